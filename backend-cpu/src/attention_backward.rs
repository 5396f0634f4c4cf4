//! The attention backward pass in f32: the gradients of `o` with respect to `q`, `k` and `v`.
//!
//! The probabilities are recomputed from the saved log-sum-exp, a block of [`KEY_BLOCK`] rows
//! of the other side at a time, widened once for all the rows of a task (key_blocks.rs'
//! `Widened`, `block_dots`, `add_weighted_rows`): one pass over blocks of query rows writes dQ
//! (keys in blocks), another over blocks of key rows writes dK and dV (the query heads that
//! share the KV head, then their queries in blocks). No two tasks write one element and every
//! sum runs in a fixed order, so the result does not depend on the thread count.

use crate::attention::{
    carve_task_rows, check_dtypes, tasks, AttentionParams, AttentionShape, Reader, Task,
};
use crate::bf16_pairs;
use crate::convert::store;
use crate::key_blocks::{
    add_weighted_rows_paired, block_dots_pair, block_positions, block_span, Logit, Widened,
    KEY_BLOCK,
};
use crate::math;
use crate::simd::{vectorised_fma, MulAdd};
use crate::views::with_views;
use calico_core::{DType, Error, Result, Tensor};
use rayon::prelude::*;

/// Per query row: the natural-log LSE of the forward pass and `delta = dO . O`, the row term
/// of the softmax gradient.
#[derive(Clone, Copy, Default)]
struct RowStats {
    lse: f32,
    delta: f32,
}

/// The row statistics of every (sequence, query head, row), in the order of `tasks` over
/// query rows: sequence `s` starts at `base[s]`, head `h`'s rows follow `h * q_len` later.
struct AllRowStats {
    stats: Vec<RowStats>,
    base: Vec<usize>,
}

impl AllRowStats {
    fn get(&self, shape: &AttentionShape, seq: usize, head: usize, row: usize) -> RowStats {
        self.stats[self.base[seq] + head * shape.seqs[seq].q_len + row]
    }
}

/// Operand readers of one backward call.
struct Operands<'a> {
    q: Reader<'a>,
    k: Reader<'a>,
    v: Reader<'a>,
    o: Reader<'a>,
    lse: Reader<'a>,
    d_o: Reader<'a>,
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
    with_views(&[q, k, v, o, lse, d_o], &[dq, dk, dv], |ins, outs| {
        let [qb, kb, vb, ob, lb, dob] = ins else {
            return Err(Error::unsupported("internal: missing view"));
        };
        let mut outs = outs.into_iter();
        let (dqb, dkb, dvb) = match (outs.next(), outs.next(), outs.next()) {
            (Some(a), Some(b), Some(c)) => (a, b, c),
            _ => return Err(Error::unsupported("internal: missing view")),
        };
        let ops = Operands {
            q: Reader::new(q, qb, false, d)?,
            k: Reader::new(k, kb, false, d)?,
            v: Reader::new(v, vb, false, d)?,
            o: Reader::new(o, ob, false, d)?,
            lse: Reader::new(lse, lb, true, 1)?,
            d_o: Reader::new(d_o, dob, false, d)?,
        };

        // The rows of all three outputs are cut before any is written, so that rows which
        // overlap (an `Aliasing` error) leave every output as it was.
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

        let stats = row_stats(shape, &ops, &q_work)?;
        q_work
            .into_par_iter()
            .zip(dq_rows)
            .try_for_each(|(task, rows)| {
                let dq = dq_task(shape, params, &ops, &stats, &task)?;
                for (row, out) in dq.chunks_exact(d).zip(rows) {
                    store(dtype, row, out);
                }
                Ok::<(), Error>(())
            })?;
        k_work
            .into_par_iter()
            .zip(dk_rows)
            .zip(dv_rows)
            .try_for_each(|((task, dk_rows), dv_rows)| {
                let (dk, dv) = dkv_task(shape, params, &ops, &stats, &task)?;
                for (row, out) in dk.chunks_exact(d).zip(dk_rows) {
                    store(dtype, row, out);
                }
                for (row, out) in dv.chunks_exact(d).zip(dv_rows) {
                    store(dtype, row, out);
                }
                Ok::<(), Error>(())
            })
    })
}

