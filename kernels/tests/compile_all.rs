//! Compiles every kernel variant for sm_80, sm_90a (NVRTC) and gfx90a, gfx942 (clang), with no
//! GPU. A missing toolchain is reported as skipped, except under CI=true, where it fails.

use calico::catalog;

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Skips (or, in CI, fails) when `available` is an error.
fn toolchain_or_skip(what: &str, available: Result<(), String>) -> bool {
    match available {
        Ok(()) => true,
        Err(why) if in_ci() => panic!("{what}: toolchain missing in CI: {why}"),
        Err(why) => {
            println!("skipped: {what}: {why}");
            false
        }
    }
}

fn nvrtc_available() -> Result<(), String> {
    calico_cuda::probe::require_nvrtc().map_err(|e| format!("nvrtc not found ({e})"))?;
    if calico_cuda::nvrtc::include_dirs().is_empty() {
        return Err("CUDA headers not found (set CUDA_HOME)".into());
    }
    Ok(())
}

fn clang_available() -> Result<(), String> {
    let clang = calico_hip::clang_path();
    match std::process::Command::new(&clang).arg("--version").output() {
        Ok(out) if out.status.success() => Ok(()),
        _ => Err(format!(
            "{clang} not found (install clang-19, lld-19, llvm-19 or set CALICO_CLANG)"
        )),
    }
}

fn compile_target(target: &str) {
    let entries = catalog::entries(target, None).expect("catalog assembles");
    assert!(!entries.is_empty());
    let mut failures = Vec::new();
    for e in &entries {
        if let Err(err) = catalog::compile(target, &e.source) {
            failures.push(format!("{} [{}]: {err}", e.op, e.label));
        }
    }
    println!(
        "{target}: {} variants compiled, {} failed",
        entries.len() - failures.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{target}:\n{}", failures.join("\n\n"));
}

#[test]
fn every_kernel_compiles_for_sm80_and_sm90a() {
    if toolchain_or_skip("sm_80/sm_90a", nvrtc_available()) {
        compile_target("sm_80");
        compile_target("sm_90a");
    }
}

#[test]
fn every_kernel_compiles_for_gfx90a_and_gfx942() {
    if toolchain_or_skip("gfx90a/gfx942", clang_available()) {
        compile_target("gfx90a");
        compile_target("gfx942");
    }
}

/// The Hopper GEMM is what it claims to be: wgmma (HGMMA) fed by the tensor memory
/// accelerator (UTMALDG), as `calico compile --op gemm --target sm_90a --disasm` shows a user.
#[test]
fn hopper_gemm_disassembles_to_hgmma_and_utmaldg() {
    if !toolchain_or_skip("sm_90a disassembly", nvrtc_available()) {
        return;
    }
    let entries: Vec<_> = catalog::entries("sm_90a", Some("gemm"))
        .expect("catalog assembles")
        .into_iter()
        .filter(|e| e.label.starts_with("hopper"))
        .collect();
    assert!(
        !entries.is_empty(),
        "the sm_90a catalog has Hopper GEMM variants"
    );
    for e in &entries {
        let cubin = catalog::compile("sm_90a", &e.source).expect("compiles");
        let sass = match catalog::disassemble("sm_90a", &cubin) {
            Ok(s) => s,
            Err(err) => {
                // Reports "skipped" (or fails under CI=true): the disassembler is missing.
                toolchain_or_skip("cuobjdump", Err(err.to_string()));
                return;
            }
        };
        let hgmma = calico_cuda::disasm::count_opcode(&sass, "HGMMA");
        let utmaldg = calico_cuda::disasm::count_opcode(&sass, "UTMALDG");
        println!("{}: {hgmma} HGMMA, {utmaldg} UTMALDG", e.label);
        assert!(
            hgmma > 0 && utmaldg > 0,
            "{}: {hgmma} HGMMA, {utmaldg} UTMALDG",
            e.label
        );
    }
}
