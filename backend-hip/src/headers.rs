//! The HIP device headers, embedded so kernels compile with no include paths.

use calico_core::HeaderSet;

/// `calico/vendor.h` (the vendor contract for CDNA) and `calico/hip_buffer.h`.
pub fn hip_headers() -> HeaderSet {
    HIP_HEADERS
}

const HIP_HEADERS: HeaderSet = &[
    ("calico/vendor.h", include_str!("../device/calico/vendor.h")),
    (
        "calico/hip_buffer.h",
        include_str!("../device/calico/hip_buffer.h"),
    ),
];
