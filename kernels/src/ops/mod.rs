//! The ops users call. Each validates its inputs (shapes, strides, dtypes, devices, aliasing;
//! a violation is an `Err`, never a panic), then runs the CPU implementation or launches the
//! kernel variant chosen for the device's architecture.

pub mod attention;
pub(crate) mod check;
pub(crate) mod norm;
pub mod plan;
pub(crate) mod rope;
pub(crate) mod softmax;

pub use crate::gemm::{gemm, matmul, GemmOptions};
pub use attention::{
    attention, attention_backward, attention_decode, attention_varlen, attention_varlen_backward,
    AttentionOptions, KvCache, MAX_DECODE_QUERIES,
};
pub use norm::{add_layer_norm, add_rms_norm, layer_norm, rms_norm};
pub use plan::{
    plan_attention, plan_attention_decode, plan_row_op, AttentionCase, DecodeCase, OpPlan,
    PlannedKernel, RowOp,
};
pub use rope::{rope, RopeMode};
pub use softmax::softmax;
