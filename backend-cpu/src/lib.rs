//! calico-cpu: Calico's CPU backend. Every op in portable Rust, parallel over rows with
//! rayon, computing in f32 as `docs/ops-spec.md` specifies; decode GEMMs streaming the weight
//! once (gemm_few_rows.rs), larger ones through the `gemm` crate.
//!
//! The op functions take tensors the `calico` crate has already validated; they still return
//! an `Err` (never panic) on a storage that is not a [`CpuStorage`], a layout that is not
//! rows, or shapes that do not fit.

mod attention;
mod attention_backward;
mod attention_decode;
mod bf16_pairs;
mod convert;
mod device;
mod gemm;
mod gemm_amx;
mod gemm_bf16_axpy;
mod gemm_bf16_dot;
mod gemm_few_rows;
mod key_blocks;
mod lanes;
mod math;
mod norm;
mod rope;
mod rows;
mod simd;
mod softmax;
mod storage;
mod stream;
mod views;

pub use attention::{attention_forward, AttentionParams, AttentionShape, SeqSpan};
pub use attention_backward::attention_backward;
pub use attention_decode::{attention_decode, DecodeCache, DecodeMask};
pub use calico_core::Epilogue;
pub use device::CpuDevice;
pub use gemm::gemm;
pub use norm::{layer_norm, rms_norm};
pub use rope::rope;
pub use simd::{limit_simd, SimdLimit};
pub use softmax::softmax;
pub use storage::CpuStorage;
