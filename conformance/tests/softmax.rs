//! softmax over the last dimension against the f64 reference.

use calico::ops;
use calico::{DType, Device};
use calico_conformance::compare::{check_close, row_tol};
use calico_conformance::reference;
use calico_conformance::rng::{Dist, Rng};
use calico_conformance::strategies::{row_case, RowCase, EDGE_COLS};
use calico_conformance::tensors::{
    aligned_tail, intact, poisoned_rows, round_all, rows_view, untouched_outside, Placement,
    TAIL_COLS,
};
use calico_conformance::{property, report_skipped, Ctx};
use proptest::sample::select;

/// `spread` scales the inputs: at 60 a softmax that does not subtract the row max overflows
/// f32's exp.
fn softmax_case(dev: &Device, c: &RowCase, spread: f64) -> Result<(), String> {
    let (dt, cols, n) = (c.dtype, c.cols(), c.numel());
    let mut rng = Rng::new(c.seed);
    let x: Vec<f64> = c
        .dist
        .sample(&mut rng, n)
        .iter()
        .map(|v| v * spread)
        .collect();
    let x = round_all(dt, &x);
    let xv = rows_view(dev, dt, &c.shape, c.x_at, &x).ctx("allocating x")?;
    let mut y = poisoned_rows(dev, dt, &c.shape, c.out_at).ctx("allocating y")?;
    ops::softmax(dev, &xv.view, &mut y.view).ctx("softmax")?;
    let got = y.view.to_f64_vec().ctx("reading y")?;
    check_close("y", &got, &reference::softmax(&x, cols), row_tol(dt, cols))?;
    untouched_outside(&y, "y")?;
    intact(&xv, &x, "x")
}

#[test]
fn softmax_matches_reference() {
    let spread = select(vec![1.0, 10.0, 60.0]);
    property("softmax", 24, (row_case(), spread), |dev, (c, s)| {
        softmax_case(dev, c, *s)
    });
}

/// Every edge row length and dtype, dense and misaligned.
#[test]
fn softmax_at_every_edge_length() {
    report_skipped("softmax_at_every_edge_length");
    for dev in calico_conformance::backends().0 {
        for (i, &cols) in EDGE_COLS.iter().enumerate() {
            for (k, dtype) in [DType::BF16, DType::F16, DType::F32]
                .into_iter()
                .enumerate()
            {
                let misaligned = Placement { pad: 5, offset: 3 };
                let c = RowCase {
                    dtype,
                    shape: vec![if cols > 1000 { 2 } else { 3 }, cols],
                    x_at: if (i + k) % 2 == 0 {
                        misaligned
                    } else {
                        Placement::default()
                    },
                    out_at: if k == 1 {
                        misaligned
                    } else {
                        Placement::default()
                    },
                    dist: Dist::Uniform { scale: 1.0 },
                    seed: (i * 10 + k) as u64,
                };
                if let Err(e) = softmax_case(&dev, &c, 30.0) {
                    panic!("backend {}: softmax {dtype} cols {cols}: {e}", dev.kind());
                }
            }
        }
    }
}

/// Rows that end exactly at the end of their allocation: dense (the allocation is exactly the
/// tensor) or 16-byte aligned rows at the tail of a larger allocation, every length 1..=9 and
/// either side of the vector and block sizes, so a vector access past the last element leaves
/// the allocation (compute-sanitizer memcheck reports it: benches/gpu/sanitize.sh).
#[test]
fn softmax_rows_end_at_the_allocation() {
    report_skipped("softmax_rows_end_at_the_allocation");
    for dev in calico_conformance::backends().0 {
        for (i, &cols) in TAIL_COLS.iter().enumerate() {
            for dtype in [DType::BF16, DType::F16, DType::F32] {
                let tail = aligned_tail(dtype, cols);
                for (x_at, out_at) in [
                    (Placement::default(), Placement::default()),
                    (tail, tail),
                    (tail, Placement::default()),
                ] {
                    let c = RowCase {
                        dtype,
                        shape: vec![3, cols],
                        x_at,
                        out_at,
                        dist: Dist::Normal { scale: 2.0 },
                        seed: i as u64,
                    };
                    if let Err(e) = softmax_case(&dev, &c, 1.0) {
                        panic!(
                            "backend {}: softmax {dtype} cols {cols} x {x_at:?} y {out_at:?}: {e}",
                            dev.kind()
                        );
                    }
                }
            }
        }
    }
}

/// Odd row lengths with x and y misaligned alike (the aligned-body kernel: scalar head and
/// tail around 16-byte vectors), every dtype, many rows so every head length occurs.
#[test]
fn softmax_odd_rows_aligned_body() {
    report_skipped("softmax_odd_rows_aligned_body");
    for dev in calico_conformance::backends().0 {
        for (i, &(rows, cols)) in [(24, 4097), (17, 1001), (9, 9), (5, 15), (3, 1)]
            .iter()
            .enumerate()
        {
            for (k, dtype) in [DType::BF16, DType::F16, DType::F32]
                .into_iter()
                .enumerate()
            {
                let at = [Placement::default(), Placement { pad: 3, offset: 1 }][(i + k) % 2];
                let c = RowCase {
                    dtype,
                    shape: vec![rows, cols],
                    x_at: at,
                    out_at: at,
                    dist: Dist::Uniform { scale: 1.0 },
                    seed: (100 + i * 10 + k) as u64,
                };
                if let Err(e) = softmax_case(&dev, &c, 30.0) {
                    panic!("backend {}: softmax {dtype} {rows}x{cols}: {e}", dev.kind());
                }
            }
        }
    }
}
