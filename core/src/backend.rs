//! The traits every backend implements: memory, timing, and (for GPUs) compile and launch.

use crate::{Arch, DynVariant, KernelSource, Result};
use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// Which backend a device or buffer belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackendKind {
    Cuda,
    Hip,
    Cpu,
}

impl BackendKind {
    pub const fn name(self) -> &'static str {
        match self {
            BackendKind::Cuda => "cuda",
            BackendKind::Hip => "hip",
            BackendKind::Cpu => "cpu",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Identifies one device: tensors may only meet in an op when their ids are equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceId {
    pub kind: BackendKind,
    pub ordinal: usize,
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind, self.ordinal)
    }
}

/// A buffer of bytes on some device. Tensors share storage through `Arc`.
pub trait Storage: Send + Sync + fmt::Debug + Any {
    /// The device that owns the bytes.
    fn device_id(&self) -> DeviceId;
    /// Size in bytes.
    fn size_bytes(&self) -> usize;
    /// Copies `src` into the buffer at byte `offset` (blocking).
    fn write_bytes(&self, offset: usize, src: &[u8]) -> Result<()>;
    /// Copies bytes at `offset` into `dst` (blocking; waits for queued work).
    fn read_bytes(&self, offset: usize, dst: &mut [u8]) -> Result<()>;
    /// The device address of byte 0, for GPU buffers.
    fn device_address(&self) -> Option<u64>;
    /// For backends to downcast their own storage.
    fn as_any(&self) -> &dyn Any;
}

/// Checks that `offset..offset + len` lies within a buffer of `size` bytes.
pub fn check_byte_range(size: usize, offset: usize, len: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(crate::Error::OutOfBounds(format!(
            "bytes {offset}..{offset}+{len} outside a buffer of {size} bytes"
        ))),
    }
}

/// One device of one backend.
pub trait Backend: Send + Sync + fmt::Debug {
    fn kind(&self) -> BackendKind;
    fn device_id(&self) -> DeviceId;
    /// The device's marketing name ("NVIDIA H100 80GB HBM3", the CPU's model name).
    fn name(&self) -> &str;
    fn arch(&self) -> &Arch;
    /// Allocates `bytes` zero-filled bytes.
    fn alloc(&self, bytes: usize) -> Result<Arc<dyn Storage>>;
    /// Waits until all queued work is done.
    fn synchronize(&self) -> Result<()>;
    /// Copies `bytes` bytes between two buffers of this device, asynchronously on GPUs.
    fn copy_bytes(
        &self,
        dst: &dyn Storage,
        dst_offset: usize,
        src: &dyn Storage,
        src_offset: usize,
        bytes: usize,
    ) -> Result<()>;
    /// Runs `work` and returns the device time it took in milliseconds (device events on GPUs,
    /// the wall clock on the CPU).
    fn time_ms(&self, work: &mut dyn FnMut() -> Result<()>) -> Result<f64>;
    /// The GPU interface, for devices that compile and launch kernels.
    fn as_gpu(&self) -> Option<&dyn GpuBackend> {
        None
    }
}

/// Grid, block and dynamic shared memory of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// A 1-D grid of `blocks` blocks of `threads` threads.
    pub fn linear(blocks: u32, threads: u32, shared_mem_bytes: u32) -> Self {
        LaunchConfig {
            grid: (blocks, 1, 1),
            block: (threads, 1, 1),
            shared_mem_bytes,
        }
    }
}

/// 128 bytes aligned to 64: the size and alignment of a CUDA tensor map (`CUtensorMap`),
/// passed to kernels by value as a `__grid_constant__` parameter.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct OpaqueParam128(pub [u8; 128]);

impl fmt::Debug for OpaqueParam128 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OpaqueParam128(..)")
    }
}

/// Capacity of a [`ParamBlock`]: the largest parameter struct a kernel takes by value.
pub const PARAM_BLOCK_BYTES: usize = 192;

/// A `#[repr(C)]` struct a kernel takes by value as one parameter, mirrored by a device struct
/// of the same layout.
///
/// # Safety
/// Implement it only for `#[repr(C)]` structs made of integers, floats and device addresses
/// (`u64`) with no padding bytes, so that every byte of a value is initialised and the bytes
/// mean the same to the device. The device side checks the size and field offsets against
/// constants the host emits (see `calico::gemm::params`), not this trait.
pub unsafe trait KernelParams: Copy + 'static {}

/// The bytes of one [`KernelParams`] value, passed to the kernel as a single by-value
/// parameter (the driver copies as many bytes as the kernel's parameter is long; the device
/// checks that length against `size_of` at compile time).
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C, align(8))]
pub struct ParamBlock {
    bytes: [u8; PARAM_BLOCK_BYTES],
    len: u32,
}

