//! Which backends the suite runs on, and how it says which it could not.

use calico::{BackendKind, Device};
use std::io::Write;
use std::sync::OnceLock;

/// Every backend that opens (the CPU always does), and `"kind: reason"` for each that did not.
/// Opened once per test binary: opening a GPU context per proptest case would dominate.
pub fn backends() -> (Vec<Device>, Vec<String>) {
    static FOUND: OnceLock<(Vec<Device>, Vec<String>)> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let mut devices = Vec::new();
            let mut skipped = Vec::new();
            for kind in [BackendKind::Cuda, BackendKind::Hip, BackendKind::Cpu] {
                match Device::open(kind, 0) {
                    Ok(dev) => devices.push(dev),
                    Err(e) => skipped.push(format!("{kind}: {e}")),
                }
            }
            (devices, skipped)
        })
        .clone()
}

/// Writes one line per skipped backend to stderr directly (not through `eprintln!`, which the
/// test harness captures), so a run without a GPU never reads as if it covered one.
pub fn report_skipped(test: &str) {
    let (devices, skipped) = backends();
    let names: Vec<&str> = devices.iter().map(|d| d.kind().name()).collect();
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "[{test}] running on: {}", names.join(", "));
    for s in &skipped {
        let _ = writeln!(err, "[{test}] skipped backend {s}");
    }
}

/// The GPU backends that opened, after [`report_skipped`]; with none, one line on stderr
/// (directly, as `report_skipped` writes) says that `what` was not run, so a GPU-only test
/// that passes on a machine without a GPU never reads as if it had covered one.
pub fn gpu_backends(test: &str, what: &str) -> Vec<Device> {
    report_skipped(test);
    let gpus: Vec<Device> = backends()
        .0
        .into_iter()
        .filter(|d| d.kind() != BackendKind::Cpu)
        .collect();
    if gpus.is_empty() {
        let _ = writeln!(
            std::io::stderr().lock(),
            "[{test}] ran on no GPU backend: {what} not run"
        );
    }
    gpus
}

/// Every how many shapes an exhaustive shape walk runs: 1 (all), or
/// `CALICO_CONFORMANCE_SHAPE_STRIDE` when set. A stride keeps the walk deterministic and spread
/// over its whole range; the sanitizer script sets it for the tools (racecheck) under which
/// every launch is slow.
pub fn shape_stride() -> usize {
    std::env::var("CALICO_CONFORMANCE_SHAPE_STRIDE")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(1)
}

/// Proptest cases per property: `default`, or `CALICO_CONFORMANCE_CASES` when set.
pub fn cases(default: u32) -> u32 {
    std::env::var("CALICO_CONFORMANCE_CASES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&n: &u32| n > 0)
        .unwrap_or(default)
}
