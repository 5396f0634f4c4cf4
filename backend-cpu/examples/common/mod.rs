//! What the timing examples share: filled inputs and host timing.

use calico_core::{DType, Tensor};
use calico_cpu::CpuDevice;
use std::time::Instant;

/// A bf16 tensor with values in [-2, 2).
pub fn filled(dev: &CpuDevice, shape: &[usize]) -> Tensor {
    let t = Tensor::zeros(dev, shape, DType::BF16).unwrap();
    let n: usize = shape.iter().product();
    let vals: Vec<half::bf16> = (0..n)
        .map(|i| half::bf16::from_f32(((i * 7919) % 1000) as f32 / 250.0 - 2.0))
        .collect();
    t.copy_from_slice(&vals).unwrap();
    t
}

/// Seconds one call of `f` takes.
pub fn seconds(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

/// Best and median seconds of `runs` calls of `f`.
#[allow(dead_code)] // not every example reports medians
pub fn best_and_median(runs: usize, mut f: impl FnMut()) -> (f64, f64) {
    let mut s: Vec<f64> = (0..runs.max(1)).map(|_| seconds(&mut f)).collect();
    s.sort_by(f64::total_cmp);
    (s[0], s[s.len() / 2])
}
