//! What the routers would run for an op on a compile target, with no device (for
//! `calico bench --dry-run`): each planner feeds the router's own decision function (the one
//! the launch calls) with dense, contiguous operands at 256-byte aligned addresses, as the
//! benchmark allocates them, and returns the kernels it picks and, on AMD targets, their
//! sources to compile offline.

use super::attention::{check::Problem, decode, gpu as attn, AttentionOptions};
use super::{norm, rope, softmax, RopeMode};
use calico_core::{Arch, DType, Error, KernelSource, KernelVariant, Result, Vendor};

/// One kernel an op would launch.
#[derive(Debug, Clone)]
pub struct PlannedKernel {
    /// What the router chose, in words.
    pub label: String,
    /// The variant's source on AMD targets; `None` on NVIDIA (see `calico compile`).
    pub source: Option<KernelSource>,
}

/// The kernels one call of an op would launch, in order.
#[derive(Debug, Clone)]
pub struct OpPlan {
    pub kernels: Vec<PlannedKernel>,
}

/// The row ops (memory-bound, one row or one head at a time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RowOp {
    RmsNorm,
    AddRmsNorm,
    /// With a weight and a bias.
    LayerNorm,
    /// With a weight and a bias.
    AddLayerNorm,
    Softmax,
    /// Half-split rope with f32 cos/sin tables of S positions.
    Rope,
}

/// One attention forward or backward: Q `[B, Hq, N, D]`, K and V `[B, Hkv, N, D]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionCase {
    pub dtype: DType,
    pub batch: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub seq: usize,
    pub head_dim: usize,
    pub causal: bool,
    pub backward: bool,
    /// Packed sequences (`attention_varlen`): `batch` sequences of `seq` tokens each.
    pub varlen: bool,
    /// Logit soft-cap (`AttentionOptions::softcap`): the kernels' soft-capped variants.
    pub softcap: Option<f32>,
}

/// One decode call: one query token per sequence over a cache of `context` tokens each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeCase {
    pub dtype: DType,
    pub batch: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub context: usize,
    /// Tokens per page; `None` for a contiguous `[B, Hkv, N, D]` cache.
    pub page_size: Option<usize>,
}

/// Where the planner places operands: far apart, 256-byte aligned.
const BASE: u64 = 1 << 40;

/// The operands a planner describes (shapes, element bytes) hold at least one element and
/// fit in memory as tensors must (`calico_core::layout::checked_bytes`): a call with an empty
/// output launches nothing, and sizes past those limits cannot come from tensors.
pub(crate) fn operands_fit(operands: &[(&[usize], usize)]) -> Result<()> {
    for &(shape, elem) in operands {
        if calico_core::layout::checked_bytes(shape, elem)? == 0 {
            return Err(Error::shape(format!(
                "an operand of shape {shape:?} is empty: the call launches nothing"
            )));
        }
    }
    Ok(())
}

fn arch_for(target: &str) -> Result<Arch> {
    Arch::for_target(target).ok_or_else(|| Error::unsupported(format!("unknown target `{target}`")))
}

fn planned<V: KernelVariant>(arch: &Arch, label: String, variant: &V) -> Result<PlannedKernel> {
    let source = match arch.vendor {
        Vendor::Amd => Some(variant.source(calico_hip::hip_headers())?),
        _ => None,
    };
    Ok(PlannedKernel { label, source })
}

/// The kernel a row op's router picks (one of the three routers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowChoice {
    Norm(norm::NormKernel),
    Softmax(softmax::SoftmaxKernel),
    Rope(rope::RopeVariant),
}

