//! The Hopper GEMM (sm_90a): TMA + wgmma, warp-specialised and persistent
//! (`kernels/device/gemm/hopper.cu` explains the kernel). This module decides when it applies,
//! picks the tile shape, encodes the tensor maps and launches it.

use super::{GemmProblem, MatrixArg};
use calico_core::{
    Arch, AsyncCopy, DType, Error, GpuBackend, KernelArg, KernelSource, LaunchConfig, MmaKind,
    OpaqueParam128, Result,
};
use calico_cuda::tma::{Swizzle, TiledMap};

const SOURCE: &str = include_str!("../../device/gemm/hopper.cu");
const ENTRY: &str = "calico_gemm_hopper";
/// One producer and two consumer warpgroups.
const THREADS: u32 = 384;
/// K per pipeline stage: one 128-byte swizzled row of 16-bit elements.
const BK: usize = 64;
/// Columns per N-major TMA box (128 bytes of 16-bit elements).
const N_CHUNK: usize = 64;
const MAX_STAGES: usize = 8;
/// Row tiles that sweep all column tiles together (L2 reuse of A rows and B columns).
const GROUP_M: i32 = 8;
/// TMA coordinates and the kernel's tile counter are 32-bit.
const MAX_EXTENT: usize = i32::MAX as usize;

/// A tile shape the kernel is compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TileConfig {
    bm: usize,
    bn: usize,
    stages: usize,
}

impl TileConfig {
    fn stage_bytes(self) -> usize {
        (self.bm + self.bn) * BK * 2
    }

    /// Must match hopper.cu: 1024 bytes of alignment slack, the slots, two mbarriers per slot.
    fn smem_bytes(self) -> usize {
        1024 + self.stages * self.stage_bytes() + 2 * self.stages * 8
    }

    fn tiles(self, p: &GemmProblem) -> usize {
        p.m.div_ceil(self.bm) * p.n.div_ceil(self.bn) * p.batch
    }
}

/// True when A is K-major (row-major M x K) in a TMA-compatible way.
fn a_fits(p: &GemmProblem) -> bool {
    let a = &p.a;
    (a.col_stride == 1 || p.k <= 1)
        && row_stride_ok(a.row_stride, p.m)
        && batch_stride_ok(a, p.batch)
}

/// Where B's contiguous dimension is: `Some(true)` for K (an N x K row-major weight),
/// `Some(false)` for N (K x N row-major), `None` when neither suits TMA.
fn b_k_major(p: &GemmProblem) -> Option<bool> {
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
    extent <= 1 || (stride % 8 == 0 && stride > 0)
}

fn batch_stride_ok(x: &MatrixArg, batch: usize) -> bool {
    batch <= 1 || x.batch_stride == 0 || x.batch_stride % 8 == 0
}

fn output_fits(x: &MatrixArg, n: usize) -> bool {
    x.col_stride == 1 || n <= 1
}

/// True when the Hopper kernel can run `p` on `arch`: sm_90a, 16-bit inputs, A K-major and B
/// with either dimension contiguous, 16-byte aligned bases and strides, D and C with
/// contiguous rows, sizes within 32-bit coordinates.
pub(crate) fn supports(arch: &Arch, p: &GemmProblem) -> bool {
    let arch_ok = arch.target.ends_with("90a")
        && arch.has_mma(MmaKind::Wgmma, p.in_dtype)
        && arch.has_async_copy(AsyncCopy::Tma);
    let dtypes_ok = matches!(p.in_dtype, DType::BF16 | DType::F16)
        && matches!(p.out_dtype, DType::BF16 | DType::F16 | DType::F32);
    let sizes_ok =
        p.m <= MAX_EXTENT && p.n <= MAX_EXTENT && p.k <= MAX_EXTENT && p.batch <= MAX_EXTENT;
    let aligned = p.a.ptr % 16 == 0 && p.b.ptr % 16 == 0;
    let outputs_ok = output_fits(&p.d, p.n) && p.c.as_ref().is_none_or(|c| output_fits(c, p.n));
    arch_ok
        && dtypes_ok
        && sizes_ok
        && aligned
        && outputs_ok
        && a_fits(p)
        && b_k_major(p).is_some()
        && pick(arch, p, b_k_major(p) == Some(true)).is_some()
}

