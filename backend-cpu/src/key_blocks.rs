//! The online softmax that the CPU attention forward and decode share, and the block
//! primitives the backward uses too: a set of query rows, each seeing its own range of keys,
//! walks the keys in blocks of [`KEY_BLOCK`] on multiples of KEY_BLOCK; each block's K and V
//! rows are widened once for all the rows, K stored transposed so that a row's scores are
//! KEY_BLOCK lanes of multiply-adds with no sum across lanes, the probabilities taken with the
//! polynomial exponential, and each row's running max, sum and output rescaled once per block.
//! Every sum has a fixed order, so a result depends only on how the caller splits the keys.

use crate::bf16_pairs;
use crate::gemm_amx;
use crate::lanes::{self, W};
use crate::math;
use crate::simd::{vectorised_fma, MulAdd};
use calico_core::{Error, Result};

/// Keys per block (their K and V rows widened together).
pub(crate) const KEY_BLOCK: usize = 64;

/// The K and V rows that [`attend`] reads.
pub(crate) trait KeyRows {
    /// Widens key `j`'s K row into `dst`.
    fn k(&self, j: usize, dst: &mut [f32]) -> Result<()>;

    /// Widens key `j`'s V row into `dst`.
    fn v(&self, j: usize, dst: &mut [f32]) -> Result<()>;

    /// Hints that key `j`'s rows are read soon: [`attend`] calls it a block ahead, for rows
    /// that stream from memory (decode). Nothing by default.
    fn prefetch(&self, _j: usize) {}

    /// Whether [`attend`] takes the scores as bf16 pair dot products of the K rows that
    /// [`KeyRows::k_bytes`] hands out as stored (where the CPU has AVX512_BF16): only where K
    /// is bf16, so that the query rows hold bf16 values too (q, k and v share a dtype), and
    /// the caller finds it worth it. No by default. It must not depend on how the caller
    /// split its rows into tasks (that follows the thread count).
    fn pair_scores(&self) -> bool {
        false
    }

    /// Key `j`'s K row as stored (at least `dim` bf16 elements), where
    /// With [`KeyRows::pair_scores`], whether the scores go to the AMX tiles where the CPU has
    /// them (prefill: a task's 16-64 query rows fill the tiles' columns; decode keeps the pair
    /// dot products).
    fn tile_scores(&self) -> bool {
        false
    }

    /// Key `j`'s V row as stored (at least `dim` bf16 elements), where
    /// [`KeyRows::tile_scores`].
    fn v_bytes(&self, _j: usize) -> Result<&[u8]> {
        Err(Error::unsupported("internal: V rows are not handed out"))
    }

    /// [`KeyRows::pair_scores`].
    fn k_bytes(&self, _j: usize) -> Result<&[u8]> {
        Err(Error::unsupported("internal: K rows are not handed out"))
    }
}

