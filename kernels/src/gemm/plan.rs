//! What the GEMM router would run for a dense problem on a compile target, with no device
//! (for `calico bench --dry-run` and the router's tests), and `CALICO_GEMM_ROUTE_AS`, which
//! routes on the GPU at hand as another target would (e.g. sm_100a's path on an H100).

use super::{cdna, cdna_gemv, portable, route, tile, Epilogue, GemmKernel, GemmProblem, MatrixArg};
use calico_core::{Arch, DType, Error, KernelSource, KernelVariant, Result, Vendor};
use std::sync::OnceLock;

/// The architecture the router should see for a device of `arch`: `None` (the device's own)
/// unless `CALICO_GEMM_ROUTE_AS` names a target of the same vendor, whose matrix instructions
/// and async copies are then used with the device's own sizes. The kernels still compile for
/// the device's target and check their own requirements against it. Read once per process.
pub(crate) fn route_as(arch: &Arch) -> Option<Arch> {
    static TARGET: OnceLock<Option<Arch>> = OnceLock::new();
    let target = TARGET
        .get_or_init(|| {
            let name = std::env::var("CALICO_GEMM_ROUTE_AS").ok()?;
            Arch::for_target(name.trim())
        })
        .as_ref()?;
    (target.vendor == arch.vendor).then(|| Arch {
        compute_units: arch.compute_units,
        shared_mem_per_block: arch.shared_mem_per_block,
        l2_bytes: arch.l2_bytes,
        ..target.clone()
    })
}

/// The kernel `CALICO_GEMM_KERNEL` (`tile` or `portable`) asks the router to take wherever it
/// supports the problem (other problems route as usual): for timing the vendor-neutral
/// kernels against each other, e.g. in `calico bench`. Read once per process.
pub(crate) fn forced_kernel() -> Option<GemmKernel> {
    static KERNEL: OnceLock<Option<GemmKernel>> = OnceLock::new();
    *KERNEL.get_or_init(|| {
        let name = std::env::var("CALICO_GEMM_KERNEL").ok()?;
        match name.trim().to_ascii_lowercase().as_str() {
            "tile" => Some(GemmKernel::Tile),
            "portable" => Some(GemmKernel::Portable),
            _ => None,
        }
    })
}

/// The kernel a problem would take, and (for AMD targets) the source it would compile.
#[derive(Debug, Clone)]
pub struct GemmPlan {
    pub kernel: GemmKernel,
    /// The variant's source on AMD targets; `None` on NVIDIA (see `calico compile`).
    pub source: Option<KernelSource>,
}

/// The plan for `D[m, n] = A[m, k] @ B` on `target`, with A and D dense row-major, B a dense
/// N x K weight (`b_k_major`) or dense K x N rows, and 256-byte-aligned buffers.
pub fn plan_dense(
    target: &str,
    (m, n, k): (usize, usize, usize),
    in_dtype: DType,
    out_dtype: DType,
    b_k_major: bool,
) -> Result<GemmPlan> {
    let arch = Arch::for_target(target)
        .ok_or_else(|| Error::unsupported(format!("unknown target `{target}`")))?;
    let matrix =
        |ptr: u64, rows: usize, cols: usize, row_stride: usize, col_stride: usize| MatrixArg {
            ptr,
            rows,
            cols,
            row_stride,
            col_stride,
            batch_stride: rows * cols,
        };
    let b = if b_k_major {
        matrix(2 << 40, k, n, 1, k)
    } else {
        matrix(2 << 40, k, n, n, 1)
    };
    let p = GemmProblem {
        batch: 1,
        m,
        n,
        k,
        in_dtype,
        out_dtype,
        a: matrix(1 << 40, m, k, k, 1),
        b,
        c: None,
        d: matrix(3 << 40, m, n, n, 1),
        bias: None,
        alpha: 1.0,
        beta: 0.0,
        epilogue: Epilogue::None,
    };
    let kernel = route(&arch, &p)?;
    let source = match (arch.vendor, kernel) {
        (Vendor::Amd, GemmKernel::CdnaGemv) => {
            Some(cdna_gemv::planned(&p).source(calico_hip::hip_headers())?)
        }
        (Vendor::Amd, GemmKernel::Cdna) => {
            Some(cdna::Variant::for_problem(&p).source(calico_hip::hip_headers())?)
        }
        (Vendor::Amd, GemmKernel::Tile) => {
            Some(tile::Variant::for_problem(&arch, &p).source(calico_hip::hip_headers())?)
        }
        (Vendor::Amd, GemmKernel::Portable) => {
            Some(portable::Variant::for_problem(&arch, &p).source(calico_hip::hip_headers())?)
        }
        _ => None,
    };
    Ok(GemmPlan { kernel, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blackwell (sm_100) has no wgmma: its GEMMs take the mma.sync kernels (the GEMV for
    /// decode shapes), never the Hopper or skinny kernels, which need sm_90a.
    #[test]
    fn sm100_routes_to_the_mma_sync_kernels() {
        for target in ["sm_100", "sm_100a"] {
            for (shape, b_k_major, want) in [
                ((4096, 4096, 4096), true, GemmKernel::Sm80),
                ((4096, 4096, 4096), false, GemmKernel::Sm80),
                ((64, 4096, 4096), true, GemmKernel::Sm80),
                ((8, 4096, 4096), true, GemmKernel::Gemv),
                ((300, 200, 136), false, GemmKernel::Sm80),
                // K = 77: rows 154 bytes apart, which the 16-byte copies cannot take.
                ((257, 129, 77), true, GemmKernel::Tile),
            ] {
                let plan = plan_dense(target, shape, DType::BF16, DType::BF16, b_k_major).unwrap();
                assert_eq!(
                    plan.kernel, want,
                    "{target} {shape:?} b_k_major={b_k_major}"
                );
            }
        }
    }

    #[test]
    fn cdna_targets_plan_the_mfma_kernel_for_dense_bf16() {
        for target in ["gfx90a", "gfx942"] {
            for b_k_major in [true, false] {
                let plan = plan_dense(
                    target,
                    (4096, 4096, 4096),
                    DType::BF16,
                    DType::BF16,
                    b_k_major,
                )
                .unwrap();
                assert_eq!(plan.kernel, GemmKernel::Cdna, "{target}");
                assert_eq!(plan.source.unwrap().entry, "calico_gemm_cdna");
            }
        }
        // N = 100: K x N rows 200 bytes apart are not 16-byte aligned: the tile kernel.
        let odd = plan_dense("gfx942", (64, 100, 64), DType::BF16, DType::F32, false).unwrap();
        assert_eq!(odd.kernel, GemmKernel::Tile);
        assert_eq!(odd.source.unwrap().entry, "calico_gemm_tile");
        let hopper = plan_dense("sm_90a", (4096, 4096, 4096), DType::BF16, DType::BF16, true);
        assert_eq!(hopper.unwrap().kernel, GemmKernel::Hopper);
        assert!(plan_dense("tpu_v5", (1, 1, 1), DType::BF16, DType::BF16, true).is_err());
    }
}
