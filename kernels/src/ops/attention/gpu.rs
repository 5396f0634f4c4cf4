//! GPU launches of the attention kernels (kernels/device/attention/).
//!
//! sm_90a runs the Hopper kernels (hopper.rs, hopper_bwd.rs). The other NVIDIA GPUs with
//! mma.sync and cp.async (sm_80 and later) run the tile kernels here, and CDNA GPUs run the
//! CDNA forward (cdna.rs) where it applies; all of these take head dims that are multiples
//! of 8 at the next width of 64, 128 or 256 (the tile backward up to 128; the Hopper backward
//! up to 256). A forward whose head dim is a multiple of 16 that only a padded vendor kernel
//! would take runs the vendor-neutral tile forward (tiles.rs) instead; every other case (the
//! backward on AMD, the backward above 128 off sm_90a or where the Hopper kernels decline it,
//! head dims off multiples of 8) runs the portable kernels, one warp per row.

use super::check::Problem;
use crate::Device;
use calico_core::{
    Arch, AsyncCopy, DType, Error, GpuBackend, HeaderSet, KernelArg, KernelSource, KernelVariant,
    LaunchConfig, MmaKind, Result, Tensor, Vendor,
};
use calico_cpu::AttentionParams;

const FORWARD: &str = include_str!("../../../device/attention/forward.cu");
const BACKWARD: &str = include_str!("../../../device/attention/backward.cu");
const PORTABLE: &str = include_str!("../../../device/attention/portable.cu");
pub(super) const HEADERS: HeaderSet = &[(
    "attention/common.cuh",
    include_str!("../../../device/attention/common.cuh"),
)];
/// Query rows per block: tile kernels 64 (4 warps of 16), portable kernels 4 (a warp each).
const TILE_ROWS: usize = 64;
const PORTABLE_ROWS: usize = 4;
const TILE_THREADS: u32 = 128;
const MAX_GRID_YZ: usize = 65_535;

/// Which kernel of the attention sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kernel {
    /// The tile forward; `aligned`: K and V rows are 16-byte aligned (cp.async).
    Forward {
        aligned: bool,
    },
    /// The tile backward: dQ per query block, dK and dV per key block.
    BackwardDq {
        aligned: bool,
    },
    BackwardDkDv {
        aligned: bool,
    },
    PortableForward,
    PortableDq,
    PortableDkDv,
}

/// One compiled form of an attention kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct AttentionVariant {
    pub kernel: Kernel,
    pub dtype: DType,
    /// The kernel's head dim (the tile kernels' 64, 128 or 256, the portable kernels' any).
    pub head_dim: usize,
    /// The problem's head dim, at most `head_dim`: the tile kernels read zeros past it and
    /// write only its columns.
    pub used_dim: usize,
}

impl AttentionVariant {
    /// Keys per block of the tile forward: 32 at head dim 256 keeps the registers in budget.
    fn keys_per_block(&self) -> usize {
        if self.head_dim > 128 {
            32
        } else {
            64
        }
    }

    /// Dynamic shared memory: the tile forward double-buffers K and V; the backward kernels
    /// hold one block of each of their two streamed operands, double-buffered.
    pub(crate) fn smem_bytes(&self) -> u32 {
        let tile = |rows: usize| rows * self.head_dim * 2;
        let bytes = match self.kernel {
            Kernel::Forward { .. } => 4 * tile(self.keys_per_block()) + 1024,
            Kernel::BackwardDq { .. } | Kernel::BackwardDkDv { .. } => {
                4 * tile(backward_block(self.head_dim)) + 1024
            }
            _ => 0,
        };
        bytes as u32
    }

    pub(crate) fn label(&self) -> String {
        if self.used_dim == self.head_dim {
            format!("{:?} {} d{}", self.kernel, self.dtype, self.head_dim)
        } else {
            format!(
                "{:?} {} d{} used{}",
                self.kernel, self.dtype, self.head_dim, self.used_dim
            )
        }
    }
}

/// Rows of the streamed blocks of the backward kernels.
fn backward_block(head_dim: usize) -> usize {
    if head_dim > 64 {
        32
    } else {
        64
    }
}

