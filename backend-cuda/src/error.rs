//! Converting cudarc's errors into Calico's.

use calico_core::Error;
use cudarc::driver::DriverError;

/// Wraps a driver error with the call that produced it.
pub(crate) fn driver(call: &str, e: DriverError) -> Error {
    let message = match (e.error_name(), e.error_string()) {
        (Ok(name), Ok(text)) => format!("{} ({})", name.to_string_lossy(), text.to_string_lossy()),
        _ => format!("{:?}", e.0),
    };
    Error::Runtime {
        backend: "cuda",
        call: call.to_string(),
        message,
    }
}

/// `.map_err(driver_err("cuXxx"))`.
pub(crate) fn driver_err(call: &'static str) -> impl Fn(DriverError) -> Error {
    move |e| driver(call, e)
}
