//! Scaled dot-product attention: forward, backward, and packed variable-length batches.
//!
//! Q is `[B, Hq, Nq, D]`, K and V `[B, Hkv, Nkv, D]`, with any strides as long as the head
//! dimension is contiguous: a `(batch, seq, heads, dim)` tensor is passed as its
//! `.transpose(1, 2)` view. `Hq` is a multiple of `Hkv` (GQA, MQA). The log-sum-exp is f32
//! `[B, Hq, Nq]`, contiguous, in natural log. Causal masks and windows are bottom-right
//! aligned: query `i` sees key `j` iff `j <= i + Nkv - Nq` (causal), and
//! `i + Nkv - Nq - left <= j <= i + Nkv - Nq + right` (window). A row that sees no key gets
//! `O = 0` and `LSE = -inf`. See docs/ops-spec.md.

pub(crate) mod cdna;
pub(crate) mod check;
pub(crate) mod decode;
pub(crate) mod decode_mma;
pub(crate) mod decode_trace;
pub(crate) mod gpu;
pub(crate) mod hopper;
pub(crate) mod hopper_bwd;
pub(crate) mod hopper_trace;
mod stamps;
pub(crate) mod tiles;
mod varlen;

use super::check as common;
use crate::Device;
use calico_core::{Result, Tensor};
use calico_cpu::{AttentionShape, SeqSpan};

pub use decode::{attention_decode, KvCache, MAX_DECODE_QUERIES};
pub use tiles::with_tile_forward;
pub use varlen::{attention_varlen, attention_varlen_backward};

/// How scores are formed and masked.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct AttentionOptions {
    /// Multiplies `q . k`; `1 / sqrt(D)` when `None`.
    pub scale: Option<f32>,
    /// Query `i` sees keys `j <= i + Nkv - Nq` only.
    pub causal: bool,
    /// Sliding window `(left, right)` in tokens around `i + Nkv - Nq` (as flash-attn).
    pub window: Option<(usize, usize)>,
    /// Soft-cap of the scaled scores: `s = cap * tanh(s / cap)`.
    pub softcap: Option<f32>,
    /// Backward only: bit-identical results across runs. The CPU and the tile kernels are
    /// deterministic in every mode; the Hopper backward sums dQ with f32 atomics (exact
    /// sums, order-dependent last bits), so deterministic calls take the tile kernels.
    pub deterministic: bool,
}

fn fixed_shape(p: &check::Problem) -> AttentionShape {
    AttentionShape {
        seqs: (0..p.batch)
            .map(|b| SeqSpan {
                batch: b,
                q_start: 0,
                q_len: p.q_len,
                k_start: 0,
                k_len: p.k_len,
            })
            .collect(),
        q_heads: p.q_heads,
        kv_heads: p.kv_heads,
        head_dim: p.head_dim,
    }
}

/// Forward attention: writes `o` (like `q`) and `lse` (f32 `[B, Hq, Nq]`, contiguous).
pub fn attention(
    dev: &Device,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    opts: &AttentionOptions,
    o: &mut Tensor,
    lse: &mut Tensor,
) -> Result<()> {
    let p = check::qkv(q, k, v)?;
    common::on_device(dev, &[("q", q), ("k", k), ("v", v), ("o", o), ("lse", lse)])?;
    check::like("o", o, p.dtype, q.shape())?;
    check::lse_is(lse, &[p.batch, p.q_heads, p.q_len])?;
    common::no_overlap(&[("o", o), ("lse", lse)], &[("q", q), ("k", k), ("v", v)])?;
    let params = check::params(opts, p.head_dim)?;
    if o.numel() == 0 {
        return Ok(());
    }
    match dev {
        Device::Cpu(_) => calico_cpu::attention_forward(&fixed_shape(&p), &params, q, k, v, o, lse),
        _ => gpu::forward(dev, &p, &params, [q, k, v, o, lse], None),
    }
}

/// Backward attention: from `q`, `k`, `v`, the forward's `o` and `lse`, and `d_o` (like `o`),
/// writes `dq` (like `q`), `dk` and `dv` (like `k`). dK and dV sum over the query heads of
/// each KV head.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    dev: &Device,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o: &Tensor,
    lse: &Tensor,
    d_o: &Tensor,
    opts: &AttentionOptions,
    dq: &mut Tensor,
    dk: &mut Tensor,
    dv: &mut Tensor,
) -> Result<()> {
    let p = check::qkv(q, k, v)?;
    common::on_device(
        dev,
        &[
            ("q", q),
            ("k", k),
            ("v", v),
            ("o", o),
            ("lse", lse),
            ("d_o", d_o),
            ("dq", dq),
            ("dk", dk),
            ("dv", dv),
        ],
    )?;
    check::backward_like(p.dtype, q, k, [o, d_o, dq, dk, dv])?;
    check::lse_is(lse, &[p.batch, p.q_heads, p.q_len])?;
    common::no_overlap(
        &[("dq", dq), ("dk", dk), ("dv", dv)],
        &[
            ("q", q),
            ("k", k),
            ("v", v),
            ("o", o),
            ("lse", lse),
            ("d_o", d_o),
        ],
    )?;
    let params = check::params(opts, p.head_dim)?;
    if dq.numel() == 0 && dk.numel() == 0 {
        return Ok(());
    }
    match dev {
        Device::Cpu(_) => calico_cpu::attention_backward(
            &fixed_shape(&p),
            &params,
            q,
            k,
            v,
            o,
            lse,
            d_o,
            dq,
            dk,
            dv,
        ),
        _ => gpu::backward(
            dev,
            &p,
            &params,
            opts.deterministic,
            [q, k, v, o, lse, d_o, dq, dk, dv],
            None,
        ),
    }
}
