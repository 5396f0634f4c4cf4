//! CpuDevice and CpuStorage through the core traits.

use crate::common::*;
use calico_core::{Arch, Backend, BackendKind, DType, DeviceId, Error, Tensor, Vendor};
use calico_cpu::{softmax, CpuDevice};
use std::sync::Arc;

#[test]
fn device_identity() {
    let d = CpuDevice::new();
    assert_eq!(d.kind(), BackendKind::Cpu);
    assert_eq!(
        d.device_id(),
        DeviceId {
            kind: BackendKind::Cpu,
            ordinal: 0
        }
    );
    assert!(!d.name().is_empty());
    let arch: &Arch = d.arch();
    assert_eq!(arch.vendor, Vendor::Cpu);
    assert_eq!(arch.compute_units as usize, rayon::current_num_threads());
    assert!(d.as_gpu().is_none());
    d.synchronize().unwrap();
    let ms = d
        .time_ms(&mut || {
            std::thread::sleep(std::time::Duration::from_millis(5));
            Ok(())
        })
        .unwrap();
    assert!(ms >= 4.0, "{ms}");
    assert!(d.time_ms(&mut || Err(Error::unsupported("x"))).is_err());
}

#[test]
fn storage_reads_writes_and_bounds() {
    let d = dev();
    let s = d.alloc(100).unwrap();
    assert_eq!(s.size_bytes(), 100);
    assert_eq!(s.device_id(), d.device_id());
    assert!(s.device_address().is_none());
    let mut buf = [1u8; 100];
    s.read_bytes(0, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0), "zero-filled");
    s.write_bytes(98, &[5, 6]).unwrap();
    assert!(s.write_bytes(99, &[5, 6]).is_err());
    assert!(s.read_bytes(usize::MAX, &mut [0u8; 2]).is_err());
    let mut two = [0u8; 2];
    s.read_bytes(98, &mut two).unwrap();
    assert_eq!(two, [5, 6]);
    assert_eq!(d.alloc(0).unwrap().size_bytes(), 0);
}

#[test]
fn copy_bytes_between_and_within_storages() {
    let d = dev();
    let (a, b) = (d.alloc(16).unwrap(), d.alloc(16).unwrap());
    a.write_bytes(0, &(0..16).collect::<Vec<u8>>()).unwrap();
    d.copy_bytes(b.as_ref(), 4, a.as_ref(), 0, 8).unwrap();
    let mut out = [0u8; 16];
    b.read_bytes(0, &mut out).unwrap();
    assert_eq!(out, [0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 0, 0, 0, 0]);
    // Overlapping copy within one storage behaves like memmove.
    d.copy_bytes(a.as_ref(), 2, a.as_ref(), 0, 10).unwrap();
    a.read_bytes(0, &mut out).unwrap();
    assert_eq!(out, [0, 1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 14, 15]);
    assert!(d.copy_bytes(a.as_ref(), 10, b.as_ref(), 0, 8).is_err());
    assert!(d.copy_bytes(a.as_ref(), 0, b.as_ref(), 9, 8).is_err());
}

/// Ops on two storages from many threads, in both directions at once, must not deadlock.
#[test]
fn concurrent_ops_in_opposite_directions() {
    let (p, q) = (
        Tensor::zeros(&dev(), &[2, 64, 65], DType::F32).unwrap(),
        Tensor::zeros(&dev(), &[2, 64, 65], DType::F32).unwrap(),
    );
    let views = Arc::new([
        p.narrow(0, 0, 1).unwrap(),
        p.narrow(0, 1, 1).unwrap(),
        q.narrow(0, 0, 1).unwrap(),
        q.narrow(0, 1, 1).unwrap(),
    ]);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let v = views.clone();
            std::thread::spawn(move || {
                for i in 0..200 {
                    // p -> q and q -> p, with p's and q's outputs in the storage also read.
                    let (src, dst) = if (t + i) % 2 == 0 {
                        (&v[0], &v[3])
                    } else {
                        (&v[2], &v[1])
                    };
                    softmax(src, dst).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}
