//! Bad inputs give the right `Err` variant, never a panic, and leave outputs unwritten.

use calico::ops::{self, AttentionOptions, GemmOptions, KvCache, RopeMode};
use calico::{BackendKind, DType, Device, Error, Tensor};
use calico_conformance::{backends, report_skipped};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The variant an input error must produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Shape,
    Stride,
    DType,
    Device,
    Aliasing,
    Unsupported,
}

fn variant(e: &Error) -> Option<Want> {
    Some(match e {
        Error::Shape(_) => Want::Shape,
        Error::Stride(_) => Want::Stride,
        Error::DType { .. } => Want::DType,
        Error::DeviceMismatch(_) => Want::Device,
        Error::Aliasing(_) => Want::Aliasing,
        Error::Unsupported(_) => Want::Unsupported,
        _ => return None,
    })
}

/// Collects every failed expectation of a test, so one run reports them all.
#[derive(Default)]
struct Expect {
    failures: Vec<String>,
}

impl Expect {
    fn err(
        &mut self,
        dev: &Device,
        what: &str,
        want: Want,
        call: impl FnOnce() -> calico::Result<()>,
    ) {
        let label = format!("backend {}: {what}", dev.kind());
        match catch_unwind(AssertUnwindSafe(call)) {
            Err(_) => self
                .failures
                .push(format!("{label}: panicked (expected Err {want:?})")),
            Ok(Ok(())) => self
                .failures
                .push(format!("{label}: returned Ok (expected Err {want:?})")),
            Ok(Err(e)) if variant(&e) != Some(want) => self
                .failures
                .push(format!("{label}: expected Err {want:?}, got `{e}`")),
            Ok(Err(_)) => {}
        }
    }

    /// `t` still holds only the NaN it was created with: a failed call wrote nothing.
    fn unwritten(&mut self, dev: &Device, what: &str, t: &Tensor) {
        match t.to_f64_vec() {
            Ok(v) if v.iter().all(|x| x.is_nan()) => {}
            Ok(_) => self.failures.push(format!(
                "backend {}: {what}: output written by a failed call",
                dev.kind()
            )),
            Err(e) => self.failures.push(format!(
                "backend {}: {what}: reading output: {e}",
                dev.kind()
            )),
        }
    }

    fn finish(self, test: &str) {
        assert!(
            self.failures.is_empty(),
            "{test}:\n{}",
            self.failures.join("\n")
        );
    }
}

fn filled(dev: &Device, dtype: DType, shape: &[usize], v: f64) -> Tensor {
    let n: usize = shape.iter().product();
    let t = dev.zeros(shape, dtype).expect("alloc");
    if dtype.is_standard_float() {
        calico_conformance::tensors::write(&t, &vec![v; n]).expect("write");
    }
    t
}

fn t(dev: &Device, dtype: DType, shape: &[usize]) -> Tensor {
    filled(dev, dtype, shape, 0.5)
}

fn nan(dev: &Device, dtype: DType, shape: &[usize]) -> Tensor {
    filled(dev, dtype, shape, f64::NAN)
}

const BF: DType = DType::BF16;

