//! What the GEMM router would run for a dense problem on a compile target, with no device
//! (for `calico bench --dry-run` and the router's tests), and `CALICO_GEMM_ROUTE_AS`, which
//! routes on the GPU at hand as another target would (e.g. sm_100a's path on an H100).

use super::{
    cdna, cdna_gemv, hopper, portable, route, tile, Epilogue, GemmKernel, GemmProblem, MatrixArg,
};
use calico_core::{Arch, DType, Error, KernelSource, KernelVariant, Result, Vendor};
use std::sync::OnceLock;

/// The architecture the router should see for a device of `arch`: `None` (the device's own)
/// unless `CALICO_GEMM_ROUTE_AS` names a target of the same vendor ([`acting_as`]). The
/// kernels still compile for the device's target and check their own requirements against
/// it. Read once per process.
pub(crate) fn route_as(arch: &Arch) -> Option<Arch> {
    static TARGET: OnceLock<Option<Arch>> = OnceLock::new();
    let target = TARGET
        .get_or_init(|| {
            let name = std::env::var("CALICO_GEMM_ROUTE_AS").ok()?;
            Arch::for_target(name.trim())
        })
        .as_ref()?;
    acting_as(arch, target)
}

/// A device of `arch` routed as `target` (same vendor): the target's name, and the matrix
/// instructions and async copies both have (so an H100 acting as sm_100a loses wgmma, and an
/// A100 acting as sm_100a gains no TMA it cannot run), with the device's own sizes.
fn acting_as(arch: &Arch, target: &Arch) -> Option<Arch> {
    (target.vendor == arch.vendor).then(|| Arch {
        compute_units: arch.compute_units,
        shared_mem_per_block: arch.shared_mem_per_block,
        l2_bytes: arch.l2_bytes,
        mma: target
            .mma
            .iter()
            .filter(|m| arch.mma.contains(m))
            .cloned()
            .collect(),
        async_copies: target
            .async_copies
            .iter()
            .filter(|c| arch.async_copies.contains(c))
            .cloned()
            .collect(),
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
    /// K cut into this many pieces computed side by side and summed by a second kernel (the
    /// Hopper kernel on problems with few tiles and a long K); 1 otherwise.
    pub k_splits: usize,
    /// The Hopper launch cut in two at a wave boundary: `(true, r)` at row `r` of D, `(false,
    /// c)` at column `c` (`k_splits` is then the second launch's).
    pub wave_cut: Option<(bool, usize)>,
    /// The `k_splits` pieces are summed inside the Hopper kernel (no second kernel).
    pub split_fused: bool,
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
    let (ie, oe) = (in_dtype.size_bytes(), out_dtype.size_bytes());
    crate::ops::plan::operands_fit(&[(&[m, n], oe)])?;
    // K = 0 is a call (D from the epilogue alone); A and B then hold nothing.
    calico_core::layout::checked_bytes(&[m, k], ie)?;
    calico_core::layout::checked_bytes(&[k, n], ie)?;
    let p = dense_problem((m, n, k), in_dtype, out_dtype, b_k_major);
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
    let hopper = kernel == GemmKernel::Hopper;
    let k_splits = if hopper {
        hopper::k_splits(&arch, &p)
    } else {
        1
    };
    let wave_cut = hopper
        .then(|| hopper::planned_cut(&arch, &p))
        .flatten()
        .map(|cut| (cut.along_m, cut.at));
    let split_fused = hopper && hopper::uses_fused_split(&arch, &p);
    Ok(GemmPlan {
        kernel,
        source,
        k_splits,
        wave_cut,
        split_fused,
    })
}

/// The dense problem [`plan_dense`] routes (256-byte-aligned buffers, one batch).
fn dense_problem(
    (m, n, k): (usize, usize, usize),
    in_dtype: DType,
    out_dtype: DType,
    b_k_major: bool,
) -> GemmProblem {
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
    GemmProblem {
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blackwell (sm_100) has TMA but no wgmma: its GEMMs take the TMA + mma.sync kernel when
    /// TMA can read the operands (the GEMV for decode shapes), never the Hopper or skinny
    /// kernels, which are sm_90's.
    #[test]
    fn sm100_routes_to_the_mma_sync_kernels() {
        for target in ["sm_100", "sm_100a"] {
            for (shape, b_k_major, want) in [
                ((4096, 4096, 4096), true, GemmKernel::Sm80Tma),
                ((4096, 4096, 4096), false, GemmKernel::Sm80Tma),
                ((64, 4096, 4096), true, GemmKernel::Sm80Tma),
                ((8, 4096, 4096), true, GemmKernel::Gemv),
                ((300, 200, 136), false, GemmKernel::Sm80Tma),
                // N = 7 (K x N rows 14 bytes apart), K = 77 (rows 154 bytes apart): neither TMA
                // nor 16-byte copies can read them; the tile kernel takes any row stride.
                ((129, 7, 1000), false, GemmKernel::Tile),
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

    /// An H100 acting as sm_100a keeps TMA and mma.sync but loses wgmma, so the router takes
    /// Blackwell's path on it; acting as sm_80 it loses TMA too (the cp.async kernel), and an
    /// A100 acting as sm_100a gains no TMA.
    use calico_core::{AsyncCopy, MmaKind};

    #[test]
    fn acting_as_keeps_what_both_have() {
        let h100 = Arch::for_target("sm_90a").unwrap();
        let b200 = Arch::for_target("sm_100a").unwrap();
        let a100 = Arch::for_target("sm_80").unwrap();
        let p = |arch: &Arch| {
            let mut p = dense_problem((4096, 4096, 4096), DType::BF16, DType::BF16, true);
            p.batch = 1;
            route(arch, &p).unwrap()
        };
        let as_b200 = acting_as(&h100, &b200).unwrap();
        assert_eq!(as_b200.target, "sm_100a");
        assert_eq!(as_b200.compute_units, h100.compute_units);
        assert!(as_b200.has_async_copy(AsyncCopy::Tma));
        assert!(!as_b200.has_mma(MmaKind::Wgmma, DType::BF16));
        assert_eq!(p(&as_b200), GemmKernel::Sm80Tma);
        assert_eq!(p(&acting_as(&h100, &a100).unwrap()), GemmKernel::Sm80);
        let a100_as_b200 = acting_as(&a100, &b200).unwrap();
        assert!(!a100_as_b200.has_async_copy(AsyncCopy::Tma));
        assert_eq!(p(&a100_as_b200), GemmKernel::Sm80);
        assert!(acting_as(&h100, &Arch::for_target("gfx942").unwrap()).is_none());
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

    /// Few tiles and a long K: the Hopper kernel splits K so that about a wave of CTAs runs
    /// (129 x 2048 x 14336: 2 x 8 tiles of 128 x 256, 224 k-tiles); a full wave of tiles or a
    /// short K keeps one piece per tile.
    #[test]
    fn hopper_splits_k_when_tiles_leave_sms_idle() {
        let plan = |m, n, k, kmajor| {
            plan_dense("sm_90a", (m, n, k), DType::BF16, DType::BF16, kmajor).unwrap()
        };
        let few = plan(129, 2048, 14336, true);
        assert_eq!(few.kernel, GemmKernel::Hopper);
        assert!(few.k_splits >= 4, "{}", few.k_splits);
        let tiles = 129usize.div_ceil(128) * 2048usize.div_ceil(256);
        assert!(tiles * few.k_splits <= 132);
        // Every piece gets at least MIN_SPLIT_K_TILES k-tiles.
        assert!(14336 / 64 / few.k_splits >= 8);
        assert_eq!(plan(777, 1536, 11008, false).kernel, GemmKernel::Hopper);
        assert!(plan(777, 1536, 11008, false).k_splits >= 2);
        assert_eq!(plan(4096, 4096, 4096, true).k_splits, 1);
        assert_eq!(plan(256, 1024, 512, true).k_splits, 1);
    }
}
