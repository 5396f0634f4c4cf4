//! gemm: strides, batches, odd sizes, alpha/beta/bias and the epilogues.

use crate::common::*;
use calico_core::{DType, Tensor};
use calico_cpu::{gemm, Epilogue};

/// erf in f64: Taylor series near 0, Lentz's continued fraction for erfc further out.
fn erf(x: f64) -> f64 {
    let z = x.abs();
    let r = if z < 3.0 {
        let (mut term, mut sum, mut n) = (z, z, 0.0);
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -z * z / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc(z) = exp(-z^2)/sqrt(pi) * 1/(z + (1/2)/(z + 1/(z + (3/2)/(z + ...))))
        let mut f = z;
        for k in (1..200).rev() {
            f = z + (k as f64 / 2.0) / f;
        }
        1.0 - (-z * z).exp() / std::f64::consts::PI.sqrt() / f
    };
    r.copysign(x)
}

fn act(e: Epilogue, v: f64) -> f64 {
    match e {
        Epilogue::None => v,
        Epilogue::Gelu => 0.5 * v * (1.0 + erf(v / std::f64::consts::SQRT_2)),
        Epilogue::Silu => v / (1.0 + (-v).exp()),
    }
}

/// Reads a [batch?, rows, cols] tensor as `batch` row-major matrices (a rank-2 tensor is
/// repeated `batch` times).
fn matrices(t: &Tensor, batch: usize) -> Vec<f64> {
    let v = read(t);
    if t.shape().len() == 2 {
        v.iter().cloned().cycle().take(v.len() * batch).collect()
    } else {
        v
    }
}

#[allow(clippy::too_many_arguments)]
fn reference(
    a: &[f64],
    b: &[f64],
    c: Option<&[f64]>,
    bias: Option<&[f64]>,
    [batch, m, n, k]: [usize; 4],
    alpha: f64,
    beta: f64,
    e: Epilogue,
) -> Vec<f64> {
    let mut d = vec![0.0; batch * m * n];
    for bi in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let dot: f64 = (0..k)
                    .map(|p| a[(bi * m + i) * k + p] * b[(bi * k + p) * n + j])
                    .sum();
                let mut v = alpha * dot;
                if let Some(c) = c {
                    v += beta * c[(bi * m + i) * n + j];
                }
                if let Some(bias) = bias {
                    v += bias[j];
                }
                d[(bi * m + i) * n + j] = act(e, v);
            }
        }
    }
    d
}

/// A [batch?, rows, cols] operand; `transposed` stores it as [batch?, cols, rows].
fn operand(
    rng: &mut Rng,
    dtype: DType,
    batch: Option<usize>,
    rows: usize,
    cols: usize,
    transposed: bool,
) -> Tensor {
    let shape: Vec<usize> = match (batch, transposed) {
        (Some(b), false) => vec![b, rows, cols],
        (Some(b), true) => vec![b, cols, rows],
        (None, false) => vec![rows, cols],
        (None, true) => vec![cols, rows],
    };
    let t = Tensor::zeros(&dev(), &shape, dtype).unwrap();
    fill(&t, &rng.values(t.numel(), -1.0, 1.0));
    if transposed {
        let r = shape.len();
        t.transpose(r - 2, r - 1).unwrap()
    } else {
        t
    }
}

#[derive(Debug, Clone, Copy)]
struct Case {
    in_dtype: DType,
    out_dtype: DType,
    batch: Option<usize>,
    m: usize,
    n: usize,
    k: usize,
    ta: bool,
    tb: bool,
    /// 0: contiguous d, 1: transposed d, 2: padded rows of d.
    d_layout: u8,
    alpha: f32,
    beta: f32,
    with_c: bool,
    with_bias: bool,
    epilogue: Epilogue,
}