#[test]
fn norm_errors() {
    report_skipped("norm_errors");
    let mut ex = Expect::default();
    for dev in backends().0 {
        let d = &dev;
        let x = t(d, BF, &[4, 8]);
        let w = t(d, BF, &[8]);
        let mut y = nan(d, BF, &[4, 8]);
        let mut sum = nan(d, BF, &[4, 8]);
        ex.err(
            d,
            "rms_norm weight of the wrong length",
            Want::Shape,
            || ops::rms_norm(d, &x, &t(d, BF, &[7]), 1e-5, &mut y),
        );
        ex.err(d, "rms_norm y of another shape", Want::Shape, || {
            ops::rms_norm(d, &x, &w, 1e-5, &mut nan(d, BF, &[4, 9]))
        });
        ex.err(d, "rms_norm weight dtype differs", Want::DType, || {
            ops::rms_norm(d, &x, &t(d, DType::F16, &[8]), 1e-5, &mut y)
        });
        ex.err(d, "rms_norm y dtype differs", Want::DType, || {
            ops::rms_norm(d, &x, &w, 1e-5, &mut nan(d, DType::F32, &[4, 8]))
        });
        ex.err(d, "rms_norm fp8 input", Want::DType, || {
            ops::rms_norm(
                d,
                &t(d, DType::F8E4M3, &[4, 8]),
                &t(d, DType::F8E4M3, &[8]),
                1e-5,
                &mut t(d, DType::F8E4M3, &[4, 8]),
            )
        });
        ex.err(d, "rms_norm negative eps", Want::Unsupported, || {
            ops::rms_norm(d, &x, &w, -1.0, &mut y)
        });
        ex.err(d, "rms_norm NaN eps", Want::Unsupported, || {
            ops::rms_norm(d, &x, &w, f32::NAN, &mut y)
        });
        ex.err(d, "rms_norm rank-0 input", Want::Shape, || {
            ops::rms_norm(d, &t(d, BF, &[]), &w, 1e-5, &mut nan(d, BF, &[]))
        });
        let xt = t(d, BF, &[8, 4]).transpose(0, 1).expect("transpose");
        ex.err(
            d,
            "rms_norm transposed input (last dim not contiguous)",
            Want::Stride,
            || ops::rms_norm(d, &xt, &w, 1e-5, &mut y),
        );
        // [2, 3, 8] whose leading strides (100, 8) do not collapse into one row stride.
        let parent = t(d, BF, &[300]);
        let ragged = parent
            .as_strided(&[2, 3, 8], &[100, 8, 1], 0)
            .expect("view");
        ex.err(
            d,
            "rms_norm rows that do not collapse",
            Want::Stride,
            || ops::rms_norm(d, &ragged, &w, 1e-5, &mut nan(d, BF, &[2, 3, 8])),
        );
        ex.err(d, "rms_norm y is x", Want::Aliasing, || {
            ops::rms_norm(d, &x, &w, 1e-5, &mut x.clone())
        });
        let wide = t(d, BF, &[5, 8]);
        let (lo, hi) = (
            wide.narrow(0, 0, 4).expect("narrow"),
            wide.narrow(0, 1, 4).expect("narrow"),
        );
        ex.err(d, "rms_norm y partly overlaps x", Want::Aliasing, || {
            ops::rms_norm(d, &lo, &w, 1e-5, &mut hi.clone())
        });
        ex.err(d, "rms_norm y overlaps weight", Want::Aliasing, || {
            let wy = t(d, BF, &[8]);
            ops::rms_norm(d, &t(d, BF, &[8]), &wy, 1e-5, &mut wy.clone())
        });
        let r = t(d, BF, &[4, 8]);
        ex.err(
            d,
            "add_rms_norm residual of another shape",
            Want::Shape,
            || ops::add_rms_norm(d, &x, &t(d, BF, &[4, 7]), &w, 1e-5, &mut y, &mut sum),
        );
        ex.err(d, "add_rms_norm sum overlaps y", Want::Aliasing, || {
            let both = nan(d, BF, &[4, 8]);
            ops::add_rms_norm(d, &x, &r, &w, 1e-5, &mut both.clone(), &mut both.clone())
        });
        ex.err(
            d,
            "add_rms_norm sum is the residual",
            Want::Aliasing,
            || ops::add_rms_norm(d, &x, &r, &w, 1e-5, &mut y, &mut r.clone()),
        );
        ex.err(d, "add_rms_norm sum dtype differs", Want::DType, || {
            ops::add_rms_norm(
                d,
                &x,
                &r,
                &w,
                1e-5,
                &mut y,
                &mut nan(d, DType::F16, &[4, 8]),
            )
        });
        ex.err(
            d,
            "layer_norm bias of the wrong length",
            Want::Shape,
            || ops::layer_norm(d, &x, Some(&w), Some(&t(d, BF, &[9])), 1e-5, &mut y),
        );
        ex.err(d, "layer_norm bias dtype differs", Want::DType, || {
            ops::layer_norm(d, &x, None, Some(&t(d, DType::F32, &[8])), 1e-5, &mut y)
        });
        ex.err(
            d,
            "add_layer_norm y is the residual",
            Want::Aliasing,
            || ops::add_layer_norm(d, &x, &r, None, None, 1e-5, &mut r.clone(), &mut sum),
        );
        ex.unwritten(d, "norm y after errors", &y);
        ex.unwritten(d, "norm sum after errors", &sum);
    }
    ex.finish("norm_errors");
}

