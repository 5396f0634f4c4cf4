//! The decode GEMV for CDNA (`kernels/device/gemm/cdna_gemv.cu`): M <= 16 against a K-major
//! weight (torch Linear's layout) on gfx90a and gfx94x, so decode does not take the 256 x 256
//! MFMA GEMM, whose tiles leave most CUs idle at these shapes. Each weight row and each A row
//! is a buffer resource: loads past K read zeros, so the K tail has no branches when K is even
//! (odd K takes the other kernels). No AMD GPU has run it: it is checked by compilation and
//! the ISA (compile_all). `CALICO_GEMV=off` disables it, as it does the NVIDIA GEMV.

use super::portable::GEMM_HEADERS;
use super::{Epilogue, GemmProblem};
use crate::catalog::CatalogEntry;
use calico_core::{
    Arch, DType, Error, GpuBackend, HeaderSet, KernelSource, KernelVariant, LaunchConfig, MmaKind,
    Result, Vendor,
};

const SOURCE: &str = include_str!("../../device/gemm/cdna_gemv.cu");
const ENTRY: &str = "calico_gemv_cdna";
/// The largest M the kernel takes.
const MAX_M: usize = 16;
/// K per wave step at unroll 1 (64 lanes x 8 elements).
const WAVE_K: usize = 512;
const UNROLL: usize = 2;
const MAX_WAVES: usize = 4;
/// A row's bytes must fit a 32-bit buffer offset with room for the last step's overshoot.
const MAX_ROW_BYTES: usize = 1 << 30;
const MAX_GRID_X: usize = i32::MAX as usize;

/// One compiled form of the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Variant {
    pub in_dtype: DType,
    pub out_dtype: DType,
    /// Rows of A compiled for (M <= mt): 1, 2, 4, 8 or 16.
    pub mt: usize,
    /// Weight rows per workgroup: 1, 2 or 4.
    pub rows: usize,
    /// Waves per workgroup splitting K: 1, 2 or 4.
    pub waves: usize,
    pub epilogue: Epilogue,
    pub has_c: bool,
    pub has_bias: bool,
}

impl Variant {
    fn label(self) -> String {
        format!(
            "gemv cdna {}->{} mt{} rows{} waves{} {:?} c={} bias={}",
            self.in_dtype,
            self.out_dtype,
            self.mt,
            self.rows,
            self.waves,
            self.epilogue,
            self.has_c,
            self.has_bias
        )
    }
}

impl KernelVariant for Variant {
    fn source(&self, vendor: HeaderSet) -> Result<KernelSource> {
        let defines = vec![
            ("CALICO_GEMM_IN", self.in_dtype.device_type().to_string()),
            ("CALICO_GEMM_OUT", self.out_dtype.device_type().to_string()),
            ("CALICO_GEMV_MT", self.mt.to_string()),
            ("CALICO_GEMV_ROWS", self.rows.to_string()),
            ("CALICO_GEMV_WAVES", self.waves.to_string()),
            ("CALICO_GEMV_UNROLL", UNROLL.to_string()),
            ("CALICO_GEMM_EPILOGUE", self.epilogue.define().to_string()),
            ("CALICO_GEMM_HAS_C", u8::from(self.has_c).to_string()),
            ("CALICO_GEMM_HAS_BIAS", u8::from(self.has_bias).to_string()),
        ];
        let sets = [vendor, calico_core::device_headers(), GEMM_HEADERS];
        KernelSource::assemble(ENTRY, SOURCE, &sets, &defines)
    }
}