/// The router's choice for `op` on dense operands of `shape` (`[rows, cols]`, or
/// `[B, S, H, D]` for rope).
pub(crate) fn row_choice(
    arch: &Arch,
    op: RowOp,
    shape: &[usize],
    dtype: DType,
) -> Result<RowChoice> {
    let operand = |i: u64| BASE * (i + 1);
    if op == RowOp::Rope {
        let &[b, s, h, d] = shape else {
            return Err(Error::shape(format!(
                "rope takes [B, S, H, D], got {shape:?}"
            )));
        };
        if d % 2 != 0 {
            return Err(Error::shape(format!(
                "rope needs an even head dimension, got {d}"
            )));
        }
        let strides = [s * h * d, h * d, d];
        let g = rope::RopeGeometry {
            dims: [b, s, h, d],
            strides: [strides, strides],
            addresses: [operand(0), operand(1), operand(2), operand(3)],
            table_bytes: s * (d / 2) * 4,
        };
        return Ok(RowChoice::Rope(rope::choose(
            arch,
            dtype,
            RopeMode::HalfSplit,
            &g,
        )));
    }
    let &[rows, cols] = shape else {
        return Err(Error::shape(format!(
            "{op:?} takes [rows, cols], got {shape:?}"
        )));
    };
    let row = |i: u64| (operand(i), cols);
    if op == RowOp::Softmax {
        return Ok(RowChoice::Softmax(softmax::choose(
            arch,
            dtype,
            rows,
            cols,
            row(0),
            row(1),
        )));
    }
    let layer = matches!(op, RowOp::LayerNorm | RowOp::AddLayerNorm);
    let add = matches!(op, RowOp::AddRmsNorm | RowOp::AddLayerNorm);
    let geometry = norm::NormGeometry {
        rows,
        cols,
        x: row(0),
        residual: add.then(|| row(1)),
        y: row(2),
        sum: add.then(|| row(3)),
        weight: Some(operand(4)),
        bias: layer.then(|| operand(5)),
    };
    Ok(RowChoice::Norm(norm::choose(arch, dtype, layer, &geometry)))
}

/// The kernel `op` would run on `target` for dense, contiguous operands of `shape`
/// (`[rows, cols]`, or `[B, S, H, D]` for rope) and `dtype`.
pub fn plan_row_op(target: &str, op: RowOp, shape: &[usize], dtype: DType) -> Result<OpPlan> {
    let arch = arch_for(target)?;
    operands_fit(&[(shape, dtype.size_bytes())])?;
    let kernel = match row_choice(&arch, op, shape, dtype)? {
        RowChoice::Norm(norm::NormKernel::Cdna(v)) => planned(
            &arch,
            format!("norm cdna, {}", cdna_rows_label(&v.plan)),
            &v,
        ),
        RowChoice::Norm(norm::NormKernel::Portable(v)) => planned(
            &arch,
            format!(
                "norm portable, {}",
                rows_label(v.vec, &v.plan, v.align_body)
            ),
            &v,
        ),
        RowChoice::Softmax(softmax::SoftmaxKernel::Cdna(v)) => planned(
            &arch,
            format!("softmax cdna, {}", cdna_rows_label(&v.plan)),
            &v,
        ),
        RowChoice::Softmax(softmax::SoftmaxKernel::Portable(v)) => planned(
            &arch,
            format!(
                "softmax portable, {}",
                rows_label(v.vec, &v.plan, v.align_body)
            ),
            &v,
        ),
        RowChoice::Rope(v) => {
            let kind = if v.cdna { "cdna" } else { "portable" };
            let label = format!(
                "rope {kind}, {} pairs a thread, {} elements an access",
                v.pairs, v.x_width
            );
            planned(&arch, label, &v)
        }
    }?;
    Ok(OpPlan {
        kernels: vec![kernel],
    })
}

fn cdna_rows_label(p: &crate::gpu::cdna_rows::CdnaRowPlan) -> String {
    format!(
        "{}-byte buffer loads x{} a lane, {} lanes a row, {} threads",
        p.bytes, p.chunks_per_lane, p.group, p.threads
    )
}

fn rows_label(vec: usize, p: &crate::gpu::rows::RowPlan, align_body: bool) -> String {
    let body = if align_body { ", aligned body" } else { "" };
    if p.streaming {
        format!(
            "{vec}-element vectors streamed, {} threads{body}",
            p.threads
        )
    } else {
        format!(
            "{vec}-element vectors x{} a thread, {} threads{body}",
            p.vectors_per_thread, p.threads
        )
    }
}

/// What the attention routers see for dense, contiguous `[B, H, N, D]` operands at aligned
/// addresses: the problem and the facts of the forward and of the backward.
fn attention_facts(
    c: &AttentionCase,
) -> Result<(Problem, attn::ForwardFacts, attn::BackwardFacts)> {
    if c.kv_heads == 0 || !c.q_heads.is_multiple_of(c.kv_heads) {
        return Err(Error::shape(format!(
            "{} query heads do not group over {} KV heads",
            c.q_heads, c.kv_heads
        )));
    }
    // A packed call's lengths are the totals over its sequences (check::packed_qkv).
    let len = if c.varlen { c.batch * c.seq } else { c.seq };
    let p = Problem {
        dtype: c.dtype,
        batch: c.batch,
        q_heads: c.q_heads,
        kv_heads: c.kv_heads,
        q_len: len,
        k_len: len,
        head_dim: c.head_dim,
    };
    // Row strides of D elements: 16-byte rows (cp.async, TMA, buffer loads) when D is a
    // multiple of 8 (TMA also needs them to express the views); the CDNA kernel also needs
    // each of K and V under 2 GiB.
    let rows_aligned = c.head_dim.is_multiple_of(8);
    let kv_bytes = c.batch * c.kv_heads * c.seq * c.head_dim * c.dtype.size_bytes();
    let forward = attn::ForwardFacts {
        varlen: c.varlen,
        kv_rows_aligned: rows_aligned,
        cdna_operands: rows_aligned && kv_bytes < 1 << 31,
        tma_views: rows_aligned,
    };
    let backward = attn::BackwardFacts {
        varlen: c.varlen,
        deterministic: false,
        rows_aligned,
        tma_views: rows_aligned,
    };
    Ok((p, forward, backward))
}