impl KernelVariant for AttentionVariant {
    fn source(&self, vendor: HeaderSet) -> Result<KernelSource> {
        let (entry, text, aligned) = match self.kernel {
            Kernel::Forward { aligned } => ("calico_attention_fwd", FORWARD, aligned),
            Kernel::BackwardDq { aligned } => ("calico_attention_bwd_dq", BACKWARD, aligned),
            Kernel::BackwardDkDv { aligned } => ("calico_attention_bwd_dkdv", BACKWARD, aligned),
            Kernel::PortableForward => ("calico_attention_fwd_portable", PORTABLE, false),
            Kernel::PortableDq => ("calico_attention_bwd_dq_portable", PORTABLE, false),
            Kernel::PortableDkDv => ("calico_attention_bwd_dkdv_portable", PORTABLE, false),
        };
        let defines = [
            ("ELEM", self.dtype.device_type().to_string()),
            ("HEAD_DIM", self.head_dim.to_string()),
            ("HEAD_DIM_USED", self.used_dim.to_string()),
            ("BN", self.keys_per_block().to_string()),
            ("BWD_BLOCK", backward_block(self.head_dim).to_string()),
            ("ALIGNED", u8::from(aligned).to_string()),
        ];
        let sets = [vendor, calico_core::device_headers(), HEADERS];
        KernelSource::assemble(entry, text, &sets, &defines)
    }
}

/// The head dim the tile kernels run `head_dim` at here (NVIDIA with mma.sync and cp.async):
/// 64, 128 or 256 (backward 64 or 128: backward.cu's tiles stop at 128, even on sm_90a, whose
/// Hopper backward takes 256), the next one up for a multiple of 8 in between (its
/// columns past the real ones load as zeros and are not stored); `None` where they do not run.
fn tile_kernel_dim(arch: &Arch, dtype: DType, head_dim: usize, backward: bool) -> Option<usize> {
    let widest = if backward { 128 } else { 256 };
    let runs = arch.vendor == Vendor::Nvidia
        && arch.has_mma(MmaKind::MmaSync, dtype)
        && arch.has_async_copy(AsyncCopy::CpAsync);
    runs.then(|| super::check::kernel_head_dim(head_dim, widest))
        .flatten()
}

/// A variant that runs the problem's head dim as it is (the portable kernels at any head dim,
/// the tile kernels at their own widths).
fn unpadded(kernel: Kernel, dtype: DType, head_dim: usize) -> AttentionVariant {
    AttentionVariant {
        kernel,
        dtype,
        head_dim,
        used_dim: head_dim,
    }
}

/// Element strides (batch, head, position) of an operand: `[B, H, N, D]` or packed `[T, H, D]`.
pub(super) fn strides(t: &Tensor) -> [usize; 3] {
    let s = t.strides();
    if s.len() == 4 {
        [s[0], s[1], s[2]]
    } else {
        [0, s[1], s[0]]
    }
}

pub(super) fn ptr(t: &Tensor) -> u64 {
    t.device_ptr().unwrap_or(0)
}

pub(super) fn operand(t: &Tensor) -> [KernelArg; 4] {
    let [sb, sh, sn] = strides(t);
    [
        KernelArg::Ptr(ptr(t)),
        KernelArg::I64(sb as i64),
        KernelArg::I64(sh as i64),
        KernelArg::I64(sn as i64),
    ]
}

/// Rows of `t` start on 16-byte boundaries (cp.async moves 16 bytes).
pub(super) fn rows_aligned(t: &Tensor) -> bool {
    ptr(t).is_multiple_of(16) && strides(t).iter().all(|s| s % 8 == 0)
}

pub(super) fn params_args(p: &Problem, params: &AttentionParams) -> [KernelArg; 9] {
    let side = |s: Option<usize>| s.map_or(-1, |v| v as i64);
    [
        KernelArg::I64(p.batch as i64),
        KernelArg::I64(p.q_heads as i64),
        KernelArg::I64(p.kv_heads as i64),
        KernelArg::I64(p.q_len as i64),
        KernelArg::I64(p.k_len as i64),
        KernelArg::F32(params.scale),
        KernelArg::F32(params.softcap.unwrap_or(0.0)),
        KernelArg::I64(side(params.left)),
        KernelArg::I64(side(params.right)),
    ]
}

