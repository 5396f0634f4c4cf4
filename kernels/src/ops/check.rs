//! Input validation shared by every op: devices, dtypes, aliasing.

use crate::Device;
use calico_core::{DType, Error, Result, Tensor};

/// Every tensor lives on `dev`.
pub(crate) fn on_device(dev: &Device, tensors: &[(&str, &Tensor)]) -> Result<()> {
    let id = dev.device_id();
    for (name, t) in tensors {
        if t.device_id() != id {
            return Err(Error::DeviceMismatch(format!(
                "`{name}` is on {}, the op was called on {id}",
                t.device_id()
            )));
        }
    }
    Ok(())
}

/// `t` has one of the standard float dtypes (bf16, f16, f32).
pub(crate) fn float_dtype(name: &str, t: &Tensor) -> Result<DType> {
    if t.dtype().is_standard_float() {
        Ok(t.dtype())
    } else {
        Err(Error::DType {
            expected: format!("bf16, f16 or f32 for `{name}`"),
            got: t.dtype(),
        })
    }
}

/// `t` has dtype `expected`.
pub(crate) fn dtype_is(name: &str, t: &Tensor, expected: DType) -> Result<()> {
    if t.dtype() == expected {
        Ok(())
    } else {
        Err(Error::DType {
            expected: format!("{expected} for `{name}`"),
            got: t.dtype(),
        })
    }
}

/// `t` has exactly `shape`.
pub(crate) fn shape_is(name: &str, t: &Tensor, shape: &[usize]) -> Result<()> {
    if t.shape() == shape {
        Ok(())
    } else {
        Err(Error::shape(format!(
            "`{name}` has shape {:?}, expected {shape:?}",
            t.shape()
        )))
    }
}

/// No output overlaps an input, another output or itself (two of its indices naming one
/// element: the CPU backend would reject it, and GPU threads would race to write it).
pub(crate) fn no_overlap(outputs: &[(&str, &Tensor)], inputs: &[(&str, &Tensor)]) -> Result<()> {
    for (oname, o) in outputs {
        not_overlapping_itself(oname, o)?;
    }
    for (i, (oname, o)) in outputs.iter().enumerate() {
        for (iname, t) in inputs.iter().chain(&outputs[i + 1..]) {
            if o.overlaps(t) {
                return Err(Error::Aliasing(format!(
                    "output `{oname}` overlaps `{iname}`"
                )));
            }
        }
    }
    Ok(())
}

/// No two indices of the output `t` name one element.
pub(crate) fn not_overlapping_itself(name: &str, t: &Tensor) -> Result<()> {
    if t.layout().overlaps_itself() {
        return Err(Error::Aliasing(format!(
            "output `{name}` (shape {:?}, strides {:?}) has elements that overlap each other",
            t.shape(),
            t.strides()
        )));
    }
    Ok(())
}
