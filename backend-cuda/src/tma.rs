//! TMA tensor maps: the 128-byte descriptors Hopper's copy engine reads, encoded on the host
//! with `cuTensorMapEncodeTiled` and passed to kernels by value (`KernelArg::Opaque128`,
//! a `const __grid_constant__ calico::tensor_map` parameter on the device side).
//!
//! Dimensions are listed innermost first, in elements; strides are in bytes for every
//! dimension but the innermost (which is contiguous). The requirements the driver enforces
//! are checked here first, so bad input is a clean `Err` that says what is wrong.

use crate::error::driver_err;
use calico_core::{DType, Error, OpaqueParam128, Result};
use cudarc::driver::sys;

/// Shared-memory swizzle of the boxes a map copies. It must match the device-side layout
/// (tile.cuh's `st<>` and the wgmma descriptors): 128B pairs with wgmma swizzle mode 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Swizzle {
    None,
    B32,
    B64,
    B128,
}

impl Swizzle {
    /// The largest inner box extent in bytes this swizzle allows (`None`: no limit but 16-byte
    /// multiples).
    pub const fn span_bytes(self) -> Option<usize> {
        match self {
            Swizzle::None => None,
            Swizzle::B32 => Some(32),
            Swizzle::B64 => Some(64),
            Swizzle::B128 => Some(128),
        }
    }

    fn to_sys(self) -> sys::CUtensorMapSwizzle {
        match self {
            Swizzle::None => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
            Swizzle::B32 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B,
            Swizzle::B64 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
            Swizzle::B128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
        }
    }
}

/// A tiled tensor map request of rank `R` (1..=5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TiledMap<const R: usize> {
    /// Device address of element (0, 0, ..).
    pub address: u64,
    pub dtype: DType,
    /// Extent of each dimension in elements, innermost first.
    pub dims: [u64; R],
    /// Byte stride of dimensions 1..R (the innermost dimension is contiguous); the last
    /// entry is unused when R == 1. Kept at R entries so the array type stays simple.
    pub strides_bytes: [u64; R],
    /// Box (the tile one copy moves) in elements, innermost first.
    pub box_dims: [u32; R],
    pub swizzle: Swizzle,
}

const MAX_STRIDE: u64 = 1 << 40;
const MAX_DIM: u64 = 1 << 32;
const MAX_BOX: u32 = 256;

fn data_type(dtype: DType) -> Result<sys::CUtensorMapDataType> {
    use sys::CUtensorMapDataType::*;
    Ok(match dtype {
        DType::BF16 => CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        DType::F16 => CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::F32 => CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        DType::F8E4M3 | DType::F8E5M2 => CU_TENSOR_MAP_DATA_TYPE_UINT8,
        DType::I32 => CU_TENSOR_MAP_DATA_TYPE_INT32,
    })
}

impl<const R: usize> TiledMap<R> {
    /// Checks every requirement of `cuTensorMapEncodeTiled` that can be checked on the host.
    pub fn validate(&self) -> Result<()> {
        if R == 0 || R > 5 {
            return Err(Error::unsupported(format!(
                "tensor maps have rank 1..=5, not {R}"
            )));
        }
        if !self.address.is_multiple_of(16) {
            return Err(Error::Alignment(format!(
                "TMA needs a 16-byte aligned base address, got {:#x}",
                self.address
            )));
        }
        let elem = self.dtype.size_bytes() as u64;
        for (i, &d) in self.dims.iter().enumerate() {
            if d == 0 || d > MAX_DIM {
                return Err(Error::shape(format!(
                    "TMA dimension {i} has extent {d}; it must be in 1..=2^32"
                )));
            }
        }
        for (i, &s) in self.strides_bytes.iter().enumerate().take(R - 1) {
            if s % 16 != 0 || s == 0 || s >= MAX_STRIDE {
                return Err(Error::stride(format!(
                    "TMA stride of dimension {} is {s} bytes; it must be a non-zero multiple of 16 below 2^40",
                    i + 1
                )));
            }
        }
        for (i, &b) in self.box_dims.iter().enumerate() {
            if b == 0 || b > MAX_BOX {
                return Err(Error::unsupported(format!(
                    "TMA box dimension {i} is {b}; it must be in 1..=256"
                )));
            }
        }
        let inner_bytes = self.box_dims[0] as u64 * elem;
        if !inner_bytes.is_multiple_of(16) {
            return Err(Error::unsupported(format!(
                "TMA inner box extent is {inner_bytes} bytes; it must be a multiple of 16"
            )));
        }
        if let Some(span) = self.swizzle.span_bytes() {
            if inner_bytes > span as u64 {
                return Err(Error::unsupported(format!(
                    "TMA inner box extent is {inner_bytes} bytes; {span}-byte swizzle allows at most {span}"
                )));
            }
        }
        Ok(())
    }

