//! Finds and opens libamdhip64 and libhiprtc at run time, once per process.
//!
//! Libraries are never unloaded: buffers and modules may be freed during process exit,
//! and the function tables point into them.

use crate::sys::{self, GetDevicePropertiesFn, HipFns, HipGraphFns, HiprtcFns};
use calico_core::{Error, Result};
use libloading::Library;
use std::path::PathBuf;
use std::sync::OnceLock;

/// Sonames tried, newest first.
const SONAME_SUFFIXES: [&str; 4] = ["", ".7", ".6", ".5"];

/// The loaded runtime: function tables and where they came from.
#[derive(Debug)]
pub struct Runtime {
    pub hip: HipFns,
    pub hip_path: String,
    /// hipRTC, or why it could not be loaded (a device without it can still move memory).
    pub rtc: std::result::Result<HiprtcFns, String>,
    /// Stream capture and graphs, or why the runtime lacks them (only capture needs them).
    pub graph: std::result::Result<HipGraphFns, String>,
    /// The properties call and the offset of `gcnArchName` in the struct it fills.
    pub props: Option<(GetDevicePropertiesFn, usize)>,
    /// `hipRuntimeGetVersion`, e.g. 60342134 for 6.3.42134.
    pub version: i32,
    _libs: Vec<Library>,
}

/// Every path tried for a library stem such as `libamdhip64`, in search order:
/// `$ROCM_PATH/lib`, then the plain soname (the loader's own search), then `/opt/rocm/lib`.
pub fn candidates(stem: &str) -> Vec<PathBuf> {
    let mut dirs: Vec<Option<PathBuf>> = Vec::new();
    if let Some(root) = std::env::var_os("ROCM_PATH").filter(|v| !v.is_empty()) {
        dirs.push(Some(PathBuf::from(root).join("lib")));
    }
    dirs.push(None);
    dirs.push(Some(PathBuf::from("/opt/rocm/lib")));
    let mut out = Vec::new();
    for dir in &dirs {
        for suffix in SONAME_SUFFIXES {
            let file = format!("{stem}.so{suffix}");
            out.push(match dir {
                Some(d) => d.join(file),
                None => PathBuf::from(file),
            });
        }
    }
    out
}

/// Opens the first candidate that loads and yields a complete table `T`.
///
/// # Safety
/// `resolve` must only bind symbols with the signatures the library really has.
pub unsafe fn open_first<T>(
    paths: &[PathBuf],
    resolve: impl Fn(&Library) -> std::result::Result<T, String>,
) -> std::result::Result<(Library, T, PathBuf), String> {
    let mut tried = Vec::new();
    for path in paths {
        // SAFETY: opening a shared library runs its initialisers; the HIP libraries' are
        // safe to run. This is the inherent contract of dynamic loading.
        match unsafe { Library::new(path) } {
            Ok(lib) => match resolve(&lib) {
                Ok(table) => return Ok((lib, table, path.clone())),
                Err(e) => tried.push(format!("{} ({e})", path.display())),
            },
            Err(_) => tried.push(path.display().to_string()),
        }
    }
    Err(format!("searched {}", tried.join(", ")))
}

static RUNTIME: OnceLock<std::result::Result<Runtime, String>> = OnceLock::new();

/// The process-wide runtime, loaded on first use.
pub fn runtime() -> Result<&'static Runtime> {
    RUNTIME
        .get_or_init(|| load(&candidates("libamdhip64"), &candidates("libhiprtc")))
        .as_ref()
        .map_err(|reason| Error::BackendUnavailable {
            backend: "hip",
            reason: reason.clone(),
        })
}

