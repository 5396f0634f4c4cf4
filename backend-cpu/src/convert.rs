//! Whole-row conversion between storage bytes and f32 scratch, and dtype checks.

use calico_core::{DType, Error, Result, Tensor};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// The dtype of `t` if it is one the ops store (bf16, f16, f32).
pub(crate) fn float_dtype(t: &Tensor) -> Result<DType> {
    if t.dtype().is_standard_float() {
        Ok(t.dtype())
    } else {
        Err(Error::DType {
            expected: "bf16, f16 or f32".into(),
            got: t.dtype(),
        })
    }
}

/// Fails unless `t` has dtype `want` (weights, residuals and outputs follow x).
pub(crate) fn expect_dtype(t: &Tensor, want: DType) -> Result<()> {
    if t.dtype() == want {
        Ok(())
    } else {
        Err(Error::DType {
            expected: want.name().into(),
            got: t.dtype(),
        })
    }
}

/// Widens the first `dst.len()` elements of `src` into `dst` (fewer if `src` is short).
pub(crate) fn load(dtype: DType, src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / dtype.size_bytes());
    let (src, dst) = (&src[..n * dtype.size_bytes()], &mut dst[..n]);
    match dtype {
        DType::BF16 => match bytemuck::try_cast_slice::<u8, bf16>(src) {
            Ok(s) => s.convert_to_f32_slice(dst),
            Err(_) => {
                for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                    *d = bf16::from_bits(u16::from_ne_bytes([c[0], c[1]])).to_f32();
                }
            }
        },
        DType::F16 => match bytemuck::try_cast_slice::<u8, f16>(src) {
            Ok(s) => s.convert_to_f32_slice(dst),
            Err(_) => {
                for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                    *d = f16::from_bits(u16::from_ne_bytes([c[0], c[1]])).to_f32();
                }
            }
        },
        DType::F32 => match bytemuck::try_cast_slice::<u8, f32>(src) {
            Ok(s) => dst.copy_from_slice(s),
            Err(_) => {
                for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                    *d = f32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
        },
        DType::I32 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = i32::from_ne_bytes([c[0], c[1], c[2], c[3]]) as f32;
            }
        }
        // Rejected by `float_dtype` before any op reads elements.
        DType::F8E4M3 | DType::F8E5M2 => dst.fill(f32::NAN),
    }
}

/// Rounds `src` to `dtype` (nearest even) into the first `src.len()` elements of `dst`.
pub(crate) fn store(dtype: DType, src: &[f32], dst: &mut [u8]) {
    let n = src.len().min(dst.len() / dtype.size_bytes());
    let (src, dst) = (&src[..n], &mut dst[..n * dtype.size_bytes()]);
    match dtype {
        DType::BF16 => match bytemuck::try_cast_slice_mut::<u8, bf16>(dst) {
            Ok(d) => d.convert_from_f32_slice(src),
            Err(_) => {
                for (c, &v) in dst.chunks_exact_mut(2).zip(src) {
                    c.copy_from_slice(&bf16::from_f32(v).to_bits().to_ne_bytes());
                }
            }
        },
        DType::F16 => match bytemuck::try_cast_slice_mut::<u8, f16>(dst) {
            Ok(d) => d.convert_from_f32_slice(src),
            Err(_) => {
                for (c, &v) in dst.chunks_exact_mut(2).zip(src) {
                    c.copy_from_slice(&f16::from_f32(v).to_bits().to_ne_bytes());
                }
            }
        },
        DType::F32 => match bytemuck::try_cast_slice_mut::<u8, f32>(dst) {
            Ok(d) => d.copy_from_slice(src),
            Err(_) => {
                for (c, &v) in dst.chunks_exact_mut(4).zip(src) {
                    c.copy_from_slice(&v.to_ne_bytes());
                }
            }
        },
        DType::I32 => {
            for (c, &v) in dst.chunks_exact_mut(4).zip(src) {
                c.copy_from_slice(&(v.round() as i32).to_ne_bytes());
            }
        }
        DType::F8E4M3 | DType::F8E5M2 => {}
    }
}

/// Rounds every value to the nearest value of `dtype`, as storing and reloading would.
pub(crate) fn round_in_place(dtype: DType, v: &mut [f32]) {
    match dtype {
        DType::BF16 => v.iter_mut().for_each(|x| *x = bf16::from_f32(*x).to_f32()),
        DType::F16 => v.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32()),
        _ => {}
    }
}
