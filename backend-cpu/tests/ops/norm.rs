//! rms_norm and layer_norm, with and without the fused residual add.

use crate::common::*;
use calico_core::{DType, Tensor};
use calico_cpu::{layer_norm, rms_norm};

const EPS: f32 = 1e-5;

/// The f64 reference: per row, s = round(x + r) when a residual is given, then the norm.
fn reference(
    rms: bool,
    dtype: DType,
    x: &[f64],
    r: Option<&[f64]>,
    w: Option<&[f64]>,
    b: Option<&[f64]>,
    cols: usize,
) -> (Vec<f64>, Vec<f64>) {
    let s: Vec<f64> = match r {
        Some(r) => x
            .iter()
            .zip(r)
            .map(|(a, b)| round_to(dtype, a + b))
            .collect(),
        None => x.to_vec(),
    };
    let mut y = Vec::with_capacity(s.len());
    for row in s.chunks(cols) {
        let n = cols as f64;
        let (shift, denom) = if rms {
            (
                0.0,
                (row.iter().map(|v| v * v).sum::<f64>() / n + EPS as f64).sqrt(),
            )
        } else {
            let mean = row.iter().sum::<f64>() / n;
            (
                mean,
                (row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n + EPS as f64).sqrt(),
            )
        };
        for (j, v) in row.iter().enumerate() {
            let wj = w.map_or(1.0, |w| w[j]);
            let bj = b.map_or(0.0, |b| b[j]);
            y.push((v - shift) / denom * wj + bj);
        }
    }
    (y, s)
}

struct Case {
    rms: bool,
    dtype: DType,
    rows: usize,
    cols: usize,
    pad: usize,
    residual: bool,
    weight: bool,
    bias: bool,
}

fn run(c: &Case, seed: u64) {
    let mut rng = Rng::new(seed);
    let what = format!(
        "{} {} rows={} cols={} pad={} residual={} weight={} bias={}",
        if c.rms { "rms" } else { "layer" },
        c.dtype,
        c.rows,
        c.cols,
        c.pad,
        c.residual,
        c.weight,
        c.bias
    );
    let (x, xv) = random_rows(&mut rng, c.dtype, c.rows, c.cols, c.pad);
    let res = c
        .residual
        .then(|| random_rows(&mut rng, c.dtype, c.rows, c.cols, c.pad));
    let w = c
        .weight
        .then(|| random(&mut rng, c.dtype, &[c.cols], 0.5, 1.5));
    let b = c
        .bias
        .then(|| random(&mut rng, c.dtype, &[c.cols], -0.5, 0.5));
    let y = strided(c.dtype, c.rows, c.cols, c.pad, 3.0);
    let sum = c
        .residual
        .then(|| strided(c.dtype, c.rows, c.cols, c.pad, 3.0));
    if c.rms {
        let w = w.as_ref().expect("rms always has a weight");
        rms_norm(&x, res.as_ref().map(|r| &r.0), &w.0, EPS, &y, sum.as_ref()).unwrap();
    } else {
        layer_norm(
            &x,
            res.as_ref().map(|r| &r.0),
            w.as_ref().map(|w| &w.0),
            b.as_ref().map(|b| &b.0),
            EPS,
            &y,
            sum.as_ref(),
        )
        .unwrap();
    }
    let (want_y, want_s) = reference(
        c.rms,
        c.dtype,
        &xv,
        res.as_ref().map(|r| r.1.as_slice()),
        w.as_ref().map(|w| w.1.as_slice()),
        b.as_ref().map(|b| b.1.as_slice()),
        c.cols,
    );
    assert_close(c.dtype, &read(&y), &want_y, &format!("{what}: y"));
    assert_padding(&y, 3.0);
    if let Some(sum) = &sum {
        // The sum is x + residual rounded once; it must match to the last bit but for the
        // rare double rounding of f64 -> dtype against f32 -> dtype.
        assert_close(c.dtype, &read(sum), &want_s, &format!("{what}: sum"));
        assert_padding(sum, 3.0);
    }
}

#[test]
fn rms_norm_matches_reference() {
    let mut seed = 1;
    for dtype in DTYPES {
        for cols in EDGE_COLS {
            for (rows, pad) in [(1, 0), (5, 2), (33, 0), (9, 5)] {
                for residual in [false, true] {
                    seed += 1;
                    run(
                        &Case {
                            rms: true,
                            dtype,
                            rows,
                            cols,
                            pad,
                            residual,
                            weight: true,
                            bias: false,
                        },
                        seed,
                    );
                }
            }
        }
    }
}

