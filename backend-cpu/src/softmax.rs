//! Softmax over the last dimension, max-subtracted, in f32.

use crate::convert::{expect_dtype, float_dtype, load, store};
use crate::lanes::{
    add, chunks, hmax, hsum, map, max, splat, sub, Ahead, Bf16, Elem, Lanes, F32, W,
};
use crate::math;
use crate::rows::{block_row, block_rows, output_blocks, rows_of, with_scratch, RowReader};
use crate::simd::{vectorised_fma, MulAdd};
use crate::views::with_views;
use calico_core::{DType, Error, Result, Rows, Tensor};
use rayon::prelude::*;
use std::ops::Range;

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
        let (n, block) = (xr.cols, block_rows(xr.rows, xr.cols));
        output_blocks(y_bytes, &yr, dtype, block)?
            .into_par_iter()
            .enumerate()
            .for_each(|(blk, y_block)| {
                let first = blk * block;
                let lanes = n.div_ceil(W);
                with_scratch(3 * lanes, |scratch| {
                    let (exps, rest) = scratch.split_at_mut(lanes);
                    let (row, out) = rest.split_at_mut(lanes);
                    let row = &mut bytemuck::cast_slice_mut::<Lanes, f32>(row)[..n];
                    let out = &mut bytemuck::cast_slice_mut::<Lanes, f32>(out)[..n];
                    let rows = first..(first + block).min(xr.rows);
                    let block = Block {
                        x_rows,
                        y_rows: &yr,
                        dtype,
                    };
                    vectorised_fma!(|M| block.run::<M>(rows, y_block, exps, row, out));
                })
            });
        Ok(())
    })
}

/// What every row of a task shares.
struct Block<'a> {
    x_rows: RowReader<'a>,
    y_rows: &'a Rows,
    dtype: DType,
}

impl Block<'_> {
    /// Softmax of rows `rows` into `y_block`, which starts at row `rows.start`; `exps`, `row`
    /// and `out` are scratch.
    #[inline(always)]
    fn run<M: MulAdd>(
        &self,
        rows: Range<usize>,
        y_block: &mut [u8],
        exps: &mut [Lanes],
        row: &mut [f32],
        out: &mut [f32],
    ) {
        let (dtype, n) = (self.dtype, row.len());
        for r in rows.clone() {
            let x = self.x_rows.row(r);
            let y = block_row(y_block, r - rows.start, self.y_rows, dtype);
            let ahead = if r + 1 < rows.end {
                Ahead::new([self.x_rows.row(r + 1), &[]], n)
            } else {
                Ahead::default()
            };
            let done = match dtype {
                DType::BF16 => typed::<M, Bf16>(x, ahead, exps, y),
                DType::F32 => typed::<M, F32>(x, ahead, exps, y),
                _ => false,
            };
            if !done {
                // f16 (or a misaligned row) through f32 rows.
                load(dtype, x, row);
                softmax_row::<M, F32, F32>(row, Ahead::default(), exps, out);
                store(dtype, out, y);
            }
        }
    }
}

/// Softmax of a row stored as `E`; false if the bytes are not aligned to `E`.
#[inline(always)]
fn typed<M: MulAdd, E: Elem>(x: &[u8], ahead: Ahead, exps: &mut [Lanes], y: &mut [u8]) -> bool {
    match (
        bytemuck::try_cast_slice::<u8, E::Bits>(x),
        bytemuck::try_cast_slice_mut::<u8, E::Bits>(y),
    ) {
        (Ok(x), Ok(y)) => {
            softmax_row::<M, E, E>(x, ahead, exps, y);
            true
        }
        _ => false,
    }
}

/// Softmax of `x` into `y` in three passes: the max, the exponentials (kept in `exps`) and
/// their sum, and the scaled store. Four accumulators per reduction keep several vector
/// operations in flight.
#[inline(always)]
fn softmax_row<M: MulAdd, I: Elem, O: Elem>(
    x: &[I::Bits],
    ahead: Ahead,
    exps: &mut [Lanes],
    y: &mut [O::Bits],
) {
    let n = x.len();
    let (full, tail) = chunks(n);
    let groups = full / 4;

    let mut m = [splat(f32::NEG_INFINITY); 4];
    for g in 0..groups {
        for (k, m) in m.iter_mut().enumerate() {
            *m = max(*m, I::load(x, 4 * g + k));
        }
    }
    for c in 4 * groups..full {
        m[0] = max(m[0], I::load(x, c));
    }
    if tail > 0 {
        m[1] = max(m[1], I::load_tail(x, full, f32::NEG_INFINITY));
    }
    let row_max = splat(hmax(max(max(m[0], m[1]), max(m[2], m[3]))));

    // A NaN input passes the max over but gives a NaN exponential, so the sum and every output
    // are NaN, as in the reference.
    let exp = |v: Lanes| map(sub(v, row_max), math::exp_nonpositive::<M>);
    let mut s = [splat(0.0); 4];
    let (body, rest) = exps.split_at_mut(4 * groups);
    for (g, e4) in body.chunks_exact_mut(4).enumerate() {
        // While the exponentials keep the core busy.
        ahead.fetch(4 * W * g, 4 * W * (g + 1));
        for (k, (e, s)) in e4.iter_mut().zip(&mut s).enumerate() {
            *e = exp(I::load(x, 4 * g + k));
            *s = add(*s, *e);
        }
    }
    for (c, e) in (4 * groups..full).zip(rest.iter_mut()) {
        *e = exp(I::load(x, c));
        s[0] = add(s[0], *e);
    }
    if tail > 0 {
        // Lanes past the end are -inf, whose exponential is 0.
        let e = exp(I::load_tail(x, full, f32::NEG_INFINITY));
        exps[full] = e;
        s[1] = add(s[1], e);
    }
    let scale = 1.0 / hsum(add(add(s[0], s[1]), add(s[2], s[3])));

    let exps: &[f32] = bytemuck::cast_slice(exps);
    O::map_store(&exps[..n], y, |e| e * scale);
}
