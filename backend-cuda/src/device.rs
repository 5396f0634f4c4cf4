//! `CudaDevice`: one GPU, its stream, its compiled kernels.

use crate::error::{driver, driver_err};
use crate::storage::{CudaStorage, Queue};
use crate::{nvrtc, probe};
use calico_core::{
    Arch, Backend, BackendKind, CompilerInfo, DeviceId, DiskCache, DynVariant, Error, GpuBackend,
    KernelArg, KernelSource, LaunchConfig, Result, Storage, Tensor, VariantCache,
};
use cudarc::driver::{
    result, sys, CudaContext, CudaGraph, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
};
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

/// Most parameters a kernel launch takes (the pointers to them live on the stack).
const MAX_KERNEL_ARGS: usize = 64;

/// A loaded kernel: its module (kept loaded) and function handle.
struct LoadedKernel {
    module: sys::CUmodule,
    function: sys::CUfunction,
    /// The entry point's name, for error messages.
    entry: String,
    /// The dynamic shared memory limit already raised for this function.
    smem_limit: AtomicU32,
}

// SAFETY: CUmodule/CUfunction are driver handles, valid in any thread once their context is
// bound; the driver API is thread-safe. They are only used after `Queue::bind`.
unsafe impl Send for LoadedKernel {}
// SAFETY: as above; shared access only reads the handles (the limit is an atomic).
unsafe impl Sync for LoadedKernel {}

/// Ops recorded by [`CudaDevice::capture_graph`], ready to replay.
pub struct CapturedGraph {
    graph: CudaGraph,
}

impl std::fmt::Debug for CapturedGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CapturedGraph(..)")
    }
}

impl CapturedGraph {
    /// Queues one replay on the stream the graph was captured on (no synchronisation): the
    /// recorded kernels run again on the same tensors.
    pub fn launch(&self) -> Result<()> {
        self.graph.launch().map_err(driver_err("cuGraphLaunch"))
    }

    /// The cudarc graph, for interop (inspecting nodes, uploading).
    pub fn as_cudarc(&self) -> &CudaGraph {
        &self.graph
    }
}

/// One NVIDIA GPU, seen through one stream: every op of this handle is queued on it.
/// [`CudaDevice::with_stream`] gives another handle to the same GPU (same loaded kernels)
/// that queues on a stream of the caller's.
#[derive(Clone)]
pub struct CudaDevice {
    inner: Arc<Inner>,
}

/// What one stream's handle owns: the stream and its scratch buffer.
struct Inner {
    queue: Arc<Queue>,
    shared: Arc<Shared>,
    /// The scratch buffer of `GpuBackend::with_workspace`, grown on demand.
    workspace: Mutex<Option<CudaStorage>>,
    /// The buffer of `GpuBackend::with_counters`: zeros between ops.
    counters: Mutex<Option<CudaStorage>>,
}

/// What every handle of one GPU shares: its description and its loaded kernels.
struct Shared {
    ctx: Arc<CudaContext>,
    name: String,
    arch: Arch,
    compiler: CompilerInfo,
    disk: DiskCache,
    /// Kernels launched by source (`GpuBackend::launch`), by digest.
    by_digest: Mutex<HashMap<[u8; 32], Arc<LoadedKernel>>>,
    /// Kernels launched by variant (`GpuBackend::launch_variant`): the hot path.
    by_variant: VariantCache<Arc<LoadedKernel>>,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.inner.queue.id.ordinal)
            .field("name", &self.inner.shared.name)
            .field("arch", &self.inner.shared.arch.target)
            .finish()
    }
}

