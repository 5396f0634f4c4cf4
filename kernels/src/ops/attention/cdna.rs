//! The CDNA (gfx90a, gfx94x) attention forward: MFMA on the tile vocabulary, K and V staged in
//! LDS through buffer loads (`kernels/device/attention/cdna_fwd.cu` explains the kernel). This
//! module decides when it applies and launches it with the argument list of the other
//! forwards; problems it declines run the portable kernel. No AMD GPU has run it: it is
//! checked by compilation and its ISA (compile_all), see docs/attention.md.

use super::check::{kernel_head_dim, Problem};
use super::gpu as common;
use crate::gpu::cdna_rows::is_cdna;
use crate::Device;
use calico_core::{Arch, DType, HeaderSet, KernelSource, KernelVariant, MmaKind, Result, Tensor};
use calico_cpu::AttentionParams;

const SOURCE: &str = include_str!("../../../device/attention/cdna_fwd.cu");
const ENTRY: &str = "calico_attention_cdna_fwd";
/// Eight wavefronts of 16 query rows.
const THREADS: u32 = 512;
const BLOCK_ROWS: usize = 128;
/// K and V are each described by one buffer resource with 32-bit offsets; the kernel's
/// out-of-range marker is 2^31.
const MAX_OPERAND_BYTES: usize = 1 << 31;

/// One compiled form of the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct CdnaFwdVariant {
    pub dtype: DType,
    /// The kernel's head dim: 64, 128 or 256.
    pub head_dim: usize,
    /// The problem's head dim (a multiple of 8, at most `head_dim`): the buffer loads past it
    /// read zeros and only its columns of O are written (HEAD_DIM_USED).
    pub used_dim: usize,
}

impl CdnaFwdVariant {
    /// Keys per block: 32 at head dim 256 keeps the registers in budget (and LDS at 32 KiB).
    fn keys_per_block(&self) -> usize {
        if self.head_dim > 128 {
            32
        } else {
            64
        }
    }

    /// LDS per workgroup: one block of K and one of V^T.
    fn lds_bytes(&self) -> usize {
        2 * self.keys_per_block() * self.head_dim * 2
    }

    pub(crate) fn label(&self) -> String {
        let used = if self.used_dim == self.head_dim {
            String::new()
        } else {
            format!(" used{}", self.used_dim)
        };
        format!(
            "cdna fwd {} d{}{used} bn{} lds {} KiB",
            self.dtype,
            self.head_dim,
            self.keys_per_block(),
            self.lds_bytes() >> 10
        )
    }
}

impl KernelVariant for CdnaFwdVariant {
    fn source(&self, vendor: HeaderSet) -> Result<KernelSource> {
        let defines = [
            ("ELEM", self.dtype.device_type().to_string()),
            ("HEAD_DIM", self.head_dim.to_string()),
            ("HEAD_DIM_USED", self.used_dim.to_string()),
            ("BN", self.keys_per_block().to_string()),
        ];
        let sets = [vendor, calico_core::device_headers(), common::HEADERS];
        KernelSource::assemble(ENTRY, SOURCE, &sets, &defines)
    }
}

/// The kernel runs here: a CDNA GPU with MFMA for the dtype, a head dim it covers (64, 128,
/// 256, and the multiples of 8 below them at the next of those widths).
fn arch_ok(arch: &Arch, dtype: DType, head_dim: usize) -> bool {
    is_cdna(arch)
        && matches!(dtype, DType::BF16 | DType::F16)
        && arch.has_mma(MmaKind::Mfma, dtype)
        && kernel_head_dim(head_dim, 256).is_some()
}

/// Bytes from a tensor's first element to one past its last.
fn span_bytes(t: &Tensor) -> Option<usize> {
    let elems = t
        .shape()
        .iter()
        .zip(t.strides())
        .try_fold(1usize, |acc, (&n, &s)| {
            n.checked_sub(1)?.checked_mul(s)?.checked_add(acc)
        })?;
    elems.checked_mul(t.dtype().size_bytes())
}

/// K or V as the kernel reads it: 16-byte aligned rows (buffer_load_dwordx4), rows at least a
/// head dim apart (so rows past the sequence fall past the buffer), under 2 GiB.
fn operand_ok(t: &Tensor, head_dim: usize) -> bool {
    let [_, _, sn] = common::strides(t);
    common::rows_aligned(t)
        && sn >= head_dim
        && span_bytes(t).is_some_and(|b| b < MAX_OPERAND_BYTES)
}

