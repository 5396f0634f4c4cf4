//! Input validation shared by every op: devices, dtypes, aliasing.

use crate::Device;
use calico_core::{DType, Error, Result, Tensor};

/// A tensor argument with its name, or an optional one that may be absent: the checks below
/// take both kinds in fixed arrays, so validating a call allocates nothing.
pub(crate) trait Arg {
    /// The name and tensor, or `None` when the optional argument was not given.
    fn given(&self) -> Option<(&str, &Tensor)>;
}

impl Arg for (&str, &Tensor) {
    fn given(&self) -> Option<(&str, &Tensor)> {
        Some((self.0, self.1))
    }
}

impl Arg for (&str, Option<&Tensor>) {
    fn given(&self) -> Option<(&str, &Tensor)> {
        self.1.map(|t| (self.0, t))
    }
}

/// Every tensor lives on `dev`.
pub(crate) fn on_device(dev: &Device, tensors: &[(&str, &Tensor)]) -> Result<()> {
    on_device_if_given(dev, tensors)
}

/// Every given tensor lives on `dev` (a concrete `on_device` above keeps `&mut` arguments
/// coercing at the call sites).
pub(crate) fn on_device_if_given(dev: &Device, tensors: &[impl Arg]) -> Result<()> {
    let id = dev.device_id();
    for (name, t) in tensors.iter().filter_map(Arg::given) {
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
    no_overlap_if_given(outputs, inputs)
}

/// `no_overlap` over optional arguments: absent ones take no part.
pub(crate) fn no_overlap_if_given(outputs: &[impl Arg], inputs: &[impl Arg]) -> Result<()> {
    let overlap = |oname: &str, o: &Tensor, iname: &str, t: &Tensor| {
        if o.overlaps(t) {
            Err(Error::Aliasing(format!(
                "output `{oname}` overlaps `{iname}`"
            )))
        } else {
            Ok(())
        }
    };
    for (i, output) in outputs.iter().enumerate() {
        let Some((oname, o)) = output.given() else {
            continue;
        };
        not_overlapping_itself(oname, o)?;
        for (iname, t) in inputs.iter().filter_map(Arg::given) {
            overlap(oname, o, iname, t)?;
        }
        for (iname, t) in outputs[i + 1..].iter().filter_map(Arg::given) {
            overlap(oname, o, iname, t)?;
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
