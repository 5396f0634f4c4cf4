//! Seeded random inputs, tensor fill/read helpers and the per-dtype tolerance check.

use calico_core::{DType, Element, Layout, Tensor};
use calico_cpu::{
    attention_backward, attention_forward, AttentionParams, AttentionShape, CpuDevice, SeqSpan,
};
use half::{bf16, f16};

pub const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// Row lengths that are not multiples of any vector width.
pub const EDGE_COLS: [usize; 5] = [1, 3, 17, 1023, 4097];

pub fn dev() -> CpuDevice {
    CpuDevice::new()
}

/// SplitMix64: small, seeded, good enough for test inputs.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn values(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
}

/// Writes `vals` (row-major) into the view `t`, rounding to its dtype.
pub fn fill(t: &Tensor, vals: &[f64]) {
    fn typed<T: Element>(t: &Tensor, vals: &[f64]) {
        let v: Vec<T> = vals.iter().map(|&x| T::from_f64(x)).collect();
        t.copy_from_slice(&v).unwrap();
    }
    match t.dtype() {
        DType::F32 => typed::<f32>(t, vals),
        DType::F16 => typed::<f16>(t, vals),
        DType::BF16 => typed::<bf16>(t, vals),
        d => panic!("no fill for {d}"),
    }
}

pub fn read(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec().unwrap()
}

/// A random tensor of `shape` with values in [lo, hi); returns it and its values as stored.
pub fn random(
    rng: &mut Rng,
    dtype: DType,
    shape: &[usize],
    lo: f64,
    hi: f64,
) -> (Tensor, Vec<f64>) {
    let t = Tensor::zeros(&dev(), shape, dtype).unwrap();
    let n = t.numel();
    fill(&t, &rng.values(n, lo, hi));
    let v = read(&t);
    (t, v)
}

/// A `[rows, cols]` view whose rows sit `pad` elements apart beyond `cols` inside a parent
/// filled with `sentinel`, so strided rows and untouched padding can be checked.
pub fn strided(dtype: DType, rows: usize, cols: usize, pad: usize, sentinel: f64) -> Tensor {
    let parent = Tensor::zeros(&dev(), &[rows, cols + pad], dtype).unwrap();
    fill(&parent, &vec![sentinel; rows * (cols + pad)]);
    parent.narrow(1, pad / 2, cols).unwrap()
}

/// A random `[rows, cols]` input, with padded rows when `pad > 0`.
pub fn random_rows(
    rng: &mut Rng,
    dtype: DType,
    rows: usize,
    cols: usize,
    pad: usize,
) -> (Tensor, Vec<f64>) {
    let t = strided(dtype, rows, cols, pad, 7.0);
    fill(&t, &rng.values(rows * cols, -2.0, 2.0));
    let v = read(&t);
    (t, v)
}

/// Every element of the storage behind `t` (as its dtype), for checking padding.
pub fn whole_storage(t: &Tensor) -> Vec<f64> {
    let n = t.storage().size_bytes() / t.dtype().size_bytes();
    let all =
        Tensor::from_storage(t.storage().clone(), t.dtype(), Layout::contiguous(&[n])).unwrap();
    read(&all)
}

/// Checks that elements of the storage outside `t`'s view still hold `sentinel`.
pub fn assert_padding(t: &Tensor, sentinel: f64) {
    let all = whole_storage(t);
    let rows = t.layout().as_rows().unwrap();
    for (e, &v) in all.iter().enumerate() {
        let rel = e.wrapping_sub(rows.offset);
        let inside = e >= rows.offset
            && rel / rows.row_stride.max(1) < rows.rows
            && rel % rows.row_stride.max(1) < rows.cols;
        if !inside {
            assert_eq!(v, sentinel, "element {e} outside the view was written");
        }
    }
}

pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 => 2e-3,
        DType::BF16 => 1.6e-2,
        d => panic!("no tolerance for {d}"),
    }
}

/// max |got - want| must be within the dtype's tolerance relative to max |want|.
pub fn assert_close(dtype: DType, got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-30);
    let (mut worst, mut at) = (0.0f64, 0);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs();
        assert!(!err.is_nan(), "{what}: NaN at {i} (got {g}, want {w})");
        if err > worst {
            (worst, at) = (err, i);
        }
    }
    assert!(
        worst / scale <= tolerance(dtype),
        "{what}: relative error {:.3e} at {at} (got {}, want {}) exceeds {:.1e} for {dtype}",
        worst / scale,
        got[at],
        want[at],
        tolerance(dtype)
    );
}

/// Rounds an f64 to `dtype` the way storing would.
pub fn round_to(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F32 => v as f32 as f64,
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        d => panic!("no rounding for {d}"),
    }
}

/// One sequence's attention inputs, `[1, heads, n, d]` with random values: q, k, v (in
/// [-2, 2)) and an output gradient d_o (in [-1, 1)), and the shape of the call.
pub fn one_sequence_attention(
    rng: &mut Rng,
    dtype: DType,
    (hq, hkv, nq, nk, d): (usize, usize, usize, usize, usize),
) -> ([Tensor; 4], AttentionShape) {
    let (q, _) = random(rng, dtype, &[1, hq, nq, d], -2.0, 2.0);
    let (k, _) = random(rng, dtype, &[1, hkv, nk, d], -2.0, 2.0);
    let (v, _) = random(rng, dtype, &[1, hkv, nk, d], -2.0, 2.0);
    let (d_o, _) = random(rng, dtype, &[1, hq, nq, d], -1.0, 1.0);
    let shape = AttentionShape {
        seqs: vec![SeqSpan {
            batch: 0,
            q_start: 0,
            q_len: nq,
            k_start: 0,
            k_len: nk,
        }],
        q_heads: hq,
        kv_heads: hkv,
        head_dim: d,
    };
    ([q, k, v, d_o], shape)
}

/// The forward, then the backward of [`one_sequence_attention`]'s inputs: o, lse, dq, dk, dv.
pub fn attention_forward_backward(
    shape: &AttentionShape,
    params: &AttentionParams,
    [q, k, v, d_o]: &[Tensor; 4],
) -> [Tensor; 5] {
    let zeros = |t: &Tensor| Tensor::zeros(&dev(), t.shape(), t.dtype()).unwrap();
    let o = zeros(q);
    let lse = Tensor::zeros(&dev(), &q.shape()[..3], DType::F32).unwrap();
    attention_forward(shape, params, q, k, v, &o, &lse).unwrap();
    let (dq, dk, dv) = (zeros(q), zeros(k), zeros(v));
    attention_backward(shape, params, q, k, v, &o, &lse, d_o, &dq, &dk, &dv).unwrap();
    [o, lse, dq, dk, dv]
}