impl CudaDevice {
    /// Opens GPU `ordinal`. Fails cleanly (never panics) when libcuda, NVRTC or the device is
    /// missing, naming what was searched.
    pub fn new(ordinal: usize) -> Result<CudaDevice> {
        probe::require_driver()?;
        result::init().map_err(|e| Error::BackendUnavailable {
            backend: "cuda",
            reason: format!("cuInit failed: {}", driver("cuInit", e)),
        })?;
        let count = result::device::get_count().map_err(driver_err("cuDeviceGetCount"))?;
        if count <= 0 {
            return Err(Error::BackendUnavailable {
                backend: "cuda",
                reason: "the CUDA driver found no device".into(),
            });
        }
        if ordinal >= count as usize {
            return Err(Error::BackendUnavailable {
                backend: "cuda",
                reason: format!("device {ordinal} requested, {count} present"),
            });
        }
        probe::require_nvrtc()?;
        let ctx = CudaContext::new(ordinal).map_err(driver_err("cuDevicePrimaryCtxRetain"))?;
        // Calico orders all work on one stream per device and manages memory with the result
        // layer, so cudarc's cross-stream event tracking would only add overhead.
        // SAFETY: no cudarc safe-layer buffers shared across streams are created by Calico.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver_err("cuStreamCreate"))?;
        let attr = |a| ctx.attribute(a).map_err(driver_err("cuDeviceGetAttribute"));
        use sys::CUdevice_attribute::*;
        let major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? as u32;
        let minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)? as u32;
        let sms = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
        let smem = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as usize;
        let l2 = attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize;
        let name = ctx.name().map_err(driver_err("cuDeviceGetName"))?;
        let arch = Arch::nvidia(major, minor, sms, smem, l2);
        let compiler = CompilerInfo {
            name: "nvrtc",
            version: nvrtc::version()?,
        };
        let queue = Arc::new(Queue {
            ctx,
            stream,
            id: DeviceId {
                kind: BackendKind::Cuda,
                ordinal,
            },
        });
        let shared = Arc::new(Shared {
            ctx: queue.ctx.clone(),
            name,
            arch,
            compiler,
            disk: DiskCache::from_env(),
            by_digest: Mutex::new(HashMap::new()),
            by_variant: VariantCache::default(),
        });
        Ok(CudaDevice {
            inner: Arc::new(Inner {
                queue,
                shared,
                workspace: Mutex::new(None),
                counters: Mutex::new(None),
            }),
        })
    }

    /// A handle to the same GPU whose ops queue on `stream` (a cudarc stream of this device's
    /// context, e.g. one the caller captures into a graph or orders with its own work). It
    /// shares the loaded kernels and has its own scratch buffer. Tensors of either handle can
    /// be used with the other; ordering work between the two streams is the caller's job.
    pub fn with_stream(&self, stream: Arc<CudaStream>) -> Result<CudaDevice> {
        if !Arc::ptr_eq(stream.context(), &self.inner.queue.ctx) {
            return Err(Error::DeviceMismatch(
                "the stream belongs to another CUDA context".into(),
            ));
        }
        let queue = Arc::new(Queue {
            ctx: self.inner.queue.ctx.clone(),
            stream,
            id: self.inner.queue.id,
        });
        Ok(CudaDevice {
            inner: Arc::new(Inner {
                queue,
                shared: self.inner.shared.clone(),
                workspace: Mutex::new(None),
                counters: Mutex::new(None),
            }),
        })
    }

    /// The cudarc stream this handle's ops are queued on (for events, graph capture, or
    /// ordering with the caller's own work).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.inner.queue.stream
    }

    /// Records the ops `work` queues on this handle's stream into a CUDA graph instead of
    /// running them, and returns the graph (launch it with `CapturedGraph::launch`, which queues
    /// it on this stream). Run each op once before capturing it, so that its kernel is
    /// compiled and loaded and its scratch buffer sized: a captured op must not compile,
    /// allocate or synchronise. Capture is thread-local: other threads may keep working.
    pub fn capture_graph(&self, work: impl FnOnce() -> Result<()>) -> Result<CapturedGraph> {
        let stream = &self.inner.queue.stream;
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(driver_err("cuStreamBeginCapture"))?;
        let outcome = work();
        // End the capture whatever happened, so the stream is usable again.
        let graph = stream
            .end_capture(
                sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
            )
            .map_err(driver_err("cuStreamEndCapture"));
        outcome?;
        let graph = graph?.ok_or_else(|| Error::Runtime {
            backend: "cuda",
            call: "cuStreamEndCapture".into(),
            message: "the capture recorded no work".into(),
        })?;
        Ok(CapturedGraph { graph })
    }

    /// Number of CUDA devices, or an error saying why there are none.
    pub fn count() -> Result<usize> {
        probe::require_driver()?;
        result::init().map_err(driver_err("cuInit"))?;
        Ok(result::device::get_count().map_err(driver_err("cuDeviceGetCount"))? as usize)
    }

    /// The cudarc context, for interop with code that uses cudarc directly.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.inner.queue.ctx
    }

    /// How many kernels this GPU has loaded (all handles together). Every module is in the
    /// by-digest map once; the variant cache only points at those entries.
    pub fn loaded_kernels(&self) -> usize {
        self.inner
            .shared
            .by_digest
            .lock()
            .map(|m| m.len())
            .unwrap_or(0)
    }

    /// The raw stream all of this device's work runs on.
    pub fn cu_stream(&self) -> sys::CUstream {
        self.inner.queue.cu_stream()
    }

    /// Wraps a cudarc `CudaSlice` as a tensor without copying; the tensor keeps the slice alive.
    /// Waits for the slice's stream first, so earlier work on it is visible to Calico's stream.
    pub fn wrap_slice<T: DeviceRepr + Send + Sync + 'static>(
        &self,
        slice: CudaSlice<T>,
        dtype: calico_core::DType,
        shape: &[usize],
    ) -> Result<Tensor> {
        if !Arc::ptr_eq(slice.context(), &self.inner.queue.ctx) {
            return Err(Error::DeviceMismatch(
                "the CudaSlice belongs to another CUDA context".into(),
            ));
        }
        slice
            .stream()
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))?;
        let bytes = slice.num_bytes();
        let (ptr, _sync) = slice.device_ptr(slice.stream());
        drop(_sync);
        // SAFETY: `ptr` addresses the `bytes` bytes owned by `slice`, which the storage keeps
        // alive; it belongs to this device's context (checked above).
        let storage =
            unsafe { CudaStorage::borrowed(&self.inner.queue, ptr, bytes, Some(Box::new(slice))) };
        Tensor::from_storage(
            Arc::new(storage),
            dtype,
            calico_core::Layout::contiguous(shape),
        )
    }

    /// Wraps a raw device pointer as a tensor without copying.
    ///
    /// # Safety
    /// `ptr` must address at least `bytes` bytes of device memory in this device's context,
    /// valid until every tensor viewing it is dropped, and not written by other streams while
    /// Calico's work on it is queued.
    pub unsafe fn wrap_raw(
        &self,
        ptr: u64,
        bytes: usize,
        dtype: calico_core::DType,
        shape: &[usize],
    ) -> Result<Tensor> {
        // SAFETY: forwarded to the caller's contract above.
        let storage = unsafe { CudaStorage::borrowed(&self.inner.queue, ptr, bytes, None) };
        Tensor::from_storage(
            Arc::new(storage),
            dtype,
            calico_core::Layout::contiguous(shape),
        )
    }

    fn storage_ptr(&self, s: &dyn Storage) -> Result<u64> {
        if s.device_id() != self.inner.queue.id {
            return Err(Error::DeviceMismatch(format!(
                "buffer on {} used with {}",
                s.device_id(),
                self.inner.queue.id
            )));
        }
        s.device_address()
            .ok_or_else(|| Error::DeviceMismatch("not a device buffer".into()))
    }

    /// Compiles `source` (through the disk cache) and loads it.
    fn load(&self, source: &KernelSource) -> Result<Arc<LoadedKernel>> {
        let cubin = self.compile(source)?;
        self.inner.queue.bind()?;
        // The driver wants a pointer to the image; cubins need no NUL terminator.
        // SAFETY: `cubin` is a complete cubin produced by NVRTC for this device's target.
        let module = unsafe { result::module::load_data(cubin.as_ptr() as *const c_void) }
            .map_err(driver_err("cuModuleLoadData"))?;
        let entry = CString::new(source.entry.as_str())
            .map_err(|_| Error::unsupported("kernel entry contains NUL"))?;
        // SAFETY: `module` was just loaded; `entry` is a valid C string.
        let function = match unsafe { result::module::get_function(module, entry) } {
            Ok(f) => f,
            Err(e) => {
                // SAFETY: the module was loaded above and is not used after this.
                let _ = unsafe { result::module::unload(module) };
                return Err(driver("cuModuleGetFunction", e));
            }
        };
        Ok(Arc::new(LoadedKernel {
            module,
            function,
            entry: source.entry.clone(),
            smem_limit: AtomicU32::new(48 * 1024),
        }))
    }

    /// The loaded kernel for `source`, by digest (compiled and loaded once).
    fn kernel_by_source(&self, source: &KernelSource) -> Result<Arc<LoadedKernel>> {
        let map = &self.inner.shared.by_digest;
        if let Some(k) = map.lock().map_err(|_| poisoned())?.get(&source.digest) {
            return Ok(k.clone());
        }
        let loaded = self.load(source)?;
        let mut map = map.lock().map_err(|_| poisoned())?;
        Ok(map.entry(source.digest).or_insert(loaded).clone())
    }

    /// The loaded kernel for `variant`: a lookup by value on the hot path; the source is
    /// built, compiled and loaded only on a miss.
    fn kernel_by_variant(&self, variant: &dyn DynVariant) -> Result<Arc<LoadedKernel>> {
        let cache = &self.inner.shared.by_variant;
        if let Some(k) = cache.get(variant) {
            return Ok(k);
        }
        let source = variant.build_source(crate::device_headers())?;
        let loaded = self.kernel_by_source(&source)?;
        Ok(cache.insert(variant, loaded))
    }

    /// Queues `kernel` on this handle's stream. No allocation, no synchronisation.
    fn launch_loaded(
        &self,
        kernel: &LoadedKernel,
        config: &LaunchConfig,
        args: &[KernelArg],
    ) -> Result<()> {
        let (gx, gy, gz) = config.grid;
        let (bx, by, bz) = config.block;
        if gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0 || bx * by * bz > 1024 {
            return Err(Error::unsupported(format!(
                "launch of `{}` with grid {:?} and block {:?}",
                kernel.entry, config.grid, config.block
            )));
        }
        let arch = &self.inner.shared.arch;
        if config.shared_mem_bytes as usize > arch.shared_mem_per_block {
            return Err(Error::unsupported(format!(
                "`{}` asks for {} bytes of shared memory; the device allows {}",
                kernel.entry, config.shared_mem_bytes, arch.shared_mem_per_block
            )));
        }
        if args.len() > MAX_KERNEL_ARGS {
            return Err(Error::unsupported(format!(
                "`{}` takes {} arguments; at most {MAX_KERNEL_ARGS} are supported",
                kernel.entry,
                args.len()
            )));
        }
        self.inner.queue.bind()?;
        if config.shared_mem_bytes > kernel.smem_limit.load(Ordering::Acquire) {
            // SAFETY: the function handle is live; the value is within the device's opt-in limit.
            unsafe {
                result::function::set_function_attribute(
                    kernel.function,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    config.shared_mem_bytes as i32,
                )
            }
            .map_err(driver_err("cuFuncSetAttribute"))?;
            kernel
                .smem_limit
                .fetch_max(config.shared_mem_bytes, Ordering::AcqRel);
        }
        let mut params = [std::ptr::null_mut::<c_void>(); MAX_KERNEL_ARGS];
        for (slot, arg) in params.iter_mut().zip(args) {
            *slot = arg_pointer(arg);
        }
        // SAFETY: the function is loaded in this context; each pointer in `params` points into
        // `args`, which outlives the call (cuLaunchKernel copies the values before returning
        // and only reads through the pointers). Callers build `args` to match the kernel's
        // parameter list (the ops modules do).
        unsafe {
            result::launch_kernel(
                kernel.function,
                config.grid,
                config.block,
                config.shared_mem_bytes,
                self.cu_stream(),
                &mut params[..args.len()],
            )
        }
        .map_err(|e| driver(&format!("cuLaunchKernel({})", kernel.entry), e))
    }
}

