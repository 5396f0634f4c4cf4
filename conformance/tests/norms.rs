//! rms_norm, add_rms_norm, layer_norm and add_layer_norm against the f64 reference.

use calico::ops;
use calico::{DType, Device};
use calico_conformance::compare::{check_close, check_exact, row_tol};
use calico_conformance::reference;
use calico_conformance::rng::{Dist, Rng};
use calico_conformance::strategies::{row_case, RowCase, EDGE_COLS};
use calico_conformance::tensors::{
    aligned_tail, intact, poisoned_rows, round_all, rows_view, untouched_outside, upload,
    Placement, TAIL_COLS,
};
use calico_conformance::{property, report_skipped, Ctx};
use proptest::prelude::*;
use proptest::sample::select;

/// Which norm, and which optional inputs it gets.
#[derive(Debug, Clone, Copy)]
struct Norm {
    layer: bool,
    residual: bool,
    weight: bool,
    bias: bool,
}

const RMS: Norm = Norm {
    layer: false,
    residual: false,
    weight: true,
    bias: false,
};
const ADD_RMS: Norm = Norm {
    residual: true,
    ..RMS
};

fn eps() -> impl Strategy<Value = f32> {
    select(vec![1e-6f32, 1e-5, 1e-3, 0.1])
}

fn layer(residual: bool) -> impl Strategy<Value = Norm> {
    (any::<bool>(), any::<bool>()).prop_map(move |(weight, bias)| Norm {
        layer: true,
        residual,
        weight,
        bias,
    })
}

/// Runs one norm on `dev` and compares `y` (and `sum`) with the reference.
fn norm_case(dev: &Device, c: &RowCase, norm: Norm, eps: f32) -> Result<(), String> {
    let (dt, cols, n) = (c.dtype, c.cols(), c.numel());
    let mut rng = Rng::new(c.seed);
    let x = round_all(dt, &c.dist.sample(&mut rng, n));
    let r = round_all(dt, &c.dist.sample(&mut rng, n));
    // Weights around 1 with either sign; bias like the inputs.
    let w = round_all(
        dt,
        &Dist::Normal { scale: 1.0 }
            .sample(&mut rng, cols)
            .iter()
            .map(|v| 1.0 + v)
            .collect::<Vec<_>>(),
    );
    let b = round_all(dt, &Dist::Uniform { scale: 1.0 }.sample(&mut rng, cols));

    let xv = rows_view(dev, dt, &c.shape, c.x_at, &x).ctx("allocating x")?;
    let rv = rows_view(dev, dt, &c.shape, c.x_at, &r).ctx("allocating residual")?;
    let wt = upload(dev, dt, &[cols], &w).ctx("allocating weight")?;
    let bt = upload(dev, dt, &[cols], &b).ctx("allocating bias")?;
    let mut y = poisoned_rows(dev, dt, &c.shape, c.out_at).ctx("allocating y")?;
    let mut sum = poisoned_rows(dev, dt, &c.shape, c.out_at).ctx("allocating sum")?;
    let (wo, bo) = (norm.weight.then_some(&wt), norm.bias.then_some(&bt));

    let result = match (norm.layer, norm.residual) {
        (false, false) => ops::rms_norm(dev, &xv.view, &wt, eps, &mut y.view),
        (false, true) => ops::add_rms_norm(
            dev,
            &xv.view,
            &rv.view,
            &wt,
            eps,
            &mut y.view,
            &mut sum.view,
        ),
        (true, false) => ops::layer_norm(dev, &xv.view, wo, bo, eps, &mut y.view),
        (true, true) => ops::add_layer_norm(
            dev,
            &xv.view,
            &rv.view,
            wo,
            bo,
            eps,
            &mut y.view,
            &mut sum.view,
        ),
    };
    result.ctx(&format!("{norm:?}"))?;

    let s = if norm.residual {
        reference::rounded_sum(dt, &x, &r)
    } else {
        x.clone()
    };
    if norm.residual {
        check_exact("sum", &sum.view.to_f64_vec().ctx("reading sum")?, &s)?;
        untouched_outside(&sum, "sum")?;
        intact(&rv, &r, "residual")?;
    }
    let want = if norm.layer {
        reference::layer_norm(
            &s,
            cols,
            norm.weight.then_some(&w[..]),
            norm.bias.then_some(&b[..]),
            eps as f64,
        )
    } else {
        reference::rms_norm(&s, cols, &w, eps as f64)
    };
    let got = y.view.to_f64_vec().ctx("reading y")?;
    let tol = if norm.layer && dt == DType::F32 {
        row_tol(dt, cols) + centring_error(&s, cols, eps as f64)
    } else {
        row_tol(dt, cols)
    };
    check_close("y", &got, &want, tol)?;
    untouched_outside(&y, "y")?;
    intact(&xv, &x, "x")
}

/// What an f32 layer norm may lose to centring, beyond [`row_tol`]: it knows each row's mean
/// only to f32 precision, summed over the row (~u * sqrt(cols) * |mean| absolute), and divides
/// x - mean by sqrt(var + eps), so rows whose |mean| is large against that denominator lose the
/// ratio (4x margin). H100 / H200 runs saw 1.9e-5 against 1e-5 (Shifted inputs plus a residual,
/// |mean| / std ~10) and 9.0e-5 against 8e-5 (2 columns 1.7e-3 apart near 2.8, eps 1e-6).
fn centring_error(s: &[f64], cols: usize, eps: f64) -> f64 {
    let u = f64::from(f32::EPSILON) / 2.0;
    let worst = s
        .chunks(cols.max(1))
        .map(|row| {
            let (mean, var) = reference::row_moments(row);
            mean.abs() / (var + eps).sqrt().max(1e-30)
        })
        .fold(0.0, f64::max);
    4.0 * u * (cols as f64).sqrt() * worst
}