/// K and V as the kernel can read them (see [`operand_ok`]).
pub(crate) fn operands_ok(k: &Tensor, v: &Tensor, head_dim: usize) -> bool {
    operand_ok(k, head_dim) && operand_ok(v, head_dim)
}

/// The CDNA variant for a problem on `arch`, or `None` when the kernel does not cover it
/// (the router's rule; K and V must also pass [`operands_ok`]).
pub(crate) fn forward_variant(arch: &Arch, p: &Problem) -> Option<CdnaFwdVariant> {
    let fits = arch_ok(arch, p.dtype, p.head_dim)
        && p.q_len <= i32::MAX as usize
        && p.k_len <= i32::MAX as usize;
    fits.then_some(CdnaFwdVariant {
        dtype: p.dtype,
        head_dim: kernel_head_dim(p.head_dim, 256)?,
        used_dim: p.head_dim,
    })
}

/// Launches `variant` on the tensors with the argument list of the other forwards.
pub(crate) fn launch_forward(
    dev: &Device,
    p: &Problem,
    params: &AttentionParams,
    variant: CdnaFwdVariant,
    [q, k, v, o, lse]: [&Tensor; 5],
    varlen: Option<[&Tensor; 2]>,
) -> Result<()> {
    let gpu = common::launcher(dev)?;
    let config = common::grid(p.q_len, BLOCK_ROWS, p.q_heads, p.batch, THREADS, 0)?;
    let args = common::forward_args(p, params, [q, k, v, o, lse], varlen);
    gpu.launch_variant(&variant, &config, args.as_slice())
}

/// Every variant, for `calico compile --op attention` and the compile checks (CDNA only).
pub(crate) fn catalog(arch: &Arch, vendor: HeaderSet) -> Result<Vec<(String, KernelSource)>> {
    let mut out = Vec::new();
    for dtype in [DType::BF16, DType::F16] {
        for head_dim in [64, 128, 256] {
            if arch_ok(arch, dtype, head_dim) {
                let v = CdnaFwdVariant {
                    dtype,
                    head_dim,
                    used_dim: head_dim,
                };
                out.push((v.label(), v.source(vendor)?));
            }
        }
    }
    // Head dims below the widths (the multiples of 8 the vendor-neutral kernel declines).
    for used_dim in [40, 120] {
        if arch_ok(arch, DType::BF16, used_dim) {
            let v = CdnaFwdVariant {
                dtype: DType::BF16,
                head_dim: kernel_head_dim(used_dim, 256).unwrap_or(used_dim),
                used_dim,
            };
            out.push((v.label(), v.source(vendor)?));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_cdna_with_mfma_and_tile_head_dims() {
        let gfx942 = Arch::for_target("gfx942").unwrap();
        let gfx90a = Arch::for_target("gfx90a").unwrap();
        let sm90 = Arch::for_target("sm_90a").unwrap();
        let rdna = Arch::amd("gfx1100", 48, 65536, 32, 6 << 20);
        assert!(arch_ok(&gfx942, DType::BF16, 128));
        assert!(arch_ok(&gfx90a, DType::F16, 64));
        assert!(arch_ok(&gfx942, DType::BF16, 256));
        assert!(
            arch_ok(&gfx942, DType::BF16, 96),
            "head dim 96, at width 128"
        );
        assert!(!arch_ok(&gfx942, DType::BF16, 100), "head dim 100");
        assert!(!arch_ok(&gfx942, DType::BF16, 264), "head dim 264");
        assert!(!arch_ok(&gfx942, DType::F32, 128), "f32");
        assert!(!arch_ok(&sm90, DType::BF16, 128), "NVIDIA");
        assert!(!arch_ok(&rdna, DType::BF16, 128), "RDNA");
        let hip = calico_hip::hip_headers();
        assert_eq!(catalog(&gfx942, hip).unwrap().len(), 8);
        assert!(catalog(&sm90, hip).unwrap().is_empty());
    }

    #[test]
    fn lds_stays_within_a_quarter_to_half_of_a_cu() {
        for (d, bytes) in [(64, 16 << 10), (128, 32 << 10), (256, 32 << 10)] {
            let v = CdnaFwdVariant {
                dtype: DType::BF16,
                head_dim: d,
                used_dim: d,
            };
            assert_eq!(v.lds_bytes(), bytes, "d{d}");
        }
    }
}
