//! `HipDevice`: one AMD GPU behind the `Backend` and `GpuBackend` traits.

use crate::context::Context;
use crate::context::Kernel;
use crate::graph::{self, CapturedHipGraph};
use crate::loader::{self, Runtime};
use crate::result::{check, hip_message};
use crate::storage::{self, HipStorage};
use crate::stream::OwnedStream;
use crate::{compile, launch, sys, timing};
use calico_core::{
    Arch, Backend, BackendKind, CompilerInfo, DeviceId, DiskCache, DynVariant, Error, GpuBackend,
    KernelArg, KernelSource, LaunchConfig, Result, Storage, Tensor, VariantCache,
};
use std::ffi::{c_char, c_int, CStr};
use std::sync::{Arc, Mutex};

/// An AMD GPU driven through the HIP runtime, with one stream. Cheap to clone.
#[derive(Debug, Clone)]
pub struct HipDevice {
    inner: Arc<Inner>,
}

#[derive(Debug, Clone)]
struct Inner {
    ctx: Arc<Context>,
    id: DeviceId,
    name: String,
    /// The full gcnArchName, feature flags included (`gfx942:sramecc+:xnack-`).
    gcn_arch: String,
    arch: Arch,
    max_threads_per_block: u32,
    compiler: CompilerInfo,
    cache: DiskCache,
    /// Loaded kernels by variant (`GpuBackend::launch_variant`): the hot path.
    variants: Arc<VariantCache<Kernel>>,
    /// The scratch buffer of `GpuBackend::with_workspace`, grown on demand.
    workspace: Arc<Mutex<Option<HipStorage>>>,
}

/// What a device reports about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    pub gcn_arch: String,
    pub compute_units: u32,
    pub lds_per_block: usize,
    pub wavefront: u32,
    pub l2_bytes: usize,
    pub max_threads_per_block: u32,
}

/// Number of HIP devices; 0 when the runtime is missing or finds none.
pub fn device_count() -> usize {
    loader::runtime()
        .ok()
        .and_then(|rt| count(rt).ok())
        .unwrap_or(0)
}

fn count(rt: &Runtime) -> std::result::Result<usize, String> {
    let mut n: c_int = 0;
    // SAFETY: live out-pointer.
    let code = unsafe { (rt.hip.hipGetDeviceCount)(&mut n) };
    if code != sys::HIP_SUCCESS {
        return Err(format!(
            "hipGetDeviceCount failed: {}",
            hip_message(&rt.hip, code)
        ));
    }
    Ok(usize::try_from(n).unwrap_or(0))
}

impl HipDevice {
    /// Opens device `ordinal`. A missing runtime or device is `Error::BackendUnavailable`.
    pub fn new(ordinal: usize) -> Result<HipDevice> {
        let rt = loader::runtime()?;
        let unavailable = |reason: String| Error::BackendUnavailable {
            backend: "hip",
            reason,
        };
        let n = count(rt)
            .map_err(|e| unavailable(format!("no HIP device: {e} (runtime {})", rt.hip_path)))?;
        if n == 0 {
            return Err(unavailable(format!(
                "no HIP device (runtime {} reports 0 devices)",
                rt.hip_path
            )));
        }
        if ordinal >= n {
            return Err(unavailable(format!("no HIP device {ordinal}: {n} present")));
        }
        let ordinal_c = ordinal as c_int; // < n, which came from a c_int
        let ctx = Arc::new(Context::new(rt, ordinal_c)?);
        let info = query(rt, ordinal_c)?;
        let arch = Arch::amd(
            &info.gcn_arch,
            info.compute_units,
            info.lds_per_block,
            info.wavefront,
            info.l2_bytes,
        );
        let version = match &rt.rtc {
            Ok(rtc) => compile::version(rtc, rt.version),
            Err(_) => "unavailable".to_string(),
        };
        Ok(HipDevice {
            inner: Arc::new(Inner {
                ctx,
                id: DeviceId {
                    kind: BackendKind::Hip,
                    ordinal,
                },
                name: info.name,
                gcn_arch: info.gcn_arch,
                arch,
                max_threads_per_block: info.max_threads_per_block,
                compiler: CompilerInfo {
                    name: "hiprtc",
                    version,
                },
                cache: DiskCache::from_env(),
                variants: Arc::new(VariantCache::default()),
                workspace: Arc::new(Mutex::new(None)),
            }),
        })
    }

