//! Attention forward and backward in TFLOP/s at FlashAttention-3's shapes (16384 tokens in
//! all, hidden 2048, head dims 64 and 128, N from 512 to 16384, causal and not; head dim 256
//! forward at the same lengths and backward from 1024 to 8192, without a target), next to torch
//! SDPA through cuDNN and flash (merged from peers.py). Forward FLOPs 4 B H N^2 D, halved when
//! causal; backward 2.5x the forward. The soft-capped cases (`s = cap * tanh(s / cap)`) have no
//! peer (SDPA has no soft-cap) and no target.

use crate::accounting::tflops;
use crate::cases::Profile;
use crate::report::{TargetCheck, Timed};
use crate::rng::{random_tensor, XorShift};
use crate::timing::{time_runs, Pad, Plan};
use calico::ops::{self, AttentionOptions};
use calico::{DType, Device, Result, Tensor};
use serde::{Deserialize, Serialize};
use std::time::Instant;

const TOKENS: usize = 16384;
const HIDDEN: usize = 2048;
/// The packed case of mixed lengths (`AttnSpec::mixed`): 10 sequences of 300 to 4000 tokens,
/// none a multiple of a row block, 16384 in all, in no particular order (as a data loader
/// packs them).
const MIXED_LENS: [usize; 10] = [4000, 300, 2100, 500, 3100, 1000, 1500, 800, 2600, 484];
/// The lengths of the head-dim-256 backward cases in the full profile, each causal and not
/// (peers.py's `ATTN_D256_BWD`; the quick profile's one case is its `ATTN_D256_BWD_QUICK`).
const D256_BWD_SEQS: [usize; 4] = [1024, 2048, 4096, 8192];

/// One attention problem.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnSpec {
    pub backward: bool,
    pub head_dim: usize,
    pub seq: usize,
    pub causal: bool,
    /// The same tokens as `batch()` sequences of `seq` packed into one `[tokens, heads, D]`
    /// tensor with offsets (`ops::attention_varlen`, as flash_attn_varlen_func).
    pub varlen: bool,
    /// Fixed-length tensors stored `[B, N, H, D]` (flash_attn_func's and most models' layout)
    /// and passed as their `[B, H, N, D]` views, so a row of one head is `H * D` elements from
    /// the next; otherwise `[B, H, N, D]` contiguous, as torch SDPA's peers take them.
    pub seq_major: bool,
    /// Packed (with `varlen`) as the sequences of [`MIXED_LENS`] instead of `batch()` of `seq`
    /// tokens; `seq` is then the longest.
    pub mixed: bool,
    /// Query heads per KV head: 1, or 4 (GQA, as Llama-3's 32:8).
    pub group: usize,
    /// Logit soft-cap (`AttentionOptions::softcap`): 30 as Grok-1's, 50 as Gemma-2's.
    pub softcap: Option<f32>,
}

impl AttnSpec {
    pub fn batch(&self) -> usize {
        if self.mixed {
            MIXED_LENS.len()
        } else {
            (TOKENS / self.seq).max(1)
        }
    }
    /// Each sequence's length.
    fn lens(&self) -> Vec<usize> {
        if self.mixed {
            MIXED_LENS.to_vec()
        } else {
            vec![self.seq; self.batch()]
        }
    }
    pub fn heads(&self) -> usize {
        HIDDEN / self.head_dim
    }
    pub fn kv_heads(&self) -> usize {
        self.heads() / self.group.max(1)
    }
    pub fn name(&self) -> String {
        format!(
            "attention {}{} d{} {}{}{}{}{}",
            if self.varlen { "varlen " } else { "" },
            if self.backward { "bwd" } else { "fwd" },
            self.head_dim,
            if self.mixed {
                format!("mixed{}", MIXED_LENS.len())
            } else {
                format!("N{}", self.seq)
            },
            if self.causal { " causal" } else { "" },
            if self.group > 1 {
                format!(" gqa{}", self.group)
            } else {
                String::new()
            },
            self.softcap
                .map_or_else(String::new, |cap| format!(" softcap{cap}")),
            if self.seq_major { " bshd" } else { "" },
        )
    }
    /// `[B, H, N, D, causal]`, and the KV heads after it under GQA, as peers.py records it
    /// (a soft-capped case has the shape of its uncapped twin: [`merge_peer`] tells them apart).
    pub fn shape(&self) -> Vec<usize> {
        let mut shape = vec![
            self.batch(),
            self.heads(),
            self.seq,
            self.head_dim,
            usize::from(self.causal),
        ];
        if self.group > 1 {
            shape.push(self.kv_heads());
        }
        shape
    }
    pub fn flops(&self) -> f64 {
        let (h, d) = (self.heads() as f64, self.head_dim as f64);
        let squares: f64 = self.lens().iter().map(|&n| (n * n) as f64).sum();
        let fwd = 4.0 * h * squares * d / if self.causal { 2.0 } else { 1.0 };
        if self.backward {
            2.5 * fwd
        } else {
            fwd
        }
    }
}

