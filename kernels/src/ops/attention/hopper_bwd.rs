//! The Hopper (sm_90a) attention backward: TMA + wgmma, warp-specialised, dQ summed exactly in
//! f32 with global reductions (`kernels/device/attention/hopper_bwd.cu` explains the kernels).
//! This module decides when it applies, lays out the workspace, encodes the tensor maps and
//! launches prepare, main (then combine, when it splits a unit's query heads: [`head_split`])
//! and finish; problems it declines (deterministic calls, head dims that are not multiples of
//! 8 or exceed 256, views TMA cannot express) go to the tile kernels (the portable ones above
//! 128). Head dims below 64, 128 or 256 run the kernels of that width on zero-filled columns.
//! Head dim 256 (the "wide" mode of the main kernel) has 64-key CTAs ([`block_kv`]) and one
//! schedule: the A/B knobs of [`Tune`] other than `ftzexp`, the unit order, the head split and
//! the dQ forms do not apply there ([`HopperBwdVariant::main`] turns them off). By default
//! (`dqkernel`) the main kernel computes dK and dV only and the dQ kernel (kernel 4) computes
//! dQ from the query side straight into the output: no accumulator, no finish kernel, no
//! reductions, so these calls are deterministic and take `deterministic` calls too.
//!
//! Head split (DESIGN): the main kernel's unit is (key block, KV head, batch) and walks every
//! query head of its KV head's group, so GQA / MQA at a small batch gives fewer CTAs than SMs.
//! When the units do not fill the SMs, [`head_split`] picks s (a divisor of the group) and the
//! router a main variant built with CALICO_ATTN_HEAD_SPLIT: the grid has units * s CTAs (the
//! part fastest in the work list), each walking group / s query heads and storing f32 dK, dV
//! partials into the workspace ([`Workspace`]: `[s, B * Hkv, nkv_pad, D]` each), and the
//! combine kernel (kernel 3) sums them in part order (deterministic), scales dK and writes
//! dK and dV. Packed sequences split too (one batch of all the keys). Without the define the
//! main kernel compiles to the same SASS as before the split existed.

use super::check::kernel_head_dim;
use super::check::Problem;
use super::hopper::{arch_ok, hopper_enabled, view_map};
use crate::Device;
use calico_core::{
    Arch, DType, GpuBackend, KernelArg, KernelSource, KernelVariant, LaunchConfig, OpaqueParam128,
    Result, Tensor,
};
use calico_cpu::AttentionParams;
use calico_cuda::tma::{Swizzle, TiledMap};

const SOURCE: &str = include_str!("../../../device/attention/hopper_bwd.cu");
use super::hopper::{Packed, PACKED_HEADERS};
/// One producer and two consumer warpgroups.
const THREADS: u32 = 384;
/// Keys per CTA of the main kernel at head dim `head_dim` (its width, or a head dim that runs
/// at it): 128 (64 per consumer warpgroup) up to 128; 64 at 256 (the wide mode, where both
/// consumer warpgroups share the 64 keys, each computing S^T and dP^T for half the query rows
/// and dV, dK, dQ for half the head dim).
fn block_kv(head_dim: usize) -> usize {
    if head_dim > 128 {
        64
    } else {
        128
    }
}
/// Threads of the prepare and finish kernels (a warp per row).
const ROW_THREADS: u32 = 256;
const ROWS_PER_BLOCK: usize = ROW_THREADS as usize / 32;
/// Threads of the bulk-dQ finish kernel: one block per 64 x 64 tile of the accumulator.
const FINISH_TILE_THREADS: u32 = 128;
/// Threads of the combine kernel (head_dim / 8 per key row).
const COMBINE_THREADS: u32 = 256;
/// The deepest Q / dO ring.
const MAX_STAGES: usize = 4;
/// Sequence lengths beyond this are left to the tile kernels (32-bit coordinates).
const MAX_LEN: usize = 1 << 30;
const LOG2E: f32 = std::f32::consts::LOG2_E;

/// Which of the three kernels of hopper_bwd.cu.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum BwdKernel {
    /// delta, LSE in base 2, the zeroed dQ accumulator.
    Prepare,
    /// dK, dV and the dQ accumulation.
    Main,
    /// dQ from its accumulator.
    Finish,
    /// dK and dV from the f32 partials of a head-split main kernel.
    Combine,
    /// Head dim 256: dQ from the query side, summed in registers (hopper_bwd.cu, DESIGN (DQ)).
    Dq,
}

/// One compiled form of a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct HopperBwdVariant {
    kernel: BwdKernel,
    dtype: DType,
    head_dim: usize,
    /// Q / dO ring depth (main kernel; 0 otherwise).
    stages: usize,
    softcap: bool,
    /// Main kernel: overlapped schedule (hopper_bwd.cu, CALICO_ATTN_SCHED 2) instead of serial.
    overlapped: bool,
    /// Main and finish kernels: dQ tiles by bulk reductions (CALICO_ATTN_BULK_DQ).
    bulk_dq: bool,
    /// Main kernel with bulk dQ: consumers at 240 registers, producer warpgroup at 24
    /// (CALICO_ATTN_WIDE_REGS).
    wide_regs: bool,
    /// Main kernel, overlapped with bulk dQ: each dQ tile a step later, the consumers signalling
    /// dS^T halves on mbarriers instead of meeting on a named barrier (CALICO_ATTN_DEFER_DQ).
    defer_dq: bool,
    /// Main kernel: P = 2^x by one flush-to-zero MUFU.EX2 (CALICO_ATTN_FTZ_EXP).
    ftz_exp: bool,
    /// Main kernel: each unit's query heads over several CTAs, dK and dV as f32 partials for
    /// the combine kernel (CALICO_ATTN_HEAD_SPLIT; [`head_split`] picks the count per call).
    head_split: bool,
    /// Main kernel: packed sequences (CALICO_ATTN_VARLEN), their bounds from the offsets.
    varlen: bool,
    /// The problem's head dim is below `head_dim` (CALICO_ATTN_PADDED): the three kernels read
    /// and write only its columns.
    padded: bool,
    /// Head dim 256, main and dQ kernels: dQ by the dQ kernel (CALICO_ATTN_DQ_KERNEL), the main
    /// kernel computing dK and dV only; no accumulator, no finish kernel.
    dq_kernel: bool,
}

/// A/B knobs of the main kernel, read once from `CALICO_ATTN_HOPPER_BWD_TUNE`
/// (comma-separated). The default is the overlapped schedule (schedule 2: P^T under the dP^T
/// MMA, the dQ reductions under the dK MMA) with bulk dQ (dQ tiles staged in shared memory and
/// added by one bulk reduction each, from a warp of the producer warpgroup): on the H100 they
/// made the backward 11-29% faster than the serial schedule with per-thread dQ atomics
/// (docs/perf-log.md). `serial` and `nobulk` turn them off; `stagger` (each key block starts
/// its walk over the query blocks at a different block) is off by default: it measured neutral;
/// `chunk=N` deals the units in chunks of N (batch, KV head) pairs, each chunk's first key
/// blocks first (`longest`: all pairs in one chunk, `nolongest`: 1, head by head; by default
/// [`walk_chunk`] picks it: about one wave of units per chunk under a causal mask).
/// `wideregs` (with bulk dQ, 240 registers per consumer thread and 24 for the producer
/// warpgroup instead of 232 and 40), `deferdq` (overlapped with bulk dQ only: each step's dQ
/// tile is computed during the next step, and the two consumer warpgroups signal their dS^T
/// halves on mbarriers instead of meeting on a named barrier every step) and `ftzexp` (P = 2^x
/// by one flush-to-zero ex2 instead of exp2f's range fix-up around it). Session 8 measured them
/// on the H100 (docs/perf-log.md): `wideregs` and `ftzexp` are on by default (with the
/// row-range masks, which replaced a branch per element and are the only form since session 9:
/// together +62-74% at d = 64, +30-52% at d = 128), `deferdq` at d = 64 only (+3-4% there,
/// -4-5% at d = 128); `narrowregs`, `exp2f` and `syncdq` / `deferdq` turn each off / on.
/// `headsplit=N` runs each unit's query heads over N CTAs (the largest divisor of the group
/// not above N; dK and dV then go through f32 partials and the combine kernel), `noheadsplit`
/// never splits; by default [`head_split`] splits when the units do not fill the SMs. At head
/// dim 256 the main kernel has one schedule: only `ftzexp` / `exp2f`, `stagger`, the chunks
/// and the head split apply there ([`HopperBwdVariant::main`]), and `dqkernel` (default) /
/// `nodqkernel`: dQ by the dQ kernel, or in the main kernel (bulk or, with `nobulk`,
/// per-thread reductions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tune {
    overlapped: bool,
    stagger: bool,
    /// (batch, KV head) pairs per chunk of the unit order (hopper_bwd.cu unit_at): `chunk=N`,
    /// `longest` (all pairs) or `nolongest` (1, head by head); else [`walk_chunk`] decides.
    /// `Some(0)` stands for all pairs.
    chunk: Option<usize>,
    bulk: bool,
    wide_regs: bool,
    /// `None`: by head dim (on at d = 64).
    defer_dq: Option<bool>,
    ftz_exp: bool,
    /// CTAs per unit (`headsplit=N`, `noheadsplit`: 1); `None`: [`head_split`] decides.
    head_split: Option<usize>,
    /// Head dim 256: dQ by its own kernel (`dqkernel`, the default) instead of reductions
    /// from the main kernel (`nodqkernel`).
    dq_kernel: bool,
}

