//! The Hopper GEMM (sm_90a): TMA + wgmma, warp-specialised and persistent
//! (`kernels/device/gemm/hopper.cu` explains the kernel). This module decides when it applies,
//! picks the tile shape, encodes the tensor maps and launches it.

use super::params::HopperParams;
use super::plan_cache::{PlanKey, PlanMemo};
pub(crate) use super::wave_cut::wave_cut;
use super::wave_cut::{self, wave_cut_of};
use super::{GemmProblem, MatrixArg};
use calico_core::{
    Arch, AsyncCopy, DType, Error, GpuBackend, KernelArg, KernelSource, KernelVariant,
    LaunchConfig, MmaKind, OpaqueParam128, Result,
};
use calico_cuda::tma::{Swizzle, TiledMap};

const SOURCE: &str = include_str!("../../device/gemm/hopper.cu");
const ENTRY: &str = "calico_gemm_hopper";
const SPLITK_SOURCE: &str = include_str!("../../device/gemm/splitk.cu");
const SPLITK_ENTRY: &str = "calico_gemm_splitk_reduce";
/// Threads per block of the split-K reduction (splitk.cu), four columns each.
const SPLITK_THREADS: u32 = 256;
const SPLITK_COLS: usize = 4;
/// Split-K: at most this many copies of the tile list, each over at least
/// [`MIN_SPLIT_K_TILES`] k-tiles, and only when the tiles fill at most half the SMs.
const MAX_SPLIT_K: usize = 16;
const MIN_SPLIT_K_TILES: usize = 8;
/// K below this many k-tiles (2048 elements) never gained from a split in the H100 sweep
/// (docs/perf-log.md, session 24): not weighed at all, which keeps the router's host work per
/// launch where it was for short K.
const MIN_SPLIT_K_TOTAL: usize = 32;
/// The split-K partials (f32, splits x batch x M x N) stay under this many bytes.
const MAX_SPLIT_K_BYTES: usize = 1 << 30;
/// One producer and two consumer warpgroups.
const THREADS: u32 = 384;
/// K per pipeline stage: one 128-byte swizzled row of 16-bit elements.
pub(super) const BK: usize = 64;
/// Columns per N-major TMA box (128 bytes of 16-bit elements).
const N_CHUNK: usize = 64;
/// The deepest ring. Small tiles fill shared memory with up to this many stages: skinny
/// problems are bound by the bytes each SM keeps in flight (M = 64: 8 -> 16 stages, +12%).
const MAX_STAGES: usize = 16;
/// Row tiles that sweep all column tiles together (L2 reuse of A rows and B columns). 16 beat
/// 8 by 0.5-1.5% on the big shapes (two interleaved runs each, docs/perf-log.md).
const GROUP_M: i32 = 16;
/// CTAs per cluster unless CALICO_HOPPER_TUNE says otherwise.
const DEFAULT_CLUSTER: usize = 1;
/// TMA coordinates and the kernel's tile counter are 32-bit.
const MAX_EXTENT: usize = i32::MAX as usize;

/// A tile shape the kernel is compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct TileConfig {
    pub(super) bm: usize,
    pub(super) bn: usize,
    stages: usize,
    /// Epilogue through shared memory and TMA stores (16-bit output, 64-column boxes).
    tma_store: bool,
    /// With `tma_store`: the staging boxes go to D by the consumer threads instead of TMA
    /// (16-bit D rows TMA cannot store; `CALICO_GEMM_ODD=staged`).
    staged: bool,
    /// CTAs per cluster (1 or 2); with 2, a pair of row tiles shares B through multicast.
    pub(super) cluster: usize,
    /// Ping-pong consumers: each warpgroup computes a whole tile and the two alternate on the
    /// tensor cores (one's epilogue overlaps the other's main loop). Otherwise they cooperate
    /// on each tile.
    pingpong: bool,
}

impl TileConfig {
    fn stage_bytes(self) -> usize {
        (self.bm + self.bn) * BK * 2
    }

    /// Two 64x64 16-bit staging boxes per consumer warpgroup for the TMA-store epilogue.
    fn staging_bytes(self) -> usize {
        if self.tma_store {
            2 * 2 * STORE_BOX * STORE_BOX * 2
        } else {
            0
        }
    }

    /// 1024 bytes of alignment slack, the slots, the staging boxes, two mbarriers per slot
    /// (emitted as CALICO_GEMM_SMEM_BYTES; hopper.cu static_asserts its own layout against it).
    fn smem_bytes(self) -> usize {
        1024 + self.stages * self.stage_bytes() + self.staging_bytes() + 2 * self.stages * 8
    }

    pub(super) fn tiles(self, p: &GemmProblem) -> usize {
        p.m.div_ceil(self.bm) * p.n.div_ceil(self.bn) * p.batch
    }

    /// Bytes of one fused split-K slot: every consumer thread's f32 accumulators.
    pub(super) fn slot_bytes(self) -> usize {
        warpgroup_cols(self.bm, self.bn, self.pingpong) / 2 * 256 * 4
    }

    /// Scheduling units: clusters of `cluster` row tiles of one column tile.
    pub(super) fn work(self, p: &GemmProblem) -> usize {
        p.m.div_ceil(self.bm).div_ceil(self.cluster) * p.n.div_ceil(self.bn) * p.batch
    }
}

/// Rows and columns of a TMA-store box.
const STORE_BOX: usize = 64;

/// Overrides for A/B tuning runs, read once from `CALICO_HOPPER_TUNE`, e.g.
/// `bm=128,bn=256,stages=4,store=tma,cluster=2,group=8,grid=132,mode=pingpong`. Entries that
/// do not parse, or that the problem cannot use, are ignored. `mode=pingpong` gives each
/// consumer warpgroup whole tiles (at most 128 x 128 or 64 x 256: 128 accumulators), taken in
/// turns; `mode=cooperative` (the default) has both share each tile.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Tune {
    bm: Option<usize>,
    bn: Option<usize>,
    stages: Option<usize>,
    tma_store: Option<bool>,
    cluster: Option<usize>,
    group_m: Option<i32>,
    grid: Option<usize>,
    pingpong: Option<bool>,
    /// L2 eviction hints for the A and B loads (`l2a=last`, `l2b=first`, ...).
    l2_a: Option<L2Hint>,
    l2_b: Option<L2Hint>,
    /// Split-K copies (`split=N`; 1 turns split-K off), where the problem allows it.
    split: Option<usize>,
    /// `cut=0` never cuts a launch at a wave boundary ([`wave_cut`]); `cut=1` is the default.
    wave_cut: Option<bool>,
    /// `fused=0` never sums split-K pieces in the kernel ([`fused_split_plan`]).
    fused: Option<bool>,
    /// `narrow=P`: a tile narrower than 128 x 256 is taken once it fills P% of the SMs (60).
    narrow_pct: Option<usize>,
    /// `floor=P`: the time model charges a k-tile of a small tile at least P% of a 128 x 256
    /// one's (35 or 42, see [`modeled_us`]).
    area_floor_pct: Option<usize>,
}

/// An L2 eviction hint for an operand's TMA loads (the kernel's CALICO_GEMM_L2_HINT_*).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
enum L2Hint {
    #[default]
    Normal,
    EvictFirst,
    EvictLast,
}

impl L2Hint {
    fn parse(text: &str) -> Option<L2Hint> {
        match text {
            "normal" | "none" => Some(L2Hint::Normal),
            "first" | "evict_first" => Some(L2Hint::EvictFirst),
            "last" | "evict_last" => Some(L2Hint::EvictLast),
            _ => None,
        }
    }

    fn define(self) -> u8 {
        match self {
            L2Hint::Normal => 0,
            L2Hint::EvictFirst => 1,
            L2Hint::EvictLast => 2,
        }
    }
}

impl Tune {
    pub(super) fn parse(text: &str) -> Tune {
        let mut t = Tune::default();
        for (key, value) in crate::knobs::pairs(text) {
            let num = value.parse::<usize>().ok();
            match key {
                "bm" => t.bm = num.filter(|v| [64, 128].contains(v)),
                "bn" => t.bn = num.filter(|v| v.is_power_of_two() && (32..=256).contains(v)),
                "stages" => t.stages = num.filter(|v| (2..=MAX_STAGES).contains(v)),
                "store" | "epilogue" => {
                    t.tma_store = match value {
                        "tma" | "smem" => Some(true),
                        "reg" | "regs" | "direct" => Some(false),
                        _ => None,
                    }
                }
                "cluster" => t.cluster = num.filter(|v| [1, 2].contains(v)),
                "group" | "group_m" => {
                    t.group_m = num.filter(|v| (1..=64).contains(v)).map(|v| v as i32)
                }
                "grid" => t.grid = num.filter(|&v| v >= 1),
                "l2a" => t.l2_a = L2Hint::parse(value),
                "l2b" => t.l2_b = L2Hint::parse(value),
                "split" | "splitk" => t.split = num.filter(|&v| (1..=64).contains(&v)),
                "cut" => t.wave_cut = num.filter(|&v| v <= 1).map(|v| v == 1),
                "fused" => t.fused = num.filter(|&v| v <= 1).map(|v| v == 1),
                "narrow" => t.narrow_pct = num.filter(|&v| (10..=200).contains(&v)),
                "floor" => t.area_floor_pct = num.filter(|&v| (1..=100).contains(&v)),
                "mode" | "schedule" => {
                    t.pingpong = match value {
                        "pingpong" | "ping-pong" | "pp" => Some(true),
                        "cooperative" | "coop" => Some(false),
                        _ => None,
                    }
                }
                _ => {}
            }
        }
        t
    }

