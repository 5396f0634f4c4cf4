//! Decode attention (one new token per sequence, GQA 32:8, head_dim 128, and 96 in two cases,
//! bf16) over paged and contiguous KV caches, as bandwidth: K + V bytes read per second
//! against the copy bandwidth.

use crate::cases::Profile;
use crate::report::{DecodeCase, Timed};
use crate::rng::{random_tensor, XorShift};
use crate::timing::{rotation_copies, time_runs, Pad, Plan};
use calico::ops::{self, AttentionOptions, KvCache};
use calico::{DType, Device, Result, Tensor};
use serde::{Deserialize, Serialize};

pub const QUERY_HEADS: usize = 32;
pub const KV_HEADS: usize = 8;
/// The head dim of the cases, and of the targets.
pub const HEAD_DIM: usize = 128;
/// Share of the copy bandwidth asked for at context >= 8k (docs/targets.md).
pub const TARGET_PCT: f64 = 80.0;
/// Shortest context the target applies to.
pub const TARGET_MIN_CONTEXT: usize = 8192;

/// One decode case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecodeSpec {
    pub batch: usize,
    /// Tokens in each sequence's cache.
    pub context: usize,
    /// Tokens per page; `None` for a contiguous [B, Hkv, N, D] cache.
    pub page_size: Option<usize>,
    /// [`HEAD_DIM`], or 96 (Phi-3's: the lane kernel at width 128). Reports written before
    /// this field read as [`HEAD_DIM`].
    #[serde(default = "default_head_dim")]
    pub head_dim: usize,
}

fn default_head_dim() -> usize {
    HEAD_DIM
}

impl DecodeSpec {
    pub fn name(&self) -> String {
        let layout = match self.page_size {
            Some(p) => format!("paged{p}"),
            None => "contiguous".into(),
        };
        let dim = if self.head_dim == HEAD_DIM {
            String::new()
        } else {
            format!(" d{}", self.head_dim)
        };
        format!(
            "attention decode bf16 b{} ctx{} {layout}{dim}",
            self.batch, self.context
        )
    }

    /// K and V bytes one call reads.
    pub fn kv_bytes(&self) -> u64 {
        (2 * self.batch * self.context * KV_HEADS * self.head_dim * 2) as u64
    }

    /// The target share of the copy bandwidth, if one applies (the head dim only).
    pub fn target_pct(&self) -> Option<f64> {
        (self.context >= TARGET_MIN_CONTEXT && self.head_dim == HEAD_DIM).then_some(TARGET_PCT)
    }

    /// The shape peers.py records for torch's run of this case: `[batch, context]` at
    /// [`HEAD_DIM`], `[batch, context, head_dim]` otherwise.
    pub fn peer_shape(&self) -> Vec<usize> {
        let mut shape = vec![self.batch, self.context];
        if self.head_dim != HEAD_DIM {
            shape.push(self.head_dim);
        }
        shape
    }
}

/// The decode cases of a profile (none on the CPU: a 100 MB cache per call is GPU work).
pub fn decode_specs(gpu: bool, profile: Profile) -> Vec<DecodeSpec> {
    let s = |batch, context, page_size| DecodeSpec {
        batch,
        context,
        page_size,
        head_dim: HEAD_DIM,
    };
    let d96 = |spec: DecodeSpec| DecodeSpec {
        head_dim: 96,
        ..spec
    };
    match (gpu, profile) {
        (true, Profile::Full) => vec![
            s(1, 1024, Some(16)),
            s(1, 8192, Some(16)),
            s(1, 32768, Some(16)),
            s(1, 65536, Some(16)),
            s(1, 131072, Some(16)),
            s(16, 8192, Some(16)),
            s(64, 8192, Some(16)),
            s(1, 32768, Some(64)),
            s(16, 8192, Some(64)),
            s(1, 8192, None),
            s(1, 32768, None),
            s(1, 65536, None),
            s(1, 131072, None),
            s(16, 8192, None),
            s(64, 8192, None),
            d96(s(1, 32768, Some(16))),
            d96(s(16, 8192, None)),
        ],
        (true, Profile::Quick) => vec![
            s(1, 8192, Some(16)),
            s(1, 32768, Some(16)),
            s(16, 8192, Some(16)),
            s(1, 32768, None),
        ],
        (true, Profile::Tiny) => vec![s(1, 256, Some(16))],
        (false, _) => Vec::new(),
    }
}

