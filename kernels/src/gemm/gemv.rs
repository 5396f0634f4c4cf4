//! The decode GEMV (`kernels/device/gemm/gemv.cu`): M <= 16 against a K-major weight (torch
//! Linear's layout) on NVIDIA with mma.sync (sm_80 and later). The weight is streamed once
//! with 16-byte loads straight into mma fragments; K is split over the warps of a CTA and
//! summed in shared memory in a fixed order (deterministic, one launch, no workspace).
//! `CALICO_GEMV=off` disables the path; `CALICO_GEMV_TUNE=nb=2,warps=8,unroll=4` forces its
//! shape (A/B runs).

use super::portable::GEMM_HEADERS;
use super::{Epilogue, GemmProblem};
use crate::catalog::CatalogEntry;
use calico_core::{
    Arch, DType, Error, GpuBackend, HeaderSet, KernelSource, KernelVariant, LaunchConfig, MmaKind,
    Result, Vendor,
};

const SOURCE: &str = include_str!("../../device/gemm/gemv.cu");
const ENTRY: &str = "calico_gemv";
/// The largest M the kernel takes (one m16 tile of A rows).
pub(crate) const MAX_M: usize = 16;
/// Warps per SM the K split aims for.
const WARPS_PER_SM: usize = 16;
const DEFAULT_UNROLL: usize = 8;
const DEFAULT_PREFETCH: bool = false;
/// Whether the warp count is capped so that a lane's loads fit its registers (`fit=0` turns it
/// off): on by default since the H100 measured M = 16 at 4096 x 4096 0.0190 -> 0.0174 ms and
/// at 4096 x 14336 0.0539 -> 0.0490 ms (the uncapped 16 warps spilled).
const DEFAULT_FIT: bool = true;
/// Whether weight loads are marked evict-first in L2 at this M (`evict=0|1` overrides): H100,
/// session 12, two mirrored pairs: M = 1 and 4 gain 2.5-3.5 points of the copy (1x4096x4096
/// 69.2-70.0 against 67.0-67.1%, 1x14336x4096 89.7-90.5 against 86.9-87.3%), M = 16 loses 2-4
/// (16x14336x4096 76.8-77.5 against 80.6-80.9%). M = 5..8 has no bench case and keeps the
/// default policy. The H200 (60 MiB of L2, HBM3e; session 27, one run with repeats of the
/// default) measured the opposite on weights larger than its L2: without the hint 1x14336x4096
/// 82.3 against 76.7%, 4x14336x4096 81.4 against 78.4, 1x4096x14336 82.3 against 79.0
/// (4x4096x14336 81.6 against 82.6), while 32 MiB weights kept gaining from it (1x4096x4096
/// 59.8 against 55.8%). Told apart by the L2 size, the one figure of the two memory systems
/// the device reports.
fn default_evict_first(arch: &Arch, p: &GemmProblem) -> bool {
    let weight_bytes =
        p.n.saturating_mul(p.k)
            .saturating_mul(p.in_dtype.size_bytes());
    let h200_class = arch.l2_bytes >= 60 << 20;
    p.m <= 4 && !(h200_class && weight_bytes > arch.l2_bytes)
}
/// Whether CTAs start their K walks at different steps when M > 8 (`rotate=0|1` overrides):
/// H100, session 12, two mirrored pairs: M = 16 +0.7-1.6 points of the copy (16x14336x4096
/// 80.8 against 79.7-80.1%, 16x4096x14336 81.4-81.5 against 79.9-80.2%), M <= 4 0.5-2 points
/// worse, so only M > 8 (where A is 16 rows, read by every CTA) rotates.
fn default_rotate(m16: bool) -> bool {
    m16
}
/// 32-bit registers per SM (sm_80 .. sm_100): a block of W warps gets at most 65536 / (32 W)
/// per thread (255 at most).
const REGS_PER_SM: usize = 65536;
/// Registers a lane needs besides its loads in flight: accumulators, pointers, indices.
const OTHER_REGS: usize = 48;
const MAX_GRID_X: usize = i32::MAX as usize;

