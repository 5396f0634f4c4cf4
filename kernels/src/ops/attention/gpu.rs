//! GPU launches of the attention kernels.

use super::check::Problem;
use crate::Device;
use calico_core::{Error, Result, Tensor};
use calico_cpu::AttentionParams;

/// Launches the forward kernel on `[q, k, v, o, lse]`; `varlen` holds the offsets tensors.
pub(crate) fn forward(
    _dev: &Device,
    _p: &Problem,
    _params: &AttentionParams,
    _t: [&Tensor; 5],
    _varlen: Option<[&Tensor; 2]>,
) -> Result<()> {
    Err(Error::unsupported(
        "attention forward has no GPU kernel yet",
    ))
}

/// Launches the backward kernels on `[q, k, v, o, lse, d_o, dq, dk, dv]`.
pub(crate) fn backward(
    _dev: &Device,
    _p: &Problem,
    _params: &AttentionParams,
    _deterministic: bool,
    _t: [&Tensor; 9],
    _varlen: Option<[&Tensor; 2]>,
) -> Result<()> {
    Err(Error::unsupported(
        "attention backward has no GPU kernel yet",
    ))
}
