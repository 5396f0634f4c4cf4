//! Scaled dot-product attention (forward, backward, packed variable-length batches) in f32.
//!
//! Work is split with rayon over (sequence, head, block of rows). The forward pass runs each
//! block's rows through key_blocks.rs: the visible keys in blocks, each block's K and V rows
//! widened once for all the rows, with an online softmax (running max and sum, the
//! accumulator rescaled when the max grows), as the GPU kernels do. The backward pass
//! recomputes the probabilities from the saved log-sum-exp: one pass over query blocks writes
//! dQ, another over key blocks writes dK and dV (summed over the query heads that share a KV
//! head), so no two tasks write one element and the result does not depend on the thread
//! count.

use crate::convert::{expect_dtype, float_dtype, load, store};
use crate::key_blocks::{self, Partial};
use crate::math;
use crate::rows::carve_rows;
use crate::views::with_views;
use calico_core::{DType, Error, Result, Tensor};
use rayon::prelude::*;

/// Rows per rayon task.
const ROWS_PER_TASK: usize = 16;

/// The score transform and mask of one call, resolved by the caller.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionParams {
    /// Multiplies `q . k` before the soft-cap.
    pub scale: f32,
    /// `s = cap * tanh(s / cap)` when set.
    pub softcap: Option<f32>,
    /// Query `i` sees key `j` iff `c - left <= j <= c + right` with `c = i + n_k - n_q`
    /// (bottom-right aligned); `None` is unbounded. Causal is `right = Some(0)`.
    pub left: Option<usize>,
    pub right: Option<usize>,
}

impl AttentionParams {
    /// The keys query `i` sees, as a half-open range (empty when none).
    pub fn visible_keys(&self, i: usize, n_q: usize, n_k: usize) -> (usize, usize) {
        let center = i as i64 + n_k as i64 - n_q as i64;
        let lo = self.left.map_or(0, |l| (center - l as i64).max(0));
        let hi = self
            .right
            .map_or(n_k as i64, |r| (center + r as i64 + 1).min(n_k as i64));
        if hi <= lo {
            (0, 0)
        } else {
            (lo as usize, hi as usize)
        }
    }

    /// The queries that see key `j`, as a half-open range (empty when none).
    fn visible_queries(&self, j: usize, n_q: usize, n_k: usize) -> (usize, usize) {
        // c - left <= j  <=>  i <= j + left - shift;  j <= c + right  <=>  i >= j - right - shift.
        let shift = n_k as i64 - n_q as i64;
        let lo = self
            .right
            .map_or(0, |r| (j as i64 - r as i64 - shift).max(0));
        let hi = self.left.map_or(n_q as i64, |l| {
            (j as i64 + l as i64 - shift + 1).min(n_q as i64)
        });
        if hi <= lo {
            (0, 0)
        } else {
            (lo as usize, hi as usize)
        }
    }

    /// The transformed score and its derivative with respect to the scaled score.
    #[inline]
    fn score(&self, dot: f32) -> (f32, f32) {
        let s = dot * self.scale;
        match self.softcap {
            Some(cap) => {
                let t = (s / cap).tanh();
                (cap * t, 1.0 - t * t)
            }
            None => (s, 1.0),
        }
    }
}

/// One sequence: its index in the batch dimension (0 for packed tensors), where its queries
/// and keys start along the sequence dimension, and how many there are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqSpan {
    pub batch: usize,
    pub q_start: usize,
    pub q_len: usize,
    pub k_start: usize,
    pub k_len: usize,
}

/// The sequences, head counts and head dimension of a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttentionShape {
    pub seqs: Vec<SeqSpan>,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl AttentionShape {
    fn group(&self) -> usize {
        self.q_heads / self.kv_heads.max(1)
    }
}

/// Element strides (batch, head, position) of an operand: `[B, H, N, D]` or packed
/// `[T, H, D]` (batch stride 0); an LSE is `[B, H, N]` or packed `[H, T]`.
fn strides_of(t: &Tensor, is_lse: bool) -> Result<[usize; 3]> {
    let s = t.strides();
    match (is_lse, s.len()) {
        (false, 4) | (true, 3) => Ok([s[0], s[1], s[2]]),
        (false, 3) => Ok([0, s[1], s[0]]),
        (true, 2) => Ok([0, s[0], s[1]]),
        (_, r) => Err(Error::shape(format!("attention: unexpected rank {r}"))),
    }
}

/// Read access to one operand's rows through its view slice.
#[derive(Clone, Copy)]
struct Reader<'a> {
    bytes: &'a [u8],
    dtype: DType,
    first: usize,
    strides: [usize; 3],
    width: usize,
}

