//! Calico: fast AI GPU kernels in Rust, on NVIDIA (CUDA), AMD (HIP) and the CPU, chosen at
//! run time from one build.
//!
//! ```no_run
//! use calico::{ops, Device, DType};
//! # fn main() -> calico::Result<()> {
//! let dev = Device::auto()?; // CUDA, else HIP, else the CPU
//! let x = dev.tensor(&vec![half::bf16::from_f32(1.0); 4 * 4096], &[4, 4096])?;
//! let w = dev.tensor(&vec![half::bf16::from_f32(1.0); 4096], &[4096])?;
//! let mut y = dev.zeros(&[4, 4096], DType::BF16)?;
//! ops::rms_norm(&dev, &x, &w, 1e-6, &mut y)?;
//! let host: Vec<half::bf16> = y.to_vec()?;
//! # Ok(()) }
//! ```

mod device;
use ops::check as ops_check;
pub mod catalog;
pub mod gemm;
mod gpu;
mod knobs;
pub mod ops;
pub mod tile_kernel;

pub use calico_core::{
    Arch, AsyncCopy, Backend, BackendKind, DType, DeviceId, Element, Error, Fp8Flavour, GpuBackend,
    KernelArg, KernelSource, LaunchConfig, Layout, MmaAtom, MmaKind, Result, Tensor, Vendor,
};
pub use device::{AsBackend, Device, Discovery};
pub use gemm::Epilogue;

/// The backend crates, for interop (wrapping cudarc buffers, raw pointers).
pub mod backends {
    pub use calico_cpu as cpu;
    pub use calico_cuda as cuda;
    pub use calico_hip as hip;
}

/// The README's example is compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;
