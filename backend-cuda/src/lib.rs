//! calico-cuda: Calico's CUDA backend.
//!
//! Built on cudarc with dynamic loading, so building needs no CUDA and one binary runs with or
//! without it. Kernels are compiled at run time with NVRTC straight to a cubin for the device's
//! own target (`sm_90a` on Hopper), cached on disk, loaded once per device and launched on the
//! device's stream.

mod device;
pub mod disasm;
mod error;
pub mod nvrtc;
pub mod probe;
mod storage;
pub mod tma;

/// The cudarc this backend is built on, for interop (`CudaDevice::wrap_slice`).
pub use cudarc;
pub use device::{CapturedGraph, CudaDevice};
pub use storage::CudaStorage;

use calico_core::HeaderSet;

/// The CUDA device headers (`calico/vendor.h` and the tile layer), embedded in the binary.
pub fn device_headers() -> HeaderSet {
    DEVICE_HEADERS
}

include!(concat!(env!("OUT_DIR"), "/device_headers.rs"));