/// The router's choice for an attention forward or backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttentionChoice {
    Forward(attn::ForwardRoute),
    Backward(attn::BackwardRoute),
}

pub(crate) fn attention_choice(arch: &Arch, c: &AttentionCase) -> Result<AttentionChoice> {
    let (p, forward, backward) = attention_facts(c)?;
    let opts = AttentionOptions {
        causal: c.causal,
        softcap: c.softcap,
        ..Default::default()
    };
    let params = super::attention::check::params(&opts, c.head_dim)?;
    Ok(if c.backward {
        AttentionChoice::Backward(attn::route_backward(arch, &p, &params, &backward))
    } else {
        AttentionChoice::Forward(attn::route_forward(arch, &p, &params, &forward))
    })
}

/// The kernels an attention forward or backward would run on `target`.
pub fn plan_attention(target: &str, case: &AttentionCase) -> Result<OpPlan> {
    let arch = arch_for(target)?;
    let elem = case.dtype.size_bytes();
    operands_fit(&[
        (&[case.batch, case.q_heads, case.seq, case.head_dim], elem),
        (&[case.batch, case.kv_heads, case.seq, case.head_dim], elem),
    ])?;
    let tile = |v: attn::AttentionVariant| planned(&arch, v.label(), &v);
    let kernels = match attention_choice(&arch, case)? {
        AttentionChoice::Forward(attn::ForwardRoute::Hopper(v)) => vec![PlannedKernel {
            label: v.label(),
            source: None,
        }],
        AttentionChoice::Forward(attn::ForwardRoute::Cdna(v)) => {
            vec![planned(&arch, v.label(), &v)?]
        }
        AttentionChoice::Forward(attn::ForwardRoute::Tiles(v)) => {
            vec![planned(&arch, v.label(), &v)?]
        }
        AttentionChoice::Forward(attn::ForwardRoute::Tile(v)) => vec![tile(v)?],
        AttentionChoice::Backward(attn::BackwardRoute::Hopper(v)) => {
            let label = v.label();
            // A head-split main kernel leaves dK and dV to its combine kernel.
            let combine = if label.contains(" headsplit") {
                ", and its dK / dV combine kernel"
            } else {
                ""
            };
            // At head dim 256 the dQ kernel takes the finish kernel's place.
            let after = if label.contains(" dqkernel") {
                "the dQ kernel"
            } else {
                "finish kernels"
            };
            vec![PlannedKernel {
                label: format!("{label}, between its prepare and {after}{combine}"),
                source: None,
            }]
        }
        AttentionChoice::Backward(attn::BackwardRoute::Tile { dq, dkdv }) => {
            vec![tile(dq)?, tile(dkdv)?]
        }
    };
    Ok(OpPlan { kernels })
}

