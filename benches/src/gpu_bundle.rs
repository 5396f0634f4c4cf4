//! Running the project's executables from a `scripts/gpu-pack.sh` bundle: on the GPU machine
//! the test executables sit in the bundle's `tests/` and the binaries in `bin/` beside it,
//! while the paths cargo compiled into the tests name the build machine's `target/`.

use std::path::PathBuf;
use std::process::Command;

/// A command for the binary `name` that cargo built at `built` (a test's
/// `env!("CARGO_BIN_EXE_<name>")`), or, where that path does not exist and the running test
/// executable sits in a bundle's `tests/`, for the bundle's `bin/<name>`.
pub fn binary(built: &str, name: &str) -> Command {
    let built = PathBuf::from(built);
    let packed = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("bin").join(name)));
    match packed {
        Some(p) if !built.exists() && p.exists() => Command::new(p),
        _ => Command::new(built),
    }
}