/// Adds keys to `part`, whose rows are the `ranges.len()` rows of `q` (rows x `dim`, f32): row
/// `r` sees keys `ranges[r]` (half-open), read from `keys`; `logit` maps `q . k` to the logit.
pub(crate) fn attend<K: KeyRows>(
    q: &[f32],
    dim: usize,
    ranges: &[(usize, usize)],
    keys: &K,
    logit: Logit,
    part: &mut Partial,
) -> Result<()> {
    let span = block_span(ranges);
    let end = span.end;
    if span.is_empty() {
        return Ok(());
    }
    let mut blocks = KeyBlocks::new(dim);
    // bf16 K with AVX512_BF16: the scores as bf16 pair dot products straight from K's bytes
    // (bf16_pairs.rs), K neither widened nor transposed; the query rows narrowed back (exact).
    let pairs = keys.pair_scores() && bf16_pairs::available();
    let q_bits: Vec<u16> = if pairs {
        bf16_pairs::bf16_bits(q).collect()
    } else {
        Vec::new()
    };
    // With AMX, the scores on the tiles (gemm_amx.rs). Decided per call, not by the task's
    // rows, so that a row's result does not depend on the thread count.
    let mut tiles = (pairs && keys.tile_scores() && gemm_amx::available())
        .then(|| gemm_amx::Scores::new(&q_bits, ranges.len(), dim));
    let mut k_rows: Vec<&[u8]> = Vec::with_capacity(KEY_BLOCK);
    for j0 in span.step_by(KEY_BLOCK) {
        let j1 = (j0 + KEY_BLOCK).min(end);
        k_rows.clear();
        for j in j0..j1 {
            if j + KEY_BLOCK < end {
                keys.prefetch(j + KEY_BLOCK);
            }
            if pairs {
                k_rows.push(keys.k_bytes(j)?);
            } else {
                blocks.k.load(j - j0, |dst| keys.k(j, dst))?;
            }
        }
        let any = if pairs {
            match &mut tiles {
                Some(t) => {
                    // Each row's first j1 - j0 entries are written; fold_dots masks the rest.
                    blocks.dots.resize(ranges.len() * KEY_BLOCK, 0.0);
                    t.block(&k_rows, (&mut blocks.dots, KEY_BLOCK));
                }
                None => blocks.pair_dots(&q_bits, &k_rows, ranges, (j0, j1)),
            }
            vectorised_fma!(|M| blocks.fold_dots::<M>(ranges, (j0, j1), logit, part))
        } else {
            vectorised_fma!(|M| blocks.scores::<M>(q, ranges, (j0, j1), logit, part))
        };
        if any {
            if let Some(t) = &mut tiles {
                // P rounded to bf16 times V's rows as stored, on the tiles.
                let v_rows = (j0..j1)
                    .map(|j| keys.v_bytes(j))
                    .collect::<Result<Vec<_>>>()?;
                t.weighted((&blocks.p, KEY_BLOCK), &v_rows, &mut part.acc);
                continue;
            }
            for j in j0..j1 {
                let i = j - j0;
                keys.v(j, &mut blocks.v[i * dim..(i + 1) * dim])?;
            }
            vectorised_fma!(|M| blocks.accumulate::<M>(j1 - j0, part));
        }
    }
    Ok(())
}

/// The online softmax of a set of query rows: per row the running max and sum (natural base)
/// and the unnormalised output.
pub(crate) struct Partial {
    max: Vec<f32>,
    sum: Vec<f32>,
    acc: Vec<f32>,
}

impl Partial {
    pub(crate) fn empty(rows: usize, dim: usize) -> Partial {
        Partial {
            max: vec![f32::NEG_INFINITY; rows],
            sum: vec![0.0; rows],
            acc: vec![0.0; rows * dim],
        }
    }
}

/// The positions the blocks walk to cover the union of `ranges` (half-open; empty when no
/// range is): from a multiple of KEY_BLOCK, whichever rows share the call, so that a row's
/// result does not depend on how the caller grouped the rows (the task size follows the
/// thread count).
pub(crate) fn block_span(ranges: &[(usize, usize)]) -> std::ops::Range<usize> {
    let seen = ranges.iter().filter(|r| r.0 < r.1);
    let start = seen.clone().map(|r| r.0).min().unwrap_or(0);
    let end = seen.map(|r| r.1).max().unwrap_or(0);
    start / KEY_BLOCK * KEY_BLOCK..end
}

/// `range` (half-open) within the block `b0..b1`, as positions in the block; `(0, 0)` when
/// they miss.
pub(crate) fn block_positions((lo, hi): (usize, usize), b0: usize, b1: usize) -> (usize, usize) {
    let (lo, hi) = (lo.max(b0), hi.min(b1));
    if lo < hi {
        (lo - b0, hi - b0)
    } else {
        (0, 0)
    }
}

/// The map from `q . k` to the logit: a scale, then `cap * tanh(s / cap)` when soft-capped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Logit {
    pub(crate) scale: f32,
    pub(crate) softcap: Option<f32>,
}

impl Logit {
    /// Maps a block of dot products to logits in place. One loop per form, so that the plain
    /// one (no `tanh` call in it) vectorises.
    #[inline(always)]
    pub(crate) fn apply(self, s: &mut [f32; KEY_BLOCK]) {
        match self.softcap {
            None => s.iter_mut().for_each(|x| *x *= self.scale),
            Some(cap) => s
                .iter_mut()
                .for_each(|x| *x = cap * (*x * self.scale / cap).tanh()),
        }
    }

