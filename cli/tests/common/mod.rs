//! What the `calico` command's integration tests share.

use std::process::Command;

/// The binary cargo built, or, where the tests run from a scripts/gpu-pack.sh bundle on
/// another machine, the `calico` in the bundle's bin/ beside tests/.
pub fn calico() -> Command {
    calico_benches::gpu_bundle::binary(env!("CARGO_BIN_EXE_calico"), "calico")
}