impl Default for Tune {
    fn default() -> Tune {
        Tune {
            overlapped: true,
            stagger: false,
            chunk: None,
            bulk: true,
            wide_regs: true,
            defer_dq: None,
            ftz_exp: true,
            head_split: None,
            dq_kernel: true,
        }
    }
}

impl Tune {
    fn parse(text: &str) -> Tune {
        let mut t = Tune::default();
        for part in text.split(',').map(str::trim) {
            match part {
                "overlapped" => t.overlapped = true,
                "serial" => t.overlapped = false,
                "stagger" => t.stagger = true,
                "longest" => t.chunk = Some(0),
                "nolongest" => t.chunk = Some(1),
                _ if part.starts_with("chunk=") => {
                    t.chunk = part["chunk=".len()..].parse().ok().or(t.chunk);
                }
                "bulk" => t.bulk = true,
                "nobulk" => t.bulk = false,
                "wideregs" => t.wide_regs = true,
                "narrowregs" => t.wide_regs = false,
                "deferdq" => t.defer_dq = Some(true),
                "syncdq" => t.defer_dq = Some(false),
                "ftzexp" => t.ftz_exp = true,
                "exp2f" => t.ftz_exp = false,
                "noheadsplit" => t.head_split = Some(1),
                "dqkernel" => t.dq_kernel = true,
                "nodqkernel" => t.dq_kernel = false,
                _ if part.starts_with("headsplit=") => {
                    t.head_split = part["headsplit=".len()..]
                        .parse()
                        .ok()
                        .map(|n: usize| n.max(1))
                        .or(t.head_split);
                }
                _ => {}
            }
        }
        t
    }

    fn get() -> Tune {
        static TUNE: std::sync::OnceLock<Tune> = std::sync::OnceLock::new();
        crate::knobs::read(&TUNE, "CALICO_ATTN_HOPPER_BWD_TUNE", Tune::parse)
    }
}

/// Key blocks per head from which the unit order goes in chunks ([`walk_chunk`]).
const MIN_CHUNKED_BLOCKS: usize = 16;

/// (batch, KV head) pairs per chunk of the main kernel's unit order (hopper_bwd.cu unit_at:
/// inside a chunk every pair's first key block, then every pair's second, ..). Under a causal
/// (right-bounded) mask a head's first key block sees every query block and is its longest
/// unit; head by head, each wave of CTAs starts with one head's longest units and ends with
/// its shortest, and the last heads' longest units start late and run alone. A chunk of about
/// one wave of units (SMs / key blocks pairs) runs the same heads together as head by head
/// would, longest units first. Measured on the H100 (session 19, chunk 1 / 2 / 4 / 8 / 16,
/// TFLOP/s): GQA 4 at 8192 tokens (64 key blocks) 478 / 536 / 522 / 506 / 505, GQA 4 at 2048
/// (16) 356 / 369 / 385 / 396 / 376, MHA d128 at 8192 518 / 537 / 538 / 532 / 522, at 4097
/// (33) 448 / 450 / 462 / 458 / 452, at 2048 381 / 383 / 387 / 388 / 386, MHA d64 at 2048
/// within 1%; all pairs at once lost 40% on MHA at 2048 (128 heads' rows at once, none shared).
/// Below 16 key blocks it measured slower (the full report of that session: 4 and 8 key blocks,
/// N = 512 to 1024, causal, -4 to -11%; not understood), so short heads keep head by head, as
/// do units of equal length (no mask, or a window on both sides). With `split` CTAs per unit
/// ([`head_split`]) a pair has `split` times as many CTAs: the chunk counts them. Key blocks
/// are those of the head dim ([`block_kv`]: 64 keys at d = 256; the thresholds above were
/// measured at d = 64 and 128).
fn walk_chunk(arch: &Arch, p: &Problem, params: &AttentionParams, split: usize) -> usize {
    let sms = (arch.compute_units as usize).max(1);
    let blocks = p.k_len.div_ceil(block_kv(p.head_dim)).max(1);
    let pairs = (p.batch * p.kv_heads).max(1);
    let ctas = blocks * split.max(1);
    if params.right.is_some() && params.left.is_none() && blocks >= MIN_CHUNKED_BLOCKS {
        ((sms + ctas / 2) / ctas).clamp(1, pairs)
    } else {
        1
    }
}

/// The kernel's `walk` argument: WALK_STAGGER (bit 0), the chunk above it.
fn walk(tune: &Tune, arch: &Arch, p: &Problem, params: &AttentionParams, split: usize) -> i32 {
    let pairs = (p.batch * p.kv_heads).max(1);
    let chunk = match tune.chunk {
        Some(0) => pairs,
        Some(c) => c.min(pairs),
        None => walk_chunk(arch, p, params, split),
    };
    i32::from(tune.stagger) | (chunk.min(i32::MAX as usize >> 1) as i32) << 1
}

/// CTAs per unit of the main kernel (HEAD_SPLIT in hopper_bwd.cu): a divisor of the group
/// `Hq / Hkv`, each CTA walking that share of the unit's query heads. One unit (key block,
/// KV head, batch) walks all `group` query heads of its KV head, so with GQA / MQA and a small
/// batch the units leave most SMs idle (measured on the H100 before the split: B = 1, Hq = 16,
/// Hkv = 2, N = 2048, d = 96: 32 CTAs, 3x PyTorch's time; 3.1x faster split). Without a mask
/// the units are equally long and the total work per SM sets the time: when they fill at most
/// half the SMs, the largest divisor s >= 2 with units * s within one wave (a second wave of
/// shorter parts gains nothing and the partials and the combine launch cost). Under a mask
/// (`masked`: causal or windowed) a head's first key blocks are its longest units and the
/// longest sets the time, so more, shorter parts pay even past one wave: when the units fill
/// at most 3/4 of the SMs, the smallest s >= 2 with units * s >= SMs (H100, session 24: B = 2,
/// Hq = 16, Hkv = 2, N = 3000, d = 128 causal, 96 units: 1.55x faster with s = 2; B = 4, Hq =
/// 32, Hkv = 8, N = 500, d = 64 causal, 128 units: 15% slower with s = 2, so not split). 1 for
/// group 1. `headsplit=N` forces the largest divisor not above N, `noheadsplit` 1. `p` is the
/// kernel's problem: packed sequences as one batch, key blocks of its head dim ([`block_kv`]).
fn head_split(tune: &Tune, arch: &Arch, p: &Problem, masked: bool) -> usize {
    let group = p.q_heads / p.kv_heads.max(1);
    let units = p.batch * p.kv_heads * p.k_len.div_ceil(block_kv(p.head_dim)).max(1);
    let divisors = (1..=group.max(1)).filter(|s| group.is_multiple_of(*s));
    let split = match tune.head_split {
        Some(n) => divisors.filter(|&s| s <= n).max().unwrap_or(1),
        None => {
            let sms = (arch.compute_units as usize).max(1);
            let splits: Vec<usize> = divisors.filter(|&s| s >= 2).collect();
            if masked && units * 4 <= sms * 3 {
                splits
                    .iter()
                    .copied()
                    .find(|&s| units * s >= sms)
                    .or_else(|| splits.last().copied())
                    .unwrap_or(1)
            } else if !masked && units * 2 <= sms {
                let one_wave = splits.iter().copied().filter(|&s| units * s <= sms).max();
                one_wave.or_else(|| splits.first().copied()).unwrap_or(1)
            } else {
                1
            }
        }
    };
    // The work list is 32-bit.
    if units * split > i32::MAX as usize {
        1
    } else {
        split
    }
}

/// Query rows per streamed block: 128 at head dim 64, 64 at 128 and 256 (see hopper_bwd.cu).
fn block_q(head_dim: usize) -> usize {
    if head_dim == 64 {
        128
    } else {
        64
    }
}

impl HopperBwdVariant {
    fn helper(
        kernel: BwdKernel,
        dtype: DType,
        head_dim: usize,
        bulk_dq: bool,
        padded: bool,
    ) -> Self {
        HopperBwdVariant {
            kernel,
            dtype,
            head_dim,
            stages: 0,
            softcap: false,
            overlapped: false,
            // The prepare kernel is the same either way.
            bulk_dq: bulk_dq && kernel == BwdKernel::Finish,
            wide_regs: false,
            defer_dq: false,
            ftz_exp: false,
            head_split: false,
            varlen: false,
            padded,
            dq_kernel: false,
        }
    }