    /// [`Logit::apply`], also giving the derivative of each logit with respect to the scaled
    /// dot product (1 without a soft-cap, `1 - tanh^2` with one).
    #[inline(always)]
    pub(crate) fn apply_with_slope(self, s: &mut [f32; KEY_BLOCK], slope: &mut [f32; KEY_BLOCK]) {
        match self.softcap {
            None => {
                s.iter_mut().for_each(|x| *x *= self.scale);
                slope.fill(1.0);
            }
            Some(cap) => {
                for (x, d) in s.iter_mut().zip(slope.iter_mut()) {
                    let t = (*x * self.scale / cap).tanh();
                    *x = cap * t;
                    *d = 1.0 - t * t;
                }
            }
        }
    }
}

/// Up to [`KEY_BLOCK`] rows of `dim` values widened to f32, kept both as rows and transposed
/// (`t[d * KEY_BLOCK + row]`), so that one vector's dot products with every row are
/// KEY_BLOCK lanes of multiply-adds with no sum across lanes ([`block_dots`]) and a weighted
/// sum of the rows reads them whole ([`add_weighted_rows`]).
pub(crate) struct Widened {
    dim: usize,
    pub(crate) rows: Vec<f32>,
    pub(crate) t: Vec<f32>,
}

impl Widened {
    pub(crate) fn new(dim: usize) -> Widened {
        Widened {
            dim,
            rows: vec![0.0; KEY_BLOCK * dim],
            t: vec![0.0; KEY_BLOCK * dim],
        }
    }

    /// Row `i`, widened by `fill`, without its column of `t` (for callers that take their
    /// dot products elsewhere: bf16 pairs).
    pub(crate) fn load_row(
        &mut self,
        i: usize,
        fill: impl FnOnce(&mut [f32]) -> Result<()>,
    ) -> Result<()> {
        fill(&mut self.rows[i * self.dim..(i + 1) * self.dim])
    }

    /// Row `i`, widened by `fill`, and its column of `t`.
    pub(crate) fn load(
        &mut self,
        i: usize,
        fill: impl FnOnce(&mut [f32]) -> Result<()>,
    ) -> Result<()> {
        let row = &mut self.rows[i * self.dim..(i + 1) * self.dim];
        fill(row)?;
        // `i` is the same for every column: its bounds check leaves the loop.
        for (column, &x) in self.t.chunks_exact_mut(KEY_BLOCK).zip(row.iter()) {
            column[i] = x;
        }
        Ok(())
    }
}

/// `x . row` for each of a block's rows (`t` from [`Widened`]); lanes past the rows loaded
/// hold stale values for the caller to mask. The sums stay in a local array (registers)
/// across `x`: all KEY_BLOCK of them, or half in each of two passes where the copy's
/// registers do not hold them all (SSE2; the same sums).
#[inline(always)]
pub(crate) fn block_dots<M: MulAdd>(x: &[f32], t: &[f32]) -> [f32; KEY_BLOCK] {
    let mut dots = [0.0f32; KEY_BLOCK];
    if M::ACCUMULATOR_LANES >= KEY_BLOCK {
        dots_of_rows::<M, KEY_BLOCK>(x, t, 0, &mut dots);
    } else {
        const HALF: usize = KEY_BLOCK / 2;
        dots_of_rows::<M, HALF>(x, t, 0, &mut dots);
        dots_of_rows::<M, HALF>(x, t, HALF, &mut dots);
    }
    dots
}

/// [`block_dots`] for the `C` rows of the block from `first`.
#[inline(always)]
fn dots_of_rows<M: MulAdd, const C: usize>(
    x: &[f32],
    t: &[f32],
    first: usize,
    dots: &mut [f32; KEY_BLOCK],
) {
    let mut acc = [0.0f32; C];
    for (&xd, td) in x.iter().zip(t.chunks_exact(KEY_BLOCK)) {
        let td = &td[first..first + C];
        for l in 0..C {
            acc[l] = M::mul_add(xd, td[l], acc[l]);
        }
    }
    dots[first..first + C].copy_from_slice(&acc);
}

