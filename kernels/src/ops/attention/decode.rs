//! Decode attention: 1 to 16 new query tokens per sequence against a KV cache, paged (vLLM /
//! FlashInfer layout) or contiguous, split along the KV length and merged through the LSE
//! (`kernels/device/attention/decode*.cu`). NVIDIA sm_80+ runs the tensor-core kernel
//! (`decode_mma.cu`); HIP, older GPUs and pages that are not a multiple of 16 tokens run the
//! lane kernel (`decode.cu`), which `CALICO_DECODE_TUNE=kernel=1` also selects for A/B runs.

use super::check::kernel_head_dim;
use super::decode_mma::{self, DecodeMmaVariant};
use super::decode_trace;
use super::stamps;
use super::AttentionOptions;
use crate::ops::check;
use crate::Device;
use calico_core::{
    Arch, DType, Error, GpuBackend, HeaderSet, KernelArg, KernelSource, KernelVariant,
    LaunchConfig, Result, Tensor,
};

/// The most tokens one sequence's cache may address (token indices are 32-bit on GPUs).
const MAX_TOKENS: usize = (i32::MAX as usize) - (1 << 16);

/// The most query tokens per sequence a decode call takes.
pub const MAX_DECODE_QUERIES: usize = 16;

/// A KV cache as decode attention reads it. Every tensor lives on the op's device; K and V
/// have the query's dtype and a contiguous head dimension; `seq_lens` (I32 `[B]`, contiguous)
/// gives the tokens of each sequence in the cache, the new ones included.
#[derive(Debug, Clone, Copy)]
pub enum KvCache<'a> {
    /// Pages of `page_size` tokens: `k_pages`/`v_pages` `[num_pages, page_size, Hkv, D]` (any
    /// strides), `block_table` I32 `[B, max_pages]` (rows contiguous): token `j` of sequence
    /// `b` is in page `block_table[b][j / page_size]` at slot `j % page_size`.
    Paged {
        k_pages: &'a Tensor,
        v_pages: &'a Tensor,
        block_table: &'a Tensor,
        seq_lens: &'a Tensor,
    },
    /// One slab per sequence: `k`/`v` `[B, Hkv, Nmax, D]` (any strides); sequence `b` uses its
    /// first `seq_lens[b]` tokens.
    Contiguous {
        k: &'a Tensor,
        v: &'a Tensor,
        seq_lens: &'a Tensor,
    },
}

/// Attention of `q` (`[B, Hq, Nq, D]`, any strides with D contiguous; a `[B, Nq, Hq, D]` tensor
/// is passed as its `transpose(1, 2)`) over `cache`, writing `o` (like `q`) and `lse` (f32
/// `[B, Hq, Nq]`, contiguous, natural log). The Nq queries are the last Nq tokens of each
/// sequence: causal masks and windows are bottom-right aligned (query `i` sees key `j` iff
/// `j <= i + L - Nq`). bf16 or f16; D of 64, 128 or 256; Hq a multiple of Hkv. A query that
/// sees no key gets O = 0 and LSE = -inf.
///
/// `seq_lens` and `block_table` are device data the op cannot read without a sync: on GPUs a
/// length is clamped to `[0, capacity]` and a page index to the pool (bad entries give wrong
/// values, never reads outside the tensors); the CPU backend rejects them with an `Err`.
pub fn attention_decode(
    dev: &Device,
    q: &Tensor,
    cache: &KvCache<'_>,
    opts: &AttentionOptions,
    o: &mut Tensor,
    lse: &mut Tensor,
) -> Result<()> {
    let p = Problem::new(dev, q, cache, opts, o, lse)?;
    if p.batch == 0 || p.hq == 0 {
        return Ok(());
    }
    let gpu = match dev {
        Device::Cpu(_) => {
            return calico_cpu::attention_decode(q, &p.cpu_cache(cache), &p.mask, o, lse)
        }
        _ => dev
            .as_gpu()
            .ok_or_else(|| Error::unsupported("device has no kernel launcher"))?,
    };
    launch(gpu, &p, q, cache, o, lse)
}

/// The validated sizes of one call.
struct Problem {
    dtype: DType,
    batch: usize,
    hq: usize,
    hkv: usize,
    nq: usize,
    dim: usize,
    /// Tokens one sequence can hold: Nmax, or max_pages * page_size.
    capacity: usize,
    page_size: usize,
    num_pages: usize,
    mask: calico_cpu::DecodeMask,
}

impl Problem {
    /// The kernels' head dim: 64, 128 or 256, the next one up for a head dim between them
    /// (`head_dim_supported` has admitted `dim`, so the fallback is never taken).
    fn width(&self) -> usize {
        kernel_head_dim(self.dim, 256).unwrap_or(self.dim)
    }