    /// The raw HIP stream all of this device's work runs on (for events, ordering with the
    /// caller's own work, or capture by the caller).
    pub fn stream(&self) -> sys::HipStream {
        self.inner.ctx.stream()
    }

    /// Wraps a raw device pointer (memory the caller allocated on this GPU, e.g. another
    /// library's HIP buffer) as a tensor without copying.
    ///
    /// # Safety
    /// `ptr` must address at least `bytes` bytes of device memory of this GPU, valid until
    /// every tensor viewing it is dropped, and not written by other streams while Calico's work
    /// on it is queued.
    pub unsafe fn wrap_raw(
        &self,
        ptr: u64,
        bytes: usize,
        dtype: calico_core::DType,
        shape: &[usize],
    ) -> Result<Tensor> {
        // SAFETY: forwarded to the caller's contract above.
        let storage = unsafe { HipStorage::borrowed(self.inner.ctx.clone(), ptr, bytes) };
        Tensor::from_storage(
            Arc::new(storage),
            dtype,
            calico_core::Layout::contiguous(shape),
        )
    }

    /// A new non-blocking stream on this device for the caller's own work (destroyed when the
    /// returned value is dropped); see [`HipDevice::with_stream`].
    pub fn create_stream(&self) -> Result<OwnedStream> {
        OwnedStream::new(self.inner.ctx.rt, self.inner.ctx.ordinal)
    }

    /// A handle to the same GPU whose ops queue on `stream`, a HIP stream of the caller's (to
    /// order Calico's work with the caller's own, or to capture it). It shares the loaded
    /// kernels and has its own scratch buffer; tensors of either handle work with the other,
    /// and ordering work between the two streams is the caller's job.
    ///
    /// # Safety
    /// `stream` must be a live stream created on this device, and stay alive (not be
    /// destroyed) until the returned handle and every tensor allocated through it are dropped.
    pub unsafe fn with_stream(&self, stream: sys::HipStream) -> Result<HipDevice> {
        let ctx = Arc::new(self.inner.ctx.on_stream(stream));
        let inner = Inner {
            ctx,
            workspace: Arc::new(Mutex::new(None)),
            ..(*self.inner).clone()
        };
        Ok(HipDevice {
            inner: Arc::new(inner),
        })
    }

    /// Records the ops `work` queues on this device's stream into a HIP graph instead of
    /// running them, and returns it instantiated (launch it with `CapturedHipGraph::launch`,
    /// which queues it on this stream). Run each op once before capturing it, so that its
    /// kernel is compiled and loaded and its scratch buffer sized: a captured op must not
    /// compile, allocate or synchronise. Capture is thread-local: other threads may keep
    /// working. `Err(Unsupported)` when the runtime has no graph entry points.
    pub fn capture_graph(&self, work: impl FnOnce() -> Result<()>) -> Result<CapturedHipGraph> {
        graph::capture(&self.inner.ctx, work)
    }

    /// How many kernels this device has loaded (the per-variant cache points into these).
    pub fn loaded_kernels(&self) -> usize {
        self.inner
            .ctx
            .kernels
            .map
            .lock()
            .map(|m| m.len())
            .unwrap_or(0)
    }

    /// The full gcnArchName, feature flags included.
    pub fn gcn_arch_name(&self) -> &str {
        &self.inner.gcn_arch
    }

    /// Uses `cache` instead of `DiskCache::from_env()` for compiled code objects.
    pub fn with_cache(mut self, cache: DiskCache) -> Self {
        Arc::make_mut(&mut self.inner).cache = cache;
        self
    }

    /// The loaded kernel for `source`, by digest (compiled and loaded once).
    fn kernel_by_source(&self, source: &KernelSource) -> Result<Kernel> {
        match self.inner.ctx.cached(&source.digest) {
            Some(k) => Ok(k),
            None => {
                let code = self.code_object(source)?;
                self.inner.ctx.load(source.digest, &code, &source.entry)
            }
        }
    }

    fn storage<'a>(&self, s: &'a dyn Storage, role: &str) -> Result<&'a HipStorage> {
        let hip = s.as_any().downcast_ref::<HipStorage>().ok_or_else(|| {
            Error::DeviceMismatch(format!(
                "{role} buffer lives on {}, not {}",
                s.device_id(),
                self.inner.id
            ))
        })?;
        if hip.ordinal() != self.inner.ctx.ordinal {
            return Err(Error::DeviceMismatch(format!(
                "{role} buffer lives on {}, not {}",
                s.device_id(),
                self.inner.id
            )));
        }
        Ok(hip)
    }

    fn code_object(&self, source: &KernelSource) -> Result<Vec<u8>> {
        let rtc = self
            .inner
            .ctx
            .rt
            .rtc
            .as_ref()
            .map_err(|reason| Error::BackendUnavailable {
                backend: "hip",
                reason: reason.clone(),
            })?;
        let key = compile::cache_key(
            source,
            &self.inner.gcn_arch,
            &self.inner.compiler.version,
            &compile::options(&self.inner.gcn_arch),
        );
        self.inner
            .cache
            .get_or_build(&key, || compile::compile(rtc, source, &self.inner.gcn_arch))
    }
}

