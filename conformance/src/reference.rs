//! f64 references, written from docs/ops-spec.md and the GEMM docs (not from any backend).
//! Inputs are the values as stored (already rounded to their dtype); every slice is
//! row-major over its logical shape.

use calico::ops::RopeMode;
use calico::{DType, Epilogue};

use crate::tensors::round;

/// Masks and scale of [`decode_attention`] (the decode op's own reference, separate from the
/// attention forward's).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeMask {
    pub scale: f64,
    pub causal: bool,
    pub window: Option<(usize, usize)>,
    pub softcap: Option<f64>,
}

/// Decode attention of one sequence: `q` [Hq, Nq, D] against `k`, `v` [Hkv, L, D] (the cache
/// gathered into contiguous rows, L = the sequence's length). The queries are the last Nq
/// tokens: query i sees key j iff j <= i + L - Nq when causal, and within (left, right) of
/// that diagonal with a window. Returns O [Hq, Nq, D] and the natural-log LSE [Hq, Nq]; a
/// query that sees no key gets zeros and -inf.
pub fn decode_attention(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    (hq, hkv, nq, dim, len): (usize, usize, usize, usize, usize),
    mask: DecodeMask,
) -> (Vec<f64>, Vec<f64>) {
    let group = hq / hkv;
    let mut o = vec![0.0; hq * nq * dim];
    let mut lse = vec![f64::NEG_INFINITY; hq * nq];
    for h in 0..hq {
        let kv = h / group;
        for i in 0..nq {
            let diag = i as i64 + len as i64 - nq as i64;
            let qrow = &q[(h * nq + i) * dim..][..dim];
            let visible = |j: usize| {
                let j = j as i64;
                let mut ok = true;
                if mask.causal {
                    ok &= j <= diag;
                }
                if let Some((left, right)) = mask.window {
                    ok &= j >= diag - left as i64 && j <= diag + right as i64;
                }
                ok
            };
            let scores: Vec<(usize, f64)> = (0..len)
                .filter(|&j| visible(j))
                .map(|j| {
                    let krow = &k[(kv * len + j) * dim..][..dim];
                    let mut s = qrow.iter().zip(krow).map(|(a, b)| a * b).sum::<f64>() * mask.scale;
                    if let Some(cap) = mask.softcap {
                        s = cap * (s / cap).tanh();
                    }
                    (j, s)
                })
                .collect();
            let Some(max) = scores.iter().map(|s| s.1).reduce(f64::max) else {
                continue;
            };
            let total: f64 = scores.iter().map(|s| (s.1 - max).exp()).sum();
            let out = &mut o[(h * nq + i) * dim..][..dim];
            for &(j, s) in &scores {
                let p = (s - max).exp() / total;
                for (d, x) in out.iter_mut().zip(&v[(kv * len + j) * dim..][..dim]) {
                    *d += p * x;
                }
            }
            lse[h * nq + i] = max + total.ln();
        }
    }
    (o, lse)
}

/// `y = x / sqrt(mean(x^2) + eps) * w`, row by row.
pub fn rms_norm(x: &[f64], cols: usize, w: &[f64], eps: f64) -> Vec<f64> {
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks(cols) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / cols as f64;
        let r = 1.0 / (ms + eps).sqrt();
        y.extend(row.iter().zip(w).map(|(v, w)| v * r * w));
    }
    y
}

/// `y = (x - mean) / sqrt(var + eps) * w + b` with the biased variance; w = 1, b = 0 if absent.
pub fn layer_norm(
    x: &[f64],
    cols: usize,
    w: Option<&[f64]>,
    b: Option<&[f64]>,
    eps: f64,
) -> Vec<f64> {
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks(cols) {
        let (mean, var) = row_moments(row);
        let r = 1.0 / (var + eps).sqrt();
        for (j, v) in row.iter().enumerate() {
            let wj = w.map_or(1.0, |w| w[j]);
            let bj = b.map_or(0.0, |b| b[j]);
            y.push((v - mean) * r * wj + bj);
        }
    }
    y
}

