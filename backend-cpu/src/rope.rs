//! Rotary position embedding on [S, H, D] or [B, S, H, D] tensors with arbitrary strides.

use crate::convert::{expect_dtype, float_dtype, load, store};
use crate::rows::{block_rows, carve_rows, rows_of, RowReader};
use crate::simd::vectorised;
use crate::views::with_views;
use calico_core::{DType, Error, Result, Tensor};
use rayon::prelude::*;

/// Batch, sequence and head extents and the element strides of one rope operand.
#[derive(Clone, Copy)]
struct Dims {
    extents: [usize; 3],
    strides: [usize; 3],
}

impl Dims {
    fn of(t: &Tensor, what: &str) -> Result<Dims> {
        let (shape, strides) = (t.shape(), t.strides());
        let d = match shape.len() {
            3 => Dims {
                extents: [1, shape[0], shape[1]],
                strides: [0, strides[0], strides[1]],
            },
            4 => Dims {
                extents: [shape[0], shape[1], shape[2]],
                strides: [strides[0], strides[1], strides[2]],
            },
            r => {
                return Err(Error::shape(format!(
                    "rope: {what} must be [S, H, D] or [B, S, H, D], got rank {r}"
                )))
            }
        };
        let last = shape.len() - 1;
        if shape[last] > 1 && strides[last] != 1 {
            return Err(Error::stride(format!(
                "rope: the last dimension of {what} must be contiguous"
            )));
        }
        Ok(d)
    }

    /// Element offset of row `r` (rows enumerate batch, sequence, head in order).
    fn start(&self, r: usize) -> usize {
        let [_, s, h] = self.extents;
        let (bi, si, hi) = (r / (s * h), (r / h) % s, r % h);
        bi * self.strides[0] + si * self.strides[1] + hi * self.strides[2]
    }

    /// The largest row offset.
    fn max_start(&self) -> usize {
        (0..3)
            .map(|i| (self.extents[i] - 1) * self.strides[i])
            .sum()
    }

    fn rows(&self) -> usize {
        self.extents.iter().product()
    }
}

/// Rotates pairs of `x` by the angles of token positions `pos_offset + s`: pairs are
/// `(x[2i], x[2i+1])` when `interleaved`, else `(x[i], x[i + D/2])`. `cos` and `sin` are f32
/// `[P, D/2]` with `P >= pos_offset + S`.
pub fn rope(
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    pos_offset: usize,
    interleaved: bool,
    y: &Tensor,
) -> Result<()> {
    let dtype = float_dtype(x)?;
    expect_dtype(y, dtype)?;
    expect_dtype(cos, DType::F32)?;
    expect_dtype(sin, DType::F32)?;
    if x.shape() != y.shape() {
        return Err(Error::shape(format!(
            "rope: x is {:?} but y is {:?}",
            x.shape(),
            y.shape()
        )));
    }
    let (xd, yd) = (Dims::of(x, "x")?, Dims::of(y, "y")?);
    let d = x.shape().last().copied().unwrap_or(0);
    if d % 2 != 0 {
        return Err(Error::shape(format!(
            "rope: the head dimension must be even, got {d}"
        )));
    }
    let (half, seq, rows) = (d / 2, xd.extents[1], xd.rows());
    if rows == 0 || d == 0 {
        return Ok(());
    }

    with_views(&[x, cos, sin], &[y], |ins, outs| {
        let (x_bytes, cos_bytes, sin_bytes, y_bytes) = match (ins, outs.into_iter().next()) {
            (&[x, c, s], Some(y)) => (x, c, s, y),
            _ => return Err(Error::unsupported("internal: missing view")),
        };
        let need = pos_offset.saturating_add(seq);
        let cos_rows = table(cos, cos_bytes, "cos", half, need)?;
        let sin_rows = table(sin, sin_bytes, "sin", half, need)?;

        let esz = dtype.size_bytes();
        let row_bytes = d * esz;
        if (xd.max_start() + d) * esz > x_bytes.len() {
            return Err(Error::OutOfBounds(
                "rope: x rows reach past its bytes".into(),
            ));
        }
        let starts: Vec<usize> = (0..rows).map(|r| yd.start(r) * esz).collect();
        let y_rows = carve_rows(y_bytes, &starts, row_bytes)?;
        y_rows
            .into_par_iter()
            .enumerate()
            .with_min_len(block_rows(rows, d))
            .for_each_init(
                || vec![0.0f32; 3 * d],
                |scratch, (r, y_row)| {
                    let (row, rest) = scratch.split_at_mut(d);
                    let (out, cs) = rest.split_at_mut(d);
                    let (c, s) = cs.split_at_mut(half);
                    let x_start = xd.start(r) * esz;
                    let p = pos_offset + (r / xd.extents[2]) % seq;
                    vectorised(
                        #[inline(always)]
                        || {
                            load(dtype, &x_bytes[x_start..x_start + row_bytes], row);
                            cos_rows.load(p, c);
                            sin_rows.load(p, s);
                            rotate(row, c, s, interleaved, out);
                            store(dtype, out, y_row);
                        },
                    )
                },
            );
        Ok(())
    })
}

/// A cos or sin table: f32 rows of `half`, at least `need` of them.
fn table<'a>(
    t: &Tensor,
    bytes: &'a [u8],
    what: &str,
    half: usize,
    need: usize,
) -> Result<RowReader<'a>> {
    let r = rows_of(t, bytes.len())?;
    if r.cols != half || r.rows < need {
        return Err(Error::shape(format!(
            "rope: {what} is {:?}; it needs at least {need} rows of {half}",
            t.shape()
        )));
    }
    Ok(RowReader::new(bytes, &r, DType::F32))
}

#[inline(always)]
fn rotate(x: &[f32], cos: &[f32], sin: &[f32], interleaved: bool, out: &mut [f32]) {
    let half = cos.len();
    if interleaved {
        for (((o, p), &c), &s) in out
            .chunks_exact_mut(2)
            .zip(x.chunks_exact(2))
            .zip(cos)
            .zip(sin)
        {
            o[0] = p[0] * c - p[1] * s;
            o[1] = p[0] * s + p[1] * c;
        }
    } else {
        let (xa, xb) = x.split_at(half);
        let (oa, ob) = out.split_at_mut(half);
        // Zipped iterators carry no bounds checks, so the loop vectorises.
        for ((((oa, ob), (&a, &b)), &c), &s) in oa
            .iter_mut()
            .zip(ob.iter_mut())
            .zip(xa.iter().zip(xb))
            .zip(cos)
            .zip(sin)
        {
            *oa = a * c - b * s;
            *ob = a * s + b * c;
        }
    }
}
