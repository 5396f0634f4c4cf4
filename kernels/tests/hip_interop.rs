//! Interop on AMD: device memory allocated outside Calico's tensor becomes a tensor without a
//! copy (`HipDevice::wrap_raw`). Reports itself skipped without a HIP device.

use calico::{ops, DType, Device};

mod common;
use common::hip;

fn values(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
        .collect()
}

#[test]
fn a_raw_hip_pointer_is_a_tensor_without_a_copy() {
    let Some(hip) = hip() else { return };
    let dev = Device::Hip(hip.clone());
    let (rows, cols) = (3, 64);
    let data = values(rows * cols);
    // Memory the wrapped tensor does not own: another tensor's buffer stands in for a buffer
    // of another library.
    let owner = dev.tensor(&data, &[rows, cols]).unwrap();
    let ptr = owner.device_ptr().expect("a device buffer");
    // SAFETY: `owner` holds rows * cols f32 at `ptr` on this GPU and outlives `x`.
    let x = unsafe { hip.wrap_raw(ptr, rows * cols * 4, DType::F32, &[rows, cols]) }.unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), data);
    let w = dev.tensor(&vec![1.0f32; cols], &[cols]).unwrap();
    let mut y = dev.zeros(&[rows, cols], DType::F32).unwrap();
    ops::rms_norm(&dev, &x, &w, 1e-6, &mut y).unwrap();
    let got = y.to_vec::<f32>().unwrap();
    for (r, row) in data.chunks(cols).enumerate() {
        let rms =
            (row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / cols as f64 + 1e-6).sqrt();
        for (c, v) in row.iter().enumerate() {
            let want = *v as f64 / rms;
            let g = got[r * cols + c] as f64;
            assert!(
                (g - want).abs() <= 1e-5 * want.abs().max(1.0),
                "{g} vs {want}"
            );
        }
    }
    // Dropping the view frees nothing: the owner still reads back its data.
    drop(x);
    assert_eq!(owner.to_vec::<f32>().unwrap(), data);
    // A view past the end of the memory it claims is refused by the tensor's checks.
    // SAFETY: never dereferenced: the shape needs more bytes than given, so no tensor is made.
    let too_small = unsafe { hip.wrap_raw(ptr, 16, DType::F32, &[rows, cols]) };
    assert!(too_small.is_err());
}
