//! What the `calico` command's integration tests share.

use std::process::Command;

/// The binary cargo built, or, where the tests run from a scripts/gpu-pack.sh bundle on
/// another machine, the `calico` in the bundle's bin/ beside tests/.
pub fn calico() -> Command {
    let built = std::path::PathBuf::from(env!("CARGO_BIN_EXE_calico"));
    let packed = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("bin").join("calico")));
    match packed {
        Some(p) if !built.exists() && p.exists() => Command::new(p),
        _ => Command::new(built),
    }
}