    /// The main kernel for `head_dim` on `arch`, with as many stages as shared memory holds
    /// (at most [`MAX_STAGES`]); `None` when not even two fit. Head dim 256 has one schedule
    /// (hopper_bwd.cu, WIDE) with two forms of the dQ reductions: `bulk` (the default: each
    /// consumer's dQ tile staged in a Q or dO slot its step is done with and added by one bulk
    /// reduction, the tiled accumulator and finish kernel) and `nobulk` (red.global.add from
    /// registers, the per-row finish kernel); the tune's `serial` / `overlapped`, `wideregs`
    /// and `deferdq` do not apply there.
    fn main(
        arch: &Arch,
        dtype: DType,
        head_dim: usize,
        softcap: bool,
        tune: Tune,
        varlen: bool,
    ) -> Option<Self> {
        let wide = head_dim == 256;
        let overlapped = tune.overlapped && !wide;
        let dq_kernel = wide && tune.dq_kernel;
        let bulk = tune.bulk && !dq_kernel;
        let one = HopperBwdVariant {
            kernel: BwdKernel::Main,
            dtype,
            head_dim,
            stages: 0,
            softcap,
            overlapped,
            bulk_dq: bulk,
            wide_regs: tune.wide_regs && bulk && !wide,
            defer_dq: tune.defer_dq.unwrap_or(head_dim == 64) && overlapped && bulk,
            ftz_exp: tune.ftz_exp,
            head_split: false,
            varlen,
            padded: false,
            dq_kernel,
        };
        let budget = arch.shared_mem_per_block.saturating_sub(1024);
        let stages = (2..=MAX_STAGES)
            .rev()
            .find(|&s| HopperBwdVariant { stages: s, ..one }.smem_bytes() <= budget)?;
        Some(HopperBwdVariant { stages, ..one })
    }

    /// Must match hopper_bwd.cu: alignment slack, K and V (BKV keys, [`block_kv`]), the Q
    /// and dO rings, two dS buffers (at d = 256 the P^T and dS^T tiles), the LSE and delta rows
    /// of each stage, two 16 KiB dQ staging tiles (bulk_dq below 256: at 256 the dQ tiles are
    /// staged in the Q and dO slots), 4 * STAGES + 2 mbarriers (+ 4 with defer_dq).
    fn smem_bytes(&self) -> usize {
        let d = self.head_dim;
        if self.kernel == BwdKernel::Dq {
            // Q and dO of one query block, STAGES K and V blocks, two dS tiles, the block's LSE
            // and delta rows, 2 * STAGES + 2 mbarriers.
            let (bq, bkv) = (block_q(d), block_kv(d));
            return 1024
                + 2 * bq * d * 2
                + self.stages * 2 * bkv * d * 2
                + 2 * bq * bkv * 2
                + 2 * bq * 4
                + (2 * self.stages + 2) * 8;
        }
        if self.kernel != BwdKernel::Main {
            return 0;
        }
        let bq = block_q(d);
        let bkv = block_kv(d);
        1024 + 2 * bkv * d * 2
            + 2 * self.stages * bq * d * 2
            + 2 * bkv * bq * 2
            + 2 * self.stages * bq * 4
            + if self.bulk_dq && d != 256 {
                2 * 64 * 64 * 4
            } else {
                0
            }
            + (4 * self.stages + 2 + if self.defer_dq { 4 } else { 0 }) * 8
    }

    /// The dQ kernel that goes with a main variant built with `dq_kernel`.
    fn dq_companion(&self) -> Self {
        HopperBwdVariant {
            kernel: BwdKernel::Dq,
            overlapped: false,
            bulk_dq: false,
            wide_regs: false,
            defer_dq: false,
            head_split: false,
            ..*self
        }
    }

    fn entry(&self) -> &'static str {
        match self.kernel {
            BwdKernel::Prepare => "calico_attention_hopper_bwd_prepare",
            BwdKernel::Main => "calico_attention_hopper_bwd",
            BwdKernel::Finish => "calico_attention_hopper_bwd_finish",
            BwdKernel::Combine => "calico_attention_hopper_bwd_combine",
            BwdKernel::Dq => "calico_attention_hopper_bwd_dq",
        }
    }

    pub(crate) fn label(&self) -> String {
        format!(
            "hopper bwd {:?} {} d={} stages={} softcap={}{}{}{}{}{}{}{}{}{}",
            self.kernel,
            self.dtype,
            self.head_dim,
            self.stages,
            self.softcap,
            if self.overlapped { " overlapped" } else { "" },
            if self.bulk_dq { " bulk" } else { "" },
            if self.wide_regs { " wideregs" } else { "" },
            if self.defer_dq { " deferdq" } else { "" },
            if self.ftz_exp { " ftzexp" } else { "" },
            if self.dq_kernel { " dqkernel" } else { "" },
            if self.head_split { " headsplit" } else { "" },
            if self.varlen { " varlen" } else { "" },
            if self.padded { " padded" } else { "" }
        )
    }
}

impl KernelVariant for HopperBwdVariant {
    fn source(&self, vendor: calico_core::HeaderSet) -> Result<KernelSource> {
        let kernel = match self.kernel {
            BwdKernel::Prepare => 0,
            BwdKernel::Main => 1,
            BwdKernel::Finish => 2,
            BwdKernel::Combine => 3,
            BwdKernel::Dq => 4,
        };
        let defines = [
            ("CALICO_ATTN_KERNEL", kernel.to_string()),
            ("CALICO_ATTN_T", self.dtype.device_type().to_string()),
            ("CALICO_ATTN_D", self.head_dim.to_string()),
            ("CALICO_ATTN_STAGES", self.stages.to_string()),
            ("CALICO_ATTN_SOFTCAP", u8::from(self.softcap).to_string()),
            (
                "CALICO_ATTN_SCHED",
                if self.overlapped { "2" } else { "1" }.to_string(),
            ),
            ("CALICO_ATTN_BULK_DQ", u8::from(self.bulk_dq).to_string()),
            (
                "CALICO_ATTN_WIDE_REGS",
                u8::from(self.wide_regs).to_string(),
            ),
            ("CALICO_ATTN_DEFER_DQ", u8::from(self.defer_dq).to_string()),
            ("CALICO_ATTN_FTZ_EXP", u8::from(self.ftz_exp).to_string()),
            ("CALICO_ATTN_VARLEN", u8::from(self.varlen).to_string()),
            (
                "CALICO_ATTN_HEAD_SPLIT",
                u8::from(self.head_split).to_string(),
            ),
            ("CALICO_ATTN_PADDED", u8::from(self.padded).to_string()),
            (
                "CALICO_ATTN_DQ_KERNEL",
                u8::from(self.dq_kernel).to_string(),
            ),
        ];
        KernelSource::assemble(
            self.entry(),
            SOURCE,
            &[vendor, calico_core::device_headers(), PACKED_HEADERS],
            &defines,
        )
    }
}

/// Every variant, for the compile checks and `calico compile` (sm_90a only).
pub(crate) fn catalog(
    arch: &Arch,
    vendor: calico_core::HeaderSet,
) -> Result<Vec<crate::catalog::CatalogEntry>> {
    let mut out = Vec::new();
    if !arch_ok(arch) {
        return Ok(out);
    }
    for dtype in [DType::BF16, DType::F16] {
        for d in [64, 128] {
            let mut variants = vec![
                HopperBwdVariant::helper(BwdKernel::Prepare, dtype, d, false, false),
                HopperBwdVariant::helper(BwdKernel::Finish, dtype, d, false, false),
                HopperBwdVariant::helper(BwdKernel::Finish, dtype, d, true, false),
                HopperBwdVariant::helper(BwdKernel::Combine, dtype, d, false, false),
            ];
            // The default (overlapped, bulk dQ, wide registers, ftz exp2) with and without the
            // soft cap, then the A/B forms: serial with per-thread dQ atomics (also
            // soft-capped), each of those changes alone, exp2f, the narrow registers (also
            // soft-capped), the deferred dQ tiles (also soft-capped, also narrow).
            let tune = |overlapped, bulk, wide_regs| Tune {
                overlapped,
                stagger: false,
                chunk: None,
                bulk,
                wide_regs,
                defer_dq: Some(false),
                ftz_exp: true,
                head_split: None,
                dq_kernel: true,
            };
            let deferred = |wide_regs| Tune {
                defer_dq: Some(true),
                ..tune(true, true, wide_regs)
            };
            let exact_exp = |t: Tune| Tune {
                ftz_exp: false,
                ..t
            };
            for (softcap, tune) in [
                (false, tune(true, true, true)),
                (true, tune(true, true, true)),
                (false, tune(false, false, false)),
                (true, tune(false, false, false)),
                (false, tune(true, false, false)),
                (false, tune(false, true, false)),
                (false, exact_exp(tune(true, true, true))),
                (false, tune(true, true, false)),
                (true, tune(true, true, false)),
                (false, deferred(true)),
                (true, deferred(true)),
                (false, deferred(false)),
            ] {
                variants.extend(HopperBwdVariant::main(arch, dtype, d, softcap, tune, false));
            }
            // Packed sequences with the default tune (deferred dQ tiles at d = 64).
            let default = Tune {
                defer_dq: None,
                ..tune(true, true, true)
            };
            variants.extend(HopperBwdVariant::main(arch, dtype, d, false, default, true));
            // The unit's query heads split over CTAs (HEAD_SPLIT), with the default tune; in
            // bf16 also soft-capped, packed and padded.
            let split = |softcap, varlen| {
                HopperBwdVariant::main(arch, dtype, d, softcap, default, varlen).map(|v| {
                    HopperBwdVariant {
                        head_split: true,
                        ..v
                    }
                })
            };
            variants.extend(split(false, false));
            if dtype == DType::BF16 {
                variants.extend(split(true, false));
                variants.extend(split(false, true));
                variants
                    .extend(split(false, false).map(|v| HopperBwdVariant { padded: true, ..v }));
                variants.push(HopperBwdVariant::helper(
                    BwdKernel::Combine,
                    dtype,
                    d,
                    false,
                    true,
                ));
            }
            // Head dims below d (padded), with the default tune: the three kernels.
            if dtype == DType::BF16 {
                variants.push(HopperBwdVariant::helper(
                    BwdKernel::Prepare,
                    dtype,
                    d,
                    false,
                    true,
                ));
                variants.push(HopperBwdVariant::helper(
                    BwdKernel::Finish,
                    dtype,
                    d,
                    true,
                    true,
                ));
                variants.extend(
                    HopperBwdVariant::main(arch, dtype, d, false, default, false)
                        .map(|v| HopperBwdVariant { padded: true, ..v }),
                );
            }
            for v in variants {
                out.push(crate::catalog::CatalogEntry {
                    op: "attention_hopper",
                    label: v.label(),
                    source: v.source(vendor)?,
                });
            }
        }
        // Head dim 256 has one main-kernel schedule (HopperBwdVariant::main turns the other
        // A/B knobs off), by default with the dQ kernel: the main and dQ kernels with and
        // without the soft cap, packed, split (main); in bf16 also split soft-capped, packed
        // and padded, the padded forms, and the two forms with dQ in the main kernel (bulk
        // reductions with the tiled finish kernel; `nobulk` with the per-row one).
        let d = 256;
        let default = Tune::default();
        let main =
            |softcap, varlen| HopperBwdVariant::main(arch, dtype, d, softcap, default, varlen);
        let split = |v: HopperBwdVariant| HopperBwdVariant {
            head_split: true,
            ..v
        };
        let padded = |v: HopperBwdVariant| HopperBwdVariant { padded: true, ..v };
        let mut variants = vec![
            HopperBwdVariant::helper(BwdKernel::Prepare, dtype, d, false, false),
            HopperBwdVariant::helper(BwdKernel::Combine, dtype, d, false, false),
        ];
        let mut mains = vec![main(false, false), main(true, false), main(false, true)];
        mains.push(main(false, false).map(split));
        if dtype == DType::BF16 {
            mains.push(main(true, false).map(split));
            mains.push(main(false, true).map(split));
            mains.push(main(false, false).map(split).map(padded));
            mains.push(main(false, false).map(padded));
        }
        for v in mains.into_iter().flatten() {
            variants.push(v);
            let dq = v.dq_companion();
            if !variants.contains(&dq) {
                variants.push(dq);
            }
        }
        if dtype == DType::BF16 {
            for kernel in [BwdKernel::Combine, BwdKernel::Prepare] {
                variants.push(HopperBwdVariant::helper(kernel, dtype, d, false, true));
            }
            for bulk in [true, false] {
                let tune = Tune {
                    dq_kernel: false,
                    bulk,
                    ..default
                };
                variants.extend(HopperBwdVariant::main(arch, dtype, d, false, tune, false));
                variants.push(HopperBwdVariant::helper(
                    BwdKernel::Finish,
                    dtype,
                    d,
                    bulk,
                    false,
                ));
            }
        }
        for v in variants {
            out.push(crate::catalog::CatalogEntry {
                op: "attention_hopper",
                label: v.label(),
                source: v.source(vendor)?,
            });
        }
    }
    Ok(out)
}