fn run(c: Case, seed: u64) {
    let mut rng = Rng::new(seed);
    let Case {
        in_dtype,
        out_dtype,
        batch,
        m,
        n,
        k,
        ..
    } = c;
    let nb = batch.unwrap_or(1);
    let a = operand(&mut rng, in_dtype, batch, m, k, c.ta);
    let b = operand(&mut rng, in_dtype, batch, k, n, c.tb);
    let cm = c
        .with_c
        .then(|| operand(&mut rng, out_dtype, batch, m, n, false));
    let bias = c.with_bias.then(|| {
        operand(&mut rng, out_dtype, None, 1, n, false)
            .reshape(&[n])
            .unwrap()
    });
    let d = match c.d_layout {
        0 => operand(&mut rng, out_dtype, batch, m, n, false),
        1 => operand(&mut rng, out_dtype, batch, m, n, true),
        _ => {
            let wide = operand(&mut rng, out_dtype, batch, m, n + 3, false);
            let r = wide.shape().len();
            wide.narrow(r - 1, 1, n).unwrap()
        }
    };
    gemm(
        &a,
        &b,
        cm.as_ref(),
        &d,
        c.alpha,
        c.beta,
        c.epilogue,
        bias.as_ref(),
    )
    .unwrap();
    let want = reference(
        &matrices(&a, nb),
        &matrices(&b, nb),
        cm.as_ref().map(|t| matrices(t, nb)).as_deref(),
        bias.as_ref().map(read).as_deref(),
        [nb, m, n, k],
        c.alpha as f64,
        c.beta as f64,
        c.epilogue,
    );
    // f32 outputs accumulate k products; the tolerance is relative to the largest output.
    assert_close(out_dtype, &read(&d), &want, &format!("{c:?}"));
}

#[test]
fn gemm_sizes_and_transposes() {
    let mut seed = 4000;
    let sizes = [1, 7, 33, 65];
    for (i, &m) in sizes.iter().enumerate() {
        for (j, &n) in sizes.iter().enumerate() {
            for (l, &k) in sizes.iter().enumerate() {
                seed += 1;
                let in_dtype = if (i + j + l) % 2 == 0 {
                    DType::BF16
                } else {
                    DType::F16
                };
                let out_dtype = [DType::F32, DType::BF16, DType::F16][(i + 2 * j + l) % 3];
                let out_dtype = if out_dtype == DType::F32 {
                    out_dtype
                } else {
                    in_dtype
                };
                run(
                    Case {
                        in_dtype,
                        out_dtype,
                        batch: if (i + j) % 2 == 0 { Some(3) } else { None },
                        m,
                        n,
                        k,
                        ta: l % 2 == 1,
                        tb: (j + l) % 2 == 0,
                        d_layout: (seed % 3) as u8,
                        alpha: 1.0,
                        beta: 0.0,
                        with_c: false,
                        with_bias: false,
                        epilogue: Epilogue::None,
                    },
                    seed,
                );
            }
        }
    }
}