    fn new(
        dev: &Device,
        q: &Tensor,
        cache: &KvCache<'_>,
        opts: &AttentionOptions,
        o: &Tensor,
        lse: &Tensor,
    ) -> Result<Problem> {
        let dtype = q.dtype();
        if !matches!(dtype, DType::BF16 | DType::F16) {
            return Err(Error::DType {
                expected: "bf16 or f16 for `q`".into(),
                got: dtype,
            });
        }
        let [batch, hq, nq, dim] = rank4("q", q)?;
        if !(1..=MAX_DECODE_QUERIES).contains(&nq) {
            return Err(Error::shape(format!(
                "attention_decode takes 1 to {MAX_DECODE_QUERIES} query tokens per sequence, got {nq}"
            )));
        }
        head_dim_supported(dim)?;
        let (k, v, table, seq_lens) = match *cache {
            KvCache::Paged {
                k_pages,
                v_pages,
                block_table,
                seq_lens,
            } => (k_pages, v_pages, Some(block_table), seq_lens),
            KvCache::Contiguous { k, v, seq_lens } => (k, v, None, seq_lens),
        };
        // A fixed array (the block table absent for contiguous caches): decode validates on
        // every step and allocates nothing.
        let inputs = [
            ("q", Some(q)),
            ("k", Some(k)),
            ("v", Some(v)),
            ("seq_lens", Some(seq_lens)),
            ("block_table", table),
        ];
        check::on_device_if_given(dev, &inputs)?;
        check::on_device(dev, &[("o", o), ("lse", lse)])?;
        check::dtype_is("k", k, dtype)?;
        check::dtype_is("v", v, dtype)?;
        check::dtype_is("o", o, dtype)?;
        check::dtype_is("lse", lse, DType::F32)?;
        check::dtype_is("seq_lens", seq_lens, DType::I32)?;
        check::shape_is("o", o, q.shape())?;
        check::shape_is("lse", lse, &[batch, hq, nq])?;
        if !lse.layout().is_contiguous() {
            return Err(Error::stride("`lse` must be contiguous [B, Hq, Nq]"));
        }
        check::shape_is("seq_lens", seq_lens, &[batch])?;
        if !seq_lens.layout().is_contiguous() {
            return Err(Error::stride("`seq_lens` must be contiguous"));
        }
        check::shape_is("v", v, k.shape())?;
        let (hkv, capacity, page_size, num_pages) = match table {
            Some(table) => {
                let [num_pages, page_size, hkv, kd] = rank4("k_pages", k)?;
                if kd != dim {
                    return Err(Error::shape(format!(
                        "`k_pages` has head_dim {kd}, `q` has {dim}"
                    )));
                }
                if page_size == 0 {
                    return Err(Error::shape("pages must hold at least one token"));
                }
                check::dtype_is("block_table", table, DType::I32)?;
                if table.shape().len() != 2 || table.shape()[0] != batch {
                    return Err(Error::shape(format!(
                        "`block_table` must be [{batch}, max_pages], got {:?}",
                        table.shape()
                    )));
                }
                if table.shape()[1] > 1 && table.strides()[1] != 1 {
                    return Err(Error::stride(
                        "the rows of `block_table` must be contiguous",
                    ));
                }
                let max_pages = table.shape()[1];
                if max_pages > 0 && num_pages == 0 {
                    return Err(Error::shape(
                        "`block_table` has entries but the pool has no pages",
                    ));
                }
                let capacity = max_pages
                    .checked_mul(page_size)
                    .filter(|&c| c <= MAX_TOKENS)
                    .ok_or_else(|| Error::shape("the block table addresses too many tokens"))?;
                (hkv, capacity, page_size, num_pages)
            }
            None => {
                let [kb, hkv, nmax, kd] = rank4("k", k)?;
                if kb != batch || kd != dim {
                    return Err(Error::shape(format!(
                        "`k` must be [{batch}, Hkv, Nmax, {dim}], got {:?}",
                        k.shape()
                    )));
                }
                if nmax > MAX_TOKENS {
                    return Err(Error::shape(format!(
                        "`k` holds {nmax} tokens per sequence; at most {MAX_TOKENS} are supported"
                    )));
                }
                (hkv, nmax, nmax, batch)
            }
        };
        if hkv == 0 || hq % hkv != 0 {
            return Err(Error::shape(format!(
                "query heads ({hq}) must be a multiple of KV heads ({hkv})"
            )));
        }
        for (name, t) in [("q", q), ("k", k), ("v", v), ("o", o)] {
            if t.strides()[3] != 1 {
                return Err(Error::stride(format!(
                    "the head dimension of `{name}` must be contiguous"
                )));
            }
        }
        check::no_overlap_if_given(&[("o", o), ("lse", lse)], &inputs)?;
        let scale = opts.scale.unwrap_or(1.0 / (dim as f32).sqrt());
        if !scale.is_finite() {
            return Err(Error::shape(format!(
                "the softmax scale must be finite, got {scale}"
            )));
        }
        if let Some(cap) = opts.softcap {
            if !(cap.is_finite() && cap > 0.0) {
                return Err(Error::shape(format!(
                    "the soft-cap must be positive and finite, got {cap}"
                )));
            }
        }
        Ok(Problem {
            dtype,
            batch,
            hq,
            hkv,
            nq,
            dim,
            capacity,
            page_size,
            num_pages,
            mask: calico_cpu::DecodeMask {
                scale,
                causal: opts.causal,
                window: opts.window,
                softcap: opts.softcap,
            },
        })
    }

    fn cpu_cache<'a>(&self, cache: &KvCache<'a>) -> calico_cpu::DecodeCache<'a> {
        match *cache {
            KvCache::Paged {
                k_pages,
                v_pages,
                block_table,
                seq_lens,
            } => calico_cpu::DecodeCache::Paged {
                k_pages,
                v_pages,
                block_table,
                seq_lens,
            },
            KvCache::Contiguous { k, v, seq_lens } => {
                calico_cpu::DecodeCache::Contiguous { k, v, seq_lens }
            }
        }
    }

    /// Query rows that share one KV head.
    fn rows_per_kv_head(&self) -> usize {
        self.hq / self.hkv * self.nq
    }
}

fn rank4(name: &str, t: &Tensor) -> Result<[usize; 4]> {
    match *t.shape() {
        [a, b, c, d] => Ok([a, b, c, d]),
        _ => Err(Error::shape(format!(
            "`{name}` must have rank 4, got {:?}",
            t.shape()
        ))),
    }
}

/// One compiled form of the main decode kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct DecodeVariant {
    pub dtype: DType,
    /// The kernel's width: 64, 128 or 256.
    pub head_dim: usize,
    /// The problem's head dim (at most `head_dim`; below it, the lanes past it load zeros and
    /// only its columns of O are written).
    pub used_dim: usize,
    /// Query rows per block (1..=8).
    pub rows: usize,
    /// 16-byte accesses per lane per tile (of K and of V each).
    pub unroll: usize,
    pub paged: bool,
    /// Loads of the next tile issued before the math of the current one.
    pub pipe: bool,
    /// Blocks per SM the registers must allow on NVIDIA (0: no bound).
    pub min_blocks: usize,
}

/// The split combiner for one output dtype and head_dim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct CombineVariant {
    pub dtype: DType,
    /// The partials' width (the main kernel's).
    pub head_dim: usize,
    /// The columns of O written.
    pub used_dim: usize,
    /// `decode_merge_row`'s batched vector loads instead of the serial loop (same sums).
    pub batched: bool,
}

const DECODE_SOURCE: &str = include_str!("../../../device/attention/decode.cu");
const COMBINE_SOURCE: &str = include_str!("../../../device/attention/decode_combine.cu");
pub(super) const DECODE_HEADERS: HeaderSet = &[(
    "attention/decode_common.h",
    include_str!("../../../device/attention/decode_common.h"),
)];
/// Warps per block of both kernels.
const WARPS: usize = 4;
/// Most query rows one block keeps in registers.
const MAX_ROWS: usize = 8;
const MAX_SPLITS: usize = 1024;
/// Most split groups (sequences x KV heads x row groups) a fused call counts (4 bytes each).
const MAX_FUSED_GROUPS: usize = 1 << 20;

