//! The vendor-neutral tile attention forward (`kernels/device/attention/tiles.cu`): written
//! only against the shared tile vocabulary, so one source runs on NVIDIA (mma.sync) and AMD
//! CDNA (MFMA). It takes the forwards the vendor-specific kernels decline (head dims that are
//! multiples of 16 other than 64 / 128 / 256 everywhere; K or V rows the CDNA kernel cannot
//! read on AMD), before the scalar portable kernel. `CALICO_ATTN_FORWARD=tiles` sends every
//! forward it supports to it, `CALICO_ATTN_FORWARD=portable` every forward to the portable
//! kernel (A/B benchmarks); [`with_tile_forward`] does the former for one thread (tests).

use super::check::Problem;
use super::gpu as common;
use crate::gpu::cdna_rows::is_cdna;
use crate::Device;
use calico_core::{
    Arch, DType, HeaderSet, KernelSource, KernelVariant, MmaKind, Result, Tensor, Vendor,
};
use calico_cpu::AttentionParams;

const SOURCE: &str = include_str!("../../../device/attention/tiles.cu");
const ENTRY: &str = "calico_attention_tiles_fwd";
/// Eight warps (wavefronts) of 16 query rows: on CDNA, 512 threads per workgroup cap the
/// registers at 256 per wave (two waves per SIMD), as in the CDNA forward.
const WARPS: u32 = 8;
const BLOCK_ROWS: usize = 16 * WARPS as usize;
/// The head dims the kernel covers: multiples of 16 up to 256.
const MAX_HEAD_DIM: usize = 256;
/// The head dims compiled in CI (see [`catalog`]).
const CATALOG_HEAD_DIMS: [usize; 7] = [16, 48, 64, 96, 128, 160, 256];

/// One compiled form of the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct TilesFwdVariant {
    pub dtype: DType,
    pub head_dim: usize,
}

impl TilesFwdVariant {
    /// Keys per block: 16 above head dim 128 keeps the registers in budget (no spills on
    /// sm_80 / sm_90a, compile_all).
    fn keys_per_block(&self) -> usize {
        if self.head_dim > 128 {
            16
        } else {
            64
        }
    }

    /// Shared memory (static): one block of K, rows padded to the shared tile width (tiles.cu's
    /// DS), and one of V^T.
    pub(crate) fn smem_bytes(&self) -> usize {
        let width = if self.head_dim <= 32 {
            self.head_dim
        } else {
            self.head_dim.div_ceil(64) * 64
        };
        self.keys_per_block() * (width + self.head_dim) * 2
    }

    pub(crate) fn label(&self) -> String {
        format!(
            "tiles fwd {} d{} bn{} smem {} KiB",
            self.dtype,
            self.head_dim,
            self.keys_per_block(),
            self.smem_bytes() >> 10
        )
    }
}

impl KernelVariant for TilesFwdVariant {
    fn source(&self, vendor: HeaderSet) -> Result<KernelSource> {
        let defines = [
            ("ELEM", self.dtype.device_type().to_string()),
            ("HEAD_DIM", self.head_dim.to_string()),
            ("BN", self.keys_per_block().to_string()),
        ];
        let sets = [vendor, calico_core::device_headers(), common::HEADERS];
        KernelSource::assemble(ENTRY, SOURCE, &sets, &defines)
    }
}

/// The vocabulary has register tiles here: NVIDIA with mma.sync for the dtype, or CDNA with
/// MFMA (wave64); and the head dim is a multiple of 16 up to 256.
fn arch_ok(arch: &Arch, dtype: DType, head_dim: usize) -> bool {
    let tiles = match arch.vendor {
        Vendor::Nvidia => arch.has_mma(MmaKind::MmaSync, dtype),
        Vendor::Amd => is_cdna(arch) && arch.has_mma(MmaKind::Mfma, dtype),
        _ => false,
    };
    tiles
        && matches!(dtype, DType::BF16 | DType::F16)
        && head_dim > 0
        && head_dim.is_multiple_of(16)
        && head_dim <= MAX_HEAD_DIM
}

/// The variant for a problem on `arch`, or `None` when the kernel does not cover it.
pub(crate) fn forward_variant(arch: &Arch, p: &Problem) -> Option<TilesFwdVariant> {
    let fits = arch_ok(arch, p.dtype, p.head_dim)
        && p.q_len <= i32::MAX as usize
        && p.k_len <= i32::MAX as usize;
    fits.then_some(TilesFwdVariant {
        dtype: p.dtype,
        head_dim: p.head_dim,
    })
}

