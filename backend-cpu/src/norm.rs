//! RMSNorm and LayerNorm over rows, with the fused residual add (`docs/ops-spec.md`).

use crate::convert::{expect_dtype, float_dtype, load, round_in_place, store};
use crate::lanes::{
    add, chunks, hsum, mul, mul_add, pairwise_sum, splat, sub, Ahead, Bf16, Elem, Lanes, F32, W,
};
use crate::rows::{block_row, block_rows, output_blocks, rows_of, with_scratch, RowReader};
use crate::simd::{vectorised_fma, MulAdd};
use crate::views::with_views;
use calico_core::{DType, Error, Result, Rows, Tensor};
use rayon::prelude::*;

#[derive(Clone, Copy)]
enum Kind {
    Rms,
    Layer,
}

/// `y = x * rsqrt(mean(x^2) + eps) * weight` over each row of `x`. With `residual`, the norm
/// is taken of `s = round(x + residual)`, which is also written to `sum` when given.
pub fn rms_norm(
    x: &Tensor,
    residual: Option<&Tensor>,
    weight: &Tensor,
    eps: f32,
    y: &Tensor,
    sum: Option<&Tensor>,
) -> Result<()> {
    norm(Kind::Rms, x, residual, Some(weight), None, eps, y, sum)
}

/// `y = (x - mean) / sqrt(var + eps) * weight + bias` over each row of `x` (biased variance;
/// weight 1 and bias 0 when absent). `residual` and `sum` as in [`rms_norm`].
pub fn layer_norm(
    x: &Tensor,
    residual: Option<&Tensor>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f32,
    y: &Tensor,
    sum: Option<&Tensor>,
) -> Result<()> {
    norm(Kind::Layer, x, residual, weight, bias, eps, y, sum)
}

/// A per-column vector ([D] or any shape of one row of D) widened to f32.
fn load_vector(t: &Tensor, bytes: &[u8], cols: usize, what: &str) -> Result<Vec<f32>> {
    let r = rows_of(t, bytes.len())?;
    if r.rows != 1 || r.cols != cols {
        return Err(Error::shape(format!(
            "{what} has shape {:?}; expected [{cols}]",
            t.shape()
        )));
    }
    let mut out = vec![0.0; cols];
    load(t.dtype(), bytes, &mut out);
    Ok(out)
}

/// The rows of `t`, which must match the rows of x.
fn matching_rows(t: &Tensor, bytes_len: usize, x: &Rows, what: &str) -> Result<Rows> {
    let r = rows_of(t, bytes_len)?;
    if (r.rows, r.cols) != (x.rows, x.cols) {
        return Err(Error::shape(format!(
            "{what} has {} rows of {}; x has {} rows of {}",
            r.rows, r.cols, x.rows, x.cols
        )));
    }
    Ok(r)
}

