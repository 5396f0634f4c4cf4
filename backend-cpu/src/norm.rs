//! RMSNorm and LayerNorm over rows, with the fused residual add (`docs/ops-spec.md`).

use crate::convert::{expect_dtype, float_dtype, load, round_in_place, store};
use crate::math;
use crate::rows::{block_row, block_rows, output_blocks, rows_of, RowReader};
use crate::simd::vectorised;
use crate::views::with_views;
use calico_core::{Error, Result, Rows, Tensor};
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

        y_blocks
            .into_par_iter()
            .zip(sum_blocks)
            .enumerate()
            .for_each_init(
                || vec![0.0f32; 2 * cols],
                |scratch, (blk, (y_block, mut sum_block))| {
                    let (row, tmp) = scratch.split_at_mut(cols);
                    let first = blk * block;
                    vectorised(
                        #[inline(always)]
                        || {
                            for i in 0..block.min(xr.rows - first) {
                                x_rows.load(first + i, row);
                                if let Some(res) = &res_rows {
                                    res.load(first + i, tmp);
                                    row.iter_mut().zip(tmp.iter()).for_each(|(a, r)| *a += r);
                                    // The norm sees the sum as stored, rounded to the dtype.
                                    round_in_place(dtype, row);
                                }
                                if let Some(s) = sum_block.as_deref_mut() {
                                    store(dtype, row, block_row(s, i, &sr, dtype));
                                }
                                match kind {
                                    Kind::Rms => rms_row(row, w.as_deref(), eps),
                                    Kind::Layer => layer_row(row, w.as_deref(), b.as_deref(), eps),
                                }
                                store(dtype, row, block_row(y_block, i, &yr, dtype));
                            }
                        },
                    )
                },
            );
        Ok(())
    })
}

#[inline(always)]
fn rms_row(row: &mut [f32], weight: Option<&[f32]>, eps: f32) {
    let r = 1.0 / (math::sum_sq(row) / row.len() as f32 + eps).sqrt();
    match weight {
        Some(w) => row.iter_mut().zip(w).for_each(|(v, w)| *v = *v * r * w),
        None => row.iter_mut().for_each(|v| *v *= r),
    }
}

#[inline(always)]
fn layer_row(row: &mut [f32], weight: Option<&[f32]>, bias: Option<&[f32]>, eps: f32) {
    let n = row.len() as f32;
    // Statistics of x - row[0]: rows far from zero (1000 +- 0.01) keep their small spread,
    // which a plain f32 sum of x, or x - mean rounded at 1000, would lose.
    let shift = row.first().copied().unwrap_or(0.0);
    row.iter_mut().for_each(|v| *v -= shift);
    let mean = math::sum(row) / n;
    // Two passes: the variance from deviations loses less than E[x^2] - E[x]^2.
    let rstd = 1.0 / (math::sum_sq_dev(row, mean) / n + eps).sqrt();
    match (weight, bias) {
        (Some(w), Some(b)) => row
            .iter_mut()
            .zip(w)
            .zip(b)
            .for_each(|((v, w), b)| *v = (*v - mean) * rstd * w + b),
        (Some(w), None) => row
            .iter_mut()
            .zip(w)
            .for_each(|(v, w)| *v = (*v - mean) * rstd * w),
        (None, Some(b)) => row
            .iter_mut()
            .zip(b)
            .for_each(|(v, b)| *v = (*v - mean) * rstd + b),
        (None, None) => row.iter_mut().for_each(|v| *v = (*v - mean) * rstd),
    }
}
