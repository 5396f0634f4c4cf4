//! `calico bench --dry-run TARGET`: what the benchmark's GEMM cases would run on a target that
//! is not here (the router's choice for each shape, compiled offline) and, on AMD targets, each
//! kernel's registers, LDS, scratch and occupancy. Nothing runs on a device.

use calico::{catalog, DType, Error, Result};
use calico_benches::cases::{gemm_specs, Profile};

pub fn run(target: &str, quick: bool) -> Result<()> {
    let profile = if quick { Profile::Quick } else { Profile::Full };
    let mut rows = Vec::new();
    let mut compiled: Vec<(String, Vec<catalog::KernelResources>)> = Vec::new();
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
        let resources = match &plan.source {
            Some(source) => match compiled
                .iter()
                .find(|(digest, _)| *digest == source.digest_hex())
            {
                Some((_, r)) => Some(r.clone()),
                None => {
                    let binary = catalog::compile(target, source)?;
                    let r = catalog::resources(target, &binary)?.unwrap_or_default();
                    compiled.push((source.digest_hex(), r.clone()));
                    Some(r)
                }
            },
            None => None,
        };
        println!("{}: {:?} kernel", spec.name(), plan.kernel);
        for k in resources.iter().flatten() {
            println!("    {}", k.summary());
            rows.push((spec.name(), k.clone()));
        }
    }
    if rows.is_empty() {
        println!(
            "(resources are listed for AMD targets; see `calico compile --disasm` for NVIDIA)"
        );
        return Ok(());
    }
    println!();
    crate::compile::print_resources(&rows);
    if rows.iter().any(|(_, k)| k.uses_scratch()) {
        return Err(Error::unsupported(format!(
            "a GEMM kernel for {target} uses scratch memory (spills)"
        )));
    }
    Ok(())
}