/// On by default: it passed the attention conformance suite on the H100 (session 5) and runs
/// 3-4x faster than the tile kernels. `CALICO_ATTN_HOPPER_BWD=0` sends backward calls to the
/// tile kernels (A/B runs); `CALICO_ATTN_HOPPER=0` turns off the Hopper forward and backward.
fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        hopper_enabled() && std::env::var("CALICO_ATTN_HOPPER_BWD").as_deref() != Ok("0")
    })
}

/// The workspace: LSE in base 2 and delta, f32 `[B * Hq, nq_pad]` each, then the dQ
/// accumulator f32 `[B * Hq, nq_pad, D]`, then (a head-split main kernel, `parts` CTAs per
/// unit) the f32 partials of dK and of dV, `[parts, B * Hkv, nkv_pad, D]` each (nkv_pad: Nkv
/// rounded up to the key blocks, [`block_kv`]: 128 keys, 64 at d = 256). Offsets in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Workspace {
    nq_pad: usize,
    rows: usize,
    delta: usize,
    dq_acc: usize,
    /// The dK partials (the dV partials follow them); `bytes` when there are none.
    part: usize,
    nkv_pad: usize,
    /// Floats per part of one tensor's partials: `B * Hkv * nkv_pad * D`.
    part_section: usize,
    bytes: usize,
}

impl Workspace {
    /// `parts`: the main kernel's CTAs per unit with HEAD_SPLIT, 0 without it.
    fn new(p: &Problem, parts: usize) -> Self {
        let nq_pad = p.q_len.div_ceil(block_q(p.head_dim)) * block_q(p.head_dim);
        let rows = p.batch * p.q_heads * nq_pad;
        // rows and nkv_pad are multiples of 64: every section starts 256-byte aligned.
        let delta = rows * 4;
        let dq_acc = 2 * rows * 4;
        let part = dq_acc + rows * p.head_dim * 4;
        let bkv = block_kv(p.head_dim);
        let nkv_pad = p.k_len.div_ceil(bkv) * bkv;
        let part_section = p.batch * p.kv_heads * nkv_pad * p.head_dim;
        Workspace {
            nq_pad,
            rows,
            delta,
            dq_acc,
            part,
            nkv_pad,
            part_section,
            bytes: part + 2 * parts * part_section * 4,
        }
    }
}

/// Element strides (batch, head, position) of a `[B, H, N, D]` tensor.
fn strides3(t: &Tensor) -> [i64; 3] {
    super::gpu::strides(t).map(|s| s as i64)
}

/// 2-element stores need every used stride and the base even (in elements): the forward's
/// rule for its 4-byte O stores.
fn pairs_ok(t: &Tensor) -> bool {
    super::hopper::o_store(t.shape(), t.strides(), t.device_ptr().unwrap_or(0), false) >= 1
}

/// A causal mask or a window: units of unequal length ([`head_split`]).
fn masked(params: &AttentionParams) -> bool {
    params.left.is_some() || params.right.is_some()
}

/// The Hopper backward's main variant for a problem on `arch`, or `None` when the kernels
/// do not cover it (the router's rule; the operands must also be TMA views, see
/// [`try_backward`]).
pub(crate) fn backward_variant(
    arch: &Arch,
    p: &Problem,
    params: &AttentionParams,
    deterministic: bool,
    varlen: bool,
) -> Option<HopperBwdVariant> {
    // Head dims that are multiples of 8 up to 256, at the kernel width 64, 128 or 256.
    let d = kernel_head_dim(p.head_dim, 256)?;
    let tune = Tune::get();
    // Packed sequences run as one batch of all the rows (try_backward), at the kernel width:
    // the limits below hold for that problem (`p.batch` counts the sequences there, and
    // multiplying by it refused large packed batches that fit, as the forward's max_units
    // says).
    let kernel_problem = Problem {
        batch: if varlen { 1 } else { p.batch },
        head_dim: d,
        ..*p
    };
    let kp = &kernel_problem;
    // Deterministic calls keep the tile kernels where the dQ reductions add in timing order;
    // at 256 with the dQ kernel every sum goes in a fixed order.
    let fits = (!deterministic || (d == 256 && tune.dq_kernel))
        && enabled()
        && arch_ok(arch)
        && matches!(p.dtype, DType::BF16 | DType::F16)
        && (1..=MAX_LEN).contains(&p.q_len)
        && (1..=MAX_LEN).contains(&p.k_len)
        && kp.batch * kp.kv_heads * kp.k_len.div_ceil(block_kv(d)) <= i32::MAX as usize;
    // TMA coordinates of the LSE / delta rows are 32-bit.
    if !fits || Workspace::new(kp, 0).rows > i32::MAX as usize {
        return None;
    }
    HopperBwdVariant::main(arch, p.dtype, d, params.softcap.is_some(), tune, varlen).map(|v| {
        HopperBwdVariant {
            padded: d != p.head_dim,
            head_split: head_split(&tune, arch, &kernel_problem, masked(params)) > 1,
            ..v
        }
    })
}

/// Runs the backward with `main` on the tensors: `None` when TMA cannot express Q, K, V or
/// dO (the caller routes again without the Hopper kernels), else the launches' result.
pub(crate) fn try_backward(
    dev: &Device,
    p: &Problem,
    params: &AttentionParams,
    main: HopperBwdVariant,
    t: [&Tensor; 9],
    varlen: Option<[&Tensor; 2]>,
) -> Option<Result<()>> {
    // Packed sequences run as one batch of all the rows (hopper_bwd.cu, packed_key_rows).
    let views: [Tensor; 8];
    let (t, p, packed) = match varlen {
        Some([cu_q, cu_k]) => {
            let [q, k, v, o, lse, d_o, dq, dk, dv] = t;
            let as_batch = super::hopper::packed_as_batch;
            views = [
                as_batch(q)?,
                as_batch(k)?,
                as_batch(v)?,
                as_batch(o)?,
                as_batch(d_o)?,
                as_batch(dq)?,
                as_batch(dk)?,
                as_batch(dv)?,
            ];
            let [q, k, v, o, d_o, dq, dk, dv] = &views;
            let offsets = Packed::of(cu_q, cu_k, p.batch)?;
            let one = Problem { batch: 1, ..*p };
            ([q, k, v, o, lse, d_o, dq, dk, dv], one, Some(offsets))
        }
        None => (t, *p, None),
    };
    // Workspace, blocks and helper kernels at the kernel's head dim (the tensors keep the real
    // one, which launch reads from them).
    let p = &Problem {
        head_dim: main.head_dim,
        ..p
    };
    let [q, k, v, _o, _lse, d_o, _dq, _dk, _dv] = t;
    let gpu = dev.as_gpu()?;
    let tune = Tune::get();
    let (bq, bkv) = (block_q(p.head_dim), block_kv(p.head_dim));
    let maps = [
        view_map(q, bq)?,
        view_map(k, bkv)?,
        view_map(v, bkv)?,
        view_map(d_o, bq)?,
    ];
    // CTAs per unit: the router chose the variant on the same rule (a head-split variant runs
    // with 1 too, through the partials).
    let split = if main.head_split {
        head_split(&tune, dev.arch(), p, masked(params))
    } else {
        1
    };
    let ws = Workspace::new(p, if main.head_split { split } else { 0 });
    Some(gpu.with_workspace(ws.bytes, &mut |base| {
        launch(
            gpu,
            p,
            params,
            (main, walk(&tune, dev.arch(), p, params, split), split),
            maps,
            t,
            ws,
            base,
            packed,
        )
    }))
}

