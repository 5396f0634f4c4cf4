//! NVRTC: device C++ to a cubin for one target, with no GPU needed.

use crate::probe;
use calico_core::{Error, KernelSource, Result};
use cudarc::nvrtc::{result as nvrtc_result, sys as nvrtc_sys};
use std::ffi::CString;
use std::path::{Path, PathBuf};

/// `$CUDA_HOME`, `$CUDA_PATH` (when set and not empty) and `/usr/local/cuda`, in that order.
fn cuda_roots() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(std::env::var_os)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .collect();
    roots.push(PathBuf::from("/usr/local/cuda"));
    roots
}

/// Directories searched for the CUDA headers (`cuda_bf16.h`), in order: `$CUDA_HOME`,
/// `$CUDA_PATH`, `/usr/local/cuda`; each contributes `include/` and, if present, `include/cccl/`.
pub fn include_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for root in cuda_roots() {
        let inc = root.join("include");
        if inc.join("cuda_bf16.h").is_file() {
            let cccl = inc.join("cccl");
            dirs.push(inc);
            if cccl.is_dir() {
                dirs.push(cccl);
            }
            break;
        }
    }
    dirs
}

fn searched_roots() -> String {
    let mut v: Vec<String> = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .map(|k| {
            format!(
                "${k}={}",
                std::env::var(k).unwrap_or_else(|_| "<unset>".into())
            )
        })
        .collect();
    v.push("/usr/local/cuda".into());
    v.join(", ")
}

/// NVRTC's version as "nvrtc MAJOR.MINOR".
pub fn version() -> Result<String> {
    probe::require_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is present (probed above); the out-pointers are valid for writes.
    let rc = unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) };
    if rc != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::Runtime {
            backend: "cuda",
            call: "nvrtcVersion".into(),
            message: format!("{rc:?}"),
        });
    }
    Ok(format!("nvrtc {major}.{minor}"))
}

/// The options Calico compiles with for `target` (e.g. `sm_90a`).
pub fn options(target: &str, include_dirs: &[PathBuf]) -> Vec<String> {
    let mut opts = vec![
        format!("--gpu-architecture={target}"),
        "-std=c++17".to_string(),
        "--device-as-default-execution-space".to_string(),
        "-DCALICO_CUDA=1".to_string(),
    ];
    opts.extend(include_dirs.iter().map(|d| format!("-I{}", d.display())));
    opts
}

/// Compiles `source` for `target` to a cubin. The compile log is inside the error.
pub fn compile(source: &KernelSource, target: &str) -> Result<Vec<u8>> {
    compile_with(source, target, &[])
}

/// As [`compile`], with extra NVRTC options (e.g. `--ptxas-options=-v`); returns the cubin and the log.
pub fn compile_with(source: &KernelSource, target: &str, extra: &[&str]) -> Result<Vec<u8>> {
    compile_with_log(source, target, extra).map(|(cubin, _)| cubin)
}

/// Compiles and also returns NVRTC's log (warnings, ptxas statistics).
pub fn compile_with_log(
    source: &KernelSource,
    target: &str,
    extra: &[&str],
) -> Result<(Vec<u8>, String)> {
    probe::require_nvrtc()?;
    let includes = include_dirs();
    if includes.is_empty() {
        return Err(Error::Compile {
            entry: source.entry.clone(),
            target: target.into(),
            log: format!(
                "CUDA headers (cuda_bf16.h) not found; searched {}",
                searched_roots()
            ),
        });
    }
    let mut opts = options(target, &includes);
    opts.extend(extra.iter().map(|s| s.to_string()));
    let compile_err = |log: String| Error::Compile {
        entry: source.entry.clone(),
        target: target.into(),
        log,
    };
    let text = CString::new(source.text.as_str())
        .map_err(|_| compile_err("source contains a NUL byte".into()))?;
    let name = CString::new(format!("{}.cu", source.entry))
        .map_err(|_| compile_err("entry contains a NUL byte".into()))?;
    let prog = nvrtc_result::create_program(&text, Some(&name))
        .map_err(|e| compile_err(format!("nvrtcCreateProgram: {e:?}")))?;
    let program = Program(prog);
    // SAFETY: `program` holds a live program created above; options are valid C strings.
    let compiled = unsafe { nvrtc_result::compile_program(program.0, &opts) };
    // SAFETY: as above; the log is read whether or not compilation succeeded.
    let log = unsafe { nvrtc_result::get_program_log(program.0) }
        .map(|raw| {
            let bytes: Vec<u8> = raw
                .iter()
                .map(|&c| c as u8)
                .take_while(|&c| c != 0)
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        })
        .unwrap_or_default();
    if compiled.is_err() {
        return Err(compile_err(log));
    }
    let mut size = 0usize;
    // SAFETY: the program compiled; `size` is a valid out-pointer.
    let rc = unsafe { nvrtc_sys::nvrtcGetCUBINSize(program.0, &mut size) };
    if rc != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
        return Err(compile_err(format!(
            "nvrtcGetCUBINSize: {rc:?} (is `{target}` a real sm_XX target?)\n{log}"
        )));
    }
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` has exactly the size NVRTC reported.
    let rc = unsafe { nvrtc_sys::nvrtcGetCUBIN(program.0, cubin.as_mut_ptr().cast()) };
    if rc != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(compile_err(format!("nvrtcGetCUBIN: {rc:?}\n{log}")));
    }
    Ok((cubin, log))
}

/// Destroys the NVRTC program on every path out of `compile`.
struct Program(nvrtc_sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by create_program and is destroyed exactly once.
        let _ = unsafe { nvrtc_result::destroy_program(self.0) };
    }
}

/// The directory of the CUDA tools (`cuobjdump`), if any: `$CUDA_HOME/bin`, `$CUDA_PATH/bin`,
/// `/usr/local/cuda/bin`.
pub fn tool_path(tool: &str) -> Option<PathBuf> {
    cuda_roots()
        .into_iter()
        .map(|r| r.join("bin").join(tool))
        .find(|p| p.is_file())
        .or_else(|| which(tool))
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file())
}