/// Tuning knobs, defaults from the H100 measurements in docs/perf-log.md;
/// `CALICO_DECODE_TUNE="kernel=1,pipe=0,unroll=8,minblocks=2,blocks_per_sm=4,min_split=128"`
/// overrides them for A/B runs. kernel: 2 = tensor cores where they run (stages, warps,
/// splits_x, fuse: the last block of a split group merges, no combine launch), 1 =
/// the lane kernel (pipe, unroll: applies to blocks of at most 4 rows, larger blocks use half;
/// minblocks, blocks_per_sm); min_split applies to both; merge=1: the combiner loads a batch of
/// splits at once (vector loads); early=1 (kernel 2): the first copies sooner;
/// l2_ahead=n (kernel 2): L2 prefetch n tiles past each copy. fuse and early are on by default
/// (`fuse=0,early=0` gives back the two-launch kernel). Session 9 (kernel 2; warps=8, spec,
/// lean and mpipe on by default, `warps=4,spec=0,lean=0,mpipe=0` turns them off): spec=1 the first
/// copies before the sequence length is known (turns early on); mbatch=8|16|32 the splits the
/// fused merge loads at once; max_splits=n caps the split count; lean=1 the fused merge's
/// fences by one thread after a barrier; mpipe=1 the fused merge with every load of a row
/// issued early (LSEs once, next batch before the sums); long_context=n the cache length from
/// which a split plan that is not one full wave takes 4-warp blocks (session 22; warps=n turns
/// the choice off); trace=1 a diagnostic: each
/// call allocates, syncs and prints when its blocks reached their milestones (`decode_trace`;
/// times taken around such calls include the sync; not for graph capture).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tune {
    kernel: usize,
    /// Tiles in each warp's cp.async ring (kernel 2).
    stages: usize,
    /// Warps per block (kernel 2).
    warps: usize,
    /// Warps per block (kernel 2) for caches of `long_context` tokens or more whose `warps`
    /// plan splits them but is not one full wave of blocks: blocks of fewer warps, several per
    /// SM, stream on every SM in one wave. `warps=n` turns the choice off.
    long_warps: usize,
    /// Cache length from which `long_warps` is tried (usize::MAX: never).
    long_context: usize,
    /// Multiplies kernel 2's split count (A/B runs of the split choice; 1 = as chosen).
    splits_x: usize,
    /// Kernel 2 merges the splits in its last block per group instead of a second launch.
    fuse: bool,
    /// The combine launch uses the batched merge.
    merge_batched: bool,
    /// Kernel 2: the first copies go out sooner (see decode_mma.cu's EARLY).
    early: bool,
    /// Kernel 2: tiles past the copied one each warp asks L2 for.
    l2_ahead: usize,
    /// Kernel 2: the first copies before the sequence length (see decode_mma.cu's SPEC).
    spec: bool,
    /// Kernel 2: splits the fused merge loads at once (0: its default).
    merge_batch: usize,
    /// Most KV splits per call (kernel 2).
    max_splits: usize,
    /// Kernel 2: stamp each block's milestones and print them per call (syncs).
    trace: bool,
    /// Kernel 2: the fused merge's fences by one thread (see decode_mma.cu's LEAN_COUNT).
    lean_count: bool,
    /// Kernel 2: the fused merge's loads issued early (decode_merge_row_early).
    merge_early: bool,
    pipe: bool,
    unroll: usize,
    min_blocks: usize,
    /// Blocks per SM the split aims for (enough loads in flight to cover the memory latency).
    blocks_per_sm: usize,
    /// Fewest KV tokens worth a split of their own.
    min_split: usize,
}

const DEFAULT_TUNE: Tune = Tune {
    kernel: 2,
    stages: 3,
    // Session 9 (H100, one command each, both orders; full profile): warps=8, spec, lean and
    // mpipe: b1 8k 49 -> 54% of copy, b1 32k 77 -> 83%, b16 94 -> 98%, b64 equal, b1 128k
    // 94 -> 90% (paged; 33 splits of 4 warps filled the SMs better there).
    // `warps=4,spec=0,lean=0,mpipe=0` gives back session 8's default.
    warps: 8,
    long_warps: 4,
    long_context: 65536,
    splits_x: 1,
    // Session 8 (H100, one command): b1 8k 39 -> 47% of copy, b1 32k 70 -> 75%, b16 92 -> 94%.
    fuse: true,
    merge_batched: false,
    early: true,
    l2_ahead: 0,
    spec: true,
    merge_batch: 0,
    max_splits: MAX_SPLITS,
    trace: false,
    lean_count: true,
    merge_early: true,
    pipe: true,
    unroll: 4,
    min_blocks: 0,
    blocks_per_sm: 4,
    min_split: 128,
};

fn tune() -> Tune {
    static TUNE: std::sync::OnceLock<Tune> = std::sync::OnceLock::new();
    crate::knobs::read(&TUNE, "CALICO_DECODE_TUNE", parse_tune)
}

/// `key=value` pairs over the defaults; unknown keys and bad values are ignored.
fn parse_tune(text: &str) -> Tune {
    let mut t = DEFAULT_TUNE;
    for (key, value) in crate::knobs::pairs(text) {
        let Ok(n) = value.parse::<usize>() else {
            continue;
        };
        match key {
            "kernel" if matches!(n, 1 | 2) => t.kernel = n,
            "stages" if (2..=8).contains(&n) => t.stages = n,
            "warps" if matches!(n, 1 | 2 | 4 | 8) => {
                t.warps = n;
                t.long_context = usize::MAX;
            }
            "long_context" if n >= 16 => t.long_context = n,
            "splits_x" if (1..=16).contains(&n) => t.splits_x = n,
            "fuse" => t.fuse = n != 0,
            "merge" => t.merge_batched = n != 0,
            "early" => t.early = n != 0,
            "l2_ahead" if n <= 8 => t.l2_ahead = n,
            "spec" => t.spec = n != 0,
            "mbatch" if matches!(n, 0 | 8 | 16 | 32) => t.merge_batch = n,
            "max_splits" if (1..=MAX_SPLITS).contains(&n) => t.max_splits = n,
            "trace" => t.trace = n != 0,
            "lean" => t.lean_count = n != 0,
            "mpipe" => t.merge_early = n != 0,
            "pipe" => t.pipe = n != 0,
            "unroll" if matches!(n, 1 | 2 | 4 | 8 | 16) => t.unroll = n,
            "minblocks" if n <= 8 => t.min_blocks = n,
            "blocks_per_sm" if (1..=32).contains(&n) => t.blocks_per_sm = n,
            "min_split" if n >= 16 => t.min_split = n,
            _ => {}
        }
    }
    t
}

impl KernelVariant for DecodeVariant {
    fn source(&self, vendor: HeaderSet) -> Result<KernelSource> {
        let defines = [
            ("ELEM", self.dtype.device_type().to_string()),
            ("HEAD_DIM", self.head_dim.to_string()),
            ("HEAD_DIM_USED", self.used_dim.to_string()),
            ("ROWS", self.rows.to_string()),
            ("UNROLL", self.unroll.to_string()),
            ("PAGED", u8::from(self.paged).to_string()),
            ("PIPE", u8::from(self.pipe).to_string()),
            ("MIN_BLOCKS", self.min_blocks.to_string()),
        ];
        let sets = [vendor, calico_core::device_headers(), DECODE_HEADERS];
        KernelSource::assemble("calico_attention_decode", DECODE_SOURCE, &sets, &defines)
    }
}

