//! Fixed-width groups of f32 lanes for the row kernels, read from and written to storage
//! bytes without a widened copy of the row.
//!
//! A [`Lanes`] value is 16 f32s; every operation on it is a loop over the 16 lanes that LLVM
//! turns into one AVX-512 instruction (two with AVX2, four with SSE2 or NEON) when the caller
//! is compiled through `simd::vectorised`. Reductions walk a row in chunks of 16 elements (the
//! last one padded, [`Elem::load_tail`]); element-wise passes are flat loops
//! ([`Elem::map_store`]).

use crate::convert::{bf16_bits_to_f32, f32_to_bf16_bits};
use crate::simd::MulAdd;

/// Lanes per chunk.
pub(crate) const W: usize = 16;

/// One chunk of a row, widened to f32.
pub(crate) type Lanes = [f32; W];

/// Every lane `v`.
#[inline(always)]
pub(crate) fn splat(v: f32) -> Lanes {
    [v; W]
}

/// `f` applied lane by lane.
#[inline(always)]
pub(crate) fn map(a: Lanes, f: impl Fn(f32) -> f32) -> Lanes {
    let mut out = a;
    for o in &mut out {
        *o = f(*o);
    }
    out
}

/// `f` applied lane by lane to two chunks.
#[inline(always)]
pub(crate) fn zip(a: Lanes, b: Lanes, f: impl Fn(f32, f32) -> f32) -> Lanes {
    let mut out = a;
    for (o, &b) in out.iter_mut().zip(&b) {
        *o = f(*o, b);
    }
    out
}

#[inline(always)]
pub(crate) fn add(a: Lanes, b: Lanes) -> Lanes {
    zip(a, b, |a, b| a + b)
}

#[inline(always)]
pub(crate) fn sub(a: Lanes, b: Lanes) -> Lanes {
    zip(a, b, |a, b| a - b)
}

#[inline(always)]
pub(crate) fn mul(a: Lanes, b: Lanes) -> Lanes {
    zip(a, b, |a, b| a * b)
}

/// `a * b + c` lane by lane, fused where `M` is.
#[inline(always)]
pub(crate) fn mul_add<M: MulAdd>(a: Lanes, b: Lanes, c: Lanes) -> Lanes {
    let mut out = a;
    for ((o, &b), &c) in out.iter_mut().zip(&b).zip(&c) {
        *o = M::mul_add(*o, b, c);
    }
    out
}

/// The larger of each pair of lanes; a NaN in `b` is passed over (a single `max` instruction
/// on x86). Callers that must propagate NaN do so through a sum.
#[inline(always)]
pub(crate) fn max(a: Lanes, b: Lanes) -> Lanes {
    zip(a, b, |a, b| if b > a { b } else { a })
}

/// Sum of W values in a fixed pairwise order (the upper half added onto the lower, halving).
#[inline(always)]
pub(crate) fn pairwise_sum<T: Copy + std::ops::AddAssign>(mut v: [T; W]) -> T {
    let mut n = W;
    while n > 1 {
        n /= 2;
        for i in 0..n {
            let upper = v[i + n];
            v[i] += upper;
        }
    }
    v[0]
}

/// Sum of the lanes, in a fixed pairwise order.
#[inline(always)]
pub(crate) fn hsum(a: Lanes) -> f32 {
    pairwise_sum(a)
}

/// Largest lane (NaN lanes are passed over).
#[inline(always)]
pub(crate) fn hmax(a: Lanes) -> f32 {
    let mut v = a;
    let mut n = W;
    while n > 1 {
        n /= 2;
        for i in 0..n {
            if v[i + n] > v[i] {
                v[i] = v[i + n];
            }
        }
    }
    v[0]
}

/// A storage element type that the row kernels read and write directly: bf16 or f32 (f16
/// rows are widened to f32 first; see the ops).
pub(crate) trait Elem: Copy {
    /// The stored bits.
    type Bits: bytemuck::Pod + Default;

    fn widen(b: Self::Bits) -> f32;

    /// `v` rounded to nearest even.
    fn narrow(v: f32) -> Self::Bits;

    /// `v` rounded to this type, as a store and a load would give it.
    #[inline(always)]
    fn round(v: f32) -> f32 {
        Self::widen(Self::narrow(v))
    }

    /// Chunk `c` (elements `c * W ..`) of `src`, which must hold all of it.
    #[inline(always)]
    fn load(src: &[Self::Bits], c: usize) -> Lanes {
        let s: &[Self::Bits; W] = src[c * W..][..W].try_into().expect("a whole chunk");
        let mut v = [0.0; W];
        for (v, &s) in v.iter_mut().zip(s) {
            *v = Self::widen(s);
        }
        v
    }

