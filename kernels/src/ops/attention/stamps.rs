//! Device buffers of %globaltimer stamps for the attention kernels' diagnostic traces
//! (`CALICO_DECODE_TUNE=trace=1`, `CALICO_ATTN_HOPPER_TRACE=1`): allocated zeroed (a milestone
//! not reached stays 0), read back once the call's work is done, printed on every 8th traced
//! call. `decode_trace` and `hopper_trace` turn the stamps into their lines.

use calico_core::{GpuBackend, Result, Storage};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A zeroed device buffer of `words` u64 stamps.
pub(crate) fn zeroed(gpu: &dyn GpuBackend, words: usize) -> Result<Arc<dyn Storage>> {
    let storage = gpu.alloc(words * 8)?;
    storage.write_bytes(0, &vec![0u8; storage.size_bytes()])?;
    Ok(storage)
}

/// Waits for the queued work, then reads the stamps back.
pub(crate) fn read(gpu: &dyn GpuBackend, storage: &dyn Storage) -> Result<Vec<u64>> {
    gpu.synchronize()?;
    let mut bytes = vec![0u8; storage.size_bytes()];
    storage.read_bytes(0, &mut bytes)?;
    Ok(bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect())
}

/// True on the 4th, 12th, 20th, ... call counted by `calls`: a few lines per bench case.
pub(crate) fn every_eighth(calls: &AtomicUsize) -> bool {
    calls.fetch_add(1, Ordering::Relaxed) % 8 == 3
}
