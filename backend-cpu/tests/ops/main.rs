//! The CPU ops against f64 references written independently here.

mod attention;
mod common;
mod device;
mod errors;
mod gemm;
mod norm;
mod rope;
mod softmax;
