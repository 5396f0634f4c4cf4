//! Device memory: stream-ordered allocations of this backend, or borrowed buffers (interop).

use crate::error::driver_err;
use calico_core::{check_byte_range, DeviceId, Result, Storage};
use cudarc::driver::{result, sys, CudaContext, CudaStream};
use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// The context and stream that every buffer and launch of one device uses.
pub(crate) struct Queue {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) id: DeviceId,
}

impl Queue {
    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(driver_err("cuCtxSetCurrent"))
    }
    pub(crate) fn cu_stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.bind()?;
        self.stream
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))
    }
}

/// Who frees the memory.
enum Ownership {
    /// Allocated by Calico with cuMemAllocAsync; freed on drop.
    Owned,
    /// Borrowed (a cudarc `CudaSlice` or a raw pointer); `keep_alive` holds the owner, if any.
    Borrowed {
        _keep_alive: Option<Box<dyn Any + Send + Sync>>,
    },
}

/// A buffer of CUDA device memory.
pub struct CudaStorage {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    queue: Arc<Queue>,
    ownership: Ownership,
}

impl fmt::Debug for CudaStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaStorage")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl CudaStorage {
    /// Allocates `bytes` zero-filled bytes, ordered on the device's stream.
    pub(crate) fn alloc(queue: &Arc<Queue>, bytes: usize) -> Result<CudaStorage> {
        queue.bind()?;
        // cuMemAllocAsync rejects zero bytes; keep one byte so every storage has an address.
        let size = bytes.max(1);
        // SAFETY: the context is bound; the stream belongs to it and outlives the allocation
        // (the storage holds the queue).
        let ptr = unsafe { result::malloc_async(queue.cu_stream(), size) }
            .map_err(driver_err("cuMemAllocAsync"))?;
        // SAFETY: `ptr` points to `size` bytes just allocated on this stream.
        unsafe { result::memset_d8_async(ptr, 0, size, queue.cu_stream()) }
            .map_err(driver_err("cuMemsetD8Async"))?;
        Ok(CudaStorage {
            ptr,
            bytes,
            queue: queue.clone(),
            ownership: Ownership::Owned,
        })
    }

    /// Wraps memory someone else owns.
    ///
    /// # Safety
    /// `ptr` must point to at least `bytes` bytes of device memory of this device's context,
    /// valid for as long as the storage (and every tensor viewing it) lives; `keep_alive`, if
    /// given, must own that memory.
    pub(crate) unsafe fn borrowed(
        queue: &Arc<Queue>,
        ptr: u64,
        bytes: usize,
        keep_alive: Option<Box<dyn Any + Send + Sync>>,
    ) -> CudaStorage {
        CudaStorage {
            ptr,
            bytes,
            queue: queue.clone(),
            ownership: Ownership::Borrowed {
                _keep_alive: keep_alive,
            },
        }
    }

    /// The raw device pointer.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for CudaStorage {
    fn drop(&mut self) {
        if let Ownership::Owned = self.ownership {
            if self.queue.bind().is_ok() {
                // SAFETY: the pointer came from cuMemAllocAsync on this stream and is freed once;
                // stream order keeps queued kernels that use it ahead of the free.
                let _ = unsafe { result::free_async(self.ptr, self.queue.cu_stream()) };
            }
        }
    }
}

impl Storage for CudaStorage {
    fn device_id(&self) -> DeviceId {
        self.queue.id
    }
    fn size_bytes(&self) -> usize {
        self.bytes
    }
    fn write_bytes(&self, offset: usize, src: &[u8]) -> Result<()> {
        check_byte_range(self.bytes, offset, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.queue.bind()?;
        // SAFETY: the destination range is inside the buffer (checked above); the copy is
        // ordered after queued work on the stream and we wait for it before `src` can go away.
        unsafe { result::memcpy_htod_async(self.ptr + offset as u64, src, self.queue.cu_stream()) }
            .map_err(driver_err("cuMemcpyHtoDAsync"))?;
        self.queue.synchronize()
    }
    fn read_bytes(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_byte_range(self.bytes, offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.queue.bind()?;
        // SAFETY: the source range is inside the buffer; we wait for the copy before returning,
        // so `dst` stays borrowed for its whole duration.
        unsafe { result::memcpy_dtoh_async(dst, self.ptr + offset as u64, self.queue.cu_stream()) }
            .map_err(driver_err("cuMemcpyDtoHAsync"))?;
        self.queue.synchronize()
    }
    fn device_address(&self) -> Option<u64> {
        Some(self.ptr)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