#[test]
fn softmax_errors() {
    report_skipped("softmax_errors");
    let mut ex = Expect::default();
    for dev in backends().0 {
        let d = &dev;
        let x = t(d, BF, &[3, 16]);
        let mut y = nan(d, BF, &[3, 16]);
        ex.err(d, "softmax y of another shape", Want::Shape, || {
            ops::softmax(d, &x, &mut nan(d, BF, &[3, 15]))
        });
        ex.err(d, "softmax y dtype differs", Want::DType, || {
            ops::softmax(d, &x, &mut nan(d, DType::F32, &[3, 16]))
        });
        ex.err(d, "softmax fp8 input", Want::DType, || {
            ops::softmax(
                d,
                &t(d, DType::F8E5M2, &[3, 16]),
                &mut t(d, DType::F8E5M2, &[3, 16]),
            )
        });
        ex.err(d, "softmax rank-0 input", Want::Shape, || {
            ops::softmax(d, &t(d, BF, &[]), &mut nan(d, BF, &[]))
        });
        let xt = t(d, BF, &[16, 3]).transpose(0, 1).expect("transpose");
        ex.err(d, "softmax transposed input", Want::Stride, || {
            ops::softmax(d, &xt, &mut y)
        });
        ex.err(d, "softmax transposed output", Want::Stride, || {
            ops::softmax(
                d,
                &x,
                &mut nan(d, BF, &[16, 3]).transpose(0, 1).expect("transpose"),
            )
        });
        ex.err(d, "softmax in place", Want::Aliasing, || {
            ops::softmax(d, &x, &mut x.clone())
        });
        ex.unwritten(d, "softmax y after errors", &y);
    }
    ex.finish("softmax_errors");
}

#[test]
fn rope_errors() {
    report_skipped("rope_errors");
    let mut ex = Expect::default();
    for dev in backends().0 {
        let d = &dev;
        let f = DType::F32;
        let (x, cos, sin) = (t(d, BF, &[4, 2, 8]), t(d, f, &[6, 4]), t(d, f, &[6, 4]));
        let mut y = nan(d, BF, &[4, 2, 8]);
        let mode = RopeMode::HalfSplit;
        ex.err(d, "rope odd head dim", Want::Shape, || {
            ops::rope(
                d,
                &t(d, BF, &[4, 2, 7]),
                &t(d, f, &[6, 3]),
                &t(d, f, &[6, 3]),
                0,
                mode,
                &mut nan(d, BF, &[4, 2, 7]),
            )
        });
        ex.err(d, "rope too few positions", Want::Shape, || {
            ops::rope(d, &x, &cos, &sin, 3, mode, &mut y)
        });
        ex.err(d, "rope cos with the wrong width", Want::Shape, || {
            ops::rope(d, &x, &t(d, f, &[6, 8]), &sin, 0, mode, &mut y)
        });
        ex.err(d, "rope cos not contiguous", Want::Shape, || {
            ops::rope(
                d,
                &x,
                &t(d, f, &[4, 6]).transpose(0, 1).expect("transpose"),
                &sin,
                0,
                mode,
                &mut y,
            )
        });
        ex.err(d, "rope cos not f32", Want::DType, || {
            ops::rope(d, &x, &t(d, BF, &[6, 4]), &sin, 0, mode, &mut y)
        });
        ex.err(d, "rope rank-2 input", Want::Shape, || {
            ops::rope(
                d,
                &t(d, BF, &[4, 8]),
                &cos,
                &sin,
                0,
                mode,
                &mut nan(d, BF, &[4, 8]),
            )
        });
        ex.err(d, "rope y of another shape", Want::Shape, || {
            ops::rope(d, &x, &cos, &sin, 0, mode, &mut nan(d, BF, &[4, 1, 8]))
        });
        ex.err(d, "rope y dtype differs", Want::DType, || {
            ops::rope(
                d,
                &x,
                &cos,
                &sin,
                0,
                mode,
                &mut nan(d, DType::F16, &[4, 2, 8]),
            )
        });
        ex.err(d, "rope fp8 input", Want::DType, || {
            ops::rope(
                d,
                &t(d, DType::F8E4M3, &[4, 2, 8]),
                &cos,
                &sin,
                0,
                mode,
                &mut t(d, DType::F8E4M3, &[4, 2, 8]),
            )
        });
        // [4, 2, 8] over memory [4, 8, 2]: the head dimension is not contiguous.
        let xt = t(d, BF, &[4, 8, 2]).transpose(1, 2).expect("transpose");
        ex.err(d, "rope last dim not contiguous", Want::Stride, || {
            ops::rope(d, &xt, &cos, &sin, 0, mode, &mut y)
        });
        ex.err(d, "rope in place", Want::Aliasing, || {
            ops::rope(d, &x, &cos, &sin, 0, mode, &mut x.clone())
        });
        // offset + sequence length past usize: a wrapped sum must not pass the table check.
        ex.err(
            d,
            "rope position offset that overflows",
            Want::Shape,
            || ops::rope(d, &x, &cos, &sin, usize::MAX - 1, mode, &mut y),
        );
        ex.unwritten(d, "rope y after errors", &y);
    }
    ex.finish("rope_errors");
}