    /// False with `cut=0` and in tuning runs that force the launch ([`Tune::forces_the_launch`]).
    pub(super) fn allows_wave_cut(self) -> bool {
        self.wave_cut != Some(false) && !self.forces_the_launch()
    }

    /// True in tuning runs that force a tile shape, a split, clusters or ping-pong: their
    /// launch stays the one they ask for (no wave cut, no fused split-K).
    fn forces_the_launch(self) -> bool {
        self.pingpong == Some(true)
            || self.cluster == Some(2)
            || self.split.is_some()
            || self.bm.is_some()
            || self.bn.is_some()
    }

    pub(super) fn get() -> Tune {
        static TUNE: std::sync::OnceLock<Tune> = std::sync::OnceLock::new();
        crate::knobs::read(&TUNE, "CALICO_HOPPER_TUNE", Tune::parse)
    }
}

/// True when A is K-major (row-major M x K) in a TMA-compatible way.
pub(super) fn a_fits(p: &GemmProblem) -> bool {
    let a = &p.a;
    (a.col_stride == 1 || p.k <= 1)
        && row_stride_ok(a.row_stride, p.m)
        && batch_stride_ok(a, p.batch)
}

/// Where B's contiguous dimension is: `Some(true)` for K (an N x K row-major weight),
/// `Some(false)` for N (K x N row-major), `None` when neither suits TMA.
pub(super) fn b_k_major(p: &GemmProblem) -> Option<bool> {
    let b = &p.b;
    if !batch_stride_ok(b, p.batch) {
        return None;
    }
    if (b.row_stride == 1 || p.k <= 1) && row_stride_ok(b.col_stride, p.n) {
        return Some(true);
    }
    if (b.col_stride == 1 || p.n <= 1) && row_stride_ok(b.row_stride, p.k) {
        return Some(false);
    }
    None
}

/// An outer stride TMA accepts: 16-byte multiples (8 elements), or irrelevant (extent <= 1).
fn row_stride_ok(stride: usize, extent: usize) -> bool {
    extent <= 1 || (stride.is_multiple_of(8) && stride > 0)
}

fn batch_stride_ok(x: &MatrixArg, batch: usize) -> bool {
    batch <= 1 || x.batch_stride == 0 || x.batch_stride.is_multiple_of(8)
}

fn output_fits(x: &MatrixArg, n: usize) -> bool {
    x.col_stride == 1 || n <= 1
}

/// The tile configuration the Hopper kernel would run `p` with on `arch`, or `None` when it
/// cannot: sm_90a, 16-bit inputs, A K-major and B with either dimension contiguous, 16-byte
/// aligned bases and strides, D and C with contiguous rows, sizes within 32-bit coordinates,
/// and a tile that fits the device's shared memory.
pub(super) fn config(arch: &Arch, p: &GemmProblem) -> Option<TileConfig> {
    config_for(arch, p, d_tma_ok(p))
}

/// [`config`] with the TMA-store decision made by the caller (`d_tma`).
fn config_for(arch: &Arch, p: &GemmProblem, d_tma: bool) -> Option<TileConfig> {
    let arch_ok = arch.target.ends_with("90a")
        && arch.has_mma(MmaKind::Wgmma, p.in_dtype)
        && arch.has_async_copy(AsyncCopy::Tma);
    let dtypes_ok = matches!(p.in_dtype, DType::BF16 | DType::F16)
        && matches!(p.out_dtype, DType::BF16 | DType::F16 | DType::F32);
    let sizes_ok =
        p.m <= MAX_EXTENT && p.n <= MAX_EXTENT && p.k <= MAX_EXTENT && p.batch <= MAX_EXTENT;
    let aligned = p.a.ptr.is_multiple_of(16) && p.b.ptr.is_multiple_of(16);
    let outputs_ok = output_fits(&p.d, p.n) && p.c.as_ref().is_none_or(|c| output_fits(c, p.n));
    let b_kmajor = b_k_major(p)?;
    (arch_ok && dtypes_ok && sizes_ok && aligned && outputs_ok && a_fits(p))
        .then(|| pick(arch, p, b_kmajor, d_tma, Tune::get()))
        .flatten()
}

/// How many output tiles (work units of one CTA) the Hopper kernel would cut `p` into, or
/// `None` when it does not run `p` (see [`config`]). The router compares this with the SM
/// count and launches the Hopper kernel when it is `Some`.
pub(crate) fn tiles(arch: &Arch, p: &GemmProblem) -> Option<usize> {
    config(arch, p).map(|cfg| cfg.tiles(p))
}

/// The (rows, columns) of the output tile the Hopper kernel would run `p` with, and the CTAs
/// that share its tiles at once (the persistent grid), or `None` (see [`config`]).
pub(super) fn tile_shape(arch: &Arch, p: &GemmProblem) -> Option<(usize, usize, usize)> {
    let grid = Tune::get()
        .grid
        .unwrap_or(arch.compute_units.max(1) as usize);
    config(arch, p).map(|cfg| (cfg.bm, cfg.bn, grid.max(1)))
}

/// The split-K form of `p`, if it takes one: the tile and how many copies of the tile list
/// (each over its own range of k-tiles) run side by side. Problems whose widest tiles fill at
/// most half the SMs leave the rest idle for the whole K loop, and [`pick`] then reaches for
/// small tiles (an LLM's down-projection at a few hundred tokens, 129 x 2048 x 14336: 192
/// tiles of 64 x 32, 90 us on the H100 against torch's 31); instead the widest tile can run
/// with its K range cut into pieces that fill about a wave, and a second kernel sums them (38
/// us there). The pieces cost a write and a read of f32 partials and a launch, which loses
/// where K is short or M x N large (128 x 4096 x 4096: 31 against 16 us), so [`modeled_us`]
/// decides, per piece count. Not with clusters or ping-pong consumers (tuning runs), and not
/// for the padded path's internal launches. `split=N` in CALICO_HOPPER_TUNE forces N pieces
/// (1: never split).
pub(super) fn split_plan(arch: &Arch, p: &GemmProblem, tune: Tune) -> Option<(TileConfig, usize)> {
    if tune.pingpong == Some(true) || tune.cluster == Some(2) || tune.split == Some(1) {
        return None;
    }
    let sms = arch.compute_units.max(1) as usize;
    let k_tiles = p.k.div_ceil(BK);
    if tune.split.is_none() && tune.bm.is_none() && tune.bn.is_none() {
        // The cheap refusals first: the widest tile's count needs no shape search.
        let widest_tiles = p.m.div_ceil(128) * p.n.div_ceil(256) * p.batch;
        if k_tiles < MIN_SPLIT_K_TOTAL || widest_tiles * 2 > sms {
            return None;
        }
    }
    // The widest shape (or the forced one), on f32 partials.
    let b_kmajor = b_k_major(p)?;
    let partial = GemmProblem {
        out_dtype: DType::F32,
        c: None,
        bias: None,
        epilogue: super::Epilogue::None,
        ..*p
    };
    let widest = Tune {
        bm: tune.bm.or(Some(128)),
        bn: tune.bn.or(Some(256)),
        ..tune
    };
    let cfg = pick(arch, &partial, b_kmajor, false, widest)?;
    let tiles = cfg.tiles(p).max(1);
    // Pieces of `per` k-tiles each: no empty piece.
    let pieces = |wanted: usize| pieces_of(k_tiles, wanted);
    let partial_bytes = |splits: usize| splits * p.batch * p.m * p.n * 4;
    let splits = match tune.split {
        Some(s) => pieces(s.min(k_tiles)),
        None => {
            if tiles * 2 > sms {
                return None;
            }
            // The unsplit launch's own tile and rounds, against each piece count that fits
            // one wave.
            let whole = config(arch, p)?;
            let rounds = whole.work(p).div_ceil(sms);
            let unsplit = modeled_us(p, rounds, k_tiles, whole, 0, tune);
            let most = (sms / tiles)
                .min(k_tiles / MIN_SPLIT_K_TILES)
                .min(MAX_SPLIT_K);
            let (best, best_us) = (2..=most)
                .map(pieces)
                .map(|s| {
                    (
                        s,
                        modeled_us(p, 1, k_tiles.div_ceil(s), cfg, partial_bytes(s), tune),
                    )
                })
                .min_by(|a, b| a.1.total_cmp(&b.1))?;
            if best_us >= unsplit {
                return None;
            }
            best
        }
    };
    (splits >= 2 && partial_bytes(splits) <= MAX_SPLIT_K_BYTES).then_some((cfg, splits))
}

