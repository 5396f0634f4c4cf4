//! The sm_80 GEMM (`kernels/device/gemm/sm80.cu`): mma.sync m16n8k16 fed by a multi-stage
//! cp.async pipeline and ldmatrix, 128 x 128 x 32 block tiles, for Ampere and later NVIDIA
//! GPUs. It needs A with K contiguous and B with K or N contiguous, 16-byte aligned; other
//! layouts go to the portable kernel. The same source with a TMA producer warp
//! (`CALICO_GEMM_TMA`, [`Variant::tma`]) is launched by `sm80_tma.rs`.

use super::params::Sm80Params;
use super::portable::GEMM_HEADERS;
use super::{as_i64, Epilogue, GemmProblem, MatrixArg};
use crate::catalog::CatalogEntry;
use calico_core::{
    Arch, AsyncCopy, DType, Error, GpuBackend, HeaderSet, KernelSource, KernelVariant,
    LaunchConfig, MmaKind, Result, Vendor,
};

const SOURCE: &str = include_str!("../../device/gemm/sm80.cu");
const ENTRY: &str = "calico_gemm_sm80";
const TMA_ENTRY: &str = "calico_gemm_sm80_tma";
/// Eight warps, 2 (M) x 4 (N), each 64 x 32.
const THREADS: u32 = 256;
pub(super) const BM: usize = 128;
pub(super) const BN: usize = 128;
/// K per stage: 32 (cp.async), 64 with TMA (one 128-byte swizzled row).
const BK: usize = 32;
pub(super) const TMA_BK: usize = 64;
/// One pipeline stage: a 128 x 32 tile of A and one of B, 16-bit elements.
const STAGE_BYTES: usize = (BM + BN) * BK * 2;
/// One TMA stage (128 x 64 tiles), and the ring's full and empty mbarrier per stage.
pub(super) const TMA_STAGE_BYTES: usize = (BM + BN) * TMA_BK * 2;
const TMA_BARRIER_BYTES: usize = 2 * 8;
/// Alignment slack: the 128B swizzle needs 1024-aligned slots.
const TMA_ALIGN_SLACK: usize = 1024;
/// The kernel accepts 3..=5; 4 keeps two blocks per SM on A100 and H100.
const MIN_STAGES: usize = 3;
const MAX_STAGES: usize = 4;
pub(super) const MAX_GRID_YZ: usize = 65_535;

/// One compiled form of the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Variant {
    pub in_dtype: DType,
    pub out_dtype: DType,
    /// B is an N x K row-major weight (K contiguous); otherwise K x N row-major.
    pub b_kmajor: bool,
    pub stages: usize,
    pub epilogue: Epilogue,
    pub has_c: bool,
    pub has_bias: bool,
    /// Thread 0 fills a ring of 128 x 64 tiles with TMA (sm_90+) instead of every thread
    /// copying with cp.async.
    pub tma: bool,
}

impl Variant {
    pub(crate) fn smem_bytes(self) -> u32 {
        if self.tma {
            (TMA_ALIGN_SLACK + self.stages * (TMA_STAGE_BYTES + TMA_BARRIER_BYTES)) as u32
        } else {
            (self.stages * STAGE_BYTES) as u32
        }
    }

    /// Eight warps in both modes (with TMA, thread 0 also issues the copies).
    pub(crate) fn threads(self) -> u32 {
        THREADS
    }

    pub(crate) fn defines(self) -> Vec<(&'static str, String)> {
        let mut defines = vec![
            ("CALICO_GEMM_IN", self.in_dtype.device_type().to_string()),
            ("CALICO_GEMM_OUT", self.out_dtype.device_type().to_string()),
            ("CALICO_GEMM_B_KMAJOR", u8::from(self.b_kmajor).to_string()),
            ("CALICO_GEMM_STAGES", self.stages.to_string()),
            ("CALICO_GEMM_EPILOGUE", self.epilogue.define().to_string()),
            ("CALICO_GEMM_HAS_C", u8::from(self.has_c).to_string()),
            ("CALICO_GEMM_HAS_BIAS", u8::from(self.has_bias).to_string()),
            ("CALICO_GEMM_TMA", u8::from(self.tma).to_string()),
            // The launch, checked by the kernel against its own constants.
            ("CALICO_GEMM_TILE_M", BM.to_string()),
            ("CALICO_GEMM_TILE_N", BN.to_string()),
            ("CALICO_GEMM_THREADS", self.threads().to_string()),
            ("CALICO_GEMM_SMEM_BYTES", self.smem_bytes().to_string()),
        ];
        defines.extend(Sm80Params::layout_defines());
        defines
    }
}

impl KernelVariant for Variant {
    fn source(&self, vendor: HeaderSet) -> Result<KernelSource> {
        let sets = [vendor, calico_core::device_headers(), GEMM_HEADERS];
        let entry = if self.tma { TMA_ENTRY } else { ENTRY };
        KernelSource::assemble(entry, SOURCE, &sets, &self.defines())
    }
}

