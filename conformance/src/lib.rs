//! Conformance of every Calico op against f64 references, on every backend present.
//!
//! The library half holds what the property tests in `tests/` share: backend discovery
//! ([`backends`]), random inputs ([`rng`]), tensors with poisoned outputs and strided views
//! ([`tensors`]), independent f64 references ([`reference`]) and per-dtype comparisons
//! ([`compare`]).

pub mod backends;
pub mod compare;
pub mod reference;
pub mod rng;
pub mod runner;
pub mod strategies;
pub mod tensors;

pub use backends::{backends, cases, for_each_backend, report_skipped};
pub use runner::{property, Ctx};