#[test]
fn rms_norm_matches_reference() {
    property("rms_norm", 24, (row_case(), eps()), |dev, (c, eps)| {
        norm_case(dev, c, RMS, *eps)
    });
}

#[test]
fn add_rms_norm_matches_reference() {
    property("add_rms_norm", 24, (row_case(), eps()), |dev, (c, eps)| {
        norm_case(dev, c, ADD_RMS, *eps)
    });
}

#[test]
fn layer_norm_matches_reference() {
    property(
        "layer_norm",
        24,
        (row_case(), layer(false), eps()),
        |dev, (c, n, eps)| norm_case(dev, c, *n, *eps),
    );
}

#[test]
fn add_layer_norm_matches_reference() {
    property(
        "add_layer_norm",
        24,
        (row_case(), layer(true), eps()),
        |dev, (c, n, eps)| norm_case(dev, c, *n, *eps),
    );
}

/// Every edge row length, every dtype, every norm, dense and misaligned: the sizes a random
/// draw might miss.
#[test]
fn norms_at_every_edge_length() {
    report_skipped("norms_at_every_edge_length");
    let norms = [
        RMS,
        ADD_RMS,
        Norm {
            layer: true,
            residual: false,
            weight: true,
            bias: true,
        },
        Norm {
            layer: true,
            residual: false,
            weight: false,
            bias: false,
        },
        Norm {
            layer: true,
            residual: true,
            weight: true,
            bias: false,
        },
    ];
    for dev in calico_conformance::backends().0 {
        for (i, &cols) in EDGE_COLS.iter().enumerate() {
            for dtype in [DType::BF16, DType::F16, DType::F32] {
                for (k, &norm) in norms.iter().enumerate() {
                    let misaligned = Placement { pad: 3, offset: 1 };
                    let c = RowCase {
                        dtype,
                        shape: vec![if cols > 1000 { 2 } else { 3 }, cols],
                        x_at: if k % 2 == 0 {
                            Placement::default()
                        } else {
                            misaligned
                        },
                        out_at: if (k + i) % 2 == 0 {
                            misaligned
                        } else {
                            Placement::default()
                        },
                        dist: Dist::Normal { scale: 1.5 },
                        seed: (i * 100 + k) as u64,
                    };
                    if let Err(e) = norm_case(&dev, &c, norm, 1e-5) {
                        panic!("backend {}: {norm:?} {dtype} cols {cols}: {e}", dev.kind());
                    }
                }
            }
        }
    }
}

/// Rows, weights and biases that end exactly at the end of their allocation: dense (weight and
/// bias always are) or 16-byte aligned rows at the tail of a larger allocation, every length
/// 1..=9 and either side of the vector and block sizes, so a vector access past the last
/// element leaves the allocation (compute-sanitizer memcheck reports it:
/// benches/gpu/sanitize.sh).
#[test]
fn norms_rows_end_at_the_allocation() {
    report_skipped("norms_rows_end_at_the_allocation");
    let norms = [
        RMS,
        ADD_RMS,
        Norm {
            layer: true,
            residual: true,
            weight: true,
            bias: true,
        },
    ];
    for dev in calico_conformance::backends().0 {
        for (i, &cols) in TAIL_COLS.iter().enumerate() {
            for dtype in [DType::BF16, DType::F16, DType::F32] {
                let tail = aligned_tail(dtype, cols);
                for (k, &norm) in norms.iter().enumerate() {
                    for (x_at, out_at) in
                        [(Placement::default(), Placement::default()), (tail, tail)]
                    {
                        let c = RowCase {
                            dtype,
                            shape: vec![2, cols],
                            x_at,
                            out_at,
                            dist: Dist::Normal { scale: 1.5 },
                            seed: (i * 10 + k) as u64,
                        };
                        if let Err(e) = norm_case(&dev, &c, norm, 1e-5) {
                            panic!(
                                "backend {}: {norm:?} {dtype} cols {cols} x {x_at:?} out {out_at:?}: {e}",
                                dev.kind()
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Odd row lengths with every row operand misaligned alike (the RMSNorm aligned-body kernel:
/// scalar head and tail around 16-byte vectors, the weight read element by element), with and
/// without the residual, every dtype, many rows so every head length occurs.
#[test]
fn rms_norm_odd_rows_aligned_body() {
    report_skipped("rms_norm_odd_rows_aligned_body");
    for dev in calico_conformance::backends().0 {
        for (i, &(rows, cols)) in [(24, 4097), (17, 1001), (9, 9), (5, 15), (3, 1)]
            .iter()
            .enumerate()
        {
            for (k, dtype) in [DType::BF16, DType::F16, DType::F32]
                .into_iter()
                .enumerate()
            {
                for norm in [RMS, ADD_RMS] {
                    let at = [Placement::default(), Placement { pad: 3, offset: 1 }][(i + k) % 2];
                    let c = RowCase {
                        dtype,
                        shape: vec![rows, cols],
                        x_at: at,
                        out_at: at,
                        dist: Dist::Normal { scale: 1.0 },
                        seed: (200 + i * 10 + k) as u64,
                    };
                    if let Err(e) = norm_case(&dev, &c, norm, 1e-5) {
                        panic!(
                            "backend {}: {norm:?} {dtype} {rows}x{cols}: {e}",
                            dev.kind()
                        );
                    }
                }
            }
        }
    }
}
