//! Kernel variants: the small typed values that identify a compiled kernel on the hot path.
//!
//! An op describes the compiled form it needs (dtypes, tile sizes, flags) as a plain value
//! that implements [`KernelVariant`]. A backend looks the loaded kernel up by that value in a
//! [`VariantCache`]: hashing a few integers and comparing them, with no source text, no
//! formatting and no allocation. Only on a miss does it call [`KernelVariant::source`] to build
//! the text, compile it (through the disk cache) and load it.

use crate::{HeaderSet, KernelSource, Result};
use rustc_hash::FxHashMap;
use std::any::{Any, TypeId};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

/// One compiled form of a kernel, as a small value. Two equal values must build the same
/// source for the same vendor headers.
pub trait KernelVariant: fmt::Debug + Clone + Hash + Eq + Send + Sync + 'static {
    /// The device source of this variant; called only when the backend has not loaded it yet.
    fn source(&self, vendor: HeaderSet) -> Result<KernelSource>;
}

/// The object-safe face of a [`KernelVariant`], so backends can take any op's variant
/// through `&dyn` (implemented for every `KernelVariant`; there is no need to implement it).
pub trait DynVariant: fmt::Debug + Send + Sync {
    /// A hash of the variant's type and value.
    fn key_hash(&self) -> u64;
    /// True when `other` is a variant of the same type and value.
    fn key_eq(&self, other: &dyn DynVariant) -> bool;
    /// The variant as `Any`, for [`DynVariant::key_eq`].
    fn as_any(&self) -> &dyn Any;
    /// An owned copy, kept as the cache's key (made once per miss).
    fn clone_boxed(&self) -> Box<dyn DynVariant>;
    /// [`KernelVariant::source`].
    fn build_source(&self, vendor: HeaderSet) -> Result<KernelSource>;
}

impl<V: KernelVariant> DynVariant for V {
    fn key_hash(&self) -> u64 {
        // FxHash: every launch hashes its variant once, and SipHash cost several times as much
        // for these few fields; the keys are the library's own values, never hostile input.
        let mut h = rustc_hash::FxHasher::default();
        TypeId::of::<V>().hash(&mut h);
        self.hash(&mut h);
        h.finish()
    }
    fn key_eq(&self, other: &dyn DynVariant) -> bool {
        other.as_any().downcast_ref::<V>() == Some(self)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn clone_boxed(&self) -> Box<dyn DynVariant> {
        Box::new(self.clone())
    }
    fn build_source(&self, vendor: HeaderSet) -> Result<KernelSource> {
        self.source(vendor)
    }
}

/// Every variant stored under one hash (almost always one), with its value.
type Bucket<K> = Vec<(Box<dyn DynVariant>, K)>;

/// A map from kernel variants to what a backend loaded for them (a function handle).
pub struct VariantCache<K> {
    /// Buckets by hash.
    map: Mutex<FxHashMap<u64, Bucket<K>>>,
}

impl<K> Default for VariantCache<K> {
    fn default() -> Self {
        VariantCache {
            map: Mutex::new(FxHashMap::default()),
        }
    }
}

impl<K> fmt::Debug for VariantCache<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self
            .map
            .lock()
            .map(|m| m.values().map(Vec::len).sum::<usize>())
            .unwrap_or(0);
        write!(f, "VariantCache({n} kernels)")
    }
}

impl<K: Clone> VariantCache<K> {
    /// The value loaded for `variant`, if any. Allocates nothing.
    pub fn get(&self, variant: &dyn DynVariant) -> Option<K> {
        let hash = variant.key_hash();
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&hash)?
            .iter()
            .find(|(k, _)| k.key_eq(variant))
            .map(|(_, v)| v.clone())
    }

    /// Stores `value` for `variant` unless another thread stored one first; returns the one
    /// kept.
    pub fn insert(&self, variant: &dyn DynVariant, value: K) -> K {
        let hash = variant.key_hash();
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let bucket = map.entry(hash).or_default();
        if let Some((_, existing)) = bucket.iter().find(|(k, _)| k.key_eq(variant)) {
            return existing.clone();
        }
        bucket.push((variant.clone_boxed(), value.clone()));
        value
    }

    /// Every value stored (for unloading modules when a device is dropped).
    pub fn values(&self) -> Vec<K> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.values()
            .flat_map(|b| b.iter().map(|(_, v)| v.clone()))
            .collect()
    }

    /// Number of variants stored.
    pub fn len(&self) -> usize {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.values().map(Vec::len).sum()
    }

    /// True when nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Eq, Hash)]
    struct A {
        tile: u32,
    }
    #[derive(Debug, Clone, PartialEq, Eq, Hash)]
    struct B {
        tile: u32,
    }

    impl KernelVariant for A {
        fn source(&self, _: HeaderSet) -> Result<KernelSource> {
            KernelSource::assemble("a", "x", &[], &[("T", self.tile.to_string())])
        }
    }
    impl KernelVariant for B {
        fn source(&self, _: HeaderSet) -> Result<KernelSource> {
            KernelSource::assemble("b", "x", &[], &[("T", self.tile.to_string())])
        }
    }

    #[test]
    fn variants_are_found_by_type_and_value() {
        let cache = VariantCache::<u32>::default();
        assert_eq!(cache.get(&A { tile: 1 }), None);
        assert_eq!(cache.insert(&A { tile: 1 }, 10), 10);
        assert_eq!(cache.insert(&A { tile: 1 }, 11), 10, "first insert wins");
        cache.insert(&A { tile: 2 }, 20);
        // Same field values, another type: a different kernel.
        cache.insert(&B { tile: 1 }, 30);
        assert_eq!(cache.get(&A { tile: 1 }), Some(10));
        assert_eq!(cache.get(&A { tile: 2 }), Some(20));
        assert_eq!(cache.get(&B { tile: 1 }), Some(30));
        assert_eq!(cache.get(&B { tile: 2 }), None);
        assert_eq!(cache.len(), 3);
        let mut all = cache.values();
        all.sort();
        assert_eq!(all, vec![10, 20, 30]);
    }

    #[test]
    fn equal_variants_build_equal_sources() {
        let a: &dyn DynVariant = &A { tile: 3 };
        let s1 = a.build_source(&[]).unwrap();
        let s2 = A { tile: 3 }.source(&[]).unwrap();
        assert_eq!(s1, s2);
    }
}