impl DecodeVariant {
    /// Tokens one warp reads per tile.
    fn tile_tokens(&self, lanes: usize) -> usize {
        lanes / (self.head_dim / 8) * self.unroll
    }
}

impl KernelVariant for CombineVariant {
    fn source(&self, vendor: HeaderSet) -> Result<KernelSource> {
        let defines = [
            ("ELEM", self.dtype.device_type().to_string()),
            ("HEAD_DIM", self.head_dim.to_string()),
            ("HEAD_DIM_USED", self.used_dim.to_string()),
            ("MERGE_BATCHED", u8::from(self.batched).to_string()),
        ];
        let sets = [vendor, calico_core::device_headers(), DECODE_HEADERS];
        KernelSource::assemble(
            "calico_attention_decode_combine",
            COMBINE_SOURCE,
            &sets,
            &defines,
        )
    }
}

/// The kernel that reads the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MainKernel {
    /// decode.cu: lanes per row, any vendor.
    Lanes(DecodeVariant),
    /// decode_mma.cu: tensor cores, NVIDIA sm_80+.
    Mma(DecodeMmaVariant),
}

impl MainKernel {
    /// The kernel's head dim (64, 128 or 256, a padded head dim's too): the partials' width.
    fn width(&self) -> usize {
        match self {
            MainKernel::Lanes(v) => v.head_dim,
            MainKernel::Mma(v) => v.head_dim,
        }
    }
}

/// How one call is cut into blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    pub kernel: MainKernel,
    /// Blocks per KV head covering its query rows.
    pub row_groups: usize,
    pub splits: usize,
    /// KV tokens per split (a multiple of the warp tile).
    pub split_tokens: usize,
    /// The combine launch (if any) uses the batched merge.
    pub batched_merge: bool,
}

fn plan(arch: &Arch, p: &Problem, paged: bool) -> Plan {
    plan_with(arch, p, paged, tune())
}

/// Decode takes head dims that are multiples of 8 up to 256 (the kernels' widths 64, 128, 256
/// and the dims below them); the call's check and `ops::plan`'s.
pub(crate) fn head_dim_supported(dim: usize) -> Result<()> {
    if kernel_head_dim(dim, 256).is_none() {
        return Err(Error::unsupported(format!(
            "attention_decode supports head dims that are multiples of 8 up to 256, got {dim}"
        )));
    }
    Ok(())
}

/// The tensor-core kernel where it runs (unless tuned off), else the lane kernel; both take
/// the head dims between 64, 128 and 256 at the next of those widths.
fn plan_with(arch: &Arch, p: &Problem, paged: bool, tune: Tune) -> Plan {
    let pages = paged.then_some(p.page_size);
    let width = p.width();
    if tune.kernel == 2 && decode_mma::runs_here(arch, p.dtype, pages) {
        // Fewer warps where their rings do not fit (warps=8 at head_dim 256), rather than
        // the lane kernel.
        let fitting = |warps: usize| {
            std::iter::successors(Some(warps), |&w| (w > 1).then_some(w / 2))
                .find_map(|w| {
                    DecodeMmaVariant::fitting(arch, p.dtype, width, paged, w, tune.stages)
                })
                .map(|v| DecodeMmaVariant {
                    used_dim: p.dim,
                    ..v
                })
        };
        if let Some(v) = fitting(tune.warps) {
            let plan = plan_mma(arch, p, v, tune);
            if long_cache_misses_one_wave(arch, p, &plan, v, tune) {
                if let Some(long) = fitting(tune.long_warps).filter(|l| l.warps < v.warps) {
                    return plan_mma(arch, p, long, tune);
                }
            }
            return plan;
        }
    }
    plan_lanes(arch, p, paged, tune)
}

/// Whether a kernel-2 plan for a long cache (`tune.long_context` tokens or more) splits it
/// but does not run as exactly one full wave of blocks: b1 at 128k with 8 warps is 33 splits x
/// 8 KV heads = two waves of 132 blocks (each wave pays the ramp, ~10 us), or 16 splits on 128
/// of the 132 SMs, where 33 splits of 4-warp blocks (two per SM) are one wave on every SM.
/// Plans without splits keep their warps: more splits would add a merge (b16 at 8k: 8 warps,
/// no split, 96% of the copy against 94% with 4 warps and 2 splits).
fn long_cache_misses_one_wave(
    arch: &Arch,
    p: &Problem,
    plan: &Plan,
    v: DecodeMmaVariant,
    tune: Tune,
) -> bool {
    let blocks = p.batch * p.hkv * plan.row_groups * plan.splits;
    plan.splits > 1 && p.capacity >= tune.long_context && blocks != v.slots(arch)
}

/// Row groups of up to 16 rows (one MMA tile); splits from the waves of blocks the GPU runs.
fn plan_mma(arch: &Arch, p: &Problem, mut variant: DecodeMmaVariant, tune: Tune) -> Plan {
    let row_groups = p.rows_per_kv_head().div_ceil(decode_mma::BLOCK_ROWS);
    let blocks = p.batch * p.hkv * row_groups;
    let (mut splits, mut split_tokens) = decode_mma::choose_splits(
        blocks,
        variant.slots(arch),
        p.capacity,
        tune.min_split,
        tune.max_splits,
    );
    if tune.splits_x > 1 {
        let want = (splits * tune.splits_x).min(tune.max_splits);
        split_tokens = decode_mma::split_tokens(p.capacity, want);
        splits = p.capacity.div_ceil(split_tokens).max(1);
    }
    // One counter per split group; a single split needs no merge.
    variant.fused = tune.fuse && splits > 1 && blocks <= MAX_FUSED_GROUPS;
    // SPEC issues its copies from EARLY's page batches.
    variant.early = tune.early || tune.spec;
    variant.l2_ahead = tune.l2_ahead;
    variant.spec = tune.spec;
    variant.merge_batch = if variant.fused { tune.merge_batch } else { 0 };
    variant.trace = tune.trace;
    variant.lean_count = variant.fused && tune.lean_count;
    variant.merge_early = variant.fused && tune.merge_early;
    Plan {
        kernel: MainKernel::Mma(variant),
        row_groups,
        splits,
        split_tokens,
        batched_merge: tune.merge_batched,
    }
}

