//! The Hopper (sm_90a) attention forward: TMA + wgmma, warp-specialised and persistent
//! (`kernels/device/attention/hopper_fwd.cu` explains the kernel). This module decides when it
//! applies, encodes the tensor maps over Q, K and V's real strides and launches it; problems
//! it declines go to the other GPU kernels (see [`enabled`] and [`Schedule`]).

use super::check::{kernel_head_dim, Problem};
use super::hopper_trace;
use super::stamps;
use crate::Device;
use calico_core::{
    Arch, AsyncCopy, DType, GpuBackend, KernelArg, KernelSource, KernelVariant, LaunchConfig,
    MmaKind, OpaqueParam128, Result, Tensor,
};
use calico_cpu::AttentionParams;
use calico_cuda::tma::{Swizzle, TiledMap};

const SOURCE: &str = include_str!("../../../device/attention/hopper_fwd.cu");
/// The packed-sequence offset lookups both Hopper attention kernels share.
pub(super) const PACKED_HEADERS: calico_core::HeaderSet = &[(
    "attention/hopper_packed.cuh",
    include_str!("../../../device/attention/hopper_packed.cuh"),
)];
const ENTRY: &str = "calico_attention_hopper_fwd";
/// Threads per warpgroup; a CTA has one producer and `consumers` consumer warpgroups.
const WARPGROUP: usize = 128;
/// Query rows per consumer warpgroup (a work unit has 64 * `consumers` rows).
const ROWS_PER_CONSUMER: usize = 64;
/// Elements per 128-byte swizzled TMA box row.
const CHUNK: usize = 64;
/// The deepest K/V ring.
const MAX_STAGES: usize = 4;
/// Sequence lengths beyond this are left to the portable kernel (32-bit coordinates and
/// mask arithmetic with room to spare).
const MAX_LEN: usize = 1 << 30;
const LOG2E: f32 = std::f32::consts::LOG2_E;

/// One compiled form of the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct HopperFwdVariant {
    dtype: DType,
    head_dim: usize,
    /// Keys per K/V tile.
    block_n: usize,
    stages: usize,
    softcap: bool,
    schedule: Schedule,
    /// Consumer warpgroups: 2, or 3 at d = 64 without a soft-cap ([`consumers_chosen`]).
    consumers: usize,
    softmax: SoftmaxForm,
    /// Q slots: 2 so that the next unit's Q loads during this one (where two K/V stages still
    /// fit beside them), or 1 (`CALICO_ATTN_HOPPER_QBUF=1`).
    q_buffers: usize,
    /// `CALICO_ATTN_HOPPER_TRACE=1`: stamp each unit's milestones (a diagnostic, hopper_trace.rs).
    trace: bool,
    /// Packed sequences (CALICO_ATTN_VARLEN): row bounds from the offsets.
    varlen: bool,
    /// The problem's head dim is below `head_dim` (CALICO_ATTN_PADDED): zero columns past it.
    padded: bool,
    /// The epilogue stages O in the unit's Q slot and stores it with TMA (CALICO_ATTN_TMA_O):
    /// needs two Q slots, fixed-length sequences and O as a TMA view ([`try_forward`] turns it
    /// off otherwise).
    tma_o: bool,
}

/// `CALICO_ATTN_HOPPER_TRACE=1`: every call stamps its units' milestones, syncs and (every 8th
/// call) prints where a unit's time goes (hopper_trace.rs). Off by default.
fn trace_chosen() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("CALICO_ATTN_HOPPER_TRACE").as_deref() == Ok("1"))
}

/// How the kernel writes its softmax (hopper_fwd.cu: softmax_ilp, lazy_max, softmax_stale).
/// All on by default (H100, session 8: ilp and lazy +18-21% at d = 64 with three consumers,
/// +1-4% at d = 128; session 22: stale +1-4% at d = 64, +3-6% at d = 128; docs/perf-log.md).
/// `CALICO_ATTN_HOPPER_SOFTMAX` names those to keep (comma-separated: `ilp`, `lazy`, `stale`;
/// `plain` for none), for A/B runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) struct SoftmaxForm {
    /// Row maxima and sums as trees / partial sums, both rows side by side.
    ilp: bool,
    /// The running max moves only when a block exceeds it by 2^8; the O rescale is skipped
    /// for warps whose rows did not move.
    lazy: bool,
    /// After a unit's first block, exponentials against the running max with no row max
    /// (softmax_stale; needs `ilp` and `lazy`, no soft-cap).
    stale: bool,
}

impl SoftmaxForm {
    fn parse(spec: &str) -> SoftmaxForm {
        let on = |name: &str| spec.split(',').any(|s| s.trim() == name);
        SoftmaxForm {
            ilp: on("ilp"),
            lazy: on("lazy"),
            stale: on("stale"),
        }
    }

    /// Every form: the default.
    const LEAN: SoftmaxForm = SoftmaxForm {
        ilp: true,
        lazy: true,
        stale: true,
    };

    fn chosen() -> SoftmaxForm {
        static CHOSEN: std::sync::OnceLock<SoftmaxForm> = std::sync::OnceLock::new();
        *CHOSEN.get_or_init(|| match std::env::var("CALICO_ATTN_HOPPER_SOFTMAX") {
            Ok(spec) if !spec.trim().is_empty() => SoftmaxForm::parse(&spec),
            _ => SoftmaxForm::LEAN,
        })
    }
}

/// How a consumer warpgroup orders its GEMMs and softmax (hopper_fwd.cu, "Schedule").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Schedule {
    /// Each key block's S, softmax and P V in turn.
    Serial = 0,
    /// S of the next block issued before P V of this one, softmax under the P V.
    Overlapped = 1,
    /// Overlapped, and the two consumers take turns issuing their GEMMs.
    PingPong = 2,
}

impl Schedule {
    /// `CALICO_ATTN_HOPPER_SCHED` = serial | overlapped | pingpong (A/B runs); else the
    /// default.
    fn chosen() -> Schedule {
        static CHOSEN: std::sync::OnceLock<Schedule> = std::sync::OnceLock::new();
        *CHOSEN.get_or_init(
            || match std::env::var("CALICO_ATTN_HOPPER_SCHED").as_deref() {
                Ok("serial") => Schedule::Serial,
                Ok("overlapped") => Schedule::Overlapped,
                _ => Schedule::PingPong,
            },
        )
    }
}