/// How many pieces of `ceil(k_tiles / wanted)` k-tiles cover `k_tiles`: about `wanted`, never
/// an empty piece (the kernel cuts K the same way).
fn pieces_of(k_tiles: usize, wanted: usize) -> usize {
    k_tiles.div_ceil(k_tiles.div_ceil(wanted.max(1)))
}

/// A rough model of the Hopper kernel's time (microseconds, H100) for `rounds` rounds of
/// CTAs each running `k_tiles` k-tiles of tile `cfg`, plus, when `partial_bytes` > 0, the
/// split-K form's partials (written, then read by the reduction) and its second launch. A
/// 128 x 256 k-tile takes ~0.6 us on one SM; smaller tiles are charged by area but not below
/// 35% of it (their loads and barriers, not the MMAs, set their pace), or 42% for tiles of at
/// least 64 x 64 over at least 96 k-tiles (session 26: one round of 64 x 128 tiles ran slower
/// than 35% predicted against the split form, 129 x 4096 x 14336 75 against 59 us split, while
/// 64 x 32 tiles and short K kept to it: 64 x 4095 x 8192 29 unsplit against 44 split). The
/// operands' bytes from DRAM bound it from below, and compute and memory overlap only in part.
/// Fitted to the calico-sweep runs of docs/perf-log.md (sessions 24 and 26); it only has to
/// rank the plans against each other.
pub(super) fn modeled_us(
    p: &GemmProblem,
    rounds: usize,
    k_tiles: usize,
    cfg: TileConfig,
    partial_bytes: usize,
    tune: Tune,
) -> f64 {
    const KTILE_US: f64 = 0.6;
    const DRAM_BYTES_PER_US: f64 = 2.8e6;
    const PARTIAL_BYTES_PER_US: f64 = 2.5e6;
    const SPLIT_LAUNCH_US: f64 = 5.0;
    let area = (cfg.bm * cfg.bn) as f64 / (128.0 * 256.0);
    // 64 x 32 tiles (16-stage rings) and short K runs keep the session-24 fit.
    let fitted = if area >= 0.125 && k_tiles >= 96 {
        42
    } else {
        35
    };
    let floor = tune.area_floor_pct.unwrap_or(fitted) as f64 / 100.0;
    let compute = rounds as f64 * k_tiles as f64 * KTILE_US * area.max(floor);
    let elem = p.in_dtype.size_bytes() as f64;
    let operands = (p.m + p.n) as f64 * p.k as f64 * elem * p.batch as f64;
    let output = (p.m * p.n * p.batch) as f64 * p.out_dtype.size_bytes() as f64;
    let dram = (operands + output) / DRAM_BYTES_PER_US;
    let mut us = compute.max(dram) + 0.3 * compute.min(dram);
    if partial_bytes > 0 {
        us += SPLIT_LAUNCH_US + 2.0 * partial_bytes as f64 / PARTIAL_BYTES_PER_US;
    }
    us
}

/// The modelled time of one launch of `p` as [`launch_whole`] makes it: split along K where
/// [`split_plan`] says so, else on [`config`]'s tile.
pub(super) fn planned_us(arch: &Arch, p: &GemmProblem, tune: Tune) -> Option<f64> {
    let k_tiles = p.k.div_ceil(BK);
    if let Some((cfg, splits)) = split_plan(arch, p, tune) {
        let partials = splits * p.batch * p.m * p.n * 4;
        return Some(modeled_us(
            p,
            1,
            k_tiles.div_ceil(splits),
            cfg,
            partials,
            tune,
        ));
    }
    let cfg = config(arch, p)?;
    let sms = arch.compute_units.max(1) as usize;
    Some(modeled_us(
        p,
        cfg.work(p).div_ceil(sms),
        k_tiles,
        cfg,
        0,
        tune,
    ))
}

/// Split-K summed inside the kernel (hopper.cu SPLIT_FUSED, gemm/split_fused.cuh) for
/// problems whose widest tiles fill between 60% and all of the SMs once: one round of whole
/// tiles leaves the other SMs idle for the whole K loop (777 x 3072 x 14336: 84 tiles of 128 x
/// 256, 133 us on the H100 against torch's 91), and the split-K form with partials through
/// DRAM and a second kernel costs more than it saves there. The pieces (`splits` copies of the
/// tile list over consecutive K ranges) run in rounds; the model weighs rounds x k-tiles per
/// piece plus the slots' round trip against one launch of whole tiles. `fused=0` turns it off.
pub(super) fn fused_split_plan(
    arch: &Arch,
    p: &GemmProblem,
    tune: Tune,
) -> Option<(TileConfig, usize)> {
    if tune.fused == Some(false) || tune.forces_the_launch() {
        return None;
    }
    let sms = arch.compute_units.max(1) as usize;
    let k_tiles = p.k.div_ceil(BK);
    // The cheap refusals: the widest tiles must fill 60% of the SMs (below that [`pick`] takes
    // narrower tiles, which beat the pieces on the H100: 72 tiles of 700 x 3000 x 14336, 112
    // against 118 us) and at most all of them, and K must be long enough to cut.
    let widest_tiles = p.m.div_ceil(128) * p.n.div_ceil(256) * p.batch;
    if k_tiles < MIN_SPLIT_K_TOTAL || widest_tiles * 5 < sms * 3 || widest_tiles > sms {
        return None;
    }
    let whole = config(arch, p)?;
    let widest = Tune {
        bm: Some(128),
        bn: Some(256),
        ..tune
    };
    let cfg = pick(
        arch,
        p,
        b_k_major(p)?,
        whole.tma_store && !whole.staged,
        widest,
    )?;
    if (cfg.bm, cfg.bn, cfg.cluster, cfg.pingpong) != (128, 256, 1, false) {
        return None;
    }
    let tiles = cfg.tiles(p);
    let pieces = |wanted: usize| pieces_of(k_tiles, wanted);
    let (splits, us, slots) = (2..=MAX_FUSED_SPLITS)
        .map(pieces)
        .filter(|&s| k_tiles.div_ceil(s) >= MIN_SPLIT_K_TILES)
        .map(|s| {
            let rounds = (tiles * s).div_ceil(sms);
            let slots = tiles * s * cfg.slot_bytes();
            let model = modeled_us(p, rounds, k_tiles.div_ceil(s), cfg, 0, tune);
            (s, model + fused_fixup_us(slots), slots)
        })
        .min_by(|a, b| a.1.total_cmp(&b.1))?;
    let best = planned_us(arch, p, tune)?;
    (us < best * (1.0 - MIN_FUSED_GAIN) && slots <= MAX_SPLIT_K_BYTES).then_some((cfg, splits))
}

/// The wave cut [`launch`] makes of `p` (none where the fused split-K runs it).
pub(crate) fn planned_cut(arch: &Arch, p: &GemmProblem) -> Option<super::wave_cut::WaveCut> {
    let tune = Tune::get();
    match fused_split_plan(arch, p, tune) {
        Some(_) => None,
        None => wave_cut(arch, p, tune),
    }
}

/// True when [`launch`] sums `p`'s split-K pieces inside the kernel.
pub(crate) fn uses_fused_split(arch: &Arch, p: &GemmProblem) -> bool {
    fused_split_plan(arch, p, Tune::get()).is_some()
}

/// At most this many fused pieces per tile: the last piece reads every slot back.
const MAX_FUSED_SPLITS: usize = 8;
/// The fused form must beat one launch's modelled time by this share.
const MIN_FUSED_GAIN: f64 = 0.08;

/// What summing the pieces in the kernel adds (microseconds, H100): every piece writes its
/// slot and the tile's last piece reads them all back, `slot_bytes` each way, beside the
/// operands' traffic. Fitted to the H100 sweep (session 26): 84 tiles in 3 pieces (32 MB of
/// slots) ran 11% faster than one round of whole tiles against 33% less MMA time, 96 tiles in
/// 4 (50 MB) 25% slower.
fn fused_fixup_us(slot_bytes: usize) -> f64 {
    2.0 + 2.0 * slot_bytes as f64 / 2.2e6
}

/// The k-splits the router's Hopper launch of `p` would use (1: none; with a wave cut, the
/// tail's); see [`split_plan`] and [`wave_cut`].
pub(crate) fn k_splits(arch: &Arch, p: &GemmProblem) -> usize {
    let tune = Tune::get();
    if let Some((_, splits)) = fused_split_plan(arch, p, tune) {
        return splits;
    }
    let whole = wave_cut(arch, p, tune).map_or(*p, |cut| cut.tail);
    config(arch, &whole)
        .and_then(|_| split_plan(arch, &whole, tune))
        .map_or(1, |(_, s)| s)
}

