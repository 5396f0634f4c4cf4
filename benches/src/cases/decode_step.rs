//! One decode step of a transformer layer's front half, as a model's forward pass queues it:
//! fused residual + RMSNorm, the Q, K and V projections, rope on Q and K, and a softmax. Used
//! by the host-loop and graph-replay cases and by the graph-capture test.

use crate::rng::{random_tensor, XorShift};
use calico::ops::{self, RopeMode};
use calico::{DType, Device, Result, Tensor};

/// The tensors of one step: inputs are fixed, outputs are rewritten by every run.
#[derive(Debug)]
pub struct DecodeStep {
    pub tokens: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    x: Tensor,
    residual: Tensor,
    norm_weight: Tensor,
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    cos: Tensor,
    sin: Tensor,
    /// Outputs (see [`DecodeStep::outputs`]).
    normed: Tensor,
    sum: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_rot: Tensor,
    k_rot: Tensor,
    probs: Tensor,
}

impl DecodeStep {
    /// A step for `tokens` tokens (the batch of a decode step) of a model with `hidden`
    /// features, `heads` query heads and `kv_heads` key/value heads of 128 features.
    pub fn new(
        dev: &Device,
        rng: &mut XorShift,
        tokens: usize,
        hidden: usize,
        kv_heads: usize,
    ) -> Result<DecodeStep> {
        let head_dim = 128;
        let heads = hidden / head_dim;
        let kv = kv_heads * head_dim;
        let t = |rng: &mut XorShift, shape: &[usize], lo, hi| {
            random_tensor(dev, rng, shape, DType::BF16, lo, hi)
        };
        let scale = 1.0 / (hidden as f32).sqrt();
        let positions = 64;
        let angles: Vec<f32> = (0..positions * head_dim / 2)
            .map(|i| (i / (head_dim / 2)) as f32 * 0.01 * ((i % (head_dim / 2)) as f32 + 1.0))
            .collect();
        let cos: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
        let sin: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
        let z = |shape: &[usize]| dev.zeros(shape, DType::BF16);
        Ok(DecodeStep {
            tokens,
            hidden,
            heads,
            kv_heads,
            head_dim,
            x: t(rng, &[tokens, hidden], -1.0, 1.0)?,
            residual: t(rng, &[tokens, hidden], -1.0, 1.0)?,
            norm_weight: t(rng, &[hidden], 0.5, 1.5)?,
            wq: t(rng, &[hidden, hidden], -scale, scale)?,
            wk: t(rng, &[kv, hidden], -scale, scale)?,
            wv: t(rng, &[kv, hidden], -scale, scale)?,
            cos: dev.tensor(&cos, &[positions, head_dim / 2])?,
            sin: dev.tensor(&sin, &[positions, head_dim / 2])?,
            normed: z(&[tokens, hidden])?,
            sum: z(&[tokens, hidden])?,
            q: z(&[tokens, hidden])?,
            k: z(&[tokens, kv])?,
            v: z(&[tokens, kv])?,
            q_rot: z(&[tokens, 1, heads, head_dim])?,
            k_rot: z(&[tokens, 1, kv_heads, head_dim])?,
            probs: z(&[tokens * heads, head_dim])?,
        })
    }

    /// Queues the step's ops on `dev` (7 launches), without synchronising.
    pub fn run(&mut self, dev: &Device) -> Result<()> {
        let s = self;
        ops::add_rms_norm(
            dev,
            &s.x,
            &s.residual,
            &s.norm_weight,
            1e-6,
            &mut s.normed,
            &mut s.sum,
        )?;
        ops::matmul(dev, &s.normed, &s.wq.transpose(0, 1)?, &mut s.q)?;
        ops::matmul(dev, &s.normed, &s.wk.transpose(0, 1)?, &mut s.k)?;
        ops::matmul(dev, &s.normed, &s.wv.transpose(0, 1)?, &mut s.v)?;
        let (t, hd) = (s.tokens, s.head_dim);
        let q = s.q.reshape(&[t, 1, s.heads, hd])?;
        let k = s.k.reshape(&[t, 1, s.kv_heads, hd])?;
        ops::rope(
            dev,
            &q,
            &s.cos,
            &s.sin,
            7,
            RopeMode::HalfSplit,
            &mut s.q_rot,
        )?;
        ops::rope(
            dev,
            &k,
            &s.cos,
            &s.sin,
            7,
            RopeMode::HalfSplit,
            &mut s.k_rot,
        )?;
        let scores = s.q_rot.reshape(&[t * s.heads, hd])?;
        ops::softmax(dev, &scores, &mut s.probs)
    }

    /// The step's outputs, in the order [`DecodeStep::outputs`] returns them.
    fn output_tensors(&self) -> [&Tensor; 8] {
        [
            &self.normed,
            &self.sum,
            &self.q,
            &self.k,
            &self.v,
            &self.q_rot,
            &self.k_rot,
            &self.probs,
        ]
    }

    /// Every output of the step, as f32 (synchronises).
    pub fn outputs(&self) -> Result<Vec<Vec<f32>>> {
        self.output_tensors()
            .iter()
            .map(|t| {
                t.to_f64_vec()
                    .map(|v| v.into_iter().map(|x| x as f32).collect())
            })
            .collect()
    }

    /// Overwrites every output with NaN, so a run that skips an op is caught.
    pub fn poison_outputs(&self) -> Result<()> {
        for t in self.output_tensors() {
            t.copy_from_slice(&vec![half::bf16::NAN; t.numel()])?;
        }
        Ok(())
    }
}
