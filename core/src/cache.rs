//! The on-disk compile cache.
//!
//! One file per compiled kernel, named by the hex SHA-256 of (source, target, compiler
//! version, options). Each file carries a magic tag, the payload length and the payload's
//! SHA-256, so a truncated or corrupt entry is detected, removed and rebuilt. Entries are
//! written to a unique temporary file in the same directory and renamed into place, which is
//! atomic on POSIX file systems: concurrent processes never see a half-written entry, and two
//! processes building the same kernel both succeed.

use crate::kernel::hex;
use sha2::{Digest, Sha256};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

const MAGIC: &[u8; 8] = b"CALICO01";
const HEADER_LEN: usize = 8 + 8 + 32;

/// A directory of compiled kernels, or no cache at all.
#[derive(Debug, Clone)]
pub struct DiskCache {
    dir: Option<PathBuf>,
}

impl DiskCache {
    /// `CALICO_CACHE_DIR` if set (`off` disables the cache), else `<user cache dir>/calico`.
    pub fn from_env() -> DiskCache {
        match std::env::var_os("CALICO_CACHE_DIR") {
            Some(v) if v == "off" => DiskCache { dir: None },
            Some(v) if !v.is_empty() => DiskCache {
                dir: Some(PathBuf::from(v)),
            },
            _ => DiskCache {
                dir: dirs::cache_dir().map(|d| d.join("calico")),
            },
        }
    }

    /// A cache in `dir`.
    pub fn at(dir: impl Into<PathBuf>) -> DiskCache {
        DiskCache {
            dir: Some(dir.into()),
        }
    }

    /// A cache that stores nothing.
    pub fn disabled() -> DiskCache {
        DiskCache { dir: None }
    }

    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The key for a set of parts (source text, target, compiler version, options...).
    pub fn key(parts: &[&[u8]]) -> String {
        let mut h = Sha256::new();
        for p in parts {
            h.update((p.len() as u64).to_le_bytes());
            h.update(p);
        }
        hex(&h.finalize())
    }

    fn path(&self, key: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(format!("{key}.bin")))
    }

    /// The cached payload for `key`, if present and intact. A damaged entry is deleted.
    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        let path = self.path(key)?;
        let bytes = fs::read(&path).ok()?;
        match decode(&bytes) {
            Some(payload) => Some(payload.to_vec()),
            None => {
                let _ = fs::remove_file(&path);
                None
            }
        }
    }

    /// Stores `payload` under `key`. Failure to write is not an error for callers that can go
    /// on without a cache; it is returned so they can log it.
    pub fn put(&self, key: &str, payload: &[u8]) -> std::io::Result<()> {
        let Some(path) = self.path(key) else {
            return Ok(());
        };
        let dir = path.parent().expect("cache entries live in a directory");
        fs::create_dir_all(dir)?;
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let tmp = dir.join(format!(
            ".{key}.{}.{}.tmp",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let result = (|| {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(&encode(payload))?;
            f.sync_all()?;
            fs::rename(&tmp, &path)
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    /// The cached payload for `key`, or `build()`'s result, which is then stored.
    pub fn get_or_build<E>(
        &self,
        key: &str,
        build: impl FnOnce() -> Result<Vec<u8>, E>,
    ) -> Result<Vec<u8>, E> {
        if let Some(hit) = self.get(key) {
            return Ok(hit);
        }
        let payload = build()?;
        // A read-only or full disk must not fail the compile that just succeeded.
        let _ = self.put(key, &payload);
        Ok(payload)
    }
}

fn encode(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(payload));
    out.extend_from_slice(payload);
    out
}

fn decode(bytes: &[u8]) -> Option<&[u8]> {
    if bytes.len() < HEADER_LEN || &bytes[..8] != MAGIC {
        return None;
    }
    let len = u64::from_le_bytes(bytes[8..16].try_into().ok()?) as usize;
    let payload = bytes.get(HEADER_LEN..)?;
    if payload.len() != len || Sha256::digest(payload).as_slice() != &bytes[16..48] {
        return None;
    }
    Some(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("calico-cache-test-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn round_trip_and_miss() {
        let c = DiskCache::at(temp_dir("rt"));
        let k = DiskCache::key(&[b"src", b"sm_90a"]);
        assert_eq!(c.get(&k), None);
        c.put(&k, b"cubin bytes").unwrap();
        assert_eq!(c.get(&k).as_deref(), Some(&b"cubin bytes"[..]));
    }

    #[test]
    fn truncated_and_corrupt_entries_are_rebuilt() {
        let dir = temp_dir("corrupt");
        let c = DiskCache::at(&dir);
        let k = DiskCache::key(&[b"x"]);
        c.put(&k, &[7u8; 100]).unwrap();
        let path = dir.join(format!("{k}.bin"));
        let full = fs::read(&path).unwrap();
        fs::write(&path, &full[..full.len() - 10]).unwrap();
        assert_eq!(c.get(&k), None, "a truncated entry is a miss");
        assert!(!path.exists(), "and is removed");
        let mut flipped = full.clone();
        *flipped.last_mut().unwrap() ^= 1;
        fs::write(&path, &flipped).unwrap();
        let rebuilt = c.get_or_build::<()>(&k, || Ok(vec![9u8; 3])).unwrap();
        assert_eq!(rebuilt, vec![9u8; 3]);
        assert_eq!(c.get(&k), Some(vec![9u8; 3]));
    }

    #[test]
    fn concurrent_writers_leave_a_valid_entry() {
        let c = DiskCache::at(temp_dir("concurrent"));
        let k = DiskCache::key(&[b"shared"]);
        let payload: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..10 {
                        c.put(&k, &payload).unwrap();
                        if let Some(got) = c.get(&k) {
                            assert_eq!(got, payload);
                        }
                    }
                });
            }
        });
        assert_eq!(c.get(&k), Some(payload));
    }

    #[test]
    fn key_separates_parts() {
        assert_ne!(
            DiskCache::key(&[b"ab", b"c"]),
            DiskCache::key(&[b"a", b"bc"])
        );
    }
}
