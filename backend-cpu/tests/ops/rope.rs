//! rope on [S, H, D] and [B, S, H, D] with arbitrary strides.

use crate::common::*;
use calico_core::{DType, Tensor};
use calico_cpu::rope;

/// f64 reference over a contiguous [B, S, H, D] copy of x.
#[allow(clippy::too_many_arguments)]
fn reference(
    x: &[f64],
    cos: &[f64],
    sin: &[f64],
    dims: [usize; 4],
    pos: usize,
    interleaved: bool,
) -> Vec<f64> {
    let [b, s, h, d] = dims;
    let half = d / 2;
    let mut y = vec![0.0; x.len()];
    for bi in 0..b {
        for si in 0..s {
            for hi in 0..h {
                let base = ((bi * s + si) * h + hi) * d;
                for i in 0..half {
                    let (ia, ib) = if interleaved {
                        (2 * i, 2 * i + 1)
                    } else {
                        (i, i + half)
                    };
                    let (c, sn) = (cos[(pos + si) * half + i], sin[(pos + si) * half + i]);
                    let (a, bb) = (x[base + ia], x[base + ib]);
                    y[base + ia] = a * c - bb * sn;
                    y[base + ib] = a * sn + bb * c;
                }
            }
        }
    }
    y
}

fn tables(rng: &mut Rng, p: usize, half: usize) -> (Tensor, Tensor, Vec<f64>, Vec<f64>) {
    let angles = rng.values(p * half, -3.2, 3.2);
    let cos = Tensor::zeros(&dev(), &[p, half], DType::F32).unwrap();
    let sin = Tensor::zeros(&dev(), &[p, half], DType::F32).unwrap();
    fill(&cos, &angles.iter().map(|a| a.cos()).collect::<Vec<_>>());
    fill(&sin, &angles.iter().map(|a| a.sin()).collect::<Vec<_>>());
    let (cv, sv) = (read(&cos), read(&sin));
    (cos, sin, cv, sv)
}

/// How x is laid out in memory.
#[derive(Clone, Copy, Debug)]
enum XLayout {
    Contiguous,
    /// Heads narrowed out of a wider tensor (e.g. q out of a fused qkv).
    NarrowHeads,
    /// Stored as [B, H, S, D] and viewed as [B, S, H, D].
    HeadsFirst,
}

fn make_x(dtype: DType, dims: [usize; 4], layout: XLayout) -> Tensor {
    let [b, s, h, d] = dims;
    match layout {
        XLayout::Contiguous => Tensor::zeros(&dev(), &dims, dtype).unwrap(),
        XLayout::NarrowHeads => Tensor::zeros(&dev(), &[b, s, 3 * h + 1, d], dtype)
            .unwrap()
            .narrow(2, h, h)
            .unwrap(),
        XLayout::HeadsFirst => Tensor::zeros(&dev(), &[b, h, s, d], dtype)
            .unwrap()
            .transpose(1, 2)
            .unwrap(),
    }
}

#[test]
fn rope_matches_reference() {
    let mut seed = 3000;
    let layouts = [
        XLayout::Contiguous,
        XLayout::NarrowHeads,
        XLayout::HeadsFirst,
    ];
    for dtype in DTYPES {
        for (dims, rank3) in [
            ([1, 5, 3, 8], true),
            ([2, 7, 4, 64], false),
            ([3, 1, 1, 2], false),
            ([1, 33, 2, 126], true),
        ] {
            for interleaved in [false, true] {
                for (li, &xl) in layouts.iter().enumerate() {
                    seed += 1;
                    let mut rng = Rng::new(seed);
                    let [b, s, h, d] = dims;
                    let pos = seed as usize % 4;
                    let (cos, sin, cv, sv) = tables(&mut rng, pos + s + 1, d / 2);
                    let x4 = make_x(dtype, dims, xl);
                    // y uses another layout than x, so the two strides are independent.
                    let y4 = make_x(dtype, dims, layouts[(li + 1) % 3]);
                    fill(&x4, &rng.values(x4.numel(), -2.0, 2.0));
                    let xv = read(&x4);
                    let (x, y) = if rank3 {
                        (
                            x4.as_strided(
                                &x4.shape()[1..],
                                &x4.strides()[1..],
                                x4.layout().offset(),
                            )
                            .unwrap(),
                            y4.as_strided(
                                &y4.shape()[1..],
                                &y4.strides()[1..],
                                y4.layout().offset(),
                            )
                            .unwrap(),
                        )
                    } else {
                        (x4.clone(), y4.clone())
                    };
                    assert!(!rank3 || b == 1);
                    rope(&x, &cos, &sin, pos, interleaved, &y).unwrap();
                    let want = reference(&xv, &cv, &sv, [b, s, h, d], pos, interleaved);
                    let what = format!("rope {dtype} {dims:?} rank3={rank3} interleaved={interleaved} x={xl:?} pos={pos}");
                    assert_close(dtype, &read(&y4), &want, &what);
                    assert_eq!(read(&x4), xv, "{what}: x untouched");
                }
            }
        }
    }
}

#[test]
fn rope_in_place() {
    let mut rng = Rng::new(31);
    let dims = [2, 9, 3, 16];
    let (cos, sin, cv, sv) = tables(&mut rng, 12, 8);
    for dtype in DTYPES {
        let (x, xv) = random(&mut rng, dtype, &dims, -2.0, 2.0);
        rope(&x, &cos, &sin, 3, false, &x).unwrap();
        assert_close(
            dtype,
            &read(&x),
            &reference(&xv, &cv, &sv, dims, 3, false),
            "in place",
        );
    }
}

#[test]
fn rope_rejects_bad_shapes() {
    let (cos, sin) = (
        Tensor::zeros(&dev(), &[8, 4], DType::F32).unwrap(),
        Tensor::zeros(&dev(), &[8, 4], DType::F32).unwrap(),
    );
    let x = Tensor::zeros(&dev(), &[4, 2, 8], DType::BF16).unwrap();
    let y = Tensor::zeros(&dev(), &[4, 2, 8], DType::BF16).unwrap();
    assert!(rope(&x, &cos, &sin, 4, true, &y).is_ok());
    assert!(rope(&x, &cos, &sin, 5, true, &y).is_err(), "P too small");
    let odd = Tensor::zeros(&dev(), &[4, 2, 7], DType::BF16).unwrap();
    assert!(rope(&odd, &cos, &sin, 0, true, &odd).is_err(), "odd D");
    let bf_cos = Tensor::zeros(&dev(), &[8, 4], DType::BF16).unwrap();
    assert!(
        rope(&x, &bf_cos, &sin, 0, true, &y).is_err(),
        "cos must be f32"
    );
    let rank2 = Tensor::zeros(&dev(), &[4, 8], DType::BF16).unwrap();
    assert!(rope(&rank2, &cos, &sin, 0, true, &rank2).is_err(), "rank 2");
}
