//! `calico compile`: the catalog's kernel variants of one op for one target, as source and,
//! optionally, disassembly with counts of the instructions the kernels exist for and (on AMD
//! targets) each kernel's registers, LDS, scratch and occupancy.

use calico::{catalog, Error, Result};

#[derive(Debug, Clone, clap::Args)]
pub struct CompileArgs {
    /// Op name (`calico::catalog::OPS`): rms_norm, layer_norm, softmax, rope, gemm, attention_decode, ...
    #[arg(long)]
    pub op: String,
    /// Compile target: sm_80, sm_90a, gfx90a, gfx942, ...
    #[arg(long)]
    pub target: String,
    /// Compile each variant (NVRTC or clang, no device needed) and print its disassembly.
    #[arg(long)]
    pub disasm: bool,
    /// Only variants whose label contains this substring.
    #[arg(long)]
    pub label: Option<String>,
    /// Skip printing the source text.
    #[arg(long)]
    pub no_source: bool,
}

/// The instructions worth counting per vendor.
pub fn key_instructions(target: &str) -> &'static [&'static str] {
    if target.starts_with("gfx") {
        &["v_mfma", "buffer_load", "global_load_dwordx4"]
    } else {
        &["HGMMA", "UTMALDG", "UTMASTG", "HMMA", "LDGSTS"]
    }
}

/// How many lines of `disasm` mention each of `keys`.
pub fn count_instructions(disasm: &str, keys: &[&str]) -> Vec<usize> {
    keys.iter()
        .map(|k| disasm.lines().filter(|l| l.contains(k)).count())
        .collect()
}

/// The closing line of `--disasm`: how many variants compiled and how many failed. `Err` (the
/// command exits non-zero) when any failed, so a missing compiler cannot pass for success.
pub fn verdict(op: &str, target: &str, compiled: usize, failed: usize) -> Result<String> {
    let line = format!(
        "{op} on {target}: {compiled} of {} variants compiled, {failed} failed",
        compiled + failed
    );
    if failed == 0 {
        Ok(line)
    } else {
        Err(Error::Compile {
            entry: format!("{op} variants"),
            target: target.to_string(),
            log: format!("{line} (each failure is printed above)"),
        })
    }
}

/// `Ok(())` when every variant printed (and, with `--disasm`, compiled); else the error that
/// says how many failed.
pub fn run(args: &CompileArgs) -> Result<()> {
    let entries = catalog::entries(&args.target, Some(&args.op))?;
    let entries: Vec<_> = entries
        .into_iter()
        .filter(|e| args.label.as_deref().is_none_or(|l| e.label.contains(l)))
        .collect();
    if entries.is_empty() {
        return Err(Error::unsupported(format!(
            "no {} variant for {} matches the label filter {:?}",
            args.op, args.target, args.label
        )));
    }
    let keys = key_instructions(&args.target);
    let mut summary = Vec::new();
    let mut resources = Vec::new();
    for e in &entries {
        println!(
            "==== {} [{}] entry {} ({} bytes of source)",
            e.op,
            e.label,
            e.source.entry,
            e.source.text.len()
        );
        if !args.no_source {
            println!("{}", e.source.text);
        }
        if !args.disasm {
            continue;
        }
        let result = catalog::compile(&args.target, &e.source).and_then(|bin| {
            let text = catalog::disassemble(&args.target, &bin)?;
            Ok((text, catalog::resources(&args.target, &bin)?))
        });
        match result {
            Ok((text, kernels)) => {
                println!("---- disassembly of {} [{}]", e.op, e.label);
                println!("{text}");
                for k in kernels.iter().flatten() {
                    println!("---- resources: {}", k.summary());
                }
                resources.extend(kernels.into_iter().flatten().map(|k| (e.label.clone(), k)));
                summary.push((e.label.clone(), Ok(count_instructions(&text, keys))));
            }
            Err(err) => {
                eprintln!("---- {} [{}] failed: {err}", e.op, e.label);
                summary.push((e.label.clone(), Err(err.to_string())));
            }
        }
    }
    if args.disasm {
        println!(
            "\n==== {} on {}: instruction counts (lines mentioning each)",
            args.op, args.target
        );
        let width = summary
            .iter()
            .map(|(l, _)| l.len())
            .max()
            .unwrap_or(7)
            .max(7);
        let header: Vec<String> = keys.iter().map(|k| format!("{k:>20}")).collect();
        println!("{:<width$} {}", "variant", header.join(""));
        for (label, counts) in &summary {
            match counts {
                Ok(c) => {
                    let cells: Vec<String> = c.iter().map(|n| format!("{n:>20}")).collect();
                    println!("{label:<width$} {}", cells.join(""));
                }
                Err(e) => {
                    let line: String = e.lines().next().unwrap_or("").chars().take(100).collect();
                    println!("{label:<width$} FAILED: {line}")
                }
            }
        }
        if !resources.is_empty() {
            println!(
                "\n==== {} on {}: resources per kernel",
                args.op, args.target
            );
            print!("{}", calico::catalog::KernelResources::table(&resources));
        }
        let failed = summary.iter().filter(|(_, c)| c.is_err()).count();
        println!(
            "\n{}",
            verdict(&args.op, &args.target, summary.len() - failed, failed)?
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_failed_variant_is_an_error_that_counts_both() {
        let all = verdict("gemm", "sm_90a", 5, 0).unwrap();
        assert!(all.contains("5 of 5 variants compiled, 0 failed"), "{all}");
        let err = verdict("gemm", "sm_90a", 3, 2).unwrap_err().to_string();
        assert!(err.contains("3 of 5 variants compiled, 2 failed"), "{err}");
        let none = verdict("softmax", "gfx942", 0, 4).unwrap_err().to_string();
        assert!(
            none.contains("0 of 4 variants compiled, 4 failed"),
            "{none}"
        );
    }

    #[test]
    fn counts_per_vendor() {
        let sass = "  HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4]\n  UTMALDG.2D [UR8], [UR10]\n  HGMMA.64x128x16 R24\n  UTMASTG.3D [UR4], [UR6]\n";
        assert_eq!(
            count_instructions(sass, key_instructions("sm_90a")),
            vec![2, 1, 1, 0, 0]
        );
        let gcn = "v_mfma_f32_16x16x16_bf16 a[0:3]\nbuffer_load_dwordx4 v[0:3]\nglobal_load_dwordx4 v[4:7]\n";
        assert_eq!(
            count_instructions(gcn, key_instructions("gfx942")),
            vec![1, 1, 1]
        );
    }
}