#[test]
fn gemm_errors() {
    report_skipped("gemm_errors");
    let mut ex = Expect::default();
    for dev in backends().0 {
        let d = &dev;
        let (a, b) = (t(d, BF, &[8, 16]), t(d, BF, &[16, 4]));
        let mut out = nan(d, DType::F32, &[8, 4]);
        let plain = GemmOptions::default();
        ex.err(d, "gemm beta != 0 without C", Want::Shape, || {
            ops::gemm(d, &a, &b, &mut out, &GemmOptions { beta: 1.0, ..plain })
        });
        ex.err(d, "gemm inner dimensions differ", Want::Shape, || {
            ops::matmul(d, &a, &t(d, BF, &[15, 4]), &mut out)
        });
        ex.err(d, "gemm D of the wrong shape", Want::Shape, || {
            ops::matmul(d, &a, &b, &mut nan(d, DType::F32, &[8, 5]))
        });
        ex.err(d, "gemm rank-1 A", Want::Shape, || {
            ops::matmul(d, &t(d, BF, &[16]), &b, &mut out)
        });
        ex.err(d, "gemm batch counts differ", Want::Shape, || {
            ops::matmul(
                d,
                &t(d, BF, &[2, 8, 16]),
                &t(d, BF, &[3, 16, 4]),
                &mut nan(d, DType::F32, &[2, 8, 4]),
            )
        });
        ex.err(d, "gemm batched A with unbatched D", Want::Shape, || {
            ops::matmul(d, &t(d, BF, &[2, 8, 16]), &b, &mut out)
        });
        ex.err(d, "gemm f32 A", Want::DType, || {
            ops::matmul(
                d,
                &t(d, DType::F32, &[8, 16]),
                &t(d, DType::F32, &[16, 4]),
                &mut out,
            )
        });
        ex.err(d, "gemm fp8 A and B", Want::DType, || {
            ops::matmul(
                d,
                &t(d, DType::F8E4M3, &[8, 16]),
                &t(d, DType::F8E4M3, &[16, 4]),
                &mut out,
            )
        });
        ex.err(d, "gemm B dtype differs from A", Want::DType, || {
            ops::matmul(d, &a, &t(d, DType::F16, &[16, 4]), &mut out)
        });
        ex.err(d, "gemm fp8 D", Want::DType, || {
            ops::matmul(d, &a, &b, &mut t(d, DType::F8E5M2, &[8, 4]))
        });
        let c16 = t(d, DType::F16, &[8, 4]);
        ex.err(d, "gemm C dtype differs from D", Want::DType, || {
            ops::gemm(
                d,
                &a,
                &b,
                &mut out,
                &GemmOptions {
                    beta: 1.0,
                    c: Some(&c16),
                    ..plain
                },
            )
        });
        let c_bad = t(d, DType::F32, &[8, 3]);
        ex.err(d, "gemm C of the wrong shape", Want::Shape, || {
            ops::gemm(
                d,
                &a,
                &b,
                &mut out,
                &GemmOptions {
                    beta: 1.0,
                    c: Some(&c_bad),
                    ..plain
                },
            )
        });
        let bias5 = t(d, DType::F32, &[5]);
        ex.err(d, "gemm bias of the wrong length", Want::Shape, || {
            ops::gemm(
                d,
                &a,
                &b,
                &mut out,
                &GemmOptions {
                    bias: Some(&bias5),
                    ..plain
                },
            )
        });
        let bias_bf = t(d, BF, &[4]);
        ex.err(d, "gemm bias dtype differs from D", Want::DType, || {
            ops::gemm(
                d,
                &a,
                &b,
                &mut out,
                &GemmOptions {
                    bias: Some(&bias_bf),
                    ..plain
                },
            )
        });
        ex.err(d, "gemm NaN alpha", Want::Unsupported, || {
            ops::gemm(
                d,
                &a,
                &b,
                &mut out,
                &GemmOptions {
                    alpha: f32::NAN,
                    ..plain
                },
            )
        });
        // D as a view of A's own storage.
        let big = t(d, BF, &[8, 16]);
        ex.err(d, "gemm D overlaps A", Want::Aliasing, || {
            ops::matmul(d, &big, &b, &mut big.narrow(1, 0, 4).expect("narrow"))
        });
        let bias_d = t(d, DType::F32, &[8, 4]);
        ex.err(d, "gemm D overlaps the bias", Want::Aliasing, || {
            let bias = bias_d.as_strided(&[4], &[1], 0).expect("view");
            ops::gemm(
                d,
                &a,
                &b,
                &mut bias_d.clone(),
                &GemmOptions {
                    bias: Some(&bias),
                    ..plain
                },
            )
        });
        let cd = nan(d, DType::F32, &[9, 4]);
        ex.err(d, "gemm C partly overlaps D", Want::Aliasing, || {
            let c = cd.narrow(0, 1, 8).expect("narrow");
            ops::gemm(
                d,
                &a,
                &b,
                &mut cd.narrow(0, 0, 8).expect("narrow"),
                &GemmOptions {
                    beta: 1.0,
                    c: Some(&c),
                    ..plain
                },
            )
        });
        ex.unwritten(d, "gemm D after errors", &out);
    }
    ex.finish("gemm_errors");
}

