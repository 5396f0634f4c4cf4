//! The sm_80 GEMM with a TMA producer (`kernels/device/gemm/sm80.cu` built with
//! `CALICO_GEMM_TMA=1`): thread 0 issues TMA loads of 128 x 64 tiles of A and B into a ring
//! of shared-memory stages (full/empty mbarriers), and the eight warps run the cp.async
//! kernel's ldmatrix + mma.sync loop and epilogue on them. It is the GEMM of NVIDIA GPUs with
//! TMA but no wgmma (sm_100 until a tcgen05 kernel exists); Hopper keeps its wgmma kernel, and
//! runs this one only when the router is told to choose as sm_100 would
//! (`CALICO_GEMM_ROUTE_AS=sm_100a`), which is how it is tested on an H100.

use super::hopper::{self, operand_map};
use super::sm80::{self, Variant, BM, BN, MAX_GRID_YZ, TMA_BK};
use super::GemmProblem;
use crate::catalog::CatalogEntry;
use calico_core::{
    Arch, AsyncCopy, DType, Epilogue, Error, GpuBackend, HeaderSet, KernelArg, KernelVariant,
    LaunchConfig, MmaKind, Result, Vendor,
};

/// Three 32 KiB stages keep two CTAs (16 warps) on an SM with 228 KiB of shared memory,
/// as the cp.async kernel's four 16 KiB stages do; two is the least the ring works with.
const STAGES: usize = 3;
const MIN_STAGES: usize = 2;
/// Columns of an N-major B box: one 128-byte swizzled row.
const N_CHUNK: usize = 64;
/// TMA coordinates and the kernel's batch index are 32-bit.
const MAX_EXTENT: usize = i32::MAX as usize;

/// True when the device can run the kernel at all: NVIDIA with mma.sync for `dtype` and TMA.
fn runs_on(arch: &Arch, dtype: DType) -> bool {
    arch.vendor == Vendor::Nvidia
        && arch.has_mma(MmaKind::MmaSync, dtype)
        && arch.has_async_copy(AsyncCopy::Tma)
}

/// The deepest ring (up to [`STAGES`]) that fits the device's shared memory.
fn stages(arch: &Arch) -> Option<usize> {
    (MIN_STAGES..=STAGES).rev().find(|&s| {
        let v = Variant {
            stages: s,
            ..catalog_variant(DType::BF16, DType::BF16, true)
        };
        v.smem_bytes() as usize <= arch.shared_mem_per_block
    })
}

/// True when TMA can read both operands and the kernel can take `p`: 16-bit inputs, A with K
/// contiguous, B with K or N contiguous, base pointers 16-byte aligned, row and batch strides
/// multiples of 16 bytes (the Hopper kernel's TMA conditions), sizes within 32-bit
/// coordinates, K > 0 and the grid within the launch limits. C and D take any strides.
fn problem_fits(p: &GemmProblem) -> bool {
    let dtypes = matches!(p.in_dtype, DType::BF16 | DType::F16)
        && matches!(p.out_dtype, DType::BF16 | DType::F16 | DType::F32);
    let sizes =
        p.m <= MAX_EXTENT && p.n <= MAX_EXTENT && p.k <= MAX_EXTENT && p.batch <= MAX_EXTENT;
    let aligned = p.a.ptr.is_multiple_of(16) && p.b.ptr.is_multiple_of(16);
    let grid = p.m.div_ceil(BM) <= MAX_GRID_YZ;
    dtypes && sizes && aligned && grid && hopper::a_fits(p) && hopper::b_k_major(p).is_some()
}

/// True when the router should send `p` here on `arch`: a GPU with TMA and mma.sync but no
/// wgmma (sm_100), and operands TMA can read.
pub(crate) fn supports(arch: &Arch, p: &GemmProblem) -> bool {
    !arch.has_mma(MmaKind::Wgmma, p.in_dtype) && can_run(arch, p)
}

/// True when the kernel can run `p` on `arch` at all (TMA, mma.sync, the ring fits, operands
/// TMA can read), whether or not the router would choose it: for `gemm_with_kernel`.
pub(crate) fn can_run(arch: &Arch, p: &GemmProblem) -> bool {
    runs_on(arch, p.in_dtype) && stages(arch).is_some() && problem_fits(p)
}

fn catalog_variant(in_dtype: DType, out_dtype: DType, b_kmajor: bool) -> Variant {
    Variant {
        in_dtype,
        out_dtype,
        b_kmajor,
        stages: STAGES,
        epilogue: Epilogue::None,
        has_c: false,
        has_bias: false,
        tma: true,
    }
}

