//! The portable tiled GEMM (`kernels/device/gemm/portable.cu`): written against the vendor
//! contract alone, so it runs on CUDA and HIP, with any sizes and any element strides. It is the
//! fallback for what the tile kernel (tile.rs) declines: operands with no unit stride, column-
//! major C or D, sizes past 32-bit indices, GPUs without 16-bit matrix instructions.

use super::{as_i64, Epilogue, GemmProblem, MatrixArg};
use crate::catalog::CatalogEntry;
use calico_core::{
    Arch, DType, Error, GpuBackend, HeaderSet, KernelArg, KernelSource, KernelVariant,
    LaunchConfig, Result, Vendor,
};

const SOURCE: &str = include_str!("../../device/gemm/portable.cu");
const ENTRY: &str = "calico_gemm_portable";

/// Device headers of the GEMM kernels themselves (the epilogue they share, and the
/// parameter structs of params.rs).
pub(crate) const GEMM_HEADERS: HeaderSet = &[
    (
        "gemm/epilogue.cuh",
        include_str!("../../device/gemm/epilogue.cuh"),
    ),
    (
        "gemm/params.cuh",
        include_str!("../../device/gemm/params.cuh"),
    ),
    (
        "gemm/shift.cuh",
        include_str!("../../device/gemm/shift.cuh"),
    ),
    (
        "gemm/split_fused.cuh",
        include_str!("../../device/gemm/split_fused.cuh"),
    ),
];

/// Grid y and z limit on both vendors; grid z is folded (blocks loop over batches).
const MAX_GRID_YZ: usize = 65_535;

/// Block tiles, largest first: the first that gives every compute unit a block is used.
const TILES: [(usize, usize); 4] = [(128, 128), (128, 64), (64, 128), (64, 64)];

/// One compiled form of the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Variant {
    pub in_dtype: DType,
    pub out_dtype: DType,
    pub bm: usize,
    pub bn: usize,
    /// Threads read A along K (A's K stride is 1).
    pub a_k_fast: bool,
    /// Threads read B along K (B's K stride is 1 and its N stride is not).
    pub b_k_fast: bool,
    pub epilogue: Epilogue,
    pub has_c: bool,
    pub has_bias: bool,
}

impl Variant {
    /// The variant for `p` on `arch`.
    pub(crate) fn for_problem(arch: &Arch, p: &GemmProblem) -> Variant {
        let units = arch.compute_units.max(1) as usize;
        let blocks = |(bm, bn): (usize, usize)| {
            p.m.div_ceil(bm)
                .saturating_mul(p.n.div_ceil(bn))
                .saturating_mul(p.batch)
        };
        let fits = |&(bm, _): &(usize, usize)| p.m.div_ceil(bm) <= MAX_GRID_YZ;
        let (bm, bn) = TILES
            .iter()
            .copied()
            .filter(fits)
            .find(|&t| blocks(t) >= units)
            .unwrap_or(if p.m.div_ceil(64) <= MAX_GRID_YZ {
                (64, 64)
            } else {
                (128, 64)
            });
        Variant {
            in_dtype: p.in_dtype,
            out_dtype: p.out_dtype,
            bm,
            bn,
            a_k_fast: p.a.col_stride == 1,
            b_k_fast: p.b.row_stride == 1 && p.b.col_stride != 1,
            epilogue: p.epilogue,
            has_c: p.c.is_some() && p.beta != 0.0,
            has_bias: p.bias.is_some(),
        }
    }

    /// Threads per block: one per 8x8 micro-tile.
    pub(crate) fn threads(self) -> u32 {
        ((self.bm / 8) * (self.bn / 8)) as u32
    }

    pub(crate) fn defines(self) -> Vec<(&'static str, String)> {
        vec![
            ("CALICO_GEMM_IN", self.in_dtype.device_type().to_string()),
            ("CALICO_GEMM_OUT", self.out_dtype.device_type().to_string()),
            ("CALICO_GEMM_BM", self.bm.to_string()),
            ("CALICO_GEMM_BN", self.bn.to_string()),
            ("CALICO_GEMM_A_K_FAST", u8::from(self.a_k_fast).to_string()),
            ("CALICO_GEMM_B_K_FAST", u8::from(self.b_k_fast).to_string()),
            ("CALICO_GEMM_EPILOGUE", self.epilogue.define().to_string()),
            ("CALICO_GEMM_HAS_C", u8::from(self.has_c).to_string()),
            ("CALICO_GEMM_HAS_BIAS", u8::from(self.has_bias).to_string()),
        ]
    }
}