impl<'a> Reader<'a> {
    fn new(t: &Tensor, bytes: &'a [u8], is_lse: bool, width: usize) -> Result<Self> {
        Ok(Reader {
            bytes,
            dtype: t.dtype(),
            first: t.layout().offset(),
            strides: strides_of(t, is_lse)?,
            width,
        })
    }

    /// Byte offset within the view slice of position `pos` (absolute) of head `h`.
    fn at(&self, batch: usize, h: usize, pos: usize) -> usize {
        let e = self.first + batch * self.strides[0] + h * self.strides[1] + pos * self.strides[2];
        (e - self.first) * self.dtype.size_bytes()
    }

    fn load(&self, batch: usize, h: usize, pos: usize, dst: &mut [f32]) -> Result<()> {
        let start = self.at(batch, h, pos);
        let len = self.width * self.dtype.size_bytes();
        let src = self
            .bytes
            .get(start..start + len)
            .ok_or_else(|| Error::OutOfBounds("attention: a row reaches past its tensor".into()))?;
        load(self.dtype, src, &mut dst[..self.width]);
        Ok(())
    }

    fn scalar(&self, batch: usize, h: usize, pos: usize) -> Result<f32> {
        let mut v = [0.0f32];
        self.load(batch, h, pos, &mut v)?;
        Ok(v[0])
    }
}

/// A unit of work: rows `rows` of head `head` of sequence `seq`.
#[derive(Debug, Clone)]
struct Task {
    seq: usize,
    head: usize,
    rows: std::ops::Range<usize>,
}

fn tasks(shape: &AttentionShape, heads: usize, len: impl Fn(&SeqSpan) -> usize) -> Vec<Task> {
    let mut out = Vec::new();
    for (s, span) in shape.seqs.iter().enumerate() {
        for head in 0..heads {
            let n = len(span);
            for r0 in (0..n).step_by(ROWS_PER_TASK) {
                out.push(Task {
                    seq: s,
                    head,
                    rows: r0..(r0 + ROWS_PER_TASK).min(n),
                });
            }
        }
    }
    out
}

/// Cuts an output into one mutable row per task row, grouped by task.
fn carve_task_rows<'a>(
    bytes: &'a mut [u8],
    out: &Reader<'_>,
    shape: &AttentionShape,
    tasks: &[Task],
    start: impl Fn(&SeqSpan) -> usize,
) -> Result<Vec<Vec<&'a mut [u8]>>> {
    let mut starts = Vec::new();
    for t in tasks {
        let span = &shape.seqs[t.seq];
        for r in t.rows.clone() {
            starts.push(out.at(span.batch, t.head, start(span) + r));
        }
    }
    let mut rows = carve_rows(bytes, &starts, out.width * out.dtype.size_bytes())?.into_iter();
    Ok(tasks
        .iter()
        .map(|t| rows.by_ref().take(t.rows.len()).collect())
        .collect())
}

fn check_dtypes(inputs: &[&Tensor], lse: &Tensor) -> Result<DType> {
    let dtype = float_dtype(inputs[0])?;
    for t in inputs {
        expect_dtype(t, dtype)?;
    }
    expect_dtype(lse, DType::F32)?;
    Ok(dtype)
}

