//! Running a block of row work with the widest vectors the CPU has.
//!
//! The portable x86-64 build may only use SSE2 (4 f32 lanes). The row loops are written so that
//! LLVM vectorises them; [`vectorised`] compiles the closure it is given again with AVX-512
//! (16 lanes, 32 registers) and with AVX2 (8 lanes) enabled, and picks the widest copy the CPU
//! supports at run time. LLVM neither reorders floating-point sums (each reduction's lanes are
//! fixed in the source) nor fuses a multiply and an add on its own, so every copy gives
//! bit-identical results; only code that asks for fused multiply-adds through [`MulAdd`] (the
//! [`vectorised_fma!`] form, softmax's exponential) differs by rounding between the copies.

/// Calls `f`, compiled with AVX-512 or AVX2 when the CPU has it. Everything `f` does should
/// inline into it (pass an `#[inline(always)]` closure; the row helpers are
/// `#[inline(always)]`), so the whole loop nest gets the wider vectors.
#[inline(always)]
pub(crate) fn vectorised<R>(f: impl FnOnce() -> R) -> R {
    match tier() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `tier()` returned Avx512 only after detecting every feature that
        // `with_avx512` enables.
        Tier::Avx512 => unsafe { with_avx512(f) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, for AVX2 and FMA.
        Tier::Avx2 => unsafe { with_avx2(f) },
        _ => f(),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn with_avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl")]
pub(crate) fn with_avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// The widest copy this CPU runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Tier {
    /// AVX-512 F/BW/VL (with FMA).
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// AVX2 with FMA.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// The build's own target features.
    Portable,
}

/// The widest copy the CPU backend may use, to compare the copies on one machine (tests,
/// benchmarks): a limit never enables what the CPU lacks. Set by `CALICO_CPU_SIMD` (`avx512`,
/// `avx2` or `portable`) or by [`limit_simd`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SimdLimit {
    Avx512,
    Avx2,
    Portable,
}

impl SimdLimit {
    fn rank(self) -> u8 {
        match self {
            SimdLimit::Portable => 1,
            SimdLimit::Avx2 => 2,
            SimdLimit::Avx512 => 3,
        }
    }
}

/// The limit set by [`limit_simd`] (its rank; 0 = none).
static LIMIT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Limits the copies every later call runs, process-wide (`None`: back to
/// `CALICO_CPU_SIMD`, or the widest the CPU has). Calls already running are not affected.
pub fn limit_simd(limit: Option<SimdLimit>) {
    LIMIT.store(
        limit.map_or(0, SimdLimit::rank),
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// The rank of the limit in force: [`limit_simd`]'s, else `CALICO_CPU_SIMD`'s (read once),
/// else none (u8::MAX).
fn limit_rank() -> u8 {
    static FROM_ENV: std::sync::OnceLock<u8> = std::sync::OnceLock::new();
    match LIMIT.load(std::sync::atomic::Ordering::Relaxed) {
        0 => *FROM_ENV.get_or_init(|| match std::env::var("CALICO_CPU_SIMD").as_deref() {
            Ok("avx512") => SimdLimit::Avx512.rank(),
            Ok("avx2") => SimdLimit::Avx2.rank(),
            Ok("portable") => SimdLimit::Portable.rank(),
            _ => u8::MAX,
        }),
        rank => rank,
    }
}

/// The [`Tier`] to run: the widest the CPU has (detection cached by std), within the limit.
#[inline(always)]
pub(crate) fn tier() -> Tier {
    #[cfg(target_arch = "x86_64")]
    {
        let limit = limit_rank();
        if limit >= SimdLimit::Avx512.rank()
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("fma")
        {
            return Tier::Avx512;
        }
        if limit >= SimdLimit::Avx2.rank()
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
        {
            return Tier::Avx2;
        }
    }
    Tier::Portable
}

/// `a * b + c`, fused (one rounding) or not, chosen per compiled copy; and what the copy's
/// registers hold, for loops that keep accumulators in them.
pub(crate) trait MulAdd {
    /// f32 lanes of accumulators a loop may keep in the copy's vector registers, about half
    /// of them (the rest hold loads and broadcasts): 8 AVX2 vectors of 8 lanes (NEON: 16 of
    /// 4) by default.
    const ACCUMULATOR_LANES: usize = 64;

    fn mul_add(a: f32, b: f32, c: f32) -> f32;
}

/// One instruction where the copy is compiled with FMA (x86 AVX2/AVX-512 copies, aarch64).
pub(crate) struct Fused;

impl MulAdd for Fused {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

/// [`Fused`] in the AVX-512 copy, with its 32 wide registers.
pub(crate) struct FusedWide;

impl MulAdd for FusedWide {
    /// 16 of the 32 AVX-512 registers of 16 lanes.
    const ACCUMULATOR_LANES: usize = 256;

    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

/// A multiply and an add, for copies without FMA (where `f32::mul_add` is a libm call).
#[cfg_attr(target_arch = "aarch64", allow(dead_code))] // aarch64 always has FMA
pub(crate) struct Separate;

impl MulAdd for Separate {
    /// 8 of the 16 SSE2 registers of 4 lanes.
    const ACCUMULATOR_LANES: usize = 32;

    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}

/// [`MulAdd`] for the portable copy: aarch64 always has FMA; x86-64's baseline does not.
#[cfg(target_arch = "aarch64")]
pub(crate) type PortableMulAdd = Fused;
#[cfg(not(target_arch = "aarch64"))]
pub(crate) type PortableMulAdd = Separate;

/// `vectorised_fma!(|M| body)`: runs `body` compiled for the CPU's [`Tier`], with the type `M`
/// naming its [`MulAdd`] (fused in the AVX2 and AVX-512 copies). A macro because a closure
/// cannot be generic: `body` is compiled once per tier, each time with its own `M`. (Written
/// like a closure so that rustfmt formats the body.)
macro_rules! vectorised_fma {
    (|$m:ident| $body:expr) => {
        match $crate::simd::tier() {
            #[cfg(target_arch = "x86_64")]
            $crate::simd::Tier::Avx512 => {
                // SAFETY: `tier()` returned Avx512 only after detecting every feature that
                // `with_avx512` enables.
                unsafe {
                    $crate::simd::with_avx512(
                        #[inline(always)]
                        || {
                            type $m = $crate::simd::FusedWide;
                            $body
                        },
                    )
                }
            }
            #[cfg(target_arch = "x86_64")]
            $crate::simd::Tier::Avx2 => {
                // SAFETY: `tier()` returned Avx2 only after detecting AVX2 and FMA, the
                // features `with_avx2` enables.
                unsafe {
                    $crate::simd::with_avx2(
                        #[inline(always)]
                        || {
                            type $m = $crate::simd::Fused;
                            $body
                        },
                    )
                }
            }
            _ => {
                type $m = $crate::simd::PortableMulAdd;
                $body
            }
        }
    };
}
pub(crate) use vectorised_fma;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_the_closure_once_and_returns_its_value() {
        let mut calls = 0;
        let v = vectorised(|| {
            calls += 1;
            (0..100).map(|i| i as f32).sum::<f32>()
        });
        assert_eq!((v, calls), (4950.0, 1));
    }
}
