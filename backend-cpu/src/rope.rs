//! Rotary position embedding on [S, H, D] or [B, S, H, D] tensors with arbitrary strides.

use crate::convert::{expect_dtype, float_dtype, load, store};
use crate::lanes::{Bf16, Elem, Lanes, F32, W};
use crate::rows::{block_rows, carve_rows, rows_of, with_scratch, RowReader};
use crate::simd::vectorised;
use crate::views::with_views;
use calico_core::{DType, Error, Result, Tensor};
use rayon::prelude::*;

/// Batch, sequence and head extents and the element strides of one rope operand.
#[derive(Clone, Copy, Debug)]
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

    /// Element offset of the row of batch `b`, token `s`, head `h`.
    #[inline(always)]
    fn offset(&self, b: usize, s: usize, h: usize) -> usize {
        b * self.strides[0] + s * self.strides[1] + h * self.strides[2]
    }

    /// Whether row r of `d` elements starts at element r * d (rows in (batch, token, head)
    /// order, one after another).
    fn is_dense(&self, d: usize) -> bool {
        let [nb, ns, nh] = self.extents;
        (nh == 1 || self.strides[2] == d)
            && (ns == 1 || self.strides[1] == nh * d)
            && (nb == 1 || self.strides[0] == ns * nh * d)
    }

    /// Byte offsets of every row for elements of `esz` bytes, rows in (batch, token, head)
    /// order.
    fn row_starts(&self, esz: usize) -> Vec<usize> {
        let [nb, ns, nh] = self.extents;
        let mut starts = Vec::with_capacity(self.rows());
        for b in 0..nb {
            for s in 0..ns {
                for h in 0..nh {
                    starts.push(self.offset(b, s, h) * esz);
                }
            }
        }
        starts
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
        let heads = xd.extents[2];
        // Whole positions per task (the heads of one position share its cos and sin rows).
        let positions_per_task = (block_rows(rows, d) / heads).max(1);
        let task = Task {
            x_bytes,
            xd,
            cos_rows,
            sin_rows,
            dtype,
            d,
            heads,
            seq,
            pos_offset,
            interleaved,
            positions_per_task,
        };
        let task_rows = positions_per_task * heads;
        if yd.is_dense(d) {
            // Rows one after another: tasks take whole byte ranges, no list of rows.
            let y_bytes = y_bytes
                .get_mut(..rows * row_bytes)
                .ok_or_else(|| Error::OutOfBounds("rope: y rows reach past its bytes".into()))?;
            y_bytes
                .par_chunks_mut(task_rows * row_bytes)
                .enumerate()
                .for_each(|(t, chunk)| task.run(t, chunk.chunks_mut(row_bytes)));
        } else {
            carve_rows(y_bytes, &yd.row_starts(esz), row_bytes)?
                .into_par_iter()
                .chunks(task_rows)
                .enumerate()
                .for_each(|(t, rows)| task.run(t, rows.into_iter()));
        }
        Ok(())
    })
}

/// What every task of one rope call shares.
struct Task<'a> {
    x_bytes: &'a [u8],
    xd: Dims,
    cos_rows: RowReader<'a>,
    sin_rows: RowReader<'a>,
    dtype: DType,
    d: usize,
    heads: usize,
    seq: usize,
    pos_offset: usize,
    interleaved: bool,
    positions_per_task: usize,
}

impl Task<'_> {
    /// Task `t`: the output rows of positions `t * positions_per_task ..`, heads in order.
    fn run<'y>(&self, t: usize, mut y_rows: impl Iterator<Item = &'y mut [u8]>) {
        let (d, half, dtype) = (self.d, self.d / 2, self.dtype);
        let (esz, lanes) = (dtype.size_bytes(), d.div_ceil(W));
        with_scratch(3 * lanes, |scratch| {
            let mut bufs = scratch
                .chunks_exact_mut(lanes)
                .map(|c| &mut bytemuck::cast_slice_mut::<Lanes, f32>(c)[..d]);
            let mut next = || bufs.next().unwrap_or_else(|| unreachable!("3 buffers"));
            let (table, row, out) = (next(), next(), next());
            let (cos, sin) = table.split_at_mut(half);
            vectorised(
                #[inline(always)]
                || {
                    for j in 0..self.positions_per_task {
                        let bs = t * self.positions_per_task + j;
                        let (b, s) = (bs / self.seq, bs % self.seq);
                        let p = self.pos_offset + s;
                        let mut loaded = false;
                        for h in 0..self.heads {
                            let Some(y) = y_rows.next() else { return };
                            if !loaded {
                                self.cos_rows.load(p, cos);
                                self.sin_rows.load(p, sin);
                                loaded = true;
                            }
                            let angles = Angles {
                                cos,
                                sin,
                                interleaved: self.interleaved,
                            };
                            let start = self.xd.offset(b, s, h) * esz;
                            let x = &self.x_bytes[start..start + d * esz];
                            let done = match dtype {
                                DType::BF16 => typed::<Bf16>(x, &angles, y),
                                DType::F32 => typed::<F32>(x, &angles, y),
                                _ => false,
                            };
                            if !done {
                                // f16 (or misaligned rows) through f32 rows.
                                load(dtype, x, row);
                                rotate::<F32, F32>(row, &angles, out);
                                store(dtype, out, y);
                            }
                        }
                    }
                },
            )
        })
    }
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

/// The cos and sin rows of one position, and which elements pair up.
struct Angles<'a> {
    cos: &'a [f32],
    sin: &'a [f32],
    interleaved: bool,
}

/// Rotates a row stored as `E`; false if a slice is not aligned to `E`.
#[inline(always)]
fn typed<E: Elem>(x: &[u8], angles: &Angles, y: &mut [u8]) -> bool {
    match (
        bytemuck::try_cast_slice::<u8, E::Bits>(x),
        bytemuck::try_cast_slice_mut::<u8, E::Bits>(y),
    ) {
        (Ok(x), Ok(y)) => {
            rotate::<E, E>(x, angles, y);
            true
        }
        _ => false,
    }
}

/// Rotates the pairs of `x` into `y`: flat loops over the pairs, which LLVM vectorises along
/// the row (the interleaved form with its de-interleaving shuffles).
#[inline(always)]
fn rotate<I: Elem, O: Elem>(x: &[I::Bits], angles: &Angles, y: &mut [O::Bits]) {
    let (cos, sin) = (angles.cos, angles.sin);
    if angles.interleaved {
        for ((o, p), (&c, &s)) in y
            .chunks_exact_mut(2)
            .zip(x.chunks_exact(2))
            .zip(cos.iter().zip(sin))
        {
            let (a, b) = (I::widen(p[0]), I::widen(p[1]));
            o[0] = O::narrow(a * c - b * s);
            o[1] = O::narrow(a * s + b * c);
        }
    } else {
        let half = cos.len();
        let (xa, xb) = x.split_at(half);
        let (ya, yb) = y.split_at_mut(half);
        for (((oa, ob), (&a, &b)), (&c, &s)) in ya
            .iter_mut()
            .zip(yb.iter_mut())
            .zip(xa.iter().zip(xb))
            .zip(cos.iter().zip(sin))
        {
            let (a, b) = (I::widen(a), I::widen(b));
            *oa = O::narrow(a * c - b * s);
            *ob = O::narrow(a * s + b * c);
        }
    }
}