/// A row's mean and (biased) variance, in two passes.
pub fn row_moments(row: &[f64]) -> (f64, f64) {
    let n = row.len() as f64;
    let mean = row.iter().sum::<f64>() / n;
    let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    (mean, var)
}

/// The residual sum as the fused ops store it: `round_to_dtype(x + residual)`.
pub fn rounded_sum(dtype: DType, x: &[f64], residual: &[f64]) -> Vec<f64> {
    x.iter()
        .zip(residual)
        .map(|(a, b)| round(dtype, a + b))
        .collect()
}

/// `exp(x - max) / sum(exp(x - max))`, row by row.
pub fn softmax(x: &[f64], cols: usize) -> Vec<f64> {
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks(cols) {
        let max = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v));
        let e: Vec<f64> = row.iter().map(|v| (v - max).exp()).collect();
        let sum: f64 = e.iter().sum();
        y.extend(e.iter().map(|v| v / sum));
    }
    y
}

/// Rotary embedding of x [B, S, H, D]; `cos`/`sin` are [P, D/2]; token s sits at position
/// `pos_offset + s`.
pub fn rope(
    x: &[f64],
    [batch, seq, heads, dim]: [usize; 4],
    cos: &[f64],
    sin: &[f64],
    pos_offset: usize,
    mode: RopeMode,
) -> Vec<f64> {
    let half = dim / 2;
    let mut y = vec![0.0; x.len()];
    for b in 0..batch {
        for s in 0..seq {
            let p = pos_offset + s;
            for h in 0..heads {
                let base = ((b * seq + s) * heads + h) * dim;
                for i in 0..half {
                    let (ia, ib) = match mode {
                        RopeMode::Interleaved => (base + 2 * i, base + 2 * i + 1),
                        RopeMode::HalfSplit => (base + i, base + i + half),
                    };
                    let (c, sn) = (cos[p * half + i], sin[p * half + i]);
                    y[ia] = x[ia] * c - x[ib] * sn;
                    y[ib] = x[ia] * sn + x[ib] * c;
                }
            }
        }
    }
    y
}

/// A GEMM problem over logical row-major host copies: a [batch, m, k], b [batch, k, n],
/// c [batch, m, n] (when beta != 0), bias [n].
#[derive(Debug, Clone)]
pub struct Gemm<'a> {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: &'a [f64],
    pub b: &'a [f64],
    pub c: Option<&'a [f64]>,
    pub bias: Option<&'a [f64]>,
    pub alpha: f64,
    pub beta: f64,
    pub epilogue: Epilogue,
}

impl Gemm<'_> {
    /// `epilogue(alpha * sum_k a*b + beta * c + bias)` at (batch q, row i, column j).
    pub fn at(&self, q: usize, i: usize, j: usize) -> f64 {
        let (m, n, k) = (self.m, self.n, self.k);
        let a = &self.a[(q * m + i) * k..][..k];
        let b = &self.b[q * k * n..][..k * n];
        let dot: f64 = (0..k).map(|l| a[l] * b[l * n + j]).sum();
        let mut v = self.alpha * dot;
        if self.beta != 0.0 {
            let c = self.c.expect("beta != 0 needs c");
            v += self.beta * c[(q * m + i) * n + j];
        }
        if let Some(bias) = self.bias {
            v += bias[j];
        }
        match self.epilogue {
            Epilogue::None => v,
            Epilogue::Gelu => gelu(v),
            Epilogue::Silu => silu(v),
        }
    }

    /// Every output element, row-major [batch, m, n].
    pub fn all(&self) -> Vec<f64> {
        let mut d = Vec::with_capacity(self.batch * self.m * self.n);
        for q in 0..self.batch {
            for i in 0..self.m {
                for j in 0..self.n {
                    d.push(self.at(q, i, j));
                }
            }
        }
        d
    }
}

/// GELU, exact form: `x * Phi(x)`.
pub fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))
}

