//! Device copy bandwidth: the yardstick of every memory-bound op, measured in the same run.

use crate::report::{CopyResult, Timed};
use crate::rng::{random_tensor, XorShift};
use crate::timing::{time_runs, Plan};
use calico::{DType, Device, Result};

/// Times `copy_bytes` of a `buffer_bytes` buffer; bytes moved = read + written.
pub fn measure(dev: &Device, plan: &Plan, buffer_bytes: usize, rng: &mut XorShift) -> CopyResult {
    let elems = buffer_bytes / 2;
    let bytes = elems * 2;
    let timed = match time_copy(dev, plan, elems, rng) {
        Ok(stats) => Timed::ok(stats),
        Err(e) => Timed::from_error(&e),
    };
    CopyResult {
        buffer_bytes: bytes as u64,
        bytes_moved: 2 * bytes as u64,
        timed,
        gbps: None,
    }
}

fn time_copy(
    dev: &Device,
    plan: &Plan,
    elems: usize,
    rng: &mut XorShift,
) -> Result<crate::stats::Stats> {
    let src = random_tensor(dev, rng, &[elems], DType::BF16, -1.0, 1.0)?;
    let dst = dev.zeros(&[elems], DType::BF16)?;
    let bytes = elems * 2;
    // A buffer this size is far past any L2, so no rotation and no pad are needed.
    time_runs(dev, plan, None, &mut |_| {
        dev.copy_bytes(&**dst.storage(), 0, &**src.storage(), 0, bytes)
    })
}
