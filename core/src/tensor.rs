//! `Tensor`: a device buffer with a dtype and a strided layout. Views share the buffer.

use crate::layout::{checked_bytes, checked_numel_or_err};
use crate::{Backend, DType, DeviceId, Element, Error, Layout, Result, Storage};
use std::sync::Arc;

/// A strided view of a device buffer. Cloning a tensor clones the view, not the data.
#[derive(Debug, Clone)]
pub struct Tensor {
    storage: Arc<dyn Storage>,
    dtype: DType,
    layout: Layout,
}

impl Tensor {
    /// Wraps existing storage. Fails if the layout reaches past the end of the buffer.
    pub fn from_storage(storage: Arc<dyn Storage>, dtype: DType, layout: Layout) -> Result<Tensor> {
        // A count past usize would wrap in every product of the dimensions (a huge shape
        // could then pass as a small or empty one); the logical bytes, repeated elements
        // counted, stay under isize::MAX so that byte counts derived from them cannot wrap.
        checked_bytes(layout.shape(), dtype.size_bytes())?;
        let end = layout
            .end_element()
            .and_then(|e| e.checked_mul(dtype.size_bytes()))
            .ok_or_else(|| Error::OutOfBounds(format!("layout {layout:?} overflows")))?;
        if end > storage.size_bytes() {
            return Err(Error::OutOfBounds(format!(
                "layout {:?} with strides {:?} at offset {} needs {end} bytes; the buffer has {}",
                layout.shape(),
                layout.strides(),
                layout.offset(),
                storage.size_bytes()
            )));
        }
        Ok(Tensor {
            storage,
            dtype,
            layout,
        })
    }

    /// A zero-filled contiguous tensor on `backend`.
    pub fn zeros(backend: &dyn Backend, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let bytes = checked_bytes(shape, dtype.size_bytes())?;
        Tensor::from_storage(backend.alloc(bytes)?, dtype, Layout::contiguous(shape))
    }

    /// A contiguous tensor on `backend` holding `data` in row-major order.
    pub fn from_slice<T: Element>(
        backend: &dyn Backend,
        data: &[T],
        shape: &[usize],
    ) -> Result<Tensor> {
        let numel = checked_numel_or_err(shape)?;
        if numel != data.len() {
            return Err(Error::shape(format!(
                "shape {shape:?} holds {numel} elements, the slice has {}",
                data.len()
            )));
        }
        let t = Tensor::zeros(backend, shape, T::DTYPE)?;
        t.storage.write_bytes(0, bytemuck::cast_slice(data))?;
        Ok(t)
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    pub fn shape(&self) -> &[usize] {
        self.layout.shape()
    }
    pub fn strides(&self) -> &[usize] {
        self.layout.strides()
    }
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }
    pub fn device_id(&self) -> DeviceId {
        self.storage.device_id()
    }

    /// Device address of the first element (GPU tensors).
    pub fn device_ptr(&self) -> Option<u64> {
        let base = self.storage.device_address()?;
        Some(base + (self.layout.offset() * self.dtype.size_bytes()) as u64)
    }

    /// Byte range `[start, end)` of the storage that the view can touch.
    pub fn byte_span(&self) -> (usize, usize) {
        let (s, e) = self.layout.element_span().expect("checked at construction");
        (s * self.dtype.size_bytes(), e * self.dtype.size_bytes())
    }

    /// True when both views share storage and their byte spans intersect (conservative).
    pub fn overlaps(&self, other: &Tensor) -> bool {
        if !std::ptr::addr_eq(Arc::as_ptr(&self.storage), Arc::as_ptr(&other.storage))
            || self.numel() == 0
            || other.numel() == 0
        {
            return false;
        }
        let (a0, a1) = self.byte_span();
        let (b0, b1) = other.byte_span();
        a0 < b1 && b0 < a1
    }