/// Rows per block as even as possible under [`MAX_ROWS`]; splits so that about
/// `blocks_per_sm` blocks per SM stream the cache, each with at least `min_split` tokens.
fn plan_lanes(arch: &Arch, p: &Problem, paged: bool, tune: Tune) -> Plan {
    let rows_total = p.rows_per_kv_head();
    let row_groups = rows_total.div_ceil(MAX_ROWS);
    let rows = rows_total.div_ceil(row_groups);
    let variant = DecodeVariant {
        dtype: p.dtype,
        head_dim: p.width(),
        used_dim: p.dim,
        rows,
        unroll: if rows <= 4 {
            tune.unroll
        } else {
            (tune.unroll / 2).max(1)
        },
        paged,
        pipe: tune.pipe,
        min_blocks: tune.min_blocks,
    };
    let tile = variant.tile_tokens(arch.lanes.max(1) as usize);
    let blocks = p.batch * p.hkv * row_groups;
    let target = (arch.compute_units.max(1) as usize * tune.blocks_per_sm).div_ceil(blocks);
    let by_length = p.capacity.div_ceil(tune.min_split);
    let want = target.min(by_length).clamp(1, MAX_SPLITS);
    let split_tokens = p.capacity.div_ceil(want).div_ceil(tile).max(1) * tile;
    let splits = p.capacity.div_ceil(split_tokens).max(1);
    Plan {
        kernel: MainKernel::Lanes(variant),
        row_groups,
        splits,
        split_tokens,
        batched_merge: tune.merge_batched,
    }
}

fn i64_of(v: usize) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::shape(format!("{v} does not fit the kernel's i64")))
}

fn i32_of(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::shape(format!("{what} ({v}) is too large")))
}

/// A device address that a 16-byte vector access may use, with strides of whole vectors.
fn vector_ready(name: &str, t: &Tensor, strides: &[usize]) -> Result<()> {
    let addr = t.device_ptr().unwrap_or(0);
    if !addr.is_multiple_of(16) || strides.iter().any(|s| s % 8 != 0) {
        return Err(Error::stride(format!(
            "`{name}` must start 16-byte aligned with strides that are multiples of 8 elements \
             on GPUs (strides {:?})",
            t.strides()
        )));
    }
    Ok(())
}

fn launch(
    gpu: &dyn GpuBackend,
    p: &Problem,
    q: &Tensor,
    cache: &KvCache<'_>,
    o: &Tensor,
    lse: &Tensor,
) -> Result<()> {
    let (k, v, table, seq_lens, paged) = match *cache {
        KvCache::Paged {
            k_pages,
            v_pages,
            block_table,
            seq_lens,
        } => (k_pages, v_pages, Some(block_table), seq_lens, true),
        KvCache::Contiguous { k, v, seq_lens } => (k, v, None, seq_lens, false),
    };
    let plan = plan(gpu.arch(), p, paged);
    let qs = q.strides();
    vector_ready("q", q, &qs[..3])?;
    // Paged: page, token, head strides; contiguous: batch (the "page"), token, head.
    let kv_strides = |t: &Tensor| -> [usize; 3] {
        let s = t.strides();
        if paged {
            [s[0], s[1], s[2]]
        } else {
            [s[0], s[2], s[1]]
        }
    };
    let (ks, vs) = (kv_strides(k), kv_strides(v));
    if k.numel() > 0 {
        vector_ready("k", k, &ks)?;
        vector_ready("v", v, &vs)?;
    }
    let os = o.strides();
    let rows = p.batch * p.hq * p.nq;
    let width = plan.kernel.width();
    let ws_bytes = if plan.splits > 1 {
        rows * plan.splits * (width + 1) * 4
    } else {
        0
    };
    let (table_ptr, table_stride) = match table {
        Some(t) => (t.device_ptr().unwrap_or(0), t.strides()[0]),
        None => (0, 0),
    };
    let page_shift = if paged && p.page_size.is_power_of_two() {
        p.page_size.trailing_zeros() as i32
    } else {
        -1
    };
    let (win_left, win_right) = match p.mask.window {
        Some((l, r)) => (
            i64_of(l.min(i32::MAX as usize))?,
            i64_of(r.min(i32::MAX as usize))?,
        ),
        None => (-1, -1),
    };
    let log2e = std::f32::consts::LOG2_E;
    let qk_scale = if p.mask.softcap.is_some() {
        p.mask.scale
    } else {
        p.mask.scale * log2e
    };
    let grid_y = p.hkv * plan.row_groups;
    if grid_y > 65_535 || p.batch > 65_535 {
        return Err(Error::shape(format!(
            "attention_decode: {} KV heads x {} row groups or batch {} exceed the grid",
            p.hkv, plan.row_groups, p.batch
        )));
    }
    let fused = matches!(plan.kernel, MainKernel::Mma(v) if v.fused);
    // trace=1: a buffer for the blocks' stamps, zero (milestones not reached stay 0).
    let trace = match plan.kernel {
        MainKernel::Mma(v) if v.trace => {
            let blocks = plan.splits * grid_y * p.batch;
            Some(stamps::zeroed(gpu, blocks * decode_trace::SLOTS)?)
        }
        _ => None,
    };
    let trace_ptr = trace.as_ref().and_then(|t| t.device_address()).unwrap_or(0);
    // The main kernel and, unless it merges itself (fused), the combiner.
    let launch_both = |ws_base: u64, counters: u64| -> Result<()> {
        let part_o = ws_base;
        let part_lse = ws_base + (rows * plan.splits * width * 4) as u64;
        let args = [
            KernelArg::Ptr(q.device_ptr().unwrap_or(0)),
            KernelArg::I64(i64_of(qs[0])?),
            KernelArg::I64(i64_of(qs[1])?),
            KernelArg::I64(i64_of(qs[2])?),
            KernelArg::Ptr(k.device_ptr().unwrap_or(0)),
            KernelArg::I64(i64_of(ks[0])?),
            KernelArg::I64(i64_of(ks[1])?),
            KernelArg::I64(i64_of(ks[2])?),
            KernelArg::Ptr(v.device_ptr().unwrap_or(0)),
            KernelArg::I64(i64_of(vs[0])?),
            KernelArg::I64(i64_of(vs[1])?),
            KernelArg::I64(i64_of(vs[2])?),
            KernelArg::Ptr(table_ptr),
            KernelArg::I64(i64_of(table_stride)?),
            KernelArg::I64(i64_of(p.page_size)?),
            KernelArg::I32(page_shift),
            KernelArg::I64(i64_of(p.num_pages)?),
            KernelArg::Ptr(seq_lens.device_ptr().unwrap_or(0)),
            KernelArg::I64(i64_of(p.capacity)?),
            KernelArg::Ptr(o.device_ptr().unwrap_or(0)),
            KernelArg::I64(i64_of(os[0])?),
            KernelArg::I64(i64_of(os[1])?),
            KernelArg::I64(i64_of(os[2])?),
            KernelArg::Ptr(lse.device_ptr().unwrap_or(0)),
            KernelArg::Ptr(part_o),
            KernelArg::Ptr(part_lse),
            KernelArg::I32(i32_of(p.hq, "query heads")?),
            KernelArg::I32(i32_of(p.hkv, "KV heads")?),
            KernelArg::I32(i32_of(p.nq, "query tokens")?),
            KernelArg::I32(i32_of(plan.row_groups, "row groups")?),
            KernelArg::I32(i32_of(plan.splits, "splits")?),
            KernelArg::I64(i64_of(plan.split_tokens)?),
            KernelArg::F32(qk_scale),
            KernelArg::F32(p.mask.softcap.unwrap_or(0.0)),
            KernelArg::I32(i32::from(p.mask.causal)),
            KernelArg::I64(win_left),
            KernelArg::I64(win_right),
            // The tensor-core kernel's last two parameters (the lane kernel has neither).
            KernelArg::Ptr(counters),
            KernelArg::Ptr(trace_ptr),
        ];
        let lanes = gpu.arch().lanes.max(1);
        let grid = (plan.splits as u32, grid_y as u32, p.batch as u32);
        match &plan.kernel {
            MainKernel::Lanes(variant) => {
                let config = LaunchConfig {
                    grid,
                    block: (WARPS as u32 * lanes, 1, 1),
                    shared_mem_bytes: 0,
                };
                gpu.launch_variant(variant, &config, &args[..args.len() - 2])?;
            }
            MainKernel::Mma(variant) => {
                let config = LaunchConfig {
                    grid,
                    block: (variant.threads() as u32, 1, 1),
                    shared_mem_bytes: variant.smem_bytes() as u32,
                };
                gpu.launch_variant(variant, &config, &args)?;
            }
        }
        if plan.splits > 1 && !fused {
            let combine = CombineVariant {
                dtype: p.dtype,
                head_dim: width,
                used_dim: p.dim,
                batched: plan.batched_merge,
            };
            let args = [
                KernelArg::Ptr(part_o),
                KernelArg::Ptr(part_lse),
                KernelArg::Ptr(o.device_ptr().unwrap_or(0)),
                KernelArg::I64(i64_of(os[0])?),
                KernelArg::I64(i64_of(os[1])?),
                KernelArg::I64(i64_of(os[2])?),
                KernelArg::Ptr(lse.device_ptr().unwrap_or(0)),
                KernelArg::I64(i64_of(rows)?),
                KernelArg::I32(i32_of(p.hq, "query heads")?),
                KernelArg::I32(i32_of(p.nq, "query tokens")?),
                KernelArg::I32(i32_of(plan.splits, "splits")?),
            ];
            let blocks = rows.div_ceil(WARPS);
            let config = LaunchConfig::linear(
                u32::try_from(blocks).map_err(|_| Error::shape("too many rows"))?,
                WARPS as u32 * lanes,
                0,
            );
            gpu.launch_variant(&combine, &config, &args)?;
        }
        Ok(())
    };
    if ws_bytes > 0 {
        // Both kernels are queued while the workspace is ours: another thread's call cannot
        // reuse the partials between them.
        gpu.with_workspace(ws_bytes, &mut |address| {
            if fused {
                let groups = p.batch * grid_y;
                gpu.with_counters(groups * 4, &mut |counters| launch_both(address, counters))
            } else {
                launch_both(address, 0)
            }
        })?;
    } else {
        launch_both(0, 0)?;
    }
    if let Some(storage) = trace {
        let stamps = stamps::read(gpu, storage.as_ref())?;
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        if stamps::every_eighth(&CALLS) {
            eprintln!(
                "[decode b{} ctx{} {} splits {}] {}",
                p.batch,
                p.capacity,
                if paged { "paged" } else { "contiguous" },
                plan.splits,
                decode_trace::summary(&stamps)
            );
        }
    }
    Ok(())
}