/// LSE strides (batch, head): `[B, Hq, Nq]`, or `[Hq, total_q]` when packed.
pub(super) fn lse_strides(p: &Problem, packed: bool) -> [KernelArg; 2] {
    if packed {
        [KernelArg::I64(0), KernelArg::I64(p.q_len as i64)]
    } else {
        [
            KernelArg::I64((p.q_heads * p.q_len) as i64),
            KernelArg::I64(p.q_len as i64),
        ]
    }
}

pub(super) fn offsets_args(varlen: Option<[&Tensor; 2]>) -> [KernelArg; 2] {
    match varlen {
        Some([cq, ck]) => [KernelArg::Ptr(ptr(cq)), KernelArg::Ptr(ptr(ck))],
        None => [KernelArg::Ptr(0), KernelArg::Ptr(0)],
    }
}

/// A kernel's arguments in a fixed buffer: launches allocate nothing.
#[derive(Clone, Copy)]
pub(super) struct ArgList {
    buf: [KernelArg; 48],
    len: usize,
}

impl ArgList {
    pub(super) fn new() -> Self {
        ArgList {
            buf: [KernelArg::I64(0); 48],
            len: 0,
        }
    }

    /// Appends `args` (the lists here are at most 43 long; more is a bug, not user input).
    pub(super) fn extend(&mut self, args: impl IntoIterator<Item = KernelArg>) {
        for a in args {
            if let Some(slot) = self.buf.get_mut(self.len) {
                *slot = a;
                self.len += 1;
            }
        }
    }

    pub(super) fn push(&mut self, a: KernelArg) {
        self.extend([a]);
    }

    pub(super) fn as_slice(&self) -> &[KernelArg] {
        &self.buf[..self.len]
    }
}

/// The argument list every forward kernel but Hopper's takes (the sm_80 tile, portable, CDNA
/// and vendor-neutral tile kernels): Q, K, V, O with their strides, the LSE and its strides,
/// the varlen offsets, then the problem and mask parameters.
pub(super) fn forward_args(
    p: &Problem,
    params: &AttentionParams,
    [q, k, v, o, lse]: [&Tensor; 5],
    varlen: Option<[&Tensor; 2]>,
) -> ArgList {
    let mut args = ArgList::new();
    for t in [q, k, v, o] {
        args.extend(operand(t));
    }
    args.push(KernelArg::Ptr(ptr(lse)));
    args.extend(lse_strides(p, varlen.is_some()));
    args.extend(offsets_args(varlen));
    args.extend(params_args(p, params));
    args
}

pub(super) fn launcher(dev: &Device) -> Result<&dyn GpuBackend> {
    dev.as_gpu()
        .ok_or_else(|| Error::unsupported("device has no kernel launcher"))
}

/// A grid of `rows`-row blocks over the longest sequence, `heads`, and the batch.
pub(super) fn grid(
    len: usize,
    rows: usize,
    heads: usize,
    batch: usize,
    threads: u32,
    smem: u32,
) -> Result<LaunchConfig> {
    let blocks = len.div_ceil(rows).max(1);
    if heads > MAX_GRID_YZ || batch > MAX_GRID_YZ || blocks > i32::MAX as usize {
        return Err(Error::unsupported(format!(
            "attention grid of {blocks} x {heads} heads x {batch} sequences exceeds the launch limits"
        )));
    }
    Ok(LaunchConfig {
        grid: (blocks as u32, heads as u32, batch as u32),
        block: (threads, 1, 1),
        shared_mem_bytes: smem,
    })
}

fn portable_threads(dev: &Device) -> u32 {
    PORTABLE_ROWS as u32 * dev.arch().lanes.max(1)
}