    /// True when both tensors view the same storage.
    pub fn same_storage(&self, other: &Tensor) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.storage), Arc::as_ptr(&other.storage))
    }

    /// A view with dimension `dim` restricted to `start..start + len`.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Tensor> {
        Ok(Tensor {
            storage: self.storage.clone(),
            dtype: self.dtype,
            layout: self.layout.narrow(dim, start, len)?,
        })
    }

    /// A view with dimensions `a` and `b` swapped.
    pub fn transpose(&self, a: usize, b: usize) -> Result<Tensor> {
        Ok(Tensor {
            storage: self.storage.clone(),
            dtype: self.dtype,
            layout: self.layout.transpose(a, b)?,
        })
    }

    /// A view of the same elements with another shape (contiguous tensors only).
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        if !self.layout.is_contiguous() {
            return Err(Error::stride("reshape needs a contiguous tensor"));
        }
        let numel = checked_numel_or_err(shape)?;
        if numel != self.numel() {
            return Err(Error::shape(format!(
                "cannot reshape {:?} into {shape:?}",
                self.shape()
            )));
        }
        let mut layout = Layout::contiguous(shape);
        layout = Layout::strided(layout.shape(), layout.strides(), self.layout.offset())?;
        Ok(Tensor {
            storage: self.storage.clone(),
            dtype: self.dtype,
            layout,
        })
    }

    /// A view with explicit shape, strides and element offset into the same storage.
    pub fn as_strided(&self, shape: &[usize], strides: &[usize], offset: usize) -> Result<Tensor> {
        Tensor::from_storage(
            self.storage.clone(),
            self.dtype,
            Layout::strided(shape, strides, offset)?,
        )
    }

    /// Reads the bytes the view spans (blocking).
    fn read_span(&self) -> Result<(usize, Vec<u8>)> {
        let (start, end) = self.byte_span();
        let mut bytes = vec![0u8; end - start];
        self.storage.read_bytes(start, &mut bytes)?;
        Ok((start, bytes))
    }

    /// Calls `f(logical_index, element_index_within_storage)` for every element in row-major order.
    fn for_each_element(&self, mut f: impl FnMut(usize, usize)) {
        let shape = self.shape();
        let strides = self.strides();
        let rank = shape.len();
        let mut idx = vec![0usize; rank];
        for logical in 0..self.numel() {
            let mut off = self.layout.offset();
            for d in 0..rank {
                off += idx[d] * strides[d];
            }
            f(logical, off);
            for d in (0..rank).rev() {
                idx[d] += 1;
                if idx[d] < shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
    }

    /// Copies the view to the host in row-major order (blocking).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype {
            return Err(Error::DType {
                expected: T::DTYPE.name().into(),
                got: self.dtype,
            });
        }
        let (start, bytes) = self.read_span()?;
        let esz = self.dtype.size_bytes();
        let mut out = vec![T::zeroed(); self.numel()];
        let first = start / esz;
        self.for_each_element(|i, e| {
            let at = (e - first) * esz;
            out[i] = bytemuck::pod_read_unaligned(&bytes[at..at + esz]);
        });
        Ok(out)
    }

    /// Copies the view to the host as f64 values (bf16/f16/f32 tensors).
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        if !self.dtype.is_standard_float() {
            return Err(Error::DType {
                expected: "bf16, f16 or f32".into(),
                got: self.dtype,
            });
        }
        let (start, bytes) = self.read_span()?;
        let first = start / self.dtype.size_bytes();
        let mut out = vec![0.0; self.numel()];
        self.for_each_element(|i, e| {
            out[i] = crate::dtype::read_f32(self.dtype, &bytes, e - first) as f64
        });
        Ok(out)
    }

    /// Writes `data` (row-major) into the elements of the view (blocking). Elements of the
    /// storage between the view's elements keep their values.
    pub fn copy_from_slice<T: Element>(&self, data: &[T]) -> Result<()> {
        if T::DTYPE != self.dtype {
            return Err(Error::DType {
                expected: T::DTYPE.name().into(),
                got: self.dtype,
            });
        }
        if data.len() != self.numel() {
            return Err(Error::shape(format!(
                "view holds {} elements, the slice has {}",
                self.numel(),
                data.len()
            )));
        }
        if self.layout.is_contiguous() {
            let start = self.layout.offset() * self.dtype.size_bytes();
            return self.storage.write_bytes(start, bytemuck::cast_slice(data));
        }
        let (start, mut bytes) = self.read_span()?;
        let esz = self.dtype.size_bytes();
        let first = start / esz;
        self.for_each_element(|i, e| {
            let at = (e - first) * esz;
            bytes[at..at + esz].copy_from_slice(bytemuck::bytes_of(&data[i]));
        });
        self.storage.write_bytes(start, &bytes)
    }
}