/// True when D can take the TMA-store epilogue: 16-bit output, contiguous rows, 16-byte
/// aligned base and row/batch strides, one matrix per batch.
pub(super) fn d_tma_ok(p: &GemmProblem) -> bool {
    // TMA stores may write a row's last 16-byte chunk whole: with N * elem not a multiple of
    // 16, a view's neighbouring columns could be overwritten, so those take the register path.
    (p.n * p.out_dtype.size_bytes()).is_multiple_of(16) && d_rows_aligned(p)
}

/// True when the staged store can write D: 16-bit, contiguous rows, 2-byte aligned.
fn staged_d_ok(p: &GemmProblem) -> bool {
    matches!(p.out_dtype, DType::BF16 | DType::F16)
        && (p.d.col_stride == 1 || p.n <= 1)
        && p.d.ptr.is_multiple_of(2)
}

/// [`d_tma_ok`] for a D whose rows may be written past N (a padded buffer).
fn d_rows_aligned(p: &GemmProblem) -> bool {
    let elem = p.out_dtype.size_bytes();
    let d = &p.d;
    matches!(p.out_dtype, DType::BF16 | DType::F16)
        && d.ptr.is_multiple_of(16)
        && (d.col_stride == 1 || p.n <= 1)
        && (p.m <= 1 || (d.row_stride > 0 && (d.row_stride * elem).is_multiple_of(16)))
        && (p.batch <= 1 || (d.batch_stride > 0 && (d.batch_stride * elem).is_multiple_of(16)))
}

/// True when a 2-CTA cluster can split the B slot: halves of a K-major box stay
/// 1024-aligned, N-major B has an even number of 64-column chunks.
fn cluster_splits_b(bn: usize, b_kmajor: bool) -> bool {
    if b_kmajor {
        ((bn / 2) * BK * 2).is_multiple_of(1024)
    } else {
        (bn / N_CHUNK).is_multiple_of(2)
    }
}

/// The tile shape for `p`: the first of 128 x 256 (the big GEMMs) and the smaller shapes
/// (skinny M, small N) that gives 60% of a wave of tiles, else the one with the most tiles. N-major B needs 64-column chunks per consumer warpgroup. The epilogue goes
/// through TMA stores when D allows it (`d_tma`) and the warpgroup tile is whole 64-column
/// boxes; `tune` (CALICO_HOPPER_TUNE) may force the shape, stages, epilogue and cluster.
fn pick(
    arch: &Arch,
    p: &GemmProblem,
    b_kmajor: bool,
    d_tma: bool,
    tune: Tune,
) -> Option<TileConfig> {
    const SHAPES: [(usize, usize); 7] = [
        (128, 256),
        (128, 128),
        (64, 256),
        (64, 128),
        (64, 64),
        (64, 32),
        (128, 64),
    ];
    let pingpong = tune.pingpong == Some(true);
    let wg_n = |bm: usize, bn: usize| warpgroup_cols(bm, bn, pingpong);
    let allowed = |&(bm, bn): &(usize, usize)| {
        wg_n(bm, bn) >= 16
            && wg_n(bm, bn) <= 256
            && (b_kmajor || wg_n(bm, bn) % N_CHUNK == 0)
            && (!pingpong || bm * bn <= 128 * 128)
    };
    let staged_ok = !d_tma && super::odd_split::staged() && staged_d_ok(p);
    let with_stages = |(bm, bn): (usize, usize)| {
        let tma_store =
            (d_tma || staged_ok) && wg_n(bm, bn) % STORE_BOX == 0 && tune.tma_store != Some(false);
        let cluster = match tune.cluster {
            Some(2) if cluster_splits_b(bn, b_kmajor) && p.m.div_ceil(bm) >= 2 => 2,
            _ => DEFAULT_CLUSTER,
        };
        let one = TileConfig {
            bm,
            bn,
            stages: 1,
            tma_store,
            staged: tma_store && !d_tma,
            cluster,
            pingpong,
        };
        // 1024 bytes of alignment slack, and 1024 that ptxas reports as static shared memory.
        let budget = arch
            .shared_mem_per_block
            .saturating_sub(2048 + one.staging_bytes());
        let most = (budget / (one.stage_bytes() + 16)).min(MAX_STAGES);
        let stages = tune.stages.filter(|&s| s <= most).unwrap_or(most);
        (stages >= 2).then_some(TileConfig { stages, ..one })
    };
    let forced: Option<(usize, usize)> = match (tune.bm, tune.bn) {
        (Some(bm), Some(bn)) => Some((bm, bn)),
        _ => None,
    };
    let candidates: Vec<TileConfig> = match forced.filter(allowed).and_then(with_stages) {
        Some(c) => vec![c],
        None => {
            let all: Vec<TileConfig> = SHAPES
                .iter()
                .filter(|s| allowed(s))
                .filter_map(|&s| with_stages(s))
                .collect();
            // One of bm / bn given: keep the shapes that match it, if any.
            let matching: Vec<TileConfig> = all
                .iter()
                .copied()
                .filter(|c| tune.bm.is_none_or(|bm| c.bm == bm))
                .filter(|c| tune.bn.is_none_or(|bn| c.bn == bn))
                .collect();
            if matching.is_empty() {
                all
            } else {
                matching
            }
        }
    };
    // Ping-pong overlaps one warpgroup's epilogue with the other's main loop only when a CTA
    // has at least two tiles: ask for about two waves.
    let waves = if pingpong { 2 } else { 1 };
    let sms = arch.compute_units as usize;
    // A tile shape is taken once it fills 60% of the SMs: one round of 80-100 tiles of 128 x
    // 256 beat two rounds of 160-200 of 128 x 128 by 5-20% in the H100 sweep (3000 x 1000 x
    // 4096: 43.5 against 54 us), 64-72 did not (1500 x 1536 x 8192: 79 against 72 us); one
    // round of 96 tiles of 128 x 128 beat two of 64 x 128 (500 x 3072 x 6144: 37 against 45).
    // The narrower shapes' share is a tuning knob (`narrow=75`: the rule before session 26).
    let wave = (sms * tune.narrow_pct.unwrap_or(60) / 100 * waves).max(1);
    let widest_wave = (sms * 3 / 5 * waves).max(1);
    let enough = |c: &TileConfig| {
        let need = if (c.bm, c.bn) == (128, 256) {
            widest_wave
        } else {
            wave
        };
        c.tiles(p) >= need
    };
    let chosen = candidates.iter().copied().find(|c| enough(c)).or_else(|| {
        candidates
            .iter()
            .copied()
            .max_by_key(|c| (c.tiles(p), c.bm * c.bn))
    })?;
    (chosen.tiles(p) <= MAX_EXTENT).then_some(chosen)
}

/// Columns per consumer warpgroup of a `bm` x `bn` tile: ping-pong warpgroups own whole tiles
/// (BM / 64 m64 blocks of BN / 2 accumulators, 128 at most); cooperative ones split BM = 128
/// by rows and BM = 64 by columns.
fn warpgroup_cols(bm: usize, bn: usize, pingpong: bool) -> usize {
    if bm == 64 && !pingpong {
        bn / 2
    } else {
        bn
    }
}

/// A stride for a TMA dimension: the real one, or (extent 1 or broadcast) any valid value.
fn outer_stride_bytes(stride: usize, extent: usize, fallback_bytes: usize, elem: usize) -> u64 {
    if extent <= 1 || stride == 0 {
        (fallback_bytes.div_ceil(16) * 16).max(16) as u64
    } else {
        (stride * elem) as u64
    }
}

/// A 3-D map {inner, outer, batch} over one operand, box {box_inner, box_outer, 1}, 128B swizzle.
#[allow(clippy::too_many_arguments)]
pub(super) fn operand_map(
    x: &MatrixArg,
    dtype: DType,
    inner: usize,
    outer: usize,
    outer_stride: usize,
    batch: usize,
    box_inner: usize,
    box_outer: usize,
) -> Result<(OpaqueParam128, i32)> {
    let elem = dtype.size_bytes();
    let inner = inner.max(1);
    let outer = outer.max(1);
    let broadcast = batch <= 1 || x.batch_stride == 0;
    let batch_dim = if broadcast { 1 } else { batch };
    let row_bytes = outer_stride_bytes(outer_stride, outer, inner * elem, elem);
    let batch_bytes =
        outer_stride_bytes(x.batch_stride, batch_dim, row_bytes as usize * outer, elem);
    let map = TiledMap {
        address: x.ptr,
        dtype,
        dims: [inner as u64, outer as u64, batch_dim as u64],
        strides_bytes: [row_bytes, batch_bytes, 0],
        box_dims: [box_inner as u32, box_outer as u32, 1],
        swizzle: Swizzle::B128,
    }
    .encode_cached()?;
    Ok((map, if broadcast { 0 } else { 1 }))
}

