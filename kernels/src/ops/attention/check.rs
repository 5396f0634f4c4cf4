//! Validation of attention calls: ranks, shapes, strides, dtypes, heads, options.

use super::AttentionOptions;
use crate::ops::check;
use calico_core::{DType, Error, Result, Tensor};
use calico_cpu::AttentionParams;

/// Largest head dimension any backend accepts.
pub(crate) const MAX_HEAD_DIM: usize = 256;

/// Window sides are clamped to this (no sequence is longer).
const WINDOW_CAP: usize = 1 << 40;

/// The sizes of a validated call. For packed (varlen) calls `batch` is the number of
/// sequences and `q_len` / `k_len` the packed totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Problem {
    pub dtype: DType,
    pub batch: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub q_len: usize,
    pub k_len: usize,
    pub head_dim: usize,
}

/// The head dim a GPU attention kernel runs a problem's `head_dim` at: the smallest of 64,
/// 128 and 256 that holds it, up to `widest`, for head dims that are multiples of 8 (16-byte
/// rows, so TMA, the 16-byte O chunks and the decode kernel's 16-byte lanes stop at the real
/// columns). The columns in between are zeros: d = 96 runs the d = 128 kernel and costs what
/// it costs.
pub(crate) fn kernel_head_dim(head_dim: usize, widest: usize) -> Option<usize> {
    if head_dim == 0 || !head_dim.is_multiple_of(8) {
        return None;
    }
    [64, 128, 256]
        .into_iter()
        .find(|&d| d >= head_dim)
        .filter(|&d| d <= widest)
}

/// bf16 or f16.
pub(crate) fn half_dtype(name: &str, t: &Tensor) -> Result<DType> {
    match t.dtype() {
        d @ (DType::BF16 | DType::F16) => Ok(d),
        got => Err(Error::DType {
            expected: format!("bf16 or f16 for `{name}`"),
            got,
        }),
    }
}

/// The shape of `t` if it has rank `rank` and a contiguous last dimension.
pub(crate) fn ranked<'a>(
    name: &str,
    t: &'a Tensor,
    rank: usize,
    what: &str,
) -> Result<&'a [usize]> {
    let shape = t.shape();
    if shape.len() != rank {
        return Err(Error::shape(format!(
            "`{name}` must be {what}, got shape {shape:?}"
        )));
    }
    if shape[rank - 1] > 1 && t.strides()[rank - 1] != 1 {
        return Err(Error::stride(format!(
            "the head dimension (last) of `{name}` must be contiguous, its stride is {}",
            t.strides()[rank - 1]
        )));
    }
    Ok(shape)
}

/// Heads divide, the head dimension is in range.
pub(crate) fn heads_and_dim(q_heads: usize, kv_heads: usize, head_dim: usize) -> Result<()> {
    if kv_heads == 0 || !q_heads.is_multiple_of(kv_heads) {
        return Err(Error::shape(format!(
            "query heads ({q_heads}) must be a multiple of key/value heads ({kv_heads})"
        )));
    }
    if head_dim == 0 || head_dim > MAX_HEAD_DIM {
        return Err(Error::shape(format!(
            "head dimension {head_dim} is outside 1..={MAX_HEAD_DIM}"
        )));
    }
    Ok(())
}

/// `lse` is f32 with `shape`, contiguous.
pub(crate) fn lse_is(lse: &Tensor, shape: &[usize]) -> Result<()> {
    check::dtype_is("lse", lse, DType::F32)?;
    check::shape_is("lse", lse, shape)?;
    if lse.numel() > 0 && !lse.layout().is_contiguous() {
        return Err(Error::stride("`lse` must be contiguous"));
    }
    Ok(())
}

/// `t` has `dtype` and `shape` and a contiguous last dimension.
pub(crate) fn like(name: &str, t: &Tensor, dtype: DType, shape: &[usize]) -> Result<()> {
    check::dtype_is(name, t, dtype)?;
    check::shape_is(name, t, shape)?;
    ranked(name, t, shape.len(), "shaped like its partner")?;
    Ok(())
}

/// The backward's O, dO and dQ shaped like Q, dK and dV like K, all of `dtype`.
pub(crate) fn backward_like(
    dtype: DType,
    q: &Tensor,
    k: &Tensor,
    [o, d_o, dq, dk, dv]: [&Tensor; 5],
) -> Result<()> {
    like("o", o, dtype, q.shape())?;
    like("d_o", d_o, dtype, q.shape())?;
    like("dq", dq, dtype, q.shape())?;
    like("dk", dk, dtype, k.shape())?;
    like("dv", dv, dtype, k.shape())
}

/// Q [B, Hq, Nq, D], K and V [B, Hkv, Nkv, D], all of one half dtype.
pub(crate) fn qkv(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Problem> {
    let dtype = half_dtype("q", q)?;
    let qs = ranked("q", q, 4, "[batch, heads, seq, head_dim]")?;
    let ks = ranked("k", k, 4, "[batch, kv_heads, seq, head_dim]")?;
    like("k", k, dtype, ks)?;
    like("v", v, dtype, ks)?;
    if ks[0] != qs[0] || ks[3] != qs[3] {
        return Err(Error::shape(format!(
            "`k` {ks:?} must match `q` {qs:?} in batch and head dimension"
        )));
    }
    heads_and_dim(qs[1], ks[1], qs[3])?;
    Ok(Problem {
        dtype,
        batch: qs[0],
        q_heads: qs[1],
        kv_heads: ks[1],
        q_len: qs[2],
        k_len: ks[2],
        head_dim: qs[3],
    })
}

/// Packed Q [Tq, Hq, D], K and V [Tk, Hkv, D]; `batch` is left 0 for the caller.
pub(crate) fn packed_qkv(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Problem> {
    let dtype = half_dtype("q", q)?;
    let qs = ranked("q", q, 3, "packed [total_q, heads, head_dim]")?;
    let ks = ranked("k", k, 3, "packed [total_k, kv_heads, head_dim]")?;
    like("k", k, dtype, ks)?;
    like("v", v, dtype, ks)?;
    if ks[2] != qs[2] {
        return Err(Error::shape(format!(
            "`k` {ks:?} must match `q` {qs:?} in head dimension"
        )));
    }
    heads_and_dim(qs[1], ks[1], qs[2])?;
    Ok(Problem {
        dtype,
        batch: 0,
        q_heads: qs[1],
        kv_heads: ks[1],
        q_len: qs[0],
        k_len: ks[0],
        head_dim: qs[2],
    })
}

/// The options as the kernels take them: the scale resolved, causal folded into the window.
pub(crate) fn params(opts: &AttentionOptions, head_dim: usize) -> Result<AttentionParams> {
    let scale = opts.scale.unwrap_or(1.0 / (head_dim as f32).sqrt());
    if !scale.is_finite() {
        return Err(Error::shape(format!("softmax scale {scale} is not finite")));
    }
    if let Some(cap) = opts.softcap {
        if !(cap.is_finite() && cap > 0.0) {
            return Err(Error::shape(format!(
                "softcap {cap} must be positive and finite"
            )));
        }
    }
    let (left, mut right) = match opts.window {
        // Beyond any sequence length, and far from i64's range in the mask arithmetic.
        Some((l, r)) => (Some(l.min(WINDOW_CAP)), Some(r.min(WINDOW_CAP))),
        None => (None, None),
    };
    if opts.causal {
        right = Some(0);
    }
    Ok(AttentionParams {
        scale,
        softcap: opts.softcap,
        left,
        right,
    })
}