/// One compiled form of the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Variant {
    pub in_dtype: DType,
    pub out_dtype: DType,
    /// Groups of 8 weight rows per CTA: 1, 2 or 4.
    pub nb: usize,
    /// Warps per CTA splitting K: 1..16.
    pub warps: usize,
    /// 32-wide K chunks per warp step: 1, 2, 4 or 8.
    pub unroll: usize,
    /// A and W rows 16-byte aligned: vector loads.
    pub vec: bool,
    /// M > 8: A rows 8..15 are read.
    pub m16: bool,
    /// Weight loads with the L2 256-byte prefetch hint.
    pub prefetch: bool,
    /// CTA b starts its walk over K at step b, so concurrent CTAs read different parts of A.
    pub rotate: bool,
    /// Weight loads marked evict-first in L2.
    pub evict_first: bool,
    pub epilogue: Epilogue,
    pub has_c: bool,
    pub has_bias: bool,
}

impl Variant {
    fn defines(self) -> Vec<(&'static str, String)> {
        vec![
            ("CALICO_GEMM_IN", self.in_dtype.device_type().to_string()),
            ("CALICO_GEMM_OUT", self.out_dtype.device_type().to_string()),
            ("CALICO_GEMV_NB", self.nb.to_string()),
            ("CALICO_GEMV_WARPS", self.warps.to_string()),
            ("CALICO_GEMV_UNROLL", self.unroll.to_string()),
            ("CALICO_GEMV_VEC", u8::from(self.vec).to_string()),
            ("CALICO_GEMV_M16", u8::from(self.m16).to_string()),
            ("CALICO_GEMV_PREFETCH", u8::from(self.prefetch).to_string()),
            ("CALICO_GEMV_ROTATE", u8::from(self.rotate).to_string()),
            (
                "CALICO_GEMV_EVICT_FIRST",
                u8::from(self.evict_first).to_string(),
            ),
            ("CALICO_GEMM_EPILOGUE", self.epilogue.define().to_string()),
            ("CALICO_GEMM_HAS_C", u8::from(self.has_c).to_string()),
            ("CALICO_GEMM_HAS_BIAS", u8::from(self.has_bias).to_string()),
        ]
    }

    fn label(self) -> String {
        format!(
            "gemv {}->{} nb{} warps{} unroll{} vec={} m16={} prefetch={}{}{} {:?} c={} bias={}",
            self.in_dtype,
            self.out_dtype,
            self.nb,
            self.warps,
            self.unroll,
            self.vec,
            self.m16,
            self.prefetch,
            if self.rotate { " rotate" } else { "" },
            if self.evict_first { " evict_first" } else { "" },
            self.epilogue,
            self.has_c,
            self.has_bias
        )
    }
}

impl KernelVariant for Variant {
    fn source(&self, vendor: HeaderSet) -> Result<KernelSource> {
        let sets = [vendor, calico_core::device_headers(), GEMM_HEADERS];
        KernelSource::assemble(ENTRY, SOURCE, &sets, &self.defines())
    }
}

/// Shape overrides from `CALICO_GEMV_TUNE` (entries that do not parse are ignored).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Tune {
    nb: Option<usize>,
    warps: Option<usize>,
    unroll: Option<usize>,
    prefetch: Option<bool>,
    /// Cap the warps so that one step's loads fit a lane's registers.
    fit: Option<bool>,
    /// Rotate each CTA's walk over K (`rotate=0|1`).
    rotate: Option<bool>,
    /// Weight loads evict-first in L2 (`evict=0|1`).
    evict_first: Option<bool>,
}

impl Tune {
    fn parse(text: &str) -> Tune {
        let mut t = Tune::default();
        for (key, value) in crate::knobs::pairs(text) {
            let num = value.parse::<usize>().ok();
            match key {
                "nb" => t.nb = num.filter(|v| [1, 2, 4].contains(v)),
                "warps" => t.warps = num.filter(|v| (1..=16).contains(v)),
                "unroll" => t.unroll = num.filter(|v| [1, 2, 4, 8].contains(v)),
                "prefetch" => t.prefetch = num.filter(|v| *v <= 1).map(|v| v == 1),
                "fit" => t.fit = num.filter(|v| *v <= 1).map(|v| v == 1),
                "rotate" => t.rotate = num.filter(|v| *v <= 1).map(|v| v == 1),
                "evict" => t.evict_first = num.filter(|v| *v <= 1).map(|v| v == 1),
                _ => {}
            }
        }
        t
    }