/// Launches the forward kernel on `[q, k, v, o, lse]`; `varlen` holds the offsets tensors.
pub(crate) fn forward(
    dev: &Device,
    p: &Problem,
    params: &AttentionParams,
    [q, k, v, o, lse]: [&Tensor; 5],
    varlen: Option<[&Tensor; 2]>,
) -> Result<()> {
    let arch = dev.arch();
    let tensors = [q, k, v, o, lse];
    let facts = ForwardFacts::of(p, k, v, varlen.is_some());
    let route = match route_forward(arch, p, params, &facts) {
        ForwardRoute::Hopper(variant) => {
            match super::hopper::try_forward(dev, p, params, variant, tensors, varlen) {
                Some(done) => return done,
                None => {
                    let facts = ForwardFacts {
                        tma_views: false,
                        ..facts
                    };
                    route_forward(arch, p, params, &facts)
                }
            }
        }
        route => route,
    };
    let variant = match route {
        ForwardRoute::Cdna(variant) => {
            return super::cdna::launch_forward(dev, p, params, variant, tensors, varlen)
        }
        ForwardRoute::Tiles(variant) => {
            return super::tiles::launch_forward(dev, p, params, variant, tensors, varlen)
        }
        ForwardRoute::Tile(variant) => variant,
        ForwardRoute::Hopper(_) => {
            return Err(Error::unsupported(
                "the Hopper forward was routed without TMA views",
            ))
        }
    };
    let kernel = variant.kernel;
    let gpu = launcher(dev)?;
    let config = match kernel {
        Kernel::PortableForward => grid(
            p.q_len,
            PORTABLE_ROWS,
            p.q_heads,
            p.batch,
            portable_threads(dev),
            0,
        )?,
        _ => grid(
            p.q_len,
            TILE_ROWS,
            p.q_heads,
            p.batch,
            TILE_THREADS,
            variant.smem_bytes(),
        )?,
    };
    let args = forward_args(p, params, tensors, varlen);
    gpu.launch_variant(&variant, &config, args.as_slice())
}

/// Launches the backward kernels on `[q, k, v, o, lse, d_o, dq, dk, dv]`: the Hopper kernels
/// where they apply (not in deterministic mode), else dQ, then dK and dV on the tile (or
/// portable) kernels, where each output element is written by one warp from sums in a fixed
/// order, so those runs are deterministic.
pub(crate) fn backward(
    dev: &Device,
    p: &Problem,
    params: &AttentionParams,
    deterministic: bool,
    tensors: [&Tensor; 9],
    varlen: Option<[&Tensor; 2]>,
) -> Result<()> {
    let [q, k, v, o, lse, d_o, dq, dk, dv] = tensors;
    let arch = dev.arch();
    let facts = BackwardFacts::of([q, k, v, o, d_o], deterministic, varlen.is_some());
    let route = match route_backward(arch, p, params, &facts) {
        BackwardRoute::Hopper(main) => {
            match super::hopper_bwd::try_backward(dev, p, params, main, tensors, varlen) {
                Some(done) => return done,
                None => {
                    let facts = BackwardFacts {
                        tma_views: false,
                        ..facts
                    };
                    route_backward(arch, p, params, &facts)
                }
            }
        }
        route => route,
    };
    let BackwardRoute::Tile {
        dq: dq_variant,
        dkdv: dkdv_variant,
    } = route
    else {
        return Err(Error::unsupported(
            "the Hopper backward was routed without TMA views",
        ));
    };
    let dq_kernel = dq_variant.kernel;
    let tile = !matches!(dq_kernel, Kernel::PortableDq);
    let gpu = launcher(dev)?;
    let mut common = ArgList::new();
    for t in [q, k, v, o, d_o] {
        common.extend(operand(t));
    }
    common.push(KernelArg::Ptr(ptr(lse)));
    common.extend(lse_strides(p, varlen.is_some()));
    let mut tail = ArgList::new();
    tail.extend(offsets_args(varlen));
    tail.extend(params_args(p, params));
    let config = |variant: AttentionVariant, len: usize, heads: usize| {
        let c = if tile {
            grid(
                len,
                TILE_ROWS,
                heads,
                p.batch,
                TILE_THREADS,
                variant.smem_bytes(),
            )
        } else {
            grid(len, PORTABLE_ROWS, heads, p.batch, portable_threads(dev), 0)
        };
        c.map(|c| (variant, c))
    };
    let dq_launch = config(dq_variant, p.q_len, p.q_heads)?;
    let dkdv_launch = config(dkdv_variant, p.k_len, p.kv_heads)?;
    // The tile kernels pass delta = rowsum(dO * O) from the dQ kernel to the dK/dV kernel
    // through the workspace (laid out as the LSE); the portable ones recompute it.
    let run = |delta: Option<u64>| -> Result<()> {
        let delta_arg = delta.map(KernelArg::Ptr);
        if q.numel() > 0 {
            let mut args = common;
            args.extend(delta_arg);
            args.extend(operand(dq));
            args.extend(tail.as_slice().iter().copied());
            gpu.launch_variant(&dq_launch.0, &dq_launch.1, args.as_slice())?;
        }
        if k.numel() > 0 {
            let mut args = common;
            args.extend(delta_arg);
            args.extend(operand(dk));
            args.extend(operand(dv));
            args.extend(tail.as_slice().iter().copied());
            gpu.launch_variant(&dkdv_launch.0, &dkdv_launch.1, args.as_slice())?;
        }
        Ok(())
    };
    if tile {
        gpu.with_workspace(lse.numel().max(1) * 4, &mut |addr| run(Some(addr)))
    } else {
        run(None)
    }
}

