//! The online softmax that the CPU attention forward and decode share: a set of query rows,
//! each seeing its own range of keys, walks the keys in blocks of [`KEY_BLOCK`]; each block's K
//! and V rows are widened once for all the rows, K stored transposed so that a row's scores are
//! KEY_BLOCK lanes of multiply-adds with no sum across lanes, the probabilities taken with the
//! polynomial exponential, and each row's running max, sum and output rescaled once per block.
//! Sums run in key order, so a result depends only on how the caller splits the keys.

use crate::lanes::W;
use crate::math;
use crate::simd::{vectorised_fma, MulAdd};
use calico_core::Result;

/// Keys per block (their K and V rows widened together).
pub(crate) const KEY_BLOCK: usize = 64;

/// Adds keys to `part`, whose rows are the `ranges.len()` rows of `q` (rows x `dim`, f32): row
/// `r` sees keys `ranges[r]` (half-open). `load_k(j, dst)` and `load_v(j, dst)` widen key `j`'s
/// K and V rows; `score` maps `q . k` to the logit (scale, soft-cap).
pub(crate) fn attend(
    q: &[f32],
    dim: usize,
    ranges: &[(usize, usize)],
    mut load_k: impl FnMut(usize, &mut [f32]) -> Result<()>,
    mut load_v: impl FnMut(usize, &mut [f32]) -> Result<()>,
    score: impl Fn(f32) -> f32,
    part: &mut Partial,
) -> Result<()> {
    let seen = ranges.iter().filter(|r| r.0 < r.1);
    let (Some(start), Some(end)) = (seen.clone().map(|r| r.0).min(), seen.map(|r| r.1).max())
    else {
        return Ok(());
    };
    let mut blocks = KeyBlocks::new(dim);
    for j0 in (start..end).step_by(KEY_BLOCK) {
        let j1 = (j0 + KEY_BLOCK).min(end);
        for j in j0..j1 {
            blocks.load_k(j - j0, |dst| load_k(j, dst))?;
        }
        let any = vectorised_fma!(|M| blocks.scores::<M>(q, ranges, (j0, j1), &score, part));
        if any {
            for j in j0..j1 {
                load_v(j, blocks.v_row(j - j0))?;
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

/// A block's widened K (transposed: `k_t[d * KEY_BLOCK + key]`, so that a row's scores are
/// KEY_BLOCK lanes of multiply-adds with no sum across lanes) and V rows, and its
/// probabilities (rows x KEY_BLOCK).
struct KeyBlocks {
    dim: usize,
    k_t: Vec<f32>,
    k_row: Vec<f32>,
    v: Vec<f32>,
    p: Vec<f32>,
}

impl KeyBlocks {
    fn new(dim: usize) -> KeyBlocks {
        KeyBlocks {
            dim,
            k_t: vec![0.0; KEY_BLOCK * dim],
            k_row: vec![0.0; dim],
            v: vec![0.0; KEY_BLOCK * dim],
            p: Vec::new(),
        }
    }

    /// Key `i` of the block's K row, widened by `fill`.
    fn load_k(&mut self, i: usize, fill: impl FnOnce(&mut [f32]) -> Result<()>) -> Result<()> {
        fill(&mut self.k_row)?;
        for (d, &x) in self.k_row.iter().enumerate() {
            self.k_t[d * KEY_BLOCK + i] = x;
        }
        Ok(())
    }

    fn v_row(&mut self, i: usize) -> &mut [f32] {
        &mut self.v[i * self.dim..(i + 1) * self.dim]
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
        score: &impl Fn(f32) -> f32,
        part: &mut Partial,
    ) -> bool {
        let dim = self.dim;
        self.p.clear();
        self.p.resize(ranges.len() * KEY_BLOCK, 0.0);
        let mut seen = false;
        for (r, &(lo, hi)) in ranges.iter().enumerate() {
            let (lo, hi) = (lo.max(j0), hi.min(j1));
            if lo >= hi {
                continue;
            }
            seen = true;
            let qr = &q[r * dim..(r + 1) * dim];
            // Keys past the block's end hold stale values; they are masked below. The row stays
            // in a local array (registers) across the head dim.
            let mut p = [0.0f32; KEY_BLOCK];
            for (&qd, kd) in qr.iter().zip(self.k_t.chunks_exact(KEY_BLOCK)) {
                for (s, &kj) in p.iter_mut().zip(kd) {
                    *s = M::mul_add(qd, kj, *s);
                }
            }
            let mut block_max = f32::NEG_INFINITY;
            for (j, pj) in p.iter_mut().enumerate() {
                let s = score(*pj);
                let key = j0 + j;
                *pj = if key >= lo && key < hi {
                    s
                } else {
                    f32::NEG_INFINITY
                };
                block_max = block_max.max(*pj);
            }
            let new_max = part.max[r].max(block_max);
            // The first block a row sees has nothing to rescale (exp(-inf) = 0).
            let rescale = (part.max[r] - new_max).exp();
            if rescale != 1.0 {
                part.sum[r] *= rescale;
                part.acc[r * dim..(r + 1) * dim]
                    .iter_mut()
                    .for_each(|a| *a *= rescale);
            }
            let mut sum = 0.0f32;
            for pj in p.iter_mut() {
                *pj = math::exp_nonpositive::<M>(*pj - new_max);
                sum += *pj;
            }
            self.p[r * KEY_BLOCK..(r + 1) * KEY_BLOCK].copy_from_slice(&p);
            part.sum[r] += sum;
            part.max[r] = new_max;
        }
        seen
    }

    /// Adds the block's probabilities times its V rows into every row's output.
    #[inline(always)]
    fn accumulate<M: MulAdd>(&self, keys: usize, part: &mut Partial) {
        let dim = self.dim;
        for (r, acc) in part.acc.chunks_exact_mut(dim).enumerate() {
            let p = &self.p[r * KEY_BLOCK..r * KEY_BLOCK + keys];
            // W output columns at a time in a local array (registers) across the keys; each
            // output still sums its keys in order. Whole chunks take fixed-length slices, which
            // vectorise (run-time lengths did not, and ran 2.5x slower); a head dim that is not
            // a multiple of W ends with a shorter chunk.
            for (c, out) in acc.chunks_mut(W).enumerate() {
                let mut a = [0.0f32; W];
                a[..out.len()].copy_from_slice(out);
                let col = c * W;
                if out.len() == W {
                    for (&pj, v) in p.iter().zip(self.v.chunks_exact(dim)) {
                        let v = &v[col..col + W];
                        for l in 0..W {
                            a[l] = M::mul_add(pj, v[l], a[l]);
                        }
                    }
                } else {
                    for (&pj, v) in p.iter().zip(self.v.chunks_exact(dim)) {
                        for (x, &y) in a.iter_mut().zip(&v[col..]) {
                            *x = M::mul_add(pj, y, *x);
                        }
                    }
                }
                out.copy_from_slice(&a[..out.len()]);
            }
        }
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