/// Outputs whose elements overlap each other (rows broadcast from one row of memory, rows
/// closer together than their length, heads on one head's memory) are an `Aliasing` error on
/// every backend, before anything is written: the CPU backend cannot write them and GPU threads
/// would race on them. The check is the ops' own, before any backend runs.
#[test]
fn outputs_that_overlap_themselves_are_errors() {
    report_skipped("outputs_that_overlap_themselves_are_errors");
    let mut ex = Expect::default();
    for dev in backends().0 {
        let d = &dev;
        let (x, r, w) = (t(d, BF, &[4, 8]), t(d, BF, &[4, 8]), t(d, BF, &[8]));
        let mut y = nan(d, BF, &[4, 8]);
        let one_row = nan(d, BF, &[8]);
        let close = nan(d, BF, &[20]);
        let broadcast = || one_row.as_strided(&[4, 8], &[0, 1], 0).expect("view");
        let squeezed = || close.as_strided(&[4, 8], &[4, 1], 0).expect("view");
        ex.err(d, "rms_norm y rows on one row", Want::Aliasing, || {
            ops::rms_norm(d, &x, &w, 1e-5, &mut broadcast())
        });
        ex.err(d, "rms_norm y rows 4 apart", Want::Aliasing, || {
            ops::rms_norm(d, &x, &w, 1e-5, &mut squeezed())
        });
        ex.err(
            d,
            "add_rms_norm sum rows on one row",
            Want::Aliasing,
            || ops::add_rms_norm(d, &x, &r, &w, 1e-5, &mut y, &mut broadcast()),
        );
        ex.err(d, "softmax y rows 4 apart", Want::Aliasing, || {
            ops::softmax(d, &x, &mut squeezed())
        });
        let (cos, sin) = (t(d, DType::F32, &[4, 4]), t(d, DType::F32, &[4, 4]));
        ex.err(d, "rope y heads on one head", Want::Aliasing, || {
            let mut heads = one_row.as_strided(&[4, 2, 8], &[0, 0, 1], 0).expect("view");
            let x = t(d, BF, &[4, 2, 8]);
            ops::rope(d, &x, &cos, &sin, 0, RopeMode::HalfSplit, &mut heads)
        });
        ex.err(d, "gemm D rows on one row", Want::Aliasing, || {
            ops::matmul(d, &x, &t(d, BF, &[8, 8]), &mut broadcast())
        });
        let (q, k, v) = (
            t(d, BF, &[1, 2, 4, 64]),
            t(d, BF, &[1, 2, 4, 64]),
            t(d, BF, &[1, 2, 4, 64]),
        );
        let lse = t(d, DType::F32, &[1, 2, 4]);
        let rows = nan(d, BF, &[2 * 64]);
        // [1, 2, 4, 64] with every query row of a head on one row of memory.
        let one_row_a_head = || {
            rows.as_strided(&[1, 2, 4, 64], &[128, 64, 0, 1], 0)
                .expect("view")
        };
        let opts = AttentionOptions::default();
        ex.err(d, "attention o rows on one row", Want::Aliasing, || {
            ops::attention(
                d,
                &q,
                &k,
                &v,
                &opts,
                &mut one_row_a_head(),
                &mut lse.clone(),
            )
        });
        ex.err(
            d,
            "attention_backward dk rows on one row",
            Want::Aliasing,
            || {
                let (o, d_o) = (t(d, BF, &[1, 2, 4, 64]), t(d, BF, &[1, 2, 4, 64]));
                let (mut dq, mut dv) = (nan(d, BF, &[1, 2, 4, 64]), nan(d, BF, &[1, 2, 4, 64]));
                let mut dk = one_row_a_head();
                ops::attention_backward(
                    d, &q, &k, &v, &o, &lse, &d_o, &opts, &mut dq, &mut dk, &mut dv,
                )
            },
        );
        ex.err(
            d,
            "attention_decode o heads on one head",
            Want::Aliasing,
            || {
                let q = t(d, BF, &[1, 2, 1, 64]);
                let seq_lens = d.tensor(&[4i32], &[1]).expect("seq_lens");
                let cache = KvCache::Contiguous {
                    k: &k,
                    v: &v,
                    seq_lens: &seq_lens,
                };
                let mut o = rows
                    .as_strided(&[1, 2, 1, 64], &[128, 0, 64, 1], 0)
                    .expect("view");
                ops::attention_decode(
                    d,
                    &q,
                    &cache,
                    &opts,
                    &mut o,
                    &mut nan(d, DType::F32, &[1, 2, 1]),
                )
            },
        );
        ex.unwritten(d, "y after errors", &y);
        ex.unwritten(d, "the one row after errors", &one_row);
        ex.unwritten(d, "the close rows after errors", &close);
        ex.unwritten(d, "the attention rows after errors", &rows);
    }
    ex.finish("outputs_that_overlap_themselves_are_errors");
}