/// Cases like `like` (direction, layout, GQA group, soft-cap) at every head dim and length,
/// each without and with a causal mask, in that order.
fn push_grid(out: &mut Vec<AttnSpec>, dims: &[usize], lens: &[usize], like: AttnSpec) {
    for &head_dim in dims {
        for &seq in lens {
            for causal in [false, true] {
                out.push(AttnSpec {
                    head_dim,
                    seq,
                    causal,
                    ..like
                });
            }
        }
    }
}

/// The cases of a profile (GPU only: on the CPU these shapes take minutes each).
pub fn specs(gpu: bool, profile: Profile) -> Vec<AttnSpec> {
    if !gpu || profile == Profile::Tiny {
        return Vec::new();
    }
    let seqs: &[usize] = if profile == Profile::Full {
        &[512, 1024, 2048, 4096, 8192, 16384]
    } else {
        &[1024, 4096]
    };
    let plain = AttnSpec {
        backward: false,
        head_dim: 0,
        seq: 0,
        causal: false,
        varlen: false,
        seq_major: false,
        mixed: false,
        group: 1,
        softcap: None,
    };
    let bwd = AttnSpec {
        backward: true,
        ..plain
    };
    let mut out = Vec::new();
    push_grid(&mut out, &[64, 128, 256], seqs, plain);
    push_grid(&mut out, &[64, 128], seqs, bwd);
    // head_dim 256 (Gemma-style models) backward, no target: N from 1024 to 8192 in the full
    // profile, the causal N4096 case alone in the quick one (8 heads: the FLOPs of the d = 128
    // case of the same length).
    if profile == Profile::Full {
        push_grid(&mut out, &[256], &D256_BWD_SEQS, bwd);
    } else {
        out.push(AttnSpec {
            head_dim: 256,
            seq: 4096,
            causal: true,
            ..bwd
        });
    }
    // Packed sequences at one length, beside the fixed-length cases of the same shape (the
    // cuDNN column is torch SDPA on that unpacked shape); the same shape stored [B, N, H, D]
    // (the layout models and flash_attn_func hand over; cuDNN column as for packed); head dim
    // 96 (Phi-3's; 21 heads, the Hopper kernels at width 128 on zero-filled columns) at two
    // lengths; GQA with 4 query heads per KV head (16:4 at d = 128) at 2048 and 8192; lengths
    // off every tile (1000: 16 sequences, 4097: 3) at d = 128; packed sequences of mixed
    // lengths (MIXED_LENS, no peer) at d = 128; soft-capped scores (no peer,
    // no target), as Grok-1 (cap 30 at d = 128, forward and backward) and Gemma-2 (cap 50 at
    // d = 256, forward only).
    if profile == Profile::Full {
        let gqa4 = AttnSpec { group: 4, ..plain };
        let packed = AttnSpec {
            varlen: true,
            ..plain
        };
        let bshd = AttnSpec {
            seq_major: true,
            ..plain
        };
        let mixed = AttnSpec {
            mixed: true,
            ..packed
        };
        let longest = MIXED_LENS.iter().copied().max().unwrap_or(1);
        let extras: [(&[usize], &[usize], AttnSpec); 6] = [
            (&[128], &[2048, 8192], gqa4),
            (&[128], &[1000, 4097], plain),
            (&[96], &[2048, 8192], plain),
            (&[64, 128], &[2048], packed),
            (&[128], &[longest], mixed),
            (&[64, 128], &[2048], bshd),
        ];
        for (dims, lens, like) in extras {
            for backward in [false, true] {
                push_grid(&mut out, dims, lens, AttnSpec { backward, ..like });
            }
        }
        // (backward, head dim, length, cap)
        let capped: [(bool, usize, usize, f32); 3] = [
            (false, 128, 8192, 30.0),
            (true, 128, 8192, 30.0),
            (false, 256, 4096, 50.0),
        ];
        for (backward, dim, len, cap) in capped {
            let like = AttnSpec {
                backward,
                softcap: Some(cap),
                ..plain
            };
            push_grid(&mut out, &[dim], &[len], like);
        }
    }
    out
}

