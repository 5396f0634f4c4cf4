//! The suite's cases: which shapes run on which device class and profile.

pub mod copy;
pub mod decode;
pub mod decode_step;
pub mod gemm;
pub mod host_loop;
pub mod latency;
pub mod memory;

use crate::accounting::MemOp;
use crate::timing::Plan;
use serde::{Deserialize, Serialize};

/// How much of the suite to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Profile {
    /// Every shape of docs/targets.md (on a GPU), with at least 20 timed runs each.
    Full,
    /// One or two shapes per op, fewer runs.
    Quick,
    /// Toy shapes and three runs: for tests.
    Tiny,
}

impl Profile {
    pub fn name(self) -> &'static str {
        match self {
            Profile::Full => "full",
            Profile::Quick => "quick",
            Profile::Tiny => "tiny",
        }
    }
}

/// One memory-bound case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemSpec {
    pub op: MemOp,
    /// `[rows, cols]`, or `[B, S, H, D]` for rope.
    pub shape: Vec<usize>,
    /// Rows whose length is not a multiple of 8 elements ("softmax odd ...", target vs torch).
    pub odd: bool,
}

impl MemSpec {
    pub fn name(&self) -> String {
        let dims: Vec<String> = self.shape.iter().map(usize::to_string).collect();
        let odd = if self.odd { " odd" } else { "" };
        format!("{}{odd} bf16 {}", self.op.name(), dims.join("x"))
    }
}

/// One GEMM case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GemmSpec {
    pub group: &'static str,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

impl GemmSpec {
    pub fn name(&self) -> String {
        if self.group == "gemv" {
            format!("gemv {}x{}x{}", self.m, self.n, self.k)
        } else {
            format!("gemm {} {}x{}x{}", self.group, self.m, self.n, self.k)
        }
    }

    /// For an odd shape (group "odd"), the nearest shape with every dimension a multiple of
    /// 8, whose Calico speed the case is compared with.
    pub fn aligned(&self) -> Option<(usize, usize, usize)> {
        let near = |x: usize| ((x + 4) / 8 * 8).max(8);
        (self.group == "odd").then(|| (near(self.m), near(self.n), near(self.k)))
    }
}

/// Decode GEMV: M = 1, 4, 16 against the Llama-style weights (docs/targets.md: >= 80% of copy).
fn gemv_specs(ms: &[usize]) -> Vec<GemmSpec> {
    let mut out = Vec::new();
    for &(n, k) in &[(4096, 4096), (14336, 4096), (4096, 14336)] {
        for &m in ms {
            out.push(GemmSpec {
                group: "gemv",
                m,
                n,
                k,
            });
        }
    }
    out
}

/// GEMMs with K, N or a row stride not a multiple of 8 elements.
fn odd_specs(full: bool) -> Vec<GemmSpec> {
    let shapes: &[(usize, usize, usize)] = if full {
        &[
            (4097, 4097, 4097),
            (8191, 8191, 8191),
            (4096, 4096, 4095),
            (1000, 999, 1000),
        ]
    } else {
        &[(4097, 4097, 4097)]
    };
    shapes
        .iter()
        .map(|&(m, n, k)| GemmSpec {
            group: "odd",
            m,
            n,
            k,
        })
        .collect()
}

const NORMS: [MemOp; 4] = [
    MemOp::RmsNorm,
    MemOp::LayerNorm,
    MemOp::AddRmsNorm,
    MemOp::AddLayerNorm,
];

/// The memory-bound cases for a GPU (`gpu`) or the CPU.
pub fn memory_specs(gpu: bool, profile: Profile) -> Vec<MemSpec> {
    let (rows, norm_cols, softmax_cols, rope): (usize, &[usize], &[usize], [usize; 4]) =
        match (gpu, profile) {
            (true, Profile::Full) => (
                65536,
                &[1024, 2048, 4096, 8192],
                &[4096, 1024],
                [16, 1024, 32, 128],
            ),
            (true, Profile::Quick) => (65536, &[4096], &[4096], [16, 1024, 32, 128]),
            (false, Profile::Full) => (4096, &[1024, 4096], &[4096, 1024], [1, 512, 32, 128]),
            (false, Profile::Quick) => (4096, &[1024], &[1024], [1, 128, 32, 128]),
            (_, Profile::Tiny) => (64, &[256], &[256], [1, 8, 4, 64]),
        };
    let mut out = Vec::new();
    for op in NORMS {
        for &cols in norm_cols {
            out.push(MemSpec {
                op,
                shape: vec![rows, cols],
                odd: false,
            });
        }
    }
    for &cols in softmax_cols {
        out.push(MemSpec {
            op: MemOp::Softmax,
            shape: vec![rows, cols],
            odd: false,
        });
    }
    out.push(MemSpec {
        op: MemOp::Rope,
        shape: rope.to_vec(),
        odd: false,
    });
    // Odd row lengths (no 16-byte aligned rows), against torch.
    if gpu && profile != Profile::Tiny {
        for op in [MemOp::Softmax, MemOp::RmsNorm] {
            out.push(MemSpec {
                op,
                shape: vec![4097, 4097],
                odd: true,
            });
        }
    }
    out
}