#[test]
fn layer_norm_matches_reference() {
    let mut seed = 1000;
    for dtype in DTYPES {
        for cols in EDGE_COLS {
            for (rows, pad) in [(1, 0), (6, 3), (33, 0)] {
                for (residual, weight, bias) in [
                    (false, false, false),
                    (false, true, true),
                    (true, true, false),
                    (true, false, true),
                    (false, false, true),
                ] {
                    seed += 1;
                    run(
                        &Case {
                            rms: false,
                            dtype,
                            rows,
                            cols,
                            pad,
                            residual,
                            weight,
                            bias,
                        },
                        seed,
                    );
                }
            }
        }
    }
}

#[test]
fn layer_norm_is_stable_far_from_zero() {
    // A large mean with a small spread: E[x^2] - E[x]^2 would cancel catastrophically.
    let mut rng = Rng::new(7);
    let cols = 1023;
    let x = Tensor::zeros(&dev(), &[4, cols], DType::F32).unwrap();
    let xv: Vec<f64> = (0..4 * cols)
        .map(|_| 1000.0 + rng.uniform(-0.01, 0.01))
        .collect();
    fill(&x, &xv);
    let xv = read(&x);
    let y = Tensor::zeros(&dev(), &[4, cols], DType::F32).unwrap();
    layer_norm(&x, None, None, None, EPS, &y, None).unwrap();
    let (want, _) = reference(false, DType::F32, &xv, None, None, None, cols);
    assert_close(DType::F32, &read(&y), &want, "mean 1000, spread 0.01");
}

/// x and y (and residual and sum) as disjoint ranges of one storage.
#[test]
fn inputs_and_outputs_share_one_storage() {
    for dtype in DTYPES {
        let (rows, cols) = (7, 33);
        let mut rng = Rng::new(99);
        let buf = Tensor::zeros(&dev(), &[4 * rows * cols + cols], dtype).unwrap();
        let view = |i: usize| {
            buf.as_strided(&[rows, cols], &[cols, 1], i * rows * cols)
                .unwrap()
        };
        let (x, r, y, s) = (view(0), view(1), view(2), view(3));
        let w = buf.as_strided(&[cols], &[1], 4 * rows * cols).unwrap();
        let xv = rng.values(rows * cols, -2.0, 2.0);
        let rv = rng.values(rows * cols, -2.0, 2.0);
        let wv = rng.values(cols, 0.5, 1.5);
        fill(&x, &xv);
        fill(&r, &rv);
        fill(&w, &wv);
        let (xv, rv, wv) = (read(&x), read(&r), read(&w));
        rms_norm(&x, Some(&r), &w, EPS, &y, Some(&s)).unwrap();
        let (want_y, want_s) = reference(true, dtype, &xv, Some(&rv), Some(&wv), None, cols);
        assert_close(dtype, &read(&y), &want_y, "shared storage: y");
        assert_close(dtype, &read(&s), &want_s, "shared storage: sum");
        assert_eq!(read(&x), xv, "x must be untouched");
    }
}

/// y written over x itself, and y interleaved with x (alternate column blocks of one
/// matrix): the inputs are read before the outputs overwrite them.
#[test]
fn output_over_or_between_inputs() {
    let (rows, cols) = (5, 17);
    let mut rng = Rng::new(5);
    for dtype in DTYPES {
        let (x, xv) = random(&mut rng, dtype, &[rows, cols], -2.0, 2.0);
        let (w, wv) = random(&mut rng, dtype, &[cols], 0.5, 1.5);
        rms_norm(&x, None, &w, EPS, &x, None).unwrap();
        let (want, _) = reference(true, dtype, &xv, None, Some(&wv), None, cols);
        assert_close(dtype, &read(&x), &want, "y == x");

        let parent = Tensor::zeros(&dev(), &[rows, 2 * cols], dtype).unwrap();
        let (x, y) = (
            parent.narrow(1, 0, cols).unwrap(),
            parent.narrow(1, cols, cols).unwrap(),
        );
        fill(&x, &xv);
        let before = read(&x);
        layer_norm(&x, None, Some(&w), None, EPS, &y, None).unwrap();
        let (want, _) = reference(false, dtype, &before, None, Some(&wv), None, cols);
        assert_close(dtype, &read(&y), &want, "y between x's rows");
        assert_eq!(read(&x), before, "x must be untouched");
    }
}