/// Every query row's LSE and delta, one rayon task per block of rows.
fn row_stats(shape: &AttentionShape, ops: &Operands, q_work: &[Task]) -> Result<AllRowStats> {
    let d = shape.head_dim;
    let per_task = q_work
        .par_iter()
        .map(|task| {
            let span = shape.seqs[task.seq];
            let (mut o_row, mut do_row) = (vec![0.0f32; d], vec![0.0f32; d]);
            task.rows
                .clone()
                .map(|i| {
                    let pos = span.q_start + i;
                    ops.o.load(span.batch, task.head, pos, &mut o_row)?;
                    ops.d_o.load(span.batch, task.head, pos, &mut do_row)?;
                    Ok(RowStats {
                        lse: ops.lse.scalar(span.batch, task.head, pos)?,
                        delta: dot(&o_row, &do_row),
                    })
                })
                .collect::<Result<Vec<_>>>()
        })
        .collect::<Result<Vec<_>>>()?;
    let mut base = Vec::with_capacity(shape.seqs.len());
    let mut next = 0;
    for span in &shape.seqs {
        base.push(next);
        next += shape.q_heads * span.q_len;
    }
    Ok(AllRowStats {
        stats: per_task.concat(),
        base,
    })
}

/// dQ of one task's query rows (rows x d, scaled): `sum_j dS_ij k_j` over the visible keys,
/// in blocks of KEY_BLOCK keys.
fn dq_task(
    shape: &AttentionShape,
    params: &AttentionParams,
    ops: &Operands,
    stats: &AllRowStats,
    task: &Task,
) -> Result<Vec<f32>> {
    let d = shape.head_dim;
    let span = shape.seqs[task.seq];
    let kv_head = task.head / shape.group();
    let n = task.rows.len();
    let (mut q, mut d_o) = (vec![0.0f32; n * d], vec![0.0f32; n * d]);
    let mut row_stats = Vec::with_capacity(n);
    let mut ranges = Vec::with_capacity(n);
    for (r, i) in task.rows.clone().enumerate() {
        let pos = span.q_start + i;
        let dst = r * d..(r + 1) * d;
        ops.q
            .load(span.batch, task.head, pos, &mut q[dst.clone()])?;
        ops.d_o.load(span.batch, task.head, pos, &mut d_o[dst])?;
        row_stats.push(stats.get(shape, task.seq, task.head, i));
        ranges.push(params.visible_keys(i, span.q_len, span.k_len));
    }
    let mut dq = vec![0.0f32; n * d];
    let (mut k, mut v) = (Widened::new(d), Widened::new(d));
    let (mut grads, mut sees) = block_gradient_rows(n);
    let logit = params.logit();
    let mut pairs = PairScores::new(ops.k.dtype(), d, [&q, &d_o]);
    for (j0, j1) in blocks(&ranges) {
        for j in j0..j1 {
            let pos = span.k_start + j;
            if let Some(p) = pairs.as_mut() {
                k.load_row(j - j0, |dst| ops.k.load(span.batch, kv_head, pos, dst))?;
                p.other[0].push(ops.k.row_bytes(span.batch, kv_head, pos)?);
                p.other[1].push(ops.v.row_bytes(span.batch, kv_head, pos)?);
            } else {
                k.load(j - j0, |dst| ops.k.load(span.batch, kv_head, pos, dst))?;
                v.load(j - j0, |dst| ops.v.load(span.batch, kv_head, pos, dst))?;
            }
        }
        let seen = |r: usize| block_positions(ranges[r], j0, j1);
        if let Some(p) = pairs.as_mut() {
            p.dots(n, d, |r| seen(r).0 < seen(r).1);
        }
        vectorised_fma!(|M| {
            for (r, g) in grads.iter_mut().enumerate() {
                let rows = r * d..(r + 1) * d;
                let stats = |_| row_stats[r];
                let dots = pairs.as_ref().map(|p| p.row(r));
                let (a, b) = ((&q[rows.clone()], &k.t[..]), (&d_o[rows], &v.t[..]));
                sees[r] = block_gradients::<M>(logit, dots, a, b, stats, seen(r), g);
            }
            let ds = |r: usize| &grads[r].ds[..j1 - j0];
            add_weighted_rows_paired::<M>(n, |r| sees[r], ds, &k.rows, &mut dq);
        });
    }
    dq.iter_mut().for_each(|x| *x *= params.scale);
    Ok(dq)
}

