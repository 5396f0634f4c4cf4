//! Errors, not panics, on storages and layouts the CPU ops cannot use.

use crate::common::*;
use calico_core::{BackendKind, DType, DeviceId, Error, Layout, Result, Storage, Tensor};
use calico_cpu::{layer_norm, rms_norm, softmax};
use std::any::Any;
use std::sync::Arc;

/// A storage of some other backend.
#[derive(Debug)]
struct Foreign(usize);

impl Storage for Foreign {
    fn device_id(&self) -> DeviceId {
        DeviceId {
            kind: BackendKind::Cuda,
            ordinal: 0,
        }
    }
    fn size_bytes(&self) -> usize {
        self.0
    }
    fn write_bytes(&self, _: usize, _: &[u8]) -> Result<()> {
        Ok(())
    }
    fn read_bytes(&self, _: usize, _: &mut [u8]) -> Result<()> {
        Ok(())
    }
    fn device_address(&self) -> Option<u64> {
        Some(0)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[test]
fn foreign_storage_is_a_device_mismatch() {
    let x = Tensor::from_storage(
        Arc::new(Foreign(64)),
        DType::F32,
        Layout::contiguous(&[4, 4]),
    )
    .unwrap();
    let y = Tensor::zeros(&dev(), &[4, 4], DType::F32).unwrap();
    assert!(matches!(softmax(&x, &y), Err(Error::DeviceMismatch(_))));
    assert!(matches!(softmax(&y, &x), Err(Error::DeviceMismatch(_))));
}

#[test]
fn layouts_that_are_not_rows_are_errors() {
    let x = Tensor::zeros(&dev(), &[4, 6], DType::F16).unwrap();
    let xt = x.transpose(0, 1).unwrap();
    let y = Tensor::zeros(&dev(), &[6, 4], DType::F16).unwrap();
    assert!(matches!(softmax(&xt, &y), Err(Error::Stride(_))));
    assert!(matches!(softmax(&y, &xt), Err(Error::Stride(_))));
}

#[test]
fn mismatches_are_errors() {
    let x = Tensor::zeros(&dev(), &[4, 6], DType::F16).unwrap();
    let y32 = Tensor::zeros(&dev(), &[4, 6], DType::F32).unwrap();
    assert!(matches!(softmax(&x, &y32), Err(Error::DType { .. })));
    let y_small = Tensor::zeros(&dev(), &[3, 6], DType::F16).unwrap();
    assert!(matches!(softmax(&x, &y_small), Err(Error::Shape(_))));
    let w = Tensor::zeros(&dev(), &[5], DType::F16).unwrap();
    let y = Tensor::zeros(&dev(), &[4, 6], DType::F16).unwrap();
    assert!(matches!(
        rms_norm(&x, None, &w, 1e-5, &y, None),
        Err(Error::Shape(_))
    ));
    let f8 = Tensor::zeros(&dev(), &[4, 6], DType::F8E4M3).unwrap();
    assert!(matches!(
        layer_norm(&f8, None, None, None, 1e-5, &f8, None),
        Err(Error::DType { .. })
    ));
}

#[test]
fn overlapping_outputs_are_aliasing_errors() {
    let x = Tensor::zeros(&dev(), &[4, 6], DType::F32).unwrap();
    let w = Tensor::zeros(&dev(), &[6], DType::F32).unwrap();
    let buf = Tensor::zeros(&dev(), &[30], DType::F32).unwrap();
    let y = buf.as_strided(&[4, 6], &[6, 1], 0).unwrap();
    let s = buf.as_strided(&[4, 6], &[6, 1], 3).unwrap();
    assert!(matches!(
        rms_norm(&x, Some(&x), &w, 1e-5, &y, Some(&s)),
        Err(Error::Aliasing(_))
    ));
    // Rows of one output that overlap each other.
    let y_self = buf.as_strided(&[4, 6], &[2, 1], 0).unwrap();
    assert!(matches!(softmax(&x, &y_self), Err(Error::Aliasing(_))));
}
