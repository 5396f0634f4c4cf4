//! `CpuStorage`: host bytes behind a lock, 64-byte aligned.

use calico_core::{check_byte_range, BackendKind, DeviceId, Error, Result, Storage};
use std::any::Any;
use std::fmt;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The device id every CPU buffer reports.
pub(crate) const CPU_DEVICE_ID: DeviceId = DeviceId {
    kind: BackendKind::Cpu,
    ordinal: 0,
};

/// One cache line; a `Vec` of these is a 64-byte aligned byte buffer without `unsafe`.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
pub(crate) struct Line([u8; 64]);

/// A zero-filled, 64-byte aligned byte buffer of exactly `len` bytes.
pub(crate) struct AlignedBytes {
    lines: Vec<Line>,
    len: usize,
}

impl AlignedBytes {
    /// Allocates `len` zero bytes; an allocation failure is an `Err`, not an abort.
    pub(crate) fn zeroed(len: usize) -> Result<Self> {
        let n = len.div_ceil(64);
        let mut lines = Vec::new();
        lines.try_reserve_exact(n).map_err(|e| {
            Error::unsupported(format!("cannot allocate {len} bytes of host memory: {e}"))
        })?;
        lines.resize(n, Line([0; 64]));
        Ok(AlignedBytes { lines, len })
    }

    /// An aligned copy of `src`.
    pub(crate) fn copy_of(src: &[u8]) -> Result<Self> {
        let mut out = Self::zeroed(src.len())?;
        out.as_mut_slice().copy_from_slice(src);
        Ok(out)
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.lines)[..self.len]
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.lines)[..self.len]
    }
}

/// A CPU buffer. The lock makes reads and writes through `&self` sound; ops lock every
/// storage they touch for the whole op (see `views`).
pub struct CpuStorage {
    bytes: RwLock<AlignedBytes>,
    len: usize,
}

impl fmt::Debug for CpuStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpuStorage")
            .field("size_bytes", &self.len)
            .finish()
    }
}

impl CpuStorage {
    /// A zero-filled buffer of `bytes` bytes, aligned to 64 bytes.
    pub fn zeroed(bytes: usize) -> Result<CpuStorage> {
        Ok(CpuStorage {
            bytes: RwLock::new(AlignedBytes::zeroed(bytes)?),
            len: bytes,
        })
    }

    /// Downcasts a storage to a CPU buffer, or says why not.
    pub fn downcast(storage: &dyn Storage) -> Result<&CpuStorage> {
        storage
            .as_any()
            .downcast_ref::<CpuStorage>()
            .ok_or_else(|| {
                Error::DeviceMismatch(format!(
                    "the CPU backend got a buffer of device {}",
                    storage.device_id()
                ))
            })
    }

    /// Shared access. A poisoned lock only means another op panicked mid-write; the bytes
    /// have no invariants to protect, so the guard is taken anyway.
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, AlignedBytes> {
        self.bytes.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Exclusive access (see [`CpuStorage::read`] on poisoning).
    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, AlignedBytes> {
        self.bytes.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The address that orders lock acquisition across storages.
    pub(crate) fn lock_order_key(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }
}

impl Storage for CpuStorage {
    fn device_id(&self) -> DeviceId {
        CPU_DEVICE_ID
    }

    fn size_bytes(&self) -> usize {
        self.len
    }

    fn write_bytes(&self, offset: usize, src: &[u8]) -> Result<()> {
        check_byte_range(self.len, offset, src.len())?;
        crate::stream::copy_large(
            &mut self.write().as_mut_slice()[offset..offset + src.len()],
            src,
        );
        Ok(())
    }

    fn read_bytes(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_byte_range(self.len, offset, dst.len())?;
        crate::stream::copy_large(dst, &self.read().as_slice()[offset..offset + dst.len()]);
        Ok(())
    }

    fn device_address(&self) -> Option<u64> {
        None
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_zeroed_and_exact() {
        for len in [0, 1, 63, 64, 65, 1000] {
            let mut b = AlignedBytes::zeroed(len).unwrap();
            assert_eq!(b.as_slice().len(), len);
            assert_eq!(b.as_slice().as_ptr() as usize % 64, 0);
            assert!(b.as_slice().iter().all(|&x| x == 0));
            b.as_mut_slice().fill(1);
            let c = AlignedBytes::copy_of(b.as_slice()).unwrap();
            assert_eq!(c.as_slice(), b.as_slice());
            assert_eq!(c.as_slice().as_ptr() as usize % 64, 0);
        }
    }

    #[test]
    fn impossible_allocation_is_an_error() {
        assert!(CpuStorage::zeroed(usize::MAX - 1).is_err());
    }
}