/// The kernels a decode call of one query token per sequence over caches of `context`
/// tokens (`page_size`: paged, a block table of whole pages; else contiguous) takes on `arch`, through the launch's own
/// [`plan`]: the main kernel, then the combiner when the call splits (for `ops::plan`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn planned_kernels(
    arch: &Arch,
    dtype: DType,
    batch: usize,
    hq: usize,
    hkv: usize,
    dim: usize,
    context: usize,
    page_size: Option<usize>,
) -> Vec<(String, DecodeKernel)> {
    let capacity = page_size.map_or(context, |ps| context.div_ceil(ps) * ps);
    let p = Problem {
        dtype,
        batch,
        hq,
        hkv,
        nq: 1,
        dim,
        capacity,
        page_size: page_size.unwrap_or(capacity),
        num_pages: page_size.map_or(batch, |ps| batch * capacity.div_ceil(ps)),
        mask: calico_cpu::DecodeMask {
            scale: 1.0 / (dim as f32).sqrt(),
            causal: false,
            window: None,
            softcap: None,
        },
    };
    let plan = plan(arch, &p, page_size.is_some());
    let width = plan.kernel.width();
    let mut out = vec![match plan.kernel {
        MainKernel::Lanes(v) => (
            format!(
                "decode lanes {dtype} d{dim}, {} rows a block, unroll {}, pipe {}",
                v.rows, v.unroll, v.pipe
            ),
            DecodeKernel::Decode(v),
        ),
        MainKernel::Mma(v) => (
            format!(
                "decode mma {dtype} d{dim}, {} warps, {} stages{}",
                v.warps,
                v.stages,
                if v.fused { ", merges its splits" } else { "" }
            ),
            DecodeKernel::Mma(v),
        ),
    }];
    let fused = matches!(plan.kernel, MainKernel::Mma(v) if v.fused);
    if plan.splits > 1 && !fused {
        let v = CombineVariant {
            dtype,
            head_dim: width,
            used_dim: dim,
            batched: plan.batched_merge,
        };
        out.push((
            format!("decode combine {dtype} d{dim} ({} splits)", plan.splits),
            DecodeKernel::Combine(v),
        ));
    }
    out
}

