//! Timing one case: warm-up, then device-event times of many runs, capped by wall time.

use crate::stats::Stats;
use calico::{DType, Device, Error, Result, Tensor};
use std::time::{Duration, Instant};

/// How many runs to time, and for how long.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plan {
    /// Untimed runs first (the first compiles and loads the kernel).
    pub warmup: usize,
    /// Timed runs always done unless `hard_cap` passes first.
    pub min_runs: usize,
    pub max_runs: usize,
    /// Stop once `min_runs` are done and this much wall time has passed.
    pub soft_cap: Duration,
    /// Stop after this much wall time even with fewer than `min_runs` (slow cases, hangs of
    /// the host side); at least one run is always timed.
    pub hard_cap: Duration,
}

impl Plan {
    pub const GPU: Plan = Plan {
        warmup: 5,
        min_runs: 20,
        max_runs: 200,
        soft_cap: Duration::from_millis(1500),
        hard_cap: Duration::from_secs(10),
    };
    pub const GPU_QUICK: Plan = Plan {
        warmup: 3,
        min_runs: 10,
        max_runs: 50,
        soft_cap: Duration::from_millis(400),
        hard_cap: Duration::from_secs(4),
    };
    pub const CPU: Plan = Plan {
        warmup: 1,
        min_runs: 5,
        max_runs: 30,
        soft_cap: Duration::from_millis(800),
        hard_cap: Duration::from_secs(4),
    };
    pub const CPU_QUICK: Plan = Plan {
        warmup: 1,
        min_runs: 3,
        max_runs: 10,
        soft_cap: Duration::from_millis(200),
        hard_cap: Duration::from_secs(2),
    };
    /// For tests: a handful of runs.
    pub const TINY: Plan = Plan {
        warmup: 1,
        min_runs: 3,
        max_runs: 3,
        soft_cap: Duration::from_millis(50),
        hard_cap: Duration::from_secs(1),
    };
}

/// Untimed device work issued before each timed run. On a GPU it keeps the stream busy while
/// the host enqueues the timed work, so the start event fires with the work already queued and
/// the host's launch cost stays out of the time (triton's `do_bench` gets the same from its L2
/// flush). It also evicts the L2. Not used on the CPU, where it would block.
///
/// The work only reads: a matrix-vector product over a 512 MiB matrix (the GEMV kernel),
/// which leaves the L2 full of clean lines. A copy (the first version) left up to the L2's
/// size of dirty lines, written back to memory during the timed run: 50 MiB at the copy's
/// bandwidth is ~17 us, a large share of a 20 us decode GEMV.
#[derive(Debug)]
pub struct Pad {
    x: Tensor,
    w: Tensor,
    y: Tensor,
}

impl Pad {
    /// 512 MiB of matrix: about 0.25 ms on an H100, longer than an op's host-side launch.
    pub const GPU_BYTES: usize = 512 << 20;

    pub fn new(dev: &Device, bytes: usize) -> Result<Pad> {
        let k = 16384;
        let n = (bytes / 2 / k).max(1);
        let pad = Pad {
            x: dev.zeros(&[1, k], DType::BF16)?,
            w: dev.zeros(&[n, k], DType::BF16)?,
            y: dev.zeros(&[1, n], DType::BF16)?,
        };
        pad.issue(dev)?;
        dev.synchronize()?;
        Ok(pad)
    }

    fn issue(&self, dev: &Device) -> Result<()> {
        // `y` is an Arc'd view: the clone writes the same memory.
        let mut y = self.y.clone();
        calico::ops::matmul(dev, &self.x, &self.w.transpose(0, 1)?, &mut y)
    }
}

/// Times `run(i)` for runs i = 0, 1, ...: `plan.warmup` untimed runs, then device-event times
/// until the plan says stop. `run` picks its input copy from `i` (rotation past the L2).
pub fn time_runs(
    dev: &Device,
    plan: &Plan,
    pad: Option<&Pad>,
    run: &mut dyn FnMut(usize) -> Result<()>,
) -> Result<Stats> {
    // The first run compiles and loads the kernel; the rest of the warm-up is capped by time
    // so that slow cases do not spend their budget before timing starts.
    let mut i = 0usize;
    if plan.warmup > 0 {
        run(i)?;
        i += 1;
        dev.synchronize()?;
    }
    let warm_start = Instant::now();
    while i < plan.warmup && warm_start.elapsed() < plan.soft_cap / 3 {
        run(i)?;
        i += 1;
    }
    dev.synchronize()?;
    let timed_start = Instant::now();
    let mut samples = Vec::with_capacity(plan.min_runs);
    while samples.len() < plan.max_runs.max(1) {
        if let Some(pad) = pad {
            pad.issue(dev)?;
        }
        let ms = dev.time_ms(&mut || run(i))?;
        i += 1;
        samples.push(ms);
        let elapsed = timed_start.elapsed();
        if (samples.len() >= plan.min_runs && elapsed > plan.soft_cap) || elapsed > plan.hard_cap {
            break;
        }
    }
    Stats::from_samples(&samples).ok_or_else(|| Error::Runtime {
        backend: "bench",
        call: "time_ms".into(),
        message: format!("timings were not finite: {samples:?}"),
    })
}

/// How many copies of a working set of `set_bytes` make the rotation exceed twice the L2
/// (`l2_bytes`, or 64 MiB when unknown), between 1 and 64.
pub fn rotation_copies(set_bytes: u64, l2_bytes: usize) -> usize {
    let l2 = if l2_bytes == 0 { 64 << 20 } else { l2_bytes } as u64;
    // The smallest count whose total is strictly over 2x the L2.
    let need = 2 * l2 / set_bytes.max(1) + 1;
    need.clamp(1, 64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_exceeds_twice_l2() {
        let l2 = 50 << 20;
        for set in [1u64 << 10, 8 << 20, 33 << 20, 100 << 20] {
            let c = rotation_copies(set, l2) as u64;
            assert!(c * set > 2 * l2 as u64 || c == 64, "{set}: {c}");
        }
        // A set of 1 GiB is never copied.
        assert_eq!(rotation_copies(1 << 30, l2), 1);
        assert_eq!(rotation_copies(0, 0), 64);
    }

    #[test]
    fn cpu_runs_follow_the_plan() {
        let dev = Device::cpu();
        let mut calls = Vec::new();
        let s = time_runs(&dev, &Plan::TINY, None, &mut |i| {
            calls.push(i);
            Ok(())
        })
        .expect("timing on the CPU");
        assert_eq!(s.runs, 3);
        assert_eq!(calls, vec![0, 1, 2, 3]);
    }
}
