//! Shared by the kernels crate's integration tests: the first GPU of a backend, or a printed
//! "skipped backend ..." line (the form the other tests report a missing backend in) and None.
// Each test binary uses the helpers it needs.
#![allow(dead_code)]

use calico::backends::cuda::CudaDevice;
use calico::backends::hip::HipDevice;

pub fn cuda() -> Option<CudaDevice> {
    CudaDevice::new(0)
        .map_err(|e| println!("skipped backend cuda: {e}"))
        .ok()
}

pub fn hip() -> Option<HipDevice> {
    HipDevice::new(0)
        .map_err(|e| println!("skipped backend hip: {e}"))
        .ok()
}