/// Representative variants for `calico compile` and the offline compile checks.
pub(crate) fn catalog_variants(arch: &Arch) -> Vec<(String, DecodeKernel)> {
    let mut out: Vec<(String, DecodeKernel)> = Vec::new();
    // The last two: head dims 96 and 40 on the widths above them.
    for (dtype, head_dim, used_dim, rows, unroll, paged, pipe, min_blocks) in [
        (DType::BF16, 128, 128, 4, 4, true, true, 0),
        (DType::BF16, 128, 128, 4, 8, false, false, 2),
        (DType::F16, 64, 64, 1, 4, true, true, 3),
        (DType::BF16, 256, 256, 8, 2, true, true, 0),
        (DType::F16, 128, 128, 7, 2, false, false, 0),
        (DType::BF16, 128, 96, 4, 4, true, true, 0),
        (DType::F16, 64, 40, 4, 8, false, true, 0),
    ] {
        let v = DecodeVariant {
            dtype,
            head_dim,
            used_dim,
            rows,
            unroll,
            paged,
            pipe,
            min_blocks,
        };
        out.push((
            format!("{dtype} d{head_dim} used{used_dim} rows{rows} unroll{unroll} paged={paged} pipe={pipe} minblocks={min_blocks}"),
            DecodeKernel::Decode(v),
        ));
    }
    // spec: session 9's early copies with the one-batch merge (mbatch=32); the f16 d64 one also
    // with trace=1's stamps.
    for (dtype, head_dim, paged, warps, stages, fused, spec) in [
        (DType::BF16, 128, true, 4, 3, false, false),
        (DType::BF16, 128, false, 4, 4, false, false),
        (DType::F16, 64, true, 4, 3, false, false),
        (DType::BF16, 256, false, 4, 3, false, false),
        (DType::F16, 256, true, 2, 2, false, false),
        (DType::BF16, 128, true, 4, 3, true, false),
        (DType::F16, 256, false, 4, 3, true, false),
        (DType::BF16, 128, true, 4, 3, true, true),
        (DType::BF16, 128, false, 4, 3, true, true),
        (DType::F16, 64, true, 4, 3, true, true),
        (DType::BF16, 128, true, 8, 3, true, true),
    ] {
        if !decode_mma::runs_here(arch, dtype, None) {
            break;
        }
        if let Some(mut v) = DecodeMmaVariant::fitting(arch, dtype, head_dim, paged, warps, stages)
        {
            if spec {
                (v.fused, v.early, v.spec, v.merge_batch) = (true, true, true, 32);
                v.trace = head_dim == 64;
                v.lean_count = !paged;
                v.merge_early = !paged || warps == 8;
            } else if fused {
                // The fused merge and early start (the defaults) with the L2 prefetch knob.
                (v.fused, v.early, v.l2_ahead) = (true, true, if paged { 2 } else { 4 });
            }
            out.push((
                format!(
                    "mma {dtype} d{head_dim} paged={paged} warps={warps} stages={} fused={fused} early={} l2_ahead={} spec={spec} mbatch={} trace={} lean={} mpipe={}",
                    v.stages, v.early, v.l2_ahead, v.merge_batch, v.trace, v.lean_count, v.merge_early
                ),
                DecodeKernel::Mma(v),
            ));
        }
    }
    // The default form (8 warps, fused merge) at head dim 96 on width 128.
    if decode_mma::runs_here(arch, DType::BF16, None) {
        if let Some(mut v) = DecodeMmaVariant::fitting(arch, DType::BF16, 128, true, 8, 3) {
            (v.fused, v.early, v.spec, v.merge_batch) = (true, true, true, 32);
            (v.used_dim, v.merge_early) = (96, true);
            out.push((
                "mma bf16 d128 used96 paged=true warps=8 stages=3 fused=true spec=true mpipe=true"
                    .to_string(),
                DecodeKernel::Mma(v),
            ));
        }
    }
    for (dtype, head_dim, used_dim, batched) in [
        (DType::BF16, 128, 128, false),
        (DType::F16, 64, 64, false),
        (DType::BF16, 256, 256, false),
        (DType::BF16, 128, 128, true),
        (DType::F16, 64, 64, true),
        (DType::BF16, 256, 256, true),
        (DType::BF16, 128, 96, false),
        (DType::BF16, 128, 96, true),
    ] {
        out.push((
            format!("combine {dtype} d{head_dim} used{used_dim} batched={batched}"),
            DecodeKernel::Combine(CombineVariant {
                dtype,
                head_dim,
                used_dim,
                batched,
            }),
        ));
    }
    out
}

/// One of the two decode kernels, for the catalog.
#[derive(Debug, Clone, Copy)]
pub(crate) enum DecodeKernel {
    Decode(DecodeVariant),
    Mma(DecodeMmaVariant),
    Combine(CombineVariant),
}