/// dK and dV of one task's key rows of a KV head (rows x d each, dK scaled): `sum_i dS_ij q_i`
/// and `sum_i P_ij dO_i` over the query heads that share the KV head and their visible
/// queries, in blocks of KEY_BLOCK queries.
fn dkv_task(
    shape: &AttentionShape,
    params: &AttentionParams,
    ops: &Operands,
    stats: &AllRowStats,
    task: &Task,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let d = shape.head_dim;
    let span = shape.seqs[task.seq];
    let n = task.rows.len();
    let (mut k, mut v) = (vec![0.0f32; n * d], vec![0.0f32; n * d]);
    let mut ranges = Vec::with_capacity(n);
    for (r, j) in task.rows.clone().enumerate() {
        let pos = span.k_start + j;
        let dst = r * d..(r + 1) * d;
        ops.k
            .load(span.batch, task.head, pos, &mut k[dst.clone()])?;
        ops.v.load(span.batch, task.head, pos, &mut v[dst])?;
        ranges.push(params.visible_queries(j, span.q_len, span.k_len));
    }
    let (mut dk, mut dv) = (vec![0.0f32; n * d], vec![0.0f32; n * d]);
    let (mut q, mut d_o) = (Widened::new(d), Widened::new(d));
    let mut block_stats = [RowStats::default(); KEY_BLOCK];
    let (mut grads, mut sees) = block_gradient_rows(n);
    let logit = params.logit();
    let group = shape.group();
    let mut pairs = PairScores::new(ops.q.dtype(), d, [&k, &v]);
    for head in task.head * group..(task.head + 1) * group {
        for (i0, i1) in blocks(&ranges) {
            for i in i0..i1 {
                let pos = span.q_start + i;
                if let Some(p) = pairs.as_mut() {
                    q.load_row(i - i0, |dst| ops.q.load(span.batch, head, pos, dst))?;
                    d_o.load_row(i - i0, |dst| ops.d_o.load(span.batch, head, pos, dst))?;
                    p.other[0].push(ops.q.row_bytes(span.batch, head, pos)?);
                    p.other[1].push(ops.d_o.row_bytes(span.batch, head, pos)?);
                } else {
                    q.load(i - i0, |dst| ops.q.load(span.batch, head, pos, dst))?;
                    d_o.load(i - i0, |dst| ops.d_o.load(span.batch, head, pos, dst))?;
                }
                block_stats[i - i0] = stats.get(shape, task.seq, head, i);
            }
            let seen = |r: usize| block_positions(ranges[r], i0, i1);
            if let Some(p) = pairs.as_mut() {
                p.dots(n, d, |r| seen(r).0 < seen(r).1);
            }
            vectorised_fma!(|M| {
                for (r, g) in grads.iter_mut().enumerate() {
                    let rows = r * d..(r + 1) * d;
                    let stats = |i| block_stats[i];
                    let dots = pairs.as_ref().map(|p| p.row(r));
                    let (a, b) = ((&k[rows.clone()], &q.t[..]), (&v[rows], &d_o.t[..]));
                    sees[r] = block_gradients::<M>(logit, dots, a, b, stats, seen(r), g);
                }
                let p = |r: usize| &grads[r].p[..i1 - i0];
                add_weighted_rows_paired::<M>(n, |r| sees[r], p, &d_o.rows, &mut dv);
                let ds = |r: usize| &grads[r].ds[..i1 - i0];
                add_weighted_rows_paired::<M>(n, |r| sees[r], ds, &q.rows, &mut dk);
            });
        }
    }
    dk.iter_mut().for_each(|x| *x *= params.scale);
    Ok((dk, dv))
}

/// A task's two score products (S and dP, or their transposes) as bf16 pair dot products
/// (bf16_pairs.rs), where the operands are bf16, the head dim is 64 or more and the CPU has
/// AVX512_BF16: the task's own rows (q and dO, or k and v) narrowed once, each block's other
/// rows read as stored, so neither of the block's two operands is transposed. Unlike the
/// forward (which keeps the f32 form at head dim 64), this saves two transposes per block:
/// 10-20% faster at 64 on the development machine, 1.6-1.8x at 128 (docs/perf-log.md).
struct PairScores<'a> {
    /// The task's two row sets, n x d bf16 bits each.
    own: [Vec<u16>; 2],
    /// The block's rows of the other side (K and V, or Q and dO), as stored.
    other: [Vec<&'a [u8]>; 2],
    /// The block's dot products, n x KEY_BLOCK each.
    dots: [Vec<f32>; 2],
}