/// Q slots asked for: 2 by default (H100, session 8: +1-3% at d = 128, even at d = 64);
/// `CALICO_ATTN_HOPPER_QBUF=1` keeps one (A/B runs).
fn q_buffers_chosen() -> usize {
    static ONE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *ONE.get_or_init(|| std::env::var("CALICO_ATTN_HOPPER_QBUF").as_deref() == Ok("1")) {
        1
    } else {
        2
    }
}

/// A key-block width named by the environment variable `var` (read once into `cell`) when it
/// is one of `allowed` (A/B runs), else `None`.
fn forced_block_n(
    cell: &'static std::sync::OnceLock<Option<usize>>,
    var: &str,
    allowed: &[usize],
) -> Option<usize> {
    *cell.get_or_init(|| {
        let v = std::env::var(var).ok()?;
        allowed.iter().copied().find(|n| n.to_string() == v.trim())
    })
}

/// Whether the epilogue stores O through shared memory and TMA where it can (the default):
/// `CALICO_ATTN_HOPPER_EPILOGUE=registers` keeps the stores from registers (A/B runs).
fn tma_o_chosen() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("CALICO_ATTN_HOPPER_EPILOGUE").as_deref() != Ok("registers"))
}

/// Keys per K/V block at d = 128: 128. Session 9 had measured 176 from 8192 keys 2-3% faster
/// (kept as the default until session 22); with the stale-max softmax (session 22, H100, two
/// mirrored passes) 128 beats 176 at every length: N8192 675 / 676 against 673 / 649 TFLOP/s,
/// causal 654 / 658 against 620 / 614, N16384 702 / 708 against 687 / 683, causal 665 / 668
/// against 647 / 644, and by 5-17% below 8192 keys (160 lies between). Under a soft-cap 176
/// spills in its key loop as well. `CALICO_ATTN_HOPPER_BN` = 128 | 160 | 176 | 192 forces one
/// (A/B runs).
fn block_n_chosen() -> usize {
    static FORCED: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    forced_block_n(&FORCED, "CALICO_ATTN_HOPPER_BN", &[128, 160, 176, 192]).unwrap_or(128)
}

/// Keys per K/V block at d = 256 for `k_len` keys: 80 from [`WIDE_BLOCKS_D256_FROM`] keys,
/// else 64 (two 80-key stages and the Q tile fill 224 KiB of shared memory, FlashAttention-3's
/// choice too). H100, session 17: 80 gains 3.5-5% from N = 2048 (causal from 4096) and loses
/// 3-8% on causal problems of 512-1024 keys. `CALICO_ATTN_HOPPER_BN256` = 64 | 80 forces one.
fn block_n_d256_chosen(k_len: usize) -> usize {
    static FORCED: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    forced_block_n(&FORCED, "CALICO_ATTN_HOPPER_BN256", &[64, 80]).unwrap_or(
        if k_len >= WIDE_BLOCKS_D256_FROM {
            80
        } else {
            64
        },
    )
}

/// Key count from which d = 256 takes 80-key blocks by default.
const WIDE_BLOCKS_D256_FROM: usize = 2048;

/// Consumer warpgroups at `head_dim`: three at d = 64 by default (192-row units; H100,
/// session 8: +8-11% alone, +18-21% with the lean softmax), two elsewhere;
/// `CALICO_ATTN_HOPPER_CONSUMERS=2` keeps two at d = 64 (A/B runs).
fn consumers_chosen(head_dim: usize) -> usize {
    static THREE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let three =
        *THREE.get_or_init(|| std::env::var("CALICO_ATTN_HOPPER_CONSUMERS").as_deref() != Ok("2"));
    if three && head_dim == 64 {
        3
    } else {
        2
    }
}

/// The A/B choices of a variant as asked for ([`Choices::chosen`] reads the knobs);
/// [`HopperFwdVariant::new`] drops those the head dim cannot take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Choices {
    schedule: Schedule,
    /// Consumer warpgroups, 2 or 3.
    consumers: usize,
    softmax: SoftmaxForm,
    /// Q slots, 1 or 2.
    q_buffers: usize,
    /// Keys per K/V block at d = 128: 128, 176 or 192.
    block_n_d128: usize,
    /// Keys per K/V block at d = 256: 64 or 80 (d = 64 keeps 128).
    block_n_d256: usize,
    /// O through the Q slot and TMA stores (where two Q slots fit).
    tma_o: bool,
}

impl Default for Choices {
    /// Main's default kernel.
    fn default() -> Self {
        Choices {
            schedule: Schedule::PingPong,
            consumers: 3,
            softmax: SoftmaxForm::LEAN,
            q_buffers: 2,
            block_n_d128: 128,
            block_n_d256: 64,
            tma_o: true,
        }
    }
}

impl Choices {
    /// The knobs' choices for `head_dim` and `k_len` keys.
    fn chosen(head_dim: usize, k_len: usize) -> Choices {
        Choices {
            schedule: Schedule::chosen(),
            consumers: consumers_chosen(head_dim),
            softmax: SoftmaxForm::chosen(),
            q_buffers: q_buffers_chosen(),
            block_n_d128: block_n_chosen(),
            block_n_d256: block_n_d256_chosen(k_len),
            tma_o: tma_o_chosen(),
        }
    }
}

impl HopperFwdVariant {
    /// The variant for `head_dim` on `arch` with the `choices` that fit: three consumer
    /// warpgroups only at d = 64 without a soft-cap, a second Q slot only where two K/V stages
    /// still fit beside it; as many K/V stages as shared memory holds (at most
    /// [`MAX_STAGES`]). `None` when not even two fit.
    fn new(
        arch: &Arch,
        dtype: DType,
        head_dim: usize,
        softcap: bool,
        choices: Choices,
    ) -> Option<Self> {
        let Choices {
            schedule,
            consumers,
            softmax,
            q_buffers,
            block_n_d128,
            block_n_d256,
            tma_o,
        } = choices;
        let block_n = match head_dim {
            128 => block_n_d128,
            d if d > 128 => block_n_d256,
            _ => 128,
        };
        // Three consumers have 160 registers each: enough at d = 64 without a soft-cap (no
        // spills in the SASS), not with tanh's temporaries (stack traffic in the loop).
        let consumers = if head_dim == 64 && !softcap {
            consumers.clamp(2, 3)
        } else {
            2
        };
        // The stale-max form extends the lazy tree form, and not under a soft-cap (its
        // tanh'd scores are bounded anyway) nor in the serial schedule (one softmax per turn).
        let softmax = SoftmaxForm {
            stale: softmax.stale
                && softmax.ilp
                && softmax.lazy
                && !softcap
                && schedule != Schedule::Serial,
            ..softmax
        };
        let one = HopperFwdVariant {
            dtype,
            head_dim,
            block_n,
            stages: 0,
            softcap,
            schedule,
            consumers,
            softmax,
            q_buffers: 1,
            trace: trace_chosen(),
            varlen: false,
            padded: false,
            tma_o: false,
        };
        // 1024 bytes of slack beside the kernel's own alignment slack.
        let budget = arch.shared_mem_per_block.saturating_sub(1024);
        let fit = |q_buffers: usize| {
            let one = HopperFwdVariant { q_buffers, ..one };
            (2..=MAX_STAGES)
                .rev()
                .map(|stages| HopperFwdVariant { stages, ..one })
                .find(|v| v.smem_bytes() <= budget)
        };
        // A second Q slot where two K/V stages still fit beside it (not d = 256).
        // O staged in a Q slot needs the other slot for the next unit's Q.
        (q_buffers >= 2)
            .then(|| fit(2))
            .flatten()
            .or_else(|| fit(1))
            .map(|v| HopperFwdVariant {
                tma_o: tma_o && v.q_buffers == 2,
                ..v
            })
    }