/// SiLU: `x * sigmoid(x)`.
pub fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// erf to ~1e-14: Maclaurin series near zero, erfc's continued fraction in the tails.
pub fn erf(x: f64) -> f64 {
    let ax = x.abs();
    let v = if ax < 2.5 {
        // sum (-1)^n x^(2n+1) / (n! (2n+1))
        let (mut term, mut sum) = (ax, ax);
        for n in 1..80 {
            term *= -ax * ax / n as f64;
            let t = term / (2 * n + 1) as f64;
            sum += t;
            if t.abs() < 1e-17 * sum.abs() {
                break;
            }
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc(x) = exp(-x^2)/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...))))
        let mut t = ax;
        for k in (1..=80).rev() {
            t = ax + (k as f64 / 2.0) / t;
        }
        1.0 - (-ax * ax).exp() / (std::f64::consts::PI.sqrt() * t)
    };
    v.copysign(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_tabulated_values() {
        for (x, want) in [
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (-2.4, -0.999_311_486_103_354_9),
            (3.0, 1.0 - 2.209_049_699_858_544e-5),
        ] {
            assert!((erf(x) - want).abs() < 1e-13, "erf({x}) = {}", erf(x));
        }
    }

    #[test]
    fn softmax_rows_sum_to_one_and_norms_have_unit_rms() {
        let y = softmax(&[1.0, 2.0, 3.0, -1.0, 0.0, 1.0], 3);
        assert!((y[..3].iter().sum::<f64>() - 1.0).abs() < 1e-15);
        let y = rms_norm(&[3.0, 4.0], 2, &[1.0, 1.0], 0.0);
        assert!((y[0] * y[0] + y[1] * y[1] - 2.0).abs() < 1e-12);
    }
}

/// Sizes of an attention problem; Q, O, dO are row-major `[batch, q_heads, q_len, head_dim]`,
/// K, V `[batch, kv_heads, k_len, head_dim]`, LSE `[batch, q_heads, q_len]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionDims {
    pub batch: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub q_len: usize,
    pub k_len: usize,
    pub head_dim: usize,
}

/// Whether query `i` sees key `j` (docs/ops-spec.md: causal and windows bottom-right aligned,
/// so the last query lines up with the last key).
fn attention_visible(
    opts: &calico::ops::AttentionOptions,
    i: usize,
    j: usize,
    dims: &AttentionDims,
) -> bool {
    let diag = i as i128 + dims.k_len as i128 - dims.q_len as i128;
    let j = j as i128;
    if opts.causal && j > diag {
        return false;
    }
    match opts.window {
        Some((left, right)) => j >= diag - left as i128 && j <= diag + right as i128,
        None => true,
    }
}

/// The masked, transformed scores of one (batch, query head) pair: `None` where masked.
fn attention_scores(
    q: &[f64],
    k: &[f64],
    dims: &AttentionDims,
    opts: &calico::ops::AttentionOptions,
    b: usize,
    h: usize,
) -> Vec<Vec<Option<(f64, f64)>>> {
    let d = dims.head_dim;
    let scale = opts.scale.map_or(1.0 / (d as f64).sqrt(), f64::from);
    let kh = h / (dims.q_heads / dims.kv_heads);
    let qrow = |i: usize| &q[((b * dims.q_heads + h) * dims.q_len + i) * d..][..d];
    let krow = |j: usize| &k[((b * dims.kv_heads + kh) * dims.k_len + j) * d..][..d];
    (0..dims.q_len)
        .map(|i| {
            (0..dims.k_len)
                .map(|j| {
                    if !attention_visible(opts, i, j, dims) {
                        return None;
                    }
                    let s: f64 =
                        qrow(i).iter().zip(krow(j)).map(|(a, b)| a * b).sum::<f64>() * scale;
                    // (score, d score / d scaled dot)
                    Some(match opts.softcap {
                        Some(cap) => {
                            let cap = cap as f64;
                            let t = (s / cap).tanh();
                            (cap * t, 1.0 - t * t)
                        }
                        None => (s, 1.0),
                    })
                })
                .collect()
        })
        .collect()
}