impl<'a> PairScores<'a> {
    fn new(dtype: DType, d: usize, own: [&[f32]; 2]) -> Option<PairScores<'a>> {
        let take = dtype == DType::BF16 && d >= 64 && bf16_pairs::available();
        take.then(|| PairScores {
            own: own.map(|rows| bf16_pairs::bf16_bits(rows).collect()),
            other: [Vec::with_capacity(KEY_BLOCK), Vec::with_capacity(KEY_BLOCK)],
            dots: [Vec::new(), Vec::new()],
        })
    }

    /// Row `r`'s two blocks of dot products.
    fn row(&self, r: usize) -> ([f32; KEY_BLOCK], [f32; KEY_BLOCK]) {
        let block = |i: usize| {
            let mut out = [0.0f32; KEY_BLOCK];
            out.copy_from_slice(&self.dots[i][r * KEY_BLOCK..(r + 1) * KEY_BLOCK]);
            out
        };
        (block(0), block(1))
    }

    /// The block's dot products of the rows that see it, from the other rows pushed for the
    /// block; leaves `other` empty for the next block.
    fn dots(&mut self, n: usize, d: usize, wanted: impl Fn(usize) -> bool + Copy) {
        for i in 0..2 {
            self.dots[i].clear();
            self.dots[i].resize(n * KEY_BLOCK, 0.0);
            let out = (&mut self.dots[i][..], KEY_BLOCK);
            bf16_pairs::dots((&self.own[i], n, d), &self.other[i], wanted, out);
            self.other[i].clear();
        }
    }
}

/// The blocks (half-open) that cover the union of `ranges` (key_blocks::block_span).
fn blocks(ranges: &[(usize, usize)]) -> impl Iterator<Item = (usize, usize)> {
    let span = block_span(ranges);
    let end = span.end;
    span.step_by(KEY_BLOCK)
        .map(move |b0| (b0, (b0 + KEY_BLOCK).min(end)))
}

/// One row's probabilities and score gradients against a block (zero outside its range).
struct BlockGradients {
    p: [f32; KEY_BLOCK],
    ds: [f32; KEY_BLOCK],
}

/// A task's rows of block gradients, and whether each row saw the block.
fn block_gradient_rows(n: usize) -> (Vec<BlockGradients>, Vec<bool>) {
    let zero = || BlockGradients {
        p: [0.0; KEY_BLOCK],
        ds: [0.0; KEY_BLOCK],
    };
    ((0..n).map(|_| zero()).collect(), vec![false; n])
}

/// One row of the score matrix against a block of the other side, or of its transpose: for
/// `(a, b)` = (q, dO) of a query row against keys (`a_t`, `b_t` = K and V transposed), or
/// (k, v) of a key row against queries (Q and dO transposed), the probabilities `P` and score
/// gradients `dS = P (dO . v - delta) ds/dx` at the block positions `seen` into `g`, zero
/// elsewhere and where the query row saw no key (LSE -inf). Returns false (`g` untouched)
/// when `seen` is empty. `stats(i)` is the query row's statistics at block position `i`.
/// `dots`: the row's a . a_t and b . b_t where taken elsewhere (bf16 pairs: `a_t` and `b_t`
/// are then not read), else computed here.
#[inline(always)]
fn block_gradients<M: MulAdd>(
    logit: Logit,
    dots: Option<([f32; KEY_BLOCK], [f32; KEY_BLOCK])>,
    (a, a_t): (&[f32], &[f32]),
    (b, b_t): (&[f32], &[f32]),
    stats: impl Fn(usize) -> RowStats,
    seen: (usize, usize),
    g: &mut BlockGradients,
) -> bool {
    if seen.0 >= seen.1 {
        return false;
    }
    let (mut s, dp) = dots.unwrap_or_else(|| block_dots_pair::<M>((a, a_t), (b, b_t)));
    let mut slope = [0.0f32; KEY_BLOCK];
    logit.apply_with_slope(&mut s, &mut slope);
    for i in 0..KEY_BLOCK {
        let row = stats(i);
        let p = math::exp_nonpositive::<M>(s[i] - row.lse);
        let ds = p * (dp[i] - row.delta) * slope[i];
        // Lanes outside the block's rows hold stale values: selects, not products, drop them.
        let visible = i >= seen.0 && i < seen.1 && row.lse != f32::NEG_INFINITY;
        g.p[i] = if visible { p } else { 0.0 };
        g.ds[i] = if visible { ds } else { 0.0 };
    }
    true
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
