//! The HIP device headers, embedded so kernels compile with no include paths.

use calico_core::HeaderSet;

/// `calico/vendor.h` (the vendor contract for CDNA), `calico/hip_buffer.h` (buffer-resource
/// loads), `calico/mfma.h` (matrix cores and scheduling), `calico/hip_tile.h` and
/// `calico/vendor_tiles.h` (the tile vocabulary of `calico/tiles.h` on MFMA).
pub fn hip_headers() -> HeaderSet {
    HIP_HEADERS
}

const HIP_HEADERS: HeaderSet = &[
    ("calico/vendor.h", include_str!("../device/calico/vendor.h")),
    (
        "calico/hip_buffer.h",
        include_str!("../device/calico/hip_buffer.h"),
    ),
    ("calico/mfma.h", include_str!("../device/calico/mfma.h")),
    (
        "calico/hip_tile.h",
        include_str!("../device/calico/hip_tile.h"),
    ),
    (
        "calico/vendor_tiles.h",
        include_str!("../device/calico/vendor_tiles.h"),
    ),
];