    /// Must match hopper_fwd.cu: alignment slack, the Q slots, the K and V rings,
    /// 4 * STAGES + 2 * QBUF mbarriers.
    fn smem_bytes(&self) -> usize {
        let d = self.head_dim;
        1024 + self.q_buffers * self.block_m() * d * 2
            + 2 * self.stages * self.block_n * d * 2
            + (4 * self.stages + 2 * self.q_buffers) * 8
    }

    /// This variant for packed sequences (`varlen`) or fixed lengths. Packed units may end
    /// inside a TMA box, on the next sequence's rows, so they keep the stores from registers.
    fn with_varlen(self, varlen: bool) -> Self {
        HopperFwdVariant {
            varlen,
            tma_o: self.tma_o && !varlen,
            ..self
        }
    }

    /// Query rows per work unit.
    fn block_m(&self) -> usize {
        ROWS_PER_CONSUMER * self.consumers
    }

    fn threads(&self) -> u32 {
        (WARPGROUP * (self.consumers + 1)) as u32
    }

    pub(crate) fn label(&self) -> String {
        format!(
            "hopper fwd {} d={} bm={} bn={} stages={} qbuf={} softcap={} {:?}{}{}{}{}{}{}{}",
            self.dtype,
            self.head_dim,
            self.block_m(),
            self.block_n,
            self.stages,
            self.q_buffers,
            self.softcap,
            self.schedule,
            if self.softmax.ilp { " ilp" } else { "" },
            if self.softmax.lazy { " lazy" } else { "" },
            if self.softmax.stale { " stale" } else { "" },
            if self.trace { " trace" } else { "" },
            if self.varlen { " varlen" } else { "" },
            if self.padded { " padded" } else { "" },
            if self.tma_o { " tma_o" } else { "" },
        )
    }
}

impl KernelVariant for HopperFwdVariant {
    fn source(&self, vendor: calico_core::HeaderSet) -> Result<KernelSource> {
        let defines = [
            ("CALICO_ATTN_T", self.dtype.device_type().to_string()),
            ("CALICO_ATTN_D", self.head_dim.to_string()),
            ("CALICO_ATTN_BN", self.block_n.to_string()),
            ("CALICO_ATTN_STAGES", self.stages.to_string()),
            ("CALICO_ATTN_SOFTCAP", u8::from(self.softcap).to_string()),
            ("CALICO_ATTN_SCHED", (self.schedule as u8).to_string()),
            ("CALICO_ATTN_CONSUMERS", self.consumers.to_string()),
            ("CALICO_ATTN_ILP", u8::from(self.softmax.ilp).to_string()),
            ("CALICO_ATTN_LAZY", u8::from(self.softmax.lazy).to_string()),
            (
                "CALICO_ATTN_STALE",
                u8::from(self.softmax.stale).to_string(),
            ),
            ("CALICO_ATTN_QBUF", self.q_buffers.to_string()),
            ("CALICO_ATTN_TRACE", u8::from(self.trace).to_string()),
            ("CALICO_ATTN_VARLEN", u8::from(self.varlen).to_string()),
            ("CALICO_ATTN_PADDED", u8::from(self.padded).to_string()),
            ("CALICO_ATTN_TMA_O", u8::from(self.tma_o).to_string()),
        ];
        KernelSource::assemble(
            ENTRY,
            SOURCE,
            &[vendor, calico_core::device_headers(), PACKED_HEADERS],
            &defines,
        )
    }
}