/// The tile shape for `p`: 128 x 256 when that already gives about a wave of tiles (the big
/// GEMMs), else the first smaller shape that does (skinny M, small N), else the one with the
/// most tiles. N-major B needs 64-column chunks per consumer warpgroup.
fn pick(arch: &Arch, p: &GemmProblem, b_kmajor: bool) -> Option<TileConfig> {
    const SHAPES: [(usize, usize); 7] = [
        (128, 256),
        (128, 128),
        (64, 256),
        (64, 128),
        (64, 64),
        (64, 32),
        (128, 64),
    ];
    let allowed = |&(bm, bn): &(usize, usize)| {
        let wg_n = if bm == 64 { bn / 2 } else { bn };
        b_kmajor || wg_n % N_CHUNK == 0
    };
    let with_stages = |(bm, bn): (usize, usize)| {
        let one = TileConfig { bm, bn, stages: 1 };
        // 1024 bytes of alignment slack, and 1024 that ptxas reports as static shared memory.
        let budget = arch.shared_mem_per_block.saturating_sub(2048);
        let stages = (budget / (one.stage_bytes() + 16)).min(MAX_STAGES);
        (stages >= 2).then_some(TileConfig { bm, bn, stages })
    };
    let wave = (arch.compute_units as usize * 3 / 4).max(1);
    let candidates: Vec<TileConfig> = SHAPES
        .iter()
        .filter(|s| allowed(s))
        .filter_map(|&s| with_stages(s))
        .collect();
    let chosen = candidates
        .iter()
        .copied()
        .find(|c| c.tiles(p) >= wave)
        .or_else(|| {
            candidates
                .iter()
                .copied()
                .max_by_key(|c| (c.tiles(p), c.bm * c.bn))
        })?;
    (chosen.tiles(p) <= MAX_EXTENT).then_some(chosen)
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
fn operand_map(
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
    .encode()?;
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

/// Launches the Hopper GEMM for `p` (call only when [`supports`] is true).
/// One compiled form of the Hopper kernel.
#[derive(Debug, Clone, Copy)]
struct Variant {
    in_dtype: DType,
    out_dtype: DType,
    tile: TileConfig,
    b_kmajor: bool,
    epilogue: super::Epilogue,
    bias: bool,
    c: bool,
}

impl Variant {
    fn source(&self, vendor: calico_core::HeaderSet) -> Result<KernelSource> {
        let defines = [
            ("CALICO_GEMM_IN", self.in_dtype.device_type().to_string()),
            ("CALICO_GEMM_OUT", self.out_dtype.device_type().to_string()),
            ("CALICO_GEMM_BM", self.tile.bm.to_string()),
            ("CALICO_GEMM_BN", self.tile.bn.to_string()),
            ("CALICO_GEMM_STAGES", self.tile.stages.to_string()),
            ("CALICO_GEMM_B_KMAJOR", u8::from(self.b_kmajor).to_string()),
            ("CALICO_GEMM_EPILOGUE", self.epilogue.define().to_string()),
            ("CALICO_GEMM_HAS_BIAS", u8::from(self.bias).to_string()),
            ("CALICO_GEMM_HAS_C", u8::from(self.c).to_string()),
        ];
        KernelSource::assemble(
            ENTRY,
            SOURCE,
            &[vendor, calico_core::device_headers()],
            &defines,
        )
    }
}

/// Representative Hopper variants for the compile checks and `calico compile`.
pub(crate) fn catalog(vendor: calico_core::HeaderSet) -> Result<Vec<crate::catalog::CatalogEntry>> {
    use super::Epilogue;
    let big = TileConfig {
        bm: 128,
        bn: 256,
        stages: 4,
    };
    let skinny = TileConfig {
        bm: 64,
        bn: 32,
        stages: 8,
    };
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
            TileConfig {
                bm: 128,
                bn: 128,
                stages: 6,
            },
            false,
            Epilogue::None,
            false,
            true,
        ),
    ];
    for (in_dtype, out_dtype, tile, b_kmajor, epilogue, bias, c) in cases {
        let v = Variant {
            in_dtype,
            out_dtype,
            tile,
            b_kmajor,
            epilogue,
            bias,
            c,
        };
        let label = format!(
            "hopper {in_dtype}->{out_dtype} {}x{}x{BK} stages={} b_kmajor={b_kmajor} {epilogue:?} bias={bias} c={c}",
            tile.bm, tile.bn, tile.stages
        );
        out.push(crate::catalog::CatalogEntry {
            op: "gemm",
            label,
            source: v.source(vendor)?,
        });
    }
    Ok(out)
}