/// What the forward router needs to know of the operands besides the problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ForwardFacts {
    pub varlen: bool,
    /// K and V rows 16-byte aligned (the tile kernel's cp.async).
    pub kv_rows_aligned: bool,
    /// K and V as the CDNA kernel reads them (`cdna::operands_ok`).
    pub cdna_operands: bool,
    /// Q, K and V can be TMA views (false once `view_map` declined them).
    pub tma_views: bool,
}

impl ForwardFacts {
    /// The facts of a call's K and V (the launch's; `ops::plan` tests compare them). TMA
    /// views are presumed until `view_map` declines them.
    pub(crate) fn of(p: &Problem, k: &Tensor, v: &Tensor, varlen: bool) -> Self {
        ForwardFacts {
            varlen,
            kv_rows_aligned: rows_aligned(k) && rows_aligned(v),
            cdna_operands: super::cdna::operands_ok(k, v, p.head_dim),
            tma_views: true,
        }
    }
}

/// The kernel a forward takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ForwardRoute {
    Hopper(super::hopper::HopperFwdVariant),
    Cdna(super::cdna::CdnaFwdVariant),
    /// The vendor-neutral tile forward (tiles.cu), on both vendors.
    Tiles(super::tiles::TilesFwdVariant),
    /// The sm_80 tile forward (forward.cu) or the portable one.
    Tile(AttentionVariant),
}

/// The forward router (shared by the launch and `ops::plan`): the Hopper kernel, then the
/// CDNA kernel, where they apply; else the sm_80 tile kernel on NVIDIA sm_80+ (head dims 64,
/// 128, 256); else the vendor-neutral tile kernel (head dims that are multiples of 16), else
/// the portable. `CALICO_ATTN_FORWARD=tiles` puts the vendor-neutral kernel first,
/// `CALICO_ATTN_FORWARD=portable` sends everything to the portable kernel (A/B runs).
pub(crate) fn route_forward(
    arch: &Arch,
    p: &Problem,
    params: &AttentionParams,
    f: &ForwardFacts,
) -> ForwardRoute {
    if super::tiles::portable_forced() {
        return ForwardRoute::Tile(unpadded(Kernel::PortableForward, p.dtype, p.head_dim));
    }
    route_forward_with(arch, p, params, f, super::tiles::forced())
}

/// [`route_forward`] with the `CALICO_ATTN_FORWARD=tiles` switch passed in (tests).
pub(crate) fn route_forward_with(
    arch: &Arch,
    p: &Problem,
    params: &AttentionParams,
    f: &ForwardFacts,
    tiles_first: bool,
) -> ForwardRoute {
    let tiles = super::tiles::forward_variant(arch, p);
    if let (true, Some(v)) = (tiles_first, tiles) {
        return ForwardRoute::Tiles(v);
    }
    if f.tma_views {
        if let Some(v) = super::hopper::forward_variant(arch, p, params, f.varlen) {
            return ForwardRoute::Hopper(v);
        }
    }
    // A vendor kernel padded to a wider head dim only where the vendor-neutral kernel, which
    // runs the head dim at its own width, declines it.
    let takes = |width: usize| width == p.head_dim || tiles.is_none();
    if f.cdna_operands {
        if let Some(v) = super::cdna::forward_variant(arch, p).filter(|v| takes(v.head_dim)) {
            return ForwardRoute::Cdna(v);
        }
    }
    if let Some(width) = tile_kernel_dim(arch, p.dtype, p.head_dim, false).filter(|&w| takes(w)) {
        return ForwardRoute::Tile(AttentionVariant {
            kernel: Kernel::Forward {
                aligned: f.kv_rows_aligned,
            },
            dtype: p.dtype,
            head_dim: width,
            used_dim: p.head_dim,
        });
    }
    if let Some(v) = tiles {
        return ForwardRoute::Tiles(v);
    }
    ForwardRoute::Tile(unpadded(Kernel::PortableForward, p.dtype, p.head_dim))
}