/// The kernels a decode call would run on `target`: the main kernel, and the split combiner
/// when the call splits the cache.
pub fn plan_attention_decode(target: &str, case: &DecodeCase) -> Result<OpPlan> {
    let arch = arch_for(target)?;
    if case.kv_heads == 0 || !case.q_heads.is_multiple_of(case.kv_heads) || case.context == 0 {
        return Err(Error::shape(format!("no decode problem: {case:?}")));
    }
    let elem = case.dtype.size_bytes();
    // The cache as the contiguous [B, Hkv, context, D] it holds, pages rounded up.
    let context = match case.page_size {
        Some(0) => return Err(Error::shape("pages of 0 tokens")),
        Some(page) => case.context.div_ceil(page).saturating_mul(page),
        None => case.context,
    };
    operands_fit(&[
        (&[case.batch, case.q_heads, case.head_dim], elem),
        (&[case.batch, case.kv_heads, context, case.head_dim], elem),
    ])?;
    decode::head_dim_supported(case.head_dim)?;
    let kernels = decode::planned_kernels(
        &arch,
        case.dtype,
        case.batch,
        case.q_heads,
        case.kv_heads,
        case.head_dim,
        case.context,
        case.page_size,
    )
    .into_iter()
    .map(|(label, kernel)| {
        let source = match arch.vendor {
            Vendor::Amd => Some(kernel.source(calico_hip::hip_headers())?),
            _ => None,
        };
        Ok(PlannedKernel { label, source })
    })
    .collect::<Result<Vec<_>>>()?;
    Ok(OpPlan { kernels })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::attention::gpu::{BackwardRoute, ForwardRoute, Kernel};

    fn arch(target: &str) -> Arch {
        Arch::for_target(target).unwrap()
    }

    #[test]
    fn row_ops_take_the_cdna_kernels_on_gfx9_and_the_portable_ones_elsewhere() {
        let bf = DType::BF16;
        for target in ["gfx942", "gfx90a"] {
            let a = arch(target);
            for op in [RowOp::RmsNorm, RowOp::AddLayerNorm] {
                let RowChoice::Norm(norm::NormKernel::Cdna(v)) =
                    row_choice(&a, op, &[65536, 4096], bf).unwrap()
                else {
                    panic!("{target} {op:?}: not the CDNA norm");
                };
                assert_eq!((v.plan.bytes, v.plan.group), (16, 128), "{v:?}");
                assert_eq!(v.layer, op == RowOp::AddLayerNorm);
            }
            let softmax = row_choice(&a, RowOp::Softmax, &[65536, 4096], bf).unwrap();
            assert!(matches!(
                softmax,
                RowChoice::Softmax(softmax::SoftmaxKernel::Cdna(_))
            ));
            let RowChoice::Rope(r) = row_choice(&a, RowOp::Rope, &[16, 1024, 32, 128], bf).unwrap()
            else {
                panic!("rope");
            };
            assert!(r.cdna && r.pairs == 8, "{r:?}");
            let plan = plan_row_op(target, RowOp::LayerNorm, &[64, 1024], bf).unwrap();
            assert!(plan.kernels[0].source.is_some());
        }
        let sm90 = arch("sm_90a");
        let RowChoice::Softmax(softmax::SoftmaxKernel::Portable(v)) =
            row_choice(&sm90, RowOp::Softmax, &[65536, 4096], bf).unwrap()
        else {
            panic!("sm_90a softmax");
        };
        assert_eq!((v.vec, v.align_body), (8, false));
        let RowChoice::Rope(r) = row_choice(&sm90, RowOp::Rope, &[16, 1024, 32, 128], bf).unwrap()
        else {
            panic!("rope");
        };
        assert!(!r.cdna);
        let plan = plan_row_op("sm_90a", RowOp::RmsNorm, &[64, 1024], bf).unwrap();
        assert!(plan.kernels[0].source.is_none());
    }

    /// Rows of 4097 bf16 are not whole dwords: the CDNA kernels decline them and the portable
    /// kernel reads each row's aligned body (x and y misaligned alike).
    #[test]
    fn odd_rows_take_the_portable_aligned_body_kernel_on_gfx942() {
        let a = arch("gfx942");
        for op in [RowOp::Softmax, RowOp::RmsNorm] {
            match row_choice(&a, op, &[4097, 4097], DType::BF16).unwrap() {
                RowChoice::Softmax(softmax::SoftmaxKernel::Portable(v)) => {
                    assert!(v.align_body && v.vec == 8)
                }
                RowChoice::Norm(norm::NormKernel::Portable(v)) => {
                    assert!(v.align_body && v.vec == 8)
                }
                other => panic!("{op:?}: {other:?}"),
            }
        }
        assert!(row_choice(&a, RowOp::Rope, &[1, 2, 3], DType::BF16).is_err());
        assert!(plan_row_op("tpu_v5", RowOp::Softmax, &[1, 8], DType::BF16).is_err());
    }

    fn case(backward: bool, head_dim: usize) -> AttentionCase {
        AttentionCase {
            dtype: DType::BF16,
            batch: 4,
            q_heads: 2048 / head_dim,
            kv_heads: 2048 / head_dim,
            seq: 4096,
            head_dim,
            causal: true,
            backward,
            varlen: false,
            softcap: None,
        }
    }

    #[test]
    fn attention_routes_per_target() {
        let fwd = |t: &str, d| attention_choice(&arch(t), &case(false, d)).unwrap();
        let bwd = |t: &str, d| attention_choice(&arch(t), &case(true, d)).unwrap();
        for t in ["gfx942", "gfx90a"] {
            assert!(matches!(
                fwd(t, 128),
                AttentionChoice::Forward(ForwardRoute::Cdna(_))
            ));
            let AttentionChoice::Backward(BackwardRoute::Tile { dq, dkdv }) = bwd(t, 64) else {
                panic!("{t} backward");
            };
            assert_eq!(
                (dq.kernel, dkdv.kernel),
                (Kernel::PortableDq, Kernel::PortableDkDv)
            );
        }
        assert!(matches!(
            fwd("sm_90a", 128),
            AttentionChoice::Forward(ForwardRoute::Hopper(_))
        ));
        assert!(matches!(
            bwd("sm_90a", 64),
            AttentionChoice::Backward(BackwardRoute::Hopper(_))
        ));
        // No wgmma on sm_80 or sm_100a: the tile kernels, K and V rows aligned.
        for t in ["sm_80", "sm_100a"] {
            let AttentionChoice::Forward(ForwardRoute::Tile(v)) = fwd(t, 128) else {
                panic!("{t} forward");
            };
            assert_eq!(v.kernel, Kernel::Forward { aligned: true });
        }
    }

    /// Head dims between the kernel widths (multiples of 8): the Hopper kernels on sm_90a (the
    /// backward up to 256), the sm_80 tile backward at the next width up to 128 elsewhere on
    /// NVIDIA (it was the portable kernel), the portable backward on AMD and above 128 off
    /// sm_90a; not a multiple of 8: the portable backward everywhere.
    #[test]
    fn padded_head_dims_take_the_matrix_kernels() {
        let bwd = |t: &str, d| attention_choice(&arch(t), &case(true, d)).unwrap();
        // Head dim 256 and those that run at it: the wide Hopper backward (dK and dV, then the
        // dQ kernel), padded below 256; the portable backward on sm_80.
        for d in [136, 192, 248, 256] {
            let AttentionChoice::Backward(BackwardRoute::Hopper(v)) = bwd("sm_90a", d) else {
                panic!("sm_90a d{d}: not the Hopper backward");
            };
            let label = v.label();
            assert!(
                label.contains(" d=256 ")
                    && label.contains(" dqkernel")
                    && !label.contains(" bulk"),
                "{label}"
            );
            assert_eq!(label.ends_with(" padded"), d != 256, "{label}");
            let plan = plan_attention("sm_90a", &case(true, d)).unwrap();
            assert!(
                plan.kernels[0].label.starts_with("hopper bwd Main"),
                "{plan:?}"
            );
            let AttentionChoice::Backward(BackwardRoute::Tile { dq, .. }) = bwd("sm_80", d) else {
                panic!("sm_80 d{d}");
            };
            assert_eq!(dq.kernel, Kernel::PortableDq, "sm_80 d{d}");
        }
        for d in [40, 96, 120] {
            assert!(
                matches!(
                    bwd("sm_90a", d),
                    AttentionChoice::Backward(BackwardRoute::Hopper(v)) if v.label().ends_with(" padded")
                ),
                "sm_90a d{d}"
            );
            for t in ["sm_80", "sm_100a"] {
                let AttentionChoice::Backward(BackwardRoute::Tile { dq, dkdv }) = bwd(t, d) else {
                    panic!("{t} d{d}");
                };
                let width = if d <= 64 { 64 } else { 128 };
                assert_eq!(dq.kernel, Kernel::BackwardDq { aligned: true }, "{t} d{d}");
                assert_eq!((dq.head_dim, dq.used_dim), (width, d), "{t} d{d}");
                assert_eq!((dkdv.head_dim, dkdv.used_dim), (width, d), "{t} d{d}");
            }
        }
        for t in ["sm_80", "gfx942"] {
            let AttentionChoice::Backward(BackwardRoute::Tile { dq, .. }) = bwd(t, 100) else {
                panic!("{t} d100");
            };
            assert_eq!(dq.kernel, Kernel::PortableDq, "{t} d100");
        }
    }

    /// The d = 128 forward takes 128-key blocks at long lengths, soft-capped or not (hopper.rs,
    /// block_n_chosen: since the stale-max softmax 176 keys no longer pay; the soft-capped
    /// 176-key variant spills as well), and only the capped one the soft-capped variant.
    #[test]
    fn d128_forwards_take_128_key_blocks_at_long_lengths() {
        if std::env::var_os("CALICO_ATTN_HOPPER_BN").is_some() {
            return;
        }
        let a = arch("sm_90a");
        let label = |softcap: Option<f32>| {
            let c = AttentionCase {
                batch: 2,
                seq: 8192,
                softcap,
                ..case(false, 128)
            };
            let AttentionChoice::Forward(ForwardRoute::Hopper(v)) =
                attention_choice(&a, &c).unwrap()
            else {
                panic!("not the Hopper forward");
            };
            v.label()
        };
        let plain = label(None);
        assert!(
            plain.contains("bn=128 ") && plain.contains("softcap=false"),
            "{plain}"
        );
        let capped = label(Some(30.0));
        assert!(
            capped.contains("bn=128 ") && capped.contains("softcap=true"),
            "{capped}"
        );
    }

    /// Packed sequences: the Hopper forward and backward take them on sm_90a (one batch of all
    /// the rows; the forward's block width by the mean sequence).
    #[test]
    fn packed_sequences_take_the_hopper_kernels() {
        let a = arch("sm_90a");
        let fwd = AttentionCase {
            varlen: true,
            batch: 8,
            seq: 2048,
            ..case(false, 128)
        };
        let AttentionChoice::Forward(ForwardRoute::Hopper(v)) = attention_choice(&a, &fwd).unwrap()
        else {
            panic!("not the Hopper forward");
        };
        assert!(v.label().contains("bn=128"), "{}", v.label());
        let bwd = AttentionCase {
            backward: true,
            ..fwd
        };
        let AttentionChoice::Backward(attn::BackwardRoute::Hopper(v)) =
            attention_choice(&a, &bwd).unwrap()
        else {
            panic!("not the Hopper backward");
        };
        assert!(v.label().ends_with(" varlen"), "{}", v.label());
    }

    /// The launch routes again without the Hopper kernel when TMA declines the views: the
    /// same router then picks the tile kernels.
    #[test]
    fn hopper_falls_back_to_the_tile_kernels_without_tma_views() {
        let a = arch("sm_90a");
        let c = case(false, 128);
        let (p, _, _) = attention_facts(&c).unwrap();
        let params =
            super::super::attention::check::params(&AttentionOptions::default(), 128).unwrap();
        let facts = attn::ForwardFacts {
            varlen: false,
            kv_rows_aligned: true,
            cdna_operands: true,
            tma_views: false,
        };
        let ForwardRoute::Tile(v) = attn::route_forward(&a, &p, &params, &facts) else {
            panic!("not the tile forward");
        };
        assert_eq!(v.kernel, Kernel::Forward { aligned: true });
    }

    /// The vendor-neutral tile forward takes what the vendor kernels decline (head dims that
    /// are multiples of 16 other than 64 / 128 / 256; on AMD also K / V rows the CDNA kernel
    /// cannot read), the scalar portable kernel the rest; CALICO_ATTN_FORWARD=tiles puts it
    /// first wherever it applies.
    #[test]
    fn vendor_neutral_tiles_take_what_the_vendor_kernels_decline() {
        let route = |t: &str, d: usize, aligned: bool, first: bool| {
            let (p, mut facts, _) = attention_facts(&case(false, d)).unwrap();
            facts.kv_rows_aligned &= aligned;
            facts.cdna_operands &= aligned;
            facts.tma_views &= aligned;
            let params =
                super::super::attention::check::params(&AttentionOptions::default(), d).unwrap();
            attn::route_forward_with(&arch(t), &p, &params, &facts, first)
        };
        for t in ["sm_80", "sm_90a", "sm_100a", "gfx90a", "gfx942"] {
            // sm_90a runs every multiple of 8 on the Hopper kernel (at 64, 128 or 256).
            let hopper = t == "sm_90a";
            for d in [16, 32, 96, 160, 192] {
                let r = route(t, d, true, false);
                let ok = if hopper {
                    matches!(r, ForwardRoute::Hopper(_))
                } else {
                    matches!(r, ForwardRoute::Tiles(v) if v.head_dim == d)
                };
                assert!(ok, "{t} d{d}: {r:?}");
            }
            // 72 (a multiple of 8, not of 16): the Hopper kernel on sm_90a, the sm_80 tile
            // kernel at width 128 on the other NVIDIA targets, the CDNA kernel at width 128 on
            // AMD.
            match route(t, 72, true, false) {
                ForwardRoute::Hopper(_) if hopper => {}
                ForwardRoute::Tile(v) if t.starts_with("sm_") && !hopper => {
                    assert_eq!(v.kernel, Kernel::Forward { aligned: true }, "{t} d72");
                    assert_eq!((v.head_dim, v.used_dim), (128, 72), "{t} d72");
                }
                ForwardRoute::Cdna(v) if t.starts_with("gfx") => {
                    assert_eq!((v.head_dim, v.used_dim), (128, 72), "{t} d72")
                }
                r => panic!("{t} d72: {r:?}"),
            }
            // Not a multiple of 8: the portable kernel everywhere.
            let ForwardRoute::Tile(v) = route(t, 100, true, false) else {
                panic!("{t} d100: not the portable kernel");
            };
            assert_eq!(v.kernel, Kernel::PortableForward, "{t} d100");
            for d in [64, 128, 256] {
                assert!(
                    matches!(route(t, d, true, true), ForwardRoute::Tiles(_)),
                    "{t} d{d} forced"
                );
            }
        }
        for t in ["gfx90a", "gfx942"] {
            assert!(
                matches!(route(t, 128, false, false), ForwardRoute::Tiles(_)),
                "{t}"
            );
        }
        let ForwardRoute::Tile(v) = route("sm_80", 128, false, false) else {
            panic!("sm_80 unaligned");
        };
        assert_eq!(v.kernel, Kernel::Forward { aligned: false });
        let plan = plan_attention("gfx942", &case(false, 96)).unwrap();
        assert!(plan.kernels[0].label.starts_with("tiles fwd"), "{plan:?}");
        assert!(plan.kernels[0].source.is_some());
    }

    #[test]
    fn decode_plans_name_the_main_kernel_and_the_combiner_when_split() {
        let c = DecodeCase {
            dtype: DType::BF16,
            batch: 1,
            q_heads: 32,
            kv_heads: 8,
            head_dim: 128,
            context: 32768,
            page_size: Some(16),
        };
        let amd = plan_attention_decode("gfx942", &c).unwrap();
        assert!(amd.kernels[0].label.starts_with("decode lanes"), "{amd:?}");
        assert!(amd.kernels.iter().all(|k| k.source.is_some()));
        assert_eq!(amd.kernels.len(), 2, "one sequence of 32k tokens is split");
        let nv = plan_attention_decode("sm_90a", &c).unwrap();
        assert!(nv.kernels[0].label.starts_with("decode mma"), "{nv:?}");
        assert!(nv.kernels.iter().all(|k| k.source.is_none()));
        // Head dims between the widths take the same kernels at the next width.
        let c96 = DecodeCase { head_dim: 96, ..c };
        let d96 = plan_attention_decode("sm_90a", &c96).unwrap();
        assert!(d96.kernels[0].label.starts_with("decode mma"), "{d96:?}");
        let d96 = plan_attention_decode("gfx942", &c96).unwrap();
        assert!(d96.kernels[0].label.starts_with("decode lanes"), "{d96:?}");
        assert!(
            d96.kernels[1].label.starts_with("decode combine"),
            "{d96:?}"
        );
        for bad_dim in [100, 264] {
            let bad = DecodeCase {
                head_dim: bad_dim,
                ..c
            };
            assert!(plan_attention_decode("sm_90a", &bad).is_err());
        }
    }

    /// A device buffer at a fixed address (nothing behind it: only the routers look).
    #[derive(Debug)]
    struct At(u64, usize);

    impl calico_core::Storage for At {
        fn device_id(&self) -> calico_core::DeviceId {
            calico_core::DeviceId {
                kind: calico_core::BackendKind::Hip,
                ordinal: 0,
            }
        }
        fn size_bytes(&self) -> usize {
            self.1
        }
        fn write_bytes(&self, _: usize, _: &[u8]) -> Result<()> {
            Ok(())
        }
        fn read_bytes(&self, _: usize, _: &mut [u8]) -> Result<()> {
            Ok(())
        }
        fn device_address(&self) -> Option<u64> {
            Some(self.0)
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }

    /// The `i`-th buffer of a call, contiguous, at a 256-byte aligned address other than the
    /// planner's (as an allocator hands them out).
    fn tensor(i: u64, shape: &[usize], dtype: DType) -> calico_core::Tensor {
        let bytes = shape.iter().product::<usize>() * dtype.size_bytes();
        let storage = std::sync::Arc::new(At(0x7f00_0000_0000 + i * 0x1_0000_0100, bytes));
        calico_core::Tensor::from_storage(storage, dtype, calico_core::Layout::contiguous(shape))
            .unwrap()
    }

    /// The planner's choice equals the one the launch makes from the geometry of a call's
    /// tensors (the same `choose`, fed through `NormGeometry::of`, `RopeGeometry::of` and
    /// `rows::operand`), on every target and for the bench's shapes and odd ones.
    #[test]
    fn row_plans_match_the_launch_geometry_of_real_tensors() {
        let bf = DType::BF16;
        for target in ["gfx942", "gfx90a", "sm_90a", "sm_80", "sm_100a"] {
            let a = arch(target);
            for shape in [[65536usize, 4096], [4097, 4097], [64, 1000], [8, 100_000]] {
                let [_, cols] = shape;
                let x = tensor(0, &shape, bf);
                let residual = tensor(1, &shape, bf);
                let (weight, bias) = (tensor(2, &[cols], bf), tensor(3, &[cols], bf));
                let (y, sum) = (tensor(4, &shape, bf), tensor(5, &shape, bf));
                for op in [
                    RowOp::RmsNorm,
                    RowOp::AddRmsNorm,
                    RowOp::LayerNorm,
                    RowOp::AddLayerNorm,
                ] {
                    let layer = matches!(op, RowOp::LayerNorm | RowOp::AddLayerNorm);
                    let add = matches!(op, RowOp::AddRmsNorm | RowOp::AddLayerNorm);
                    let g = norm::NormGeometry::of(
                        &x,
                        add.then_some(&residual),
                        Some(&weight),
                        layer.then_some(&bias),
                        &y,
                        add.then_some(&sum),
                    )
                    .unwrap();
                    let launched = RowChoice::Norm(norm::choose(&a, bf, layer, &g));
                    let planned = row_choice(&a, op, &shape, bf).unwrap();
                    assert_eq!(planned, launched, "{target} {op:?} {shape:?}");
                }
                let (xs, ys) = (
                    crate::gpu::rows::operand(&x).unwrap(),
                    crate::gpu::rows::operand(&y).unwrap(),
                );
                let launched = RowChoice::Softmax(softmax::choose(&a, bf, shape[0], cols, xs, ys));
                let planned = row_choice(&a, RowOp::Softmax, &shape, bf).unwrap();
                assert_eq!(planned, launched, "{target} softmax {shape:?}");
            }
            for dims in [[16usize, 1024, 32, 128], [1, 7, 3, 6], [2, 5, 4, 64]] {
                let [_, s, _, d] = dims;
                let x = tensor(0, &dims, bf);
                let table = [s, d / 2];
                let (cos, sin) = (tensor(1, &table, DType::F32), tensor(2, &table, DType::F32));
                let y = tensor(3, &dims, bf);
                let g = rope::RopeGeometry::of(&x, &cos, &sin, &y).unwrap();
                let launched = RowChoice::Rope(rope::choose(&a, bf, RopeMode::HalfSplit, &g));
                let planned = row_choice(&a, RowOp::Rope, &dims, bf).unwrap();
                assert_eq!(planned, launched, "{target} rope {dims:?}");
            }
        }
    }

    /// The attention planner sees the facts the launch derives from a call's tensors (TMA
    /// views aside: the launch presumes them and asks `view_map`, which needs the driver).
    #[test]
    fn attention_facts_match_the_launch_facts_of_real_tensors() {
        for d in [64usize, 128, 96, 36] {
            let c = AttentionCase {
                head_dim: d,
                q_heads: 8,
                kv_heads: 2,
                ..case(false, 64)
            };
            let (p, forward, backward) = attention_facts(&c).unwrap();
            let q_shape = [c.batch, c.q_heads, c.seq, d];
            let kv_shape = [c.batch, c.kv_heads, c.seq, d];
            let (q, o, d_o) = (
                tensor(0, &q_shape, c.dtype),
                tensor(1, &q_shape, c.dtype),
                tensor(2, &q_shape, c.dtype),
            );
            let (k, v) = (tensor(3, &kv_shape, c.dtype), tensor(4, &kv_shape, c.dtype));
            let launched = attn::ForwardFacts::of(&p, &k, &v, false);
            let presumed = attn::ForwardFacts {
                tma_views: true,
                ..forward
            };
            assert_eq!(presumed, launched, "d{d}");
            let launched = attn::BackwardFacts::of([&q, &k, &v, &o, &d_o], false, false);
            let presumed = attn::BackwardFacts {
                tma_views: true,
                ..backward
            };
            assert_eq!(presumed, launched, "d{d}");
        }
    }
}