pub(crate) fn launch(gpu: &dyn GpuBackend, p: &GemmProblem) -> Result<()> {
    let arch = gpu.arch();
    if !supports(arch, p) {
        return Err(Error::unsupported(
            "the Hopper GEMM does not support this problem (layout, alignment or device)",
        ));
    }
    let b_kmajor = b_k_major(p) == Some(true);
    let cfg = pick(arch, p, b_kmajor).ok_or_else(|| {
        Error::unsupported("no Hopper GEMM tile fits this device's shared memory")
    })?;
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
        operand_map(
            &p.b,
            p.in_dtype,
            p.k,
            p.n,
            p.b.col_stride,
            p.batch,
            BK,
            cfg.bn,
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
    };
    let source = variant.source(gpu.vendor_headers())?;

    let tiles = cfg.tiles(p);
    let grid = tiles.min(arch.compute_units.max(1) as usize) as u32;
    let c = p.c.filter(|_| has_c);
    let batched = |x: &MatrixArg| if p.batch <= 1 { 0 } else { x.batch_stride };
    let args = [
        KernelArg::Opaque128(map_a),
        KernelArg::Opaque128(map_b),
        KernelArg::Ptr(p.d.ptr),
        KernelArg::Ptr(c.map_or(0, |c| c.ptr)),
        KernelArg::Ptr(p.bias.unwrap_or(0)),
        KernelArg::I32(as_i32(p.m, "M")?),
        KernelArg::I32(as_i32(p.n, "N")?),
        KernelArg::I32(as_i32(p.k, "K")?),
        KernelArg::I32(as_i32(p.batch, "batch")?),
        KernelArg::I64(as_i64(p.d.row_stride, "D row stride")?),
        KernelArg::I64(as_i64(batched(&p.d), "D batch stride")?),
        KernelArg::I64(as_i64(c.map_or(0, |c| c.row_stride), "C row stride")?),
        KernelArg::I64(as_i64(c.map_or(0, |c| batched(&c)), "C batch stride")?),
        KernelArg::I32(a_step),
        KernelArg::I32(b_step),
        KernelArg::I32(GROUP_M),
        KernelArg::F32(p.alpha),
        KernelArg::F32(p.beta),
    ];
    let config = LaunchConfig::linear(grid, THREADS, cfg.smem_bytes() as u32);
    gpu.launch(&source, &config, &args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::Epilogue;

    fn problem(m: usize, n: usize, k: usize, b_kmajor: bool) -> GemmProblem {
        let a = MatrixArg {
            ptr: 1 << 20,
            rows: m,
            cols: k,
            row_stride: k,
            col_stride: 1,
            batch_stride: 0,
        };
        let b = if b_kmajor {
            MatrixArg {
                ptr: 2 << 20,
                rows: k,
                cols: n,
                row_stride: 1,
                col_stride: k,
                batch_stride: 0,
            }
        } else {
            MatrixArg {
                ptr: 2 << 20,
                rows: k,
                cols: n,
                row_stride: n,
                col_stride: 1,
                batch_stride: 0,
            }
        };
        let d = MatrixArg {
            ptr: 3 << 20,
            rows: m,
            cols: n,
            row_stride: n,
            col_stride: 1,
            batch_stride: 0,
        };
        GemmProblem {
            batch: 1,
            m,
            n,
            k,
            in_dtype: DType::BF16,
            out_dtype: DType::BF16,
            a,
            b,
            c: None,
            d,
            bias: None,
            alpha: 1.0,
            beta: 0.0,
            epilogue: Epilogue::None,
        }
    }

    fn h100() -> Arch {
        Arch::for_target("sm_90a").unwrap()
    }

    #[test]
    fn big_gemms_use_128x256_with_4_stages() {
        let p = problem(4096, 4096, 4096, true);
        assert!(supports(&h100(), &p));
        let c = pick(&h100(), &p, true).unwrap();
        assert_eq!((c.bm, c.bn, c.stages), (128, 256, 4));
        assert!(c.smem_bytes() <= h100().shared_mem_per_block);
    }

    #[test]
    fn skinny_m_spreads_over_more_ctas() {
        let c = pick(&h100(), &problem(16, 4096, 4096, true), true).unwrap();
        assert_eq!((c.bm, c.bn), (64, 32));
        let c = pick(&h100(), &problem(256, 4096, 4096, true), true).unwrap();
        assert_eq!((c.bm, c.bn), (64, 128));
        // N-major B needs 64-column chunks per consumer warpgroup.
        let c = pick(&h100(), &problem(16, 4096, 4096, false), false).unwrap();
        assert_eq!((c.bm, c.bn), (128, 64));
    }

    #[test]
    fn unaligned_strides_and_other_targets_are_declined() {
        let mut p = problem(100, 100, 100, true);
        p.a.row_stride = 100; // 200 bytes: not a multiple of 16
        assert!(!supports(&h100(), &p));
        let p = problem(128, 128, 128, true);
        assert!(!supports(&Arch::for_target("sm_80").unwrap(), &p));
        let mut p = problem(128, 128, 128, true);
        p.a.col_stride = 128;
        p.a.row_stride = 1;
        assert!(!supports(&h100(), &p));
    }

    #[test]
    fn smem_layout_matches_the_kernel() {
        let c = TileConfig {
            bm: 128,
            bn: 256,
            stages: 4,
        };
        assert_eq!(c.smem_bytes(), 1024 + 4 * 49152 + 64);
    }
}
