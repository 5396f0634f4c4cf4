//! Interop with cudarc: buffers made outside Calico become tensors without a copy.

use calico::backends::cuda::cudarc;
use calico::{ops, DType, Device};

mod common;
use common::cuda;

fn values(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
        .collect()
}

fn rms_norm_on_cpu(x: &[f32], cols: usize) -> Vec<f32> {
    let cpu = Device::cpu();
    let rows = x.len() / cols;
    let xt = cpu.tensor(x, &[rows, cols]).unwrap();
    let w = cpu.tensor(&vec![1.0f32; cols], &[cols]).unwrap();
    let mut y = cpu.zeros(&[rows, cols], DType::F32).unwrap();
    ops::rms_norm(&cpu, &xt, &w, 1e-6, &mut y).unwrap();
    y.to_vec().unwrap()
}

fn assert_close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{g} vs {w}");
    }
}

#[test]
fn a_cudarc_slice_is_a_tensor_without_a_copy() {
    let Some(cuda) = cuda() else { return };
    let (rows, cols) = (5, 96);
    let data = values(rows * cols);
    let stream = cuda.context().default_stream();
    let slice: cudarc::driver::CudaSlice<f32> = stream.clone_htod(&data).unwrap();
    let x = cuda.wrap_slice(slice, DType::F32, &[rows, cols]).unwrap();
    let dev = Device::Cuda(cuda);
    let w = dev.tensor(&vec![1.0f32; cols], &[cols]).unwrap();
    let mut y = dev.zeros(&[rows, cols], DType::F32).unwrap();
    ops::rms_norm(&dev, &x, &w, 1e-6, &mut y).unwrap();
    assert_close(&y.to_vec::<f32>().unwrap(), &rms_norm_on_cpu(&data, cols));
    // The wrapped tensor reads back what cudarc wrote: the same memory, not a copy of it.
    assert_eq!(x.to_vec::<f32>().unwrap(), data);
}

#[test]
fn a_raw_device_pointer_is_a_tensor_without_a_copy() {
    let Some(cuda) = cuda() else { return };
    let (rows, cols) = (3, 64);
    let data = values(rows * cols);
    let stream = cuda.context().default_stream();
    let owner: cudarc::driver::CudaSlice<f32> = stream.clone_htod(&data).unwrap();
    stream.synchronize().unwrap();
    let ptr = {
        use cudarc::driver::DevicePtr;
        let (ptr, _sync) = owner.device_ptr(&stream);
        ptr
    };
    // SAFETY: `owner` holds rows * cols f32 at `ptr` in this context and outlives `x`.
    let x = unsafe { cuda.wrap_raw(ptr, rows * cols * 4, DType::F32, &[rows, cols]) }.unwrap();
    let dev = Device::Cuda(cuda);
    let w = dev.tensor(&vec![1.0f32; cols], &[cols]).unwrap();
    let mut y = dev.zeros(&[rows, cols], DType::F32).unwrap();
    ops::rms_norm(&dev, &x, &w, 1e-6, &mut y).unwrap();
    assert_close(&y.to_vec::<f32>().unwrap(), &rms_norm_on_cpu(&data, cols));
    drop(x);
    drop(owner);
}