impl ParamBlock {
    /// Checked when `new::<T>` is instantiated: `T` fits the block.
    const fn fits<T>() -> bool {
        std::mem::size_of::<T>() <= PARAM_BLOCK_BYTES
    }

    /// Copies `value`'s bytes.
    pub fn new<T: KernelParams>(value: &T) -> ParamBlock {
        const {
            assert!(
                Self::fits::<T>(),
                "parameter struct larger than PARAM_BLOCK_BYTES"
            )
        };
        let len = std::mem::size_of::<T>();
        let mut bytes = [0u8; PARAM_BLOCK_BYTES];
        // SAFETY: `T: KernelParams` promises a #[repr(C)] struct without padding, so all `len`
        // bytes behind `value` are initialised; `bytes` holds at least `len` bytes (the const
        // assertion above) and is a separate local, so the regions do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (value as *const T).cast::<u8>(),
                bytes.as_mut_ptr(),
                len,
            );
        }
        ParamBlock {
            bytes,
            len: len as u32,
        }
    }

    /// The struct's bytes (what the kernel receives).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

impl fmt::Debug for ParamBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ParamBlock({} bytes)", self.len)
    }
}

/// One kernel argument, in the order of the kernel's parameter list.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KernelArg {
    /// A device pointer.
    Ptr(u64),
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F32(f32),
    /// A 128-byte opaque struct (a TMA descriptor).
    Opaque128(OpaqueParam128),
    /// A parameter struct passed by value ([`KernelParams`]).
    Params(ParamBlock),
}

/// The compiler a GPU backend uses at run time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompilerInfo {
    /// "nvrtc" or "hiprtc".
    pub name: &'static str,
    /// Version string; part of the compile-cache key.
    pub version: String,
}

/// What a GPU backend adds: its device headers, the compiler, and kernel launches.
pub trait GpuBackend: Backend {
    /// The vendor's device headers (`calico/vendor.h` and its primitives), for
    /// [`KernelSource::assemble`].
    fn vendor_headers(&self) -> &'static [(&'static str, &'static str)];
    fn compiler(&self) -> &CompilerInfo;
    /// Launches the kernel of `variant` with `args` (the hot path of every op). The loaded
    /// kernel is found by the variant's value; its source is built, compiled (through the disk
    /// cache) and loaded only the first time. Allocates nothing and never synchronises, so
    /// launches can be captured into a CUDA graph. Args must match the kernel's parameters in
    /// order and type.
    fn launch_variant(
        &self,
        variant: &dyn DynVariant,
        config: &LaunchConfig,
        args: &[KernelArg],
    ) -> Result<()>;
    /// Runs `work` with the device address of a scratch buffer of at least `bytes` bytes that
    /// belongs to this device's stream. The buffer is kept and reused by later calls (it grows
    /// when a call needs more, never shrinks), and no other caller gets it while `work` runs;
    /// the work `work` queues may use it until the next op on the same stream. Ops that need
    /// scratch space use this, so that a repeated call allocates nothing.
    fn with_workspace(&self, bytes: usize, work: &mut dyn FnMut(u64) -> Result<()>) -> Result<()>;
    /// Runs `work` with the device address of a buffer of at least `bytes` bytes that holds
    /// zeros whenever no op runs on this device's stream: for counters that the blocks of one
    /// launch share (the last block of a group to finish does a merge). The work must leave
    /// every byte it touched zero again by the end of its kernels, so the next op (or a replay
    /// of a captured graph) finds zeros without a memset. Kept and reused like the workspace;
    /// call it inside [`GpuBackend::with_workspace`], never the reverse. Backends without it
    /// return `Err(Unsupported)`.
    fn with_counters(&self, bytes: usize, work: &mut dyn FnMut(u64) -> Result<()>) -> Result<()> {
        let _ = (bytes, work);
        Err(crate::Error::unsupported(
            "this backend has no zeroed counter buffer",
        ))
    }
    /// Compiles (or fetches from the caches) and launches `source` with `args`. Args must
    /// match the kernel's parameters in order and type. Finds the loaded kernel by the
    /// source's digest: for one-off kernels; ops use [`GpuBackend::launch_variant`].
    fn launch(
        &self,
        source: &KernelSource,
        config: &LaunchConfig,
        args: &[KernelArg],
    ) -> Result<()>;
    /// Compiles `source` for this device (or fetches it from the disk cache) and returns the
    /// binary; used by `calico compile` and to warm caches.
    fn compile(&self, source: &KernelSource) -> Result<Arc<Vec<u8>>>;
}