/// Representative variants for the compile checks and `calico compile` (sm_90a only).
pub(crate) fn catalog(
    arch: &Arch,
    vendor: calico_core::HeaderSet,
) -> Result<Vec<crate::catalog::CatalogEntry>> {
    let mut out = Vec::new();
    if !arch_ok(arch) {
        return Ok(out);
    }
    let plain = SoftmaxForm::default();
    let lean = SoftmaxForm::LEAN;
    // Session 21's default: the row max on every block.
    let no_stale = SoftmaxForm {
        stale: false,
        ..lean
    };
    let choices = |schedule, consumers, softmax, q_buffers, block_n_d128| Choices {
        schedule,
        consumers,
        softmax,
        q_buffers,
        block_n_d128,
        block_n_d256: 64,
        tma_o: true,
    };
    let (pp, ov, se) = (Schedule::PingPong, Schedule::Overlapped, Schedule::Serial);
    let (bf, hf) = (DType::BF16, DType::F16);
    for (dtype, d, softcap, choices) in [
        (bf, 64, false, choices(pp, 2, plain, 1, 128)),
        (bf, 64, false, choices(pp, 3, plain, 1, 128)),
        (bf, 64, false, choices(pp, 3, lean, 2, 128)),
        (bf, 64, false, choices(ov, 3, plain, 1, 128)),
        (hf, 64, false, choices(pp, 3, plain, 1, 128)),
        (bf, 128, false, choices(pp, 2, plain, 1, 128)),
        (bf, 128, false, choices(pp, 2, lean, 1, 128)),
        (bf, 128, false, choices(pp, 2, lean, 2, 128)),
        (bf, 128, false, choices(ov, 2, plain, 1, 128)),
        (bf, 128, false, choices(se, 2, plain, 1, 128)),
        (hf, 128, true, choices(pp, 2, plain, 1, 128)),
        (hf, 128, true, choices(pp, 2, lean, 2, 128)),
        (bf, 128, true, choices(pp, 2, lean, 2, 128)),
        (bf, 128, false, choices(pp, 2, lean, 2, 160)),
        (bf, 128, false, choices(pp, 2, lean, 2, 176)),
        (hf, 128, true, choices(pp, 2, lean, 2, 176)),
        (bf, 128, false, choices(pp, 2, lean, 2, 192)),
        (bf, 64, false, choices(pp, 3, no_stale, 2, 128)),
        (bf, 128, false, choices(pp, 2, no_stale, 2, 128)),
        (bf, 128, false, choices(pp, 2, no_stale, 2, 176)),
        // The stores from registers (CALICO_ATTN_HOPPER_EPILOGUE=registers).
        (
            bf,
            128,
            false,
            Choices {
                tma_o: false,
                ..choices(pp, 2, lean, 2, 128)
            },
        ),
        (bf, 256, false, choices(pp, 2, plain, 1, 128)),
        (bf, 256, false, choices(pp, 2, lean, 2, 128)),
        (
            bf,
            256,
            false,
            Choices {
                block_n_d256: 80,
                ..choices(pp, 2, lean, 2, 128)
            },
        ),
    ] {
        if let Some(v) = HopperFwdVariant::new(arch, dtype, d, softcap, choices) {
            out.push(crate::catalog::CatalogEntry {
                op: "attention_hopper",
                label: v.label(),
                source: v.source(vendor)?,
            });
        }
    }
    // The traced form of the defaults (CALICO_ATTN_HOPPER_TRACE=1) and the packed-sequence
    // form, so that they stay compiled.
    // The head dims below 64, 128 and 256 (padded) too.
    for (d, trace, varlen, padded) in [
        (64, true, false, false),
        (128, true, false, false),
        (64, false, true, false),
        (128, false, true, false),
        (64, false, false, true),
        (128, false, false, true),
        (256, false, false, true),
    ] {
        if let Some(v) = HopperFwdVariant::new(arch, bf, d, false, Choices::default()) {
            let v = HopperFwdVariant {
                trace,
                padded,
                ..v.with_varlen(varlen)
            };
            out.push(crate::catalog::CatalogEntry {
                op: "attention_hopper",
                label: v.label(),
                source: v.source(vendor)?,
            });
        }
    }
    Ok(out)
}

pub(crate) fn arch_ok(arch: &Arch) -> bool {
    arch.target.ends_with("90a")
        && arch.has_mma(MmaKind::Wgmma, DType::BF16)
        && arch.has_async_copy(AsyncCopy::Tma)
}

/// On by default: it passed the attention conformance suite and memcheck, racecheck, synccheck
/// and initcheck on the H100 (session 4) and runs 3-5x faster than the tile kernel.
/// `CALICO_ATTN_HOPPER=0` sends every problem to the tile kernel instead (A/B runs).
/// (The backward's switch is in hopper_bwd.rs; this one turns off both.)
pub(crate) fn hopper_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("CALICO_ATTN_HOPPER").as_deref() != Ok("0"))
}

/// The widest store of an O (or dQ) row (calico::ROW_STORE_* in tile.cuh): 16 bytes when the base is
/// 16-byte aligned and every used stride a multiple of 8 elements, 4 bytes when both are
/// even, else one element at a time. `vector`: whether 16-byte stores may be used.
pub(crate) fn o_store(shape: &[usize], strides: &[usize], ptr: u64, vector: bool) -> i32 {
    let used = |i: usize| shape[i] > 1;
    let all_multiple = |m: usize| (0..3).all(|i| !used(i) || strides[i].is_multiple_of(m));
    if vector && ptr.is_multiple_of(16) && all_multiple(8) {
        2
    } else if ptr.is_multiple_of(4) && all_multiple(2) {
        1
    } else {
        0
    }
}

/// The kernel's tuning switches, all on unless `CALICO_ATTN_HOPPER_TUNE` names some to turn
/// off (comma-separated: `nokvfirst`, `nofold`, `novec`, `noqthread`,
/// `nodecodeahead`, `nofastepi`, `noskip`, `nofoldodd`, `nostage`, `nolongest`), for A/B
/// runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tune {
    /// The producer loads a unit's first K/V block before waiting for the Q slot.
    kv_first: bool,
    /// Causal and windowed problems pair long and short row blocks on one CTA.
    fold: bool,
    /// 16-byte O stores where alignment allows.
    vector_stores: bool,
    /// Q loaded by a thread of its own, a unit ahead with two Q slots.
    q_thread: bool,
    /// Consumers decode their next unit during this one.
    decode_ahead: bool,
    /// MUFU approximations for 1 / l and ln l in the epilogue.
    fast_epilogue: bool,
    /// A consumer passes over the key blocks none of its 64 rows sees (causal 192-row
    /// blocks, rows past Nq) without computing them.
    skip_unseen: bool,
    /// With `fold`, odd row-block counts are folded too, each head's unpaired middle block
    /// after all pairs. Measured with three consumers (192-row blocks: N = 2048 and 8192 have
    /// 11 and 43) and, in session 19, with two (4097 tokens, 33 blocks, causal: +18%; plain
    /// descending order had left the longest units of the last heads to the end).
    fold_odd: bool,
    /// Packed sequences: the offsets staged in shared memory where they fit (host only: the
    /// kernel argument `offsets_staged`), and with them units per sequence.
    stage_offsets: bool,
    /// Per-sequence units go out longest sequence first, rounds dealt in alternating
    /// directions (mixed lengths would otherwise leave the longest units for the end).
    longest_first: bool,
}

impl Tune {
    fn parse(spec: &str) -> Tune {
        let off = |name: &str| spec.split(',').any(|s| s.trim() == name);
        Tune {
            kv_first: !off("nokvfirst"),
            fold: !off("nofold"),
            vector_stores: !off("novec"),
            q_thread: !off("noqthread"),
            decode_ahead: !off("nodecodeahead"),
            fast_epilogue: !off("nofastepi"),
            skip_unseen: !off("noskip"),
            fold_odd: !off("nofoldodd"),
            stage_offsets: !off("nostage"),
            longest_first: !off("nolongest"),
        }
    }
    /// hopper_fwd.cu's TUNE_* bits.
    fn bits(&self) -> i32 {
        i32::from(self.kv_first)
            | i32::from(self.fold) << 1
            | i32::from(self.fold && self.fold_odd) << 2
            | i32::from(self.q_thread) << 3
            | i32::from(self.decode_ahead) << 4
            | i32::from(self.fast_epilogue) << 5
            | i32::from(self.skip_unseen) << 6
            | i32::from(self.longest_first) << 7
    }
}