impl KernelVariant for Variant {
    fn source(&self, vendor: HeaderSet) -> Result<KernelSource> {
        let sets = [vendor, calico_core::device_headers(), GEMM_HEADERS];
        KernelSource::assemble(ENTRY, SOURCE, &sets, &self.defines())
    }
}

/// True when the portable kernel can run `p` on `arch`: any GPU, 16-bit inputs, bf16/f16/f32
/// output, and a grid within the launch limits (M up to 8M rows per tile column).
pub(crate) fn supports(arch: &Arch, p: &GemmProblem) -> bool {
    let gpu = matches!(arch.vendor, Vendor::Nvidia | Vendor::Amd);
    let dtypes = matches!(p.in_dtype, DType::BF16 | DType::F16)
        && matches!(p.out_dtype, DType::BF16 | DType::F16 | DType::F32);
    gpu && dtypes && grid(p, Variant::for_problem(arch, p)).is_ok()
}

/// (grid, threads): x over N tiles, y over M tiles, z over batches (folded past the limit).
fn grid(p: &GemmProblem, v: Variant) -> Result<LaunchConfig> {
    let threads = v.threads();
    let x = p.n.div_ceil(v.bn).max(1);
    let y = p.m.div_ceil(v.bm).max(1);
    let z = p.batch.clamp(1, MAX_GRID_YZ);
    // HIP counts the grid in work-items, in 32 bits.
    if y > MAX_GRID_YZ || x > (u32::MAX / threads) as usize {
        return Err(Error::unsupported(format!(
            "GEMM of {}x{} is too large for one launch grid",
            p.m, p.n
        )));
    }
    Ok(LaunchConfig {
        grid: (x as u32, y as u32, z as u32),
        block: (threads, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// The argument list shared by the portable and sm_80 kernels, in their parameter order:
/// (a, a strides), (b, ...), (c, ...), (d, ...), bias, m, n, k, batch, grid_z, alpha, beta.
/// Each matrix is a pointer then its row, column and batch strides in elements.
pub(crate) fn args(p: &GemmProblem, has_c: bool, grid_z: u32) -> Result<Vec<KernelArg>> {
    let mut args = Vec::with_capacity(24);
    let zero = MatrixArg {
        ptr: 0,
        rows: 0,
        cols: 0,
        row_stride: 0,
        col_stride: 0,
        batch_stride: 0,
    };
    let c = p.c.filter(|_| has_c).unwrap_or(zero);
    // Names for the (never expected) overflow errors, static so the hot path formats nothing.
    let operands = [
        (&p.a, ["A row stride", "A column stride", "A batch stride"]),
        (&p.b, ["B row stride", "B column stride", "B batch stride"]),
        (&c, ["C row stride", "C column stride", "C batch stride"]),
        (&p.d, ["D row stride", "D column stride", "D batch stride"]),
    ];
    for (x, [rs, cs, bs]) in operands {
        let batch_stride = if p.batch <= 1 { 0 } else { x.batch_stride };
        args.push(KernelArg::Ptr(x.ptr));
        args.push(KernelArg::I64(as_i64(x.row_stride, rs)?));
        args.push(KernelArg::I64(as_i64(x.col_stride, cs)?));
        args.push(KernelArg::I64(as_i64(batch_stride, bs)?));
    }
    args.push(KernelArg::Ptr(p.bias.unwrap_or(0)));
    for (name, v) in [("M", p.m), ("N", p.n), ("K", p.k), ("batch", p.batch)] {
        args.push(KernelArg::I64(as_i64(v, name)?));
    }
    args.push(KernelArg::I64(i64::from(grid_z)));
    args.push(KernelArg::F32(p.alpha));
    args.push(KernelArg::F32(p.beta));
    Ok(args)
}

/// Launches the portable GEMM for `p`.
pub(crate) fn launch(gpu: &dyn GpuBackend, p: &GemmProblem) -> Result<()> {
    let arch = gpu.arch();
    if !supports(arch, p) {
        return Err(Error::unsupported(format!(
            "the portable GEMM does not support this problem on {}",
            arch.target
        )));
    }
    let v = Variant::for_problem(arch, p);
    let config = grid(p, v)?;
    gpu.launch_variant(&v, &config, &args(p, v.has_c, config.grid.2)?)
}

/// Representative variants, for `calico compile` and the offline compile checks.
pub(crate) fn catalog(vendor: HeaderSet) -> Result<Vec<CatalogEntry>> {
    let mut out = Vec::new();
    let shapes = [
        (128, 128, true, false),
        (64, 64, false, true),
        (128, 64, true, true),
        (64, 128, false, false),
    ];
    for (i, (bm, bn, a_k_fast, b_k_fast)) in shapes.into_iter().enumerate() {
        for in_dtype in [DType::BF16, DType::F16] {
            let out_dtype = [DType::BF16, DType::F16, DType::F32][i % 3];
            let epilogue = [Epilogue::None, Epilogue::Gelu, Epilogue::Silu][i % 3];
            let v = Variant {
                in_dtype,
                out_dtype,
                bm,
                bn,
                a_k_fast,
                b_k_fast,
                epilogue,
                has_c: i % 2 == 0,
                has_bias: i % 2 == 1,
            };
            let label = format!("portable {in_dtype}->{out_dtype} {bm}x{bn} a_k_fast={a_k_fast} b_k_fast={b_k_fast} {epilogue:?}");
            out.push(CatalogEntry {
                op: "gemm",
                label,
                source: v.source(vendor)?,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The H100's target, for the GEMM routers' unit tests.
    pub(crate) fn h100() -> calico_core::Arch {
        calico_core::Arch::for_target("sm_90a").unwrap()
    }

    /// A row-major problem (B as K x N, or as an N x K weight when `b_kmajor`).
    pub(crate) fn problem(m: usize, n: usize, k: usize, b_kmajor: bool) -> GemmProblem {
        let a = MatrixArg {
            ptr: 1 << 20,
            rows: m,
            cols: k,
            row_stride: k,
            col_stride: 1,
            batch_stride: m * k,
        };
        let b = if b_kmajor {
            MatrixArg {
                ptr: 2 << 20,
                rows: k,
                cols: n,
                row_stride: 1,
                col_stride: k,
                batch_stride: n * k,
            }
        } else {
            MatrixArg {
                ptr: 2 << 20,
                rows: k,
                cols: n,
                row_stride: n,
                col_stride: 1,
                batch_stride: n * k,
            }
        };
        let d = MatrixArg {
            ptr: 3 << 20,
            rows: m,
            cols: n,
            row_stride: n,
            col_stride: 1,
            batch_stride: m * n,
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

    #[test]
    fn tiles_shrink_for_small_problems_and_odd_layouts_are_taken() {
        let arch = Arch::for_target("gfx942").unwrap();
        let big = Variant::for_problem(&arch, &problem(4096, 4096, 4096, false));
        assert_eq!((big.bm, big.bn, big.threads()), (128, 128, 256));
        let small = Variant::for_problem(&arch, &problem(100, 100, 100, true));
        assert_eq!((small.bm, small.bn), (64, 64));
        assert!(small.b_k_fast && small.a_k_fast);
        let mut p = problem(33, 17, 5, false);
        p.a.row_stride = 1;
        p.a.col_stride = 33; // column-major A
        assert!(supports(&arch, &p));
        assert!(!Variant::for_problem(&arch, &p).a_k_fast);
        assert!(!supports(&Arch::cpu(4), &p));
    }

    #[test]
    fn batches_past_the_grid_limit_fold_and_huge_m_is_declined() {
        let arch = Arch::for_target("sm_80").unwrap();
        let mut p = problem(64, 64, 64, false);
        p.batch = 100_000;
        let v = Variant::for_problem(&arch, &p);
        assert_eq!(grid(&p, v).unwrap().grid.2, 65_535);
        let p = problem(1 << 24, 8, 8, false);
        assert!(!supports(&arch, &p));
    }

    #[test]
    fn args_follow_the_kernel_signature() {
        let mut p = problem(10, 20, 30, false);
        p.c = Some(p.d);
        p.beta = 0.5;
        let args = args(&p, true, 1).unwrap();
        assert_eq!(args.len(), 24);
        assert_eq!(args[0], KernelArg::Ptr(1 << 20));
        assert_eq!(args[1], KernelArg::I64(30));
        assert_eq!(args[3], KernelArg::I64(0)); // batch 1: batch strides are irrelevant
        assert_eq!(args[8], KernelArg::Ptr(3 << 20));
        assert_eq!(args[17], KernelArg::I64(10));
        assert_eq!(args[22], KernelArg::F32(1.0));
        assert_eq!(args[23], KernelArg::F32(0.5));
    }

    #[test]
    fn sources_assemble_for_both_vendors() {
        for vendor in [calico_cuda::device_headers(), calico_hip::hip_headers()] {
            let entries = catalog(vendor).unwrap();
            assert!(entries
                .iter()
                .all(|e| e.source.text.contains("calico_gemm_portable")));
            assert!(entries[0].source.text.contains("erfc_fit"));
        }
    }
}
