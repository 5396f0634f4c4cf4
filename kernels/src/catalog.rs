//! Every kernel variant Calico launches, for compiling and disassembling with no device
//! present: `calico compile`, and the CI test that compiles every source for sm_80, sm_90a,
//! sm_100a, gfx90a and gfx942.

use crate::gpu::cdna_rows::{self, CdnaRowPlan};
use crate::gpu::rows::{self, RowPlan};
use crate::ops::norm::{NormCdnaVariant, NormVariant};
use crate::ops::RopeMode;
use calico_core::{Arch, DType, Error, HeaderSet, KernelSource, KernelVariant, Result, Vendor};

/// The ops that have device kernels.
pub const OPS: &[&str] = &[
    "rms_norm",
    "layer_norm",
    "softmax",
    "rope",
    "gemm",
    "attention_decode",
    "attention",
    "attention_hopper",
];

/// One variant of one op's kernel.
#[derive(Debug, Clone)]
pub struct CatalogEntry {
    pub op: &'static str,
    /// What distinguishes this variant (dtype, vector width, flags).
    pub label: String,
    pub source: KernelSource,
}

fn arch_for(target: &str) -> Result<Arch> {
    Arch::for_target(target).ok_or_else(|| {
        Error::unsupported(format!(
            "unknown target `{target}` (expected sm_XY[a] or gfxNNN)"
        ))
    })
}

fn vendor_headers(arch: &Arch) -> HeaderSet {
    match arch.vendor {
        Vendor::Amd => calico_hip::hip_headers(),
        _ => calico_cuda::device_headers(),
    }
}