/// Forward attention: `o = softmax(mask(transform(q k^T))) v` and `lse` = the natural log of
/// each row's softmax denominator. A row that sees no key gets `o = 0`, `lse = -inf`.
#[allow(clippy::too_many_arguments)]
pub fn attention_forward(
    shape: &AttentionShape,
    params: &AttentionParams,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o: &Tensor,
    lse: &Tensor,
) -> Result<()> {
    let dtype = check_dtypes(&[q, k, v, o], lse)?;
    let d = shape.head_dim;
    let group = shape.group();
    with_views(&[q, k, v], &[o, lse], |ins, outs| {
        let [qb, kb, vb] = ins else {
            return Err(Error::unsupported("internal: missing view"));
        };
        let mut outs = outs.into_iter();
        let (ob, lb) = match (outs.next(), outs.next()) {
            (Some(o), Some(l)) => (o, l),
            _ => return Err(Error::unsupported("internal: missing view")),
        };
        let (qr, kr, vr) = (
            Reader::new(q, qb, false, d)?,
            Reader::new(k, kb, false, d)?,
            Reader::new(v, vb, false, d)?,
        );
        let or = Reader::new(o, &[], false, d)?;
        let lr = Reader::new(lse, &[], true, 1)?;
        let work = tasks(shape, shape.q_heads, |s| s.q_len);
        let o_rows = carve_task_rows(ob, &or, shape, &work, |s| s.q_start)?;
        let l_rows = carve_task_rows(lb, &lr, shape, &work, |s| s.q_start)?;
        work.into_par_iter().zip(o_rows).zip(l_rows).try_for_each(
            |((task, mut o_rows), mut l_rows)| {
                let span = shape.seqs[task.seq];
                let kv_head = task.head / group;
                // The task's rows share each K and V row, widened once for all of them.
                let rows = task.rows.len();
                let mut qv = vec![0.0f32; rows * d];
                let mut ranges = Vec::with_capacity(rows);
                for (r, i) in task.rows.clone().enumerate() {
                    qr.load(
                        span.batch,
                        task.head,
                        span.q_start + i,
                        &mut qv[r * d..(r + 1) * d],
                    )?;
                    ranges.push(params.visible_keys(i, span.q_len, span.k_len));
                }
                let mut part = Partial::empty(rows, d);
                let key = |j: usize| span.k_start + j;
                key_blocks::attend(
                    &qv,
                    d,
                    &ranges,
                    |j, dst| kr.load(span.batch, kv_head, key(j), dst),
                    |j, dst| vr.load(span.batch, kv_head, key(j), dst),
                    |dot| params.score(dot).0,
                    &mut part,
                )?;
                let mut out = vec![0.0f32; d];
                for r in 0..rows {
                    let row_lse = key_blocks::merge(std::slice::from_ref(&part), r, &mut out);
                    store(dtype, &out, o_rows[r]);
                    store(DType::F32, &[row_lse], l_rows[r]);
                }
                Ok::<(), Error>(())
            },
        )
    })
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let tail: f32 = ta.iter().zip(tb).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// The softmax probability of a score given the row's log-sum-exp (0 for a row with no keys).
#[inline]
fn probability(s: f32, lse: f32) -> f32 {
    if lse == f32::NEG_INFINITY {
        0.0
    } else {
        math::exp(s - lse)
    }
}

/// Backward attention: the gradients of `o` with respect to `q`, `k` and `v` given `d_o`,
/// with `o` and `lse` from the forward pass. dK and dV sum over the query heads that share a
/// KV head.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    shape: &AttentionShape,
    params: &AttentionParams,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o: &Tensor,
    lse: &Tensor,
    d_o: &Tensor,
    dq: &Tensor,
    dk: &Tensor,
    dv: &Tensor,
) -> Result<()> {
    let dtype = check_dtypes(&[q, k, v, o, d_o, dq, dk, dv], lse)?;
    let d = shape.head_dim;
    let group = shape.group();
    with_views(&[q, k, v, o, lse, d_o], &[dq, dk, dv], |ins, outs| {
        let [qb, kb, vb, ob, lb, dob] = ins else {
            return Err(Error::unsupported("internal: missing view"));
        };
        let mut outs = outs.into_iter();
        let (dqb, dkb, dvb) = match (outs.next(), outs.next(), outs.next()) {
            (Some(a), Some(b), Some(c)) => (a, b, c),
            _ => return Err(Error::unsupported("internal: missing view")),
        };
        let qr = Reader::new(q, qb, false, d)?;
        let kr = Reader::new(k, kb, false, d)?;
        let vr = Reader::new(v, vb, false, d)?;
        let or = Reader::new(o, ob, false, d)?;
        let lr = Reader::new(lse, lb, true, 1)?;
        let dor = Reader::new(d_o, dob, false, d)?;

        // delta_i = dO_i . O_i, the row term of the softmax gradient, per (seq, q head, row).
        let delta_of = |batch: usize, h: usize, pos: usize, a: &mut [f32], b: &mut [f32]| {
            dor.load(batch, h, pos, a)?;
            or.load(batch, h, pos, b)?;
            Ok::<f32, Error>(dot(a, b))
        };

        // The rows of all three outputs are cut before any is written, so that rows which
        // overlap (an `Aliasing` error) leave every output as it was.
        // dQ: one task per block of query rows; dK and dV: one per block of key rows of a KV
        // head, over its query heads.
        let q_work = tasks(shape, shape.q_heads, |s| s.q_len);
        let dq_rows =
            carve_task_rows(dqb, &Reader::new(dq, &[], false, d)?, shape, &q_work, |s| {
                s.q_start
            })?;
        let k_work = tasks(shape, shape.kv_heads, |s| s.k_len);
        let dk_rows =
            carve_task_rows(dkb, &Reader::new(dk, &[], false, d)?, shape, &k_work, |s| {
                s.k_start
            })?;
        let dv_rows =
            carve_task_rows(dvb, &Reader::new(dv, &[], false, d)?, shape, &k_work, |s| {
                s.k_start
            })?;
        q_work
            .into_par_iter()
            .zip(dq_rows)
            .try_for_each(|(task, mut rows)| {
                let span = shape.seqs[task.seq];
                let kv_head = task.head / group;
                let [mut qrow, mut dorow, mut orow, mut krow, mut vrow, mut acc] =
                    std::array::from_fn(|_| vec![0.0f32; d]);
                for (r, i) in task.rows.clone().enumerate() {
                    let pos = span.q_start + i;
                    qr.load(span.batch, task.head, pos, &mut qrow)?;
                    let delta = delta_of(span.batch, task.head, pos, &mut dorow, &mut orow)?;
                    let row_lse = lr.scalar(span.batch, task.head, pos)?;
                    acc.fill(0.0);
                    let (lo, hi) = params.visible_keys(i, span.q_len, span.k_len);
                    for j in lo..hi {
                        kr.load(span.batch, kv_head, span.k_start + j, &mut krow)?;
                        vr.load(span.batch, kv_head, span.k_start + j, &mut vrow)?;
                        let (s, ds_dx) = params.score(dot(&qrow, &krow));
                        let p = probability(s, row_lse);
                        let dx = p * (dot(&dorow, &vrow) - delta) * ds_dx;
                        acc.iter_mut().zip(&krow).for_each(|(a, k)| *a += dx * k);
                    }
                    acc.iter_mut().for_each(|a| *a *= params.scale);
                    store(dtype, &acc, rows[r]);
                }
                Ok::<(), Error>(())
            })?;

        k_work
            .into_par_iter()
            .zip(dk_rows)
            .zip(dv_rows)
            .try_for_each(|((task, mut dk_rows), mut dv_rows)| {
                let span = shape.seqs[task.seq];
                let [mut qrow, mut dorow, mut orow, mut krow, mut vrow, mut dk_acc, mut dv_acc] =
                    std::array::from_fn(|_| vec![0.0f32; d]);
                for (r, j) in task.rows.clone().enumerate() {
                    kr.load(span.batch, task.head, span.k_start + j, &mut krow)?;
                    vr.load(span.batch, task.head, span.k_start + j, &mut vrow)?;
                    dk_acc.fill(0.0);
                    dv_acc.fill(0.0);
                    let (lo, hi) = params.visible_queries(j, span.q_len, span.k_len);
                    for h in task.head * group..(task.head + 1) * group {
                        for i in lo..hi {
                            let pos = span.q_start + i;
                            qr.load(span.batch, h, pos, &mut qrow)?;
                            let delta = delta_of(span.batch, h, pos, &mut dorow, &mut orow)?;
                            let row_lse = lr.scalar(span.batch, h, pos)?;
                            let (s, ds_dx) = params.score(dot(&qrow, &krow));
                            let p = probability(s, row_lse);
                            let dx = p * (dot(&dorow, &vrow) - delta) * ds_dx;
                            dv_acc.iter_mut().zip(&dorow).for_each(|(a, g)| *a += p * g);
                            dk_acc.iter_mut().zip(&qrow).for_each(|(a, q)| *a += dx * q);
                        }
                    }
                    dk_acc.iter_mut().for_each(|a| *a *= params.scale);
                    store(dtype, &dk_acc, dk_rows[r]);
                    store(dtype, &dv_acc, dv_rows[r]);
                }
                Ok::<(), Error>(())
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_ranges_agree() {
        let cases = [
            (None, None),
            (None, Some(0)),
            (Some(3), Some(0)),
            (Some(2), Some(5)),
            (Some(100), Some(100)),
        ];
        for (left, right) in cases {
            let p = AttentionParams {
                scale: 1.0,
                softcap: None,
                left,
                right,
            };
            for (nq, nk) in [(1, 1), (5, 9), (9, 5), (7, 7), (1, 13), (13, 1)] {
                for i in 0..nq {
                    for j in 0..nk {
                        let (klo, khi) = p.visible_keys(i, nq, nk);
                        let (qlo, qhi) = p.visible_queries(j, nq, nk);
                        assert_eq!(
                            (klo..khi).contains(&j),
                            (qlo..qhi).contains(&i),
                            "{left:?} {right:?} {nq} {nk} {i} {j}"
                        );
                    }
                }
            }
        }
        let causal = AttentionParams {
            scale: 1.0,
            softcap: None,
            left: None,
            right: Some(0),
        };
        // Bottom-right alignment: the last query sees every key; with n_q > n_k the first
        // queries see none.
        assert_eq!(causal.visible_keys(2, 3, 5), (0, 5));
        assert_eq!(causal.visible_keys(0, 3, 5), (0, 3));
        assert_eq!(causal.visible_keys(0, 5, 3), (0, 0));
        assert_eq!(causal.visible_keys(2, 5, 3), (0, 1));
    }
}
