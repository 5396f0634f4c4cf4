//! Turns HIP and hipRTC status codes into Calico errors with the runtime's own message.

use crate::sys::{self, HipError, HipFns, HiprtcFns, HiprtcResult};
use calico_core::{Error, Result};
use std::ffi::CStr;

/// `Ok(())` for hipSuccess, else `Error::Runtime` naming `call` and the runtime's message.
pub fn check(hip: &HipFns, code: HipError, call: &str) -> Result<()> {
    if code == sys::HIP_SUCCESS {
        return Ok(());
    }
    Err(Error::Runtime {
        backend: "hip",
        call: call.to_string(),
        message: hip_message(hip, code),
    })
}

/// The runtime's description of `code`, with the number.
pub fn hip_message(hip: &HipFns, code: HipError) -> String {
    // SAFETY: hipGetErrorString takes any int and returns a static string or null.
    let ptr = unsafe { (hip.hipGetErrorString)(code) };
    format!("{} (hipError_t {code})", static_str(ptr))
}

/// `Ok(())` for HIPRTC_SUCCESS, else `Error::Runtime` naming `call`.
pub fn check_rtc(rtc: &HiprtcFns, code: HiprtcResult, call: &str) -> Result<()> {
    if code == sys::HIPRTC_SUCCESS {
        return Ok(());
    }
    // SAFETY: hiprtcGetErrorString takes any int and returns a static string or null.
    let ptr = unsafe { (rtc.hiprtcGetErrorString)(code) };
    Err(Error::Runtime {
        backend: "hip",
        call: call.to_string(),
        message: format!("{} (hiprtcResult {code})", static_str(ptr)),
    })
}

fn static_str(ptr: *const std::ffi::c_char) -> String {
    if ptr.is_null() {
        return "unknown error".to_string();
    }
    // SAFETY: non-null pointers from the *GetErrorString calls are NUL-terminated statics.
    unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}