/// The kernel variants of `op` (or of every op) for `target`.
pub fn entries(target: &str, op: Option<&str>) -> Result<Vec<CatalogEntry>> {
    if let Some(op) = op {
        if !OPS.contains(&op) {
            return Err(Error::unsupported(format!(
                "unknown op `{op}`; ops with kernels: {}",
                OPS.join(", ")
            )));
        }
    }
    let arch = arch_for(target)?;
    let vendor = vendor_headers(&arch);
    let wanted = |name: &str| op.is_none_or(|o| o == name);
    let mut out = Vec::new();
    let dtypes = [DType::BF16, DType::F16, DType::F32];
    // Register-resident rows (vectorised and scalar) and the streaming fallback.
    // (`aim`: vectors per thread aimed for, RMSNorm's or the others'.)
    let plans = |dtype: DType, aim: usize| -> Vec<(usize, RowPlan)> {
        let vec = 16 / dtype.size_bytes();
        vec![
            (vec, rows::plan_aiming(4096, vec, &arch, aim)),
            (1, rows::plan_aiming(1000, 1, &arch, aim)),
            (vec, rows::plan_aiming(1 << 20, vec, &arch, aim)),
        ]
    };
    // CDNA row kernels (buffer loads): a row per wavefront, a row per workgroup, and rows
    // aligned to 4 bytes only (dword accesses).
    let cdna_plans = |dtype: DType| -> Vec<CdnaRowPlan> {
        let esz = dtype.size_bytes();
        [(1024, 0x1000), (8192, 0x1000), (4096, 0x1004)]
            .into_iter()
            .filter_map(|(cols, addr)| cdna_rows::plan(&arch, esz, cols, &[addr], &[cols]))
            .collect()
    };
    let cdna_label = |dtype: DType, p: &CdnaRowPlan| {
        format!(
            "cdna {dtype} {}B x{} {}",
            p.bytes,
            p.chunks_per_lane,
            if p.group == 64 {
                "row per wave"
            } else {
                "row per workgroup"
            }
        )
    };
    for (name, layer) in [("rms_norm", false), ("layer_norm", true)] {
        if !wanted(name) {
            continue;
        }
        for dtype in dtypes {
            for plan in cdna_plans(dtype) {
                for residual in [false, true] {
                    let v = NormCdnaVariant {
                        dtype,
                        plan,
                        layer,
                        residual,
                        weight: true,
                        bias: layer,
                    };
                    out.push(CatalogEntry {
                        op: name,
                        label: format!("{} residual={residual}", cdna_label(dtype, &plan)),
                        source: v.source(vendor)?,
                    });
                }
            }
        }
        let aim = if layer {
            rows::TARGET_VECTORS
        } else {
            rows::RMS_TARGET_VECTORS
        };
        for dtype in dtypes {
            for (vec, plan) in plans(dtype, aim) {
                for residual in [false, true] {
                    let v = NormVariant {
                        dtype,
                        vec,
                        plan,
                        align_body: false,
                        layer,
                        residual,
                        weight: true,
                        bias: layer,
                    };
                    let label = format!(
                        "{dtype} vec{vec} nv{} streaming={} residual={residual}",
                        plan.vectors_per_thread, plan.streaming
                    );
                    out.push(CatalogEntry {
                        op: name,
                        label,
                        source: v.source(vendor)?,
                    });
                }
            }
            // Odd row lengths (RMSNorm): aligned body, scalar head and tail.
            if !layer {
                let wide = 16 / dtype.size_bytes();
                for residual in [false, true] {
                    let v = NormVariant {
                        dtype,
                        vec: wide,
                        plan: rows::plan_aiming(4097, wide, &arch, aim),
                        align_body: true,
                        layer,
                        residual,
                        weight: true,
                        bias: false,
                    };
                    out.push(CatalogEntry {
                        op: name,
                        label: format!(
                            "{dtype} vec{wide} aligned body (odd rows) residual={residual}"
                        ),
                        source: v.source(vendor)?,
                    });
                }
            }
        }
    }
    if wanted("softmax") {
        for dtype in dtypes {
            for plan in cdna_plans(dtype) {
                let v = crate::ops::softmax::SoftmaxCdnaVariant { dtype, plan };
                out.push(CatalogEntry {
                    op: "softmax",
                    label: cdna_label(dtype, &plan),
                    source: v.source(vendor)?,
                });
            }
            for (vec, plan) in plans(dtype, rows::TARGET_VECTORS) {
                let label = format!(
                    "{dtype} vec{vec} nv{} streaming={}",
                    plan.vectors_per_thread, plan.streaming
                );
                out.push(CatalogEntry {
                    op: "softmax",
                    label,
                    source: crate::ops::softmax::source(vendor, dtype, vec, plan, false)?,
                });
            }
            // Odd row lengths: aligned body, scalar head and tail.
            let wide = 16 / dtype.size_bytes();
            let plan = rows::plan(4097, wide, &arch);
            out.push(CatalogEntry {
                op: "softmax",
                label: format!("{dtype} vec{wide} aligned body (odd rows)"),
                source: crate::ops::softmax::source(vendor, dtype, wide, plan, true)?,
            });
        }
    }
    if wanted("rope") {
        for dtype in dtypes {
            for mode in [RopeMode::HalfSplit, RopeMode::Interleaved] {
                let wide = if mode == RopeMode::HalfSplit {
                    16 / dtype.size_bytes()
                } else {
                    8 / dtype.size_bytes()
                };
                let pairs = wide.max(1);
                let aligned_width = if mode == RopeMode::HalfSplit {
                    pairs
                } else {
                    2 * pairs
                };
                // Aligned vectors, and the same pairs with x read one element at a time.
                for (pairs, x_width) in [(pairs, aligned_width), (pairs, 1), (1, 1)] {
                    let label = format!("{dtype} {mode:?} pairs{pairs} x_width{x_width}");
                    out.push(CatalogEntry {
                        op: "rope",
                        label,
                        source: crate::ops::rope::source(vendor, dtype, pairs, x_width, mode)?,
                    });
                }
                // CDNA (buffer loads): whole 16-byte accesses, and dword accesses.
                let dword = 4 / dtype.size_bytes();
                for x_width in [aligned_width, dword] {
                    if cdna_rows::is_cdna(&arch) {
                        out.push(CatalogEntry {
                            op: "rope",
                            label: format!("cdna {dtype} {mode:?} pairs{pairs} x_width{x_width}"),
                            source: crate::ops::rope::cdna_source(
                                vendor, dtype, pairs, x_width, mode,
                            )?,
                        });
                    }
                }
            }
        }
    }
    if wanted("gemm") {
        out.extend(crate::gemm::catalog(&arch, vendor)?);
    }
    if wanted("attention_decode") {
        for (label, kernel) in crate::ops::attention::decode::catalog_variants(&arch) {
            out.push(CatalogEntry {
                op: "attention_decode",
                label,
                source: kernel.source(vendor)?,
            });
        }
    }
    if wanted("attention") {
        let cdna = crate::ops::attention::cdna::catalog(&arch, vendor)?;
        let tiles = crate::ops::attention::tiles::catalog(&arch, vendor)?;
        for (label, source) in crate::ops::attention::gpu::catalog(&arch, vendor)?
            .into_iter()
            .chain(cdna)
            .chain(tiles)
        {
            out.push(CatalogEntry {
                op: "attention",
                label,
                source,
            });
        }
    }
    if wanted("attention_hopper") {
        out.extend(crate::ops::attention::hopper::catalog(&arch, vendor)?);
        out.extend(crate::ops::attention::hopper_bwd::catalog(&arch, vendor)?);
    }
    Ok(out)
}

/// Compiles a source for `target` with no device: NVRTC for `sm_*`, clang for `gfx*`.
pub fn compile(target: &str, source: &KernelSource) -> Result<Vec<u8>> {
    match arch_for(target)?.vendor {
        Vendor::Amd => calico_hip::compile_offline(source, target),
        _ => calico_cuda::nvrtc::compile(source, target),
    }
}

/// Disassembles a binary made by [`compile`]: SASS (cuobjdump) or AMDGCN (llvm-objdump).
pub fn disassemble(target: &str, binary: &[u8]) -> Result<String> {
    match arch_for(target)?.vendor {
        Vendor::Amd => calico_hip::disassemble(binary),
        _ => calico_cuda::disasm::sass(binary),
    }
}

/// Register, LDS and scratch use per kernel and the occupancy that follows, read from an AMD
/// code object's metadata; `None` for NVIDIA targets (their cubins carry no such note here).
pub fn resources(target: &str, binary: &[u8]) -> Result<Option<Vec<KernelResources>>> {
    match arch_for(target)?.vendor {
        Vendor::Amd => calico_hip::read_resources(binary).map(Some),
        _ => Ok(None),
    }
}

pub use calico_hip::KernelResources;