fn attribute(rt: &Runtime, attr: c_int, ordinal: c_int, what: &str) -> Result<i32> {
    let mut v: c_int = 0;
    // SAFETY: live out-pointer; attribute ids come from sys::attr.
    let code = unsafe { (rt.hip.hipDeviceGetAttribute)(&mut v, attr, ordinal) };
    check(&rt.hip, code, &format!("hipDeviceGetAttribute({what})"))?;
    Ok(v)
}

fn query(rt: &Runtime, ordinal: c_int) -> Result<DeviceInfo> {
    let mut name = [0 as c_char; 256];
    // SAFETY: the buffer holds the 256 bytes we say it does.
    let code = unsafe { (rt.hip.hipDeviceGetName)(name.as_mut_ptr(), 256, ordinal) };
    check(&rt.hip, code, "hipDeviceGetName")?;
    name[255] = 0;
    // SAFETY: NUL-terminated by the line above.
    let name = unsafe { CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .trim()
        .to_string();
    let nonneg = |v: i32| u32::try_from(v).unwrap_or(0);
    let lds = attribute(
        rt,
        sys::attr::MAX_SHARED_MEMORY_PER_BLOCK,
        ordinal,
        "MaxSharedMemoryPerBlock",
    )?;
    let optin = attribute(
        rt,
        sys::attr::SHARED_MEM_PER_BLOCK_OPTIN,
        ordinal,
        "SharedMemPerBlockOptin",
    )
    .unwrap_or(0);
    Ok(DeviceInfo {
        name,
        gcn_arch: gcn_arch_name(rt, ordinal)?,
        compute_units: nonneg(attribute(
            rt,
            sys::attr::MULTIPROCESSOR_COUNT,
            ordinal,
            "MultiprocessorCount",
        )?),
        lds_per_block: nonneg(lds.max(optin)) as usize,
        wavefront: nonneg(attribute(rt, sys::attr::WARP_SIZE, ordinal, "WarpSize")?),
        l2_bytes: nonneg(
            attribute(rt, sys::attr::L2_CACHE_SIZE, ordinal, "L2CacheSize").unwrap_or(0),
        ) as usize,
        max_threads_per_block: nonneg(attribute(
            rt,
            sys::attr::MAX_THREADS_PER_BLOCK,
            ordinal,
            "MaxThreadsPerBlock",
        )?),
    })
}

/// Reads gcnArchName from the properties struct (see `sys::props` for the layouts).
fn gcn_arch_name(rt: &Runtime, ordinal: c_int) -> Result<String> {
    let (get, offset) = rt.props.ok_or_else(|| Error::Runtime {
        backend: "hip",
        call: "hipGetDeviceProperties".into(),
        message: format!(
            "runtime {} (version {}) exports no properties call with a known layout",
            rt.hip_path, rt.version
        ),
    })?;
    // u64 elements: aligned for the struct's size_t and pointer fields.
    let mut buf = vec![0u64; sys::props::BUFFER_BYTES / 8];
    // SAFETY: the buffer is larger than either layout (1472 or 792 bytes) and suitably aligned.
    let code = unsafe { get(buf.as_mut_ptr().cast(), ordinal) };
    check(&rt.hip, code, "hipGetDeviceProperties")?;
    let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
    parse_gcn_arch(&bytes, offset).ok_or_else(|| Error::Runtime {
        backend: "hip",
        call: "hipGetDeviceProperties".into(),
        message: format!(
            "no gfx name at offset {offset} of hipDeviceProp_t (runtime version {})",
            rt.version
        ),
    })
}

/// The NUL-terminated `gfx...` name at `offset`, or None if the bytes are not one.
fn parse_gcn_arch(bytes: &[u8], offset: usize) -> Option<String> {
    let field = bytes.get(offset..offset + sys::props::GCN_ARCH_NAME_LEN)?;
    let end = field.iter().position(|&b| b == 0)?;
    let name = std::str::from_utf8(&field[..end]).ok()?;
    name.starts_with("gfx").then(|| name.to_string())
}

impl Backend for HipDevice {
    fn kind(&self) -> BackendKind {
        BackendKind::Hip
    }

    fn device_id(&self) -> DeviceId {
        self.inner.id
    }

    fn name(&self) -> &str {
        &self.inner.name
    }

    fn arch(&self) -> &Arch {
        &self.inner.arch
    }

    fn alloc(&self, bytes: usize) -> Result<Arc<dyn Storage>> {
        Ok(Arc::new(HipStorage::zeroed(self.inner.ctx.clone(), bytes)?))
    }

    fn synchronize(&self) -> Result<()> {
        self.inner.ctx.sync()
    }

    fn copy_bytes(
        &self,
        dst: &dyn Storage,
        dst_offset: usize,
        src: &dyn Storage,
        src_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        let dst = self.storage(dst, "destination")?;
        let src = self.storage(src, "source")?;
        storage::copy_async(&self.inner.ctx, dst, dst_offset, src, src_offset, bytes)
    }

    fn time_ms(&self, work: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        timing::time_ms(&self.inner.ctx, work)
    }

    fn as_gpu(&self) -> Option<&dyn GpuBackend> {
        Some(self)
    }
}

impl GpuBackend for HipDevice {
    fn vendor_headers(&self) -> &'static [(&'static str, &'static str)] {
        crate::hip_headers()
    }

    fn compiler(&self) -> &CompilerInfo {
        &self.inner.compiler
    }

    fn launch(
        &self,
        source: &KernelSource,
        config: &LaunchConfig,
        args: &[KernelArg],
    ) -> Result<()> {
        launch::validate(
            config,
            self.inner.max_threads_per_block,
            self.inner.arch.shared_mem_per_block,
        )?;
        let kernel = self.kernel_by_source(source)?;
        launch::launch(&self.inner.ctx, kernel, config, args)
    }

    fn launch_variant(
        &self,
        variant: &dyn DynVariant,
        config: &LaunchConfig,
        args: &[KernelArg],
    ) -> Result<()> {
        launch::validate(
            config,
            self.inner.max_threads_per_block,
            self.inner.arch.shared_mem_per_block,
        )?;
        let kernel = match self.inner.variants.get(variant) {
            Some(k) => k,
            None => {
                let source = variant.build_source(crate::hip_headers())?;
                let k = self.kernel_by_source(&source)?;
                self.inner.variants.insert(variant, k)
            }
        };
        launch::launch(&self.inner.ctx, kernel, config, args)
    }

    fn with_workspace(&self, bytes: usize, work: &mut dyn FnMut(u64) -> Result<()>) -> Result<()> {
        let mut slot = self
            .inner
            .workspace
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_none_or(|w| w.size_bytes() < bytes) {
            let size = bytes.max(slot.as_ref().map_or(0, |w| w.size_bytes() * 3 / 2));
            // The old buffer may still be read by queued work: wait for it before freeing.
            if slot.is_some() {
                self.inner.ctx.sync()?;
            }
            *slot = None;
            *slot = Some(HipStorage::zeroed(self.inner.ctx.clone(), size)?);
        }
        let ptr = slot.as_ref().map_or(0, |w| w.as_ptr());
        work(ptr)
    }

    fn compile(&self, source: &KernelSource) -> Result<Arc<Vec<u8>>> {
        Ok(Arc::new(self.code_object(source)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gcn_arch_parses_from_either_layout() {
        for (size, offset) in [
            (sys::props::R0600_SIZE, sys::props::R0600_GCN_ARCH_NAME),
            (sys::props::R0000_SIZE, sys::props::R0000_GCN_ARCH_NAME),
        ] {
            let mut b = vec![0u8; size];
            let name = b"gfx942:sramecc+:xnack-";
            b[offset..offset + name.len()].copy_from_slice(name);
            assert_eq!(
                parse_gcn_arch(&b, offset).as_deref(),
                Some("gfx942:sramecc+:xnack-")
            );
            assert!(offset + sys::props::GCN_ARCH_NAME_LEN <= size);
        }
        assert_eq!(
            parse_gcn_arch(&[b'x'; 600], 100),
            None,
            "unterminated or non-gfx bytes are rejected"
        );
        assert_eq!(parse_gcn_arch(&[0; 10], 100), None);
    }

    #[test]
    fn hip_device_is_send_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<HipDevice>();
        assert_send_sync::<HipStorage>();
    }
}
