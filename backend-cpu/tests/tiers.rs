//! The CPU backend's vector copies agree: the AVX2 copy gives the AVX-512 copy's bits (both
//! fuse their multiply-adds and keep every sum's order; bf16 GEMMs and attention on CPUs
//! with AVX512_BF16 excepted, within rounding), the portable copy (separate multiply and add on x86-64) the
//! same values within rounding. One test in its own executable, since
//! `limit_simd` is process-wide.

#[allow(dead_code)]
#[path = "ops/common.rs"]
mod common;

use calico_core::{DType, Epilogue, Tensor};
use calico_cpu::{
    attention_decode, gemm, limit_simd, rms_norm, softmax, AttentionParams, DecodeCache,
    DecodeMask, SimdLimit,
};
use common::{attention_forward_backward, dev, one_sequence_attention, random, read, Rng};

/// Every output of a fixed set of calls (attention forward, backward and decode with a window,
/// GQA and a head dim with a tail; a few-rows and a general GEMM; rms_norm; softmax).
fn outputs(dtype: DType) -> Vec<(String, Vec<f64>)> {
    let mut rng = Rng::new(11);
    let zeros = |s: &[usize], dt| Tensor::zeros(&dev(), s, dt).unwrap();
    let mut out = Vec::new();
    for d in [64, 80] {
        let (hq, hkv, nq, nk) = (4, 2, 70, 133);
        let (inputs, shape) = one_sequence_attention(&mut rng, dtype, (hq, hkv, nq, nk, d));
        let params = AttentionParams {
            scale: 0.2,
            softcap: None,
            left: Some(90),
            right: Some(0),
        };
        let [o, lse, dq, dk, dv] = attention_forward_backward(&shape, &params, &inputs);
        let [q, k, v, _] = &inputs;
        let lens = zeros(&[1], DType::I32);
        lens.copy_from_slice(&[nk as i32]).unwrap();
        let q1 = q.narrow(2, 0, 2).unwrap();
        let (o1, lse1) = (zeros(q1.shape(), dtype), zeros(&[1, hq, 2], DType::F32));
        let cache = DecodeCache::Contiguous {
            k,
            v,
            seq_lens: &lens,
        };
        let mask = DecodeMask {
            scale: 0.2,
            causal: true,
            window: None,
            softcap: Some(5.0),
        };
        attention_decode(&q1, &cache, &mask, &o1, &lse1).unwrap();
        for (name, t) in [
            ("o", &o),
            ("lse", &lse),
            ("dq", &dq),
            ("dk", &dk),
            ("dv", &dv),
            ("decode o", &o1),
            ("decode lse", &lse1),
        ] {
            out.push((format!("attention d{d} {name}"), read(t)));
        }
    }
    for (m, n, k) in [(3, 200, 300), (300, 70, 90)] {
        let (a, _) = random(&mut rng, dtype, &[m, k], -1.0, 1.0);
        let (w, _) = random(&mut rng, dtype, &[n, k], -1.0, 1.0);
        let d = zeros(&[m, n], DType::F32);
        gemm(
            &a,
            &w.transpose(0, 1).unwrap(),
            None,
            &d,
            1.0,
            0.0,
            Epilogue::None,
            None,
        )
        .unwrap();
        out.push((format!("gemm {m}x{n}x{k}"), read(&d)));
    }
    let (x, _) = random(&mut rng, dtype, &[5, 1000], -3.0, 3.0);
    let (w, _) = random(&mut rng, dtype, &[1000], 0.5, 1.5);
    let y = zeros(&[5, 1000], dtype);
    rms_norm(&x, None, &w, 1e-6, &y, None).unwrap();
    out.push(("rms_norm".into(), read(&y)));
    let s = zeros(&[5, 1000], dtype);
    softmax(&x, &s).unwrap();
    out.push(("softmax".into(), read(&s)));
    out
}

/// Whether the AVX-512 copy takes bf16 GEMMs through AVX512_BF16 (gemm_bf16_dot.rs).
fn has_bf16_dot() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[test]
fn vector_copies_agree() {
    for dtype in [DType::F32, DType::BF16] {
        limit_simd(Some(SimdLimit::Avx512));
        let widest = outputs(dtype);
        limit_simd(Some(SimdLimit::Avx2));
        let avx2 = outputs(dtype);
        limit_simd(Some(SimdLimit::Portable));
        let portable = outputs(dtype);
        limit_simd(None);
        // bf16 outputs may round to the neighbouring value where the portable copy's products
        // differ in the last f32 bit.
        let tol = if dtype == DType::F32 { 1e-4 } else { 1e-2 };
        for (((name, w), (_, a)), (_, p)) in widest.iter().zip(&avx2).zip(&portable) {
            let scale = w.iter().fold(1e-30f64, |m, v| m.max(v.abs()));
            let pair_dots = name.starts_with("gemm") || name.starts_with("attention");
            if dtype == DType::BF16 && pair_dots && has_bf16_dot() {
                // The AVX-512 copy multiplies bf16 pairs directly (the GEMM's products, the
                // attention's scores: bf16_pairs.rs): each pair's two products are added into
                // an f32 lane in turn, so its sums round differently from the widening
                // copies', and a bf16 output may round to the neighbouring value.
                let worst = w
                    .iter()
                    .zip(a)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0.0, f64::max);
                assert!(
                    worst <= tol * scale,
                    "{dtype} {name}: the AVX-512 copy off the AVX2 copy by {worst:e}"
                );
            } else {
                let same = w.iter().zip(a).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(
                    same,
                    "{dtype} {name}: the AVX2 copy differs from the AVX-512 copy"
                );
            }
            let worst = w
                .iter()
                .zip(p)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f64::max);
            assert!(
                worst <= tol * scale,
                "{dtype} {name}: portable copy off by {worst:e} (max |x| {scale:e})"
            );
        }
    }
    #[cfg(target_arch = "x86_64")]
    println!(
        "compared the copies this CPU has: avx512 {} (bf16 dot {}), avx2 {}",
        std::arch::is_x86_feature_detected!("avx512f"),
        has_bf16_dot(),
        std::arch::is_x86_feature_detected!("avx2")
    );
}
