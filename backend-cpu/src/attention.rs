//! Scaled dot-product attention (forward, backward, packed variable-length batches) in f32.
//!
//! Work is split with rayon over (sequence, head, block of rows). The forward pass runs each
//! block's rows through key_blocks.rs: the visible keys in blocks, each block's K and V rows
//! widened once for all the rows, with an online softmax (running max and sum, the
//! accumulator rescaled when the max grows), as the GPU kernels do. The backward pass is in
//! attention_backward.rs.

use crate::convert::{expect_dtype, float_dtype, load, store};
use crate::key_blocks::{self, KeyRows, Logit, Partial};
use crate::rows::carve_rows;
use crate::views::with_views;
use calico_core::{DType, Error, Result, Tensor};
use rayon::prelude::*;

/// Rows per rayon task at most: a task widens the other side's rows once for all of its rows.
const MAX_ROWS_PER_TASK: usize = 64;

/// Rows per rayon task at least, when fewer rows per task are needed to keep every thread busy.
const MIN_ROWS_PER_TASK: usize = 16;

/// Tasks per rayon thread that the task size aims for (so that uneven tasks, causal ones,
/// balance out).
const TASKS_PER_THREAD: usize = 4;

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
    pub(crate) fn visible_queries(&self, j: usize, n_q: usize, n_k: usize) -> (usize, usize) {
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

    /// The map from `q . k` to the logit.
    pub(crate) fn logit(&self) -> Logit {
        Logit {
            scale: self.scale,
            softcap: self.softcap,
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
    pub(crate) fn group(&self) -> usize {
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
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    dtype: DType,
    first: usize,
    strides: [usize; 3],
    width: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(t: &Tensor, bytes: &'a [u8], is_lse: bool, width: usize) -> Result<Self> {
        Ok(Reader {
            bytes,
            dtype: t.dtype(),
            first: t.layout().offset(),
            strides: strides_of(t, is_lse)?,
            width,
        })
    }

    /// Byte offset within the view slice of position `pos` (absolute) of head `h`.
    pub(crate) fn at(&self, batch: usize, h: usize, pos: usize) -> usize {
        let e = self.first + batch * self.strides[0] + h * self.strides[1] + pos * self.strides[2];
        (e - self.first) * self.dtype.size_bytes()
    }

    pub(crate) fn load(&self, batch: usize, h: usize, pos: usize, dst: &mut [f32]) -> Result<()> {
        let src = self.row_bytes(batch, h, pos)?;
        load(self.dtype, src, &mut dst[..self.width]);
        Ok(())
    }

    /// The dtype the rows are stored in.
    pub(crate) fn dtype(&self) -> DType {
        self.dtype
    }

    /// The stored bytes of the row at position `pos` of head `h`.
    pub(crate) fn row_bytes(&self, batch: usize, h: usize, pos: usize) -> Result<&'a [u8]> {
        let start = self.at(batch, h, pos);
        let len = self.width * self.dtype.size_bytes();
        self.bytes
            .get(start..start + len)
            .ok_or_else(|| Error::OutOfBounds("attention: a row reaches past its tensor".into()))
    }

    pub(crate) fn scalar(&self, batch: usize, h: usize, pos: usize) -> Result<f32> {
        let mut v = [0.0f32];
        self.load(batch, h, pos, &mut v)?;
        Ok(v[0])
    }
}

/// One KV head's keys of one sequence, for key_blocks::attend.
struct HeadKeys<'a> {
    k: Reader<'a>,
    v: Reader<'a>,
    batch: usize,
    head: usize,
    /// The sequence's first key along the sequence dimension.
    start: usize,
}

impl KeyRows for HeadKeys<'_> {
    fn k(&self, j: usize, dst: &mut [f32]) -> Result<()> {
        self.k.load(self.batch, self.head, self.start + j, dst)
    }

    fn v(&self, j: usize, dst: &mut [f32]) -> Result<()> {
        self.v.load(self.batch, self.head, self.start + j, dst)
    }

    /// Pair dot products end each score in a sum across lanes (~3 instructions) that the
    /// transposed f32 form does not pay; at head dim 64, where a task's 16-64 rows share each K
    /// block's transpose, that form measured as fast or faster (dev machine: 16 heads x 512 x
    /// 64, 6.9-8.3 ms against 8.6-8.8), at 128 the pairs 10-20% faster.
    fn pair_scores(&self) -> bool {
        self.k.dtype == DType::BF16 && self.k.width > 64
    }

    /// On AMX tiles (scores, and P V with P rounded to bf16) at head dim 128: 1024 causal
    /// rows 70-74 -> 51-52 ms on the 2-core Xeon. At head dim 64 (not pair scores) the scores
    /// on tiles measured the same as the widened form (docs/perf-log.md, session 32).
    fn tile_scores(&self) -> bool {
        true
    }

    fn v_bytes(&self, j: usize) -> Result<&[u8]> {
        self.v.row_bytes(self.batch, self.head, self.start + j)
    }

    fn k_bytes(&self, j: usize) -> Result<&[u8]> {
        self.k.row_bytes(self.batch, self.head, self.start + j)
    }
}

/// A unit of work: rows `rows` of head `head` of sequence `seq`.
#[derive(Debug, Clone)]
pub(crate) struct Task {
    pub(crate) seq: usize,
    pub(crate) head: usize,
    pub(crate) rows: std::ops::Range<usize>,
}

/// The tasks over every head's rows of every sequence (`len` rows in each), in order of
/// sequence, head and row.
pub(crate) fn tasks(
    shape: &AttentionShape,
    heads: usize,
    len: impl Fn(&SeqSpan) -> usize,
) -> Vec<Task> {
    let count = |size: usize| -> usize {
        let per_head: usize = shape.seqs.iter().map(|s| len(s).div_ceil(size)).sum();
        per_head * heads
    };
    let wanted = TASKS_PER_THREAD * rayon::current_num_threads();
    let mut size = MAX_ROWS_PER_TASK;
    while size > MIN_ROWS_PER_TASK && count(size) < wanted {
        size /= 2;
    }
    let mut out = Vec::with_capacity(count(size));
    for (s, span) in shape.seqs.iter().enumerate() {
        for head in 0..heads {
            let n = len(span);
            for r0 in (0..n).step_by(size) {
                out.push(Task {
                    seq: s,
                    head,
                    rows: r0..(r0 + size).min(n),
                });
            }
        }
    }
    out
}

/// Cuts an output into one mutable row per task row, grouped by task.
pub(crate) fn carve_task_rows<'a>(
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

pub(crate) fn check_dtypes(inputs: &[&Tensor], lse: &Tensor) -> Result<DType> {
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
                let keys = HeadKeys {
                    k: kr,
                    v: vr,
                    batch: span.batch,
                    head: kv_head,
                    start: span.k_start,
                };
                key_blocks::attend(&qv, d, &ranges, &keys, params.logit(), &mut part)?;
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