/// A stride between 16-byte aligned rows (8 elements), or one that is never used (extent <= 1).
fn row_stride_ok(stride: usize, extent: usize) -> bool {
    extent <= 1 || (stride & 7) == 0
}

fn batch_stride_ok(x: &MatrixArg, batch: usize) -> bool {
    batch <= 1 || (x.batch_stride & 7) == 0
}

/// A as M x K with K contiguous.
pub(super) fn a_fits(p: &GemmProblem) -> bool {
    let a = &p.a;
    (a.col_stride == 1 || p.k <= 1)
        && row_stride_ok(a.row_stride, p.m)
        && batch_stride_ok(a, p.batch)
        && (a.ptr & 15) == 0
}

/// `Some(true)` when B is read as an N x K weight (K contiguous), `Some(false)` as K x N
/// (N contiguous), `None` when neither fits.
pub(super) fn b_kmajor(p: &GemmProblem) -> Option<bool> {
    let b = &p.b;
    if !batch_stride_ok(b, p.batch) || (b.ptr & 15) != 0 {
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

/// The deepest pipeline that fits the device's shared memory (at least 3 stages).
fn stages(arch: &Arch) -> Option<usize> {
    let s = (arch.shared_mem_per_block / STAGE_BYTES).min(MAX_STAGES);
    (s >= MIN_STAGES).then_some(s)
}

/// True when the sm_80 kernel can run `p` on `arch`: an NVIDIA GPU with mma.sync and cp.async
/// for the input dtype, A K-contiguous, B K- or N-contiguous, their base pointers, row strides
/// and batch strides 16-byte aligned, and a grid within the launch limits.
pub(crate) fn supports(arch: &Arch, p: &GemmProblem) -> bool {
    let arch_ok = arch.vendor == Vendor::Nvidia
        && arch.has_mma(MmaKind::MmaSync, p.in_dtype)
        && arch.has_async_copy(AsyncCopy::CpAsync)
        && stages(arch).is_some();
    let dtypes = matches!(p.in_dtype, DType::BF16 | DType::F16)
        && matches!(p.out_dtype, DType::BF16 | DType::F16 | DType::F32);
    let grid_ok = p.m.div_ceil(BM) <= MAX_GRID_YZ && p.n.div_ceil(BN) <= i32::MAX as usize;
    arch_ok && dtypes && a_fits(p) && b_kmajor(p).is_some() && grid_ok
}

/// The variant for `p` (call only when [`supports`] is true).
fn variant(arch: &Arch, p: &GemmProblem) -> Result<Variant> {
    let unsupported = || {
        Error::unsupported(
            "the sm_80 GEMM does not support this problem (layout, alignment or device)",
        )
    };
    let b_kmajor = b_kmajor(p).ok_or_else(unsupported)?;
    let stages = stages(arch).ok_or_else(unsupported)?;
    Ok(Variant {
        in_dtype: p.in_dtype,
        out_dtype: p.out_dtype,
        b_kmajor,
        stages,
        epilogue: p.epilogue,
        has_c: p.c.is_some() && p.beta != 0.0,
        has_bias: p.bias.is_some(),
        tma: false,
    })
}

/// The kernel's parameters: C only when it is read, batch strides 0 for a single batch.
pub(super) fn params(p: &GemmProblem, has_c: bool, grid_z: u32) -> Result<Sm80Params> {
    let zero = MatrixArg {
        ptr: 0,
        rows: 0,
        cols: 0,
        row_stride: 0,
        col_stride: 0,
        batch_stride: 0,
    };
    let c = p.c.filter(|_| has_c).unwrap_or(zero);
    let bs =
        |x: &MatrixArg, name: &str| as_i64(if p.batch <= 1 { 0 } else { x.batch_stride }, name);
    Ok(Sm80Params {
        a: p.a.ptr,
        a_rs: as_i64(p.a.row_stride, "A row stride")?,
        a_cs: as_i64(p.a.col_stride, "A column stride")?,
        a_bs: bs(&p.a, "A batch stride")?,
        b: p.b.ptr,
        b_rs: as_i64(p.b.row_stride, "B row stride")?,
        b_cs: as_i64(p.b.col_stride, "B column stride")?,
        b_bs: bs(&p.b, "B batch stride")?,
        c: c.ptr,
        c_rs: as_i64(c.row_stride, "C row stride")?,
        c_cs: as_i64(c.col_stride, "C column stride")?,
        c_bs: bs(&c, "C batch stride")?,
        d: p.d.ptr,
        d_rs: as_i64(p.d.row_stride, "D row stride")?,
        d_cs: as_i64(p.d.col_stride, "D column stride")?,
        d_bs: bs(&p.d, "D batch stride")?,
        bias: p.bias.unwrap_or(0),
        m: as_i64(p.m, "M")?,
        n: as_i64(p.n, "N")?,
        k: as_i64(p.k, "K")?,
        batch: as_i64(p.batch, "batch")?,
        grid_z: i64::from(grid_z),
        alpha: p.alpha,
        beta: p.beta,
    })
}

/// Launches the sm_80 GEMM for `p`.
pub(crate) fn launch(gpu: &dyn GpuBackend, p: &GemmProblem) -> Result<()> {
    let arch = gpu.arch();
    if !supports(arch, p) {
        return Err(Error::unsupported(format!(
            "the sm_80 GEMM does not support this problem on {}",
            arch.target
        )));
    }
    let v = variant(arch, p)?;
    let config = LaunchConfig {
        grid: (
            p.n.div_ceil(BN).max(1) as u32,
            p.m.div_ceil(BM).max(1) as u32,
            p.batch.clamp(1, MAX_GRID_YZ) as u32,
        ),
        block: (THREADS, 1, 1),
        shared_mem_bytes: v.smem_bytes(),
    };
    let params = params(p, v.has_c, config.grid.2)?;
    gpu.launch_variant(&v, &config, &[params.arg()])
}

/// Representative variants, for `calico compile` and the offline compile checks.
pub(crate) fn catalog(vendor: HeaderSet) -> Result<Vec<CatalogEntry>> {
    let mut out = Vec::new();
    for in_dtype in [DType::BF16, DType::F16] {
        for (i, out_dtype) in [DType::BF16, DType::F16, DType::F32]
            .into_iter()
            .enumerate()
        {
            for b_kmajor in [true, false] {
                let epilogue = [Epilogue::None, Epilogue::Gelu, Epilogue::Silu][i];
                let v = Variant {
                    in_dtype,
                    out_dtype,
                    b_kmajor,
                    stages: MAX_STAGES,
                    epilogue,
                    has_c: i == 1,
                    has_bias: i != 1,
                    tma: false,
                };
                let label =
                    format!("sm80 {in_dtype}->{out_dtype} b_kmajor={b_kmajor} {epilogue:?}");
                out.push(CatalogEntry {
                    op: "gemm",
                    label,
                    source: v.source(vendor)?,
                });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::portable::tests::problem;

    fn a100() -> Arch {
        Arch::for_target("sm_80").unwrap()
    }

    #[test]
    fn row_major_and_weight_layouts_are_taken() {
        let p = problem(4096, 4096, 4096, true);
        assert!(supports(&a100(), &p));
        assert_eq!(b_kmajor(&p), Some(true));
        let p = problem(100, 40, 24, false);
        assert!(supports(&a100(), &p));
        assert_eq!(b_kmajor(&p), Some(false));
        assert_eq!(variant(&a100(), &p).unwrap().stages, 4);
        assert_eq!(variant(&a100(), &p).unwrap().smem_bytes(), 65_536);
        // Hopper runs it too (as the fallback for what the wgmma kernel declines).
        assert!(supports(&Arch::for_target("sm_90a").unwrap(), &p));
    }

    #[test]
    fn other_layouts_alignments_and_devices_are_declined() {
        let mut p = problem(100, 100, 100, true);
        p.a.row_stride = 100; // 200 bytes: rows not 16-byte aligned
        assert!(!supports(&a100(), &p));
        let mut p = problem(64, 64, 64, false);
        p.a.row_stride = 1;
        p.a.col_stride = 64; // M contiguous
        assert!(!supports(&a100(), &p));
        let mut p = problem(64, 64, 64, false);
        p.b.ptr += 2;
        assert!(!supports(&a100(), &p));
        let mut p = problem(64, 64, 64, false);
        p.batch = 2;
        p.a.batch_stride = 4;
        assert!(!supports(&a100(), &p));
        let p = problem(64, 64, 64, false);
        assert!(!supports(&Arch::for_target("gfx942").unwrap(), &p));
        assert!(!supports(&Arch::nvidia(7, 5, 40, 64 * 1024, 4 << 20), &p));
    }

    #[test]
    fn unit_extents_ignore_their_strides() {
        let mut p = problem(1, 64, 1, false);
        p.a.row_stride = 3;
        p.a.col_stride = 7;
        p.b.row_stride = 5;
        assert!(supports(&a100(), &p));
    }

    #[test]
    fn sources_assemble() {
        let entries = catalog(calico_cuda::device_headers()).unwrap();
        assert_eq!(entries.len(), 12);
        assert!(entries
            .iter()
            .all(|e| e.source.text.contains("mma.sync.aligned.m16n8k16")));
        let v = Variant {
            in_dtype: DType::F16,
            out_dtype: DType::F32,
            b_kmajor: false,
            stages: 3,
            epilogue: Epilogue::Gelu,
            has_c: true,
            has_bias: true,
            tma: false,
        };
        let text = v.source(calico_cuda::device_headers()).unwrap().text;
        assert!(text.starts_with("#define CALICO_GEMM_IN f16\n#define CALICO_GEMM_OUT float\n"));
        assert!(text.contains("#define CALICO_GEMM_STAGES 3\n"));
    }
}
