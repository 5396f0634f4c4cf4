//! Run-time compilation with hipRTC, and the compile-cache key.

use crate::result::check_rtc;
use crate::sys::{HiprtcFns, HiprtcProgram};
use calico_core::{DiskCache, Error, KernelSource, Result};
use std::ffi::{c_char, CString};

/// hipRTC options for `gcn_arch` (the full name, feature flags included, e.g.
/// `gfx942:sramecc+:xnack-`, so the code object matches the device's xnack/ecc mode).
pub fn options(gcn_arch: &str) -> Vec<String> {
    vec![
        format!("--offload-arch={gcn_arch}"),
        "-O3".to_string(),
        "-std=c++17".to_string(),
    ]
}

/// hipRTC's "major.minor" plus the HIP runtime version: hipRTC alone reports the same
/// number across ROCm releases (9.0 on ROCm 5.2), and the cache key must change with ROCm.
pub fn version(rtc: &HiprtcFns, hip_runtime_version: i32) -> String {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two live out-pointers.
    let code = unsafe { (rtc.hiprtcVersion)(&mut major, &mut minor) };
    if code == crate::sys::HIPRTC_SUCCESS {
        format!("{major}.{minor} (HIP {hip_runtime_version})")
    } else {
        format!("unknown (HIP {hip_runtime_version})")
    }
}

/// The disk-cache key: source text, full target, compiler version and options.
pub fn cache_key(
    source: &KernelSource,
    target: &str,
    compiler_version: &str,
    options: &[String],
) -> String {
    let opts = options.join("\u{1f}");
    DiskCache::key(&[
        b"hiprtc",
        source.text.as_bytes(),
        target.as_bytes(),
        compiler_version.as_bytes(),
        opts.as_bytes(),
    ])
}

/// A hipRTC program destroyed on drop.
struct Program<'a> {
    rtc: &'a HiprtcFns,
    raw: HiprtcProgram,
}

impl Drop for Program<'_> {
    fn drop(&mut self) {
        // SAFETY: we created the program and destroy it once.
        unsafe { (self.rtc.hiprtcDestroyProgram)(&mut self.raw) };
    }
}

/// Compiles `source` to a code object for `gcn_arch`; a failed compile carries hipRTC's log.
pub fn compile(rtc: &HiprtcFns, source: &KernelSource, gcn_arch: &str) -> Result<Vec<u8>> {
    let nul = |what: &str| Error::unsupported(format!("{what} contains a NUL byte"));
    let text = CString::new(source.text.as_str()).map_err(|_| nul("kernel source"))?;
    let name = CString::new(format!("{}.hip", source.entry)).map_err(|_| nul("kernel name"))?;
    let opts: Vec<CString> = options(gcn_arch)
        .into_iter()
        .map(CString::new)
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| nul("target"))?;
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();

    let mut raw: HiprtcProgram = std::ptr::null_mut();
    // SAFETY: NUL-terminated strings that outlive the call; no extra headers.
    let code = unsafe {
        (rtc.hiprtcCreateProgram)(
            &mut raw,
            text.as_ptr(),
            name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    check_rtc(rtc, code, "hiprtcCreateProgram")?;
    let program = Program { rtc, raw };

    // SAFETY: `opt_ptrs` holds `opts.len()` pointers to live C strings.
    let code = unsafe {
        (rtc.hiprtcCompileProgram)(program.raw, opt_ptrs.len() as i32, opt_ptrs.as_ptr())
    };
    if code != crate::sys::HIPRTC_SUCCESS {
        let log = log(&program).unwrap_or_else(|e| format!("(no log: {e})"));
        let why = check_rtc(rtc, code, "hiprtcCompileProgram")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        return Err(Error::Compile {
            entry: source.entry.clone(),
            target: gcn_arch.to_string(),
            log: format!("{why}\n{log}"),
        });
    }
    let mut size = 0usize;
    // SAFETY: live out-pointer; the program compiled.
    let code = unsafe { (rtc.hiprtcGetCodeSize)(program.raw, &mut size) };
    check_rtc(rtc, code, "hiprtcGetCodeSize")?;
    let mut code_object = vec![0u8; size];
    // SAFETY: the buffer holds exactly the size hipRTC reported.
    let code = unsafe { (rtc.hiprtcGetCode)(program.raw, code_object.as_mut_ptr().cast()) };
    check_rtc(rtc, code, "hiprtcGetCode")?;
    if code_object.is_empty() {
        return Err(Error::Compile {
            entry: source.entry.clone(),
            target: gcn_arch.to_string(),
            log: "hipRTC returned an empty code object".into(),
        });
    }
    Ok(code_object)
}

fn log(program: &Program<'_>) -> Result<String> {
    let rtc = program.rtc;
    let mut size = 0usize;
    // SAFETY: live out-pointer.
    let code = unsafe { (rtc.hiprtcGetProgramLogSize)(program.raw, &mut size) };
    check_rtc(rtc, code, "hiprtcGetProgramLogSize")?;
    let mut buf = vec![0u8; size.max(1)];
    // SAFETY: the buffer holds at least the reported size.
    let code = unsafe { (rtc.hiprtcGetProgramLog)(program.raw, buf.as_mut_ptr().cast()) };
    check_rtc(rtc, code, "hiprtcGetProgramLog")?;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// Compiles `source` for `target` with the installed hipRTC, no device needed (the runtime
/// library must be present). The result is not cached.
pub fn compile_hiprtc(source: &KernelSource, target: &str) -> Result<Vec<u8>> {
    let rt = crate::loader::runtime()?;
    let rtc = rt
        .rtc
        .as_ref()
        .map_err(|reason| Error::BackendUnavailable {
            backend: "hip",
            reason: reason.clone(),
        })?;
    compile(rtc, source, target)
}

/// The installed hipRTC's version, if the runtime loads.
pub fn hiprtc_version() -> Result<String> {
    let rt = crate::loader::runtime()?;
    let rtc = rt
        .rtc
        .as_ref()
        .map_err(|reason| Error::BackendUnavailable {
            backend: "hip",
            reason: reason.clone(),
        })?;
    Ok(version(rtc, rt.version))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_carry_the_full_target() {
        let o = options("gfx942:sramecc+:xnack-");
        assert_eq!(o[0], "--offload-arch=gfx942:sramecc+:xnack-");
        assert!(o.contains(&"-O3".to_string()) && o.contains(&"-std=c++17".to_string()));
    }

    #[test]
    fn cache_key_depends_on_every_part() {
        let s = KernelSource::assemble("k", "x", &[], &[]).unwrap();
        let t = KernelSource::assemble("k", "y", &[], &[]).unwrap();
        let o = options("gfx942");
        let base = cache_key(&s, "gfx942", "6.3", &o);
        assert_ne!(base, cache_key(&t, "gfx942", "6.3", &o));
        assert_ne!(base, cache_key(&s, "gfx90a", "6.3", &o));
        assert_ne!(base, cache_key(&s, "gfx942", "6.4", &o));
        assert_ne!(
            base,
            cache_key(&s, "gfx942", "6.3", &options("gfx942:xnack+"))
        );
    }
}
