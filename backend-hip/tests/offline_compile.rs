//! Compiles Calico device code for CDNA targets with Debian's clang-19 (no GPU, no ROCm) and
//! checks the instructions the headers exist for. Skips when clang-19 is absent, unless CI=true.

use calico_core::{Error, KernelSource};
use calico_hip::{compile_offline, disassemble, hip_headers};

const KERNEL: &str = include_str!("kernels/calico_test.hip");

fn clang_present() -> bool {
    calico_hip::require_clang().is_ok()
}

fn skip_or_fail(what: &str) -> bool {
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{what} not found and CI=true");
    }
    println!("skipped: {what} not found");
    true
}

fn source() -> KernelSource {
    KernelSource::assemble(
        "scale_bf16",
        KERNEL,
        &[hip_headers(), calico_core::device_headers()],
        &[],
    )
    .unwrap()
}

#[test]
fn cdna_kernels_use_permutes_and_16_byte_loads() {
    if !clang_present() && skip_or_fail("clang-19") {
        return;
    }
    let src = source();
    for target in ["gfx90a", "gfx942", "gfx942:sramecc+:xnack-"] {
        let code = compile_offline(&src, target).unwrap_or_else(|e| panic!("{target}: {e}"));
        assert_eq!(&code[..4], b"\x7fELF", "{target}: a code object");
        let asm = disassemble(&code).unwrap();
        for entry in ["scale_bf16", "scale_f16", "scale_f32", "copy_buffer_bf16"] {
            assert!(
                asm.contains(&format!("<{entry}>:")),
                "{target}: {entry} missing"
            );
        }
        assert!(asm.contains("ds_bpermute_b32"), "{target}: no ds_bpermute");
        assert!(
            asm.contains("quad_perm"),
            "{target}: no DPP quad permute for the xor-1/2 steps"
        );
        assert!(
            asm.contains("global_load_dwordx4"),
            "{target}: no 16-byte global load"
        );
        assert!(
            asm.contains("global_store_dwordx4"),
            "{target}: no 16-byte global store"
        );
        assert!(
            asm.contains("buffer_load_dwordx4"),
            "{target}: no 16-byte buffer load"
        );
        assert!(
            asm.contains("buffer_store_dwordx4"),
            "{target}: no 16-byte buffer store"
        );
        assert!(asm.contains("s_barrier"), "{target}: no barrier");
        assert!(
            asm.contains("v_exp_f32") && asm.contains("v_rsq_f32"),
            "{target}: no fast exp2/rsqrt"
        );
    }
}

#[test]
fn reductions_span_all_64_lanes() {
    if !clang_present() && skip_or_fail("clang-19") {
        return;
    }
    // A wave64 butterfly has 6 steps (masks 32..1): 4 through ds_bpermute, 2 through DPP.
    let src = KernelSource::assemble(
        "r",
        "#include \"calico/calico.h\"\nCALICO_KERNEL void r(float* p) { p[calico::thread_x()] = calico::warp_sum(p[calico::thread_x()]); }\n",
        &[hip_headers(), calico_core::device_headers()],
        &[],
    )
    .unwrap();
    let asm = disassemble(&compile_offline(&src, "gfx942").unwrap()).unwrap();
    assert_eq!(asm.matches("ds_bpermute_b32").count(), 4, "{asm}");
    assert_eq!(asm.matches("quad_perm").count(), 2, "{asm}");
}

#[test]
fn a_broken_kernel_reports_the_compiler_log() {
    if !clang_present() && skip_or_fail("clang-19") {
        return;
    }
    let src = KernelSource::assemble(
        "bad",
        "CALICO_KERNEL void bad() { undefined_thing(); }\n",
        &[],
        &[],
    )
    .unwrap();
    match compile_offline(&src, "gfx942") {
        Err(Error::Compile { entry, target, log }) => {
            assert_eq!((entry.as_str(), target.as_str()), ("bad", "gfx942"));
            assert!(log.contains("error"), "{log}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn a_missing_tool_is_backend_unavailable() {
    // Runs the tool lookup through a path that cannot exist, without touching the env of
    // other tests: the env var is read per call, so use a child process instead.
    if std::env::var_os("CALICO_HIP_CHILD").is_some() {
        let err = compile_offline(&source(), "gfx942").unwrap_err();
        assert!(
            matches!(&err, Error::BackendUnavailable { reason, .. } if reason.contains("/nonexistent/clang-19")),
            "{err}"
        );
        let err = disassemble(b"\x7fELF").unwrap_err();
        assert!(
            matches!(&err, Error::BackendUnavailable { reason, .. } if reason.contains("/nonexistent/objdump")),
            "{err}"
        );
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let status = std::process::Command::new(exe)
        .args([
            "--exact",
            "a_missing_tool_is_backend_unavailable",
            "--nocapture",
        ])
        .env("CALICO_HIP_CHILD", "1")
        .env("CALICO_CLANG", "/nonexistent/clang-19")
        .env("CALICO_LLVM_OBJDUMP", "/nonexistent/objdump")
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn bad_targets_are_rejected_before_running_clang() {
    assert!(matches!(
        compile_offline(&source(), "gfx942; rm -rf /"),
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(
        compile_offline(&source(), ""),
        Err(Error::Unsupported(_))
    ));
}

/// The CDNA primitives compile to the instructions they exist for: every MFMA shape (fp8 on
/// gfx942 only), s_setprio, buffer loads straight into LDS, and ds_read_b64 tile reads; no
/// scratch memory.
#[test]
fn cdna_primitives_reach_the_matrix_cores_and_lds() {
    if !clang_present() && skip_or_fail("clang-19") {
        return;
    }
    const PRIMITIVES: &str = include_str!("kernels/cdna_primitives.hip");
    let src = KernelSource::assemble(
        "mfma_shapes",
        PRIMITIVES,
        &[hip_headers(), calico_core::device_headers()],
        &[],
    )
    .unwrap();
    for target in ["gfx90a", "gfx942"] {
        let asm = disassemble(&compile_offline(&src, target).unwrap()).unwrap();
        // gfx90a spells the 16-bit ones ..._16x16x16bf16_1k, gfx942 ..._16x16x16_bf16.
        for shape in ["16x16x16", "32x32x8"] {
            for dtype in ["bf16", "f16"] {
                let found = asm
                    .lines()
                    .any(|l| l.contains(&format!("v_mfma_f32_{shape}")) && l.contains(dtype));
                assert!(found, "{target}: no {shape} {dtype} MFMA");
            }
        }
        let fp8 = asm.contains("v_mfma_f32_16x16x32_fp8_fp8");
        assert_eq!(fp8, target == "gfx942", "{target}: fp8 MFMA only on CDNA3");
        assert!(asm.contains("s_setprio 1"), "{target}: no s_setprio");
        assert!(
            asm.lines()
                .any(|l| l.contains("buffer_load_dword") && l.trim_end().contains(" lds")),
            "{target}: no buffer load into LDS"
        );
        assert!(
            asm.contains("ds_read_b64"),
            "{target}: no 8-byte LDS tile read"
        );
        assert!(!asm.contains("scratch_"), "{target}: scratch (spills)");
    }
}