fn as_i32(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| {
        Error::unsupported(format!(
            "{what} = {v} exceeds the Hopper GEMM's 32-bit range"
        ))
    })
}

fn as_i64(v: usize, what: &str) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::unsupported(format!("{what} = {v} exceeds 64-bit range")))
}

/// One compiled form of the Hopper kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Variant {
    in_dtype: DType,
    out_dtype: DType,
    tile: TileConfig,
    b_kmajor: bool,
    epilogue: super::Epilogue,
    bias: bool,
    c: bool,
    /// L2 hints for the A and B loads.
    l2: (L2Hint, L2Hint),
    /// Split-K partials: raw f32 into the workspace (CALICO_GEMM_SPLIT_K).
    split_k: bool,
    /// Split-K summed in the kernel (CALICO_GEMM_SPLIT_FUSED, [`fused_split_plan`]).
    split_fused: bool,
}

impl Variant {
    /// The catalog's name for this variant (`calico compile --label` matches it).
    fn label(&self) -> String {
        let t = self.tile;
        let hint = |name: &str, h: L2Hint| match h {
            L2Hint::Normal => String::new(),
            L2Hint::EvictFirst => format!(" {name}=first"),
            L2Hint::EvictLast => format!(" {name}=last"),
        };
        format!(
            "hopper {}->{} {}x{}x{BK} stages={} store={} cluster={} b_kmajor={} {:?} bias={} c={}{}{}{}{}{}",
            self.in_dtype,
            self.out_dtype,
            t.bm,
            t.bn,
            t.stages,
            match (t.tma_store, t.staged) {
                (true, true) => "staged",
                (true, false) => "tma",
                _ => "reg",
            },
            t.cluster,
            self.b_kmajor,
            self.epilogue,
            self.bias,
            self.c,
            if t.pingpong { " mode=pingpong" } else { "" },
            hint("l2a", self.l2.0),
            hint("l2b", self.l2.1),
            if self.split_k { " splitk" } else { "" },
            if self.split_fused { " splitfused" } else { "" },
        )
    }
}

impl KernelVariant for Variant {
    fn source(&self, vendor: calico_core::HeaderSet) -> Result<KernelSource> {
        let mut defines = vec![
            ("CALICO_GEMM_IN", self.in_dtype.device_type().to_string()),
            ("CALICO_GEMM_OUT", self.out_dtype.device_type().to_string()),
            ("CALICO_GEMM_BM", self.tile.bm.to_string()),
            ("CALICO_GEMM_BN", self.tile.bn.to_string()),
            ("CALICO_GEMM_STAGES", self.tile.stages.to_string()),
            ("CALICO_GEMM_B_KMAJOR", u8::from(self.b_kmajor).to_string()),
            ("CALICO_GEMM_EPILOGUE", self.epilogue.define().to_string()),
            ("CALICO_GEMM_HAS_BIAS", u8::from(self.bias).to_string()),
            ("CALICO_GEMM_HAS_C", u8::from(self.c).to_string()),
            (
                "CALICO_GEMM_TMA_STORE",
                u8::from(self.tile.tma_store).to_string(),
            ),
            ("CALICO_GEMM_CLUSTER", self.tile.cluster.to_string()),
            (
                "CALICO_GEMM_PINGPONG",
                u8::from(self.tile.pingpong).to_string(),
            ),
            ("CALICO_GEMM_L2_HINT_A", self.l2.0.define().to_string()),
            ("CALICO_GEMM_L2_HINT_B", self.l2.1.define().to_string()),
            // Checked by the kernel against its own layout.
            ("CALICO_GEMM_SMEM_BYTES", self.tile.smem_bytes().to_string()),
        ];
        if self.tile.staged {
            defines.push(("CALICO_GEMM_STAGED_STORE", "1".to_string()));
        }
        if self.split_k {
            defines.push(("CALICO_GEMM_SPLIT_K", "1".to_string()));
        }
        if self.split_fused {
            defines.push(("CALICO_GEMM_SPLIT_FUSED", "1".to_string()));
        }
        defines.extend(HopperParams::layout_defines());
        KernelSource::assemble(
            ENTRY,
            SOURCE,
            &[
                vendor,
                calico_core::device_headers(),
                super::portable::GEMM_HEADERS,
            ],
            &defines,
        )
    }
}

/// Representative Hopper variants for the compile checks and `calico compile`.
pub(crate) fn catalog(vendor: calico_core::HeaderSet) -> Result<Vec<crate::catalog::CatalogEntry>> {
    use super::Epilogue;
    let tile = |bm, bn, stages, tma_store, cluster| TileConfig {
        bm,
        bn,
        stages,
        tma_store,
        cluster,
        staged: false,
        pingpong: false,
    };
    let pingpong = |bm, bn, stages, tma_store, cluster| TileConfig {
        pingpong: true,
        ..tile(bm, bn, stages, tma_store, cluster)
    };
    let big = tile(128, 256, 4, false, 1);
    let big_tma = tile(128, 256, 4, true, 1);
    let big_cluster = tile(128, 256, 4, true, 2);
    let skinny = tile(64, 32, 16, false, 1);
    let mut out = Vec::new();
    let cases = [
        (
            DType::BF16,
            DType::BF16,
            big,
            true,
            Epilogue::None,
            false,
            false,
        ),
        (
            DType::BF16,
            DType::BF16,
            big,
            false,
            Epilogue::None,
            false,
            false,
        ),
        (
            DType::F16,
            DType::F32,
            big,
            true,
            Epilogue::Gelu,
            true,
            true,
        ),
        (
            DType::BF16,
            DType::BF16,
            skinny,
            true,
            Epilogue::Silu,
            true,
            false,
        ),
        (
            DType::BF16,
            DType::F16,
            tile(128, 128, 6, false, 1),
            false,
            Epilogue::None,
            false,
            true,
        ),
        (
            DType::BF16,
            DType::BF16,
            big_tma,
            true,
            Epilogue::None,
            false,
            false,
        ),
        (
            DType::BF16,
            DType::BF16,
            big_cluster,
            true,
            Epilogue::None,
            false,
            false,
        ),
        (
            DType::F16,
            DType::F16,
            big_cluster,
            false,
            Epilogue::Gelu,
            true,
            true,
        ),
        (
            DType::BF16,
            DType::BF16,
            tile(64, 128, 8, true, 1),
            true,
            Epilogue::Silu,
            true,
            true,
        ),
        // Ping-pong (CALICO_HOPPER_TUNE mode=pingpong): the 128x128 default with TMA stores,
        // N-major B, the register epilogue with f32 out, 64x256 in a cluster.
        (
            DType::BF16,
            DType::BF16,
            pingpong(128, 128, 6, true, 1),
            true,
            Epilogue::None,
            false,
            false,
        ),
        (
            DType::F16,
            DType::F16,
            pingpong(128, 128, 6, true, 1),
            false,
            Epilogue::Gelu,
            true,
            true,
        ),
        (
            DType::BF16,
            DType::F32,
            pingpong(128, 128, 6, false, 1),
            true,
            Epilogue::Silu,
            true,
            true,
        ),
        (
            DType::BF16,
            DType::BF16,
            pingpong(64, 256, 4, true, 2),
            true,
            Epilogue::None,
            false,
            false,
        ),
    ];
    let mut variants: Vec<Variant> = cases
        .into_iter()
        .map(
            |(in_dtype, out_dtype, tile, b_kmajor, epilogue, bias, c)| Variant {
                in_dtype,
                out_dtype,
                tile,
                b_kmajor,
                epilogue,
                bias,
                c,
                l2: (L2Hint::Normal, L2Hint::Normal),
                split_k: false,
                split_fused: false,
            },
        )
        .collect();
    // L2 eviction hints on the operand loads (CALICO_HOPPER_TUNE l2a=/l2b=).
    variants.push(Variant {
        tile: big_tma,
        l2: (L2Hint::EvictLast, L2Hint::EvictFirst),
        ..variants[0]
    });
    // The staged store for odd-width D (CALICO_GEMM_ODD=staged): the 4097^3 shape, and a
    // skinny tile with C, bias and an activation.
    variants.push(Variant {
        tile: TileConfig {
            staged: true,
            ..big_tma
        },
        ..variants[0]
    });
    variants.push(Variant {
        tile: TileConfig {
            staged: true,
            ..tile(64, 128, 8, true, 1)
        },
        epilogue: Epilogue::Silu,
        bias: true,
        c: true,
        ..variants[0]
    });
    // Split-K partials (few tiles, long K): K-major and N-major B.
    for b_kmajor in [true, false] {
        variants.push(Variant {
            out_dtype: DType::F32,
            tile: tile(128, 256, 4, false, 1),
            b_kmajor,
            split_k: true,
            ..variants[0]
        });
    }
    // Split-K summed in the kernel (tiles filling 60% to all of the SMs once): K-major and
    // N-major B, and one with C, a bias and an activation.
    for b_kmajor in [true, false] {
        variants.push(Variant {
            tile: big_tma,
            b_kmajor,
            split_fused: true,
            ..variants[0]
        });
    }
    variants.push(Variant {
        tile: big_tma,
        epilogue: Epilogue::Gelu,
        bias: true,
        c: true,
        split_fused: true,
        ..variants[0]
    });
    for v in variants {
        out.push(crate::catalog::CatalogEntry {
            op: "gemm",
            label: v.label(),
            source: v.source(vendor)?,
        });
    }
    // Their reduction, plain and with the whole epilogue.
    for reduce in [
        SplitReduce {
            out_dtype: DType::BF16,
            epilogue: Epilogue::None,
            bias: false,
            c: false,
        },
        SplitReduce {
            out_dtype: DType::F16,
            epilogue: Epilogue::Gelu,
            bias: true,
            c: true,
        },
        SplitReduce {
            out_dtype: DType::F32,
            epilogue: Epilogue::Silu,
            bias: true,
            c: false,
        },
    ] {
        out.push(crate::catalog::CatalogEntry {
            op: "gemm",
            label: reduce.label(),
            source: reduce.source(vendor)?,
        });
    }
    Ok(out)
}