impl DecodeKernel {
    pub(crate) fn source(&self, vendor: HeaderSet) -> Result<KernelSource> {
        match self {
            DecodeKernel::Decode(v) => v.source(vendor),
            DecodeKernel::Mma(v) => v.source(vendor),
            DecodeKernel::Combine(v) => v.source(vendor),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(batch: usize, hq: usize, hkv: usize, nq: usize, capacity: usize) -> Problem {
        Problem {
            dtype: DType::BF16,
            batch,
            hq,
            hkv,
            nq,
            dim: 128,
            capacity,
            page_size: 16,
            num_pages: 1,
            mask: calico_cpu::DecodeMask {
                scale: 1.0,
                causal: false,
                window: None,
                softcap: None,
            },
        }
    }

    fn lanes(plan: &Plan) -> DecodeVariant {
        match plan.kernel {
            MainKernel::Lanes(v) => v,
            MainKernel::Mma(_) => panic!("expected the lane kernel, got {plan:?}"),
        }
    }

    #[test]
    fn lane_plan_splits_long_contexts_and_groups_rows() {
        let h100 = Arch::for_target("sm_90a").unwrap();
        let tune = Tune {
            kernel: 1,
            ..DEFAULT_TUNE
        };
        let one = plan_with(&h100, &problem(1, 32, 8, 1, 8192), true, tune);
        assert_eq!((one.row_groups, lanes(&one).rows), (1, 4));
        assert_eq!(lanes(&one).unroll, DEFAULT_TUNE.unroll);
        assert!(one.splits > 1 && one.splits * one.split_tokens >= 8192);
        assert_eq!(one.split_tokens % lanes(&one).tile_tokens(32), 0);
        let big = plan_with(&h100, &problem(64, 32, 8, 1, 8192), false, tune);
        assert!(big.splits <= 2);
        let wide = plan_with(&h100, &problem(2, 32, 8, 16, 100), true, tune);
        assert_eq!((wide.row_groups, lanes(&wide).rows), (8, 8));
        let odd = plan_with(&h100, &problem(1, 7, 1, 2, 1), true, tune);
        assert_eq!((odd.row_groups, lanes(&odd).rows, odd.splits), (2, 7, 1));
    }

    #[test]
    fn tensor_cores_where_they_run() {
        let h100 = Arch::for_target("sm_90a").unwrap();
        let one = plan_with(&h100, &problem(1, 32, 8, 1, 8192), true, DEFAULT_TUNE);
        assert!(matches!(one.kernel, MainKernel::Mma(v) if v.paged && v.stages == 3));
        assert_eq!(one.row_groups, 1);
        assert!(one.splits * one.split_tokens >= 8192);
        assert_eq!(one.split_tokens % decode_mma::TILE_TOKENS, 0);
        // 16 query tokens x GQA 4: 64 rows in 4 groups of 16.
        let wide = plan_with(&h100, &problem(2, 32, 8, 16, 100), false, DEFAULT_TUNE);
        assert_eq!(wide.row_groups, 4);
        // Pages of 8 tokens do not hold whole tiles; AMD has no mma.sync.
        let mut small_pages = problem(1, 32, 8, 1, 8192);
        small_pages.page_size = 8;
        lanes(&plan_with(&h100, &small_pages, true, DEFAULT_TUNE));
        let mi300 = Arch::for_target("gfx942").unwrap();
        lanes(&plan_with(
            &mi300,
            &problem(1, 32, 8, 1, 8192),
            true,
            DEFAULT_TUNE,
        ));
    }

    #[test]
    fn fused_merge_only_where_a_call_splits() {
        let h100 = Arch::for_target("sm_90a").unwrap();
        let tune = Tune {
            fuse: true,
            ..DEFAULT_TUNE
        };
        let fused = |plan: &Plan| matches!(plan.kernel, MainKernel::Mma(v) if v.fused);
        let one = plan_with(&h100, &problem(1, 32, 8, 1, 8192), true, tune);
        assert!(one.splits > 1 && fused(&one));
        let big = plan_with(&h100, &problem(64, 32, 8, 1, 8192), true, tune);
        assert!(big.splits == 1 && !fused(&big));
        let unfused = Tune {
            fuse: false,
            ..DEFAULT_TUNE
        };
        let two = plan_with(&h100, &problem(1, 32, 8, 1, 8192), true, unfused);
        assert!(!fused(&two));
        let default = plan_with(&h100, &problem(1, 32, 8, 1, 8192), true, DEFAULT_TUNE);
        assert!(fused(&default));
        // The combiner is planned only without the fused merge.
        let kernels =
            |arch: &Arch| planned_kernels(arch, DType::BF16, 1, 32, 8, 128, 8192, Some(16)).len();
        assert_eq!(kernels(&h100), if super::tune().fuse { 1 } else { 2 });
    }

    #[test]
    fn tune_overrides_known_keys_only() {
        let t = parse_tune("pipe=0, unroll=8,minblocks=2,bogus=1,unroll=3,min_split=x,kernel=1");
        assert_eq!((t.pipe, t.unroll, t.min_blocks, t.kernel), (false, 8, 2, 1));
        let t = parse_tune("kernel=3,stages=4,warps=3,splits_x=2,fuse=0,early=0");
        assert_eq!(
            (t.kernel, t.stages, t.warps, t.splits_x),
            (2, 4, DEFAULT_TUNE.warps, 2)
        );
        assert!(!t.fuse && DEFAULT_TUNE.fuse && !t.early && DEFAULT_TUNE.early);
        assert_eq!(t.min_split, DEFAULT_TUNE.min_split);
        assert_eq!(parse_tune(""), DEFAULT_TUNE);
        let t = parse_tune("spec=1,mbatch=32,max_splits=32,lean=1,trace=1");
        assert_eq!((t.spec, t.merge_batch, t.max_splits), (true, 32, 32));
        assert!(t.lean_count && t.trace && DEFAULT_TUNE.lean_count && !DEFAULT_TUNE.trace);
        let off = parse_tune("warps=4,spec=0,lean=0,mpipe=0");
        assert!(!off.spec && !off.lean_count && !off.merge_early && off.warps == 4);
        let on = parse_tune("");
        assert!(on.spec && on.lean_count && on.merge_early && on.warps == 8);
        let t = parse_tune("mbatch=12,max_splits=0");
        assert_eq!((t.merge_batch, t.max_splits), (0, MAX_SPLITS));
    }

    #[test]
    fn session_9_knobs_reach_the_variant_and_the_split_count() {
        let h100 = Arch::for_target("sm_90a").unwrap();
        let mma = |plan: &Plan| match plan.kernel {
            MainKernel::Mma(v) => v,
            MainKernel::Lanes(_) => panic!("the lane kernel was planned"),
        };
        let tune = Tune {
            early: false,
            ..parse_tune("warps=4,spec=1,mbatch=32,max_splits=32")
        };
        // b1 32k, 4 warps: 33 splits fill the 264 slots; the cap keeps 32 (one merge batch).
        let capped = plan_with(&h100, &problem(1, 32, 8, 1, 32768), true, tune);
        assert_eq!((capped.splits, capped.split_tokens), (32, 1024));
        let four = parse_tune("warps=4,spec=0");
        let uncapped = plan_with(&h100, &problem(1, 32, 8, 1, 32768), true, four);
        assert_eq!(uncapped.splits, 33);
        let v = mma(&capped);
        // SPEC needs EARLY's page batches: spec turns it on.
        assert!(v.spec && v.early && v.fused && v.merge_batch == 32);
        // No split, no merge: the merge batch stays at its default.
        let big = mma(&plan_with(&h100, &problem(64, 32, 8, 1, 8192), true, tune));
        assert!(!big.fused && big.merge_batch == 0);
        assert!(!mma(&uncapped).spec);
        // warps=8: 1 block per SM at head_dim 128 (16 splits at b1 8k); at 256 the rings of
        // 8 warps do not fit, so 4 warps, not the lane kernel.
        let eight = parse_tune("warps=8");
        let b1 = plan_with(&h100, &problem(1, 32, 8, 1, 8192), true, eight);
        assert_eq!((mma(&b1).warps, b1.splits), (8, 16));
        let mut wide = problem(1, 32, 8, 1, 8192);
        wide.dim = 256;
        assert_eq!(mma(&plan_with(&h100, &wide, true, eight)).warps, 4);
    }

    #[test]
    fn long_splits_that_leave_sms_idle_take_blocks_of_fewer_warps() {
        let h100 = Arch::for_target("sm_90a").unwrap();
        let warps_and_splits = |batch, context, tune: Tune| {
            let plan = plan_with(&h100, &problem(batch, 32, 8, 1, context), true, tune);
            match plan.kernel {
                MainKernel::Mma(v) => (v.warps, plan.splits),
                MainKernel::Lanes(_) => panic!("the lane kernel was planned"),
            }
        };
        let auto = DEFAULT_TUNE;
        // b1 128k: 33 splits of 8 warps are two waves on 132 SMs -> 33 splits of 4 warps, one
        // wave of two blocks on every SM.
        assert_eq!(warps_and_splits(1, 131072, parse_tune("warps=8")), (8, 33));
        assert_eq!(warps_and_splits(1, 131072, auto), (4, 33));
        // Shorter caches keep 8 warps (b1 32k: 16 splits on 128 SMs, the merge of 33 splits
        // costs more there), and so do plans without splits (b16 128k: 128 blocks, no merge).
        assert_eq!(warps_and_splits(1, 32768, auto), (8, 16));
        assert_eq!(warps_and_splits(16, 131072, auto), (8, 1));
        let never = parse_tune(&format!("long_context={}", usize::MAX));
        assert_eq!(warps_and_splits(1, 131072, never), (8, 33));
    }
}