/// Launches the kernel for `p` on a device that has TMA and mma.sync (an H100 too: the
/// routing choice is [`supports`], made for the target the router was told to act as).
pub(crate) fn launch(gpu: &dyn GpuBackend, p: &GemmProblem) -> Result<()> {
    let arch = gpu.arch();
    let stages = stages(arch).filter(|_| runs_on(arch, p.in_dtype) && problem_fits(p));
    let b_kmajor = hopper::b_k_major(p);
    let (Some(stages), Some(b_kmajor)) = (stages, b_kmajor) else {
        return Err(Error::unsupported(format!(
            "the TMA + mma.sync GEMM does not support this problem on {} (layout, alignment or device)",
            arch.target
        )));
    };
    let (map_a, _) = operand_map(
        &p.a,
        p.in_dtype,
        p.k,
        p.m,
        p.a.row_stride,
        p.batch,
        TMA_BK,
        BM,
    )?;
    let (map_b, _) = if b_kmajor {
        operand_map(
            &p.b,
            p.in_dtype,
            p.k,
            p.n,
            p.b.col_stride,
            p.batch,
            TMA_BK,
            BN,
        )?
    } else {
        operand_map(
            &p.b,
            p.in_dtype,
            p.n,
            p.k,
            p.b.row_stride,
            p.batch,
            N_CHUNK,
            TMA_BK,
        )?
    };
    let v = Variant {
        in_dtype: p.in_dtype,
        out_dtype: p.out_dtype,
        b_kmajor,
        stages,
        epilogue: p.epilogue,
        has_c: p.c.is_some() && p.beta != 0.0,
        has_bias: p.bias.is_some(),
        tma: true,
    };
    let config = LaunchConfig {
        grid: (
            p.n.div_ceil(BN).max(1) as u32,
            p.m.div_ceil(BM).max(1) as u32,
            p.batch.clamp(1, MAX_GRID_YZ) as u32,
        ),
        block: (v.threads(), 1, 1),
        shared_mem_bytes: v.smem_bytes(),
    };
    // The kernel reads a_bs / b_bs only as "has a batch dimension", as the maps were built.
    let params = sm80::params(p, v.has_c, config.grid.2)?;
    let args = [
        KernelArg::Opaque128(map_a),
        KernelArg::Opaque128(map_b),
        params.arg(),
    ];
    gpu.launch_variant(&v, &config, &args)
}

/// Representative variants, for `calico compile` and the offline compile checks (sm_90a and
/// sm_100a: targets with TMA).
pub(crate) fn catalog(arch: &Arch, vendor: HeaderSet) -> Result<Vec<CatalogEntry>> {
    if !runs_on(arch, DType::BF16) {
        return Ok(Vec::new());
    }
    let cases = [
        (DType::BF16, DType::BF16, true, Epilogue::None, false, false),
        (
            DType::BF16,
            DType::BF16,
            false,
            Epilogue::None,
            false,
            false,
        ),
        (DType::F16, DType::F32, true, Epilogue::Gelu, true, true),
        (DType::F16, DType::F16, false, Epilogue::Silu, false, true),
    ];
    let mut out = Vec::new();
    for (in_dtype, out_dtype, b_kmajor, epilogue, has_c, has_bias) in cases {
        let v = Variant {
            epilogue,
            has_c,
            has_bias,
            ..catalog_variant(in_dtype, out_dtype, b_kmajor)
        };
        out.push(CatalogEntry {
            op: "gemm",
            label: format!(
                "sm80-tma {in_dtype}->{out_dtype} b_kmajor={b_kmajor} {epilogue:?} c={has_c} bias={has_bias}"
            ),
            source: v.source(vendor)?,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::portable::tests::problem;

    fn b200() -> Arch {
        Arch::for_target("sm_100a").unwrap()
    }

    #[test]
    fn blackwell_takes_tma_readable_problems_and_hopper_does_not() {
        let p = problem(4096, 4096, 4096, true);
        assert!(supports(&b200(), &p));
        assert!(supports(&Arch::for_target("sm_100").unwrap(), &p));
        assert!(supports(&b200(), &problem(7, 129, 1000, true)));
        assert!(!supports(&b200(), &problem(64, 64, 0, true)));
        // Hopper keeps its wgmma kernel; sm_80 has no TMA.
        assert!(!supports(&Arch::for_target("sm_90a").unwrap(), &p));
        assert!(!supports(&Arch::for_target("sm_80").unwrap(), &p));
        assert!(runs_on(&Arch::for_target("sm_90a").unwrap(), DType::BF16));
        assert!(!supports(&Arch::for_target("gfx942").unwrap(), &p));
    }

    #[test]
    fn strides_tma_cannot_read_are_declined() {
        let mut p = problem(100, 100, 100, true);
        p.a.row_stride = 100; // 200 bytes between rows: not a multiple of 16
        assert!(!supports(&b200(), &p));
        let mut p = problem(64, 64, 64, false);
        p.b.ptr += 2;
        assert!(!supports(&b200(), &p));
        let mut p = problem(64, 64, 64, false);
        p.a.row_stride = 1;
        p.a.col_stride = 64; // M contiguous
        assert!(!supports(&b200(), &p));
        let mut p = problem(64, 64, 64, true);
        p.batch = 2;
        p.a.batch_stride = 4;
        assert!(!supports(&b200(), &p));
    }

    #[test]
    fn three_stages_keep_two_ctas_per_sm() {
        assert_eq!(stages(&b200()), Some(3));
        let v = catalog_variant(DType::BF16, DType::BF16, true);
        assert_eq!(v.smem_bytes(), 1024 + 3 * (32_768 + 16));
        assert!(2 * (v.smem_bytes() as usize + 1024) <= 228 * 1024);
        assert_eq!(v.threads(), 256);
        // A device with less shared memory per block gets two stages, or none.
        let mut small = b200();
        small.shared_mem_per_block = 80 * 1024;
        assert_eq!(stages(&small), Some(2));
        small.shared_mem_per_block = 48 * 1024;
        assert_eq!(stages(&small), None);
    }

    #[test]
    fn sources_assemble_with_the_tma_producer() {
        let entries = catalog(&b200(), calico_cuda::device_headers()).unwrap();
        assert_eq!(entries.len(), 4);
        for e in &entries {
            assert_eq!(e.source.entry, "calico_gemm_sm80_tma");
            assert!(e.source.text.contains("#define CALICO_GEMM_TMA 1\n"));
            assert!(e.source.text.contains("cp.async.bulk.tensor"));
            assert!(e.source.text.contains("#define CALICO_GEMM_THREADS 256\n"));
        }
        assert!(catalog(
            &Arch::for_target("sm_80").unwrap(),
            calico_cuda::device_headers()
        )
        .unwrap()
        .is_empty());
    }
}