fn tune() -> Tune {
    static TUNE: std::sync::OnceLock<Tune> = std::sync::OnceLock::new();
    crate::knobs::read(&TUNE, "CALICO_ATTN_HOPPER_TUNE", Tune::parse)
}

/// A TMA dimension's byte stride: the real one, or any valid value where the extent is 1.
fn tma_stride(stride: usize, extent: usize, fallback_bytes: u64) -> Option<u64> {
    if extent <= 1 {
        Some(fallback_bytes.div_ceil(16).max(1) * 16)
    } else {
        let bytes = (stride * 2) as u64;
        (bytes.is_multiple_of(16) && bytes > 0).then_some(bytes)
    }
}

/// The 4-D map {D, N, H, B} over a `[B, H, N, D]` view, box {64, rows, 1, 1}, 128B swizzle;
/// `None` when TMA cannot express the view (alignment, strides).
pub(crate) fn view_map(t: &Tensor, rows: usize) -> Option<OpaqueParam128> {
    let [b, h, n, d] = <[usize; 4]>::try_from(t.shape()).ok()?;
    let st = t.strides();
    let ptr = t.device_ptr()?;
    if ptr % 16 != 0 || (d > 1 && st[3] != 1) {
        return None;
    }
    let s_n = tma_stride(st[2], n, (d * 2) as u64)?;
    let s_h = tma_stride(st[1], h, s_n * n as u64)?;
    let s_b = tma_stride(st[0], b, s_h * h as u64)?;
    TiledMap::<4> {
        address: ptr,
        dtype: t.dtype(),
        dims: [d as u64, n as u64, h as u64, b as u64],
        strides_bytes: [s_n, s_h, s_b, 0],
        box_dims: [CHUNK as u32, rows as u32, 1, 1],
        swizzle: Swizzle::B128,
    }
    .encode_cached()
    .ok()
}

/// Heads (of the work order) whose K and V together take about half the L2, or
/// `CALICO_ATTN_HOPPER_CHUNK` heads (an A/B switch).
fn heads_per_chunk(arch: &Arch, p: &Problem) -> usize {
    static FORCED: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let forced = *FORCED.get_or_init(|| {
        std::env::var("CALICO_ATTN_HOPPER_CHUNK")
            .ok()
            .and_then(|v| v.parse().ok())
    });
    if let Some(heads) = forced {
        return heads.clamp(1, (p.batch * p.q_heads).max(1));
    }
    let kv_bytes = (2 * p.k_len * p.head_dim * 2).max(1);
    let budget = if arch.l2_bytes == 0 {
        25 << 20
    } else {
        arch.l2_bytes / 2
    };
    let group = p.q_heads / p.kv_heads;
    ((budget / kv_bytes).max(1) * group).clamp(1, p.batch * p.q_heads)
}

/// The most work units a forward launch of `p` can have (the narrowest row blocks). Packed
/// sequences run as one batch of all the rows: `p.batch` counts the sequences there, and
/// multiplying by it would refuse large packed batches that fit; their per-sequence units add
/// at most one partial block per sequence.
fn max_units(p: &Problem, varlen: bool) -> usize {
    let blocks = p.q_len.div_ceil(ROWS_PER_CONSUMER * 2);
    if varlen {
        p.q_heads * (blocks + p.batch)
    } else {
        p.batch * p.q_heads * blocks
    }
}

/// The Hopper variant for a problem on `arch`, or `None` when the kernel does not cover it
/// (the router's rule; the operands must also be TMA views, see [`try_forward`]).
pub(crate) fn forward_variant(
    arch: &Arch,
    p: &Problem,
    params: &AttentionParams,
    varlen: bool,
) -> Option<HopperFwdVariant> {
    // The kernel takes the row max before scaling (hopper_fwd.cu): the factor from scores to
    // base-2 units must be positive. A cap makes it cap * log2(e); else it is the scale.
    let scale_positive = params.softcap.is_some() || params.scale > 0.0;
    let fits = hopper_enabled()
        && scale_positive
        && arch_ok(arch)
        && matches!(p.dtype, DType::BF16 | DType::F16)
        && p.q_len <= MAX_LEN
        && p.k_len <= MAX_LEN
        && max_units(p, varlen) <= i32::MAX as usize;
    if !fits {
        return None;
    }
    // Packed sequences: the block width goes by the mean sequence's keys, not the total.
    let keys = if varlen {
        p.k_len / p.batch.max(1)
    } else {
        p.k_len
    };
    let d = kernel_head_dim(p.head_dim, 256)?;
    let softcap = params.softcap.is_some();
    HopperFwdVariant::new(arch, p.dtype, d, softcap, Choices::chosen(d, keys)).map(|v| {
        HopperFwdVariant {
            padded: d != p.head_dim,
            ..v.with_varlen(varlen)
        }
    })
}

/// A packed `[total, heads, D]` tensor as the one-batch `[1, heads, total, D]` view the
/// kernel's maps and stores take.
pub(super) fn packed_as_batch(t: &Tensor) -> Option<Tensor> {
    let [total, heads, d] = <[usize; 3]>::try_from(t.shape()).ok()?;
    let st = t.strides();
    let span = (total * st[0]).max(heads * st[1]).max(1);
    t.as_strided(
        &[1, heads, total, d],
        &[span, st[1], st[0], st[2]],
        t.layout().offset(),
    )
    .ok()
}

/// Runs `variant` on the tensors: `None` when TMA cannot express Q, K or V (the caller
/// routes again without the Hopper kernel), else the launch's result.
pub(crate) fn try_forward(
    dev: &Device,
    p: &Problem,
    params: &AttentionParams,
    variant: HopperFwdVariant,
    t: [&Tensor; 5],
    varlen: Option<[&Tensor; 2]>,
) -> Option<Result<()>> {
    let [q, k, v, o, lse] = t;
    let arch = dev.arch();
    let gpu = dev.as_gpu()?;
    // Packed sequences run as one batch of all the rows (hopper_fwd.cu, packed_row_keys).
    let views: [Tensor; 4];
    let ([q, k, v, o], packed) = match varlen {
        Some([cu_q, cu_k]) => {
            views = [
                packed_as_batch(q)?,
                packed_as_batch(k)?,
                packed_as_batch(v)?,
                packed_as_batch(o)?,
            ];
            let offsets = Packed::of(cu_q, cu_k, p.batch)?;
            ([&views[0], &views[1], &views[2], &views[3]], Some(offsets))
        }
        None => ([q, k, v, o], None),
    };
    let map_q = view_map(q, variant.block_m())?;
    let map_k = view_map(k, variant.block_n)?;
    let map_v = view_map(v, variant.block_n)?;
    // O through TMA where it is a TMA view; else the stores from registers.
    let map_o = variant
        .tma_o
        .then(|| view_map(o, ROWS_PER_CONSUMER))
        .flatten();
    let variant = HopperFwdVariant {
        tma_o: map_o.is_some(),
        ..variant
    };
    let p = Problem {
        batch: if packed.is_some() { 1 } else { p.batch },
        ..*p
    };
    Some(launch(
        gpu,
        arch,
        &p,
        params,
        variant,
        [map_q, map_k, map_v, map_o.unwrap_or(map_q)],
        o,
        lse,
        packed,
    ))
}