/// True when the CDNA GEMV runs `p` on `arch` and is routed there: gfx90a/gfx94x (MFMA
/// targets), one matrix, 1 <= M <= 16, 16-bit inputs, A and the weight with K contiguous, K
/// even (no dword straddles a row's end), both base pointers and row strides 4-byte aligned,
/// and each row's bytes within a 32-bit buffer offset.
pub(crate) fn supports(arch: &Arch, p: &GemmProblem) -> bool {
    let arch_ok = arch.vendor == Vendor::Amd && arch.has_mma(MmaKind::Mfma, p.in_dtype);
    let dtypes = matches!(p.in_dtype, DType::BF16 | DType::F16)
        && matches!(p.out_dtype, DType::BF16 | DType::F16 | DType::F32);
    let shape = p.batch == 1
        && (1..=MAX_M).contains(&p.m)
        && p.n >= 1
        && p.k >= 2
        && p.k.is_multiple_of(2)
        && p.k.saturating_mul(2) <= MAX_ROW_BYTES
        && i64::try_from(p.n).is_ok();
    // Rows of `extent` elements `stride` apart, K contiguous, every row dword-aligned.
    let rows_ok = |ptr: u64, unit: usize, stride: usize, count: usize| {
        unit == 1 && ptr.is_multiple_of(4) && (count <= 1 || stride.is_multiple_of(2))
    };
    let a_ok = rows_ok(p.a.ptr, p.a.col_stride, p.a.row_stride, p.m);
    let b_ok = rows_ok(p.b.ptr, p.b.row_stride, p.b.col_stride, p.n);
    super::gemv::enabled() && arch_ok && dtypes && shape && a_ok && b_ok
}

/// The variant for `p` (call only when [`supports`] is true): A's rows rounded up to a power of
/// two; four weight rows per workgroup while M <= 2 (more loads in flight per lane), fewer as
/// the accumulators grow (M x rows of them per lane); the fewest waves that still give each a
/// K step.
fn variant(p: &GemmProblem) -> Variant {
    let mt = p.m.next_power_of_two();
    let rows = match mt {
        1 | 2 => 4,
        4 | 8 => 2,
        _ => 1,
    };
    let steps = p.k.div_ceil(WAVE_K * UNROLL);
    let mut waves = MAX_WAVES;
    while waves > 1 && waves > steps {
        waves /= 2;
    }
    Variant {
        in_dtype: p.in_dtype,
        out_dtype: p.out_dtype,
        mt,
        rows,
        waves,
        epilogue: p.epilogue,
        has_c: p.c.is_some() && p.beta != 0.0,
        has_bias: p.bias.is_some(),
    }
}