    /// Chunk `c` of a row that ends inside it; lanes past the end are `fill`.
    #[inline(always)]
    fn load_tail(src: &[Self::Bits], c: usize, fill: f32) -> Lanes {
        let rest = src.get(c * W..).unwrap_or_default();
        let mut v = splat(fill);
        for (v, &b) in v.iter_mut().zip(rest) {
            *v = Self::widen(b);
        }
        v
    }

    /// `dst[i] = narrow(f(src[i]))` over whole slices: a flat loop, which LLVM vectorises
    /// along the row (loops over chunks of [`Lanes`] may instead be vectorised across chunks,
    /// with gathers).
    #[inline(always)]
    fn map_store(src: &[f32], dst: &mut [Self::Bits], f: impl Fn(f32) -> f32) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = Self::narrow(f(s));
        }
    }
}

/// bf16: the top half of an f32.
#[derive(Clone, Copy)]
pub(crate) struct Bf16;

impl Elem for Bf16 {
    type Bits = u16;

    #[inline(always)]
    fn widen(b: u16) -> f32 {
        bf16_bits_to_f32(b)
    }

    #[inline(always)]
    fn narrow(v: f32) -> u16 {
        f32_to_bf16_bits(v)
    }
}

/// f32, stored as is.
#[derive(Clone, Copy)]
pub(crate) struct F32;

impl Elem for F32 {
    type Bits = f32;

    #[inline(always)]
    fn widen(b: f32) -> f32 {
        b
    }

    #[inline(always)]
    fn narrow(v: f32) -> f32 {
        v
    }
}

/// Asks the CPU to bring the cache line of `s[i]` into L1 (nothing if `i` is past the end or
/// the architecture has no stable prefetch hint). Row kernels prefetch the next row during the
/// compute-heavy passes over the current one, so its first pass does not wait on memory.
#[inline(always)]
pub(crate) fn prefetch<T>(s: &[T], i: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(p) = s.get(i) {
        // SAFETY: `_mm_prefetch` only needs SSE (part of x86-64); a prefetch is a hint that
        // never faults, and `p` points into a live slice.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                (p as *const T).cast::<i8>(),
            )
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (s, i);
}

/// The bytes of the rows that the next row's kernel will read first, and the row length in
/// elements: the compute-heavy passes over the current row prefetch them a block at a time,
/// so that the next row's first pass finds them in cache instead of waiting on memory.
#[derive(Clone, Copy, Default)]
pub(crate) struct Ahead<'a> {
    rows: [&'a [u8]; 2],
    n: usize,
}

impl<'a> Ahead<'a> {
    pub(crate) fn new(rows: [&'a [u8]; 2], n: usize) -> Self {
        Ahead { rows, n }
    }

    /// Prefetches elements `start..end` of each row.
    #[inline(always)]
    pub(crate) fn fetch(&self, start: usize, end: usize) {
        for row in self.rows {
            let size = row.len() / self.n.max(1);
            for byte in (start * size..end * size).step_by(64) {
                prefetch(row, byte);
            }
        }
    }
}

/// Whole chunks and the elements left over in a row of `n`.
#[inline(always)]
pub(crate) fn chunks(n: usize) -> (usize, usize) {
    (n / W, n % W)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<E: Elem>(v: &[f32]) -> Vec<f32> {
        let src: Vec<E::Bits> = v.iter().map(|&x| E::narrow(x)).collect();
        let mut dst = vec![E::Bits::default(); src.len()];
        let (full, tail) = chunks(v.len());
        let mut widened = Vec::new();
        for c in 0..full {
            widened.extend(E::load(&src, c));
        }
        if tail > 0 {
            let t = E::load_tail(&src, full, -1.0);
            assert!(t[tail..].iter().all(|&x| x == -1.0));
            widened.extend(&t[..tail]);
        }
        E::map_store(&widened, &mut dst, |x| x);
        dst.iter().map(|&b| E::widen(b)).collect()
    }

    #[test]
    fn chunks_and_tails_round_trip() {
        for n in [1usize, 15, 16, 17, 33, 64] {
            let v: Vec<f32> = (0..n).map(|i| i as f32 - 7.5).collect();
            assert_eq!(round_trip::<F32>(&v), v, "n = {n}");
            assert_eq!(round_trip::<Bf16>(&v), v, "n = {n}");
        }
    }

    #[test]
    fn reductions() {
        let v: Lanes = std::array::from_fn(|i| i as f32);
        assert_eq!(hsum(v), 120.0);
        assert_eq!(hmax(v), 15.0);
        assert_eq!(max(splat(1.0), v)[3], 3.0);
        assert_eq!(Bf16::round(1.0 + 1.0 / 512.0), 1.0);
    }
}