#[allow(clippy::too_many_arguments)]
fn norm(
    kind: Kind,
    x: &Tensor,
    residual: Option<&Tensor>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f32,
    y: &Tensor,
    sum: Option<&Tensor>,
) -> Result<()> {
    let dtype = float_dtype(x)?;
    for t in [residual, weight, bias, Some(y), sum].into_iter().flatten() {
        expect_dtype(t, dtype)?;
    }
    // Inputs in a fixed order: x, then whichever of residual, weight, bias are present.
    let mut inputs = vec![x];
    inputs.extend([residual, weight, bias].into_iter().flatten());
    let mut outputs = vec![y];
    outputs.extend(sum);

    with_views(&inputs, &outputs, |ins, outs| {
        let mut ins = ins.iter().copied();
        let mut next_input = || {
            ins.next()
                .ok_or_else(|| Error::unsupported("internal: missing input view"))
        };
        let x_bytes = next_input()?;
        let xr = rows_of(x, x_bytes.len())?;
        let cols = xr.cols;
        let x_rows = RowReader::new(x_bytes, &xr, dtype);
        let res_rows = match residual {
            Some(t) => {
                let bytes = next_input()?;
                Some(RowReader::new(
                    bytes,
                    &matching_rows(t, bytes.len(), &xr, "residual")?,
                    dtype,
                ))
            }
            None => None,
        };
        let w = weight
            .map(|t| load_vector(t, next_input()?, cols, "weight"))
            .transpose()?;
        let b = bias
            .map(|t| load_vector(t, next_input()?, cols, "bias"))
            .transpose()?;

        let mut outs = outs.into_iter();
        let y_bytes = outs
            .next()
            .ok_or_else(|| Error::unsupported("internal: missing output view"))?;
        let yr = matching_rows(y, y_bytes.len(), &xr, "y")?;
        let block = block_rows(xr.rows, cols);
        let y_blocks = output_blocks(y_bytes, &yr, dtype, block)?;
        let (sr, sum_blocks): (Rows, Vec<Option<&mut [u8]>>) = match (sum, outs.next()) {
            (Some(t), Some(bytes)) => {
                let sr = matching_rows(t, bytes.len(), &xr, "sum")?;
                (
                    sr,
                    output_blocks(bytes, &sr, dtype, block)?
                        .into_iter()
                        .map(Some)
                        .collect(),
                )
            }
            _ => (yr, y_blocks.iter().map(|_| None).collect()),
        };

        let params = Params {
            kind,
            weight: w.as_deref(),
            bias: b.as_deref(),
            eps,
        };
        let lanes = cols.div_ceil(W);
        y_blocks
            .into_par_iter()
            .zip(sum_blocks)
            .enumerate()
            .for_each(|(blk, (y_block, mut sum_block))| {
                let first = blk * block;
                with_scratch(4 * lanes, |scratch| {
                    let rows: Vec<&mut [f32]> = scratch
                        .chunks_exact_mut(lanes)
                        .map(|c| &mut bytemuck::cast_slice_mut::<Lanes, f32>(c)[..cols])
                        .collect();
                    let [s_row, x_row, r_row, y_row] = <[&mut [f32]; 4]>::try_from(rows)
                        .unwrap_or_else(|_| unreachable!("four scratch rows"));
                    vectorised_fma!(|M| {
                        for i in 0..block.min(xr.rows - first) {
                            let r = first + i;
                            let row = RowBytes {
                                x: x_rows.row(r),
                                residual: res_rows.as_ref().map(|t| t.row(r)),
                                sum: sum_block
                                    .as_deref_mut()
                                    .map(|s| block_row(s, i, &sr, dtype)),
                                y: block_row(y_block, i, &yr, dtype),
                                ahead: if r + 1 < xr.rows {
                                    Ahead::new(
                                        [
                                            x_rows.row(r + 1),
                                            res_rows.as_ref().map_or(&[], |t| t.row(r + 1)),
                                        ],
                                        cols,
                                    )
                                } else {
                                    Ahead::default()
                                },
                            };
                            let done = match dtype {
                                DType::BF16 => typed_row::<M, Bf16>(row, &params, s_row),
                                DType::F32 => typed_row::<M, F32>(row, &params, s_row),
                                _ => Err(row),
                            };
                            if let Err(row) = done {
                                let rows = [&mut *s_row, &mut *x_row, &mut *r_row, &mut *y_row];
                                widened_row::<M>(dtype, row, &params, rows);
                            }
                        }
                    })
                })
            });
        Ok(())
    })
}

/// What a norm needs besides the row.
struct Params<'a> {
    kind: Kind,
    weight: Option<&'a [f32]>,
    bias: Option<&'a [f32]>,
    eps: f32,
}

/// The storage bytes of one row of each operand.
struct RowBytes<'a> {
    x: &'a [u8],
    residual: Option<&'a [u8]>,
    sum: Option<&'a mut [u8]>,
    y: &'a mut [u8],
    /// The next row's x and residual.
    ahead: Ahead<'a>,
}

