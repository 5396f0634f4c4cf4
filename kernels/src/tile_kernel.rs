//! Your own tile kernels: device code written against Calico's shared tile vocabulary
//! (`#include "calico/tiles.h"`), compiled at run time for whichever GPU is present (NVRTC on
//! NVIDIA, hipRTC on AMD, through the same disk cache as Calico's kernels) and launched from
//! Rust. docs/tile-kernels.md builds one step by step; kernels/examples/tile_softmax.rs runs one.
//!
//! ```no_run
//! use calico::tile_kernel::TileKernel;
//! use calico::{Device, KernelArg, LaunchConfig};
//! # fn main() -> calico::Result<()> {
//! const SOURCE: &str = "#include \"calico/tiles.h\"\n\
//!     CALICO_KERNEL void twice(float* p) { p[calico::thread_x()] *= 2.0f; }\n";
//! let dev = Device::auto()?;
//! let x = dev.tensor(&[1.0f32; 64], &[64])?;
//! let kernel = TileKernel::new("twice", SOURCE);
//! let ptr = x.device_ptr().expect("a GPU tensor");
//! kernel.launch(&dev, &LaunchConfig::linear(1, 64, 0), &[KernelArg::Ptr(ptr)])?;
//! # Ok(()) }
//! ```

use crate::{catalog, Device};
use calico_core::{Error, HeaderSet, KernelArg, KernelSource, KernelVariant, LaunchConfig, Result};
use std::hash::{Hash, Hasher};

/// A kernel of yours: its `extern "C"` entry point, its source text (usually from
/// `include_str!`) and `#define`s put in front of it. `#include "calico/..."` lines are
/// resolved from Calico's embedded headers for the device's vendor.
///
/// It is also the kernel's cache key: the loaded module is found by the entry, the source's
/// address and length, and the defines, so a launch after the first builds no text and
/// compiles nothing.
#[derive(Debug, Clone)]
pub struct TileKernel {
    entry: &'static str,
    source: &'static str,
    defines: Vec<(&'static str, String)>,
}

impl TileKernel {
    pub fn new(entry: &'static str, source: &'static str) -> TileKernel {
        TileKernel {
            entry,
            source,
            defines: Vec::new(),
        }
    }

    /// Adds `#define name value` in front of the source (a new kernel variant per value).
    pub fn define(mut self, name: &'static str, value: impl ToString) -> TileKernel {
        self.defines.push((name, value.to_string()));
        self
    }

    /// The complete source for a vendor's headers (e.g. `calico::backends::hip::hip_headers()`).
    pub fn source_for(&self, vendor: HeaderSet) -> Result<KernelSource> {
        let defines: Vec<(&str, String)> =
            self.defines.iter().map(|(n, v)| (*n, v.clone())).collect();
        KernelSource::assemble(
            self.entry,
            self.source,
            &[vendor, calico_core::device_headers()],
            &defines,
        )
    }

    /// Compiles for a named target without a device (`sm_80`, `sm_90a`, `gfx90a`, `gfx942`,
    /// ...: NVRTC for NVIDIA, clang-19 for AMD), returning the binary; for CI checks.
    pub fn compile_for(&self, target: &str) -> Result<Vec<u8>> {
        let arch = calico_core::Arch::for_target(target)
            .ok_or_else(|| Error::unsupported(format!("unknown target `{target}`")))?;
        let vendor = match arch.vendor {
            calico_core::Vendor::Amd => calico_hip::hip_headers(),
            _ => calico_cuda::device_headers(),
        };
        catalog::compile(target, &self.source_for(vendor)?)
    }

    /// Launches on `dev` (a GPU) with `args` in the kernel's parameter order. The first launch
    /// on a device compiles (or fetches from the disk cache) and loads the kernel; it neither
    /// synchronises nor allocates device memory.
    pub fn launch(&self, dev: &Device, config: &LaunchConfig, args: &[KernelArg]) -> Result<()> {
        let gpu = dev.as_gpu().ok_or_else(|| {
            Error::unsupported("tile kernels run on a GPU; this device is the CPU")
        })?;
        gpu.launch_variant(self, config, args)
    }
}

impl PartialEq for TileKernel {
    fn eq(&self, other: &TileKernel) -> bool {
        self.entry == other.entry
            && std::ptr::eq(self.source, other.source)
            && self.defines == other.defines
    }
}

impl Eq for TileKernel {}

impl Hash for TileKernel {
    // The source by address, not by content: no hashing of text per launch.
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.entry.hash(state);
        (self.source.as_ptr() as usize).hash(state);
        self.source.len().hash(state);
        self.defines.hash(state);
    }
}

impl KernelVariant for TileKernel {
    fn source(&self, vendor: HeaderSet) -> Result<KernelSource> {
        self.source_for(vendor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str = "#include \"calico/tiles.h\"\nCALICO_KERNEL void k(float* p) { p[0] = N; }\n";

    #[test]
    fn defines_come_first_and_name_the_variant() {
        let a = TileKernel::new("k", SRC).define("N", 1);
        let b = TileKernel::new("k", SRC).define("N", 2);
        assert_ne!(a, b);
        assert_eq!(a, TileKernel::new("k", SRC).define("N", 1));
        let text = a.source_for(calico_hip::hip_headers()).unwrap().text;
        assert!(text.starts_with("#define N 1\n"), "{text}");
        assert!(
            text.contains("// ---- calico/hip_tile.h"),
            "the vendor's tiles are included"
        );
    }

    #[test]
    fn the_cpu_is_refused_with_a_clear_error() {
        let err = TileKernel::new("k", SRC)
            .launch(&Device::cpu(), &LaunchConfig::linear(1, 1, 0), &[])
            .unwrap_err();
        assert!(err.to_string().contains("GPU"), "{err}");
    }
}
