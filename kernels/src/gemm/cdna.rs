//! The CDNA GEMM (`kernels/device/gemm/cdna.cu`): MFMA on the tile vocabulary, 8-wave
//! ping-pong, 256 x 256 block tiles, buffer loads with hardware range checks. Runs on gfx90a and
//! gfx94x for A with k stride 1 and B with k stride 1 (an N x K weight) or n stride 1 (K x N
//! rows, transposed on the way into LDS); other layouts take the portable kernel. No AMD GPU
//! has run it: it is checked by compilation and the ISA (compile_all).

use super::{portable, Epilogue, GemmProblem};
use crate::catalog::CatalogEntry;
use calico_core::{
    Arch, DType, Error, GpuBackend, HeaderSet, KernelSource, KernelVariant, LaunchConfig, MmaKind,
    Result, Vendor,
};

const SOURCE: &str = include_str!("../../device/gemm/cdna.cu");
const ENTRY: &str = "calico_gemm_cdna";
const BM: usize = 256;
const BN: usize = 256;
const THREADS: u32 = 512;
const MAX_GRID_YZ: usize = 65_535;
/// Operands must stay below this many bytes (32-bit buffer offsets, with one bit kept for the
/// kernel's out-of-range marker).
const MAX_OPERAND_BYTES: usize = 1 << 31;

/// One compiled form of the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Variant {
    pub in_dtype: DType,
    pub out_dtype: DType,
    /// B's k stride is 1 (else its n stride is).
    pub b_k_major: bool,
    pub epilogue: Epilogue,
    pub has_c: bool,
    pub has_bias: bool,
}

impl Variant {
    pub(crate) fn for_problem(p: &GemmProblem) -> Variant {
        Variant {
            in_dtype: p.in_dtype,
            out_dtype: p.out_dtype,
            b_k_major: b_k_major(p),
            epilogue: p.epilogue,
            has_c: p.c.is_some() && p.beta != 0.0,
            has_bias: p.bias.is_some(),
        }
    }
}

impl KernelVariant for Variant {
    fn source(&self, vendor: HeaderSet) -> Result<KernelSource> {
        let defines = vec![
            ("CALICO_GEMM_IN", self.in_dtype.device_type().to_string()),
            ("CALICO_GEMM_OUT", self.out_dtype.device_type().to_string()),
            (
                "CALICO_GEMM_B_K_MAJOR",
                u8::from(self.b_k_major).to_string(),
            ),
            ("CALICO_GEMM_EPILOGUE", self.epilogue.define().to_string()),
            ("CALICO_GEMM_HAS_C", u8::from(self.has_c).to_string()),
            ("CALICO_GEMM_HAS_BIAS", u8::from(self.has_bias).to_string()),
        ];
        let sets = [
            vendor,
            calico_core::device_headers(),
            portable::GEMM_HEADERS,
        ];
        KernelSource::assemble(ENTRY, SOURCE, &sets, &defines)
    }
}

fn b_k_major(p: &GemmProblem) -> bool {
    p.b.row_stride == 1
}

/// True on a CDNA GPU with MFMA when A's k stride is 1 and B's k or n stride is 1, the other
/// strides and the batch strides are multiples of 8 elements, the pointers 16-byte aligned,
/// each operand under 2 GiB, and the grid fits.
pub(crate) fn supports(arch: &Arch, p: &GemmProblem) -> bool {
    let cdna = arch.vendor == Vendor::Amd && arch.has_mma(MmaKind::Mfma, p.in_dtype);
    let dtypes = matches!(p.in_dtype, DType::BF16 | DType::F16)
        && matches!(p.out_dtype, DType::BF16 | DType::F16 | DType::F32);
    let esize = p.in_dtype.size_bytes();
    // `rows` rows of `cols` contiguous elements, `stride` apart.
    let operand_ok =
        |ptr: u64, unit: usize, stride: usize, batch_stride: usize, rows: usize, cols: usize| {
            let extent = (rows.max(1) - 1)
                .checked_mul(stride)
                .and_then(|x| x.checked_add(cols))
                .and_then(|x| x.checked_mul(esize));
            unit == 1
                && stride.is_multiple_of(8)
                && (p.batch <= 1 || batch_stride.is_multiple_of(8))
                && ptr.is_multiple_of(16)
                && extent.is_some_and(|e| e < MAX_OPERAND_BYTES)
        };
    let a_ok = operand_ok(
        p.a.ptr,
        p.a.col_stride,
        p.a.row_stride,
        p.a.batch_stride,
        p.m,
        p.k,
    );
    let b_ok = if b_k_major(p) {
        operand_ok(
            p.b.ptr,
            p.b.row_stride,
            p.b.col_stride,
            p.b.batch_stride,
            p.n,
            p.k,
        )
    } else {
        operand_ok(
            p.b.ptr,
            p.b.col_stride,
            p.b.row_stride,
            p.b.batch_stride,
            p.k,
            p.n,
        )
    };
    cdna && dtypes && p.k > 0 && a_ok && b_ok && p.m.div_ceil(BM) <= MAX_GRID_YZ
}

