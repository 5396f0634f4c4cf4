//! `calico-bench --dry-run TARGET` plans without a device, like `calico bench --dry-run`: it
//! must never fall through to timing the device at hand and overwriting its report.

use std::process::Command;

fn calico_bench() -> Command {
    calico_benches::gpu_bundle::binary(env!("CARGO_BIN_EXE_calico-bench"), "calico-bench")
}

#[test]
fn calico_bench_honours_dry_run_and_writes_nothing() {
    let out = std::env::temp_dir().join(format!("calico-dry-run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    // An unknown target: the dry run's own error, reached without compiling anything.
    let run = calico_bench()
        .args(["--dry-run", "no_such_gpu", "--quick", "--out"])
        .arg(&out)
        .output()
        .expect("calico-bench runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        !run.status.success(),
        "exit {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        run.status
    );
    assert!(
        stdout.contains("--dry-run no_such_gpu: nothing is timed"),
        "stdout:\n{stdout}"
    );
    assert!(
        stderr.contains("unknown target `no_such_gpu`"),
        "stderr:\n{stderr}"
    );
    assert!(
        !out.exists(),
        "a dry run wrote {} (the suite ran instead)",
        out.display()
    );
}