/// Shapes whose element count passes `usize`, or whose bytes pass `isize::MAX` (Rust's bound
/// on an allocation, kept by views that repeat elements too), are a Shape error wherever a
/// tensor is made: a
/// wrapped count once let such a shape pass as an empty one (2^69 elements wrap to 0) or as a
/// small one (2^64 + 2^32 wrap to 2^32), whose rows then reach past the end of its buffer.
#[test]
fn shapes_past_usize_are_errors() {
    report_skipped("shapes_past_usize_are_errors");
    let mut ex = Expect::default();
    for dev in backends().0 {
        let d = &dev;
        // 2^33 * 2^33 * 8 = 2^69 elements (2^64 * 32: a wrapped count of 0).
        let huge = [1usize << 33, 1 << 33, 8];
        let buf = t(d, BF, &[8]);
        ex.err(d, "zeros of 2^69 elements", Want::Shape, || {
            d.zeros(&huge, BF).map(drop)
        });
        ex.err(d, "a slice seen as 2^69 elements", Want::Shape, || {
            d.tensor::<f32>(&[], &huge).map(drop)
        });
        ex.err(d, "a broadcast view of 2^69 elements", Want::Shape, || {
            buf.as_strided(&huge, &[0, 0, 0], 0).map(drop)
        });
        ex.err(d, "a reshape to 2^66 elements", Want::Shape, || {
            buf.reshape(&[1 << 33, 1 << 33]).map(drop)
        });
        // Views that repeat elements count their logical bytes: up to isize::MAX is a valid
        // input, past it a Shape error (byte counts derived from the shape could wrap).
        let most = isize::MAX as usize / 2;
        if buf
            .as_strided(&[most, 1], &[0, 0], 0)
            .map(|w| w.numel())
            .ok()
            != Some(most)
        {
            ex.failures.push(format!(
                "backend {}: a broadcast view of isize::MAX bytes was refused",
                d.kind()
            ));
        }
        ex.err(
            d,
            "a broadcast view past isize::MAX bytes",
            Want::Shape,
            || buf.as_strided(&[most + 1, 1], &[0, 0], 0).map(drop),
        );
    }
    ex.finish("shapes_past_usize_are_errors");
}

