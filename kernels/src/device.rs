//! `Device`: one enum over the three backends, chosen at run time.

use calico_core::{Backend, BackendKind, DType, Element, Error, Result, Tensor};
use calico_cpu::CpuDevice;
use calico_cuda::CudaDevice;
use calico_hip::HipDevice;
use enum_dispatch::enum_dispatch;
use std::ops::Deref;

/// Access to the backend behind a [`Device`] variant (dispatched by `enum_dispatch`, so the
/// variant match compiles to a jump rather than a virtual call).
#[enum_dispatch]
pub trait AsBackend {
    /// The backend as a trait object.
    fn backend(&self) -> &(dyn Backend + 'static);
}

impl AsBackend for CudaDevice {
    fn backend(&self) -> &(dyn Backend + 'static) {
        self
    }
}
impl AsBackend for HipDevice {
    fn backend(&self) -> &(dyn Backend + 'static) {
        self
    }
}
impl AsBackend for CpuDevice {
    fn backend(&self) -> &(dyn Backend + 'static) {
        self
    }
}

/// A compute device of any backend. Cheap to clone, `Send + Sync`, usable from many threads.
#[enum_dispatch(AsBackend)]
#[derive(Debug, Clone)]
pub enum Device {
    Cuda(CudaDevice),
    Hip(HipDevice),
    Cpu(CpuDevice),
}

impl Deref for Device {
    type Target = dyn Backend + 'static;
    fn deref(&self) -> &(dyn Backend + 'static) {
        self.backend()
    }
}

/// What [`Device::discover`] found: every backend tried, in order, and why it failed.
#[derive(Debug)]
pub struct Discovery {
    /// The device `auto()` picks, if any backend worked.
    pub chosen: Option<Device>,
    /// Each backend tried, with its device or the reason it is unavailable.
    pub attempts: Vec<(BackendKind, Result<Device>)>,
    /// The `CALICO_BACKEND` value in force, if any.
    pub forced: Option<String>,
}

impl Device {
    /// The first available device: `CALICO_BACKEND=cuda|hip|cpu` if set, else CUDA, then HIP,
    /// then the CPU.
    pub fn auto() -> Result<Device> {
        let d = Device::discover();
        if let Some(dev) = d.chosen {
            return Ok(dev);
        }
        // Only reachable when CALICO_BACKEND forced a backend that failed, or had a bad value.
        match d.attempts.into_iter().next() {
            Some((_, Err(e))) => Err(e),
            _ => Err(Error::unsupported(format!(
                "CALICO_BACKEND={} is not one of cuda, hip, cpu",
                d.forced.unwrap_or_default()
            ))),
        }
    }

    /// Tries the backends in `auto()`'s order and reports on each.
    pub fn discover() -> Discovery {
        let forced = std::env::var("CALICO_BACKEND")
            .ok()
            .filter(|v| !v.is_empty());
        let order: Vec<BackendKind> =
            match forced.as_deref().map(str::to_ascii_lowercase).as_deref() {
                None => vec![BackendKind::Cuda, BackendKind::Hip, BackendKind::Cpu],
                Some("cuda") => vec![BackendKind::Cuda],
                Some("hip") => vec![BackendKind::Hip],
                Some("cpu") => vec![BackendKind::Cpu],
                Some(_) => vec![],
            };
        let mut attempts = Vec::new();
        let mut chosen = None;
        for kind in order {
            let result = Device::open(kind, 0);
            if chosen.is_none() {
                if let Ok(dev) = &result {
                    chosen = Some(dev.clone());
                }
            }
            attempts.push((kind, result));
            if chosen.is_some() {
                break;
            }
        }
        Discovery {
            chosen,
            attempts,
            forced,
        }
    }

    /// Opens device `ordinal` of one backend.
    pub fn open(kind: BackendKind, ordinal: usize) -> Result<Device> {
        match kind {
            BackendKind::Cuda => CudaDevice::new(ordinal).map(Device::Cuda),
            BackendKind::Hip => HipDevice::new(ordinal).map(Device::Hip),
            BackendKind::Cpu if ordinal == 0 => Ok(Device::Cpu(CpuDevice::new())),
            BackendKind::Cpu => Err(Error::BackendUnavailable {
                backend: "cpu",
                reason: format!("there is one CPU device, {ordinal} asked for"),
            }),
        }
    }

    /// The CPU device.
    pub fn cpu() -> Device {
        Device::Cpu(CpuDevice::new())
    }

    /// A contiguous tensor holding `data` (row-major) on this device.
    pub fn tensor<T: Element>(&self, data: &[T], shape: &[usize]) -> Result<Tensor> {
        Tensor::from_slice(self.backend(), data, shape)
    }

    /// A zero-filled contiguous tensor on this device.
    pub fn zeros(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::zeros(self.backend(), shape, dtype)
    }
}