/// Softmax of one row of masked scores and its log-sum-exp (`-inf` and zeros when all masked).
fn attention_row_softmax(row: &[Option<(f64, f64)>]) -> (Vec<f64>, f64) {
    let max = row
        .iter()
        .flatten()
        .fold(f64::NEG_INFINITY, |m, &(s, _)| m.max(s));
    if max == f64::NEG_INFINITY {
        return (vec![0.0; row.len()], f64::NEG_INFINITY);
    }
    let e: Vec<f64> = row
        .iter()
        .map(|s| s.map_or(0.0, |(s, _)| (s - max).exp()))
        .collect();
    let sum: f64 = e.iter().sum();
    (e.iter().map(|v| v / sum).collect(), max + sum.ln())
}

/// Attention forward in f64: `(o, lse)`. A query that sees no key gets `o = 0` and
/// `lse = -inf`.
pub fn attention_reference(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    dims: &AttentionDims,
    opts: &calico::ops::AttentionOptions,
) -> (Vec<f64>, Vec<f64>) {
    let d = dims.head_dim;
    let group = dims.q_heads / dims.kv_heads;
    let mut o = vec![0.0; dims.batch * dims.q_heads * dims.q_len * d];
    let mut lse = vec![0.0; dims.batch * dims.q_heads * dims.q_len];
    for b in 0..dims.batch {
        for h in 0..dims.q_heads {
            let vbase = (b * dims.kv_heads + h / group) * dims.k_len * d;
            for (i, row) in attention_scores(q, k, dims, opts, b, h).iter().enumerate() {
                let (p, l) = attention_row_softmax(row);
                let r = (b * dims.q_heads + h) * dims.q_len + i;
                lse[r] = l;
                for (j, pj) in p.iter().enumerate() {
                    for c in 0..d {
                        o[r * d + c] += pj * v[vbase + j * d + c];
                    }
                }
            }
        }
    }
    (o, lse)
}

/// Attention backward in f64: `(dq, dk, dv)` for the gradient `d_o` of the output (dK and dV
/// summed over the query heads of each KV head).
///
/// `o` is the forward output as the backward receives it (rounded to the storage dtype): the
/// row term D_i = dO_i . O_i is defined on it, as in every FlashAttention-style backward. Using
/// the exact O instead would make the reference differ from the defined result by
/// rounding(O) * dO, which the small difference dP_ij - D_i (two keys of similar dP) can
/// amplify into a >10% error on an ill-conditioned row.
pub fn attention_backward_reference(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    o: &[f64],
    d_o: &[f64],
    dims: &AttentionDims,
    opts: &calico::ops::AttentionOptions,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let d = dims.head_dim;
    let group = dims.q_heads / dims.kv_heads;
    let scale = opts.scale.map_or(1.0 / (d as f64).sqrt(), f64::from);
    let mut dq = vec![0.0; q.len()];
    let mut dk = vec![0.0; k.len()];
    let mut dv = vec![0.0; v.len()];
    for b in 0..dims.batch {
        for h in 0..dims.q_heads {
            let kvbase = (b * dims.kv_heads + h / group) * dims.k_len * d;
            for (i, row) in attention_scores(q, k, dims, opts, b, h).iter().enumerate() {
                let (p, _) = attention_row_softmax(row);
                let r = ((b * dims.q_heads + h) * dims.q_len + i) * d;
                let g = &d_o[r..r + d];
                // dP_ij = dO_i . V_j; dS_ij = P_ij (dP_ij - D_i), D_i = dO_i . O_i.
                let dp: Vec<f64> = (0..dims.k_len)
                    .map(|j| (0..d).map(|c| g[c] * v[kvbase + j * d + c]).sum())
                    .collect();
                let delta: f64 = g.iter().zip(&o[r..r + d]).map(|(a, b)| a * b).sum();
                for j in 0..dims.k_len {
                    let Some((_, dcap)) = row[j] else { continue };
                    let dx = p[j] * (dp[j] - delta) * dcap * scale;
                    for c in 0..d {
                        dq[r + c] += dx * k[kvbase + j * d + c];
                        dk[kvbase + j * d + c] += dx * q[r + c];
                        dv[kvbase + j * d + c] += p[j] * g[c];
                    }
                }
            }
        }
    }
    (dq, dk, dv)
}