/// One row stored as `E`, read and written in place; the row back if a slice is not aligned
/// to `E`. `s_row` holds `round(x + residual)`.
#[inline(always)]
fn typed_row<'a, M: MulAdd, E: Elem>(
    row: RowBytes<'a>,
    p: &Params,
    s_row: &mut [f32],
) -> std::result::Result<(), RowBytes<'a>> {
    let fits = |b: &[u8]| bytemuck::try_cast_slice::<u8, E::Bits>(b).is_ok();
    let aligned = fits(row.x)
        && row.residual.is_none_or(fits)
        && row.sum.as_deref().is_none_or(fits)
        && fits(row.y);
    if !aligned {
        return Err(row);
    }
    let cast =
        |b: &'a [u8]| bytemuck::try_cast_slice::<u8, E::Bits>(b).unwrap_or_else(|_| unreachable!());
    let cast_mut = |b: &'a mut [u8]| {
        bytemuck::try_cast_slice_mut::<u8, E::Bits>(b).unwrap_or_else(|_| unreachable!())
    };
    let x = cast(row.x);
    let y = cast_mut(row.y);
    match row.residual.map(cast) {
        None => norm_row::<M, E, E>(x, p, y, row.ahead),
        Some(r) => {
            // The norm sees the sum as stored, rounded to the dtype.
            match row.sum.map(cast_mut) {
                Some(sum) => {
                    for (((s, out), &a), &b) in s_row.iter_mut().zip(sum).zip(x).zip(r) {
                        *out = E::narrow(E::widen(a) + E::widen(b));
                        *s = E::widen(*out);
                    }
                }
                None => {
                    for ((s, &a), &b) in s_row.iter_mut().zip(x).zip(r) {
                        *s = E::round(E::widen(a) + E::widen(b));
                    }
                }
            }
            norm_row::<M, F32, E>(s_row, p, y, row.ahead);
        }
    }
    Ok(())
}

/// One row of another dtype (f16) or alignment, through f32 rows.
#[inline(always)]
fn widened_row<M: MulAdd>(
    dtype: DType,
    row: RowBytes,
    p: &Params,
    [s_row, x_row, r_row, y_row]: [&mut [f32]; 4],
) {
    load(dtype, row.x, x_row);
    let input = match row.residual {
        None => &*x_row,
        Some(r) => {
            load(dtype, r, r_row);
            for ((s, a), b) in s_row.iter_mut().zip(&*x_row).zip(&*r_row) {
                *s = a + b;
            }
            round_in_place(dtype, s_row);
            if let Some(sum) = row.sum {
                store(dtype, s_row, sum);
            }
            &*s_row
        }
    };
    norm_row::<M, F32, F32>(input, p, y_row, row.ahead);
    store(dtype, y_row, row.y);
}

/// The norm of row `x` into `y`.
#[inline(always)]
fn norm_row<M: MulAdd, I: Elem, O: Elem>(
    x: &[I::Bits],
    p: &Params,
    y: &mut [O::Bits],
    ahead: Ahead,
) {
    match p.kind {
        Kind::Rms => {
            let r = 1.0 / (sum_sq::<I>(x) / x.len() as f32 + p.eps).sqrt();
            match p.weight {
                Some(w) => map3::<I, O>(x, w, w, y, ahead, |v, w, _| v * r * w),
                None => map1::<I, O>(x, y, ahead, |v| v * r),
            }
        }
        Kind::Layer => {
            // Statistics of x - x[0]: rows far from zero (1000 +- 0.01) keep their small
            // spread.
            let shift = x.first().map_or(0.0, |&v| I::widen(v));
            let (mean, m2) = shifted_mean_m2::<M, I>(x, shift);
            let rstd = (1.0 / (m2 / x.len() as f64 + f64::from(p.eps)).sqrt()) as f32;
            let mean = mean as f32;
            let centred = |v: f32| (v - shift - mean) * rstd;
            match (p.weight, p.bias) {
                (Some(w), Some(b)) => {
                    map3::<I, O>(x, w, b, y, ahead, |v, w, b| M::mul_add(centred(v), w, b))
                }
                (Some(w), None) => map3::<I, O>(x, w, w, y, ahead, |v, w, _| centred(v) * w),
                (None, Some(b)) => map3::<I, O>(x, b, b, y, ahead, |v, _, b| centred(v) + b),
                (None, None) => map1::<I, O>(x, y, ahead, centred),
            }
        }
    }
}

/// Elements per block of the flat loops, between prefetches of the next row.
const BLOCK: usize = 512;

