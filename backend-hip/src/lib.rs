//! calico-hip: Calico's backend for AMD GPUs.
//!
//! The HIP runtime (libamdhip64) and hipRTC are opened at run time with libloading, so the
//! crate builds and runs on machines without ROCm; [`HipDevice::new`] then returns
//! `Error::BackendUnavailable` naming what was searched. Layers, innermost first:
//! [`sys`] (hand-written declarations), `result` (status codes to errors), `loader`,
//! `context`/`storage`/`timing`/`launch`/`graph` (safe wrappers), [`HipDevice`] (the traits
//! and the stream, graph-capture and loaded-kernel accessors that mirror `CudaDevice`'s).
//! [`compile_offline`] and [`disassemble`] need only Debian's clang-19 and llvm-19.

mod compile;
mod context;
mod device;
mod graph;
mod headers;
mod launch;
mod loader;
mod offline;
mod resources;
mod result;
mod storage;
mod stream;
pub mod sys;
mod timing;

pub use compile::{compile_hiprtc, hiprtc_version};
pub use device::{device_count, DeviceInfo, HipDevice};
pub use graph::CapturedHipGraph;
pub use headers::hip_headers;
pub use offline::{clang_path, compile_offline, disassemble, objdump_path, require_clang};
pub use resources::{parse_metadata, read_resources, readelf_path, KernelResources};
pub use storage::HipStorage;
pub use stream::OwnedStream;