/// One measured case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttnCase {
    pub name: String,
    pub backward: bool,
    /// `[B, H, N, D, causal]`.
    pub shape: Vec<usize>,
    pub flops: f64,
    pub calico: Timed,
    pub calico_tflops: Option<f64>,
    pub pct_of_peak: Option<f64>,
    /// Host time of the first call of this variant in the run (compile or disk cache, load,
    /// launch, wait).
    pub first_call_ms: Option<f64>,
    pub cudnn_ms: Option<f64>,
    pub cudnn_tflops: Option<f64>,
    pub ratio_cudnn: Option<f64>,
    pub flash_ms: Option<f64>,
    pub flash_tflops: Option<f64>,
    pub ratio_flash: Option<f64>,
    /// Ratio to cuDNN the issue asks for (N >= 2048), else None.
    pub target_ratio: Option<f64>,
    /// The logit soft-cap of the case, if any: no peer figures (torch SDPA has no soft-cap) and
    /// no target. Absent in reports written before these cases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub softcap: Option<f32>,
}

struct Inputs {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    lse: Tensor,
    d_o: Tensor,
    dq: Tensor,
    dk: Tensor,
    dv: Tensor,
    /// Varlen: the offsets of the packed sequences (I32 `[batch + 1]`).
    cu: Option<Tensor>,
}

fn inputs(dev: &Device, s: &AttnSpec, rng: &mut XorShift) -> Result<Inputs> {
    // The stored shape, the index of its heads axis, the LSE's shape and the offsets.
    let (shape, heads_axis, lse_shape, cu) = if s.varlen {
        let lens = s.lens();
        let tokens: usize = lens.iter().sum();
        let offsets: Vec<i32> = std::iter::once(0)
            .chain(lens.iter().scan(0, |end, &n| {
                *end += n;
                Some(*end as i32)
            }))
            .collect();
        (
            vec![tokens, s.heads(), s.head_dim],
            1,
            vec![s.heads(), tokens],
            Some(dev.tensor(&offsets, &[offsets.len()])?),
        )
    } else {
        let lse_shape = vec![s.batch(), s.heads(), s.seq];
        if s.seq_major {
            let shape = vec![s.batch(), s.seq, s.heads(), s.head_dim];
            (shape, 2, lse_shape, None)
        } else {
            let shape = vec![s.batch(), s.heads(), s.seq, s.head_dim];
            (shape, 1, lse_shape, None)
        }
    };
    // K and V (and their gradients) with the KV heads.
    let mut kv_shape = shape.clone();
    kv_shape[heads_axis] = s.kv_heads();
    // [B, N, H, D] storage is handed over as its [B, H, N, D] view.
    let view = |t: Tensor| {
        if s.seq_major {
            t.transpose(1, 2)
        } else {
            Ok(t)
        }
    };
    let random = |rng: &mut XorShift, shape: &[usize]| {
        view(random_tensor(dev, rng, shape, DType::BF16, -1.0, 1.0)?)
    };
    let zeros = |shape: &[usize]| view(dev.zeros(shape, DType::BF16)?);
    Ok(Inputs {
        cu,
        q: random(rng, &shape)?,
        k: random(rng, &kv_shape)?,
        v: random(rng, &kv_shape)?,
        o: zeros(&shape)?,
        lse: dev.zeros(&lse_shape, DType::F32)?,
        d_o: random(rng, &shape)?,
        dq: zeros(&shape)?,
        dk: zeros(&kv_shape)?,
        dv: zeros(&kv_shape)?,
    })
}

