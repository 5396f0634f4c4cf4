//! Tensors past 2^31 elements (4 GiB of bf16) on the GPU: every index and byte offset that
//! passes 2^31 must stay 64-bit, in the row ops and in the GEMM's operand loads and stores.
//! Sampled rows (the first, the last and those around element 2^31) are read back and checked
//! against the f64 reference. GPU only: 8-13 GiB per test fits a GPU host, not the CPU-only CI
//! machine, and the CPU backend indexes with usize throughout.

use calico::ops;
use calico::{DType, Tensor};
use calico_conformance::compare::{check_close, gemm_tol, row_tol};
use calico_conformance::gpu_backends;
use calico_conformance::reference;
use calico_conformance::rng::Rng;
use half::bf16;

/// Row length of the row ops and K (or N) of the GEMMs.
const COLS: usize = 4096;
/// 2^31 / COLS + 3 rows: 2^31 + 12288 elements, so element 2^31 sits inside row 524288.
const ROWS: usize = (1 << 31) / COLS + 3;
/// A repeating pattern of random values, its length prime so that rows differ.
const PATTERN: usize = 1_000_003;

/// `n` bf16 values in [-2, 2): a random pattern repeated (filling 2^31 values one by one would
/// take most of the test's time).
fn values(n: usize, seed: u64) -> Vec<bf16> {
    let mut rng = Rng::new(seed);
    let pattern: Vec<bf16> = (0..PATTERN.min(n))
        .map(|_| bf16::from_f64(rng.uniform(-2.0, 2.0)))
        .collect();
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let take = pattern.len().min(n - out.len());
        out.extend_from_slice(&pattern[..take]);
    }
    out
}

/// The rows read back: the ends, the middle and the rows around element 2^31.
fn sampled_rows(rows: usize, cols: usize) -> Vec<usize> {
    let boundary = (1usize << 31) / cols;
    let mut r = vec![
        0,
        1,
        rows / 2,
        boundary - 1,
        boundary,
        boundary + 1,
        rows - 2,
        rows - 1,
    ];
    r.retain(|&i| i < rows);
    r.dedup();
    r
}

