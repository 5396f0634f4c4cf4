//! Summary statistics of repeated timings.

use serde::{Deserialize, Serialize};

/// Summary of the per-run times of one case, in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub runs: usize,
    pub median_ms: f64,
    pub min_ms: f64,
    pub p90_ms: f64,
    pub mean_ms: f64,
}

impl Stats {
    /// Summarises `samples`; `None` when there are none or any is not finite.
    pub fn from_samples(samples: &[f64]) -> Option<Stats> {
        if samples.is_empty() || samples.iter().any(|s| !s.is_finite()) {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        Some(Stats {
            runs: sorted.len(),
            median_ms: median_sorted(&sorted),
            min_ms: sorted[0],
            p90_ms: percentile_sorted(&sorted, 0.9),
            mean_ms: sorted.iter().sum::<f64>() / sorted.len() as f64,
        })
    }
}

/// Median of sorted, non-empty data (the mean of the two middle values for even lengths).
pub fn median_sorted(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        0.5 * (sorted[n / 2 - 1] + sorted[n / 2])
    }
}

/// The `q` quantile (0..=1) of sorted, non-empty data, interpolating linearly between ranks.
pub fn percentile_sorted(sorted: &[f64], q: f64) -> f64 {
    let q = q.clamp(0.0, 1.0);
    let pos = q * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    let frac = pos - lo as f64;
    sorted[lo] + (sorted[hi] - sorted[lo]) * frac
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_and_even_medians() {
        assert_eq!(median_sorted(&[1.0, 2.0, 9.0]), 2.0);
        assert_eq!(median_sorted(&[1.0, 2.0, 4.0, 9.0]), 3.0);
        assert_eq!(median_sorted(&[5.0]), 5.0);
    }

    #[test]
    fn summary_of_unsorted_samples() {
        let s = Stats::from_samples(&[4.0, 1.0, 3.0, 2.0, 5.0, 10.0, 6.0, 7.0, 8.0, 9.0, 11.0])
            .expect("finite samples");
        assert_eq!(s.runs, 11);
        assert_eq!(s.median_ms, 6.0);
        assert_eq!(s.min_ms, 1.0);
        assert!((s.p90_ms - 10.0).abs() < 1e-12);
        assert!((s.mean_ms - 6.0).abs() < 1e-12);
    }

    #[test]
    fn percentile_interpolates() {
        let d = [0.0, 10.0];
        assert!((percentile_sorted(&d, 0.9) - 9.0).abs() < 1e-12);
        assert_eq!(percentile_sorted(&d, 0.0), 0.0);
        assert_eq!(percentile_sorted(&d, 1.0), 10.0);
    }

    #[test]
    fn empty_or_nan_is_none() {
        assert!(Stats::from_samples(&[]).is_none());
        assert!(Stats::from_samples(&[1.0, f64::NAN]).is_none());
    }
}
