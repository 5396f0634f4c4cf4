//! `calico compile --disasm` must fail loudly when its compiler is missing: a non-zero exit
//! and a closing count of compiled and failed variants.

mod common;

use common::calico;

#[test]
fn a_missing_compiler_makes_disasm_exit_non_zero_with_the_counts() {
    // The HIP path compiles with $CALICO_CLANG; pointing it at nothing fails every variant
    // on any machine, whether or not clang-19 is installed.
    let out = calico()
        .args(["compile", "--op", "softmax", "--target", "gfx942"])
        .args(["--disasm", "--no-source"])
        .env("CALICO_CLANG", "/nonexistent/clang-for-calico-test")
        .output()
        .expect("the calico binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "exit {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    assert!(stdout.contains("FAILED"), "stdout:\n{stdout}");
    assert!(
        stderr.contains("variants compiled") && stderr.contains("failed"),
        "stderr:\n{stderr}"
    );
    assert!(
        !stderr.contains(" 0 failed"),
        "a failing run must not claim zero failures:\n{stderr}"
    );
}

#[test]
fn printing_sources_without_compiling_succeeds() {
    let out = calico()
        .args(["compile", "--op", "softmax", "--target", "gfx942"])
        .env("CALICO_CLANG", "/nonexistent/clang-for-calico-test")
        .output()
        .expect("the calico binary runs");
    assert!(
        out.status.success(),
        "stderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("===="));
}