    /// Encodes the map. Needs the CUDA driver (call only for a CUDA device).
    pub fn encode(&self) -> Result<OpaqueParam128> {
        self.validate()?;
        crate::probe::require_driver()?;
        let dtype = data_type(self.dtype)?;
        let element_strides = [1u32; R];
        let mut map = sys::CUtensorMap { opaque: [0; 16] };
        // SAFETY: the driver library is present (checked above); every pointer refers to a live
        // local array of at least R (or R - 1 for strides) entries, and `map` is a properly
        // aligned CUtensorMap the driver writes 128 bytes into. The address is only recorded in
        // the descriptor, not dereferenced.
        unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                dtype,
                R as u32,
                self.address as *mut std::ffi::c_void,
                self.dims.as_ptr(),
                self.strides_bytes.as_ptr(),
                self.box_dims.as_ptr(),
                element_strides.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                self.swizzle.to_sys(),
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        }
        .result()
        .map_err(driver_err("cuTensorMapEncodeTiled"))?;
        let mut bytes = [0u8; 128];
        for (chunk, word) in bytes.chunks_exact_mut(8).zip(map.opaque.iter()) {
            chunk.copy_from_slice(&word.to_ne_bytes());
        }
        Ok(OpaqueParam128(bytes))
    }
}

/// A map request of any rank (1..=5), padded to rank 5: the key of the encode cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct MapKey {
    rank: usize,
    address: u64,
    dtype: DType,
    dims: [u64; 5],
    strides_bytes: [u64; 5],
    box_dims: [u32; 5],
    swizzle: Swizzle,
}

/// Maps encoded before, so that a call repeated with the same pointers and shapes (a model's
/// forward pass) skips the driver. Bounded: emptied when full. Hashed with FxHash: a GEMM
/// looks up three of these ~140-byte keys per launch (SipHash ~0.1 us each on the
/// development machine, FxHash ~0.01).
static ENCODED: std::sync::Mutex<Option<rustc_hash::FxHashMap<MapKey, OpaqueParam128>>> =
    std::sync::Mutex::new(None);
/// Entries kept before the cache is emptied.
const MAX_CACHED_MAPS: usize = 1024;

impl<const R: usize> TiledMap<R> {
    fn key(&self) -> Option<MapKey> {
        if R == 0 || R > 5 {
            return None;
        }
        let mut key = MapKey {
            rank: R,
            address: self.address,
            dtype: self.dtype,
            dims: [0; 5],
            strides_bytes: [0; 5],
            box_dims: [0; 5],
            swizzle: self.swizzle,
        };
        key.dims[..R].copy_from_slice(&self.dims);
        key.strides_bytes[..R].copy_from_slice(&self.strides_bytes);
        key.box_dims[..R].copy_from_slice(&self.box_dims);
        Some(key)
    }

    /// [`TiledMap::encode`], through a process-wide cache of recent maps. A map only records
    /// an address, so a stale entry for memory that was freed is harmless: it is used only for
    /// a request with the same address, dims, strides and box, which encodes to the same bytes.
    pub fn encode_cached(&self) -> Result<OpaqueParam128> {
        let Some(key) = self.key() else {
            return self.encode();
        };
        let mut guard = ENCODED.lock().unwrap_or_else(|e| e.into_inner());
        let cache = guard.get_or_insert_with(rustc_hash::FxHashMap::default);
        if let Some(map) = cache.get(&key) {
            return Ok(*map);
        }
        let map = self.encode()?;
        if cache.len() >= MAX_CACHED_MAPS {
            cache.clear();
        }
        cache.insert(key, map);
        Ok(map)
    }
}

/// A 2-D map over a row-major matrix of `rows x cols` elements, rows `row_stride_bytes` apart.
pub fn encode_tiled_2d(
    address: u64,
    dtype: DType,
    dims: [u64; 2],
    row_stride_bytes: u64,
    box_dims: [u32; 2],
    swizzle: Swizzle,
) -> Result<OpaqueParam128> {
    TiledMap {
        address,
        dtype,
        dims,
        strides_bytes: [row_stride_bytes, 0],
        box_dims,
        swizzle,
    }
    .encode()
}

/// A 3-D map (innermost first), e.g. {cols, rows, batch} with strides {row, batch} in bytes.
pub fn encode_tiled_3d(
    address: u64,
    dtype: DType,
    dims: [u64; 3],
    strides_bytes: [u64; 2],
    box_dims: [u32; 3],
    swizzle: Swizzle,
) -> Result<OpaqueParam128> {
    TiledMap {
        address,
        dtype,
        dims,
        strides_bytes: [strides_bytes[0], strides_bytes[1], 0],
        box_dims,
        swizzle,
    }
    .encode()
}