fn call(dev: &Device, s: &AttnSpec, x: &mut Inputs) -> Result<()> {
    let opts = AttentionOptions {
        causal: s.causal,
        softcap: s.softcap,
        ..Default::default()
    };
    match (&x.cu, s.backward) {
        (None, true) => ops::attention_backward(
            dev, &x.q, &x.k, &x.v, &x.o, &x.lse, &x.d_o, &opts, &mut x.dq, &mut x.dk, &mut x.dv,
        ),
        (None, false) => ops::attention(dev, &x.q, &x.k, &x.v, &opts, &mut x.o, &mut x.lse),
        (Some(cu), true) => ops::attention_varlen_backward(
            dev, &x.q, &x.k, &x.v, &x.o, &x.lse, &x.d_o, cu, cu, &opts, &mut x.dq, &mut x.dk,
            &mut x.dv,
        ),
        (Some(cu), false) => {
            ops::attention_varlen(dev, &x.q, &x.k, &x.v, cu, cu, &opts, &mut x.o, &mut x.lse)
        }
    }
}

/// Times one case (one input set: each run reads far more than the L2 holds at these shapes
/// only through its own re-reads, as FlashAttention's benchmarks do).
pub fn run_case(
    dev: &Device,
    spec: &AttnSpec,
    plan: &Plan,
    pad: Option<&Pad>,
    rng: &mut XorShift,
) -> AttnCase {
    let mut case = skipped_case(spec, Timed::not_available("not run"));
    let mut x = match inputs(dev, spec, rng) {
        Ok(x) => x,
        Err(e) => {
            case.calico = Timed::from_error(&e);
            return case;
        }
    };
    if spec.backward {
        // The backward reads the forward's O and LSE.
        let forward = AttnSpec {
            backward: false,
            ..*spec
        };
        if let Err(e) = call(dev, &forward, &mut x) {
            case.calico = Timed::from_error(&e);
            return case;
        }
    }
    let start = Instant::now();
    let first = call(dev, spec, &mut x).and_then(|_| dev.synchronize());
    if let Err(e) = first {
        case.calico = Timed::from_error(&e);
        return case;
    }
    case.first_call_ms = Some(start.elapsed().as_secs_f64() * 1e3);
    case.calico = match time_runs(dev, plan, pad, &mut |_| call(dev, spec, &mut x)) {
        Ok(s) => Timed::ok(s),
        Err(e) => Timed::from_error(&e),
    };
    case
}

/// A case that was not timed, with `why` as Calico's entry.
pub fn skipped_case(spec: &AttnSpec, why: Timed) -> AttnCase {
    AttnCase {
        name: spec.name(),
        backward: spec.backward,
        shape: spec.shape(),
        flops: spec.flops(),
        calico: why,
        calico_tflops: None,
        pct_of_peak: None,
        first_call_ms: None,
        cudnn_ms: None,
        cudnn_tflops: None,
        ratio_cudnn: None,
        flash_ms: None,
        flash_tflops: None,
        ratio_flash: None,
        // The targets name head_dim 64 and 128 at the paper's lengths (powers of two);
        // 96, 256 and the odd lengths are reported beside cuDNN without one, the soft-capped
        // cases with neither.
        target_ratio: (spec.seq >= 2048
            && spec.seq.is_power_of_two()
            && matches!(spec.head_dim, 64 | 128)
            && !spec.varlen
            && !spec.seq_major
            && spec.group == 1
            && spec.softcap.is_none())
        .then_some(if spec.backward { 1.10 } else { 1.05 }),
        softcap: spec.softcap,
    }
}

/// Rates and ratios from the times.
pub fn derive(cases: &mut [AttnCase], peak: Option<f64>) {
    for c in cases {
        c.calico_tflops = c.calico.median_ms().map(|ms| tflops(c.flops, ms));
        c.pct_of_peak = c.calico_tflops.zip(peak).map(|(t, p)| 100.0 * t / p);
        c.cudnn_tflops = c.cudnn_ms.map(|ms| tflops(c.flops, ms));
        c.flash_tflops = c.flash_ms.map(|ms| tflops(c.flops, ms));
        let ratio = |peer: Option<f64>| c.calico_tflops.zip(peer).map(|(a, b)| a / b);
        c.ratio_cudnn = ratio(c.cudnn_tflops);
        c.ratio_flash = ratio(c.flash_tflops);
    }
}