/// `CALICO_ATTN_FORWARD` (read once per process): `tiles` sends every forward this kernel
/// supports to it, `portable` every forward to the scalar portable kernel (A/B runs).
fn env_forward() -> &'static str {
    static CHOICE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    CHOICE.get_or_init(|| std::env::var("CALICO_ATTN_FORWARD").unwrap_or_default())
}

/// Every forward this kernel supports takes it, ahead of the vendor-specific kernels: for the
/// whole process under `CALICO_ATTN_FORWARD=tiles`, for one thread inside
/// [`with_tile_forward`].
pub(crate) fn forced() -> bool {
    env_forward() == "tiles" || THREAD_FIRST.with(|f| f.get())
}

/// `CALICO_ATTN_FORWARD=portable`: every forward runs the scalar portable kernel.
pub(crate) fn portable_forced() -> bool {
    env_forward() == "portable"
}

thread_local! {
    static THREAD_FIRST: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with every attention forward this thread launches or plans (`ops::attention`,
/// `attention_varlen`, `plan_attention`) routed to the vendor-neutral tile kernel
/// (`kernels/device/attention/tiles.cu`) wherever it supports the problem, as
/// `CALICO_ATTN_FORWARD=tiles` does for a whole process: for tests and A/B runs on GPUs where
/// a vendor-specific kernel would take the problem. Other threads are not affected.
pub fn with_tile_forward<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            THREAD_FIRST.with(|t| t.set(self.0));
        }
    }
    let _restore = Restore(THREAD_FIRST.with(|t| t.replace(true)));
    f()
}

/// Launches `variant` on the tensors with the argument list of the other forwards.
pub(crate) fn launch_forward(
    dev: &Device,
    p: &Problem,
    params: &AttentionParams,
    variant: TilesFwdVariant,
    [q, k, v, o, lse]: [&Tensor; 5],
    varlen: Option<[&Tensor; 2]>,
) -> Result<()> {
    let gpu = common::launcher(dev)?;
    let threads = WARPS * dev.arch().lanes.max(1);
    let config = common::grid(p.q_len, BLOCK_ROWS, p.q_heads, p.batch, threads, 0)?;
    let args = common::forward_args(p, params, [q, k, v, o, lse], varlen);
    gpu.launch_variant(&variant, &config, args.as_slice())
}

/// Every variant for `calico compile --op attention` and the compile checks: both dtypes at
/// head dims 64, 128 and 256 (the vendor kernels' dims) and 16, 48, 96, 160, which only this
/// kernel takes on a GPU (shared rows unpadded, padded to 64 elements, padded to 128; 16-key
/// blocks with Q re-read on NVIDIA).
pub(crate) fn catalog(arch: &Arch, vendor: HeaderSet) -> Result<Vec<(String, KernelSource)>> {
    let mut out = Vec::new();
    for dtype in [DType::BF16, DType::F16] {
        for head_dim in CATALOG_HEAD_DIMS {
            if arch_ok(arch, dtype, head_dim) {
                let v = TilesFwdVariant { dtype, head_dim };
                out.push((v.label(), v.source(vendor)?));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_vendors_with_matrix_units_and_multiples_of_16() {
        let gfx942 = Arch::for_target("gfx942").unwrap();
        let gfx90a = Arch::for_target("gfx90a").unwrap();
        let sm80 = Arch::for_target("sm_80").unwrap();
        let sm90 = Arch::for_target("sm_90a").unwrap();
        let rdna = Arch::amd("gfx1100", 48, 65536, 32, 6 << 20);
        for a in [&gfx942, &gfx90a, &sm80, &sm90] {
            for d in [16, 48, 64, 80, 96, 128, 144, 256] {
                assert!(arch_ok(a, DType::BF16, d), "{} d{d}", a.target);
                assert!(arch_ok(a, DType::F16, d), "{} d{d}", a.target);
            }
            for d in [0, 8, 72, 100, 272] {
                assert!(!arch_ok(a, DType::BF16, d), "{} d{d}", a.target);
            }
            assert!(!arch_ok(a, DType::F32, 64), "f32");
        }
        assert!(!arch_ok(&rdna, DType::BF16, 128), "RDNA has no MFMA");
        let hip = calico_hip::hip_headers();
        assert_eq!(catalog(&gfx942, hip).unwrap().len(), 14);
        assert_eq!(catalog(&rdna, hip).unwrap().len(), 0);
    }

    #[test]
    fn shared_tiles_fit_the_static_limit() {
        for d in (16..=256).step_by(16) {
            let v = TilesFwdVariant {
                dtype: DType::BF16,
                head_dim: d,
            };
            assert!(v.smem_bytes() <= 32 << 10, "d{d}: {}", v.smem_bytes());
        }
    }
}
