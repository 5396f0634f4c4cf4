//! Packed variable-length batches (as flash_attn_varlen_func): sequence `b` holds query rows
//! `cu_seqlens_q[b]..cu_seqlens_q[b + 1]` of Q `[total_q, Hq, D]` and key rows
//! `cu_seqlens_k[b]..cu_seqlens_k[b + 1]` of K and V `[total_k, Hkv, D]`. The LSE is f32
//! `[Hq, total_q]`, contiguous.

use super::{check, common, gpu, AttentionOptions};
use crate::Device;
use calico_core::{DType, Error, Result, Tensor};
use calico_cpu::{AttentionShape, SeqSpan};

/// The offsets tensors: I32 `[batch + 1]`, contiguous, one length for both.
fn offsets(cu_q: &Tensor, cu_k: &Tensor) -> Result<usize> {
    for (name, t) in [("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)] {
        common::dtype_is(name, t, DType::I32)?;
        if t.shape().len() != 1 || t.shape()[0] == 0 || !t.layout().is_contiguous() {
            return Err(Error::shape(format!(
                "`{name}` must be a contiguous [batch + 1] vector, got shape {:?}",
                t.shape()
            )));
        }
    }
    if cu_q.shape() != cu_k.shape() {
        return Err(Error::shape(format!(
            "`cu_seqlens_q` {:?} and `cu_seqlens_k` {:?} must have one length",
            cu_q.shape(),
            cu_k.shape()
        )));
    }
    Ok(cu_q.shape()[0] - 1)
}

/// Reads and checks offsets on the host: from 0 to `total`, non-decreasing.
fn host_offsets(name: &str, t: &Tensor, total: usize) -> Result<Vec<usize>> {
    let raw: Vec<i32> = t.to_vec()?;
    let mut out = Vec::with_capacity(raw.len());
    for (i, &c) in raw.iter().enumerate() {
        let prev = out.last().copied().unwrap_or(0);
        if c < 0 || (i > 0 && (c as usize) < prev) || c as usize > total {
            return Err(Error::shape(format!(
                "`{name}`[{i}] = {c}: offsets must be non-decreasing and within 0..={total}"
            )));
        }
        out.push(c as usize);
    }
    if out.first() != Some(&0) || out.last() != Some(&total) {
        return Err(Error::shape(format!(
            "`{name}` must run from 0 to the packed length {total}, got {raw:?}"
        )));
    }
    Ok(out)
}

fn packed_shape(p: &check::Problem, cu_q: &Tensor, cu_k: &Tensor) -> Result<AttentionShape> {
    let cq = host_offsets("cu_seqlens_q", cu_q, p.q_len)?;
    let ck = host_offsets("cu_seqlens_k", cu_k, p.k_len)?;
    Ok(AttentionShape {
        seqs: (0..p.batch)
            .map(|b| SeqSpan {
                batch: 0,
                q_start: cq[b],
                q_len: cq[b + 1] - cq[b],
                k_start: ck[b],
                k_len: ck[b + 1] - ck[b],
            })
            .collect(),
        q_heads: p.q_heads,
        kv_heads: p.kv_heads,
        head_dim: p.head_dim,
    })
}

/// Forward attention over packed sequences: writes `o` (like `q`) and `lse` (f32
/// `[Hq, total_q]`). On GPUs the offsets are not read back to the host (that would
/// synchronise): offsets out of order or past the end are clamped by the kernel (never read
/// or written out of bounds) and rows past the last offset are left as they are; the CPU
/// backend reports such offsets as an `Err`.
#[allow(clippy::too_many_arguments)]
pub fn attention_varlen(
    dev: &Device,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cu_seqlens_q: &Tensor,
    cu_seqlens_k: &Tensor,
    opts: &AttentionOptions,
    o: &mut Tensor,
    lse: &mut Tensor,
) -> Result<()> {
    let mut p = check::packed_qkv(q, k, v)?;
    p.batch = offsets(cu_seqlens_q, cu_seqlens_k)?;
    common::on_device(
        dev,
        &[
            ("q", q),
            ("k", k),
            ("v", v),
            ("cu_seqlens_q", cu_seqlens_q),
            ("cu_seqlens_k", cu_seqlens_k),
            ("o", o),
            ("lse", lse),
        ],
    )?;
    check::like("o", o, p.dtype, q.shape())?;
    check::lse_is(lse, &[p.q_heads, p.q_len])?;
    common::no_overlap(
        &[("o", o), ("lse", lse)],
        &[
            ("q", q),
            ("k", k),
            ("v", v),
            ("cu_seqlens_q", cu_seqlens_q),
            ("cu_seqlens_k", cu_seqlens_k),
        ],
    )?;
    let params = check::params(opts, p.head_dim)?;
    if o.numel() == 0 || p.batch == 0 {
        return Ok(());
    }
    match dev {
        Device::Cpu(_) => {
            let shape = packed_shape(&p, cu_seqlens_q, cu_seqlens_k)?;
            calico_cpu::attention_forward(&shape, &params, q, k, v, o, lse)
        }
        _ => gpu::forward(
            dev,
            &p,
            &params,
            [q, k, v, o, lse],
            Some([cu_seqlens_q, cu_seqlens_k]),
        ),
    }
}

/// Backward of [`attention_varlen`]: writes `dq` (like `q`), `dk` and `dv` (like `k`). On
/// GPUs, as in the forward, the offsets are clamped rather than checked; rows and keys outside
/// every sequence then get no defined gradient (zeros from the Hopper kernels).
#[allow(clippy::too_many_arguments)]
pub fn attention_varlen_backward(
    dev: &Device,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o: &Tensor,
    lse: &Tensor,
    d_o: &Tensor,
    cu_seqlens_q: &Tensor,
    cu_seqlens_k: &Tensor,
    opts: &AttentionOptions,
    dq: &mut Tensor,
    dk: &mut Tensor,
    dv: &mut Tensor,
) -> Result<()> {
    let mut p = check::packed_qkv(q, k, v)?;
    p.batch = offsets(cu_seqlens_q, cu_seqlens_k)?;
    common::on_device(
        dev,
        &[
            ("q", q),
            ("k", k),
            ("v", v),
            ("o", o),
            ("lse", lse),
            ("d_o", d_o),
            ("cu_seqlens_q", cu_seqlens_q),
            ("cu_seqlens_k", cu_seqlens_k),
            ("dq", dq),
            ("dk", dk),
            ("dv", dv),
        ],
    )?;
    check::backward_like(p.dtype, q, k, [o, d_o, dq, dk, dv])?;
    check::lse_is(lse, &[p.q_heads, p.q_len])?;
    common::no_overlap(
        &[("dq", dq), ("dk", dk), ("dv", dv)],
        &[
            ("q", q),
            ("k", k),
            ("v", v),
            ("o", o),
            ("lse", lse),
            ("d_o", d_o),
            ("cu_seqlens_q", cu_seqlens_q),
            ("cu_seqlens_k", cu_seqlens_k),
        ],
    )?;
    let params = check::params(opts, p.head_dim)?;
    if dq.numel() == 0 && dk.numel() == 0 {
        return Ok(());
    }
    match dev {
        Device::Cpu(_) => {
            let shape = packed_shape(&p, cu_seqlens_q, cu_seqlens_k)?;
            calico_cpu::attention_backward(&shape, &params, q, k, v, o, lse, d_o, dq, dk, dv)
        }
        _ => gpu::backward(
            dev,
            &p,
            &params,
            opts.deterministic,
            [q, k, v, o, lse, d_o, dq, dk, dv],
            Some([cu_seqlens_q, cu_seqlens_k]),
        ),
    }
}