    fn get() -> Tune {
        static TUNE: std::sync::OnceLock<Tune> = std::sync::OnceLock::new();
        crate::knobs::read(&TUNE, "CALICO_GEMV_TUNE", Tune::parse)
    }
}

/// False when `CALICO_GEMV=off` (or 0/false/no) turns the GEMV paths off (NVIDIA and CDNA).
pub(crate) fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        let v = std::env::var("CALICO_GEMV").unwrap_or_default();
        !matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "off" | "0" | "false" | "no"
        )
    })
}

/// True when the GEMV runs `p` on `arch` and is routed there: NVIDIA with bf16/f16 mma.sync,
/// one matrix, 1 <= M <= 16, 16-bit inputs, A with K contiguous and B a K-major weight (K
/// contiguous); any strides and alignments otherwise (unaligned rows take scalar loads).
pub(crate) fn supports(arch: &Arch, p: &GemmProblem) -> bool {
    let arch_ok = arch.vendor == Vendor::Nvidia && arch.has_mma(MmaKind::MmaSync, p.in_dtype);
    let dtypes = matches!(p.in_dtype, DType::BF16 | DType::F16)
        && matches!(p.out_dtype, DType::BF16 | DType::F16 | DType::F32);
    let shape = p.batch == 1
        && (1..=MAX_M).contains(&p.m)
        && p.n >= 1
        && p.n.div_ceil(8) <= MAX_GRID_X
        && i64::try_from(p.k).is_ok()
        && i64::try_from(p.n).is_ok();
    let a_ok = p.a.col_stride == 1 || p.k <= 1;
    let b_ok = p.b.row_stride == 1 || p.k <= 1;
    enabled() && arch_ok && dtypes && shape && a_ok && b_ok
}

/// Rows 16-byte aligned (or never stepped over): the vector-load variant applies.
fn vector_loads_ok(p: &GemmProblem) -> bool {
    let rows_ok = |stride: usize, extent: usize| extent <= 1 || stride.is_multiple_of(8);
    p.a.ptr.is_multiple_of(16)
        && p.b.ptr.is_multiple_of(16)
        && rows_ok(p.a.row_stride, p.m)
        && rows_ok(p.b.col_stride, p.n)
}

/// True when a lane of a `warps`-warp block can hold one step's loads in registers: 4 per
/// 16-byte load of W (NB x UNROLL) and of A (UNROLL, twice when M > 8). At 16 warps a thread
/// gets 128 registers, and the M = 16 default (NB 4, UNROLL 8: 192 for its loads) spilled
/// (249 STL, 112 LDL in its sm_90a SASS).
fn loads_fit(nb: usize, unroll: usize, m16: bool, warps: usize) -> bool {
    let loads = 4 * unroll * (nb + 1 + usize::from(m16));
    let budget = (REGS_PER_SM / (32 * warps.max(1))).min(255);
    loads + OTHER_REGS <= budget
}

/// The variant for `p` (call only when [`supports`] is true): more weight rows per CTA as M
/// grows (A's bytes per weight byte are M / (8 NB)), and the fewest warps (a power of two up to
/// 16) that give every SM ~16 warps while each keeps at least one K step; with `fit=1`, no more
/// than a lane's registers can feed (see [`loads_fit`]).
fn variant(arch: &Arch, p: &GemmProblem, tune: Tune) -> Variant {
    let nb = tune.nb.unwrap_or(match p.m {
        0..=4 => 1,
        5..=8 => 2,
        _ => 4,
    });
    let unroll = tune.unroll.unwrap_or(DEFAULT_UNROLL);
    let ctas = p.n.div_ceil(8 * nb).max(1);
    let steps = p.k.div_ceil(32 * unroll).max(1);
    let want = (WARPS_PER_SM * arch.compute_units.max(1) as usize).div_ceil(ctas);
    let mut warps = 4;
    while warps < 16 && warps < want && 2 * warps <= steps {
        warps *= 2;
    }
    while warps > 1 && warps > steps {
        warps /= 2;
    }
    let m16 = p.m > 8;
    if tune.fit.unwrap_or(DEFAULT_FIT) {
        while warps > 1 && !loads_fit(nb, unroll, m16, warps) {
            warps /= 2;
        }
    }
    Variant {
        in_dtype: p.in_dtype,
        out_dtype: p.out_dtype,
        nb,
        warps: tune.warps.unwrap_or(warps),
        unroll,
        vec: vector_loads_ok(p),
        m16,
        prefetch: tune.prefetch.unwrap_or(DEFAULT_PREFETCH),
        rotate: tune.rotate.unwrap_or(default_rotate(m16)),
        evict_first: tune.evict_first.unwrap_or(default_evict_first(arch, p)),
        epilogue: p.epilogue,
        has_c: p.c.is_some() && p.beta != 0.0,
        has_bias: p.bias.is_some(),
    }
}