#[test]
fn gemm_alpha_beta_bias_epilogues() {
    let mut seed = 5000;
    for in_dtype in [DType::BF16, DType::F16] {
        for out_dtype in [DType::F32, in_dtype] {
            for epilogue in [Epilogue::None, Epilogue::Gelu, Epilogue::Silu] {
                for (with_c, with_bias, alpha, beta) in [
                    (true, false, 0.5, 2.0),
                    (false, true, -1.5, 0.0),
                    (true, true, 1.0, -1.0),
                    (true, false, 2.0, 0.0),
                ] {
                    for (ta, tb, batch) in [
                        (false, false, Some(3)),
                        (true, true, None),
                        (false, true, Some(3)),
                    ] {
                        seed += 1;
                        run(
                            Case {
                                in_dtype,
                                out_dtype,
                                batch,
                                m: 33,
                                n: 17,
                                k: 65,
                                ta,
                                tb,
                                d_layout: (seed % 3) as u8,
                                alpha,
                                beta,
                                with_c,
                                with_bias,
                                epilogue,
                            },
                            seed,
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn gemm_large_enough_to_run_in_parallel() {
    for (ta, tb) in [(false, false), (true, true)] {
        run(
            Case {
                in_dtype: DType::BF16,
                out_dtype: DType::F32,
                batch: Some(3),
                m: 129,
                n: 96,
                k: 257,
                ta,
                tb,
                d_layout: 0,
                alpha: 1.0,
                beta: 1.0,
                with_c: true,
                with_bias: true,
                epilogue: Epilogue::Gelu,
            },
            77,
        );
    }
}

/// A rank-2 weight shared by every batch, and a zero-length k (D = beta * C).
#[test]
fn gemm_broadcast_weight_and_empty_k() {
    let mut rng = Rng::new(8);
    let a = operand(&mut rng, DType::BF16, Some(3), 7, 33, false);
    let b = operand(&mut rng, DType::BF16, None, 33, 5, true);
    let d = Tensor::zeros(&dev(), &[3, 7, 5], DType::F32).unwrap();
    gemm(&a, &b, None, &d, 1.0, 0.0, Epilogue::None, None).unwrap();
    let want = reference(
        &read(&a),
        &matrices(&b, 3),
        None,
        None,
        [3, 7, 5, 33],
        1.0,
        0.0,
        Epilogue::None,
    );
    assert_close(DType::F32, &read(&d), &want, "broadcast b");

    let a = Tensor::zeros(&dev(), &[4, 0], DType::F16).unwrap();
    let b = Tensor::zeros(&dev(), &[0, 6], DType::F16).unwrap();
    let (c, cv) = random(&mut rng, DType::F32, &[4, 6], -1.0, 1.0);
    let d = Tensor::zeros(&dev(), &[4, 6], DType::F32).unwrap();
    gemm(&a, &b, Some(&c), &d, 1.0, 2.0, Epilogue::None, None).unwrap();
    let want: Vec<f64> = cv.iter().map(|v| 2.0 * v).collect();
    assert_close(DType::F32, &read(&d), &want, "k = 0");
}

/// d in the same storage as a and b (disjoint ranges), and d written over c.
#[test]
fn gemm_shares_storage() {
    let mut rng = Rng::new(9);
    let (m, n, k) = (7, 9, 33);
    let buf = Tensor::zeros(&dev(), &[m * k + k * n + m * n], DType::BF16).unwrap();
    let a = buf.as_strided(&[m, k], &[k, 1], 0).unwrap();
    let b = buf.as_strided(&[k, n], &[1, k], m * k).unwrap();
    let d = buf.as_strided(&[m, n], &[n, 1], m * k + k * n).unwrap();
    fill(&a, &rng.values(m * k, -1.0, 1.0));
    fill(&b, &rng.values(k * n, -1.0, 1.0));
    fill(&d, &rng.values(m * n, -1.0, 1.0));
    let (av, bv, dv) = (read(&a), read(&b), read(&d));
    gemm(&a, &b, Some(&d), &d, 1.0, 1.0, Epilogue::Silu, None).unwrap();
    let want = reference(
        &av,
        &bv,
        Some(&dv),
        None,
        [1, m, n, k],
        1.0,
        1.0,
        Epilogue::Silu,
    );
    assert_close(DType::BF16, &read(&d), &want, "shared storage, d over c");
    assert_eq!(read(&a), av);
}

#[test]
fn gemm_rejects_bad_shapes() {
    let a = Tensor::zeros(&dev(), &[4, 5], DType::BF16).unwrap();
    let b = Tensor::zeros(&dev(), &[6, 3], DType::BF16).unwrap();
    let d = Tensor::zeros(&dev(), &[4, 3], DType::F32).unwrap();
    assert!(
        gemm(&a, &b, None, &d, 1.0, 0.0, Epilogue::None, None).is_err(),
        "k mismatch"
    );
    let b = Tensor::zeros(&dev(), &[5, 3], DType::BF16).unwrap();
    let bias = Tensor::zeros(&dev(), &[4], DType::F32).unwrap();
    assert!(
        gemm(&a, &b, None, &d, 1.0, 0.0, Epilogue::None, Some(&bias)).is_err(),
        "bias length"
    );
    let d3 = Tensor::zeros(&dev(), &[2, 4, 3], DType::F32).unwrap();
    let a3 = Tensor::zeros(&dev(), &[3, 4, 5], DType::BF16).unwrap();
    assert!(
        gemm(&a3, &b, None, &d3, 1.0, 0.0, Epilogue::None, None).is_err(),
        "batch mismatch"
    );
    let d_bcast = Tensor::zeros(&dev(), &[4], DType::F32)
        .unwrap()
        .as_strided(&[4, 3], &[1, 0], 0)
        .unwrap();
    assert!(
        gemm(&a, &b, None, &d_bcast, 1.0, 0.0, Epilogue::None, None).is_err(),
        "d overlapping itself"
    );
}

#[test]
fn reference_erf_is_accurate() {
    // Known values of erf.
    for (x, want) in [
        (0.5, 0.520_499_877_813_046_5),
        (1.0, 0.842_700_792_949_714_9),
        (2.5, 0.999_593_047_982_555),
        (3.5, 0.999_999_256_901_627_7),
    ] {
        assert!((erf(x) - want).abs() < 1e-13, "erf({x}) = {}", erf(x));
        assert!((erf(-x) + want).abs() < 1e-13);
    }
}