/// [`block_dots`] of two vectors against two blocks, in one pass where the copy has the
/// registers for both (otherwise one pass each, the same sums): eight independent
/// multiply-add chains instead of four (one pass of four chains waits on the instruction's
/// latency).
#[inline(always)]
pub(crate) fn block_dots_pair<M: MulAdd>(
    (x, x_t): (&[f32], &[f32]),
    (y, y_t): (&[f32], &[f32]),
) -> ([f32; KEY_BLOCK], [f32; KEY_BLOCK]) {
    if M::ACCUMULATOR_LANES < 2 * KEY_BLOCK {
        // Two blocks of accumulators would spill: one pass each (the same sums).
        return (block_dots::<M>(x, x_t), block_dots::<M>(y, y_t));
    }
    let mut dx = [0.0f32; KEY_BLOCK];
    let mut dy = [0.0f32; KEY_BLOCK];
    let cols = x_t.chunks_exact(KEY_BLOCK).zip(y_t.chunks_exact(KEY_BLOCK));
    for ((&xd, &yd), (xt, yt)) in x.iter().zip(y).zip(cols) {
        for j in 0..KEY_BLOCK {
            dx[j] = M::mul_add(xd, xt[j], dx[j]);
            dy[j] = M::mul_add(yd, yt[j], dy[j]);
        }
    }
    (dx, dy)
}

/// `acc += sum_j weights[j] * rows[j]` (rows of `acc.len()` values), each output summing its
/// rows in order.
#[inline(always)]
pub(crate) fn add_weighted_rows<M: MulAdd>(weights: &[f32], rows: &[f32], acc: &mut [f32]) {
    add_weighted_rows_n::<M, 1>([weights], rows, [acc]);
}

/// [`add_weighted_rows`] for `N` weight vectors and outputs over the same rows in one pass, so
/// that each row's load serves all N sums. Every output sums its rows in order: the results
/// are those of N separate calls, bit for bit.
#[inline(always)]
pub(crate) fn add_weighted_rows_n<M: MulAdd, const N: usize>(
    weights: [&[f32]; N],
    rows: &[f32],
    mut accs: [&mut [f32]; N],
) {
    let dim = accs[0].len();
    // Columns in fixed-length groups held in local arrays (registers) across the rows, as
    // many as the copy's registers keep with room for the loads (M::ACCUMULATOR_LANES, at
    // most eight AVX-512 vectors per output): independent multiply-add chains hide the
    // instruction's latency (one chain ran at a quarter of the rate). Fixed lengths
    // vectorise; run-time ones did not (2.5x slower).
    let group = (M::ACCUMULATOR_LANES / N).min(8 * W);
    let mut col = 0;
    macro_rules! groups_of {
        ($c:expr) => {
            if group >= $c {
                while col + $c <= dim {
                    add_weighted_columns::<M, N, { $c }>(&weights, rows, col, &mut accs);
                    col += $c;
                }
            }
        };
    }
    groups_of!(8 * W);
    groups_of!(4 * W);
    groups_of!(2 * W);
    groups_of!(W);
    groups_of!(W / 2);
    for (weights, acc) in weights.iter().zip(accs.iter_mut()) {
        for (c, out) in acc.iter_mut().enumerate().skip(col) {
            let mut a = *out;
            for (&wj, row) in weights.iter().zip(rows.chunks_exact(dim)) {
                a = M::mul_add(wj, row[c], a);
            }
            *out = a;
        }
    }
}

/// `out[r] += sum_j weights(r)[j] rows[j]` for each of the `n` rows of `out` with `sees(r)`,
/// two rows per pass where both are (each of `rows` loaded once for both; the same bits as one
/// row at a time).
#[inline(always)]
pub(crate) fn add_weighted_rows_paired<'w, M: MulAdd>(
    n: usize,
    sees: impl Fn(usize) -> bool,
    weights: impl Fn(usize) -> &'w [f32],
    rows: &[f32],
    out: &mut [f32],
) {
    let d = out.len() / n.max(1);
    let mut pairs = out.chunks_exact_mut(2 * d);
    for (i, pair) in pairs.by_ref().enumerate() {
        let (r, s) = (2 * i, 2 * i + 1);
        let (a, b) = pair.split_at_mut(d);
        match (sees(r), sees(s)) {
            (true, true) => add_weighted_rows_n::<M, 2>([weights(r), weights(s)], rows, [a, b]),
            (true, false) => add_weighted_rows::<M>(weights(r), rows, a),
            (false, true) => add_weighted_rows::<M>(weights(s), rows, b),
            (false, false) => {}
        }
    }
    let last = pairs.into_remainder();
    if !last.is_empty() && sees(n - 1) {
        add_weighted_rows::<M>(weights(n - 1), rows, last);
    }
}