/// The split-K reduction (splitk.cu) for one output type and epilogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct SplitReduce {
    out_dtype: DType,
    epilogue: super::Epilogue,
    bias: bool,
    c: bool,
}

impl SplitReduce {
    fn label(&self) -> String {
        format!(
            "splitk reduce ->{} {:?} bias={} c={}",
            self.out_dtype, self.epilogue, self.bias, self.c
        )
    }
}

impl KernelVariant for SplitReduce {
    fn source(&self, vendor: calico_core::HeaderSet) -> Result<KernelSource> {
        let defines = vec![
            ("CALICO_GEMM_OUT", self.out_dtype.device_type().to_string()),
            ("CALICO_GEMM_EPILOGUE", self.epilogue.define().to_string()),
            ("CALICO_GEMM_HAS_BIAS", u8::from(self.bias).to_string()),
            ("CALICO_GEMM_HAS_C", u8::from(self.c).to_string()),
        ];
        KernelSource::assemble(
            SPLITK_ENTRY,
            SPLITK_SOURCE,
            &[
                vendor,
                calico_core::device_headers(),
                super::portable::GEMM_HEADERS,
            ],
            &defines,
        )
    }
}

/// How [`launch`] runs a problem: decided by [`plan_launch`] once per problem shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum LaunchPlan {
    /// Split-K summed inside the kernel ([`fused_split_plan`]).
    Fused {
        cfg: TileConfig,
        splits: usize,
    },
    /// Cut at a wave boundary ([`wave_cut`]): the head (D's rows or columns before `at`) on
    /// the uncut tile `head`, then the tail as planned.
    Cut {
        along_m: bool,
        at: usize,
        head: TileConfig,
        tail: WholePlan,
    },
    Whole(WholePlan),
}

/// One problem in one or two launches: the tile list once, or split-K ([`split_plan`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum WholePlan {
    Tiles(TileConfig),
    Split { cfg: TileConfig, splits: usize },
}

/// Launches the Hopper GEMM for `p` (call only when [`tiles`] is `Some`), cut in two at a
/// wave boundary when its last round of tiles would leave most SMs idle ([`wave_cut`]), split
/// along K when its tiles leave most SMs idle ([`split_plan`]).
pub(crate) fn launch(gpu: &dyn GpuBackend, p: &GemmProblem) -> Result<()> {
    static PLANS: PlanMemo<LaunchPlan> = PlanMemo::new();
    let arch = gpu.arch();
    match PLANS.get_or_plan(PlanKey::of(arch, p), || plan_launch(arch, p, Tune::get()))? {
        LaunchPlan::Fused { cfg, splits } => launch_fused(gpu, p, cfg, splits),
        LaunchPlan::Cut {
            along_m,
            at,
            head,
            tail,
        } => {
            let cut = wave_cut::cut_at(p, along_m, at).ok_or_else(not_supported)?;
            launch_tiles(gpu, &cut.head, head, 1, None)?;
            launch_whole(gpu, &cut.tail, tail)
        }
        LaunchPlan::Whole(whole) => launch_whole(gpu, p, whole),
    }
}

/// The form [`launch`] runs `p` in (fused split, wave cut, split-K or whole): a function of
/// `p`'s [`PlanKey`] and `tune` alone, so [`launch`] makes it once per key.
pub(super) fn plan_launch(arch: &Arch, p: &GemmProblem, tune: Tune) -> Result<LaunchPlan> {
    if let Some((cfg, splits)) = fused_split_plan(arch, p, tune) {
        return Ok(LaunchPlan::Fused { cfg, splits });
    }
    // The uncut launch's tile, picked once: the wave cut weighs it and the whole launch runs it.
    let whole = config(arch, p).ok_or_else(not_supported)?;
    if let Some(cut) = wave_cut_of(arch, p, whole, tune) {
        let head = config(arch, &cut.head).ok_or_else(not_supported)?;
        let tail = config(arch, &cut.tail).ok_or_else(not_supported)?;
        return Ok(LaunchPlan::Cut {
            along_m: cut.along_m,
            at: cut.at,
            head,
            tail: plan_whole(arch, &cut.tail, tail, tune),
        });
    }
    Ok(LaunchPlan::Whole(plan_whole(arch, p, whole, tune)))
}

/// [`plan_launch`] without a wave cut: the tile list on `whole` (`p`'s [`config`]) once, or
/// split-K's two launches.
fn plan_whole(arch: &Arch, p: &GemmProblem, whole: TileConfig, tune: Tune) -> WholePlan {
    match split_plan(arch, p, tune) {
        Some((cfg, splits)) => WholePlan::Split { cfg, splits },
        None => WholePlan::Tiles(whole),
    }
}

/// The fused split-K kernel's scratch: one slot of f32 partial sums per work item (workspace)
/// and one counter per tile (zeroed counters).
#[derive(Debug, Clone, Copy)]
struct FusedBuffers {
    partials: u64,
    counters: u64,
}

/// The fused split-K launch of `p` on tile `cfg` in `splits` pieces ([`fused_split_plan`]).
fn launch_fused(
    gpu: &dyn GpuBackend,
    p: &GemmProblem,
    cfg: TileConfig,
    splits: usize,
) -> Result<()> {
    let tiles = cfg.tiles(p);
    gpu.with_workspace(tiles * splits * cfg.slot_bytes(), &mut |partials| {
        gpu.with_counters(tiles * 4, &mut |counters| {
            let fused = FusedBuffers { partials, counters };
            launch_tiles(gpu, p, cfg, splits, Some(fused))
        })
    })
}

fn launch_whole(gpu: &dyn GpuBackend, p: &GemmProblem, plan: WholePlan) -> Result<()> {
    match plan {
        WholePlan::Split { cfg, splits } => launch_split(gpu, p, cfg, splits),
        WholePlan::Tiles(cfg) => launch_tiles(gpu, p, cfg, 1, None),
    }
}

/// [`launch`] without split-K, for callers that already hold the device's workspace (the
/// padded path's operand copies).
pub(super) fn launch_unsplit(gpu: &dyn GpuBackend, p: &GemmProblem) -> Result<()> {
    launch_for(gpu, p, d_tma_ok(p))
}

/// Launches the Hopper GEMM for `p` whose D is a padded buffer with aligned rows that may be
/// written past column N (the padded path's odd-width D): TMA stores whatever N is.
pub(super) fn launch_into_padded_d(gpu: &dyn GpuBackend, p: &GemmProblem) -> Result<()> {
    launch_for(gpu, p, d_rows_aligned(p))
}