/// `y[i] = f(x[i])`: flat loops, vectorised along the row.
#[inline(always)]
fn map1<I: Elem, O: Elem>(x: &[I::Bits], y: &mut [O::Bits], ahead: Ahead, f: impl Fn(f32) -> f32) {
    for (k, (y, x)) in y.chunks_mut(BLOCK).zip(x.chunks(BLOCK)).enumerate() {
        ahead.fetch(k * BLOCK, (k + 1) * BLOCK);
        for (y, &x) in y.iter_mut().zip(x) {
            *y = O::narrow(f(I::widen(x)));
        }
    }
}

/// `y[i] = f(x[i], a[i], b[i])`, as [`map1`].
#[inline(always)]
fn map3<I: Elem, O: Elem>(
    x: &[I::Bits],
    a: &[f32],
    b: &[f32],
    y: &mut [O::Bits],
    ahead: Ahead,
    f: impl Fn(f32, f32, f32) -> f32,
) {
    let blocks = y
        .chunks_mut(BLOCK)
        .zip(x.chunks(BLOCK))
        .zip(a.chunks(BLOCK).zip(b.chunks(BLOCK)));
    for (k, ((y, x), (a, b))) in blocks.enumerate() {
        ahead.fetch(k * BLOCK, (k + 1) * BLOCK);
        for (((y, &x), &a), &b) in y.iter_mut().zip(x).zip(a).zip(b) {
            *y = O::narrow(f(I::widen(x), a, b));
        }
    }
}

/// Sum of squares over four accumulators of 16 lanes.
#[inline(always)]
fn sum_sq<I: Elem>(x: &[I::Bits]) -> f32 {
    let (full, tail) = chunks(x.len());
    let mut acc = [splat(0.0); 4];
    let sq_add = |a: Lanes, v: Lanes| add(a, mul(v, v));
    for g in 0..full / 4 {
        for (k, a) in acc.iter_mut().enumerate() {
            *a = sq_add(*a, I::load(x, 4 * g + k));
        }
    }
    for c in full / 4 * 4..full {
        acc[0] = sq_add(acc[0], I::load(x, c));
    }
    if tail > 0 {
        acc[1] = sq_add(acc[1], I::load_tail(x, full, 0.0));
    }
    hsum(add(add(acc[0], acc[1]), add(acc[2], acc[3])))
}

/// Mean and sum of squared deviations of `x - shift`, in one pass: each lane keeps the mean
/// and squared deviations of its elements, updated per group of four (Chan et al.: the
/// group's own two-pass statistics, then the combination with the running ones), so no sum of
/// squares cancels against a squared mean. Lanes and the elements past the last whole group
/// are combined in f64.
#[inline(always)]
fn shifted_mean_m2<M: MulAdd, I: Elem>(x: &[I::Bits], shift: f32) -> (f64, f64) {
    const G: usize = 4;
    let (full, _) = chunks(x.len());
    let groups = full / G;
    let shifted = |c: usize| sub(I::load(x, c), splat(shift));
    let (mut mean, mut m2) = (splat(0.0), splat(0.0));
    for g in 0..groups {
        let v = [
            shifted(G * g),
            shifted(G * g + 1),
            shifted(G * g + 2),
            shifted(G * g + 3),
        ];
        let group_mean = mul(add(add(v[0], v[1]), add(v[2], v[3])), splat(0.25));
        let d = |k: usize| sub(v[k], group_mean);
        let (d0, d1, d2, d3) = (d(0), d(1), d(2), d(3));
        let group_m2 = add(
            mul_add::<M>(d1, d1, mul(d0, d0)),
            mul_add::<M>(d3, d3, mul(d2, d2)),
        );
        if g == 0 {
            (mean, m2) = (group_mean, group_m2);
        } else {
            // n = G g elements so far per lane, G more: the mean moves by delta G / (n + G),
            // and the squares gain delta^2 n G / (n + G).
            let delta = sub(group_mean, mean);
            let to_mean = 1.0 / (g + 1) as f32;
            let to_m2 = (G * g) as f32 * to_mean;
            mean = mul_add::<M>(delta, splat(to_mean), mean);
            m2 = mul_add::<M>(mul(delta, delta), splat(to_m2), add(m2, group_m2));
        }
    }
    // Combine (count, mean, m2) triples in f64: the lanes, then the rest as one more.
    let combine = |(n, mean, m2): (f64, f64, f64), (nb, mean_b, m2_b): (f64, f64, f64)| {
        let total = n + nb;
        let delta = mean_b - mean;
        (
            total,
            mean + delta * nb / total,
            m2 + m2_b + delta * delta * n * nb / total,
        )
    };
    let per_lane = (G * groups) as f64;
    let (lanes_mean, lanes_m2) = combine_lanes(&mean, &m2, per_lane);
    let mut acc = (per_lane * W as f64, lanes_mean, lanes_m2);
    let rest = &x[G * W * groups..];
    if !rest.is_empty() {
        let value = |v: &I::Bits| f64::from(I::widen(*v) - shift);
        let nb = rest.len() as f64;
        let mean_b = rest.iter().map(value).sum::<f64>() / nb;
        let m2_b = rest.iter().map(|v| (value(v) - mean_b).powi(2)).sum();
        acc = combine(acc, (nb, mean_b, m2_b));
    }
    (acc.1, acc.2)
}

