//! Raw HIP runtime and hipRTC declarations, written by hand so nothing links at build time.
//!
//! Enum values and struct offsets come from ROCm/HIP `include/hip/hip_runtime_api.h` and
//! `include/hip/hiprtc.h` at commit c5e11fca (October 2024, the ROCm 6.3 line), checked
//! against Debian's ROCm 5.2.3 headers (`libamdhip64-dev`): the attribute values used here are
//! the same in both. Offsets were computed with clang from those headers (x86_64 Linux).

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `hipError_t`: 0 is success.
pub type HipError = c_int;
pub const HIP_SUCCESS: HipError = 0;
/// `hipErrorNoDevice`: hipGetDeviceCount found no device.
pub const HIP_ERROR_NO_DEVICE: HipError = 100;

/// `hiprtcResult`: 0 is success.
pub type HiprtcResult = c_int;
pub const HIPRTC_SUCCESS: HiprtcResult = 0;

/// Opaque runtime handles.
pub type HipStream = *mut c_void;
pub type HipEvent = *mut c_void;
pub type HipModule = *mut c_void;
pub type HipFunction = *mut c_void;
pub type HiprtcProgram = *mut c_void;
pub type HipGraph = *mut c_void;
pub type HipGraphExec = *mut c_void;
pub type HipGraphNode = *mut c_void;

/// `hipStreamCaptureMode` (as CUDA's): only this thread's calls are checked during a capture.
pub const HIP_STREAM_CAPTURE_MODE_THREAD_LOCAL: c_int = 1;
/// `hipGraphNodeType`: a kernel launch (the values follow CUDA's: memcpy 1, memset 2, host 3).
pub const HIP_GRAPH_NODE_TYPE_KERNEL: c_int = 0;

/// `hipDeviceAttribute_t` values (identical in ROCm 5.2 and 6.x).
pub mod attr {
    use std::ffi::c_int;
    pub const L2_CACHE_SIZE: c_int = 19;
    pub const MAX_THREADS_PER_BLOCK: c_int = 56;
    pub const MULTIPROCESSOR_COUNT: c_int = 63;
    pub const MAX_SHARED_MEMORY_PER_BLOCK: c_int = 74;
    pub const SHARED_MEM_PER_BLOCK_OPTIN: c_int = 75;
    pub const WARP_SIZE: c_int = 87;
}

/// `hipMemcpyKind`.
pub const HIP_MEMCPY_HOST_TO_DEVICE: c_int = 1;
pub const HIP_MEMCPY_DEVICE_TO_HOST: c_int = 2;
pub const HIP_MEMCPY_DEVICE_TO_DEVICE: c_int = 3;

/// `hipStreamNonBlocking`: our stream does not wait for the legacy null stream.
pub const HIP_STREAM_NON_BLOCKING: c_uint = 1;

/// `hipFuncAttributeMaxDynamicSharedMemorySize`.
pub const HIP_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_MEMORY_SIZE: c_int = 8;

/// Where `gcnArchName` (char[256]) sits in `hipDeviceProp_t`. hipDeviceGetAttribute cannot
/// return it (the old GcnArchName attribute is `Unused5` in ROCm 6), so it is read from the
/// properties struct, written into a buffer much larger than either layout.
pub mod props {
    /// `hipDeviceProp_tR0600` (ROCm 6.x, `hipGetDevicePropertiesR0600`): 1472 bytes.
    pub const R0600_SIZE: usize = 1472;
    pub const R0600_GCN_ARCH_NAME: usize = 1160;
    /// The ROCm 5.x layout (`hipGetDeviceProperties` in libamdhip64.so.5): 792 bytes.
    pub const R0000_SIZE: usize = 792;
    pub const R0000_GCN_ARCH_NAME: usize = 396;
    pub const GCN_ARCH_NAME_LEN: usize = 256;
    /// Bytes handed to the runtime: room for a later layout that grows.
    pub const BUFFER_BYTES: usize = 8192;
}

