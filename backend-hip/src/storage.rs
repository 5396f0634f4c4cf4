//! Device memory: `HipStorage` owns one hipMalloc allocation.

use crate::context::{Context, Handle};
use crate::result::check;
use crate::sys;
use calico_core::{check_byte_range, BackendKind, DeviceId, Result, Storage};
use std::any::Any;
use std::ffi::c_void;
use std::sync::Arc;

/// A buffer in HIP device memory. Reads and writes are ordered with kernels on the device's
/// stream.
#[derive(Debug)]
pub struct HipStorage {
    ctx: Arc<Context>,
    ptr: Handle,
    bytes: usize,
    /// Whether this storage allocated the memory (and frees it) or views the caller's.
    owned: bool,
}

impl HipStorage {
    /// Allocates `bytes` zero-filled bytes (a zero-byte buffer allocates nothing).
    pub(crate) fn zeroed(ctx: Arc<Context>, bytes: usize) -> Result<HipStorage> {
        if bytes == 0 {
            return Ok(HipStorage {
                ctx,
                ptr: Handle(std::ptr::null_mut()),
                bytes,
                owned: true,
            });
        }
        ctx.bind()?;
        let hip = &ctx.rt.hip;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a live out-pointer.
        let code = unsafe { (hip.hipMalloc)(&mut ptr, bytes) };
        check(hip, code, &format!("hipMalloc({bytes} bytes)"))?;
        let storage = HipStorage {
            ctx,
            ptr: Handle(ptr),
            bytes,
            owned: true,
        };
        // SAFETY: the allocation is `bytes` long; the stream belongs to this device.
        let code = unsafe { (hip.hipMemsetAsync)(ptr, 0, bytes, storage.ctx.stream()) };
        check(hip, code, "hipMemsetAsync")?;
        Ok(storage)
    }

    /// A view of `bytes` bytes of the caller's device memory at `ptr`: never freed here.
    ///
    /// # Safety
    /// `ptr` must address at least `bytes` bytes of device memory of `ctx`'s device, valid
    /// until this storage is dropped.
    pub(crate) unsafe fn borrowed(ctx: Arc<Context>, ptr: u64, bytes: usize) -> HipStorage {
        HipStorage {
            ctx,
            ptr: Handle(ptr as *mut c_void),
            bytes,
            owned: false,
        }
    }

    /// The device pointer of byte 0.
    pub fn as_ptr(&self) -> u64 {
        self.ptr.0 as u64
    }

    pub(crate) fn ordinal(&self) -> i32 {
        self.ctx.ordinal
    }

    fn at(&self, offset: usize) -> *mut c_void {
        self.ptr.0.cast::<u8>().wrapping_add(offset).cast()
    }
}

impl Storage for HipStorage {
    fn device_id(&self) -> DeviceId {
        DeviceId {
            kind: BackendKind::Hip,
            ordinal: self.ctx.ordinal as usize,
        }
    }

    fn size_bytes(&self) -> usize {
        self.bytes
    }

    fn write_bytes(&self, offset: usize, src: &[u8]) -> Result<()> {
        check_byte_range(self.bytes, offset, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.ctx.bind()?;
        let hip = &self.ctx.rt.hip;
        // SAFETY: the range was checked against the allocation; `src` stays borrowed until
        // the stream synchronisation below, so the runtime never reads freed host memory.
        let code = unsafe {
            (hip.hipMemcpyAsync)(
                self.at(offset),
                src.as_ptr().cast(),
                src.len(),
                sys::HIP_MEMCPY_HOST_TO_DEVICE,
                self.ctx.stream(),
            )
        };
        check(hip, code, "hipMemcpyAsync(host to device)")?;
        self.ctx.sync()
    }

    fn read_bytes(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_byte_range(self.bytes, offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.ctx.bind()?;
        let hip = &self.ctx.rt.hip;
        // SAFETY: as in write_bytes; `dst` is exclusively borrowed until the copy completes.
        let code = unsafe {
            (hip.hipMemcpyAsync)(
                dst.as_mut_ptr().cast(),
                self.at(offset),
                dst.len(),
                sys::HIP_MEMCPY_DEVICE_TO_HOST,
                self.ctx.stream(),
            )
        };
        check(hip, code, "hipMemcpyAsync(device to host)")?;
        self.ctx.sync()
    }

    fn device_address(&self) -> Option<u64> {
        Some(self.as_ptr())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for HipStorage {
    fn drop(&mut self) {
        if self.ptr.0.is_null() || !self.owned {
            return;
        }
        // Queued kernels may still use the buffer: wait for them before freeing.
        let _ = self.ctx.sync();
        // SAFETY: we own the allocation and nothing queued refers to it any more.
        unsafe { (self.ctx.rt.hip.hipFree)(self.ptr.0) };
    }
}

/// Copies `bytes` bytes device-to-device on the stream, after checking both ranges.
pub(crate) fn copy_async(
    ctx: &Context,
    dst: &HipStorage,
    dst_offset: usize,
    src: &HipStorage,
    src_offset: usize,
    bytes: usize,
) -> Result<()> {
    check_byte_range(dst.bytes, dst_offset, bytes)?;
    check_byte_range(src.bytes, src_offset, bytes)?;
    if bytes == 0 {
        return Ok(());
    }
    ctx.bind()?;
    let hip = &ctx.rt.hip;
    // SAFETY: both ranges lie inside live allocations of this device; the storages are kept
    // alive by their owners, and Drop waits for the stream before freeing.
    let code = unsafe {
        (hip.hipMemcpyAsync)(
            dst.at(dst_offset),
            src.at(src_offset),
            bytes,
            sys::HIP_MEMCPY_DEVICE_TO_DEVICE,
            ctx.stream(),
        )
    };
    check(hip, code, "hipMemcpyAsync(device to device)")
}