/// Loads the runtime from explicit candidate lists (tests pass paths that do not exist).
pub fn load(hip_paths: &[PathBuf], rtc_paths: &[PathBuf]) -> std::result::Result<Runtime, String> {
    // SAFETY: HipFns declares the ROCm 5/6 C signatures of these entry points.
    let (hip_lib, hip, hip_path) = unsafe { open_first(hip_paths, |lib| HipFns::load(lib)) }
        .map_err(|e| format!("libamdhip64 (the HIP runtime) not found; {e}"))?;
    let mut libs = vec![];
    // SAFETY: as above, for hipRTC.
    let rtc = match unsafe { open_first(rtc_paths, |lib| HiprtcFns::load(lib)) } {
        Ok((lib, table, _)) => {
            libs.push(lib);
            Ok(table)
        }
        // ROCm 5 ships hipRTC inside libamdhip64.
        Err(e) => {
            // SAFETY: as above.
            unsafe { HiprtcFns::load(&hip_lib) }.map_err(|_| format!("libhiprtc not found; {e}"))
        }
    };
    let mut version = 0;
    // SAFETY: the pointer is to a live local; the call only writes an int.
    let _ = unsafe { (hip.hipRuntimeGetVersion)(&mut version) };
    let props = properties_fn(&hip_lib, version);
    // SAFETY: HipGraphFns declares the ROCm 4.5+ C signatures of these entry points.
    let graph = unsafe { HipGraphFns::load(&hip_lib) };
    libs.push(hip_lib);
    Ok(Runtime {
        hip,
        hip_path: hip_path.display().to_string(),
        rtc,
        graph,
        props,
        version,
        _libs: libs,
    })
}

/// ROCm 6 exports the R0600 layout under its own name; ROCm 5 has only the old layout.
fn properties_fn(lib: &Library, version: i32) -> Option<(GetDevicePropertiesFn, usize)> {
    // SAFETY: both symbols have the signature (struct*, int) -> hipError_t.
    unsafe {
        if let Ok(f) = lib.get::<GetDevicePropertiesFn>(b"hipGetDevicePropertiesR0600\0") {
            return Some((*f, sys::props::R0600_GCN_ARCH_NAME));
        }
        if version / 10_000_000 < 6 {
            if let Ok(f) = lib.get::<GetDevicePropertiesFn>(b"hipGetDeviceProperties\0") {
                return Some((*f, sys::props::R0000_GCN_ARCH_NAME));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_cover_sonames_and_rocm_dirs() {
        let c = candidates("libamdhip64");
        let names: Vec<String> = c.iter().map(|p| p.display().to_string()).collect();
        for want in [
            "libamdhip64.so",
            "libamdhip64.so.7",
            "libamdhip64.so.6",
            "libamdhip64.so.5",
        ] {
            assert!(
                names.iter().any(|n| n == want),
                "{want} missing from {names:?}"
            );
        }
        assert!(names.iter().any(|n| n == "/opt/rocm/lib/libamdhip64.so.6"));
    }

    /// Where a HIP runtime is installed (Debian's libamdhip64-5 is enough; no GPU needed),
    /// every entry point is resolved, the graph ones included; elsewhere a skip is reported.
    #[test]
    fn an_installed_runtime_resolves_the_graph_entry_points() {
        match runtime() {
            Ok(rt) => {
                assert!(rt.graph.is_ok(), "{:?}", rt.graph.as_ref().err());
                assert!(rt.rtc.is_ok(), "{:?}", rt.rtc.as_ref().err());
            }
            Err(e) => println!("skipped: no HIP runtime to resolve against ({e})"),
        }
    }

    #[test]
    fn missing_runtime_names_every_path_searched() {
        let dir = std::env::temp_dir().join("calico-hip-nowhere");
        let hip: Vec<PathBuf> = ["libamdhip64.so", "libamdhip64.so.6"]
            .iter()
            .map(|n| dir.join(n))
            .collect();
        let err = load(&hip, &[]).unwrap_err();
        assert!(err.contains("libamdhip64"), "{err}");
        for p in &hip {
            assert!(
                err.contains(&p.display().to_string()),
                "{err} lacks {}",
                p.display()
            );
        }
    }

    #[test]
    fn an_installed_runtime_resolves_every_table() {
        let Ok(rt) = runtime() else {
            println!("skipped: no libamdhip64 here");
            return;
        };
        println!("{} version {}", rt.hip_path, rt.version);
        assert!(
            rt.props.is_some(),
            "no properties call with a known layout in {}",
            rt.hip_path
        );
        if rt.version / 10_000_000 == 5 {
            assert!(
                rt.rtc.is_ok(),
                "ROCm 5 carries hipRTC in libamdhip64: {:?}",
                rt.rtc.as_ref().err()
            );
        }
    }
}