macro_rules! fn_table {
    ($(#[$meta:meta])* $table:ident { $($name:ident : fn($($arg:ty),*) -> $ret:ty;)* }) => {
        $(#[$meta])*
        #[allow(non_snake_case)]
        #[derive(Clone, Copy)]
        pub struct $table {
            $(pub $name: unsafe extern "C" fn($($arg),*) -> $ret,)*
        }

        impl $table {
            /// Resolves every entry point from `lib`, naming the first one missing.
            ///
            /// # Safety
            /// The library must export these symbols with the declared C signatures.
            pub unsafe fn load(lib: &libloading::Library) -> Result<Self, String> {
                Ok($table {
                    $($name: {
                        let name = concat!(stringify!($name), "\0");
                        // SAFETY: the caller vouches that the symbol has this signature; the
                        // pointer is copied out and stays valid while `lib` is loaded, which
                        // is forever (libraries are never unloaded).
                        let sym = unsafe {
                            lib.get::<unsafe extern "C" fn($($arg),*) -> $ret>(name.as_bytes())
                        };
                        *sym.map_err(|e| format!("missing symbol {}: {e}", stringify!($name)))?
                    },)*
                })
            }
        }

        impl std::fmt::Debug for $table {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(concat!(stringify!($table), "{..}"))
            }
        }
    };
}

fn_table! {
    /// The HIP runtime entry points Calico uses (libamdhip64).
    HipFns {
        hipGetErrorString: fn(HipError) -> *const c_char;
        hipRuntimeGetVersion: fn(*mut c_int) -> HipError;
        hipGetDeviceCount: fn(*mut c_int) -> HipError;
        hipSetDevice: fn(c_int) -> HipError;
        hipDeviceGetAttribute: fn(*mut c_int, c_int, c_int) -> HipError;
        hipDeviceGetName: fn(*mut c_char, c_int, c_int) -> HipError;
        hipDeviceSynchronize: fn() -> HipError;
        hipMalloc: fn(*mut *mut c_void, usize) -> HipError;
        hipFree: fn(*mut c_void) -> HipError;
        hipMemcpyAsync: fn(*mut c_void, *const c_void, usize, c_int, HipStream) -> HipError;
        hipMemsetAsync: fn(*mut c_void, c_int, usize, HipStream) -> HipError;
        hipStreamCreateWithFlags: fn(*mut HipStream, c_uint) -> HipError;
        hipStreamDestroy: fn(HipStream) -> HipError;
        hipStreamSynchronize: fn(HipStream) -> HipError;
        hipEventCreate: fn(*mut HipEvent) -> HipError;
        hipEventDestroy: fn(HipEvent) -> HipError;
        hipEventRecord: fn(HipEvent, HipStream) -> HipError;
        hipEventSynchronize: fn(HipEvent) -> HipError;
        hipEventElapsedTime: fn(*mut f32, HipEvent, HipEvent) -> HipError;
        hipModuleLoadData: fn(*mut HipModule, *const c_void) -> HipError;
        hipModuleUnload: fn(HipModule) -> HipError;
        hipModuleGetFunction: fn(*mut HipFunction, HipModule, *const c_char) -> HipError;
        hipModuleLaunchKernel: fn(
            HipFunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, HipStream,
            *mut *mut c_void, *mut *mut c_void
        ) -> HipError;
        hipFuncSetAttribute: fn(*const c_void, c_int, c_int) -> HipError;
    }
}

fn_table! {
    /// hipRTC (libhiprtc on ROCm 6, inside libamdhip64 on ROCm 5).
    HiprtcFns {
        hiprtcGetErrorString: fn(HiprtcResult) -> *const c_char;
        hiprtcVersion: fn(*mut c_int, *mut c_int) -> HiprtcResult;
        hiprtcCreateProgram: fn(
            *mut HiprtcProgram, *const c_char, *const c_char, c_int, *const *const c_char,
            *const *const c_char
        ) -> HiprtcResult;
        hiprtcCompileProgram: fn(HiprtcProgram, c_int, *const *const c_char) -> HiprtcResult;
        hiprtcDestroyProgram: fn(*mut HiprtcProgram) -> HiprtcResult;
        hiprtcGetProgramLogSize: fn(HiprtcProgram, *mut usize) -> HiprtcResult;
        hiprtcGetProgramLog: fn(HiprtcProgram, *mut c_char) -> HiprtcResult;
        hiprtcGetCodeSize: fn(HiprtcProgram, *mut usize) -> HiprtcResult;
        hiprtcGetCode: fn(HiprtcProgram, *mut c_char) -> HiprtcResult;
    }
}

fn_table! {
    /// Stream capture and graphs (libamdhip64 since ROCm 4.3-4.5; loaded apart from
    /// [`HipFns`] so that a runtime without them still runs every op).
    HipGraphFns {
        hipStreamBeginCapture: fn(HipStream, c_int) -> HipError;
        hipStreamEndCapture: fn(HipStream, *mut HipGraph) -> HipError;
        hipGraphInstantiate: fn(*mut HipGraphExec, HipGraph, *mut HipGraphNode, *mut c_char, usize) -> HipError;
        hipGraphLaunch: fn(HipGraphExec, HipStream) -> HipError;
        hipGraphExecDestroy: fn(HipGraphExec) -> HipError;
        hipGraphDestroy: fn(HipGraph) -> HipError;
        hipGraphGetNodes: fn(HipGraph, *mut HipGraphNode, *mut usize) -> HipError;
        hipGraphNodeGetType: fn(HipGraphNode, *mut c_int) -> HipError;
    }
}

/// `hipGetDevicePropertiesR0600(hipDeviceProp_tR0600*, int)` or, on ROCm 5,
/// `hipGetDeviceProperties(hipDeviceProp_t*, int)`: same C signature, different layouts.
pub type GetDevicePropertiesFn = unsafe extern "C" fn(*mut c_void, c_int) -> HipError;
