//! A HIP stream created for the caller's own work (the AMD side of a cudarc stream from
//! `CudaContext::new_stream`): to order work with Calico's, or to run Calico's ops on through
//! `HipDevice::with_stream`.

use crate::context::Handle;
use crate::loader::Runtime;
use crate::result::check;
use crate::sys::{self, HipStream};
use calico_core::Result;

/// A non-blocking HIP stream of one device, destroyed (after its work) when dropped.
#[derive(Debug)]
pub struct OwnedStream {
    rt: &'static Runtime,
    ordinal: i32,
    stream: Handle,
}

/// Makes device `ordinal` current and creates a non-blocking stream on it (one that does not
/// wait for the legacy null stream); the caller destroys it.
pub(crate) fn create_non_blocking(rt: &'static Runtime, ordinal: i32) -> Result<HipStream> {
    // SAFETY: plain int argument, a device ordinal validated against the device count.
    let code = unsafe { (rt.hip.hipSetDevice)(ordinal) };
    check(&rt.hip, code, "hipSetDevice")?;
    let mut stream: HipStream = std::ptr::null_mut();
    // SAFETY: `stream` is a live out-pointer.
    let code =
        unsafe { (rt.hip.hipStreamCreateWithFlags)(&mut stream, sys::HIP_STREAM_NON_BLOCKING) };
    check(&rt.hip, code, "hipStreamCreateWithFlags")?;
    Ok(stream)
}

impl OwnedStream {
    pub(crate) fn new(rt: &'static Runtime, ordinal: i32) -> Result<OwnedStream> {
        Ok(OwnedStream {
            rt,
            ordinal,
            stream: Handle(create_non_blocking(rt, ordinal)?),
        })
    }

    /// The raw stream, for `HipDevice::with_stream` or the caller's own HIP calls.
    pub fn raw(&self) -> HipStream {
        self.stream.0
    }

    /// Waits for everything queued on this stream.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the stream is alive for as long as `self`.
        let code = unsafe { (self.rt.hip.hipStreamSynchronize)(self.stream.0) };
        check(&self.rt.hip, code, "hipStreamSynchronize")
    }
}

impl Drop for OwnedStream {
    fn drop(&mut self) {
        // SAFETY: the stream is ours; its work is waited for before it is destroyed. Errors at
        // teardown have nowhere to go.
        unsafe {
            (self.rt.hip.hipSetDevice)(self.ordinal);
            (self.rt.hip.hipStreamSynchronize)(self.stream.0);
            (self.rt.hip.hipStreamDestroy)(self.stream.0);
        }
    }
}
