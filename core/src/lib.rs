//! calico-core: the vendor-neutral layer of Calico.
//!
//! Dtypes, layouts and tensors; the [`Arch`] descriptor; the [`Backend`] and [`GpuBackend`]
//! traits that the CUDA, HIP and CPU backends implement; [`KernelSource`] assembly from
//! embedded device headers; the on-disk compile cache; and the shared C++ tile vocabulary
//! in `core/device` (see [`device_headers`]).

pub mod arch;
pub mod backend;
pub mod cache;
pub mod cdna_staging;
pub mod dtype;
pub mod epilogue;
pub mod error;
pub mod kernel;
pub mod lanes;
pub mod layout;
pub mod lds;
pub mod tensor;
pub mod variant;

pub use arch::{Arch, AsyncCopy, Fp8Flavour, MmaAtom, MmaKind, Vendor};
pub use backend::{
    check_byte_range, Backend, BackendKind, CompilerInfo, DeviceId, GpuBackend, KernelArg,
    KernelParams, LaunchConfig, OpaqueParam128, ParamBlock, Storage, PARAM_BLOCK_BYTES,
};
pub use cache::DiskCache;
pub use dtype::{DType, Element};
pub use epilogue::Epilogue;
pub use error::{Error, Result};
pub use kernel::{HeaderSet, KernelSource};
pub use layout::{Layout, Rows};
pub use tensor::Tensor;
pub use variant::{DynVariant, KernelVariant, VariantCache};

/// The device headers both vendors share (`calico/*.h` in `core/device`). Each vendor
/// backend adds `calico/vendor.h` and its own primitives.
pub fn device_headers() -> HeaderSet {
    DEVICE_HEADERS
}

const DEVICE_HEADERS: HeaderSet = &[
    ("calico/calico.h", include_str!("../device/calico/calico.h")),
    ("calico/types.h", include_str!("../device/calico/types.h")),
    ("calico/reduce.h", include_str!("../device/calico/reduce.h")),
    ("calico/memory.h", include_str!("../device/calico/memory.h")),
    (
        "calico/tile_types.h",
        include_str!("../device/calico/tile_types.h"),
    ),
    ("calico/tiles.h", include_str!("../device/calico/tiles.h")),
];
