//! Devices are `Send + Sync` and can be shared by threads that each run ops.

use calico::{ops, BackendKind, DType, Device};

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn device_and_tensor_are_send_and_sync() {
    assert_send_sync::<Device>();
    assert_send_sync::<calico::Tensor>();
}

#[test]
fn threads_share_a_device() {
    let mut devices = vec![Device::cpu()];
    for kind in [BackendKind::Cuda, BackendKind::Hip] {
        match Device::open(kind, 0) {
            Ok(d) => devices.push(d),
            Err(e) => println!("skipped backend {kind}: {e}"),
        }
    }
    for dev in devices {
        let cols = 256;
        let w = dev.tensor(&vec![1.0f32; cols], &[cols]).unwrap();
        std::thread::scope(|s| {
            for t in 0..4 {
                let (dev, w) = (&dev, &w);
                s.spawn(move || {
                    for i in 0..8 {
                        let v = (t * 8 + i) as f32 + 1.0;
                        let x = dev.tensor(&vec![v; 3 * cols], &[3, cols]).unwrap();
                        let mut y = dev.zeros(&[3, cols], DType::F32).unwrap();
                        ops::rms_norm(dev, &x, w, 0.0, &mut y).unwrap();
                        // A constant row normalises to ones whatever its value.
                        let out: Vec<f32> = y.to_vec().unwrap();
                        assert!(
                            out.iter().all(|&o| (o - 1.0).abs() < 1e-5),
                            "{} thread {t}: {:?}",
                            dev.kind(),
                            &out[..4]
                        );
                    }
                });
            }
        });
    }
}