/// The targets: >= 1.05x cuDNN forward, >= 1.10x backward, at N >= 2048.
pub fn targets(cases: &[AttnCase]) -> Vec<TargetCheck> {
    cases
        .iter()
        .filter_map(|c| {
            let want = c.target_ratio?;
            Some(TargetCheck {
                what: c.name.clone(),
                target: format!(">= {want:.2}x cuDNN (torch SDPA)"),
                measured: c
                    .ratio_cudnn
                    .map_or_else(|| "not measured".into(), |r| format!("{r:.2}x")),
                met: c.ratio_cudnn.map(|r| r >= want),
            })
        })
        .collect()
}

/// The Markdown table.
pub fn markdown(cases: &[AttnCase]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    if cases.is_empty() {
        return s;
    }
    let f = |v: Option<f64>, p: usize| v.map_or_else(|| "-".to_string(), |v| format!("{v:.p$}"));
    let _ = writeln!(s, "\n## Attention (bf16, 16384 tokens, hidden 2048)\n");
    let _ = writeln!(
        s,
        "| case | [B, H, N, D, causal] | calico TFLOP/s | % of peak | first call ms | cuDNN TFLOP/s | x cuDNN | flash TFLOP/s | x flash |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
    for c in cases {
        let calico = match c.calico_tflops {
            Some(t) => format!("{t:.0}"),
            None => c
                .calico
                .message
                .clone()
                .unwrap_or_else(|| "-".into())
                .lines()
                .next()
                .unwrap_or("-")
                .to_string(),
        };
        let _ = writeln!(
            s,
            "| {} | {:?} | {calico} | {} | {} | {} | {} | {} | {} |",
            c.name,
            c.shape,
            f(c.pct_of_peak, 1),
            f(c.first_call_ms, 0),
            f(c.cudnn_tflops, 0),
            f(c.ratio_cudnn, 2),
            f(c.flash_tflops, 0),
            f(c.ratio_flash, 2),
        );
    }
    s
}

/// Puts a peers.py figure (`attention fwd cudnn` etc.) next to its case; true when matched.
pub fn merge_peer(cases: &mut [AttnCase], op: &str, shape: &[usize], ms: f64) -> bool {
    let mut parts = op.split(' ');
    let (Some("attention"), Some(dir), Some(backend)) = (parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let backward = dir == "bwd";
    // Every case of the shape: the fixed-length one and its packed (varlen) and [B, N, H, D]
    // twins; not the soft-capped one (SDPA computes no soft-cap: its time is another
    // problem's).
    let mut matched = false;
    for c in cases
        .iter_mut()
        .filter(|c| c.backward == backward && c.shape == shape && c.softcap.is_none())
    {
        match backend {
            "cudnn" => c.cudnn_ms = Some(ms),
            "flash" => c.flash_ms = Some(ms),
            _ => return false,
        }
        matched = true;
    }
    matched
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soft_capped_cases_are_in_the_full_profile_only_with_names_of_their_own() {
        let full = specs(true, Profile::Full);
        let capped: Vec<String> = full
            .iter()
            .filter(|s| s.softcap.is_some())
            .map(AttnSpec::name)
            .collect();
        assert_eq!(
            capped,
            [
                "attention fwd d128 N8192 softcap30",
                "attention fwd d128 N8192 causal softcap30",
                "attention bwd d128 N8192 softcap30",
                "attention bwd d128 N8192 causal softcap30",
                "attention fwd d256 N4096 softcap50",
                "attention fwd d256 N4096 causal softcap50",
            ]
        );
        let mut names: Vec<String> = full.iter().map(AttnSpec::name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), full.len(), "two cases share a name");
        for profile in [Profile::Quick, Profile::Tiny] {
            assert!(specs(true, profile).iter().all(|s| s.softcap.is_none()));
        }
    }

    #[test]
    fn head_dim_256_backward_cases_take_peers_but_no_target() {
        let bwd256 = |profile| -> Vec<AttnSpec> {
            specs(true, profile)
                .into_iter()
                .filter(|s| s.backward && s.head_dim == 256)
                .collect()
        };
        let full = bwd256(Profile::Full);
        let names: Vec<String> = full.iter().map(AttnSpec::name).collect();
        let want: Vec<String> = D256_BWD_SEQS
            .iter()
            .flat_map(|n| {
                [
                    format!("attention bwd d256 N{n}"),
                    format!("attention bwd d256 N{n} causal"),
                ]
            })
            .collect();
        assert_eq!(names, want);
        let quick: Vec<String> = bwd256(Profile::Quick).iter().map(AttnSpec::name).collect();
        assert_eq!(quick, ["attention bwd d256 N4096 causal"]);
        let mut cases: Vec<AttnCase> = full
            .iter()
            .map(|s| skipped_case(s, Timed::not_available("not run")))
            .collect();
        for (c, s) in cases.iter().zip(&full) {
            // The d256 forward's convention: 16384 tokens, 2048 / 256 = 8 heads.
            assert_eq!(c.shape[..4], [16384 / s.seq, 8, s.seq, 256], "{}", c.name);
            assert_eq!(c.target_ratio, None, "{}", c.name);
        }
        let shape = full[1].shape();
        assert!(merge_peer(&mut cases, "attention bwd cudnn", &shape, 1.0));
        assert!(merge_peer(&mut cases, "attention bwd flash", &shape, 2.0));
        for c in &cases {
            let merged = c.shape == shape;
            assert_eq!(c.cudnn_ms, merged.then_some(1.0), "{}", c.name);
            assert_eq!(c.flash_ms, merged.then_some(2.0), "{}", c.name);
        }
    }

    #[test]
    fn soft_capped_cases_take_no_peer_and_no_target() {
        let specs = specs(true, Profile::Full);
        let twins: Vec<AttnSpec> = specs
            .iter()
            .filter(|s| s.head_dim == 128 && s.seq == 8192 && s.group == 1 && !s.varlen)
            .copied()
            .collect();
        let mut cases: Vec<AttnCase> = twins
            .iter()
            .map(|s| skipped_case(s, Timed::not_available("not run")))
            .collect();
        for c in &cases {
            assert_eq!(c.target_ratio.is_some(), c.softcap.is_none(), "{}", c.name);
        }
        let shape = AttnSpec {
            softcap: None,
            ..twins[0]
        }
        .shape();
        assert!(merge_peer(&mut cases, "attention fwd cudnn", &shape, 1.0));
        assert!(merge_peer(&mut cases, "attention fwd flash", &shape, 2.0));
        for c in &cases {
            let merged = !c.backward && c.shape == shape && c.softcap.is_none();
            assert_eq!(c.cudnn_ms, merged.then_some(1.0), "{}", c.name);
            assert_eq!(c.flash_ms, merged.then_some(2.0), "{}", c.name);
        }
    }

    #[test]
    fn seq_major_cases_share_their_twins_peers_but_take_no_target() {
        let specs = specs(true, Profile::Full);
        let bshd: Vec<AttnSpec> = specs.iter().filter(|s| s.seq_major).copied().collect();
        assert_eq!(
            bshd.len(),
            8,
            "d64 and d128, N2048, fwd and bwd, causal and not"
        );
        let mut cases: Vec<AttnCase> = bshd
            .iter()
            .map(|s| skipped_case(s, Timed::not_available("not run")))
            .collect();
        let twin = AttnSpec {
            seq_major: false,
            ..bshd[0]
        };
        assert!(
            specs.contains(&twin),
            "the [B, H, N, D] case of the same shape"
        );
        assert!(merge_peer(
            &mut cases,
            "attention fwd cudnn",
            &twin.shape(),
            1.0
        ));
        assert!(cases[0].name.ends_with(" bshd"), "{}", cases[0].name);
        assert_eq!(cases[0].cudnn_ms, Some(1.0));
        assert!(cases.iter().all(|c| c.target_ratio.is_none()));
    }

    #[test]
    fn reports_without_the_softcap_field_still_parse() {
        let spec = AttnSpec {
            backward: false,
            head_dim: 128,
            seq: 2048,
            causal: true,
            varlen: false,
            seq_major: false,
            mixed: false,
            group: 1,
            softcap: None,
        };
        let case = skipped_case(&spec, Timed::not_available("not run"));
        let json = serde_json::to_value(&case).unwrap();
        assert!(json.get("softcap").is_none(), "{json}");
        let back: AttnCase = serde_json::from_value(json).unwrap();
        assert_eq!(back, case);
        let capped = skipped_case(
            &AttnSpec {
                softcap: Some(30.0),
                ..spec
            },
            Timed::not_available("not run"),
        );
        let back: AttnCase =
            serde_json::from_str(&serde_json::to_string(&capped).unwrap()).unwrap();
        assert_eq!(back.softcap, Some(30.0));
    }
}