/// Tensors of another device: needs two backends (CPU + CPU is one device).
#[test]
fn device_mismatch_errors() {
    report_skipped("device_mismatch_errors");
    let devices = backends().0;
    let (Some(gpu), Some(cpu)) = (
        devices.iter().find(|d| d.kind() != BackendKind::Cpu),
        devices.iter().find(|d| d.kind() == BackendKind::Cpu),
    ) else {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "[device_mismatch_errors] skipped: needs a second backend besides the CPU (CPU + CPU is one device)"
        );
        return;
    };
    let mut ex = Expect::default();
    for (here, there) in [(gpu, cpu), (cpu, gpu)] {
        let (x, w) = (t(here, BF, &[4, 8]), t(here, BF, &[8]));
        let (x_far, w_far) = (t(there, BF, &[4, 8]), t(there, BF, &[8]));
        let mut y = nan(here, BF, &[4, 8]);
        ex.err(
            here,
            "rms_norm weight on another device",
            Want::Device,
            || ops::rms_norm(here, &x, &w_far, 1e-5, &mut y),
        );
        ex.err(
            here,
            "rms_norm every tensor on another device",
            Want::Device,
            || ops::rms_norm(here, &x_far, &w_far, 1e-5, &mut nan(there, BF, &[4, 8])),
        );
        ex.err(here, "softmax y on another device", Want::Device, || {
            ops::softmax(here, &x, &mut nan(there, BF, &[4, 8]))
        });
        ex.err(
            here,
            "layer_norm bias on another device",
            Want::Device,
            || ops::layer_norm(here, &x, Some(&w), Some(&w_far), 1e-5, &mut y),
        );
        let (cos, sin) = (t(there, DType::F32, &[4, 4]), t(here, DType::F32, &[4, 4]));
        ex.err(here, "rope cos on another device", Want::Device, || {
            ops::rope(
                here,
                &t(here, BF, &[4, 1, 8]),
                &cos,
                &sin,
                0,
                RopeMode::Interleaved,
                &mut nan(here, BF, &[4, 1, 8]),
            )
        });
        ex.err(here, "matmul B on another device", Want::Device, || {
            ops::matmul(
                here,
                &x,
                &t(there, BF, &[8, 2]),
                &mut nan(here, DType::F32, &[4, 2]),
            )
        });
        ex.unwritten(here, "y after device errors", &y);
    }
    ex.finish("device_mismatch_errors");
}

/// Zero rows are legal: Ok, and nothing to do.
#[test]
fn empty_inputs_are_ok() {
    report_skipped("empty_inputs_are_ok");
    for dev in backends().0 {
        let d = &dev;
        let (x, w) = (t(d, BF, &[0, 8]), t(d, BF, &[8]));
        let result = ops::rms_norm(d, &x, &w, 1e-5, &mut t(d, BF, &[0, 8]))
            .and_then(|()| ops::softmax(d, &x, &mut t(d, BF, &[0, 8])))
            .and_then(|()| {
                ops::matmul(
                    d,
                    &t(d, BF, &[0, 8]),
                    &t(d, BF, &[8, 3]),
                    &mut t(d, DType::F32, &[0, 3]),
                )
            });
        if let Err(e) = result {
            panic!("backend {}: an empty input returned Err: {e}", dev.kind());
        }
    }
}
