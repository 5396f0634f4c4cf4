//! bf16 GEMM in TFLOP/s: Calico and, on CUDA, cuBLASLt on the same buffers and stream.

use crate::accounting::gemm_flops;
use crate::cases::GemmSpec;
use crate::cublaslt::CublasLt;
use crate::report::{gemm_target_ratio, GemmCase, Timed};
use crate::rng::{random_tensor, XorShift};
use crate::timing::{rotation_copies, time_runs, Pad, Plan};
use calico::{ops, DType, Device, Result, Tensor};

/// A, W and D of one rotation copy, and B = W^T as a strided view (torch Linear's layout).
struct Set {
    a: Tensor,
    w: Tensor,
    b: Tensor,
    d: Tensor,
}

/// The baseline as the suite sees it: absent (not CUDA), unusable (with why), or ready.
#[derive(Debug)]
pub enum Baseline {
    Absent,
    Unavailable(String),
    Ready(CublasLt),
}

impl Baseline {
    pub fn new(dev: &Device) -> Baseline {
        match CublasLt::new(dev) {
            Ok(None) => Baseline::Absent,
            Ok(Some(lt)) => Baseline::Ready(lt),
            Err(why) => Baseline::Unavailable(why),
        }
    }
}

/// Times one case with Calico and the baseline.
pub fn run_case(
    dev: &Device,
    spec: &GemmSpec,
    plan: &Plan,
    pad: Option<&Pad>,
    rng: &mut XorShift,
    baseline: &Baseline,
) -> GemmCase {
    let (m, n, k) = (spec.m, spec.n, spec.k);
    let set_bytes = 2 * (m * k + n * k + m * n) as u64;
    let copies = if *plan == Plan::TINY {
        2
    } else {
        rotation_copies(set_bytes, dev.arch().l2_bytes)
    };
    let mut case = skipped_case(spec, Timed::not_available("not run"));
    case.rotation_copies = copies;
    if dev.as_gpu().is_none() {
        // The GEMV's bandwidth target is the GPUs' (docs/targets.md); on the CPU the case
        // reports its bandwidth without one.
        case.target_pct_of_copy = None;
    }
    let mut sets = match make_sets(dev, spec, copies, rng) {
        Ok(sets) => sets,
        Err(e) => {
            case.calico = Timed::from_error(&e);
            return case;
        }
    };
    case.calico = timed(time_runs(dev, plan, pad, &mut |i| {
        let n = sets.len();
        let s = &mut sets[i % n];
        ops::matmul(dev, &s.a, &s.b, &mut s.d)
    }));
    if let Some((am, an, ak)) = spec.aligned() {
        let aligned = GemmSpec {
            group: "square",
            m: am,
            n: an,
            k: ak,
        };
        let copies = rotation_copies(
            2 * (am * ak + an * ak + am * an) as u64,
            dev.arch().l2_bytes,
        );
        case.aligned = Some(match make_sets(dev, &aligned, copies, rng) {
            Err(e) => Timed::from_error(&e),
            Ok(mut sets) => timed(time_runs(dev, plan, pad, &mut |i| {
                let n = sets.len();
                let s = &mut sets[i % n];
                ops::matmul(dev, &s.a, &s.b, &mut s.d)
            })),
        });
    }
    case.cublaslt = match baseline {
        Baseline::Absent => None,
        Baseline::Unavailable(why) => Some(Timed::not_available(why.clone())),
        Baseline::Ready(lt) => Some(match lt.plan(m, n, k) {
            Err(why) => Timed::not_available(why),
            Ok(g) => timed(time_runs(dev, plan, pad, &mut |i| {
                let s = &sets[i % sets.len()];
                g.run(&s.a, &s.w, &s.d)
            })),
        }),
    };
    case
}

/// A case that was not timed, with `why` as Calico's entry.
pub fn skipped_case(spec: &GemmSpec, why: Timed) -> GemmCase {
    let (m, n, k) = (spec.m, spec.n, spec.k);
    GemmCase {
        name: spec.name(),
        group: spec.group.to_string(),
        m,
        n,
        k,
        flops: gemm_flops(m, n, k),
        rotation_copies: 0,
        calico: why,
        calico_tflops: None,
        pct_of_peak: None,
        cublaslt: None,
        cublaslt_tflops: None,
        ratio_cublaslt: None,
        target_ratio: gemm_target_ratio(spec.group, m, n, k),
        torch_ms: None,
        torch_tflops: None,
        ratio_torch: None,
        target_pct_of_copy: (spec.group == "gemv").then_some(GEMV_TARGET_PCT_OF_COPY),
        aligned_shape: spec.aligned(),
        target_vs_aligned: spec.aligned().map(|_| ODD_TARGET_VS_ALIGNED),
        target_vs_torch: (spec.group == "odd" && m == n && n == k).then_some(ODD_TARGET_VS_TORCH),
        ..GemmCase::extras_none()
    }
}

/// Decode GEMV: weight bytes per second as a share of the copy bandwidth (docs/targets.md).
pub const GEMV_TARGET_PCT_OF_COPY: f64 = 80.0;
/// Odd shapes (issue 8): at 4097^3 and 8191^3 >= 1.5x torch.matmul; every odd shape >= 0.85x
/// Calico's own speed at the nearest aligned shape.
pub const ODD_TARGET_VS_TORCH: f64 = 1.5;
pub const ODD_TARGET_VS_ALIGNED: f64 = 0.85;

fn timed(r: Result<crate::stats::Stats>) -> Timed {
    match r {
        Ok(s) => Timed::ok(s),
        Err(e) => Timed::from_error(&e),
    }
}

fn make_sets(dev: &Device, spec: &GemmSpec, copies: usize, rng: &mut XorShift) -> Result<Vec<Set>> {
    let (m, n, k) = (spec.m, spec.n, spec.k);
    (0..copies)
        .map(|_| {
            let a = random_tensor(dev, rng, &[m, k], DType::BF16, -1.0, 1.0)?;
            let w = random_tensor(dev, rng, &[n, k], DType::BF16, -1.0, 1.0)?;
            let b = w.transpose(0, 1)?;
            let d = dev.zeros(&[m, n], DType::BF16)?;
            Ok(Set { a, w, b, d })
        })
        .collect()
}