/// [`add_weighted_rows_n`] for the `C` columns from `col`.
#[inline(always)]
fn add_weighted_columns<M: MulAdd, const N: usize, const C: usize>(
    weights: &[&[f32]; N],
    rows: &[f32],
    col: usize,
    accs: &mut [&mut [f32]; N],
) {
    let dim = accs[0].len();
    let keys = weights.iter().map(|w| w.len()).min().unwrap_or(0);
    let mut a = [[0.0f32; C]; N];
    for (a, acc) in a.iter_mut().zip(accs.iter()) {
        a.copy_from_slice(&acc[col..col + C]);
    }
    for (j, row) in rows.chunks_exact(dim).take(keys).enumerate() {
        let row = &row[col..col + C];
        for (a, w) in a.iter_mut().zip(weights) {
            let wj = w[j];
            for l in 0..C {
                a[l] = M::mul_add(wj, row[l], a[l]);
            }
        }
    }
    for (a, acc) in a.iter().zip(accs.iter_mut()) {
        acc[col..col + C].copy_from_slice(a);
    }
}

/// A block's widened K (rows and transposed) and V rows, its probabilities
/// (rows x KEY_BLOCK), and its dot products where bf16 pairs make them (rows x KEY_BLOCK).
struct KeyBlocks {
    dim: usize,
    k: Widened,
    v: Vec<f32>,
    p: Vec<f32>,
    dots: Vec<f32>,
}

impl KeyBlocks {
    fn new(dim: usize) -> KeyBlocks {
        KeyBlocks {
            dim,
            k: Widened::new(dim),
            v: vec![0.0; KEY_BLOCK * dim],
            p: Vec::new(),
            dots: Vec::new(),
        }
    }

    /// The dot products of the query rows (bf16 bits) that see keys `j0..j1` with those keys'
    /// K rows (bf16 bytes), into `dots`.
    fn pair_dots(
        &mut self,
        q: &[u16],
        k_rows: &[&[u8]],
        ranges: &[(usize, usize)],
        (j0, j1): (usize, usize),
    ) {
        let rows = ranges.len();
        self.dots.clear();
        self.dots.resize(rows * KEY_BLOCK, 0.0);
        let sees = |r: usize| {
            let (lo, hi) = block_positions(ranges[r], j0, j1);
            lo < hi
        };
        let out = (&mut self.dots[..], KEY_BLOCK);
        bf16_pairs::dots((q, rows, self.dim), k_rows, sees, out);
    }

    /// [`KeyBlocks::scores`] from the dot products in `dots`.
    #[inline(always)]
    fn fold_dots<M: MulAdd>(
        &mut self,
        ranges: &[(usize, usize)],
        (j0, j1): (usize, usize),
        logit: Logit,
        part: &mut Partial,
    ) -> bool {
        self.p.clear();
        self.p.resize(ranges.len() * KEY_BLOCK, 0.0);
        let mut any = false;
        for (r, &range) in ranges.iter().enumerate() {
            let seen = block_positions(range, j0, j1);
            if seen.0 < seen.1 {
                let mut dots = [0.0f32; KEY_BLOCK];
                dots.copy_from_slice(&self.dots[r * KEY_BLOCK..(r + 1) * KEY_BLOCK]);
                self.fold_row::<M>(r, dots, seen, logit, part);
                any = true;
            }
        }
        any
    }