fn as_f64(v: &[bf16]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// Row `r` of a [rows, cols] tensor, read back alone.
fn read_row(t: &Tensor, r: usize) -> Result<Vec<f64>, String> {
    t.narrow(0, r, 1)
        .and_then(|row| row.to_f64_vec())
        .map_err(|e| format!("reading row {r}: {e}"))
}

#[test]
fn softmax_and_rms_norm_past_2_31_elements() {
    for dev in gpu_backends(
        "softmax_and_rms_norm_past_2_31_elements",
        "the checks of tensors past 2^31 elements",
    ) {
        let x = values(ROWS * COLS, 11);
        let w = values(COLS, 12);
        let xt = dev.tensor(&x, &[ROWS, COLS]).expect("x");
        let wt = dev.tensor(&w, &[COLS]).expect("weight");
        let mut y = dev.zeros(&[ROWS, COLS], DType::BF16).expect("y");
        let w64 = as_f64(&w);
        ops::softmax(&dev, &xt, &mut y).expect("softmax");
        for r in sampled_rows(ROWS, COLS) {
            let xr = as_f64(&x[r * COLS..(r + 1) * COLS]);
            let got = read_row(&y, r).unwrap();
            check_close(
                &format!("softmax row {r}"),
                &got,
                &reference::softmax(&xr, COLS),
                row_tol(DType::BF16, COLS),
            )
            .unwrap_or_else(|e| panic!("{}: {e}", dev.name()));
        }
        ops::rms_norm(&dev, &xt, &wt, 1e-6, &mut y).expect("rms_norm");
        for r in sampled_rows(ROWS, COLS) {
            let xr = as_f64(&x[r * COLS..(r + 1) * COLS]);
            let got = read_row(&y, r).unwrap();
            let expected = reference::rms_norm(&xr, COLS, &w64, 1e-6);
            check_close(
                &format!("rms_norm row {r}"),
                &got,
                &expected,
                row_tol(DType::BF16, COLS),
            )
            .unwrap_or_else(|e| panic!("{}: {e}", dev.name()));
        }
    }
}

/// Rows `rows` of D = A · W^T from the host copies (A: [M, K], W: [N, K]).
fn gemm_rows(a: &[bf16], w: &[bf16], k: usize, n: usize, rows: &[usize]) -> Vec<Vec<f64>> {
    rows.iter()
        .map(|&r| {
            let ar = &a[r * k..(r + 1) * k];
            (0..n)
                .map(|j| {
                    let wr = &w[j * k..(j + 1) * k];
                    ar.iter()
                        .zip(wr)
                        .map(|(x, y)| x.to_f64() * y.to_f64())
                        .sum()
                })
                .collect()
        })
        .collect()
}

/// D = A · W^T with A of 2^31 + elements (K = 4096, N = 64), then with D of 2^31 + elements
/// (K = 64, N = 4096): the operand loads and the epilogue's stores past 4 GiB.
#[test]
fn matmul_past_2_31_elements_in_a_and_in_d() {
    for dev in gpu_backends(
        "matmul_past_2_31_elements_in_a_and_in_d",
        "the checks of tensors past 2^31 elements",
    ) {
        for (k, n) in [(COLS, 64), (64, COLS)] {
            let a = values(ROWS * k, 21);
            let w = values(n * k, 22);
            let at = dev.tensor(&a, &[ROWS, k]).expect("a");
            let wt = dev.tensor(&w, &[n, k]).expect("w");
            let mut d = dev.zeros(&[ROWS, n], DType::BF16).expect("d");
            ops::matmul(&dev, &at, &wt.transpose(0, 1).expect("w^T"), &mut d).expect("matmul");
            let rows = sampled_rows(ROWS, COLS);
            let (_, elementwise) = gemm_tol(DType::BF16);
            for (r, expected) in rows.iter().zip(gemm_rows(&a, &w, k, n, &rows)) {
                let got = read_row(&d, *r).unwrap();
                check_close(
                    &format!("D row {r} (K = {k}, N = {n})"),
                    &got,
                    &expected,
                    elementwise,
                )
                .unwrap_or_else(|e| panic!("{}: {e}", dev.name()));
            }
        }
    }
}

/// Attention forward with Q and O of 2^31 + elements (8 heads of 2097155 query rows at head
/// dim 128) against 128 keys: the query-row and head offsets of the loads, the O stores and
/// the LSE past 4 GiB. Sampled rows against a per-row f64 softmax.
#[test]
fn attention_past_2_31_elements_in_q_and_o() {
    const HEADS: usize = 8;
    const D: usize = 128;
    const KEYS: usize = 128;
    const QROWS: usize = (1 << 31) / (HEADS * D) + 3;
    for dev in gpu_backends(
        "attention_past_2_31_elements_in_q_and_o",
        "the checks of tensors past 2^31 elements",
    ) {
        let q = values(HEADS * QROWS * D, 31);
        let k = values(HEADS * KEYS * D, 32);
        let v = values(HEADS * KEYS * D, 33);
        let qt = dev.tensor(&q, &[1, HEADS, QROWS, D]).expect("q");
        let kt = dev.tensor(&k, &[1, HEADS, KEYS, D]).expect("k");
        let vt = dev.tensor(&v, &[1, HEADS, KEYS, D]).expect("v");
        let mut o = dev.zeros(&[1, HEADS, QROWS, D], DType::BF16).expect("o");
        let mut lse = dev.zeros(&[1, HEADS, QROWS], DType::F32).expect("lse");
        ops::attention(&dev, &qt, &kt, &vt, &Default::default(), &mut o, &mut lse)
            .expect("attention");
        let scale = 1.0 / (D as f64).sqrt();
        // Flattened (head, row) indices: the ends and those around element 2^31.
        let boundary = (1usize << 31) / D;
        let last = HEADS * QROWS - 1;
        for flat in [0, 1, boundary - 1, boundary, boundary + 1, last - 1, last] {
            let (h, i) = (flat / QROWS, flat % QROWS);
            let qr = as_f64(&q[flat * D..(flat + 1) * D]);
            let key = |j: usize| as_f64(&k[(h * KEYS + j) * D..(h * KEYS + j + 1) * D]);
            let s: Vec<f64> = (0..KEYS)
                .map(|j| scale * qr.iter().zip(key(j)).map(|(a, b)| a * b).sum::<f64>())
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let l: f64 = s.iter().map(|x| (x - m).exp()).sum();
            let mut expected = vec![0.0; D];
            for (j, sj) in s.iter().enumerate() {
                let p = (sj - m).exp() / l;
                let vr = &v[(h * KEYS + j) * D..(h * KEYS + j + 1) * D];
                for (e, x) in expected.iter_mut().zip(vr) {
                    *e += p * x.to_f64();
                }
            }
            let view = |t: &Tensor| t.narrow(1, h, 1).and_then(|t| t.narrow(2, i, 1));
            let got = view(&o).and_then(|t| t.to_f64_vec()).expect("o row");
            check_close(
                &format!("O head {h} row {i}"),
                &got,
                &expected,
                row_tol(DType::BF16, D),
            )
            .unwrap_or_else(|e| panic!("{}: {e}", dev.name()));
            let got_lse = view(&lse).and_then(|t| t.to_f64_vec()).expect("lse row");
            let want = m + l.ln();
            assert!(
                (got_lse[0] - want).abs() <= 1e-3 * want.abs().max(1.0),
                "{}: LSE head {h} row {i}: {} against {want}",
                dev.name(),
                got_lse[0]
            );
        }
    }
}