fn grid(p: &GemmProblem) -> LaunchConfig {
    LaunchConfig {
        grid: (
            p.n.div_ceil(BN).max(1) as u32,
            p.m.div_ceil(BM).max(1) as u32,
            p.batch.clamp(1, MAX_GRID_YZ) as u32,
        ),
        block: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Launches the CDNA GEMM for `p`.
pub(crate) fn launch(gpu: &dyn GpuBackend, p: &GemmProblem) -> Result<()> {
    let arch = gpu.arch();
    if !supports(arch, p) {
        return Err(Error::unsupported(format!(
            "the CDNA GEMM does not support this problem on {}",
            arch.target
        )));
    }
    let v = Variant::for_problem(p);
    let config = grid(p);
    gpu.launch_variant(&v, &config, &portable::args(p, v.has_c, config.grid.2)?)
}

/// Representative variants, for `calico compile` and the offline compile checks.
pub(crate) fn catalog(vendor: HeaderSet) -> Result<Vec<CatalogEntry>> {
    let mut out = Vec::new();
    for (i, in_dtype) in [DType::BF16, DType::F16].into_iter().enumerate() {
        for (j, out_dtype) in [DType::BF16, DType::F16, DType::F32]
            .into_iter()
            .enumerate()
        {
            let epilogue = [Epilogue::None, Epilogue::Gelu, Epilogue::Silu][j];
            let b_k_major = (i + j) % 2 == 1;
            let v = Variant {
                in_dtype,
                out_dtype,
                b_k_major,
                epilogue,
                has_c: (i + j) % 2 == 0,
                has_bias: j == 1,
            };
            out.push(CatalogEntry {
                op: "gemm",
                label: format!(
                    "cdna {in_dtype}->{out_dtype} 256x256 B {} {epilogue:?}",
                    if b_k_major { "n x k" } else { "k x n" }
                ),
                source: v.source(vendor)?,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::portable::tests::problem;

    #[test]
    fn routes_cdna_with_unit_k_or_n_stride_b() {
        let gfx942 = Arch::for_target("gfx942").unwrap();
        let sm90 = Arch::for_target("sm_90a").unwrap();
        let weight = problem(300, 500, 136, true);
        assert!(supports(&gfx942, &weight));
        assert!(Variant::for_problem(&weight).b_k_major);
        assert!(!supports(&sm90, &weight), "NVIDIA has its own kernels");
        let rows = problem(300, 504, 136, false);
        assert!(supports(&gfx942, &rows), "K x N rows");
        assert!(!Variant::for_problem(&rows).b_k_major);
        assert!(
            !supports(&gfx942, &problem(300, 500, 136, false)),
            "rows of 500"
        );
        let mut odd = weight;
        odd.a.row_stride = 137;
        odd.a.cols = 137;
        assert!(!supports(&gfx942, &odd), "row stride not a multiple of 8");
        let mut misaligned = weight;
        misaligned.b.ptr += 8;
        assert!(!supports(&gfx942, &misaligned));
        let mut huge = weight;
        huge.m = 1 << 20;
        huge.a.row_stride = 4096;
        assert!(!supports(&gfx942, &huge), "A over 2 GiB");
    }

    #[test]
    fn grid_covers_the_output_in_256_tiles() {
        let p = problem(300, 513, 64, true);
        let g = grid(&p);
        assert_eq!(g.grid, (3, 2, 1));
        assert_eq!(g.block, (512, 1, 1));
    }
}