fn poisoned() -> Error {
    Error::Runtime {
        backend: "cuda",
        call: "kernel cache".into(),
        message: "a thread panicked while holding the kernel cache lock".into(),
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Every handle of this GPU is gone; wait for all of their streams before unloading.
        if self.ctx.synchronize().is_ok() {
            if let Ok(map) = self.by_digest.get_mut() {
                for k in map.values() {
                    // SAFETY: all work is finished (synchronized above); each module is loaded
                    // once (the variant cache holds the same Arcs as this map) and unloaded once.
                    let _ = unsafe { result::module::unload(k.module) };
                }
            }
        }
    }
}

impl Backend for CudaDevice {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }
    fn device_id(&self) -> DeviceId {
        self.inner.queue.id
    }
    fn name(&self) -> &str {
        &self.inner.shared.name
    }
    fn arch(&self) -> &Arch {
        &self.inner.shared.arch
    }
    fn alloc(&self, bytes: usize) -> Result<Arc<dyn Storage>> {
        Ok(Arc::new(CudaStorage::alloc(&self.inner.queue, bytes)?))
    }
    fn synchronize(&self) -> Result<()> {
        self.inner.queue.synchronize()
    }
    fn copy_bytes(
        &self,
        dst: &dyn Storage,
        dst_offset: usize,
        src: &dyn Storage,
        src_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        calico_core::check_byte_range(dst.size_bytes(), dst_offset, bytes)?;
        calico_core::check_byte_range(src.size_bytes(), src_offset, bytes)?;
        let (d, s) = (self.storage_ptr(dst)?, self.storage_ptr(src)?);
        if bytes == 0 {
            return Ok(());
        }
        self.inner.queue.bind()?;
        // SAFETY: both ranges are inside live buffers of this device (checked above).
        unsafe {
            result::memcpy_dtod_async(
                d + dst_offset as u64,
                s + src_offset as u64,
                bytes,
                self.cu_stream(),
            )
        }
        .map_err(driver_err("cuMemcpyDtoDAsync"))
    }
    fn time_ms(&self, work: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        self.inner.queue.bind()?;
        let start = Event::new()?;
        let end = Event::new()?;
        start.record(self.cu_stream())?;
        work()?;
        end.record(self.cu_stream())?;
        // SAFETY: both events are live and recorded on this device's stream.
        unsafe { result::event::synchronize(end.0) }.map_err(driver_err("cuEventSynchronize"))?;
        // SAFETY: as above; both events have completed.
        let ms = unsafe { result::event::elapsed(start.0, end.0) }
            .map_err(driver_err("cuEventElapsedTime"))?;
        Ok(ms as f64)
    }
    fn as_gpu(&self) -> Option<&dyn GpuBackend> {
        Some(self)
    }
}