#[allow(clippy::too_many_arguments)]
fn launch(
    gpu: &dyn GpuBackend,
    p: &Problem,
    params: &AttentionParams,
    (main, walk, split): (HopperBwdVariant, i32, usize),
    maps: [OpaqueParam128; 4],
    [_q, _k, _v, o, lse, d_o, dq, dk, dv]: [&Tensor; 9],
    ws: Workspace,
    base: u64,
    packed: Option<Packed>,
) -> Result<()> {
    // The problem's head dim (`p.head_dim` is the kernel's width): the kernels' `head_dim`.
    let head_dim = o.shape()[3];
    let ptr = |t: &Tensor| t.device_ptr().unwrap_or(0);
    let (lse_log2, delta, dq_acc) = (base, base + ws.delta as u64, base + ws.dq_acc as u64);
    let rows_config = |rows: usize| {
        LaunchConfig::linear(rows.div_ceil(ROWS_PER_BLOCK).max(1) as u32, ROW_THREADS, 0)
    };

    // 16-byte loads of O and dO rows in the prepare kernel where their alignment allows.
    let vec = [o, d_o]
        .iter()
        .all(|t| super::hopper::o_store(t.shape(), t.strides(), ptr(t), true) == 2);
    let [o_sb, o_sh, o_sn] = strides3(o);
    let [g_sb, g_sh, g_sn] = strides3(d_o);
    let prepare =
        HopperBwdVariant::helper(BwdKernel::Prepare, p.dtype, p.head_dim, false, main.padded);
    let args = [
        KernelArg::Ptr(ptr(o)),
        KernelArg::I64(o_sb),
        KernelArg::I64(o_sh),
        KernelArg::I64(o_sn),
        KernelArg::Ptr(ptr(d_o)),
        KernelArg::I64(g_sb),
        KernelArg::I64(g_sh),
        KernelArg::I64(g_sn),
        KernelArg::Ptr(ptr(lse)),
        KernelArg::Ptr(lse_log2),
        KernelArg::Ptr(delta),
        KernelArg::Ptr(dq_acc),
        KernelArg::I32(p.q_heads as i32),
        KernelArg::I32(p.q_len as i32),
        KernelArg::I32(ws.nq_pad as i32),
        KernelArg::I64(ws.rows as i64),
        KernelArg::I32(i32::from(vec)),
        KernelArg::I32(head_dim as i32),
    ];
    let prepare_config = if vec {
        // D / 8 lanes per row.
        let threads = ws.rows * (p.head_dim / 8);
        LaunchConfig::linear(
            threads.div_ceil(ROW_THREADS as usize) as u32,
            ROW_THREADS,
            0,
        )
    } else {
        rows_config(ws.rows)
    };
    gpu.launch_variant(&prepare, &prepare_config, &args)?;

    let (score_scale, cap_log2) = match params.softcap {
        Some(cap) => (params.scale / cap, cap * LOG2E),
        None => (params.scale * LOG2E, 0.0),
    };
    let side = |s: Option<usize>| (i32::from(s.is_some()), s.unwrap_or(0) as i64);
    let (has_left, left) = side(params.left);
    let (has_right, right) = side(params.right);
    let [dk_sb, dk_sh, dk_sn] = strides3(dk);
    let [dv_sb, dv_sh, dv_sn] = strides3(dv);
    let pairs = i32::from(pairs_ok(dk)) | (i32::from(pairs_ok(dv)) << 1);
    let work = p.batch * p.kv_heads * p.k_len.div_ceil(block_kv(p.head_dim)) * split;
    let [map_q, map_k, map_v, map_do] = maps;
    // The LSE and delta rows, back to back in the workspace, as one 2-D map: row index, then
    // 0 (LSE) or 1 (delta).
    let map_rows = TiledMap::<2> {
        address: lse_log2,
        dtype: DType::F32,
        dims: [ws.rows as u64, 2],
        strides_bytes: [ws.delta as u64, 0],
        box_dims: [block_q(p.head_dim) as u32, 1],
        swizzle: Swizzle::None,
    }
    .encode_cached()?;
    let [cu_q, cu_k, n_seqs] = Packed::args(packed);
    let args = [
        KernelArg::Opaque128(map_q),
        KernelArg::Opaque128(map_k),
        KernelArg::Opaque128(map_v),
        KernelArg::Opaque128(map_do),
        KernelArg::Opaque128(map_rows),
        KernelArg::Ptr(dq_acc),
        KernelArg::Ptr(ptr(dk)),
        KernelArg::Ptr(ptr(dv)),
        KernelArg::I32(p.batch as i32),
        KernelArg::I32(p.q_heads as i32),
        KernelArg::I32((p.q_heads / p.kv_heads) as i32),
        KernelArg::I32(p.q_len as i32),
        KernelArg::I32(p.k_len as i32),
        KernelArg::I32(ws.nq_pad as i32),
        KernelArg::I64(dk_sb),
        KernelArg::I64(dk_sh),
        KernelArg::I64(dk_sn),
        KernelArg::I64(dv_sb),
        KernelArg::I64(dv_sh),
        KernelArg::I64(dv_sn),
        KernelArg::I32(pairs),
        KernelArg::F32(params.scale),
        KernelArg::F32(score_scale),
        KernelArg::F32(cap_log2),
        KernelArg::I32(has_left),
        KernelArg::I64(left),
        KernelArg::I32(has_right),
        KernelArg::I64(right),
        KernelArg::I32(walk),
        cu_q,
        cu_k,
        n_seqs,
        KernelArg::I32(head_dim as i32),
        KernelArg::Ptr(base + ws.part as u64),
        KernelArg::I32(split as i32),
    ];
    // One CTA per key block (and part): the grid is the work list, so each CTA runs one unit.
    let config = LaunchConfig::linear(work as u32, THREADS, main.smem_bytes() as u32);
    gpu.launch_variant(&main, &config, &args)?;

    if main.head_split {
        // dK and dV from the partials: head_dim / 8 threads per key row.
        let combine =
            HopperBwdVariant::helper(BwdKernel::Combine, p.dtype, p.head_dim, false, main.padded);
        let count = p.batch * p.kv_heads * p.k_len * (p.head_dim / 8);
        let config = LaunchConfig::linear(
            count.div_ceil(COMBINE_THREADS as usize) as u32,
            COMBINE_THREADS,
            0,
        );
        let stores = super::hopper::o_store(dk.shape(), dk.strides(), ptr(dk), true)
            | (super::hopper::o_store(dv.shape(), dv.strides(), ptr(dv), true) << 2);
        let args = [
            KernelArg::Ptr(base + ws.part as u64),
            KernelArg::Ptr(ptr(dk)),
            KernelArg::I64(dk_sb),
            KernelArg::I64(dk_sh),
            KernelArg::I64(dk_sn),
            KernelArg::Ptr(ptr(dv)),
            KernelArg::I64(dv_sb),
            KernelArg::I64(dv_sh),
            KernelArg::I64(dv_sn),
            KernelArg::F32(params.scale),
            KernelArg::I32(p.kv_heads as i32),
            KernelArg::I32(p.k_len as i32),
            KernelArg::I32(ws.nkv_pad as i32),
            KernelArg::I32(split as i32),
            KernelArg::I64(ws.part_section as i64),
            KernelArg::I64(count as i64),
            KernelArg::I32(stores),
            KernelArg::I32(head_dim as i32),
        ];
        gpu.launch_variant(&combine, &config, &args)?;
    }

    if main.dq_kernel {
        // dQ from the query side, straight into dQ (no accumulator, no finish kernel).
        let dq_variant = main.dq_companion();
        let [q_sb, q_sh, q_sn] = strides3(dq);
        let units = ws.rows / block_q(p.head_dim);
        let args = [
            KernelArg::Opaque128(map_q),
            KernelArg::Opaque128(map_k),
            KernelArg::Opaque128(map_v),
            KernelArg::Opaque128(map_do),
            KernelArg::Opaque128(map_rows),
            KernelArg::Ptr(ptr(dq)),
            KernelArg::I64(q_sb),
            KernelArg::I64(q_sh),
            KernelArg::I64(q_sn),
            KernelArg::I32(i32::from(pairs_ok(dq))),
            KernelArg::I32(p.batch as i32),
            KernelArg::I32(p.q_heads as i32),
            KernelArg::I32((p.q_heads / p.kv_heads) as i32),
            KernelArg::I32(p.q_len as i32),
            KernelArg::I32(p.k_len as i32),
            KernelArg::I32(ws.nq_pad as i32),
            KernelArg::F32(params.scale),
            KernelArg::F32(score_scale),
            KernelArg::F32(cap_log2),
            KernelArg::I32(has_left),
            KernelArg::I64(left),
            KernelArg::I32(has_right),
            KernelArg::I64(right),
            cu_q,
            cu_k,
            n_seqs,
            KernelArg::I32(head_dim as i32),
        ];
        let config = LaunchConfig::linear(units as u32, THREADS, dq_variant.smem_bytes() as u32);
        return gpu.launch_variant(&dq_variant, &config, &args);
    }

    let finish = HopperBwdVariant::helper(
        BwdKernel::Finish,
        p.dtype,
        p.head_dim,
        main.bulk_dq,
        main.padded,
    );
    let [q_sb, q_sh, q_sn] = strides3(dq);
    // Bulk dQ: one block of 128 threads per 64 x 64 tile of the accumulator (the staged
    // order); otherwise a warp per row of dQ.
    let (count, config) = if main.bulk_dq {
        let tiles = ws.rows * p.head_dim / (64 * 64);
        (
            tiles,
            LaunchConfig::linear(tiles as u32, FINISH_TILE_THREADS, 0),
        )
    } else {
        let rows = p.batch * p.q_heads * p.q_len;
        (rows, rows_config(rows))
    };
    let store = super::hopper::o_store(dq.shape(), dq.strides(), ptr(dq), true);
    let args = [
        KernelArg::Ptr(dq_acc),
        KernelArg::Ptr(ptr(dq)),
        KernelArg::I64(q_sb),
        KernelArg::I64(q_sh),
        KernelArg::I64(q_sn),
        KernelArg::F32(params.scale),
        KernelArg::I32(p.q_heads as i32),
        KernelArg::I32(p.q_len as i32),
        KernelArg::I32(ws.nq_pad as i32),
        KernelArg::I64(count as i64),
        KernelArg::I32(store),
        KernelArg::I32(head_dim as i32),
    ];
    gpu.launch_variant(&finish, &config, &args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn main_variants_fit_shared_memory_with_two_stages_or_more() {
        let arch = Arch::for_target("sm_90a").unwrap();
        for d in [64, 128, 256] {
            for tune in [
                Tune::parse("serial,nobulk"),
                Tune::default(),
                Tune::parse("wideregs,deferdq"),
            ] {
                let v = HopperBwdVariant::main(&arch, DType::BF16, d, false, tune, false).unwrap();
                assert!(v.stages >= 2, "{v:?}");
                assert!(v.smem_bytes() + 1024 <= arch.shared_mem_per_block, "{v:?}");
            }
        }
        let v = HopperBwdVariant::main(
            &arch,
            DType::F16,
            128,
            true,
            Tune::parse("serial,nobulk"),
            false,
        )
        .unwrap();
        // K, V 64 KiB; per stage Q + dO 32 KiB and two 256-byte rows; dS 32 KiB.
        assert_eq!(
            v.smem_bytes(),
            1024 + 65536 + v.stages * (32768 + 512) + 32768 + (4 * v.stages + 2) * 8
        );
    }

    /// Head dim 256 (the wide mode): one schedule whatever the tune says (not overlapped, the
    /// default registers, no deferred dQ) with bulk dQ unless `nobulk` (the dQ tiles staged in
    /// the Q / dO slots: no staging tiles of their own), 64-key blocks and two stages in 227 KiB.
    #[test]
    fn head_dim_256_main_variants_take_one_schedule_in_two_stages() {
        let arch = Arch::for_target("sm_90a").unwrap();
        for tune in [
            Tune::parse("serial,nobulk"),
            Tune::default(),
            Tune::parse("wideregs,deferdq"),
            Tune::parse("overlapped,bulk,narrowregs,exp2f"),
        ] {
            for (dtype, softcap, varlen) in [
                (DType::BF16, false, false),
                (DType::F16, true, false),
                (DType::BF16, false, true),
            ] {
                let v = HopperBwdVariant::main(&arch, dtype, 256, softcap, tune, varlen).unwrap();
                assert_eq!(v.stages, 2, "{v:?}");
                assert!(!v.overlapped && !v.wide_regs && !v.defer_dq, "{v:?}");
                // The dQ kernel (default) leaves the main kernel no dQ to reduce.
                assert_eq!(v.dq_kernel, tune.dq_kernel, "{v:?}");
                assert_eq!(v.bulk_dq, tune.bulk && !tune.dq_kernel, "{v:?}");
                assert_eq!(
                    (v.ftz_exp, v.softcap, v.varlen),
                    (tune.ftz_exp, softcap, varlen)
                );
                // K, V 64 KiB (64 keys); per stage Q + dO 64 KiB and two 256-byte rows; the
                // P^T and dS^T tiles 16 KiB; 10 mbarriers.
                assert_eq!(
                    v.smem_bytes(),
                    1024 + 65536 + 2 * (65536 + 512) + 16384 + 10 * 8
                );
                assert!(v.smem_bytes() + 1024 <= arch.shared_mem_per_block, "{v:?}");
                // A third stage does not fit.
                let three = HopperBwdVariant { stages: 3, ..v };
                assert!(three.smem_bytes() + 1024 > arch.shared_mem_per_block);
                assert_eq!(v.label().contains(" ftzexp"), tune.ftz_exp);
                assert_eq!(v.label().contains(" bulk"), v.bulk_dq, "{}", v.label());
            }
        }
        // The widths below keep their knobs.
        let v =
            HopperBwdVariant::main(&arch, DType::BF16, 128, false, Tune::default(), false).unwrap();
        assert!(v.overlapped && v.bulk_dq && v.wide_regs, "{v:?}");
        assert_eq!((block_kv(64), block_kv(128), block_kv(256)), (128, 128, 64));
        assert_eq!((block_q(64), block_q(128), block_q(256)), (128, 64, 64));
    }

    /// The catalog: no label twice, the d = 64 / 128 variants with their A/B forms, and at
    /// d = 256 the main kernel with the dQ kernel (default) in its plain, soft-capped, packed,
    /// split and padded forms, each with its dQ kernel, and the two forms with dQ in the main
    /// kernel (bulk, per-thread) with their finish kernels; each split main kernel beside its
    /// unsplit one (compile_all compares them).
    #[test]
    fn catalog_labels_are_unique_and_cover_head_dim_256() {
        let arch = Arch::for_target("sm_90a").unwrap();
        let entries = catalog(&arch, calico_cuda::device_headers()).unwrap();
        let labels: Vec<&str> = entries.iter().map(|e| e.label.as_str()).collect();
        let mut unique = labels.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), labels.len(), "duplicate labels");
        let wide: Vec<&str> = labels
            .iter()
            .copied()
            .filter(|l| l.contains(" d=256 "))
            .collect();
        // Per dtype: prepare, combine, main and dQ (plain, soft-capped, packed), split main;
        // in bf16 also split main soft-capped, packed and padded, padded main and dQ, padded
        // prepare and combine, and the bulk and per-thread main kernels with their finish.
        assert_eq!(wide.len(), 2 * 9 + 11, "{wide:#?}");
        let count = |part: &str| wide.iter().filter(|l| l.contains(part)).count();
        assert_eq!(count("hopper bwd Dq "), 2 * 3 + 1, "{wide:#?}");
        assert_eq!(count(" bulk"), 2, "{wide:#?}");
        assert!(wide
            .iter()
            .filter(|l| l.starts_with("hopper bwd Main"))
            .all(|l| l.contains("stages=2 ") && !l.contains(" overlapped")));
        // Every main kernel with the dQ kernel has its dQ kernel in the catalog.
        for l in wide
            .iter()
            .filter(|l| l.starts_with("hopper bwd Main") && l.contains(" dqkernel"))
        {
            let dq = l.replace("Main", "Dq").replace(" headsplit", "");
            assert!(labels.contains(&dq.as_str()), "{l}: no dQ kernel");
        }
        for l in wide.iter().filter(|l| l.contains(" headsplit")) {
            let unsplit = l.replace(" headsplit", "");
            assert!(
                labels.contains(&unsplit.as_str()),
                "{l}: no unsplit variant"
            );
        }
        for kernel in ["Prepare", "Dq", "Combine", "Main"] {
            let name = format!("hopper bwd {kernel} bf16 d=256 ");
            assert!(
                wide.iter()
                    .any(|l| l.starts_with(&name) && l.contains(" padded")),
                "{kernel} padded at d = 256"
            );
        }
        for d in [64, 128] {
            let tag = format!(" d={d} ");
            let n = labels.iter().filter(|l| l.contains(&tag)).count();
            // f16 18 (prepare, two finish, combine, 12 main, packed, split), bf16 7 more.
            assert_eq!(n, 18 + 25, "d = {d}");
        }
    }

    #[test]
    fn units_go_in_chunks_of_about_one_wave_under_a_causal_mask() {
        let arch = Arch::for_target("sm_90a").unwrap(); // 132 SMs
        let problem = |batch, q_heads, kv_heads, len| Problem {
            dtype: DType::BF16,
            batch,
            q_heads,
            kv_heads,
            q_len: len,
            k_len: len,
            head_dim: 128,
        };
        let plain = AttentionParams {
            scale: 0.1,
            softcap: None,
            left: None,
            right: None,
        };
        let causal = AttentionParams {
            right: Some(0),
            ..plain
        };
        let chunk = |p: Problem, params| walk_chunk(&arch, &p, &params, 1);
        // 64, 16 and 33 key blocks: 2, 8 and 4 pairs make about 132 units.
        assert_eq!(chunk(problem(2, 16, 4, 8192), causal), 2);
        assert_eq!(chunk(problem(8, 16, 4, 2048), causal), 8);
        assert_eq!(chunk(problem(3, 16, 16, 4097), causal), 4);
        // Longer than a wave per head: head by head; fewer pairs than the chunk: all of them.
        assert_eq!(chunk(problem(1, 16, 16, 32768), causal), 1);
        assert_eq!(chunk(problem(1, 4, 1, 2048), causal), 1);
        assert_eq!(chunk(problem(1, 8, 2, 2048), causal), 2);
        // Under 16 key blocks (N < 1921): head by head.
        assert_eq!(chunk(problem(16, 16, 16, 1024), causal), 1);
        assert_eq!(chunk(problem(32, 16, 16, 512), causal), 1);
        // Units of one length (no mask, or a window on both sides): head by head.
        assert_eq!(chunk(problem(8, 16, 4, 2048), plain), 1);
        let window = AttentionParams {
            left: Some(256),
            ..causal
        };
        assert_eq!(chunk(problem(8, 16, 4, 2048), window), 1);
        // The walk argument: stagger in bit 0, pairs per chunk above it.
        let walk_of = |spec, p: Problem, params| walk(&Tune::parse(spec), &arch, &p, &params, 1);
        assert_eq!(walk_of("", problem(2, 16, 4, 8192), causal), 2 << 1);
        assert_eq!(
            walk_of("nolongest,stagger", problem(2, 16, 4, 8192), causal),
            3
        );
        assert_eq!(
            walk_of("longest", problem(8, 16, 16, 2048), plain),
            128 << 1
        );
        assert_eq!(walk_of("chunk=4", problem(8, 16, 4, 2048), causal), 4 << 1);
        assert_eq!(walk_of("chunk=99", problem(2, 16, 4, 8192), causal), 8 << 1);
    }

    #[test]
    fn packed_batches_are_limited_as_the_one_batch_they_run_as() {
        let arch = Arch::for_target("sm_90a").unwrap();
        let params = AttentionParams {
            scale: 0.1,
            softcap: None,
            left: None,
            right: Some(0),
        };
        // 64 sequences over 2^20 packed tokens, 32 query heads: 2^25 LSE rows in the one
        // batch the kernel runs (64 x that counted the sequences as batches, past i32).
        let problem = |batch| Problem {
            dtype: DType::BF16,
            batch,
            q_heads: 32,
            kv_heads: 8,
            q_len: 1 << 20,
            k_len: 1 << 20,
            head_dim: 128,
        };
        assert!(backward_variant(&arch, &problem(64), &params, false, true).is_some());
        // As 64 separate batches of 2^20 rows each, the rows pass i32.
        assert!(backward_variant(&arch, &problem(64), &params, false, false).is_none());
        assert!(backward_variant(&arch, &problem(1), &params, false, false).is_some());
    }

    #[test]
    fn query_heads_split_over_ctas_when_the_units_do_not_fill_the_sms() {
        let arch = Arch::for_target("sm_90a").unwrap(); // 132 SMs
        let problem = |batch, q_heads, kv_heads, q_len, k_len| Problem {
            dtype: DType::BF16,
            batch,
            q_heads,
            kv_heads,
            q_len,
            k_len,
            head_dim: 128,
        };
        let split = |spec, p: Problem| head_split(&Tune::parse(spec), &arch, &p, false);
        let split_masked = |p: Problem| head_split(&Tune::default(), &arch, &p, true);
        // 32 units (2 KV heads x 16 key blocks), group 8: 4 x 32 = 128 fits one wave of 132.
        assert_eq!(split("", problem(1, 16, 2, 2048, 2048)), 4);
        // 64 units, group 8: 2; Nkv = 1000 (8 key blocks) over 2 x 2 pairs: 4.
        assert_eq!(split("", problem(4, 8, 1, 2048, 2048)), 2);
        assert_eq!(split("", problem(2, 16, 2, 4096, 1000)), 4);
        // 128 units: more than half the SMs busy, no split.
        assert_eq!(split("", problem(4, 32, 8, 500, 500)), 1);
        // Under a mask the longest unit sets the time: parts past one wave, from fewer units
        // (96: split in 2; 48: in 4), but not at 128 units.
        assert_eq!(split_masked(problem(2, 16, 2, 3000, 3000)), 2);
        assert_eq!(split_masked(problem(1, 16, 2, 3000, 3000)), 4);
        assert_eq!(split_masked(problem(4, 8, 1, 2048, 2048)), 4);
        assert_eq!(split_masked(problem(4, 32, 8, 500, 500)), 1);
        assert_eq!(split_masked(problem(1, 8, 1, 333, 333)), 8);
        // Tiny problems split the whole group; group 3: 3.
        assert_eq!(split("", problem(1, 8, 1, 333, 333)), 8);
        assert_eq!(split("", problem(1, 6, 2, 100, 100)), 3);
        // Enough units, or no group: no split.
        assert_eq!(split("", problem(8, 16, 16, 2048, 2048)), 1);
        assert_eq!(split("", problem(1, 1, 1, 64, 64)), 1);
        assert_eq!(split("", problem(8, 16, 4, 2048, 2048)), 1);
        assert_eq!(split("", problem(1, 66, 33, 100, 600)), 1);
        // Forced: the largest divisor of the group not above N; noheadsplit: 1.
        assert_eq!(split("headsplit=3", problem(1, 16, 2, 2048, 2048)), 2);
        assert_eq!(split("headsplit=100", problem(8, 16, 4, 2048, 2048)), 4);
        assert_eq!(split("headsplit=4", problem(8, 32, 4, 2048, 2048)), 4);
        assert_eq!(split("headsplit=0", problem(1, 16, 2, 2048, 2048)), 1);
        assert_eq!(split("noheadsplit", problem(1, 16, 2, 2048, 2048)), 1);
        assert_eq!(split("headsplit=8", problem(1, 4, 4, 2048, 2048)), 1);
        // The chunk of the unit order counts a pair's CTAs: 16 blocks x 4 parts, about 2 pairs
        // per wave.
        let causal = AttentionParams {
            scale: 0.1,
            softcap: None,
            left: None,
            right: Some(0),
        };
        assert_eq!(
            walk_chunk(&arch, &problem(4, 8, 1, 2048, 2048), &causal, 4),
            2
        );
        assert_eq!(
            walk_chunk(&arch, &problem(4, 8, 1, 2048, 2048), &causal, 1),
            4
        );
        // The router's variant says whether it splits (packed sequences as one batch).
        if std::env::var_os("CALICO_ATTN_HOPPER_BWD_TUNE").is_none() {
            let variant = |p: Problem, varlen| {
                backward_variant(&arch, &p, &causal, false, varlen)
                    .unwrap()
                    .head_split
            };
            assert!(variant(problem(1, 16, 2, 2048, 2048), false));
            assert!(!variant(problem(8, 16, 16, 2048, 2048), false));
            // 16384 packed keys (128 blocks) over 2 KV heads: 256 units; 2048 keys: 32.
            assert!(!variant(problem(8, 16, 2, 16384, 16384), true));
            assert!(variant(problem(8, 16, 2, 2048, 2048), true));
            let label = backward_variant(&arch, &problem(1, 8, 1, 333, 333), &causal, false, false)
                .unwrap()
                .label();
            assert!(label.ends_with(" ftzexp headsplit"), "{label}");
        }
    }

    #[test]
    fn tune_knobs_parse_and_default_to_the_measured_winners() {
        let default = Tune {
            overlapped: true,
            stagger: false,
            chunk: None,
            bulk: true,
            wide_regs: true,
            defer_dq: None,
            ftz_exp: true,
            head_split: None,
            dq_kernel: true,
        };
        assert_eq!(Tune::parse(""), default);
        assert_eq!(Tune::parse("unknown"), default);
        assert_eq!(
            Tune::parse("stagger, longest, serial,nobulk,narrowregs,exp2f,nodqkernel"),
            Tune {
                overlapped: false,
                stagger: true,
                chunk: Some(0),
                bulk: false,
                wide_regs: false,
                defer_dq: None,
                ftz_exp: false,
                head_split: None,
                dq_kernel: false,
            }
        );
        assert_eq!(Tune::parse("nodqkernel,dqkernel"), default);
        assert_eq!(Tune::parse("overlapped,bulk,wideregs,ftzexp"), default);
        assert_eq!(
            Tune::parse("deferdq"),
            Tune {
                defer_dq: Some(true),
                ..default
            }
        );
        assert_eq!(
            Tune::parse("deferdq,syncdq"),
            Tune {
                defer_dq: Some(false),
                ..default
            }
        );
        // deferdq by head dim unless named.
        let h100 = Arch::for_target("sm_90a").unwrap();
        let main = |d, t| HopperBwdVariant::main(&h100, DType::BF16, d, false, t, false).unwrap();
        assert!(main(64, default).defer_dq && !main(128, default).defer_dq);
        assert!(!main(64, Tune::parse("syncdq")).defer_dq);
        assert!(main(128, Tune::parse("deferdq")).defer_dq);
        assert_eq!(Tune::parse("headsplit=4").head_split, Some(4));
        assert_eq!(Tune::parse("headsplit=0").head_split, Some(1));
        assert_eq!(Tune::parse("headsplit=x").head_split, None);
        assert_eq!(Tune::parse("headsplit=4,noheadsplit").head_split, Some(1));
    }

    #[test]
    fn workspace_sections_are_aligned_and_padded_to_query_blocks() {
        let p = Problem {
            dtype: DType::BF16,
            batch: 2,
            q_heads: 3,
            kv_heads: 1,
            q_len: 65,
            k_len: 7,
            head_dim: 128,
        };
        let ws = Workspace::new(&p, 0);
        assert_eq!(ws.nq_pad, 128);
        assert_eq!(ws.rows, 2 * 3 * 128);
        assert_eq!(ws.delta % 256, 0);
        assert_eq!(ws.dq_acc % 256, 0);
        assert_eq!(ws.bytes, 2 * ws.rows * 4 + ws.rows * 128 * 4);
        assert_eq!(ws.part, ws.bytes);
        let p64 = Problem {
            head_dim: 64,
            q_len: 129,
            ..p
        };
        assert_eq!(Workspace::new(&p64, 0).nq_pad, 256);
        // Head-split partials after the dQ accumulator: [parts, B * Hkv, nkv_pad, D] for dK,
        // then dV; Nkv = 7 pads to one 128-key block.
        for (p, parts) in [(p, 3), (p64, 2), (Problem { k_len: 1000, ..p }, 8)] {
            let ws = Workspace::new(&p, parts);
            assert_eq!(ws.part, Workspace::new(&p, 0).bytes);
            assert_eq!(ws.nkv_pad, p.k_len.div_ceil(128) * 128);
            assert_eq!(
                ws.part_section,
                p.batch * p.kv_heads * ws.nkv_pad * p.head_dim
            );
            assert_eq!(ws.part % 256, 0);
            assert_eq!((ws.part_section * 4) % 256, 0);
            assert_eq!(ws.bytes, ws.part + 2 * parts * ws.part_section * 4);
        }
        // Head dim 256: 64-row query blocks and 64-key blocks; the sections stay 256-byte
        // aligned (Nkv = 7 pads to 64, 65 to 128, 1000 to 1024).
        let p256 = Problem { head_dim: 256, ..p };
        assert_eq!(Workspace::new(&p256, 0).nq_pad, 128);
        for (k_len, nkv_pad) in [(7, 64), (64, 64), (65, 128), (1000, 1024)] {
            for (batch, kv_heads, parts) in [(2, 1, 3), (1, 3, 2), (3, 1, 1)] {
                let p = Problem {
                    k_len,
                    batch,
                    kv_heads,
                    q_heads: kv_heads * 3,
                    ..p256
                };
                let ws = Workspace::new(&p, parts);
                assert_eq!(ws.nkv_pad, nkv_pad, "{p:?}");
                assert_eq!(ws.nkv_pad % 64, 0);
                assert_eq!(ws.part_section, batch * kv_heads * nkv_pad * 256);
                for offset in [ws.delta, ws.dq_acc, ws.part, ws.part_section * 4] {
                    assert_eq!(offset % 256, 0, "{p:?}");
                }
                assert_eq!(ws.bytes, ws.part + 2 * parts * ws.part_section * 4);
            }
        }
    }

    /// Units, the head split and the chunks of the unit order count 64-key blocks at d = 256
    /// (also for head dims that run at 256, 136 to 248).
    #[test]
    fn head_dim_256_counts_64_key_blocks() {
        let arch = Arch::for_target("sm_90a").unwrap(); // 132 SMs
        let problem = |batch, q_heads, kv_heads, len, head_dim| Problem {
            dtype: DType::BF16,
            batch,
            q_heads,
            kv_heads,
            q_len: len,
            k_len: len,
            head_dim,
        };
        let causal = AttentionParams {
            scale: 0.1,
            softcap: None,
            left: None,
            right: Some(0),
        };
        let tune = Tune::default();
        // 2 KV heads x 32 key blocks = 64 units: split in 2 within one wave (d = 128: 32
        // units, 4), under a mask in 4 (64 x 2 < 132).
        assert_eq!(
            head_split(&tune, &arch, &problem(1, 16, 2, 2048, 256), false),
            2
        );
        assert_eq!(
            head_split(&tune, &arch, &problem(1, 16, 2, 2048, 128), false),
            4
        );
        assert_eq!(
            head_split(&tune, &arch, &problem(1, 16, 2, 2048, 256), true),
            4
        );
        // 8 x 16 = 128 units at 256 (d = 128: 64): more than half the SMs, no split.
        assert_eq!(
            head_split(&tune, &arch, &problem(4, 8, 2, 1024, 256), false),
            1
        );
        assert_eq!(
            head_split(&tune, &arch, &problem(4, 8, 2, 1024, 128), false),
            2
        );
        // 1024 keys are 16 blocks at 256 (chunked, 8 pairs per wave), 8 at 128 (head by head);
        // 2048 keys 32 blocks (4 pairs) and 16 (8 pairs).
        let chunk = |p: Problem| walk_chunk(&arch, &p, &causal, 1);
        assert_eq!(chunk(problem(16, 16, 16, 1024, 256)), 8);
        assert_eq!(chunk(problem(16, 16, 16, 1024, 128)), 1);
        assert_eq!(chunk(problem(8, 16, 4, 2048, 256)), 4);
        assert_eq!(chunk(problem(8, 16, 4, 2048, 128)), 8);
        assert_eq!(chunk(problem(8, 16, 4, 2048, 192)), 4);
    }

    /// The router sends head dim 256, and the multiples of 8 from 136 to 248 (padded), to the
    /// Hopper backward on sm_90a, with bulk dQ and the tiled finish kernel; not past 256,
    /// not off multiples of 8, not deterministic calls, not other targets.
    #[test]
    fn head_dims_up_to_256_take_the_hopper_backward_with_the_dq_kernel() {
        let arch = Arch::for_target("sm_90a").unwrap();
        let problem = |head_dim| Problem {
            dtype: DType::BF16,
            batch: 2,
            q_heads: 8,
            kv_heads: 2,
            q_len: 1000,
            k_len: 1000,
            head_dim,
        };
        let causal = AttentionParams {
            scale: 0.1,
            softcap: None,
            left: None,
            right: Some(0),
        };
        for (d, varlen) in [
            (256, false),
            (192, false),
            (136, false),
            (248, true),
            (256, true),
        ] {
            let v = backward_variant(&arch, &problem(d), &causal, false, varlen)
                .unwrap_or_else(|| panic!("d = {d}: not the Hopper backward"));
            assert_eq!((v.kernel, v.head_dim, v.stages), (BwdKernel::Main, 256, 2));
            assert!(
                v.dq_kernel && !v.bulk_dq && !v.overlapped && !v.wide_regs && !v.defer_dq,
                "d = {d}: {v:?}"
            );
            assert_eq!((v.padded, v.varlen), (d != 256, varlen), "d = {d}");
            assert!(v.smem_bytes() + 1024 <= arch.shared_mem_per_block);
            // The dQ kernel that launch pairs with it keeps the problem's form.
            let dq = v.dq_companion();
            assert_eq!(dq.kernel, BwdKernel::Dq);
            assert_eq!(
                (dq.padded, dq.varlen, dq.head_split),
                (v.padded, varlen, false)
            );
            assert!(
                dq.smem_bytes() + 1024 <= arch.shared_mem_per_block,
                "{dq:?}"
            );
            let capped = AttentionParams {
                softcap: Some(30.0),
                ..causal
            };
            let v = backward_variant(&arch, &problem(d), &capped, false, varlen).unwrap();
            assert!(v.softcap && v.dq_kernel, "d = {d}");
            // Every sum in a fixed order: deterministic calls take it too.
            assert!(backward_variant(&arch, &problem(d), &capped, true, varlen).is_some());
        }
        // 1 x 2 KV heads x 32 key blocks: split (64 units, causal); 8 x 2 x 16 = 256 units:
        // not split.
        let small = Problem {
            batch: 1,
            q_heads: 16,
            k_len: 2048,
            q_len: 2048,
            ..problem(256)
        };
        if std::env::var_os("CALICO_ATTN_HOPPER_BWD_TUNE").is_none() {
            assert!(
                backward_variant(&arch, &small, &causal, false, false)
                    .unwrap()
                    .head_split
            );
            let large = Problem {
                batch: 8,
                ..problem(256)
            };
            assert!(
                !backward_variant(&arch, &large, &causal, false, false)
                    .unwrap()
                    .head_split
            );
        }
        for d in [100, 260, 264] {
            assert!(backward_variant(&arch, &problem(d), &causal, false, false).is_none());
        }
        assert!(backward_variant(&arch, &problem(128), &causal, true, false).is_none());
        for t in ["sm_80", "sm_100a", "gfx942"] {
            let other = Arch::for_target(t).unwrap();
            assert!(backward_variant(&other, &problem(256), &causal, false, false).is_none());
        }
    }
}
