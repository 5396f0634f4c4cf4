//! Compiling and disassembling without a GPU or ROCm: Debian's clang-19 and llvm-objdump-19.

use calico_core::{Error, KernelSource, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};

/// The clang used by [`compile_offline`]: `$CALICO_CLANG`, else `clang-19`.
pub fn clang_path() -> String {
    tool_from_env("CALICO_CLANG", "clang-19")
}

/// Ok when the offline compiler runs (`clang --version` succeeds); else why not, with what to
/// install.
pub fn require_clang() -> Result<()> {
    let clang = clang_path();
    match Command::new(&clang).arg("--version").output() {
        Ok(out) if out.status.success() => Ok(()),
        _ => Err(Error::unsupported(format!(
            "{clang} not found (install clang-19, lld-19, llvm-19 or set CALICO_CLANG)"
        ))),
    }
}

/// The objdump used by [`disassemble`]: `$CALICO_LLVM_OBJDUMP`, else `llvm-objdump-19`.
pub fn objdump_path() -> String {
    tool_from_env("CALICO_LLVM_OBJDUMP", "llvm-objdump-19")
}

fn tool_from_env(var: &str, default: &str) -> String {
    std::env::var(var)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_string())
}

/// Compiles `source` for `target` (e.g. `gfx942`, feature flags allowed) with clang and no
/// HIP headers or device libraries, returning the linked code object (an AMDGPU ELF that
/// hipModuleLoadData accepts).
pub fn compile_offline(source: &KernelSource, target: &str) -> Result<Vec<u8>> {
    if target.is_empty()
        || target
            .chars()
            .any(|c| !(c.is_ascii_alphanumeric() || matches!(c, ':' | '+' | '-' | '_')))
    {
        return Err(Error::unsupported(format!(
            "{target:?} is not an AMD GPU target"
        )));
    }
    let dir = TempDir::new()?;
    let src = dir.path().join("kernel.hip");
    let out = dir.path().join("kernel.co");
    std::fs::write(&src, &source.text)?;
    let clang = clang_path();
    let output = run(
        Command::new(&clang)
            .args([
                "-x",
                "hip",
                &format!("--offload-arch={target}"),
                "-nogpuinc",
                "-nogpulib",
            ])
            // One linked code object instead of a clang offload bundle.
            .args([
                "--cuda-device-only",
                "--no-gpu-bundle-output",
                "-O3",
                "-std=c++17",
                "-c",
            ])
            .arg(&src)
            .arg("-o")
            .arg(&out),
        &clang,
        "CALICO_CLANG",
    )?;
    if !output.status.success() {
        let log =
            String::from_utf8_lossy(&output.stderr).replace(&*src.to_string_lossy(), "kernel.hip");
        return Err(Error::Compile {
            entry: source.entry.clone(),
            target: target.to_string(),
            log,
        });
    }
    Ok(std::fs::read(&out)?)
}

/// Disassembles an AMDGPU code object (the instruction set is read from the ELF header).
pub fn disassemble(code_object: &[u8]) -> Result<String> {
    let dir = TempDir::new()?;
    let path = dir.path().join("kernel.co");
    std::fs::write(&path, code_object)?;
    let objdump = objdump_path();
    let output = run(
        Command::new(&objdump).arg("-d").arg(&path),
        &objdump,
        "CALICO_LLVM_OBJDUMP",
    )?;
    if !output.status.success() {
        return Err(Error::Runtime {
            backend: "hip",
            call: objdump,
            message: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn run(cmd: &mut Command, tool: &str, var: &str) -> Result<Output> {
    cmd.output().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::BackendUnavailable {
            backend: "hip",
            reason: format!("{tool} not found (install clang-19/llvm-19 or set {var})"),
        },
        _ => Error::Io(e),
    })
}

/// A private scratch directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<TempDir> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!(
            "calico-hip-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let path = std::env::temp_dir().join(name);
        std::fs::create_dir(&path)?;
        Ok(TempDir(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