    /// Scores of keys `j0..j1` for every row that sees them, folded into the rows' running
    /// max and sum (rescaling their outputs), leaving the block's probabilities in `p`.
    /// Returns whether any row saw a key.
    #[inline(always)]
    fn scores<M: MulAdd>(
        &mut self,
        q: &[f32],
        ranges: &[(usize, usize)],
        (j0, j1): (usize, usize),
        logit: Logit,
        part: &mut Partial,
    ) -> bool {
        let dim = self.dim;
        self.p.clear();
        self.p.resize(ranges.len() * KEY_BLOCK, 0.0);
        // Block positions each row sees (empty when none).
        let seen = |r: usize| block_positions(ranges[r], j0, j1);
        let sees = |r: usize| seen(r).0 < seen(r).1;
        let mut any = false;
        // Rows in pairs: two rows' dot products in one pass keep eight multiply-add chains in
        // flight. Keys past the block's end hold stale values; fold_row masks them.
        for r in (0..ranges.len()).step_by(2) {
            let q_row = |r: usize| &q[r * dim..(r + 1) * dim];
            if r + 1 < ranges.len() && sees(r) && sees(r + 1) {
                let k_t = &self.k.t[..];
                let (a, b) = block_dots_pair::<M>((q_row(r), k_t), (q_row(r + 1), k_t));
                self.fold_row::<M>(r, a, seen(r), logit, part);
                self.fold_row::<M>(r + 1, b, seen(r + 1), logit, part);
                any = true;
                continue;
            }
            for r in r..(r + 2).min(ranges.len()) {
                if sees(r) {
                    let dots = block_dots::<M>(q_row(r), &self.k.t);
                    self.fold_row::<M>(r, dots, seen(r), logit, part);
                    any = true;
                }
            }
        }
        any
    }

    /// Folds row `r`'s dot products with the block's keys, visible at block positions
    /// `seen`, into its running max and sum (rescaling its output), leaving its probabilities
    /// in `p`. The max and sum run over W lanes first, then across them in a fixed order (one
    /// chain through 64 keys waited on each add).
    #[inline(always)]
    fn fold_row<M: MulAdd>(
        &mut self,
        r: usize,
        mut p: [f32; KEY_BLOCK],
        (lo, hi): (usize, usize),
        logit: Logit,
        part: &mut Partial,
    ) {
        let dim = self.dim;
        logit.apply(&mut p);
        let mut lane_max = lanes::splat(f32::NEG_INFINITY);
        for (c, chunk) in p.chunks_exact_mut(W).enumerate() {
            for (l, (x, m)) in chunk.iter_mut().zip(&mut lane_max).enumerate() {
                let j = c * W + l;
                *x = if j >= lo && j < hi {
                    *x
                } else {
                    f32::NEG_INFINITY
                };
                *m = if *x > *m { *x } else { *m };
            }
        }
        let new_max = part.max[r].max(lanes::hmax(lane_max));
        // The first block a row sees has nothing to rescale (exp(-inf) = 0).
        let rescale = (part.max[r] - new_max).exp();
        if rescale != 1.0 {
            part.sum[r] *= rescale;
            part.acc[r * dim..(r + 1) * dim]
                .iter_mut()
                .for_each(|a| *a *= rescale);
        }
        let mut lane_sum = lanes::splat(0.0);
        for chunk in p.chunks_exact_mut(W) {
            for (x, s) in chunk.iter_mut().zip(&mut lane_sum) {
                *x = math::exp_nonpositive::<M>(*x - new_max);
                *s += *x;
            }
        }
        self.p[r * KEY_BLOCK..(r + 1) * KEY_BLOCK].copy_from_slice(&p);
        part.sum[r] += lanes::hsum(lane_sum);
        part.max[r] = new_max;
    }

    /// Adds the block's probabilities times its V rows into every row's output.
    #[inline(always)]
    fn accumulate<M: MulAdd>(&self, keys: usize, part: &mut Partial) {
        // Every row: a row that did not see the block has zero probabilities.
        let p = |r: usize| &self.p[r * KEY_BLOCK..r * KEY_BLOCK + keys];
        let rows = part.max.len();
        add_weighted_rows_paired::<M>(rows, |_| true, p, &self.v, &mut part.acc);
    }
}

/// Row `r`'s output (`out`) and natural-log LSE from its partials, merged in order; no key
/// seen: zeros and -inf.
pub(crate) fn merge(parts: &[Partial], r: usize, out: &mut [f32]) -> f32 {
    let dim = out.len();
    let max = parts
        .iter()
        .map(|p| p.max[r])
        .fold(f32::NEG_INFINITY, f32::max);
    out.fill(0.0);
    if max == f32::NEG_INFINITY {
        return f32::NEG_INFINITY;
    }
    let mut sum = 0.0f32;
    for p in parts {
        let w = (p.max[r] - max).exp();
        sum += p.sum[r] * w;
        for (o, &a) in out.iter_mut().zip(&p.acc[r * dim..(r + 1) * dim]) {
            *o += a * w;
        }
    }
    out.iter_mut().for_each(|o| *o /= sum);
    max + sum.ln()
}
