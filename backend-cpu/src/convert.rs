//! Whole-row conversion between storage bytes and f32 scratch, and dtype checks.

use calico_core::{DType, Error, Result, Tensor};
use half::f16;
use half::slice::HalfFloatSliceExt;

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
#[inline(always)]
pub(crate) fn load(dtype: DType, src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / dtype.size_bytes());
    let (src, dst) = (&src[..n * dtype.size_bytes()], &mut dst[..n]);
    match dtype {
        // bf16 is the top half of an f32: a shift per element, which vectorises (half's
        // slice conversion goes element by element through a NaN branch).
        DType::BF16 => match bytemuck::try_cast_slice::<u8, u16>(src) {
            Ok(s) => {
                for (d, &b) in dst.iter_mut().zip(s) {
                    *d = bf16_bits_to_f32(b);
                }
            }
            Err(_) => {
                for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                    *d = bf16_bits_to_f32(u16::from_ne_bytes([c[0], c[1]]));
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
#[inline(always)]
pub(crate) fn store(dtype: DType, src: &[f32], dst: &mut [u8]) {
    let n = src.len().min(dst.len() / dtype.size_bytes());
    let (src, dst) = (&src[..n], &mut dst[..n * dtype.size_bytes()]);
    match dtype {
        DType::BF16 => match bytemuck::try_cast_slice_mut::<u8, u16>(dst) {
            Ok(d) => {
                for (d, &v) in d.iter_mut().zip(src) {
                    *d = f32_to_bf16_bits(v);
                }
            }
            Err(_) => {
                for (c, &v) in dst.chunks_exact_mut(2).zip(src) {
                    c.copy_from_slice(&f32_to_bf16_bits(v).to_ne_bytes());
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
#[inline(always)]
pub(crate) fn round_in_place(dtype: DType, v: &mut [f32]) {
    match dtype {
        DType::BF16 => v
            .iter_mut()
            .for_each(|x| *x = bf16_bits_to_f32(f32_to_bf16_bits(*x))),
        DType::F16 => {
            // Through half's slice conversions (F16C where the CPU has it), a stack batch at a
            // time.
            let mut batch = [f16::ZERO; 64];
            for chunk in v.chunks_mut(batch.len()) {
                let b = &mut batch[..chunk.len()];
                b.convert_from_f32_slice(chunk);
                b.convert_to_f32_slice(chunk);
            }
        }
        _ => {}
    }
}

/// The f32 whose top half is `bits` (bf16 to f32 is exact). NaNs stay NaN.
#[inline(always)]
pub(crate) fn bf16_bits_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// `x` rounded to the nearest bf16, ties to even, as bits; the same values as
/// `half::bf16::from_f32`. Written without branches (the NaN case is a select) so that loops
/// over it vectorise.
#[inline(always)]
pub(crate) fn f32_to_bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    // Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even; a carry into the
    // exponent rounds up to the next binade or to infinity, as it should.
    let rounded = (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16;
    // A NaN keeps its top mantissa bits and is made quiet, so rounding cannot make it infinite.
    // (`is_nan` is one unordered compare per vector.)
    let quiet_nan = ((bits >> 16) | 0x0040) as u16;
    if x.is_nan() {
        quiet_nan
    } else {
        rounded
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    /// Every bf16 rounding case the bit trick must match half on: ties, carries into the
    /// exponent, overflow to infinity, subnormals, signed zeros, infinities and NaNs.
    #[test]
    fn bf16_bits_match_half() {
        let mut samples = vec![
            0.0f32,
            -0.0,
            1.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            f32::from_bits(1),
            f32::from_bits(0x7f7f_ffff),
            f32::from_bits(0x7f80_0001),
            f32::from_bits(0xff80_0001),
            f32::from_bits(0x7fc0_0000),
        ];
        // Each upper half with low halves around the tie point.
        for hi in (0u32..0x1_0000)
            .step_by(97)
            .chain([0x3f80, 0x7f7f, 0x807f, 0xff7f])
        {
            for lo in [0u32, 1, 0x7fff, 0x8000, 0x8001, 0xffff] {
                samples.push(f32::from_bits((hi << 16) | lo));
            }
        }
        for x in samples {
            let want = bf16::from_f32(x);
            let got = f32_to_bf16_bits(x);
            if want.is_nan() {
                assert!(bf16::from_bits(got).is_nan(), "{x:e} ({:#x})", x.to_bits());
            } else {
                assert_eq!(got, want.to_bits(), "{x:e} ({:#x})", x.to_bits());
                assert_eq!(bf16_bits_to_f32(got), want.to_f32());
            }
        }
    }

    #[test]
    fn round_in_place_matches_a_store_and_load() {
        let v: Vec<f32> = (0..300).map(|i| (i as f32 - 150.0) * 0.013_7).collect();
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            let mut rounded = v.clone();
            round_in_place(dtype, &mut rounded);
            let mut bytes = vec![0u8; v.len() * dtype.size_bytes()];
            store(dtype, &v, &mut bytes);
            let mut back = vec![0.0f32; v.len()];
            load(dtype, &bytes, &mut back);
            assert_eq!(rounded, back, "{dtype}");
        }
    }
}
