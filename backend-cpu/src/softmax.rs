//! Softmax over the last dimension, max-subtracted, in f32.

use crate::convert::{expect_dtype, float_dtype, store};
use crate::math;
use crate::rows::{block_row, block_rows, output_blocks, rows_of, RowReader};
use crate::simd::vectorised;
use crate::views::with_views;
use calico_core::{Error, Result, Tensor};
use rayon::prelude::*;

/// `y = exp(x - max) / sum(exp(x - max))` over each row of `x`.
pub fn softmax(x: &Tensor, y: &Tensor) -> Result<()> {
    let dtype = float_dtype(x)?;
    expect_dtype(y, dtype)?;
    with_views(&[x], &[y], |ins, outs| {
        let (x_bytes, y_bytes) = match (ins.first(), outs.into_iter().next()) {
            (Some(&x), Some(y)) => (x, y),
            _ => return Err(Error::unsupported("internal: missing view")),
        };
        let xr = rows_of(x, x_bytes.len())?;
        let yr = rows_of(y, y_bytes.len())?;
        if (xr.rows, xr.cols) != (yr.rows, yr.cols) {
            return Err(Error::shape(format!(
                "softmax: x is {:?} but y is {:?}",
                x.shape(),
                y.shape()
            )));
        }
        let x_rows = RowReader::new(x_bytes, &xr, dtype);
        let block = block_rows(xr.rows, xr.cols);
        output_blocks(y_bytes, &yr, dtype, block)?
            .into_par_iter()
            .enumerate()
            .for_each_init(
                || vec![0.0f32; xr.cols],
                |row, (blk, y_block)| {
                    let first = blk * block;
                    vectorised(
                        #[inline(always)]
                        || {
                            for i in 0..block.min(xr.rows - first) {
                                x_rows.load(first + i, row);
                                softmax_row(row);
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
fn softmax_row(row: &mut [f32]) {
    let max = math::max(row);
    // Two simple loops vectorise better than one that maps and sums.
    row.iter_mut()
        .for_each(|v| *v = math::exp_nonpositive(*v - max));
    let scale = 1.0 / math::sum(row);
    row.iter_mut().for_each(|v| *v *= scale);
}
