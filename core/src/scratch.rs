//! Device memory that kernels keep between launches (the stream-K GEMM's partial tiles and
//! their ready flags), owned by a backend and handed out with a launch number.

use crate::{Result, Storage};
use std::sync::{Arc, Mutex};

/// Granularity of scratch growth, so a run of slightly larger requests allocates once.
const GROWTH: usize = 1 << 20;

/// A scratch buffer for one launch, and that launch's epoch: a number no earlier request on
/// this device received (it skips 0, so zero-filled flags never look raised).
///
/// Hold `storage` until the launch is queued: a later, larger request replaces the buffer,
/// and the old one is freed (in stream order) once the last holder drops it.
#[derive(Debug, Clone)]
pub struct Scratch {
    pub storage: Arc<dyn Storage>,
    pub epoch: u32,
}

/// One device's scratch buffer, grown on demand and zero-filled when (re)allocated.
#[derive(Debug, Default)]
pub struct ScratchPool {
    state: Mutex<PoolState>,
}

#[derive(Debug, Default)]
struct PoolState {
    buffer: Option<Arc<dyn Storage>>,
    epoch: u32,
}

impl ScratchPool {
    /// A buffer of at least `bytes`, allocating through `alloc` (which must zero-fill) when
    /// the current one is smaller.
    pub fn get(
        &self,
        bytes: usize,
        alloc: impl FnOnce(usize) -> Result<Arc<dyn Storage>>,
    ) -> Result<Scratch> {
        let mut state = self.state.lock().map_err(|_| crate::Error::Runtime {
            backend: "calico",
            call: "scratch pool".into(),
            message: "a thread panicked while holding the scratch lock".into(),
        })?;
        let big_enough = state
            .buffer
            .as_ref()
            .is_some_and(|b| b.size_bytes() >= bytes);
        if !big_enough {
            let size = bytes.div_ceil(GROWTH).max(1) * GROWTH;
            state.buffer = Some(alloc(size)?);
        }
        state.epoch = state.epoch.wrapping_add(1);
        if state.epoch == 0 {
            state.epoch = 1;
        }
        let storage = state.buffer.clone().expect("allocated above");
        Ok(Scratch {
            storage,
            epoch: state.epoch,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BackendKind, DeviceId};
    use std::any::Any;

    #[derive(Debug)]
    struct Fake(usize);
    impl Storage for Fake {
        fn device_id(&self) -> DeviceId {
            DeviceId {
                kind: BackendKind::Cpu,
                ordinal: 0,
            }
        }
        fn size_bytes(&self) -> usize {
            self.0
        }
        fn write_bytes(&self, _: usize, _: &[u8]) -> Result<()> {
            Ok(())
        }
        fn read_bytes(&self, _: usize, _: &mut [u8]) -> Result<()> {
            Ok(())
        }
        fn device_address(&self) -> Option<u64> {
            None
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    #[test]
    fn grows_only_when_needed_and_epochs_are_fresh() {
        let pool = ScratchPool::default();
        let mut allocations = 0;
        let mut alloc = |n: usize| -> Result<Arc<dyn Storage>> {
            allocations += 1;
            Ok(Arc::new(Fake(n)))
        };
        let a = pool.get(1000, &mut alloc).unwrap();
        assert_eq!(a.storage.size_bytes(), GROWTH);
        assert_eq!(a.epoch, 1);
        let b = pool.get(GROWTH, &mut alloc).unwrap();
        assert!(Arc::ptr_eq(&a.storage, &b.storage));
        assert_eq!(b.epoch, 2);
        let c = pool.get(GROWTH + 1, &mut alloc).unwrap();
        assert_eq!(c.storage.size_bytes(), 2 * GROWTH);
        assert!(!Arc::ptr_eq(&a.storage, &c.storage));
        assert_eq!(allocations, 2);
    }

    #[test]
    fn epoch_skips_zero_on_wrap() {
        let pool = ScratchPool::default();
        pool.state.lock().unwrap().epoch = u32::MAX;
        let s = pool.get(1, |n| Ok(Arc::new(Fake(n)))).unwrap();
        assert_eq!(s.epoch, 1);
    }

    #[test]
    fn allocation_errors_pass_through() {
        let pool = ScratchPool::default();
        let err = pool
            .get(1, |_| Err(crate::Error::unsupported("out of memory")))
            .unwrap_err();
        assert!(err.to_string().contains("out of memory"));
    }
}
