//! `calico-sweep`: host time per call of ops at shapes read from a JSON file, timed as a user's
//! program sees them: the op queued back to back without synchronising, the loop closed by one
//! device synchronisation, the best of five loops (warm-up calls first, so compilation and
//! loading are not in it). No report and no targets: it looks for shapes where Calico is much
//! slower than its peer, which `benches/peers/sweep.py` writes the case list for and times the
//! same way in PyTorch.
//!
//!   calico-sweep cases.json > calico.jsonl
//!
//! A case is an object with "id" and "op" and the op's sizes:
//!   matmul: m, n, k, batch (0: 2-D), b ("linear": B = W^T with W [N, K]; "rowmajor": B [K, N])
//!   rms_norm, softmax: rows, cols
//!   attention, attention_backward: b, hq, hkv, nq, nkv, d, causal
//!   attention_decode: b, hq, hkv, ctx, d, nq (queries per sequence, contiguous cache)
//! Output: one JSON object per case and line: {"id", "us"} or {"id", "error"}.

use calico::ops::{self, AttentionOptions, KvCache};
use calico::{DType, Device, Result};
use calico_benches::rng::{random_tensor, XorShift};
use serde::Deserialize;
use std::time::Instant;

#[derive(Debug, Deserialize)]
struct Case {
    id: String,
    op: String,
    #[serde(default)]
    m: usize,
    #[serde(default)]
    n: usize,
    #[serde(default)]
    k: usize,
    #[serde(default)]
    batch: usize,
    #[serde(default)]
    b: serde_json::Value,
    #[serde(default)]
    rows: usize,
    #[serde(default)]
    cols: usize,
    #[serde(default)]
    hq: usize,
    #[serde(default)]
    hkv: usize,
    #[serde(default)]
    nq: usize,
    #[serde(default)]
    nkv: usize,
    #[serde(default)]
    ctx: usize,
    #[serde(default)]
    d: usize,
    #[serde(default)]
    causal: bool,
}

impl Case {
    /// The batch of the attention cases ("b" is a number there, a layout for matmul).
    fn attention_batch(&self) -> usize {
        self.b.as_u64().unwrap_or(1) as usize
    }
}

type Call = Box<dyn FnMut() -> Result<()>>;

