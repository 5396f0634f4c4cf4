//! Times the CPU attention (forward, backward, decode) outside `calico bench`, for tuning on a
//! shared machine:
//!
//! ```sh
//! cargo run --release -p calico-cpu --example attention_timing -- [filter] [runs]
//! ```
//!
//! bf16 inputs with values in [-2, 2), the whole call timed on the host; prints the best and
//! the median of `runs` calls (default 5) with the best's GFLOP/s (forward 4 N_q N_k d per
//! head, backward 2.5x that, halved under a causal mask) or, for decode, GB/s of K and V read.

mod common;

use calico_core::{DType, Tensor};
use calico_cpu::{
    attention_backward, attention_decode, attention_forward, AttentionParams, AttentionShape,
    CpuDevice, DecodeCache, DecodeMask, SeqSpan,
};
use common::{best_and_median, filled};

/// A prefill shape: query heads, KV heads, sequence length (queries = keys), head dim, causal.
struct Prefill {
    hq: usize,
    hkv: usize,
    n: usize,
    d: usize,
    causal: bool,
}

impl Prefill {
    fn name(&self, pass: &str) -> String {
        let mask = if self.causal { " causal" } else { "" };
        let (hq, hkv, n, d) = (self.hq, self.hkv, self.n, self.d);
        format!("attention {pass} 1 x {hq}/{hkv} heads x {n} x {d}{mask}")
    }

    /// Forward FLOPs: Q K^T and P V, halved under a causal mask.
    fn forward_flops(&self) -> f64 {
        let full = 4.0 * (self.hq * self.n * self.n * self.d) as f64;
        if self.causal {
            full / 2.0
        } else {
            full
        }
    }
}

fn report(name: &str, (best, median): (f64, f64), rate: f64, unit: &str) {
    println!(
        "{name:<52} best {:>9.3} ms  median {:>9.3} ms  {:>7.1} {unit}",
        best * 1e3,
        median * 1e3,
        rate / best / 1e9
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let filter = args.first().cloned().unwrap_or_default();
    let runs: usize = args.get(1).and_then(|r| r.parse().ok()).unwrap_or(5);
    let dev = CpuDevice::new();
    let prefills = [
        Prefill {
            hq: 32,
            hkv: 8,
            n: 128,
            d: 128,
            causal: false,
        },
        Prefill {
            hq: 32,
            hkv: 8,
            n: 1024,
            d: 128,
            causal: true,
        },
        Prefill {
            hq: 16,
            hkv: 16,
            n: 512,
            d: 64,
            causal: false,
        },
    ];
    for p in &prefills {
        let (fwd, bwd) = (p.name("fwd"), p.name("bwd"));
        if !fwd.contains(&filter) && !bwd.contains(&filter) {
            continue;
        }
        let q = filled(&dev, &[1, p.hq, p.n, p.d]);
        let k = filled(&dev, &[1, p.hkv, p.n, p.d]);
        let v = filled(&dev, &[1, p.hkv, p.n, p.d]);
        let d_o = filled(&dev, &[1, p.hq, p.n, p.d]);
        let o = Tensor::zeros(&dev, &[1, p.hq, p.n, p.d], DType::BF16).unwrap();
        let lse = Tensor::zeros(&dev, &[1, p.hq, p.n], DType::F32).unwrap();
        let grads = [&q, &k, &v].map(|t| Tensor::zeros(&dev, t.shape(), DType::BF16).unwrap());
        let shape = AttentionShape {
            seqs: vec![SeqSpan {
                batch: 0,
                q_start: 0,
                q_len: p.n,
                k_start: 0,
                k_len: p.n,
            }],
            q_heads: p.hq,
            kv_heads: p.hkv,
            head_dim: p.d,
        };
        let params = AttentionParams {
            scale: 1.0 / (p.d as f32).sqrt(),
            softcap: None,
            left: None,
            right: p.causal.then_some(0),
        };
        let forward = || attention_forward(&shape, &params, &q, &k, &v, &o, &lse).unwrap();
        let t = best_and_median(runs, forward);
        if fwd.contains(&filter) {
            report(&fwd, t, p.forward_flops(), "GFLOP/s");
        }
        if bwd.contains(&filter) {
            let [dq, dk, dv] = &grads;
            let t = best_and_median(runs, || {
                attention_backward(&shape, &params, &q, &k, &v, &o, &lse, &d_o, dq, dk, dv).unwrap()
            });
            report(&bwd, t, 2.5 * p.forward_flops(), "GFLOP/s");
        }
    }
    for (seqs, nq, keys) in [(1, 1, 4096), (1, 1, 32768), (4, 4, 4096)] {
        let (hq, hkv, d) = (32, 8, 128);
        let name = format!("attention_decode {seqs} x {nq} x {hq}/{hkv} heads x {keys} x {d}");
        if !name.contains(&filter) {
            continue;
        }
        let q = filled(&dev, &[seqs, hq, nq, d]);
        let k = filled(&dev, &[seqs, hkv, keys, d]);
        let v = filled(&dev, &[seqs, hkv, keys, d]);
        let seq_lens = Tensor::zeros(&dev, &[seqs], DType::I32).unwrap();
        seq_lens.copy_from_slice(&vec![keys as i32; seqs]).unwrap();
        let o = Tensor::zeros(&dev, &[seqs, hq, nq, d], DType::BF16).unwrap();
        let lse = Tensor::zeros(&dev, &[seqs, hq, nq], DType::F32).unwrap();
        let cache = DecodeCache::Contiguous {
            k: &k,
            v: &v,
            seq_lens: &seq_lens,
        };
        let mask = DecodeMask {
            scale: 1.0 / (d as f32).sqrt(),
            causal: true,
            window: None,
            softcap: None,
        };
        let t = best_and_median(runs, || {
            attention_decode(&q, &cache, &mask, &o, &lse).unwrap()
        });
        let kv_bytes = 2.0 * (seqs * hkv * keys * d * 2) as f64;
        report(&name, t, kv_bytes, "GB/s");
    }
}