/// The mean and squared deviations of all 16 lanes together, each lane holding `per_lane`
/// elements with the given mean and squared deviations: the mean of the lane means, and the
/// lanes' squares plus `per_lane` times the spread of their means (pairwise sums in f64, so
/// the row's critical path has no chain of 16 dependent steps). Not inlined: reading single
/// lanes inside the kernel made LLVM vectorise its main loop 4 lanes wide instead of 16.
#[inline(never)]
fn combine_lanes(mean: &Lanes, m2: &Lanes, per_lane: f64) -> (f64, f64) {
    let pairwise = pairwise_sum::<f64>;
    let mut wide = [0.0f64; W];
    for (w, &m) in wide.iter_mut().zip(mean) {
        *w = f64::from(m);
    }
    let lanes_mean = pairwise(wide) / W as f64;
    let mut spread = [0.0f64; W];
    let mut squares = [0.0f64; W];
    for ((s, q), (&m, &m2)) in spread.iter_mut().zip(&mut squares).zip(mean.iter().zip(m2)) {
        let d = f64::from(m) - lanes_mean;
        *s = d * d;
        *q = f64::from(m2);
    }
    (lanes_mean, pairwise(squares) + per_lane * pairwise(spread))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::{Fused, Separate};

    /// Mean and squared deviations of `x - shift`, two-pass in f64.
    fn reference(x: &[f32], shift: f32) -> (f64, f64) {
        let v: Vec<f64> = x.iter().map(|&x| f64::from(x - shift)).collect();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        (mean, v.iter().map(|v| (v - mean).powi(2)).sum())
    }

    #[test]
    fn one_pass_statistics_match_two_pass_ones() {
        for n in [1usize, 2, 15, 16, 17, 63, 64, 65, 127, 128, 1000, 4097] {
            for (what, offset, outlier) in [
                ("centred", 0.0, 0.0),
                ("far", 1000.0, 0.0),
                ("outlier first", 0.0, 50.0),
            ] {
                let mut x: Vec<f32> = (0..n)
                    .map(|i| offset + ((i * 7919) % 997) as f32 / 997.0 - 0.5)
                    .collect();
                x[0] += outlier;
                let shift = x[0];
                let (want_mean, want_m2) = reference(&x, shift);
                for (got_mean, got_m2) in [
                    shifted_mean_m2::<Fused, F32>(&x, shift),
                    shifted_mean_m2::<Separate, F32>(&x, shift),
                ] {
                    let scale = want_m2.max(1e-30);
                    assert!(
                        (got_mean - want_mean).abs() < 1e-5 * (1.0 + want_mean.abs()),
                        "{what} n={n}: mean {got_mean} want {want_mean}"
                    );
                    assert!(
                        (got_m2 - want_m2).abs() <= 1e-5 * scale,
                        "{what} n={n}: m2 {got_m2} want {want_m2}"
                    );
                }
            }
        }
    }
}