/// Split-K: the Hopper kernel writes `splits` raw f32 partials of every tile into the
/// device's workspace, then splitk.cu sums them in order and applies `p`'s epilogue into D.
fn launch_split(
    gpu: &dyn GpuBackend,
    p: &GemmProblem,
    cfg: TileConfig,
    splits: usize,
) -> Result<()> {
    let matrix = p.m * p.n;
    let bytes = splits * p.batch * matrix * 4;
    gpu.with_workspace(bytes, &mut |base| {
        let partials = GemmProblem {
            out_dtype: DType::F32,
            c: None,
            d: MatrixArg {
                ptr: base,
                rows: p.m,
                cols: p.n,
                row_stride: p.n,
                col_stride: 1,
                batch_stride: matrix,
            },
            bias: None,
            alpha: 1.0,
            beta: 0.0,
            epilogue: super::Epilogue::None,
            ..*p
        };
        launch_tiles(gpu, &partials, cfg, splits, None)?;
        let has_c = p.c.is_some() && p.beta != 0.0;
        let c = p.c.filter(|_| has_c);
        let reduce = SplitReduce {
            out_dtype: p.out_dtype,
            epilogue: p.epilogue,
            bias: p.bias.is_some(),
            c: has_c,
        };
        let batched = |x: &MatrixArg| if p.batch <= 1 { 0 } else { x.batch_stride };
        let items = p.n.div_ceil(SPLITK_COLS) * p.m * p.batch;
        let blocks = u32::try_from(items.div_ceil(SPLITK_THREADS as usize))
            .map_err(|_| Error::unsupported("split-K reduction grid exceeds 2^32 blocks"))?;
        let args = [
            KernelArg::Ptr(base),
            KernelArg::I32(as_i32(splits, "k splits")?),
            KernelArg::I32(as_i32(p.m, "M")?),
            KernelArg::I32(as_i32(p.n, "N")?),
            KernelArg::I32(as_i32(p.batch, "batch")?),
            KernelArg::Ptr(p.d.ptr),
            KernelArg::I64(as_i64(p.d.row_stride, "D row stride")?),
            KernelArg::I64(as_i64(batched(&p.d), "D batch stride")?),
            KernelArg::Ptr(c.map_or(0, |c| c.ptr)),
            KernelArg::I64(as_i64(c.map_or(0, |c| c.row_stride), "C row stride")?),
            KernelArg::I64(as_i64(c.map_or(0, |c| batched(&c)), "C batch stride")?),
            KernelArg::Ptr(p.bias.unwrap_or(0)),
            KernelArg::F32(p.alpha),
            KernelArg::F32(p.beta),
        ];
        let config = LaunchConfig::linear(blocks, SPLITK_THREADS, 0);
        gpu.launch_variant(&reduce, &config, &args)
    })
}

fn launch_for(gpu: &dyn GpuBackend, p: &GemmProblem, d_tma: bool) -> Result<()> {
    let cfg = config_for(gpu.arch(), p, d_tma).ok_or_else(not_supported)?;
    launch_tiles(gpu, p, cfg, 1, None)
}

fn not_supported() -> Error {
    Error::unsupported(
        "the Hopper GEMM does not support this problem (layout, alignment or device)",
    )
}

