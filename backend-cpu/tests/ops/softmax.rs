//! softmax over rows.

use crate::common::*;
use calico_core::{DType, Tensor};
use calico_cpu::softmax;

fn reference(x: &[f64], cols: usize) -> Vec<f64> {
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks(cols) {
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = row.iter().map(|v| (v - max).exp()).collect();
        let s: f64 = e.iter().sum();
        y.extend(e.iter().map(|v| v / s));
    }
    y
}

#[test]
fn softmax_matches_reference() {
    let mut seed = 2000;
    for dtype in DTYPES {
        for cols in EDGE_COLS {
            for (rows, pad) in [(1, 0), (4, 3), (33, 0)] {
                seed += 1;
                let mut rng = Rng::new(seed);
                let x = strided(dtype, rows, cols, pad, 7.0);
                // A wide range, so the max subtraction matters.
                fill(&x, &rng.values(rows * cols, -30.0, 30.0));
                let xv = read(&x);
                let y = strided(dtype, rows, cols, pad, 3.0);
                softmax(&x, &y).unwrap();
                let what = format!("softmax {dtype} rows={rows} cols={cols} pad={pad}");
                assert_close(dtype, &read(&y), &reference(&xv, cols), &what);
                assert_padding(&y, 3.0);
            }
        }
    }
}

#[test]
fn softmax_handles_large_and_masked_values() {
    let x = Tensor::zeros(&dev(), &[2, 5], DType::F32).unwrap();
    fill(
        &x,
        &[
            1e4,
            1e4 - 1.0,
            f64::NEG_INFINITY,
            -1e4,
            0.0,
            -80.0,
            -100.0,
            -90.0,
            f64::NEG_INFINITY,
            -85.0,
        ],
    );
    let y = Tensor::zeros(&dev(), &[2, 5], DType::F32).unwrap();
    softmax(&x, &y).unwrap();
    let want = reference(&read(&x), 5);
    assert_close(DType::F32, &read(&y), &want, "extremes");
    assert_eq!(read(&y)[2], 0.0, "exp(-inf) is exactly 0");
}

#[test]
fn softmax_in_place_and_shared_storage() {
    let mut rng = Rng::new(3);
    for dtype in DTYPES {
        let (rows, cols) = (6, 1023);
        let buf = Tensor::zeros(&dev(), &[2, rows, cols], dtype).unwrap();
        let (x, y) = (buf.narrow(0, 0, 1).unwrap(), buf.narrow(0, 1, 1).unwrap());
        fill(&x, &rng.values(rows * cols, -5.0, 5.0));
        let xv = read(&x);
        softmax(&x, &y).unwrap();
        assert_close(
            dtype,
            &read(&y),
            &reference(&xv, cols),
            "x and y in one storage",
        );
        assert_eq!(read(&x), xv);
        softmax(&x, &x).unwrap();
        assert_close(dtype, &read(&x), &reference(&xv, cols), "y == x");
    }
}
