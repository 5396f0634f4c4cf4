//! `calico bench --dry-run TARGET` (or `calico-bench --dry-run TARGET`): what the benchmark's
//! cases (GEMM, the row ops, attention forward and backward, attention decode) would run on a
//! target that is not here (each router's choice, compiled offline once per distinct source)
//! and, on AMD targets, each kernel's registers, LDS, scratch and occupancy. Nothing runs on a
//! device.

use crate::accounting::MemOp;
use crate::cases::{decode, gemm_specs, memory_specs, Profile};
use calico::ops::{self, AttentionCase, DecodeCase, PlannedKernel, RowOp};
use calico::{catalog, DType, Error, KernelSource, Result};

/// Compiles each distinct source once (by digest) and keeps its resources.
struct Compiled<'a> {
    target: &'a str,
    by_digest: Vec<(String, Vec<catalog::KernelResources>)>,
}

impl Compiled<'_> {
    fn resources(&mut self, source: &KernelSource) -> Result<Vec<catalog::KernelResources>> {
        let digest = source.digest_hex();
        if let Some((_, r)) = self.by_digest.iter().find(|(d, _)| *d == digest) {
            return Ok(r.clone());
        }
        let binary = catalog::compile(self.target, source)?;
        let r = catalog::resources(self.target, &binary)?.unwrap_or_default();
        self.by_digest.push((digest, r.clone()));
        Ok(r)
    }
}

fn row_op(op: MemOp) -> RowOp {
    match op {
        MemOp::RmsNorm => RowOp::RmsNorm,
        MemOp::AddRmsNorm => RowOp::AddRmsNorm,
        MemOp::LayerNorm => RowOp::LayerNorm,
        MemOp::AddLayerNorm => RowOp::AddLayerNorm,
        MemOp::Softmax => RowOp::Softmax,
        MemOp::Rope => RowOp::Rope,
    }
}

pub fn run(target: &str, quick: bool) -> Result<()> {
    let profile = if quick { Profile::Quick } else { Profile::Full };
    let mut compiled = Compiled {
        target,
        by_digest: Vec::new(),
    };
    let mut rows: Vec<(String, catalog::KernelResources)> = Vec::new();
    let mut list = |case: String, kernels: Vec<PlannedKernel>| -> Result<()> {
        for k in kernels {
            println!("{case}: {}", k.label);
            if let Some(source) = &k.source {
                // A code object may hold several entry points: keep the one launched.
                let all = compiled.resources(source)?;
                let launched: Vec<_> = all.iter().filter(|r| r.name == source.entry).collect();
                let shown = if launched.is_empty() {
                    all.iter().collect()
                } else {
                    launched
                };
                for r in shown {
                    println!("    {}", r.summary());
                    rows.push((format!("{case}: {}", r.name), r.clone()));
                }
            }
        }
        Ok(())
    };
    println!("==== calico bench --dry-run {target}: nothing is timed");
    for spec in gemm_specs(true, profile) {
        // The bench multiplies bf16 activations by an N x K bf16 weight into bf16.
        let plan = calico::gemm::plan_dense(
            target,
            (spec.m, spec.n, spec.k),
            DType::BF16,
            DType::BF16,
            true,
        )?;
        let kernel = PlannedKernel {
            label: {
                let mut label = format!("{:?} kernel", plan.kernel);
                if let Some((along_m, at)) = plan.wave_cut {
                    let what = if along_m { "rows" } else { "columns" };
                    label += &format!(", cut at a wave: {what} {at}.. launched after");
                }
                if plan.k_splits > 1 {
                    label += &format!(", K in {} pieces", plan.k_splits);
                }
                if plan.split_fused {
                    label += " summed in the kernel";
                }
                label
            },
            source: plan.source,
        };
        list(spec.name(), vec![kernel])?;
    }
    for spec in memory_specs(true, profile) {
        let plan = ops::plan_row_op(target, row_op(spec.op), &spec.shape, DType::BF16)?;
        list(spec.name(), plan.kernels)?;
    }
    for spec in crate::attention::specs(true, profile) {
        let case = AttentionCase {
            dtype: DType::BF16,
            batch: spec.batch(),
            q_heads: spec.heads(),
            kv_heads: spec.kv_heads(),
            seq: spec.seq,
            head_dim: spec.head_dim,
            causal: spec.causal,
            backward: spec.backward,
            varlen: spec.varlen,
            softcap: spec.softcap,
        };
        list(spec.name(), ops::plan_attention(target, &case)?.kernels)?;
    }
    for spec in decode::decode_specs(true, profile) {
        let case = DecodeCase {
            dtype: DType::BF16,
            batch: spec.batch,
            q_heads: decode::QUERY_HEADS,
            kv_heads: decode::KV_HEADS,
            head_dim: spec.head_dim,
            context: spec.context,
            page_size: spec.page_size,
        };
        list(
            spec.name(),
            ops::plan_attention_decode(target, &case)?.kernels,
        )?;
    }
    if rows.is_empty() {
        println!(
            "(resources are listed for AMD targets; see `calico compile --disasm` for NVIDIA)"
        );
        return Ok(());
    }
    println!();
    print!("{}", catalog::KernelResources::table(&rows));
    let spilling: Vec<&str> = rows
        .iter()
        .filter(|(_, k)| k.uses_scratch())
        .map(|(case, _)| case.as_str())
        .collect();
    if !spilling.is_empty() {
        return Err(Error::unsupported(format!(
            "kernels for {target} use scratch memory (spills): {}",
            spilling.join(", ")
        )));
    }
    Ok(())
}