/// The GEMM cases for a GPU or the CPU.
pub fn gemm_specs(gpu: bool, profile: Profile) -> Vec<GemmSpec> {
    let sq = |s| GemmSpec {
        group: "square",
        m: s,
        n: s,
        k: s,
    };
    let llm = |n, k| GemmSpec {
        group: "llm",
        m: 8192,
        n,
        k,
    };
    let skinny = |m| GemmSpec {
        group: "skinny",
        m,
        n: 4096,
        k: 4096,
    };
    match (gpu, profile) {
        (true, Profile::Full) => [
            sq(2048),
            sq(4096),
            sq(8192),
            llm(4096, 4096),
            llm(14336, 4096),
            llm(4096, 14336),
            llm(28672, 4096),
            skinny(16),
            skinny(64),
            skinny(256),
            // Decode through a narrow projection (GQA keys/values: 8 heads x 128): too few
            // column tiles to fill the SMs without splitting K.
            GemmSpec {
                n: 1024,
                ..skinny(64)
            },
        ]
        .into_iter()
        .chain(gemv_specs(&[1, 4, 16]))
        .chain(odd_specs(true))
        .collect(),
        (true, Profile::Quick) => [sq(4096), llm(14336, 4096), skinny(64)]
            .into_iter()
            .chain(gemv_specs(&[16]))
            .chain(odd_specs(false))
            .collect(),
        // Decode GEMVs too: the CPU backend's few-rows path streams the weight once.
        (false, Profile::Full) => [sq(256), sq(512)]
            .into_iter()
            .chain(gemv_specs(&[1, 16]))
            .collect(),
        (false, Profile::Quick) => vec![sq(256)],
        (_, Profile::Tiny) => vec![sq(64)],
    }
}

/// Runs per case.
pub fn plan(gpu: bool, profile: Profile) -> Plan {
    match (gpu, profile) {
        (_, Profile::Tiny) => Plan::TINY,
        (true, Profile::Full) => Plan::GPU,
        (true, Profile::Quick) => Plan::GPU_QUICK,
        (false, Profile::Full) => Plan::CPU,
        (false, Profile::Quick) => Plan::CPU_QUICK,
    }
}

/// Size of the buffer whose copy measures the bandwidth.
pub fn copy_buffer_bytes(gpu: bool, profile: Profile) -> usize {
    match (gpu, profile) {
        (_, Profile::Tiny) => 1 << 20,
        (true, _) => 1 << 30,
        (false, _) => 256 << 20,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_gpu_suite_has_every_targets_shape() {
        let mem = memory_specs(true, Profile::Full);
        assert_eq!(mem.len(), 4 * 4 + 2 + 1 + 2);
        assert!(mem.iter().any(|m| m.name() == "softmax odd bf16 4097x4097"));
        assert!(mem
            .iter()
            .any(|m| m.name() == "rms_norm odd bf16 4097x4097"));
        assert!(mem
            .iter()
            .any(|m| m.name() == "add_layer_norm bf16 65536x8192"));
        assert!(mem.iter().any(|m| m.name() == "rope bf16 16x1024x32x128"));
        let g = gemm_specs(true, Profile::Full);
        assert_eq!(g.len(), 11 + 9 + 4);
        assert!(g.iter().any(|g| g.name() == "gemv 1x14336x4096"));
        let odd = g
            .iter()
            .find(|g| g.name() == "gemm odd 1000x999x1000")
            .expect("odd case");
        assert_eq!(odd.aligned(), Some((1000, 1000, 1000)));
        let odd = g.iter().find(|g| g.name() == "gemm odd 8191x8191x8191");
        assert_eq!(odd.and_then(GemmSpec::aligned), Some((8192, 8192, 8192)));
        assert!(g.iter().any(|g| g.name() == "gemm llm 8192x28672x4096"));
        assert!(g.iter().any(|g| g.name() == "gemm skinny 16x4096x4096"));
        assert!(g.iter().any(|g| g.name() == "gemm skinny 64x1024x4096"));
    }

    #[test]
    fn cpu_suite_is_small() {
        for p in [Profile::Full, Profile::Quick, Profile::Tiny] {
            for m in memory_specs(false, p) {
                assert!(
                    m.shape.iter().product::<usize>() <= 16 << 20,
                    "{}",
                    m.name()
                );
            }
            for g in gemm_specs(false, p) {
                assert!(g.m <= 512);
            }
        }
    }
}
