//! The skinny GEMM (`kernels/device/gemm/skinny.cu`): LLM decode shapes, M <= 64 against a
//! K-major weight, on sm_90. K is split across the CTAs of a thread-block cluster (so that
//! there are ~4 CTAs per SM streaming the weight) and the partials are summed in a fixed order
//! through distributed shared memory: no workspace, one launch, deterministic results.
//! Routed for M <= 16, and for M <= 64 when the Hopper kernel would leave most SMs idle
//! (narrow N); `CALICO_SKINNY=off` disables the path, `CALICO_SKINNY=all` routes every
//! M <= 64 (A/B runs and tests).

use super::params::WeightParams;
use super::portable::GEMM_HEADERS;
use super::{Epilogue, GemmProblem};
use crate::catalog::CatalogEntry;
use calico_core::{
    Arch, AsyncCopy, DType, Error, GpuBackend, HeaderSet, KernelSource, KernelVariant,
    LaunchConfig, MmaKind, Result, Vendor,
};

const SOURCE: &str = include_str!("../../device/gemm/skinny.cu");
const ENTRY: &str = "calico_gemm_skinny";
const THREADS: u32 = 128;
/// Output columns per cluster.
const BN: usize = 64;
/// K per pipeline stage.
const BK: usize = 64;
/// The largest M the kernel takes (four m16 tiles of A rows).
pub(crate) const MAX_M: usize = 64;
/// The portable cluster size limit.
const MAX_SPLIT: usize = 8;
/// CTAs per SM the split aims for (the kernel's launch bounds allow four).
const CTAS_PER_SM: usize = 4;
/// Fewest K tiles per split worth a CTA of its own.
const MIN_TILES_PER_SPLIT: usize = 4;
const MAX_GRID_Y: usize = 65_535;

/// One compiled form of the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Variant {
    pub in_dtype: DType,
    pub out_dtype: DType,
    /// m16 tiles of A rows: 1, 2 or 4.
    pub mt: usize,
    /// CTAs per cluster splitting K: 1, 2, 4 or 8.
    pub split: usize,
    pub epilogue: Epilogue,
    pub has_c: bool,
    pub has_bias: bool,
}

impl Variant {
    /// Pipeline depth: at most 48 KiB of shared memory, so four CTAs fit on an SM.
    fn stages(self) -> usize {
        match self.mt {
            1 | 2 => 4,
            _ => 3,
        }
    }

    fn smem_bytes(self) -> u32 {
        (self.stages() * (self.mt * 16 + BN) * BK * 2) as u32
    }

    fn defines(self) -> Vec<(&'static str, String)> {
        let mut defines = vec![
            ("CALICO_GEMM_IN", self.in_dtype.device_type().to_string()),
            ("CALICO_GEMM_OUT", self.out_dtype.device_type().to_string()),
            ("CALICO_SKINNY_MT", self.mt.to_string()),
            ("CALICO_SKINNY_STAGES", self.stages().to_string()),
            ("CALICO_SKINNY_SPLIT", self.split.to_string()),
            ("CALICO_GEMM_EPILOGUE", self.epilogue.define().to_string()),
            ("CALICO_GEMM_HAS_C", u8::from(self.has_c).to_string()),
            ("CALICO_GEMM_HAS_BIAS", u8::from(self.has_bias).to_string()),
            // The launch, checked by the kernel against its own constants.
            ("CALICO_GEMM_TILE_N", BN.to_string()),
            ("CALICO_GEMM_THREADS", THREADS.to_string()),
            ("CALICO_GEMM_SMEM_BYTES", self.smem_bytes().to_string()),
        ];
        defines.extend(WeightParams::layout_defines());
        defines
    }
}

impl KernelVariant for Variant {
    fn source(&self, vendor: HeaderSet) -> Result<KernelSource> {
        let sets = [vendor, calico_core::device_headers(), GEMM_HEADERS];
        KernelSource::assemble(ENTRY, SOURCE, &sets, &self.defines())
    }
}

/// Largest M always routed here. Measured on the H100 (N = K = 4096, bf16): M = 16 runs at
/// 22.7 us here against 28.5 us in the Hopper kernel; M = 64 at 0.75x cuBLASLt here against
/// 0.96x in the Hopper kernel (the A re-reads from L2 and the cluster reduction cost more than
/// the split gains while the Hopper kernel has a tile for most SMs).
const ALWAYS_MAX_M: usize = 16;

