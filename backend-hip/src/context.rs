//! One device's runtime state: its ordinal, its stream and its loaded kernels. Shared by the
//! device and every buffer it allocated, so buffers can be freed after the device is dropped.

use crate::loader::Runtime;
use crate::result::check;
use crate::sys::{HipFunction, HipModule, HipStream};
use calico_core::Result;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A raw HIP handle that may cross threads.
#[derive(Debug, Clone, Copy)]
pub struct Handle(pub *mut std::ffi::c_void);
// SAFETY: HIP streams, modules and functions are process-wide objects the runtime lets any
// host thread use; Calico only passes them back to the runtime.
unsafe impl Send for Handle {}
// SAFETY: as above; the handle itself is an immutable pointer value.
unsafe impl Sync for Handle {}

/// A loaded module and the entry point looked up in it.
#[derive(Debug, Clone, Copy)]
pub struct Kernel {
    pub module: Handle,
    pub function: Handle,
}

/// The modules one device has loaded, shared by every handle (stream) of it and unloaded
/// when the last one goes.
#[derive(Debug)]
pub struct Modules {
    rt: &'static Runtime,
    ordinal: i32,
    /// KernelSource digest -> loaded kernel, so repeat launches skip compile and load.
    pub map: Mutex<HashMap<[u8; 32], Kernel>>,
}

impl Drop for Modules {
    fn drop(&mut self) {
        let hip = &self.rt.hip;
        // SAFETY: plain int argument. Then: the last handle is gone, so no launch can use
        // these modules any more (each handle synchronised its stream when it was dropped).
        // Errors during teardown have nowhere to go and are ignored.
        unsafe {
            (hip.hipSetDevice)(self.ordinal);
            let map = self.map.get_mut().unwrap_or_else(|p| p.into_inner());
            for k in map.values() {
                (hip.hipModuleUnload)(k.module.0);
            }
        }
    }
}

#[derive(Debug)]
pub struct Context {
    pub rt: &'static Runtime,
    pub ordinal: i32,
    pub stream: Handle,
    /// Whether this context created the stream (and destroys it) or borrows a caller's.
    owns_stream: bool,
    pub kernels: Arc<Modules>,
}

impl Context {
    /// Makes this device current on the calling thread (HIP's current device is per thread).
    pub fn bind(&self) -> Result<()> {
        // SAFETY: plain int argument; the ordinal was validated against the device count.
        check(
            &self.rt.hip,
            unsafe { (self.rt.hip.hipSetDevice)(self.ordinal) },
            "hipSetDevice",
        )
    }

    pub fn new(rt: &'static Runtime, ordinal: i32) -> Result<Context> {
        let stream = crate::stream::create_non_blocking(rt, ordinal)?;
        Ok(Context {
            rt,
            ordinal,
            stream: Handle(stream),
            owns_stream: true,
            kernels: Arc::new(Modules {
                rt,
                ordinal,
                map: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// A context of the same device whose work queues on `stream`, a caller's stream that
    /// this context neither creates nor destroys; it shares the loaded modules.
    pub fn on_stream(&self, stream: HipStream) -> Context {
        Context {
            rt: self.rt,
            ordinal: self.ordinal,
            stream: Handle(stream),
            owns_stream: false,
            kernels: self.kernels.clone(),
        }
    }

    pub fn stream(&self) -> HipStream {
        self.stream.0
    }

    /// Waits for all work queued on the device's stream.
    pub fn sync(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: the stream is alive for as long as `self`.
        check(
            &self.rt.hip,
            unsafe { (self.rt.hip.hipStreamSynchronize)(self.stream()) },
            "hipStreamSynchronize",
        )
    }

    /// The cached kernel for `digest`, if loaded.
    pub fn cached(&self, digest: &[u8; 32]) -> Option<Kernel> {
        self.kernels.map.lock().ok()?.get(digest).copied()
    }

    /// Loads `code` and looks up `entry`; the first kernel stored for a digest wins.
    pub fn load(&self, digest: [u8; 32], code_object: &[u8], entry: &str) -> Result<Kernel> {
        let name = std::ffi::CString::new(entry).map_err(|_| {
            calico_core::Error::unsupported(format!("kernel name {entry:?} contains a NUL byte"))
        })?;
        self.bind()?;
        let hip = &self.rt.hip;
        let mut module: HipModule = std::ptr::null_mut();
        // SAFETY: `code_object` is a complete code object that outlives the call (the runtime copies it).
        let code = unsafe { (hip.hipModuleLoadData)(&mut module, code_object.as_ptr().cast()) };
        check(hip, code, "hipModuleLoadData")?;
        let mut function: HipFunction = std::ptr::null_mut();
        // SAFETY: `module` was just loaded; `name` is NUL-terminated.
        let code = unsafe { (hip.hipModuleGetFunction)(&mut function, module, name.as_ptr()) };
        if let Err(e) = check(hip, code, &format!("hipModuleGetFunction({entry})")) {
            // SAFETY: the module is ours and nothing refers to it.
            unsafe { (hip.hipModuleUnload)(module) };
            return Err(e);
        }
        let kernel = Kernel {
            module: Handle(module),
            function: Handle(function),
        };
        let mut map = self.kernels.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(existing) = map.get(&digest) {
            // Another thread won the race; drop our copy.
            // SAFETY: the module is ours and nothing refers to it.
            unsafe { (hip.hipModuleUnload)(module) };
            return Ok(*existing);
        }
        map.insert(digest, kernel);
        Ok(kernel)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        let hip = &self.rt.hip;
        let _ = self.bind();
        // SAFETY: the last owner of this handle is going away: its queued work is waited
        // for, and a stream it created is destroyed (a borrowed one stays the caller's). The
        // modules go with the last handle (`Modules`). Errors during teardown are ignored.
        unsafe {
            (hip.hipStreamSynchronize)(self.stream.0);
            if self.owns_stream {
                (hip.hipStreamDestroy)(self.stream.0);
            }
        }
    }
}
