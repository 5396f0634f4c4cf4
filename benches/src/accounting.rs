//! Bytes and FLOPs each case must move or compute: every input read once, every output written
//! once; GEMM counts 2·M·N·K.

use serde::{Deserialize, Serialize};

/// The memory-bound ops the suite times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemOp {
    RmsNorm,
    LayerNorm,
    AddRmsNorm,
    AddLayerNorm,
    Softmax,
    /// Half-split (GPT-NeoX) rope with f32 cos/sin tables.
    Rope,
}

impl MemOp {
    pub const ALL: [MemOp; 6] = [
        MemOp::RmsNorm,
        MemOp::LayerNorm,
        MemOp::AddRmsNorm,
        MemOp::AddLayerNorm,
        MemOp::Softmax,
        MemOp::Rope,
    ];

    pub fn name(self) -> &'static str {
        match self {
            MemOp::RmsNorm => "rms_norm",
            MemOp::LayerNorm => "layer_norm",
            MemOp::AddRmsNorm => "add_rms_norm",
            MemOp::AddLayerNorm => "add_layer_norm",
            MemOp::Softmax => "softmax",
            MemOp::Rope => "rope",
        }
    }

    pub fn from_name(name: &str) -> Option<MemOp> {
        MemOp::ALL.into_iter().find(|op| op.name() == name)
    }

    /// The share of the copy bandwidth docs/targets.md asks for on a GPU.
    pub fn target_fraction_of_copy(self) -> f64 {
        match self {
            MemOp::Softmax | MemOp::Rope => 0.85,
            _ => 0.90,
        }
    }

    /// The share asked for on `gpu` or, for the CPU backend, 70% for every row op.
    pub fn target_fraction_of_copy_on(self, gpu: bool) -> f64 {
        if gpu {
            self.target_fraction_of_copy()
        } else {
            CPU_TARGET_FRACTION_OF_COPY
        }
    }
}

/// The CPU backend's row ops against the copy bandwidth of the same run (docs/targets.md).
pub const CPU_TARGET_FRACTION_OF_COPY: f64 = 0.70;

/// Bytes one call must move. Norms and softmax take `[rows, cols]`; rope takes `[B, S, H, D]`
/// with f32 cos/sin tables of `[S, D/2]` each. `elem` is the size of x's dtype.
pub fn mem_bytes(op: MemOp, shape: &[usize], elem: usize) -> u64 {
    let numel: u64 = shape.iter().map(|&d| d as u64).product();
    let cols = shape.last().copied().unwrap_or(0) as u64;
    let e = elem as u64;
    match op {
        // x in, y out, weight.
        MemOp::RmsNorm => (2 * numel + cols) * e,
        // x in, y out, weight and bias.
        MemOp::LayerNorm => (2 * numel + 2 * cols) * e,
        // x and residual in, y and sum out, weight.
        MemOp::AddRmsNorm => (4 * numel + cols) * e,
        MemOp::AddLayerNorm => (4 * numel + 2 * cols) * e,
        MemOp::Softmax => 2 * numel * e,
        MemOp::Rope => {
            let s = shape.get(1).copied().unwrap_or(0) as u64;
            2 * numel * e + 2 * s * (cols / 2) * 4
        }
    }
}

/// FLOPs of an M x N x K matrix product.
pub fn gemm_flops(m: usize, n: usize, k: usize) -> f64 {
    2.0 * m as f64 * n as f64 * k as f64
}

/// GB/s (1e9 bytes per second) for `bytes` moved in `ms`.
pub fn gbps(bytes: u64, ms: f64) -> f64 {
    bytes as f64 / (ms * 1e-3) / 1e9
}

/// TFLOP/s for `flops` done in `ms`.
pub fn tflops(flops: f64, ms: f64) -> f64 {
    flops / (ms * 1e-3) / 1e12
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn norm_bytes() {
        // 65536 x 4096 bf16: x + y = 1 GiB, plus a 4096-element weight.
        let b = mem_bytes(MemOp::RmsNorm, &[65536, 4096], 2);
        assert_eq!(b, 2 * 65536 * 4096 * 2 + 4096 * 2);
        assert_eq!(mem_bytes(MemOp::LayerNorm, &[4, 8], 2), (2 * 32 + 16) * 2);
        assert_eq!(mem_bytes(MemOp::AddRmsNorm, &[4, 8], 2), (4 * 32 + 8) * 2);
        assert_eq!(
            mem_bytes(MemOp::AddLayerNorm, &[4, 8], 4),
            (4 * 32 + 16) * 4
        );
        assert_eq!(mem_bytes(MemOp::Softmax, &[4, 8], 2), 2 * 32 * 2);
    }

    #[test]
    fn rope_bytes_count_tables_once() {
        // [B=16, S=1024, H=32, D=128] bf16 in and out, two f32 tables of [1024, 64].
        let b = mem_bytes(MemOp::Rope, &[16, 1024, 32, 128], 2);
        let x = 16 * 1024 * 32 * 128 * 2;
        assert_eq!(b, 2 * x + 2 * 1024 * 64 * 4);
    }

    #[test]
    fn rates() {
        assert_eq!(gemm_flops(2, 3, 4), 48.0);
        assert!((gbps(2_000_000_000, 1000.0) - 2.0).abs() < 1e-12);
        assert!((tflops(2.0 * 4096f64.powi(3), 1.0) - 137.438953472).abs() < 1e-6);
    }

    #[test]
    fn names_round_trip() {
        for op in MemOp::ALL {
            assert_eq!(MemOp::from_name(op.name()), Some(op));
        }
        assert_eq!(MemOp::Rope.target_fraction_of_copy(), 0.85);
        assert_eq!(MemOp::AddLayerNorm.target_fraction_of_copy(), 0.90);
    }
}
