//! Conformance of every Calico op against f64 references, on every backend present.
//!
//! The library half holds what the property tests in `tests/` share: backend discovery
//! ([`backends`]), random inputs ([`rng`]), tensors with poisoned outputs and strided views
//! ([`tensors`]), independent f64 references ([`reference`]) and per-dtype comparisons
//! ([`compare`]).
//!
//! `cargo test -p calico-conformance` runs every property on every backend that opens (CUDA,
//! HIP, the CPU) and names the ones it skipped. `CALICO_CONFORMANCE_CASES=500` raises the
//! number of random cases per property (default 12 to 32, sized for a debug build on two
//! cores). An `Err` from any op, `Unsupported` included, fails the test on that backend.

pub mod backends;
pub mod compare;
pub mod reference;
pub mod rng;
pub mod runner;
pub mod strategies;
pub mod tensors;

pub use backends::{backends, cases, gpu_backends, report_skipped, shape_stride};
pub use runner::{property, Ctx};