/// What the backward router needs to know besides the problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BackwardFacts {
    pub varlen: bool,
    pub deterministic: bool,
    /// Q, K, V, O and dO rows 16-byte aligned.
    pub rows_aligned: bool,
    /// Q, K, V and dO can be TMA views (false once `view_map` declined them).
    pub tma_views: bool,
}

impl BackwardFacts {
    /// The facts of a call's Q, K, V, O and dO (the launch's; `ops::plan` tests compare them).
    pub(crate) fn of(operands: [&Tensor; 5], deterministic: bool, varlen: bool) -> Self {
        BackwardFacts {
            varlen,
            deterministic,
            rows_aligned: operands.iter().all(|t| rows_aligned(t)),
            tma_views: true,
        }
    }
}

/// The kernels a backward takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BackwardRoute {
    /// The Hopper kernels (prepare, this main kernel, finish).
    Hopper(super::hopper_bwd::HopperBwdVariant),
    /// dQ, then dK and dV, on the tile kernels or the portable ones.
    Tile {
        dq: AttentionVariant,
        dkdv: AttentionVariant,
    },
}

/// The backward router (shared by the launch and `ops::plan`).
pub(crate) fn route_backward(
    arch: &Arch,
    p: &Problem,
    params: &AttentionParams,
    f: &BackwardFacts,
) -> BackwardRoute {
    if f.tma_views {
        let main = super::hopper_bwd::backward_variant(arch, p, params, f.deterministic, f.varlen);
        if let Some(main) = main {
            return BackwardRoute::Hopper(main);
        }
    }
    let aligned = f.rows_aligned;
    let (dq, dkdv, width) = match tile_kernel_dim(arch, p.dtype, p.head_dim, true) {
        Some(width) => (
            Kernel::BackwardDq { aligned },
            Kernel::BackwardDkDv { aligned },
            width,
        ),
        None => (Kernel::PortableDq, Kernel::PortableDkDv, p.head_dim),
    };
    let variant = |kernel| AttentionVariant {
        kernel,
        dtype: p.dtype,
        head_dim: width,
        used_dim: p.head_dim,
    };
    BackwardRoute::Tile {
        dq: variant(dq),
        dkdv: variant(dkdv),
    }
}

/// Every attention variant, for the catalog (compiled for each target in CI).
pub(crate) fn catalog(arch: &Arch, vendor: HeaderSet) -> Result<Vec<(String, KernelSource)>> {
    let mut out = Vec::new();
    for dtype in [DType::BF16, DType::F16] {
        for head_dim in [64, 128, 256] {
            let mut kernels = vec![
                Kernel::PortableForward,
                Kernel::PortableDq,
                Kernel::PortableDkDv,
            ];
            for aligned in [true, false] {
                if tile_kernel_dim(arch, dtype, head_dim, false).is_some() {
                    kernels.push(Kernel::Forward { aligned });
                }
                if tile_kernel_dim(arch, dtype, head_dim, true).is_some() {
                    kernels.push(Kernel::BackwardDq { aligned });
                    kernels.push(Kernel::BackwardDkDv { aligned });
                }
            }
            for kernel in kernels {
                let v = unpadded(kernel, dtype, head_dim);
                out.push((v.label(), v.source(vendor)?));
            }
            // The tile kernels at a head dim below their width (96 on 128, 40 on 64).
            let used = head_dim - if head_dim == 64 { 24 } else { 32 };
            if dtype == DType::BF16 && head_dim <= 128 {
                for kernel in [
                    Kernel::Forward { aligned: false },
                    Kernel::BackwardDq { aligned: true },
                    Kernel::BackwardDkDv { aligned: false },
                ] {
                    if tile_kernel_dim(arch, dtype, used, true).is_some() {
                        let v = AttentionVariant {
                            used_dim: used,
                            ..unpadded(kernel, dtype, head_dim)
                        };
                        out.push((v.label(), v.source(vendor)?));
                    }
                }
            }
        }
    }
    Ok(out)
}