/// Which M this path takes: `CALICO_SKINNY=off` (or `0`, `false`, `no`) none, `all` every M
/// it supports (up to 64; A/B runs and tests), anything else the default rule of [`prefers`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Routing {
    Off,
    All,
    Default,
}

fn routing() -> Routing {
    static ROUTING: std::sync::OnceLock<Routing> = std::sync::OnceLock::new();
    *ROUTING.get_or_init(|| {
        let v = std::env::var("CALICO_SKINNY")
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        match v.as_str() {
            "off" | "0" | "false" | "no" => Routing::Off,
            "all" => Routing::All,
            _ => Routing::Default,
        }
    })
}

/// Whether to route a problem this kernel [`supports`] here rather than to the Hopper kernel,
/// which would cut it into `hopper_tiles` tiles (`None`: it cannot run it). By default: M <=
/// 16, or M <= 64 when the Hopper kernel would leave more than half the SMs without a tile
/// (narrow N: M = 64, N = 1024, K = 4096 ran at 0.92x cuBLASLt here, 0.76x there).
pub(crate) fn prefers(arch: &Arch, p: &GemmProblem, hopper_tiles: Option<usize>) -> bool {
    match routing() {
        Routing::Off => false,
        Routing::All => true,
        Routing::Default => prefers_by_default(arch, p, hopper_tiles),
    }
}

fn prefers_by_default(arch: &Arch, p: &GemmProblem, hopper_tiles: Option<usize>) -> bool {
    let sms = arch.compute_units.max(1) as usize;
    p.m <= ALWAYS_MAX_M || hopper_tiles.is_none_or(|t| 2 * t <= sms)
}

/// NVIDIA with mma.sync for `dtype` and thread-block clusters (TMA-capable parts), sm_90 only:
/// it was tuned and measured on the H100; sm_100 sends these shapes to the TMA + mma.sync
/// kernel until the skinny kernel is measured there.
fn arch_ok(arch: &Arch, dtype: DType) -> bool {
    arch.vendor == Vendor::Nvidia
        && arch.target.starts_with("sm_90")
        && arch.has_mma(MmaKind::MmaSync, dtype)
        && arch.has_async_copy(AsyncCopy::CpAsync)
        && arch.has_async_copy(AsyncCopy::Tma)
}

/// A stride between 16-byte aligned rows (8 elements), or one that is never used.
fn row_stride_ok(stride: usize, extent: usize) -> bool {
    extent <= 1 || stride.is_multiple_of(8)
}

/// True when the skinny kernel can run `p` on `arch`: sm_90, one matrix, 1 <= M <= 64, 16-bit
/// inputs, A with K contiguous and B a K-major weight (K contiguous), both with 16-byte aligned
/// bases and rows; C, D and bias take any strides.
pub(crate) fn supports(arch: &Arch, p: &GemmProblem) -> bool {
    let dtypes = matches!(p.in_dtype, DType::BF16 | DType::F16)
        && matches!(p.out_dtype, DType::BF16 | DType::F16 | DType::F32);
    let shape = p.batch == 1
        && (1..=MAX_M).contains(&p.m)
        && p.n >= 1
        && p.n.div_ceil(BN) <= MAX_GRID_Y
        && i64::try_from(p.k).is_ok();
    let a = &p.a;
    let a_ok = (a.col_stride == 1 || p.k <= 1)
        && row_stride_ok(a.row_stride, p.m)
        && a.ptr.is_multiple_of(16);
    let b = &p.b;
    // B is K x N with K contiguous: row n of the weight starts at n * col_stride.
    let b_ok = (b.row_stride == 1 || p.k <= 1)
        && row_stride_ok(b.col_stride, p.n)
        && b.ptr.is_multiple_of(16);
    arch_ok(arch, p.in_dtype) && dtypes && shape && a_ok && b_ok
}

