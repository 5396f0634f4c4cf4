//! `CpuDevice`: the host as a Calico device.

use crate::storage::{CpuStorage, CPU_DEVICE_ID};
use calico_core::{check_byte_range, Arch, Backend, BackendKind, DeviceId, Result, Storage};
use std::sync::Arc;
use std::time::Instant;

/// The CPU backend. Cheap to clone; every clone is the same device.
#[derive(Debug, Clone)]
pub struct CpuDevice {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    name: String,
    arch: Arch,
}

impl Default for CpuDevice {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuDevice {
    /// The host CPU, with as many compute units as rayon has threads.
    pub fn new() -> CpuDevice {
        let threads = u32::try_from(rayon::current_num_threads()).unwrap_or(u32::MAX);
        let mut arch = Arch::cpu(threads);
        arch.l2_bytes = last_level_cache_bytes().unwrap_or(0);
        CpuDevice {
            inner: Arc::new(Inner {
                name: cpu_model_name(),
                arch,
            }),
        }
    }
}

/// The size of CPU 0's highest-level cache, from Linux's sysfs (None elsewhere): what a
/// benchmark must exceed for its reads to come from memory.
pub(crate) fn last_level_cache_bytes() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    let read = |path: std::path::PathBuf| std::fs::read_to_string(path).ok();
    dir.filter_map(|e| e.ok())
        .filter_map(|e| {
            let level: u32 = read(e.path().join("level"))?.trim().parse().ok()?;
            Some((level, parse_cache_size(&read(e.path().join("size"))?)?))
        })
        .max()
        .map(|(_, bytes)| bytes)
}

/// sysfs cache sizes read like "32768K" (or "1M", or plain bytes).
fn parse_cache_size(text: &str) -> Option<usize> {
    let t = text.trim();
    let (digits, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => t.split_at(i),
        None => (t, ""),
    };
    let n: usize = digits.parse().ok()?;
    let scale = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(scale)
}

/// The "model name" line of /proc/cpuinfo, or "CPU" where there is none.
fn cpu_model_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.trim() == "model name")
                .map(|(_, v)| v.trim().to_string())
        })
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "CPU".to_string())
}

impl Backend for CpuDevice {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    fn device_id(&self) -> DeviceId {
        CPU_DEVICE_ID
    }

    fn name(&self) -> &str {
        &self.inner.name
    }

    fn arch(&self) -> &Arch {
        &self.inner.arch
    }

    fn alloc(&self, bytes: usize) -> Result<Arc<dyn Storage>> {
        Ok(Arc::new(CpuStorage::zeroed(bytes)?))
    }

    /// Ops run to completion before they return; nothing is queued.
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn copy_bytes(
        &self,
        dst: &dyn Storage,
        dst_offset: usize,
        src: &dyn Storage,
        src_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        let (dst, src) = (CpuStorage::downcast(dst)?, CpuStorage::downcast(src)?);
        check_byte_range(dst.size_bytes(), dst_offset, bytes)?;
        check_byte_range(src.size_bytes(), src_offset, bytes)?;
        if dst.lock_order_key() == src.lock_order_key() {
            // One buffer: a single write lock and a memmove.
            dst.write()
                .as_mut_slice()
                .copy_within(src_offset..src_offset + bytes, dst_offset);
            return Ok(());
        }
        // Lock in address order, as ops do, so concurrent copies cannot deadlock.
        if src.lock_order_key() < dst.lock_order_key() {
            let s = src.read();
            let mut d = dst.write();
            crate::stream::copy_large(
                &mut d.as_mut_slice()[dst_offset..dst_offset + bytes],
                &s.as_slice()[src_offset..src_offset + bytes],
            );
        } else {
            let mut d = dst.write();
            let s = src.read();
            crate::stream::copy_large(
                &mut d.as_mut_slice()[dst_offset..dst_offset + bytes],
                &s.as_slice()[src_offset..src_offset + bytes],
            );
        }
        Ok(())
    }

    fn time_ms(&self, work: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        let start = Instant::now();
        work()?;
        Ok(start.elapsed().as_secs_f64() * 1e3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_parse_with_and_without_units() {
        assert_eq!(parse_cache_size("32768K\n"), Some(32 << 20));
        assert_eq!(parse_cache_size("1M"), Some(1 << 20));
        assert_eq!(parse_cache_size("4096"), Some(4096));
        assert_eq!(parse_cache_size("12Q"), None);
        assert_eq!(parse_cache_size(""), None);
    }

    #[test]
    fn the_last_level_cache_is_read_where_sysfs_lists_one() {
        let listed = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache/index0").exists();
        let bytes = CpuDevice::new().arch().l2_bytes;
        if listed {
            assert!(bytes >= 1 << 10, "sysfs lists caches but none was read");
        } else {
            assert_eq!(bytes, 0, "no sysfs cache listing: unknown is 0");
        }
    }
}
