//! Running a block of row work with the widest vectors the CPU has.
//!
//! The portable x86-64 build may only use SSE2 (4 f32 lanes). The row loops are written so that
//! LLVM vectorises them; [`vectorised`] compiles the closure it is given again with AVX-512
//! (16 lanes, 32 registers) and with AVX2 (8 lanes) enabled, and picks the widest copy the CPU
//! supports at run time. No FMA is enabled and LLVM does not reorder floating-point sums (each
//! reduction's lanes are fixed in the source), so every copy gives bit-identical results.

/// Calls `f`, compiled with AVX-512 or AVX2 when the CPU has it. Everything `f` does should
/// inline into it (pass an `#[inline(always)]` closure; the row helpers are
/// `#[inline(always)]`), so the whole loop nest gets the wider vectors.
#[inline(always)]
pub(crate) fn vectorised<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
        {
            // SAFETY: `with_avx512` only requires these three CPU features, checked just above.
            return unsafe { with_avx512(f) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: `with_avx2` only requires that the CPU supports AVX2, checked just above.
            return unsafe { with_avx2(f) };
        }
    }
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn with_avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
fn with_avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

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