/// Row groups (grid z): how many CTAs share one W slab, each taking `mt * 16` rows of A. By
/// default two when M > 16 and even the largest split leaves SMs without a CTA (N / 64
/// clusters of 8 < SMs): on the H100, M = 64, N = 1024, K = 4096 went from 13.1 us (one group,
/// 128 CTAs) to 11.3 us (two), while four groups of one m16 tile gave 13.1 us again.
/// `CALICO_SKINNY_ROWS=1|2|4` (read once) overrides it, for A/B runs.
fn row_groups(arch: &Arch, p: &GemmProblem) -> usize {
    static ASKED: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let asked = *ASKED.get_or_init(|| {
        match std::env::var("CALICO_SKINNY_ROWS")
            .ok()
            .as_deref()
            .map(str::trim)
        {
            Some("1") => Some(1),
            Some("2") => Some(2),
            Some("4") => Some(4),
            _ => None,
        }
    });
    let sms = arch.compute_units.max(1) as usize;
    let narrow = p.n.div_ceil(BN) * MAX_SPLIT < sms;
    let groups = asked.unwrap_or(if p.m > 16 && narrow { 2 } else { 1 });
    groups.min(p.m.div_ceil(16).max(1))
}

/// m16 tiles of A rows per CTA (1, 2 or 4) when the rows are dealt to `groups` CTAs.
fn m_tiles(m: usize, groups: usize) -> usize {
    match m.div_ceil(16 * groups) {
        0 | 1 => 1,
        2 => 2,
        _ => 4,
    }
}

/// CTAs per cluster: the fewest (a power of two up to 8) that give every SM ~4 CTAs, as long
/// as each split keeps at least a few K tiles.
fn split(arch: &Arch, p: &GemmProblem) -> usize {
    let target = CTAS_PER_SM * arch.compute_units.max(1) as usize;
    let col_blocks = p.n.div_ceil(BN) * row_groups(arch, p);
    let k_tiles = p.k.div_ceil(BK);
    let mut s = 1;
    while s < MAX_SPLIT && col_blocks * s < target && k_tiles >= 2 * s * MIN_TILES_PER_SPLIT {
        s *= 2;
    }
    s
}

/// The variant for `p` (call only when [`supports`] is true).
fn variant(arch: &Arch, p: &GemmProblem) -> Variant {
    Variant {
        in_dtype: p.in_dtype,
        out_dtype: p.out_dtype,
        mt: m_tiles(p.m, row_groups(arch, p)),
        split: split(arch, p),
        epilogue: p.epilogue,
        has_c: p.c.is_some() && p.beta != 0.0,
        has_bias: p.bias.is_some(),
    }
}

/// Launches the skinny GEMM for `p`.
pub(crate) fn launch(gpu: &dyn GpuBackend, p: &GemmProblem) -> Result<()> {
    let arch = gpu.arch();
    if !supports(arch, p) {
        return Err(Error::unsupported(format!(
            "the skinny GEMM does not support this problem on {}",
            arch.target
        )));
    }
    let v = variant(arch, p);
    let config = LaunchConfig {
        grid: (
            v.split as u32,
            p.n.div_ceil(BN) as u32,
            p.m.div_ceil(v.mt * 16) as u32,
        ),
        block: (THREADS, 1, 1),
        shared_mem_bytes: v.smem_bytes(),
    };
    let params = super::weight_params(p, v.has_c)?;
    gpu.launch_variant(&v, &config, &[params.arg()])
}

