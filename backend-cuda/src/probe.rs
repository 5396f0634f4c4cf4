//! Finding the CUDA driver and NVRTC libraries without panicking.
//!
//! cudarc's dynamic loader panics when a library is missing, so every entry into cudarc is
//! preceded by one of these probes.

use calico_core::{Error, Result};

/// cudarc's candidate file names for `lib`, without repeats (for error messages).
fn candidates(lib: &str) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    cudarc::get_lib_name_candidates(lib)
        .into_iter()
        .filter(|n| seen.insert(n.clone()))
        .collect()
}

/// True when libcuda can be opened.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen candidate names; opening libcuda runs no user code.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// True when libnvrtc can be opened.
pub fn nvrtc_present() -> bool {
    // SAFETY: as above, for libnvrtc.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// True when libcublasLt can be opened.
pub fn cublaslt_present() -> bool {
    // SAFETY: as above, for libcublasLt.
    unsafe { cudarc::cublaslt::sys::is_culib_present() }
}

/// `Ok` when libcuda is present, else an error naming every file name searched.
pub fn require_driver() -> Result<()> {
    if driver_present() {
        return Ok(());
    }
    Err(Error::BackendUnavailable {
        backend: "cuda",
        reason: format!(
            "the CUDA driver library was not found (searched {} on the loader path; set LD_LIBRARY_PATH to add directories)",
            candidates("cuda").join(", ")
        ),
    })
}

/// `Ok` when libnvrtc is present, else an error naming every file name searched.
pub fn require_nvrtc() -> Result<()> {
    if nvrtc_present() {
        return Ok(());
    }
    Err(Error::BackendUnavailable {
        backend: "cuda",
        reason: format!(
            "NVRTC was not found (searched {} on the loader path; install the CUDA toolkit or the nvidia-cuda-nvrtc wheel and add its lib directory to LD_LIBRARY_PATH)",
            candidates("nvrtc").join(", ")
        ),
    })
}