/// Queues the Hopper kernel for `p` on tile `cfg`; `splits` > 1: `p` is the split-K partial
/// problem (f32 D in the workspace, no epilogue), run as that many copies of the tile list,
/// or with `fused`, `p` itself, its pieces summed in the kernel.
fn launch_tiles(
    gpu: &dyn GpuBackend,
    p: &GemmProblem,
    mut cfg: TileConfig,
    splits: usize,
    fused: Option<FusedBuffers>,
) -> Result<()> {
    let arch = gpu.arch();
    let b_kmajor = b_k_major(p) == Some(true);
    let tune = Tune::get();
    let no_tile = || Error::unsupported("no Hopper GEMM tile fits this device's shared memory");
    let mut map_d = OpaqueParam128([0; 128]);
    if cfg.tma_store && !cfg.staged {
        match operand_map(
            &p.d,
            p.out_dtype,
            p.n,
            p.m,
            p.d.row_stride,
            p.batch,
            STORE_BOX,
            STORE_BOX,
        ) {
            Ok((map, _)) => map_d = map,
            // A D the copy engine rejects: store from registers instead.
            Err(_) => {
                // The fused form sized its slots and counters for this tile shape: keep it.
                let shape = (cfg.bm, cfg.bn);
                let tune = match fused {
                    Some(_) => Tune {
                        bm: Some(shape.0),
                        bn: Some(shape.1),
                        ..tune
                    },
                    None => tune,
                };
                cfg = pick(arch, p, b_kmajor, false, tune).ok_or_else(no_tile)?;
                if fused.is_some() && (cfg.bm, cfg.bn) != shape {
                    return Err(no_tile());
                }
            }
        }
    }
    let (map_a, a_step) = operand_map(
        &p.a,
        p.in_dtype,
        p.k,
        p.m,
        p.a.row_stride,
        p.batch,
        BK,
        cfg.bm,
    )?;
    let (map_b, b_step) = if b_kmajor {
        // With a cluster each CTA loads (and multicasts) its share of the B box.
        operand_map(
            &p.b,
            p.in_dtype,
            p.k,
            p.n,
            p.b.col_stride,
            p.batch,
            BK,
            cfg.bn / cfg.cluster,
        )?
    } else {
        operand_map(
            &p.b,
            p.in_dtype,
            p.n,
            p.k,
            p.b.row_stride,
            p.batch,
            N_CHUNK,
            BK,
        )?
    };

    let has_c = p.c.is_some() && p.beta != 0.0;
    let variant = Variant {
        in_dtype: p.in_dtype,
        out_dtype: p.out_dtype,
        tile: cfg,
        b_kmajor,
        epilogue: p.epilogue,
        bias: p.bias.is_some(),
        c: has_c,
        l2: (tune.l2_a.unwrap_or_default(), tune.l2_b.unwrap_or_default()),
        split_k: splits > 1 && fused.is_none(),
        split_fused: fused.is_some(),
    };

    // Persistent: one CTA per SM (whole clusters), or the tuning override.
    let clusters = tune.grid.unwrap_or(arch.compute_units.max(1) as usize) / cfg.cluster;
    let clusters = clusters.max(1);
    let grid = ((cfg.work(p) * splits).min(clusters) * cfg.cluster) as u32;
    let c = p.c.filter(|_| has_c);
    let batched = |x: &MatrixArg| if p.batch <= 1 { 0 } else { x.batch_stride };
    let params = HopperParams {
        d: p.d.ptr,
        c: c.map_or(0, |c| c.ptr),
        bias: p.bias.unwrap_or(0),
        d_row_stride: as_i64(p.d.row_stride, "D row stride")?,
        // Split-K partials: matrix split * batch + b, even for one batch.
        d_batch_stride: if splits > 1 && fused.is_none() {
            as_i64(p.m * p.n, "split-K partial stride")?
        } else {
            as_i64(batched(&p.d), "D batch stride")?
        },
        c_row_stride: as_i64(c.map_or(0, |c| c.row_stride), "C row stride")?,
        c_batch_stride: as_i64(c.map_or(0, |c| batched(&c)), "C batch stride")?,
        m: as_i32(p.m, "M")?,
        n: as_i32(p.n, "N")?,
        k: as_i32(p.k, "K")?,
        batch: as_i32(p.batch, "batch")?,
        a_batch_step: a_step,
        b_batch_step: b_step,
        group_m: tune.group_m.unwrap_or(GROUP_M),
        alpha: p.alpha,
        beta: p.beta,
        k_splits: as_i32(splits, "k splits")?,
        split_partials: fused.map_or(0, |f| f.partials),
        split_counters: fused.map_or(0, |f| f.counters),
    };
    let args = [
        KernelArg::Opaque128(map_a),
        KernelArg::Opaque128(map_b),
        KernelArg::Opaque128(map_d),
        params.arg(),
    ];
    let config = LaunchConfig::linear(grid, THREADS, cfg.smem_bytes() as u32);
    gpu.launch_variant(&variant, &config, &args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::portable::tests::{h100, problem};

    #[test]
    fn tiles_filling_half_to_all_sms_sum_split_pieces_in_the_kernel() {
        // 7 x 12 = 84 tiles of 128 x 256: three pieces of K run in two rounds.
        let p = problem(777, 3072, 14336, true);
        let (cfg, splits) = fused_split_plan(&h100(), &p, Tune::default()).unwrap();
        assert_eq!((cfg.bm, cfg.bn, cfg.cluster, splits), (128, 256, 1, 3));
        assert!(cfg.tma_store);
        assert_eq!(cfg.slot_bytes(), 128 * 256 * 4);
        assert_eq!(k_splits(&h100(), &p), 3);
        assert!(planned_cut(&h100(), &p).is_none());
        for tune in [
            "fused=0",
            "split=2",
            "bm=128,bn=128",
            "mode=pingpong",
            "cluster=2",
        ] {
            assert_eq!(
                fused_split_plan(&h100(), &p, Tune::parse(tune)),
                None,
                "{tune}"
            );
        }
        // Whole rounds, few tiles (split-K's), short K: not fused.
        for (m, n, k) in [(4096, 4096, 4096), (129, 2048, 14336), (777, 8192, 1000)] {
            let p = problem(m, n, k, true);
            assert_eq!(
                fused_split_plan(&h100(), &p, Tune::default()),
                None,
                "{m}x{n}x{k}"
            );
        }
    }

    #[test]
    fn big_gemms_use_128x256_with_4_stages() {
        let p = problem(4096, 4096, 4096, true);
        assert!(config(&h100(), &p).is_some());
        let c = pick(&h100(), &p, true, d_tma_ok(&p), Tune::default()).unwrap();
        assert_eq!((c.bm, c.bn, c.stages), (128, 256, 4));
        assert!(c.tma_store);
        assert_eq!(c.cluster, DEFAULT_CLUSTER);
        assert!(c.smem_bytes() <= h100().shared_mem_per_block);
    }

    #[test]
    fn skinny_m_spreads_over_more_ctas() {
        let t = Tune::default();
        let c = pick(&h100(), &problem(16, 4096, 4096, true), true, true, t).unwrap();
        assert_eq!((c.bm, c.bn, c.tma_store), (64, 32, false));
        let c = pick(&h100(), &problem(256, 4096, 4096, true), true, true, t).unwrap();
        assert_eq!((c.bm, c.bn, c.tma_store), (64, 128, true));
        // N-major B needs 64-column chunks per consumer warpgroup.
        let c = pick(&h100(), &problem(16, 4096, 4096, false), false, true, t).unwrap();
        assert_eq!((c.bm, c.bn), (128, 64));
    }

    #[test]
    fn unaligned_strides_and_other_targets_are_declined() {
        let mut p = problem(100, 100, 100, true);
        p.a.row_stride = 100; // 200 bytes: not a multiple of 16
        assert!(config(&h100(), &p).is_none());
        let p = problem(128, 128, 128, true);
        assert!(config(&Arch::for_target("sm_80").unwrap(), &p).is_none());
        let mut p = problem(128, 128, 128, true);
        p.a.col_stride = 128;
        p.a.row_stride = 1;
        assert!(config(&h100(), &p).is_none());
    }

    #[test]
    fn the_staged_store_is_a_define_of_its_own() {
        let entries = catalog(calico_cuda::device_headers()).unwrap();
        let staged: Vec<_> = entries
            .iter()
            .filter(|e| e.label.contains("store=staged"))
            .collect();
        assert_eq!(staged.len(), 2);
        for e in &staged {
            assert!(e
                .source
                .text
                .contains("#define CALICO_GEMM_STAGED_STORE 1\n"));
            assert!(e.source.text.contains("#define CALICO_GEMM_TMA_STORE 1\n"));
        }
        // The other variants do not define it (the kernel defaults it to 0).
        for e in entries.iter().filter(|e| !e.label.contains("store=staged")) {
            assert!(!e.source.text.contains("#define CALICO_GEMM_STAGED_STORE 1"));
        }
    }

    #[test]
    fn smem_layout_matches_the_kernel() {
        let c = TileConfig {
            bm: 128,
            bn: 256,
            stages: 4,
            tma_store: false,
            staged: false,
            cluster: 1,
            pingpong: false,
        };
        assert_eq!(c.smem_bytes(), 1024 + 4 * 49152 + 64);
        let c = TileConfig {
            tma_store: true,
            ..c
        };
        assert_eq!(c.smem_bytes(), 1024 + 4 * 49152 + 32768 + 64);
        assert!(c.smem_bytes() + 1024 <= h100().shared_mem_per_block);
    }

    #[test]
    fn tuning_overrides_parse_and_apply() {
        let t = Tune::parse("bm=128,bn=128,stages=5,store=reg,cluster=2,group=4,grid=64");
        assert_eq!(
            t,
            Tune {
                bm: Some(128),
                bn: Some(128),
                stages: Some(5),
                tma_store: Some(false),
                cluster: Some(2),
                group_m: Some(4),
                grid: Some(64),
                pingpong: None,
                l2_a: None,
                l2_b: None,
                split: None,
                wave_cut: None,
                fused: None,
                narrow_pct: None,
                area_floor_pct: None,
            }
        );
        assert_eq!(Tune::parse("split=4").split, Some(4));
        assert_eq!(Tune::parse("split=0").split, None);
        let h = Tune::parse("l2a=last,l2b=first");
        assert_eq!(
            (h.l2_a, h.l2_b),
            (Some(L2Hint::EvictLast), Some(L2Hint::EvictFirst))
        );
        assert_eq!(Tune::parse("l2a=sideways").l2_a, None);
        // Nonsense is ignored.
        let bad = Tune::parse("bm=96,bn=banana,stages=99,store=x,cluster=3,=,foo,grid=0");
        assert_eq!(bad, Tune::default());
        let p = problem(4096, 4096, 4096, true);
        let c = pick(&h100(), &p, true, true, t).unwrap();
        assert_eq!(
            (c.bm, c.bn, c.stages, c.tma_store, c.cluster),
            (128, 128, 5, false, 2)
        );
        // A cluster needs two row tiles; N-major B an even number of 64-column chunks.
        let c = pick(&h100(), &problem(64, 4096, 4096, true), true, true, t).unwrap();
        assert_eq!(c.cluster, 1);
        let t2 = Tune::parse("bm=128,bn=64,cluster=2");
        let c = pick(&h100(), &problem(4096, 4096, 4096, false), false, true, t2).unwrap();
        assert_eq!((c.bn, c.cluster), (64, 1));
        // Too many stages for the shape: the most that fit.
        let c = pick(&h100(), &p, true, true, Tune::parse("stages=8")).unwrap();
        assert_eq!(c.stages, 4);
        // Small tiles take a deep ring unless told otherwise.
        let skinny = problem(64, 4096, 4096, true);
        let c = pick(&h100(), &skinny, true, true, Tune::default()).unwrap();
        assert_eq!((c.bm, c.bn, c.stages), (64, 32, 16));
        let c = pick(&h100(), &skinny, true, true, Tune::parse("stages=8")).unwrap();
        assert_eq!(c.stages, 8);
        assert!(!c.pingpong);
    }

    #[test]
    fn pingpong_is_opt_in_and_keeps_128_accumulators() {
        assert_eq!(Tune::parse("mode=pingpong").pingpong, Some(true));
        assert_eq!(Tune::parse("bn=128;mode=coop").pingpong, Some(false));
        assert_eq!(Tune::parse("mode=sideways").pingpong, None);
        let p = problem(4096, 4096, 4096, true);
        let pp = Tune::parse("mode=pingpong");
        // The big shape: 128 x 128 per warpgroup (128x256 would need 256 accumulators).
        let c = pick(&h100(), &p, true, true, pp).unwrap();
        assert_eq!(
            (c.bm, c.bn, c.stages, c.tma_store, c.pingpong),
            (128, 128, 6, true, true)
        );
        assert!(c.smem_bytes() + 1024 <= h100().shared_mem_per_block);
        // A forced 128x256 is out of reach; forced 64x256 keeps one m64n256 accumulator.
        let c = pick(
            &h100(),
            &p,
            true,
            true,
            Tune::parse("mode=pingpong,bm=128,bn=256"),
        )
        .unwrap();
        assert_eq!((c.bm, c.bn), (128, 128));
        let c = pick(
            &h100(),
            &p,
            true,
            true,
            Tune::parse("mode=pingpong,bm=64,bn=256"),
        )
        .unwrap();
        assert_eq!((c.bm, c.bn, c.stages, c.pingpong), (64, 256, 4, true));
        // Ping-pong warpgroups take whole tiles: N-major B needs BN a multiple of 64, and
        // BM = 64 no longer halves the columns (64x32 is fine with K-major B).
        let c = pick(&h100(), &problem(16, 4096, 4096, false), false, true, pp).unwrap();
        assert_eq!(c.bn % N_CHUNK, 0);
        let c = pick(&h100(), &problem(16, 4096, 4096, true), true, true, pp).unwrap();
        assert_eq!((c.bm, c.bn, c.tma_store), (64, 32, false));
        // Odd N * elem: TMA cannot store D; the staged store writes it from the staging
        // boxes (the default), else the register epilogue (CALICO_GEMM_ODD without `staged`).
        let mut odd = problem(4096, 4095, 4096, true);
        odd.d.row_stride = 4096;
        assert!(!d_tma_ok(&odd));
        let c = pick(&h100(), &odd, true, d_tma_ok(&odd), pp).unwrap();
        assert!(c.pingpong);
        assert_eq!(
            (c.tma_store, c.staged),
            (
                crate::gemm::odd_split::staged(),
                crate::gemm::odd_split::staged()
            )
        );
        // Two tiles per CTA wanted: 2048 x 1024 gets 128 x 128 cooperative but 64 x 128 (256
        // tiles, about two per SM) in ping-pong.
        let mid = problem(2048, 1024, 4096, true);
        let c = pick(&h100(), &mid, true, true, Tune::parse("bm=128")).unwrap();
        assert_eq!((c.bm, c.bn), (128, 128));
        let c = pick(&h100(), &mid, true, true, pp).unwrap();
        assert_eq!((c.bm, c.bn), (64, 128));
        // The default stays cooperative.
        let c = pick(&h100(), &p, true, true, Tune::default()).unwrap();
        assert!(!c.pingpong);
    }
}