/// Arrays the forward stages in shared memory per packed batch (hopper_fwd.cu's `staged_array`,
/// which asserts the same count): the query and key offsets, the row-block counts, the order the
/// sequences go in and, over that order, the prefix sums of row blocks and of odd block counts.
const STAGED_ARRAYS: usize = 6;

/// The offsets of packed sequences, as the Hopper kernels (forward and backward) take them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Packed {
    cu_q: u64,
    cu_k: u64,
    seqs: usize,
}

impl Packed {
    /// `None` when an offsets tensor has no device address.
    pub(super) fn of(cu_q: &Tensor, cu_k: &Tensor, seqs: usize) -> Option<Packed> {
        Some(Packed {
            cu_q: cu_q.device_ptr()?,
            cu_k: cu_k.device_ptr()?,
            seqs,
        })
    }

    /// Shared memory for what the forward stages per sequence: STAGED_ARRAYS arrays of
    /// `n_seqs + 1` i32 each.
    pub(super) fn staged_bytes(&self) -> usize {
        STAGED_ARRAYS * (self.seqs + 1) * std::mem::size_of::<i32>()
    }

    /// The kernels' last three arguments: `cu_q`, `cu_k`, `n_seqs` (null and 0 for
    /// fixed-length calls).
    pub(super) fn args(packed: Option<Packed>) -> [KernelArg; 3] {
        [
            KernelArg::Ptr(packed.map_or(0, |x| x.cu_q)),
            KernelArg::Ptr(packed.map_or(0, |x| x.cu_k)),
            KernelArg::I32(packed.map_or(0, |x| x.seqs as i32)),
        ]
    }
}

/// Bytes of shared memory past the barriers where the forward stages the packed offsets:
/// where they fit beside `variant`, with the same 1024 bytes of slack the variant was chosen
/// with. `None`: the kernel reads them from global memory.
fn staged_offsets(
    arch: &Arch,
    variant: &HopperFwdVariant,
    packed: Option<Packed>,
) -> Option<usize> {
    packed
        .map(|x| x.staged_bytes())
        .filter(|&bytes| variant.smem_bytes() + bytes + 1024 <= arch.shared_mem_per_block)
}