/// Launches the GEMV for `p`.
pub(crate) fn launch(gpu: &dyn GpuBackend, p: &GemmProblem) -> Result<()> {
    let arch = gpu.arch();
    if !supports(arch, p) {
        return Err(Error::unsupported(format!(
            "the GEMV kernel does not support this problem on {}",
            arch.target
        )));
    }
    let v = variant(arch, p, Tune::get());
    let config = LaunchConfig {
        grid: (p.n.div_ceil(8 * v.nb) as u32, 1, 1),
        block: (32 * v.warps as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // Positional, not WeightParams: see the kernel entry in gemv.cu.
    let args = super::weight_args(p, v.has_c)?;
    gpu.launch_variant(&v, &config, &args)
}

/// Representative variants, for `calico compile` and the offline compile checks.
pub(crate) fn catalog(arch: &Arch, vendor: HeaderSet) -> Result<Vec<CatalogEntry>> {
    if !(arch.vendor == Vendor::Nvidia && arch.has_mma(MmaKind::MmaSync, DType::BF16)) {
        return Ok(Vec::new());
    }
    let base = Variant {
        in_dtype: DType::BF16,
        out_dtype: DType::BF16,
        nb: 1,
        warps: 8,
        unroll: 4,
        vec: true,
        m16: false,
        prefetch: false,
        rotate: false,
        evict_first: false,
        epilogue: Epilogue::None,
        has_c: false,
        has_bias: false,
    };
    let variants = [
        base,
        // 8 warps: at 16, NB 4 x UNROLL 4 with M > 8 spills (see `loads_fit`).
        Variant {
            nb: 4,
            warps: 8,
            m16: true,
            prefetch: true,
            ..base
        },
        Variant {
            in_dtype: DType::F16,
            out_dtype: DType::F32,
            nb: 2,
            epilogue: Epilogue::Gelu,
            has_c: true,
            has_bias: true,
            ..base
        },
        Variant {
            vec: false,
            m16: true,
            epilogue: Epilogue::Silu,
            unroll: 2,
            ..base
        },
        // The defaults at M = 1 and (with fit=1) M = 16 against a 4096 x 4096 weight.
        Variant {
            unroll: DEFAULT_UNROLL,
            ..base
        },
        Variant {
            nb: 4,
            warps: 8,
            unroll: DEFAULT_UNROLL,
            m16: true,
            ..base
        },
        Variant {
            nb: 4,
            warps: 8,
            unroll: DEFAULT_UNROLL,
            m16: true,
            rotate: true,
            evict_first: true,
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
    use crate::gemm::portable::tests::{h100, problem};
    use calico_core::KernelArg;

    #[test]
    fn decode_shapes_fill_the_sms() {
        let t = Tune::default();
        let v = variant(&h100(), &problem(1, 4096, 4096, true), t);
        assert_eq!((v.nb, v.warps, v.vec, v.m16), (1, 8, true, false));
        let v = variant(&h100(), &problem(16, 4096, 4096, true), t);
        assert_eq!((v.nb, v.warps, v.m16, v.rotate), (4, 8, true, true));
        // M <= 8 walks K in order; rotate=0 / 1 overrides.
        assert!(!variant(&h100(), &problem(8, 4096, 4096, true), t).rotate);
        // Weight loads evict-first in L2 at M <= 4 only.
        assert!(variant(&h100(), &problem(4, 4096, 4096, true), t).evict_first);
        assert!(!variant(&h100(), &problem(5, 4096, 4096, true), t).evict_first);
        assert!(!variant(&h100(), &problem(16, 4096, 4096, true), t).evict_first);
        // The H200 (60 MiB of L2) reads weights larger than its L2 without the hint.
        let mut h200 = h100();
        h200.l2_bytes = 60 << 20;
        assert!(variant(&h100(), &problem(1, 14336, 4096, true), t).evict_first);
        assert!(!variant(&h200, &problem(1, 14336, 4096, true), t).evict_first);
        assert!(variant(&h200, &problem(1, 4096, 4096, true), t).evict_first);
        let r = Tune::parse("rotate=0");
        assert!(!variant(&h100(), &problem(16, 4096, 4096, true), r).rotate);
        let v = variant(&h100(), &problem(4, 14336, 4096, true), t);
        assert_eq!((v.nb, v.warps), (1, 4));
        // Short K: no more warps than K steps.
        assert_eq!(variant(&h100(), &problem(1, 64, 100, true), t).warps, 1);
    }

    #[test]
    fn fit_caps_the_warps_where_the_loads_would_spill() {
        let fit = Tune::parse("fit=1");
        assert_eq!(fit.fit, Some(true));
        // M = 16 against 4096 x 4096 and 4096 x 14336: 16 warps spilled, 8 hold 192 + 48.
        for k in [4096, 14336] {
            let v = variant(&h100(), &problem(16, 4096, k, true), fit);
            assert_eq!((v.nb, v.warps, v.unroll, v.m16), (4, 8, 8, true));
        }
        // M = 1 keeps its 8 warps, and 16 fit it (64 + 48 registers).
        let v = variant(&h100(), &problem(1, 4096, 4096, true), fit);
        assert_eq!(v.warps, 8);
        assert!(loads_fit(1, 8, false, 16));
        assert!(!loads_fit(2, 8, true, 16));
        assert!(!loads_fit(4, 4, true, 16) && loads_fit(4, 4, true, 8));
        // fit=0 gives back the uncapped 16 warps; an explicit warps= still wins.
        let v = variant(
            &h100(),
            &problem(16, 4096, 4096, true),
            Tune::parse("fit=0"),
        );
        assert_eq!(v.warps, 16);
        let v = variant(
            &h100(),
            &problem(16, 4096, 4096, true),
            Tune::parse("fit=1,warps=16"),
        );
        assert_eq!(v.warps, 16);
    }

    #[test]
    fn odd_strides_take_scalar_loads() {
        let mut p = problem(3, 100, 4095, true);
        assert!(supports(&h100(), &p));
        assert!(!variant(&h100(), &p, Tune::default()).vec);
        p.k = 4096;
        p.a.row_stride = 4096;
        p.b.col_stride = 4096;
        assert!(variant(&h100(), &p, Tune::default()).vec);
        p.a.ptr += 2;
        assert!(!variant(&h100(), &p, Tune::default()).vec);
    }

    #[test]
    fn other_problems_are_declined() {
        assert!(!supports(&h100(), &problem(17, 4096, 4096, true)));
        assert!(!supports(&h100(), &problem(16, 4096, 4096, false)));
        assert!(supports(
            &Arch::for_target("sm_80").unwrap(),
            &problem(16, 64, 64, true)
        ));
        assert!(!supports(
            &Arch::for_target("gfx942").unwrap(),
            &problem(16, 64, 64, true)
        ));
        let mut p = problem(16, 64, 64, true);
        p.batch = 2;
        assert!(!supports(&h100(), &p));
    }

    #[test]
    fn tune_parses_and_ignores_junk() {
        let t = Tune::parse("nb=2, warps=8;unroll=8,bogus=1,nb=3,prefetch=1");
        assert_eq!(t.prefetch, Some(true));
        assert_eq!(t.warps, Some(8));
        assert_eq!(t.unroll, Some(8));
        assert_eq!(t.nb, None);
    }

    #[test]
    fn args_and_sources() {
        let mut p = problem(10, 20, 32, true);
        p.c = Some(p.d);
        p.beta = 0.5;
        let a = crate::gemm::weight_args(&p, true).unwrap();
        assert_eq!(a[3], KernelArg::I64(32));
        assert_eq!(a[4], KernelArg::Ptr(3 << 20));
        assert_eq!(a[15], KernelArg::F32(0.5));
        let entries = catalog(&h100(), calico_cuda::device_headers()).unwrap();
        assert_eq!(entries.len(), 7);
        assert!(entries[1]
            .source
            .text
            .contains("#define CALICO_GEMV_NB 4\n"));
    }
}
