//! Kernel launches: argument marshalling and hipModuleLaunchKernel.

use crate::context::{Context, Kernel};
use crate::result::check;
use crate::sys;
use calico_core::{Error, KernelArg, LaunchConfig, Result};
use std::ffi::c_void;

/// One `void*` per argument, pointing at the argument's bytes inside `args` (which the
/// caller keeps borrowed across the launch). HIP reads each value's size from the kernel's
/// metadata; an `Opaque128` is passed as a pointer to its 128 bytes, `Params` as a pointer to
/// the struct's bytes.
pub fn marshal(args: &[KernelArg]) -> Vec<*mut c_void> {
    args.iter()
        .map(|arg| {
            let p: *const c_void = match arg {
                KernelArg::Ptr(v) | KernelArg::U64(v) => (v as *const u64).cast(),
                KernelArg::I32(v) => (v as *const i32).cast(),
                KernelArg::U32(v) => (v as *const u32).cast(),
                KernelArg::I64(v) => (v as *const i64).cast(),
                KernelArg::F32(v) => (v as *const f32).cast(),
                KernelArg::Opaque128(v) => v.0.as_ptr().cast(),
                KernelArg::Params(v) => v.as_bytes().as_ptr().cast(),
            };
            p.cast_mut()
        })
        .collect()
}

/// Checks a launch shape against the device before handing it to the runtime.
pub fn validate(config: &LaunchConfig, max_threads: u32, max_shared: usize) -> Result<()> {
    let (gx, gy, gz) = config.grid;
    let (bx, by, bz) = config.block;
    if [gx, gy, gz, bx, by, bz].contains(&0) {
        return Err(Error::unsupported(format!(
            "launch with an empty grid {:?} or block {:?}",
            config.grid, config.block
        )));
    }
    let threads = u64::from(bx) * u64::from(by) * u64::from(bz);
    if threads > u64::from(max_threads) {
        return Err(Error::unsupported(format!(
            "block of {threads} threads exceeds the device's {max_threads}"
        )));
    }
    if config.shared_mem_bytes as usize > max_shared {
        return Err(Error::unsupported(format!(
            "{} bytes of dynamic shared memory exceed the device's {max_shared} bytes of LDS per block",
            config.shared_mem_bytes
        )));
    }
    Ok(())
}

/// Launches `kernel` on the device's stream.
pub fn launch(
    ctx: &Context,
    kernel: Kernel,
    config: &LaunchConfig,
    args: &[KernelArg],
) -> Result<()> {
    ctx.bind()?;
    let hip = &ctx.rt.hip;
    if config.shared_mem_bytes > 64 * 1024 {
        // AMD needs no opt-in (the limit is the device's LDS size, checked in `validate`), and
        // module functions are not host stubs, so a refusal here is expected and harmless.
        // SAFETY: the function handle is loaded; the call only reads it.
        let _ = unsafe {
            (hip.hipFuncSetAttribute)(
                kernel.function.0.cast_const(),
                sys::HIP_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_MEMORY_SIZE,
                config.shared_mem_bytes as i32,
            )
        };
    }
    let mut params = marshal(args);
    let (gx, gy, gz) = config.grid;
    let (bx, by, bz) = config.block;
    let params_ptr = if params.is_empty() {
        std::ptr::null_mut()
    } else {
        params.as_mut_ptr()
    };
    // SAFETY: `params` points into `args`, borrowed for this call; the runtime copies the
    // values before returning. The caller promises the args match the kernel's parameters.
    let code = unsafe {
        (hip.hipModuleLaunchKernel)(
            kernel.function.0,
            gx,
            gy,
            gz,
            bx,
            by,
            bz,
            config.shared_mem_bytes,
            ctx.stream(),
            params_ptr,
            std::ptr::null_mut(),
        )
    };
    if code == sys::HIP_SUCCESS {
        return Ok(());
    }
    check(hip, code, "hipModuleLaunchKernel")
}

#[cfg(test)]
mod tests {
    use super::*;
    use calico_core::OpaqueParam128;

    #[test]
    fn marshalled_pointers_reach_each_value() {
        let mut blob = [0u8; 128];
        blob[0] = 7;
        blob[127] = 9;
        let args = [
            KernelArg::Ptr(0xdead_beef_0000),
            KernelArg::I32(-3),
            KernelArg::U32(5),
            KernelArg::I64(-1 << 40),
            KernelArg::U64(1 << 50),
            KernelArg::F32(1.5),
            KernelArg::Opaque128(OpaqueParam128(blob)),
        ];
        let p = marshal(&args);
        assert_eq!(p.len(), args.len());
        // SAFETY: each pointer refers to the matching value inside `args`, still alive.
        unsafe {
            assert_eq!(*(p[0] as *const u64), 0xdead_beef_0000);
            assert_eq!(*(p[1] as *const i32), -3);
            assert_eq!(*(p[2] as *const u32), 5);
            assert_eq!(*(p[3] as *const i64), -1 << 40);
            assert_eq!(*(p[4] as *const u64), 1 << 50);
            assert_eq!(*(p[5] as *const f32), 1.5);
            let bytes = std::slice::from_raw_parts(p[6] as *const u8, 128);
            assert_eq!((bytes[0], bytes[127]), (7, 9));
        }
    }

    #[test]
    fn bad_launch_shapes_are_errors() {
        let ok = LaunchConfig::linear(4, 256, 0);
        assert!(validate(&ok, 1024, 65536).is_ok());
        assert!(validate(&LaunchConfig::linear(0, 256, 0), 1024, 65536).is_err());
        assert!(validate(&LaunchConfig::linear(1, 2048, 0), 1024, 65536).is_err());
        assert!(validate(&LaunchConfig::linear(1, 64, 65537), 1024, 65536).is_err());
    }
}