#[allow(clippy::too_many_arguments)]
fn launch(
    gpu: &dyn GpuBackend,
    arch: &Arch,
    p: &Problem,
    params: &AttentionParams,
    variant: HopperFwdVariant,
    maps: [OpaqueParam128; 4],
    o: &Tensor,
    lse: &Tensor,
    packed: Option<Packed>,
) -> Result<()> {
    let os = o.strides();
    let o_ptr = o.device_ptr().unwrap_or(0);
    let lse_ptr = lse.device_ptr().unwrap_or(0);
    let o_store = o_store(o.shape(), os, o_ptr, tune().vector_stores);
    let (score_scale, cap_log2) = match params.softcap {
        Some(cap) => (params.scale / cap, cap * LOG2E),
        None => (params.scale * LOG2E, 0.0),
    };
    let side = |s: Option<usize>| (i32::from(s.is_some()), s.unwrap_or(0) as i64);
    let (has_left, left) = side(params.left);
    let (has_right, right) = side(params.right);
    let staged = staged_offsets(arch, &variant, packed.filter(|_| tune().stage_offsets));
    // Units: per-sequence units (staged offsets) add at most a partial block per sequence; the
    // kernel counts them itself and the host sizes the grid and the trace by this bound.
    let extra = match (packed, staged) {
        (Some(x), Some(_)) => x.seqs,
        _ => 0,
    };
    let work = p.batch * p.q_heads * (p.q_len.div_ceil(variant.block_m()) + extra);
    let grid = work.min(arch.compute_units.max(1) as usize).max(1) as u32;
    let [map_q, map_k, map_v, map_o] = maps;
    // trace: a zeroed buffer for the stamps (milestones not reached stay 0).
    let per_cta = work.div_ceil(grid as usize);
    let trace = if variant.trace {
        let words = grid as usize * per_cta * variant.consumers * hopper_trace::SLOTS;
        Some(stamps::zeroed(gpu, words)?)
    } else {
        None
    };
    let trace_ptr = trace.as_ref().and_then(|t| t.device_address()).unwrap_or(0);
    let [cu_q, cu_k, n_seqs] = Packed::args(packed);
    let smem_bytes = variant.smem_bytes() + staged.unwrap_or(0);
    let args = [
        KernelArg::Opaque128(map_q),
        KernelArg::Opaque128(map_k),
        KernelArg::Opaque128(map_v),
        KernelArg::Opaque128(map_o),
        KernelArg::Ptr(o_ptr),
        KernelArg::Ptr(lse_ptr),
        KernelArg::I32(p.batch as i32),
        KernelArg::I32(p.q_heads as i32),
        KernelArg::I32((p.q_heads / p.kv_heads) as i32),
        KernelArg::I32(p.q_len as i32),
        KernelArg::I32(p.k_len as i32),
        KernelArg::I32(heads_per_chunk(arch, p) as i32),
        KernelArg::I64(os[0] as i64),
        KernelArg::I64(os[1] as i64),
        KernelArg::I64(os[2] as i64),
        KernelArg::I32(o_store),
        KernelArg::F32(score_scale),
        KernelArg::F32(cap_log2),
        KernelArg::I32(has_left),
        KernelArg::I64(left),
        KernelArg::I32(has_right),
        KernelArg::I64(right),
        KernelArg::I32(tune().bits()),
        KernelArg::Ptr(trace_ptr),
        cu_q,
        cu_k,
        n_seqs,
        KernelArg::I32(p.head_dim as i32),
        KernelArg::I32(i32::from(staged.is_some())),
    ];
    let config = LaunchConfig::linear(grid, variant.threads(), smem_bytes as u32);
    gpu.launch_variant(&variant, &config, &args)?;
    if let Some(storage) = trace {
        let stamps = stamps::read(gpu, storage.as_ref())?;
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        if stamps::every_eighth(&CALLS) {
            eprintln!(
                "[attention fwd b{} h{} n{} d{} causal={} {}] {}",
                p.batch,
                p.q_heads,
                p.q_len,
                p.head_dim,
                params.right == Some(0),
                variant.label(),
                hopper_trace::summary(
                    &stamps,
                    grid as usize,
                    per_cta,
                    variant.consumers,
                    p.k_len.div_ceil(variant.block_n)
                )
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100() -> Arch {
        Arch::for_target("sm_90a").unwrap()
    }

    fn choices(consumers: usize, q_buffers: usize) -> Choices {
        Choices {
            consumers,
            q_buffers,
            ..Choices::default()
        }
    }

    #[test]
    fn head_dims_run_at_the_next_kernel_width() {
        for (d, kernel) in [(8, 64), (32, 64), (64, 64), (72, 128), (80, 128), (96, 128)] {
            assert_eq!(kernel_head_dim(d, 256), Some(kernel), "d = {d}");
        }
        assert_eq!(kernel_head_dim(136, 256), Some(256));
        assert_eq!(kernel_head_dim(256, 256), Some(256));
        // Not multiples of 8 (rows not 16-byte multiples), wider than the widest, zero.
        for d in [0, 1, 36, 100, 264] {
            assert_eq!(kernel_head_dim(d, 256), None, "d = {d}");
        }
        assert_eq!(kernel_head_dim(136, 128), None);
        assert_eq!(kernel_head_dim(96, 128), Some(128));
    }

    /// A bf16 multi-head problem of `heads` heads, `len` queries and keys.
    fn mha(batch: usize, heads: usize, len: usize, head_dim: usize) -> Problem {
        Problem {
            batch,
            q_heads: heads,
            kv_heads: heads,
            q_len: len,
            k_len: len,
            head_dim,
            dtype: DType::BF16,
        }
    }

    /// Scale 0.1, no soft-cap, no window.
    fn unmasked() -> AttentionParams {
        AttentionParams {
            scale: 0.1,
            softcap: None,
            left: None,
            right: None,
        }
    }

    #[test]
    fn padded_head_dims_take_the_wider_variant() {
        let arch = h100();
        let problem = |head_dim| mha(1, 2, 300, head_dim);
        let params = unmasked();
        let v96 = forward_variant(&arch, &problem(96), &params, false).unwrap();
        let v128 = forward_variant(&arch, &problem(128), &params, false).unwrap();
        assert_eq!(
            v96,
            HopperFwdVariant {
                padded: true,
                ..v128
            }
        );
        assert!(v96.label().contains(" padded"));
        assert!(!v128.padded);
        assert!(forward_variant(&arch, &problem(100), &params, false).is_none());
    }

    #[test]
    fn o_goes_through_tma_only_with_two_q_slots_and_fixed_lengths() {
        let arch = h100();
        for d in [64, 128, 256] {
            for q_buffers in [1, 2] {
                let v = HopperFwdVariant::new(&arch, DType::BF16, d, false, choices(3, q_buffers))
                    .unwrap();
                assert_eq!(v.tma_o, v.q_buffers == 2, "{v:?}");
                assert!(v.tma_o || !v.label().contains("tma_o"));
            }
        }
        // d = 256 has room for one Q slot only: its O goes from registers.
        let v256 =
            HopperFwdVariant::new(&arch, DType::BF16, 256, false, Choices::default()).unwrap();
        assert!(!v256.tma_o);
        let registers = Choices {
            tma_o: false,
            ..Choices::default()
        };
        assert!(
            !HopperFwdVariant::new(&arch, DType::BF16, 128, false, registers)
                .unwrap()
                .tma_o
        );
        let problem = mha(2, 4, 500, 128);
        let params = unmasked();
        assert!(
            forward_variant(&arch, &problem, &params, false)
                .unwrap()
                .tma_o
        );
        // Packed units may end inside a box: the next sequence's rows.
        assert!(
            !forward_variant(&arch, &problem, &params, true)
                .unwrap()
                .tma_o
        );
    }

    #[test]
    fn variants_fit_shared_memory_with_two_stages_or_more() {
        let arch = h100();
        for d in [64, 128, 256] {
            for (consumers, q_buffers) in [(2, 1), (3, 1), (2, 2), (3, 2)] {
                let v = HopperFwdVariant::new(
                    &arch,
                    DType::BF16,
                    d,
                    false,
                    choices(consumers, q_buffers),
                )
                .unwrap();
                assert!(v.stages >= 2, "{v:?}");
                assert!(v.smem_bytes() + 1024 <= arch.shared_mem_per_block, "{v:?}");
            }
        }
        let v = HopperFwdVariant::new(&arch, DType::BF16, 128, false, choices(2, 1)).unwrap();
        assert_eq!(
            (v.block_m(), v.block_n, v.stages, v.threads()),
            (128, 128, 3, 384)
        );
        assert_eq!(v.smem_bytes(), 1024 + 32768 + 3 * 65536 + 14 * 8);
    }

    #[test]
    fn wide_key_blocks_at_d128_take_one_q_slot_and_two_stages() {
        let arch = h100();
        for (bn, bytes) in [
            (176, 1024 + 32768 + 2 * 2 * 176 * 256 + 10 * 8),
            (192, 1024 + 32768 + 2 * 2 * 192 * 256 + 10 * 8),
        ] {
            let asked = Choices {
                block_n_d128: bn,
                ..Choices::default()
            };
            let v = HopperFwdVariant::new(&arch, DType::BF16, 128, false, asked).unwrap();
            assert_eq!((v.block_n, v.q_buffers, v.stages), (bn, 1, 2));
            assert_eq!(v.smem_bytes(), bytes);
            assert!(v.smem_bytes() + 1024 <= arch.shared_mem_per_block, "{v:?}");
            // Other head dims keep their blocks.
            let d64 = HopperFwdVariant::new(&arch, DType::BF16, 64, false, asked).unwrap();
            assert_eq!((d64.block_n, d64.consumers), (128, 3));
        }
        if std::env::var_os("CALICO_ATTN_HOPPER_BN").is_none() {
            assert_eq!(block_n_chosen(), 128);
            for k_len in [1, 8192, 1 << 20] {
                assert_eq!(Choices::chosen(128, k_len).block_n_d128, 128);
            }
        }
    }

    #[test]
    fn eighty_key_blocks_at_d256_fill_shared_memory_with_two_stages() {
        let arch = h100();
        let asked = Choices {
            block_n_d256: 80,
            ..Choices::default()
        };
        let v = HopperFwdVariant::new(&arch, DType::BF16, 256, false, asked).unwrap();
        assert_eq!((v.block_n, v.q_buffers, v.stages), (80, 1, 2));
        assert_eq!(v.smem_bytes(), 1024 + 65536 + 2 * 2 * 80 * 512 + 10 * 8);
        assert!(v.smem_bytes() + 1024 <= arch.shared_mem_per_block, "{v:?}");
        // d = 128 keeps its own block.
        let d128 = HopperFwdVariant::new(&arch, DType::BF16, 128, false, asked).unwrap();
        assert_eq!(d128.block_n, 128);
        if std::env::var_os("CALICO_ATTN_HOPPER_BN256").is_none() {
            assert_eq!(block_n_d256_chosen(WIDE_BLOCKS_D256_FROM - 1), 64);
            assert_eq!(block_n_d256_chosen(WIDE_BLOCKS_D256_FROM), 80);
        }
    }

    #[test]
    fn packed_offsets_are_staged_where_they_fit_beside_the_variant() {
        let arch = h100();
        let packed = |seqs| {
            Some(Packed {
                cu_q: 0,
                cu_k: 0,
                seqs,
            })
        };
        let d128 = HopperFwdVariant::new(&arch, DType::BF16, 128, false, Choices::default());
        let d128 = d128.unwrap();
        assert_eq!(staged_offsets(&arch, &d128, packed(8)), Some(216));
        assert_eq!(staged_offsets(&arch, &d128, None), None);
        // Two 80-key stages at d = 256 leave under 1 KiB: 38 sequences fit, 39 do not.
        let asked = Choices {
            block_n_d256: 80,
            ..Choices::default()
        };
        let d256 = HopperFwdVariant::new(&arch, DType::BF16, 256, false, asked).unwrap();
        assert_eq!(staged_offsets(&arch, &d256, packed(38)), Some(936));
        assert_eq!(staged_offsets(&arch, &d256, packed(39)), None);
    }

    #[test]
    fn three_consumers_only_at_head_dim_64() {
        let arch = h100();
        let v = HopperFwdVariant::new(&arch, DType::BF16, 64, false, choices(3, 1)).unwrap();
        assert_eq!((v.block_m(), v.threads(), v.stages), (192, 512, 4));
        assert_eq!(
            v.smem_bytes(),
            1024 + 192 * 64 * 2 + 2 * 4 * 128 * 64 * 2 + 18 * 8
        );
        let v = HopperFwdVariant::new(&arch, DType::BF16, 128, false, choices(3, 1)).unwrap();
        assert_eq!((v.block_m(), v.threads()), (128, 384));
        let v = HopperFwdVariant::new(&arch, DType::BF16, 64, true, choices(3, 1)).unwrap();
        assert_eq!(v.block_m(), 128);
    }

    #[test]
    fn other_targets_are_declined() {
        assert!(arch_ok(&h100()));
        assert!(!arch_ok(&Arch::for_target("sm_80").unwrap()));
        assert!(!arch_ok(&Arch::for_target("sm_90").unwrap()));
    }

    #[test]
    fn o_stores_are_as_wide_as_the_alignment_allows() {
        let shape = [2, 4, 100, 128];
        assert_eq!(o_store(&shape, &[51200, 12800, 128, 1], 256, true), 2);
        assert_eq!(o_store(&shape, &[51200, 12800, 128, 1], 256, false), 1);
        assert_eq!(o_store(&shape, &[51200, 12800, 128, 1], 260, true), 1);
        assert_eq!(o_store(&shape, &[51204, 12804, 130, 1], 256, true), 1);
        assert_eq!(o_store(&shape, &[51200, 12800, 129, 1], 256, true), 0);
        assert_eq!(o_store(&shape, &[51200, 12800, 128, 1], 258, true), 0);
        // A dimension of extent 1 may have any stride.
        assert_eq!(
            o_store(&[1, 4, 100, 128], &[3, 12800, 128, 1], 256, true),
            2
        );
    }

    #[test]
    fn tune_switches_turn_off_by_name() {
        let all = Tune::parse("");
        assert_eq!(all.bits(), 255);
        assert!(all.vector_stores);
        let some = Tune::parse("nofold, novec");
        assert_eq!(some.bits(), 249);
        assert!(!some.vector_stores);
        let none = "nokvfirst,nofold,noqthread,nodecodeahead,nofastepi,noskip,nolongest";
        assert_eq!(Tune::parse(none).bits(), 0);
        assert_eq!(Tune::parse("noqthread").bits(), 247);
        assert_eq!(
            Tune::parse("nodecodeahead,nofastepi,noskip,nolongest").bits(),
            15
        );
        assert_eq!(Tune::parse("nolongest").bits(), 127);
        // The odd-count fold alone, and never without the fold itself.
        assert_eq!(Tune::parse("nofoldodd").bits(), 251);
        assert_eq!(Tune::parse("nofold").bits() & 4, 0);
    }

    #[test]
    fn a_second_q_slot_only_where_two_stages_still_fit() {
        let arch = h100();
        let v = |d, q| HopperFwdVariant::new(&arch, DType::BF16, d, false, choices(2, q)).unwrap();
        assert_eq!((v(64, 2).q_buffers, v(64, 2).stages), (2, 4));
        assert_eq!((v(128, 2).q_buffers, v(128, 2).stages), (2, 2));
        assert_eq!(
            v(128, 2).smem_bytes(),
            1024 + 2 * 32768 + 2 * 65536 + 12 * 8
        );
        assert_eq!((v(256, 2).q_buffers, v(256, 2).stages), (1, 2));
        assert_eq!(v(128, 1).smem_bytes(), 1024 + 32768 + 3 * 65536 + 14 * 8);
    }

    #[test]
    fn softmax_forms_turn_on_by_name() {
        assert_eq!(SoftmaxForm::parse(""), SoftmaxForm::default());
        let both = SoftmaxForm::parse("ilp, lazy");
        assert!(both.ilp && both.lazy);
        let one = SoftmaxForm::parse("lazy");
        assert!(!one.ilp && one.lazy);
    }

    #[test]
    fn unaligned_strides_are_not_expressible() {
        assert_eq!(tma_stride(64, 10, 0), Some(128));
        assert_eq!(tma_stride(67, 10, 0), None);
        // Extent 1: any stride, replaced by a valid one.
        assert_eq!(tma_stride(3, 1, 200), Some(208));
    }
}
