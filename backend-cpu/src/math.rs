//! f32 building blocks written so the compiler vectorises them: polynomial exponentials
//! (libm's `expf` is a call per element) and the activations.
//! They are `#[inline(always)]` so that they are compiled into `simd::vectorised` callers.

use crate::simd::MulAdd;

/// e^x to about 2 ulp (Cephes `expf` polynomial), 0 below the f32 range, inf above it.
/// Selects instead of `clamp` and `as i32` keep the loop branch-free so it vectorises.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LO: f32 = -87.336_54;
    const HI: f32 = 88.722_83;
    // Adding 1.5 * 2^23 rounds to an integer that then sits in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    const ROUND_BITS: i32 = 0x4B40_0000;
    let xc = if x < LO { LO } else { x };
    let xc = if xc > HI { HI } else { xc };
    let t = xc * std::f32::consts::LOG2_E + ROUND;
    let n = (t.to_bits() as i32).wrapping_sub(ROUND_BITS);
    let nf = t - ROUND;
    // ln 2 split in two so that n * ln2 is exact enough.
    let r = xc - nf * 0.693_359_4 - nf * -2.121_944_4e-4;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let p = p * r * r + r + 1.0;
    // 2^n in two factors: n reaches 128 near HI, past the largest f32 exponent.
    let half = n >> 1;
    let y = p
        * f32::from_bits(((half + 127) as u32) << 23)
        * f32::from_bits(((n - half + 127) as u32) << 23);
    let y = if x < LO { 0.0 } else { y };
    if x > HI {
        f32::INFINITY
    } else {
        y
    }
}

/// e^x for `x <= 0` to about 4 ulp, with fewer operations than [`exp`] (softmax's
/// inner loop): 2^y for y = x log2(e) split into an integer n and f in [-1/2, 1/2], 2^f from a
/// degree-5 minimax polynomial (relative error 7.5e-8 in exact arithmetic; the constant term
/// rounded to 1 so that e^0 is exactly 1) and 2^n from its exponent bits. 0 where y < -126.5
/// (results below 1.2e-38), so that -inf gives exactly 0; NaN stays NaN.
#[inline(always)]
pub(crate) fn exp_nonpositive<M: MulAdd>(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0;
    const ROUND_BITS: i32 = 0x4B40_0000;
    let y = x * std::f32::consts::LOG2_E;
    // The clamp keeps n >= -127, where 2^n's exponent field is 0: the factor is 0.
    let y = if y < -127.0 { -127.0 } else { y };
    let t = y + ROUND;
    let n = (t.to_bits() as i32).wrapping_sub(ROUND_BITS);
    let f = y - (t - ROUND);
    let horner = |p: f32, c: f32| M::mul_add(p, f, c);
    let p = horner(
        horner(
            horner(
                horner(horner(1.327_647_2e-3, 9.675_541e-3), 5.550_713e-2),
                0.240_221_2,
            ),
            0.693_146_94,
        ),
        1.0,
    );
    p * f32::from_bits(((n + 127) as u32) << 23)
}

/// erfc(x) with relative error below 1.2e-7 in exact arithmetic (Numerical Recipes' `erfcc`),
/// so GELU stays accurate for large negative inputs.
#[inline]
fn erfc(x: f32) -> f32 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -1.265_512_2
        + t * (1.000_023_7
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_204
                                + t * (1.488_515_9 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let ans = t * exp(-z * z + poly);
    if x >= 0.0 {
        ans
    } else {
        2.0 - ans
    }
}

/// GELU, exact (erf) form: 0.5 x (1 + erf(x / sqrt 2)) = 0.5 x erfc(-x / sqrt 2).
#[inline]
pub(crate) fn gelu(x: f32) -> f32 {
    0.5 * x * erfc(-x * std::f32::consts::FRAC_1_SQRT_2)
}

/// SiLU: x / (1 + e^-x).
#[inline]
pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::{Fused, Separate};

    #[test]
    fn exp_matches_libm() {
        let mut x = -100.0f32;
        while x < 100.0 {
            let (got, want) = (exp(x), (x as f64).exp());
            if want < 1e-37 {
                assert!(got < 1e-37, "exp({x}) = {got}");
            } else if want > f32::MAX as f64 {
                assert!(got.is_infinite(), "exp({x}) = {got}");
            } else {
                assert!(
                    ((got as f64 - want) / want).abs() < 4e-7,
                    "exp({x}) = {got}, want {want}"
                );
            }
            x += 0.0137;
        }
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
    }

    #[test]
    fn exp_nonpositive_matches_libm() {
        exp_nonpositive_is_accurate::<Fused>();
        exp_nonpositive_is_accurate::<Separate>();
    }

    fn exp_nonpositive_is_accurate<M: MulAdd>() {
        let exp_nonpositive = exp_nonpositive::<M>;
        let mut x = 0.0f32;
        while x > -88.0 {
            let (got, want) = (exp_nonpositive(x) as f64, (x as f64).exp());
            // 4 ulp of the polynomial and the rounding of x log2(e), which grows with |x|.
            let tol = 2.5e-7 + x.abs() as f64 * 1.2e-7;
            if want > 1.2e-38 {
                assert!(
                    ((got - want) / want).abs() < tol,
                    "exp({x}) = {got}, want {want}"
                );
            } else {
                assert!(got < 1.2e-38, "exp({x}) = {got}");
            }
            x -= 0.00731;
        }
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(-0.0), 1.0);
        assert_eq!(exp_nonpositive(-100.0), 0.0);
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
        assert!(exp_nonpositive(f32::NAN).is_nan());
    }
}