fn prepare(dev: &Device, c: &Case, rng: &mut XorShift) -> Result<Call> {
    let t = |rng: &mut XorShift, shape: &[usize]| {
        random_tensor(dev, rng, shape, DType::BF16, -1.0, 1.0)
    };
    let d = dev.clone();
    let opts = AttentionOptions {
        causal: c.causal,
        ..AttentionOptions::default()
    };
    Ok(match c.op.as_str() {
        "matmul" => {
            let lead: Vec<usize> = if c.batch > 0 { vec![c.batch] } else { vec![] };
            let dims = |x: &[usize]| [lead.as_slice(), x].concat();
            let a = t(rng, &dims(&[c.m, c.k]))?;
            let rank = lead.len();
            let b = if c.b.as_str() == Some("rowmajor") {
                t(rng, &dims(&[c.k, c.n]))?
            } else {
                t(rng, &dims(&[c.n, c.k]))?.transpose(rank, rank + 1)?
            };
            let mut out = dev.zeros(&dims(&[c.m, c.n]), DType::BF16)?;
            Box::new(move || ops::matmul(&d, &a, &b, &mut out))
        }
        "rms_norm" => {
            let (x, w) = (t(rng, &[c.rows, c.cols])?, t(rng, &[c.cols])?);
            let mut y = dev.zeros(&[c.rows, c.cols], DType::BF16)?;
            Box::new(move || ops::rms_norm(&d, &x, &w, 1e-6, &mut y))
        }
        "softmax" => {
            let x = t(rng, &[c.rows, c.cols])?;
            let mut y = dev.zeros(&[c.rows, c.cols], DType::BF16)?;
            Box::new(move || ops::softmax(&d, &x, &mut y))
        }
        "attention" | "attention_backward" => {
            let b = c.attention_batch();
            let q = t(rng, &[b, c.hq, c.nq, c.d])?;
            let (k, v) = (
                t(rng, &[b, c.hkv, c.nkv, c.d])?,
                t(rng, &[b, c.hkv, c.nkv, c.d])?,
            );
            let mut o = dev.zeros(&[b, c.hq, c.nq, c.d], DType::BF16)?;
            let mut lse = dev.zeros(&[b, c.hq, c.nq], DType::F32)?;
            if c.op == "attention" {
                Box::new(move || ops::attention(&d, &q, &k, &v, &opts, &mut o, &mut lse))
            } else {
                ops::attention(dev, &q, &k, &v, &opts, &mut o, &mut lse)?;
                let d_o = t(rng, &[b, c.hq, c.nq, c.d])?;
                let mut dq = dev.zeros(&[b, c.hq, c.nq, c.d], DType::BF16)?;
                let mut dk = dev.zeros(&[b, c.hkv, c.nkv, c.d], DType::BF16)?;
                let mut dv = dev.zeros(&[b, c.hkv, c.nkv, c.d], DType::BF16)?;
                Box::new(move || {
                    ops::attention_backward(
                        &d, &q, &k, &v, &o, &lse, &d_o, &opts, &mut dq, &mut dk, &mut dv,
                    )
                })
            }
        }
        "attention_decode" => {
            let b = c.attention_batch();
            let q = t(rng, &[b, c.hq, c.nq, c.d])?;
            let (k, v) = (
                t(rng, &[b, c.hkv, c.ctx, c.d])?,
                t(rng, &[b, c.hkv, c.ctx, c.d])?,
            );
            let seq_lens = dev.tensor(&vec![c.ctx as i32; b], &[b])?;
            let mut o = dev.zeros(&[b, c.hq, c.nq, c.d], DType::BF16)?;
            let mut lse = dev.zeros(&[b, c.hq, c.nq], DType::F32)?;
            Box::new(move || {
                let cache = KvCache::Contiguous {
                    k: &k,
                    v: &v,
                    seq_lens: &seq_lens,
                };
                ops::attention_decode(&d, &q, &cache, &opts, &mut o, &mut lse)
            })
        }
        other => {
            return Err(calico::Error::unsupported(format!(
                "calico-sweep: no op {other}"
            )))
        }
    })
}

/// Microseconds per call: the best of five loops, each as many calls as fit ~20 ms (at least
/// 3, at most 200), after warm-up calls.
fn time_call(dev: &Device, call: &mut Call) -> Result<f64> {
    call()?;
    dev.synchronize()?;
    let start = Instant::now();
    call()?;
    dev.synchronize()?;
    let once = start.elapsed().as_secs_f64();
    let calls = ((0.02 / once.max(1e-6)) as usize).clamp(3, 200);
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let start = Instant::now();
        for _ in 0..calls {
            call()?;
        }
        dev.synchronize()?;
        best = best.min(start.elapsed().as_secs_f64() / calls as f64);
    }
    Ok(best * 1e6)
}

fn run(dev: &Device, c: &Case, rng: &mut XorShift) -> Result<f64> {
    let mut call = prepare(dev, c, rng)?;
    time_call(dev, &mut call)
}

fn main() -> std::process::ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: calico-sweep CASES.json");
        return std::process::ExitCode::FAILURE;
    };
    let cases: Vec<Case> = match std::fs::read_to_string(&path)
        .map_err(|e| e.to_string())
        .and_then(|s| serde_json::from_str(&s).map_err(|e| e.to_string()))
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("calico-sweep: {path}: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let dev = match Device::auto() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("calico-sweep: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    eprintln!("calico-sweep: {} cases on {}", cases.len(), dev.name());
    let mut rng = XorShift::new(7);
    for c in &cases {
        let line = match run(&dev, c, &mut rng) {
            Ok(us) => serde_json::json!({"id": c.id, "us": us}),
            Err(e) => serde_json::json!({"id": c.id, "error": e.to_string()}),
        };
        println!("{line}");
    }
    std::process::ExitCode::SUCCESS
}