/// One rotation set: a cache, its queries and outputs.
struct Set {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    block_table: Option<Tensor>,
    seq_lens: Tensor,
    o: Tensor,
    lse: Tensor,
}

impl Set {
    fn call(&mut self, dev: &Device) -> Result<()> {
        let cache = match &self.block_table {
            Some(t) => KvCache::Paged {
                k_pages: &self.k,
                v_pages: &self.v,
                block_table: t,
                seq_lens: &self.seq_lens,
            },
            None => KvCache::Contiguous {
                k: &self.k,
                v: &self.v,
                seq_lens: &self.seq_lens,
            },
        };
        let opts = AttentionOptions::default();
        ops::attention_decode(dev, &self.q, &cache, &opts, &mut self.o, &mut self.lse)
    }
}

fn make_set(dev: &Device, spec: &DecodeSpec, rng: &mut XorShift) -> Result<Set> {
    let (b, n) = (spec.batch, spec.context);
    let bf = DType::BF16;
    let d = spec.head_dim;
    let q = random_tensor(dev, rng, &[b, QUERY_HEADS, 1, d], bf, -1.0, 1.0)?;
    let lens: Vec<i32> = vec![n as i32; b];
    let seq_lens = dev.tensor(&lens, &[b])?;
    let (k, v, block_table) = match spec.page_size {
        Some(ps) => {
            let per_seq = n.div_ceil(ps);
            let pages = b * per_seq;
            let shape = [pages, ps, KV_HEADS, d];
            // Pages in a shuffled order, as a long-running server's pool hands them out.
            let mut order: Vec<i32> = (0..pages as i32).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
            }
            (
                random_tensor(dev, rng, &shape, bf, -1.0, 1.0)?,
                random_tensor(dev, rng, &shape, bf, -1.0, 1.0)?,
                Some(dev.tensor(&order, &[b, per_seq])?),
            )
        }
        None => {
            let shape = [b, KV_HEADS, n, d];
            (
                random_tensor(dev, rng, &shape, bf, -1.0, 1.0)?,
                random_tensor(dev, rng, &shape, bf, -1.0, 1.0)?,
                None,
            )
        }
    };
    Ok(Set {
        q,
        k,
        v,
        block_table,
        seq_lens,
        o: dev.zeros(&[b, QUERY_HEADS, 1, d], bf)?,
        lse: dev.zeros(&[b, QUERY_HEADS, 1], DType::F32)?,
    })
}

/// Times one case; errors become a "not available" or "failed" entry.
pub fn run_case(
    dev: &Device,
    spec: &DecodeSpec,
    plan: &Plan,
    pad: Option<&Pad>,
    rng: &mut XorShift,
) -> DecodeCase {
    let bytes = spec.kv_bytes();
    let copies = rotation_copies(bytes, dev.arch().l2_bytes);
    let copies = if *plan == Plan::TINY { 2 } else { copies };
    let timed = (|| {
        let mut sets = Vec::with_capacity(copies);
        for _ in 0..copies {
            sets.push(make_set(dev, spec, rng)?);
        }
        time_runs(dev, plan, pad, &mut |i| {
            let n = sets.len();
            sets[i % n].call(dev)
        })
    })();
    let timed = match timed {
        Ok(stats) => Timed::ok(stats),
        Err(e) => Timed::from_error(&e),
    };
    DecodeCase {
        rotation_copies: copies,
        ..skipped_case(spec, timed)
    }
}

/// A case with `calico` as given and nothing else measured.
pub fn skipped_case(spec: &DecodeSpec, calico: Timed) -> DecodeCase {
    DecodeCase {
        name: spec.name(),
        spec: *spec,
        kv_bytes: spec.kv_bytes(),
        rotation_copies: 0,
        calico,
        gbps: None,
        pct_of_copy: None,
        target_pct: spec.target_pct(),
        cudnn_ms: None,
        flash_ms: None,
        cudnn_pct_of_copy: None,
        flash_pct_of_copy: None,
    }
}