/// A timing event, destroyed on drop.
struct Event(sys::CUevent);

impl Event {
    fn new() -> Result<Event> {
        Ok(Event(
            result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
                .map_err(driver_err("cuEventCreate"))?,
        ))
    }
    fn record(&self, stream: sys::CUstream) -> Result<()> {
        // SAFETY: the event is live and the stream belongs to the bound context.
        unsafe { result::event::record(self.0, stream) }.map_err(driver_err("cuEventRecord"))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: the event was created by cuEventCreate and is destroyed once.
        let _ = unsafe { result::event::destroy(self.0) };
    }
}

impl GpuBackend for CudaDevice {
    fn vendor_headers(&self) -> &'static [(&'static str, &'static str)] {
        crate::device_headers()
    }
    fn compiler(&self) -> &CompilerInfo {
        &self.inner.shared.compiler
    }
    fn compile(&self, source: &KernelSource) -> Result<Arc<Vec<u8>>> {
        let target = self.inner.shared.arch.target.as_str();
        let opts = nvrtc::options(target, &nvrtc::include_dirs()).join(" ");
        let key = DiskCache::key(&[
            source.text.as_bytes(),
            source.entry.as_bytes(),
            target.as_bytes(),
            self.inner.shared.compiler.version.as_bytes(),
            opts.as_bytes(),
        ]);
        let cubin = self
            .inner
            .shared
            .disk
            .get_or_build(&key, || nvrtc::compile(source, target))?;
        Ok(Arc::new(cubin))
    }
    fn launch(
        &self,
        source: &KernelSource,
        config: &LaunchConfig,
        args: &[KernelArg],
    ) -> Result<()> {
        let kernel = self.kernel_by_source(source)?;
        self.launch_loaded(&kernel, config, args)
    }
    fn launch_variant(
        &self,
        variant: &dyn DynVariant,
        config: &LaunchConfig,
        args: &[KernelArg],
    ) -> Result<()> {
        let kernel = self.kernel_by_variant(variant)?;
        self.launch_loaded(&kernel, config, args)
    }
    fn with_workspace(&self, bytes: usize, work: &mut dyn FnMut(u64) -> Result<()>) -> Result<()> {
        let mut slot = self.inner.workspace.lock().map_err(|_| poisoned())?;
        if slot.as_ref().is_none_or(|w| w.size_bytes() < bytes) {
            // Grow geometrically so a sequence of slightly larger calls allocates rarely. The
            // old buffer is freed in stream order, after the work queued on it.
            let size = bytes.max(slot.as_ref().map_or(0, |w| w.size_bytes() * 3 / 2));
            *slot = None;
            *slot = Some(CudaStorage::alloc(&self.inner.queue, size)?);
        }
        let ptr = slot.as_ref().map_or(0, |w| w.ptr());
        work(ptr)
    }

    fn with_counters(&self, bytes: usize, work: &mut dyn FnMut(u64) -> Result<()>) -> Result<()> {
        let mut slot = self.inner.counters.lock().map_err(|_| poisoned())?;
        if slot.as_ref().is_none_or(|c| c.size_bytes() < bytes) {
            // A new buffer is zeroed in stream order (`CudaStorage::alloc`); the old one is
            // freed in stream order, after the work queued on it.
            let size = bytes.max(slot.as_ref().map_or(0, |c| c.size_bytes() * 3 / 2));
            *slot = None;
            *slot = Some(CudaStorage::alloc(&self.inner.queue, size)?);
        }
        let ptr = slot.as_ref().map_or(0, |c| c.ptr());
        work(ptr)
    }
}

/// A pointer to the value inside a kernel argument, as cuLaunchKernel wants it (`*mut` by
/// the API's signature; the driver only reads through it).
fn arg_pointer(arg: &KernelArg) -> *mut c_void {
    match arg {
        KernelArg::Ptr(v) | KernelArg::U64(v) => v as *const u64 as *mut c_void,
        KernelArg::I32(v) => v as *const i32 as *mut c_void,
        KernelArg::U32(v) => v as *const u32 as *mut c_void,
        KernelArg::I64(v) => v as *const i64 as *mut c_void,
        KernelArg::F32(v) => v as *const f32 as *mut c_void,
        KernelArg::Opaque128(v) => v as *const calico_core::OpaqueParam128 as *mut c_void,
        KernelArg::Params(v) => v.as_bytes().as_ptr() as *mut c_void,
    }
}