fn config(p: &GemmProblem, v: &Variant) -> Result<LaunchConfig> {
    let blocks = p.n.div_ceil(v.rows);
    if blocks > MAX_GRID_X {
        return Err(Error::unsupported(format!(
            "the CDNA GEMV grid of {blocks} workgroups is too large"
        )));
    }
    Ok(LaunchConfig {
        grid: (blocks as u32, 1, 1),
        block: (64 * v.waves as u32, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// Launches the CDNA GEMV for `p`.
pub(crate) fn launch(gpu: &dyn GpuBackend, p: &GemmProblem) -> Result<()> {
    let arch = gpu.arch();
    if !supports(arch, p) {
        return Err(Error::unsupported(format!(
            "the CDNA GEMV does not support this problem on {}",
            arch.target
        )));
    }
    let v = variant(p);
    let config = config(p, &v)?;
    let args = super::weight_args(p, v.has_c)?;
    gpu.launch_variant(&v, &config, &args)
}

/// The variant a dense plan of `p` would launch (for `plan_dense`).
pub(crate) fn planned(p: &GemmProblem) -> Variant {
    variant(p)
}

/// Representative variants, for `calico compile` and the offline compile checks.
pub(crate) fn catalog(arch: &Arch, vendor: HeaderSet) -> Result<Vec<CatalogEntry>> {
    if !(arch.vendor == Vendor::Amd && arch.has_mma(MmaKind::Mfma, DType::BF16)) {
        return Ok(Vec::new());
    }
    let base = Variant {
        in_dtype: DType::BF16,
        out_dtype: DType::BF16,
        mt: 1,
        rows: 4,
        waves: 4,
        epilogue: Epilogue::None,
        has_c: false,
        has_bias: false,
    };
    let variants = [
        base,
        Variant {
            mt: 4,
            rows: 2,
            ..base
        },
        Variant {
            in_dtype: DType::F16,
            out_dtype: DType::F32,
            mt: 8,
            rows: 2,
            epilogue: Epilogue::Gelu,
            has_c: true,
            has_bias: true,
            ..base
        },
        Variant {
            mt: 16,
            rows: 1,
            waves: 2,
            epilogue: Epilogue::Silu,
            ..base
        },
    ];
    variants
        .into_iter()
        .map(|v| {
            Ok(CatalogEntry {
                op: "gemm",
                label: v.label(),
                source: v.source(vendor)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::portable::tests::problem;

    fn gfx(target: &str) -> Arch {
        Arch::for_target(target).unwrap()
    }

    #[test]
    fn decode_shapes_on_cdna_take_the_gemv() {
        for target in ["gfx90a", "gfx942"] {
            let arch = gfx(target);
            assert!(supports(&arch, &problem(1, 4096, 4096, true)), "{target}");
            assert!(supports(&arch, &problem(16, 14336, 4096, true)), "{target}");
            assert!(supports(&arch, &problem(3, 100, 4094, true)), "{target}");
            assert!(!supports(&arch, &problem(17, 4096, 4096, true)), "M > 16");
            assert!(!supports(&arch, &problem(1, 4096, 4096, false)), "K x N B");
            assert!(!supports(&arch, &problem(1, 4096, 4095, true)), "odd K");
            let mut p = problem(2, 64, 64, true);
            p.b.ptr += 2;
            assert!(!supports(&arch, &p), "weight not dword-aligned");
            let mut p = problem(2, 64, 64, true);
            p.batch = 2;
            assert!(!supports(&arch, &p), "batched");
        }
        assert!(!supports(&gfx("sm_90a"), &problem(1, 4096, 4096, true)));
    }

    #[test]
    fn variants_follow_m_and_k() {
        let v = variant(&problem(1, 4096, 4096, true));
        assert_eq!((v.mt, v.rows, v.waves), (1, 4, 4));
        let v = variant(&problem(5, 4096, 4096, true));
        assert_eq!((v.mt, v.rows), (8, 2));
        let v = variant(&problem(16, 4096, 1024, true));
        assert_eq!((v.mt, v.rows, v.waves), (16, 1, 1));
        let c = config(
            &problem(1, 4097, 4096, true),
            &variant(&problem(1, 4097, 4096, true)),
        );
        assert_eq!(c.unwrap().grid, (1025, 1, 1));
    }

    /// The routing decision for decode shapes, per vendor: CDNA takes this kernel, NVIDIA its
    /// mma.sync GEMV; what this kernel declines on CDNA goes to the MFMA or portable GEMM.
    #[test]
    fn route_sends_decode_to_the_vendor_gemv() {
        use crate::gemm::{route, GemmKernel};
        for (target, want) in [
            ("gfx90a", GemmKernel::CdnaGemv),
            ("gfx942", GemmKernel::CdnaGemv),
            ("sm_90a", GemmKernel::Gemv),
        ] {
            for m in [1, 8, 16] {
                let got = route(&gfx(target), &problem(m, 4096, 4096, true)).unwrap();
                assert_eq!(got, want, "{target} m={m}");
            }
        }
        let gfx942 = gfx("gfx942");
        let route = |p: &GemmProblem| route(&gfx942, p).unwrap();
        assert_eq!(route(&problem(17, 4096, 4096, true)), GemmKernel::Cdna);
        assert_eq!(route(&problem(8, 4096, 4096, false)), GemmKernel::Cdna);
        assert_eq!(route(&problem(1, 4096, 4095, true)), GemmKernel::Tile);
    }

    #[test]
    fn catalog_is_cdna_only() {
        assert_eq!(
            catalog(&gfx("gfx942"), calico_hip::hip_headers())
                .unwrap()
                .len(),
            4
        );
        assert!(catalog(&gfx("sm_90a"), calico_cuda::device_headers())
            .unwrap()
            .is_empty());
    }
}