/// Representative variants (every M tiling and split), for `calico compile` and the offline
/// compile checks; only for targets with clusters.
pub(crate) fn catalog(arch: &Arch, vendor: HeaderSet) -> Result<Vec<CatalogEntry>> {
    if !arch_ok(arch, DType::BF16) {
        return Ok(Vec::new());
    }
    let shapes = [
        (DType::BF16, DType::BF16, 1, 8, Epilogue::None, false, false),
        (DType::F16, DType::F16, 2, 4, Epilogue::Gelu, true, false),
        (DType::BF16, DType::F32, 4, 8, Epilogue::Silu, false, true),
        (DType::F16, DType::BF16, 4, 2, Epilogue::None, true, true),
        (DType::BF16, DType::BF16, 1, 1, Epilogue::Gelu, false, true),
    ];
    let mut out = Vec::new();
    for (in_dtype, out_dtype, mt, split, epilogue, has_c, has_bias) in shapes {
        let v = Variant {
            in_dtype,
            out_dtype,
            mt,
            split,
            epilogue,
            has_c,
            has_bias,
        };
        out.push(CatalogEntry {
            op: "gemm",
            label: format!(
                "skinny {in_dtype}->{out_dtype} m{} split{split} {epilogue:?}",
                mt * 16
            ),
            source: v.source(vendor)?,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::portable::tests::{h100, problem};

    #[test]
    fn decode_shapes_are_taken_with_four_ctas_per_sm() {
        let p = problem(16, 4096, 4096, true);
        assert!(supports(&h100(), &p));
        let v = variant(&h100(), &p);
        assert_eq!((v.mt, v.split), (1, 8));
        assert_eq!(v.smem_bytes(), 40 * 1024);
        let v = variant(&h100(), &problem(64, 4096, 4096, true));
        assert_eq!((v.mt, v.split, v.smem_bytes()), (4, 8, 48 * 1024));
        // Narrow N: 16 clusters of 8 leave SMs idle, so two row groups of two m16 tiles.
        let v = variant(&h100(), &problem(64, 1024, 4096, true));
        assert_eq!((v.mt, v.split), (2, 8));
        assert_eq!(variant(&h100(), &problem(16, 1024, 4096, true)).mt, 1);
        assert_eq!(variant(&h100(), &problem(33, 11008, 4096, true)).split, 4);
        assert_eq!(variant(&h100(), &problem(1, 64, 64, true)).split, 1);
        assert!(supports(&h100(), &problem(1, 1, 1, true)));
    }

    #[test]
    fn row_groups_take_fewer_m_tiles_each() {
        assert_eq!([m_tiles(16, 1), m_tiles(32, 1), m_tiles(33, 1)], [1, 2, 4]);
        assert_eq!([m_tiles(64, 2), m_tiles(64, 4), m_tiles(48, 2)], [2, 1, 2]);
        assert_eq!([m_tiles(40, 3), m_tiles(1, 4)], [1, 1]);
    }

    #[test]
    fn routed_for_tiny_m_or_when_hopper_leaves_sms_idle() {
        let h = h100();
        let p = |m, n| problem(m, n, 4096, true);
        assert!(prefers_by_default(&h, &p(16, 4096), Some(128)));
        // M = 64: the Hopper kernel has 128 tiles for 132 SMs at N = 4096, 32 at N = 1024.
        assert!(!prefers_by_default(&h, &p(64, 4096), Some(128)));
        assert!(prefers_by_default(&h, &p(64, 1024), Some(32)));
        assert!(prefers_by_default(&h, &p(64, 1024), Some(66)));
        assert!(!prefers_by_default(&h, &p(64, 1024), Some(67)));
        assert!(prefers_by_default(&h, &p(48, 1024), None));
    }

    #[test]
    fn other_problems_are_declined() {
        assert!(!supports(&h100(), &problem(65, 4096, 4096, true)));
        assert!(!supports(&h100(), &problem(16, 4096, 4096, false)));
        assert!(!supports(
            &Arch::for_target("sm_80").unwrap(),
            &problem(16, 64, 64, true)
        ));
        assert!(!supports(
            &Arch::for_target("gfx942").unwrap(),
            &problem(16, 64, 64, true)
        ));
        let mut p = problem(16, 64, 100, true);
        p.b.col_stride = 100; // weight rows not 16-byte aligned
        p.a.row_stride = 104;
        assert!(!supports(&h100(), &p));
        let mut p = problem(16, 64, 64, true);
        p.batch = 2;
        assert!(!supports(&h100(), &p));
        let mut p = problem(16, 64, 64, true);
        p.a.ptr += 8;
        assert!(!supports(&h100(), &p));
    }

    #[test]
    fn params_carry_the_problem() {
        let mut p = problem(10, 20, 32, true);
        p.c = Some(p.d);
        p.beta = 0.5;
        let a = crate::gemm::weight_params(&p, true).unwrap();
        assert_eq!(a.a_rs, 32);
        assert_eq!(a.w_rs, 32);
        assert_eq!(a.c, 3 << 20);
        assert_eq!(a.m, 10);
        assert_eq!(a.beta, 0.5);
        assert_eq!(crate::gemm::weight_params(&p, false).unwrap().c, 0);
    }

    #[test]
    fn sources_assemble() {
        let entries = catalog(&h100(), calico_cuda::device_headers()).unwrap();
        assert_eq!(entries.len(), 5);
        assert!(entries[0]
            .source
            .text
            .contains("#define CALICO_SKINNY_MT 1\n"));
        assert!(catalog(
            &Arch::for_target("sm_80").unwrap(),
            calico_cuda::device_headers()
        )
        .unwrap()
        .is_empty());
    }
}
