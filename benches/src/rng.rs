//! Random inputs: a small xorshift generator, and device tensors filled with random values.
//!
//! Large tensors are filled by tiling a random pool whose length is prime, so no two rows of a
//! power-of-two shape start alike, while the host work stays at memcpy speed even in debug builds.

use calico::{DType, Device, Result, Tensor};
use half::{bf16, f16};

/// xorshift64*: fast, good enough for benchmark data, reproducible from a seed.
#[derive(Debug, Clone)]
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> XorShift {
        // A zero state would stay zero forever.
        XorShift((seed ^ 0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [-1, 1).
    pub fn next_f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// Length of the random pool that large tensors tile (a prime, about 1M elements).
const POOL: usize = 1_048_573;

/// `n` random values in [lo, hi), as f32.
pub fn random_f32(rng: &mut XorShift, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    let pool: Vec<f32> = (0..n.min(POOL))
        .map(|_| lo + (rng.next_f32() * 0.5 + 0.5) * (hi - lo))
        .collect();
    tile(&pool, n)
}

fn tile<T: Copy>(pool: &[T], n: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let take = pool.len().min(n - out.len());
        out.extend_from_slice(&pool[..take]);
    }
    out
}

/// A contiguous tensor of `dtype` with values uniform in [lo, hi) (never all zeros).
pub fn random_tensor(
    dev: &Device,
    rng: &mut XorShift,
    shape: &[usize],
    dtype: DType,
    lo: f32,
    hi: f32,
) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let values = random_f32(rng, n.min(POOL), lo, hi);
    match dtype {
        DType::BF16 => {
            let pool: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
            dev.tensor(&tile(&pool, n), shape)
        }
        DType::F16 => {
            let pool: Vec<f16> = values.iter().map(|&v| f16::from_f32(v)).collect();
            dev.tensor(&tile(&pool, n), shape)
        }
        _ => dev.tensor(&tile(&values, n), shape),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_in_range_and_not_constant() {
        let mut r = XorShift::new(0);
        let v = random_f32(&mut r, 10_000, -2.0, 3.0);
        assert!(v.iter().all(|&x| (-2.0..3.0).contains(&x)));
        let mean = v.iter().sum::<f32>() / v.len() as f32;
        assert!((mean - 0.5).abs() < 0.1, "mean {mean}");
        assert!(v.iter().any(|&x| x != v[0]));
    }

    #[test]
    fn tiling_fills_exactly() {
        assert_eq!(tile(&[1, 2, 3], 7), vec![1, 2, 3, 1, 2, 3, 1]);
        assert!(tile::<u8>(&[1], 0).is_empty());
    }
}