/// Checks the coordinates of one copy (innermost first, in elements) against the rules the
/// hardware enforces by faulting (`CUDA_ERROR_ILLEGAL_INSTRUCTION` at the `UTMALDG`/`UTMASTG`,
/// which poisons the context) rather than by clipping:
///
/// - the innermost coordinate must fall on a 16-byte boundary (coordinate x element size a
///   multiple of 16), for loads and stores;
/// - a store box may hang past the end of the tensor (those elements are not written) but must
///   not start before it: every store coordinate must be non-negative. Loads may start before
///   the tensor (the elements outside read as zero).
///
/// Not a fault, but a limit on that clipping: stores write whole 16-byte chunks of a row, so when
/// the innermost extent in bytes is not a multiple of 16, the rest of a row's last chunk (up to
/// its 16-byte boundary, past `dims[0]`) is written too, with the box's contents there. A
/// destination whose row padding belongs to something else (a column slice of a wider tensor)
/// needs an innermost extent in whole 16-byte pieces, or another way to store its last columns.
///
/// Kernels compute their coordinates on the device (see tma.cuh's `tma::store_coords_ok`);
/// hosts that pick the origins use this to refuse, or to predict, the boxes that cannot be
/// copied.
pub fn check_coords(dtype: DType, coords: &[i64], store: bool) -> Result<()> {
    let elem = dtype.size_bytes() as i64;
    if let Some(&c0) = coords.first() {
        if (c0 * elem) % 16 != 0 {
            return Err(Error::Alignment(format!(
                "TMA innermost coordinate {c0} is {} bytes from the tensor start; it must be a multiple of 16",
                c0 * elem
            )));
        }
    }
    if store {
        if let Some((i, &c)) = coords.iter().enumerate().find(|&(_, &c)| c < 0) {
            return Err(Error::unsupported(format!(
                "TMA store coordinate {i} is {c}; a store box may not start before the tensor"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_keys_tell_ranks_and_fields_apart() {
        let m3 = map();
        let m4 = TiledMap::<4> {
            address: m3.address,
            dtype: m3.dtype,
            dims: [m3.dims[0], m3.dims[1], m3.dims[2], 1],
            strides_bytes: [
                m3.strides_bytes[0],
                m3.strides_bytes[1],
                m3.strides_bytes[2],
                0,
            ],
            box_dims: [m3.box_dims[0], m3.box_dims[1], m3.box_dims[2], 1],
            swizzle: m3.swizzle,
        };
        assert_ne!(m3.key(), m4.key());
        assert_eq!(m3.key(), map().key());
        let moved = TiledMap {
            address: m3.address + 16,
            ..m3
        };
        assert_ne!(m3.key(), moved.key());
    }

    fn map() -> TiledMap<3> {
        TiledMap {
            address: 0x7f00_0000_0000,
            dtype: DType::BF16,
            dims: [4096, 4096, 1],
            strides_bytes: [8192, 8192 * 4096, 0],
            box_dims: [64, 128, 1],
            swizzle: Swizzle::B128,
        }
    }

    #[test]
    fn a_gemm_operand_map_is_valid() {
        map().validate().unwrap();
    }

    #[test]
    fn unaligned_address_is_an_alignment_error() {
        let m = TiledMap {
            address: 0x7f00_0000_0008,
            ..map()
        };
        assert!(matches!(m.validate(), Err(Error::Alignment(_))));
    }

    #[test]
    fn stride_not_multiple_of_16_is_a_stride_error() {
        let m = TiledMap {
            strides_bytes: [8190, 8192 * 4096, 0],
            ..map()
        };
        assert!(matches!(m.validate(), Err(Error::Stride(_))));
    }

    #[test]
    fn box_over_256_or_wider_than_the_swizzle_is_refused() {
        assert!(TiledMap {
            box_dims: [64, 512, 1],
            ..map()
        }
        .validate()
        .is_err());
        assert!(TiledMap {
            box_dims: [128, 64, 1],
            ..map()
        }
        .validate()
        .is_err());
        assert!(TiledMap {
            box_dims: [128, 64, 1],
            swizzle: Swizzle::None,
            ..map()
        }
        .validate()
        .is_ok());
    }

    #[test]
    fn empty_dimension_is_a_shape_error() {
        assert!(matches!(
            TiledMap {
                dims: [0, 4, 1],
                ..map()
            }
            .validate(),
            Err(Error::Shape(_))
        ));
    }

    #[test]
    fn coordinates_innermost_16_byte_aligned_and_stores_not_before_the_tensor() {
        assert!(check_coords(DType::BF16, &[8, -3], false).is_ok());
        assert!(check_coords(DType::BF16, &[-8, 5], false).is_ok());
        assert!(matches!(
            check_coords(DType::BF16, &[4, 8], false),
            Err(Error::Alignment(_))
        ));
        assert!(matches!(
            check_coords(DType::F32, &[2, 0], true),
            Err(Error::Alignment(_))
        ));
        assert!(check_coords(DType::BF16, &[8, 3, 0], true).is_ok());
        assert!(check_coords(DType::BF16, &[-8, 3], true).is_err());
        assert!(check_coords(DType::BF16, &[8, -3], true).is_err());
        assert!(check_coords(DType::F32, &[0, 0, -1], true).is_err());
    }
}
