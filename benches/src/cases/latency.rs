//! Host latency of an op: the first call (compile, load, launch) and later calls (cached).

use crate::report::Latency;
use crate::rng::{random_tensor, XorShift};
use crate::stats::Stats;
use calico::{ops, DType, Device, Result};
use std::path::PathBuf;
use std::time::Instant;

const FIRST_TARGET_MS: f64 = 2000.0;
const LATER_TARGET_MS: f64 = 10.0;

/// Measures `rms_norm` on `shape` with a fresh device of `dev`'s kind whose disk cache is an
/// empty temporary `CALICO_CACHE_DIR`, so its first call compiles.
pub fn measure(dev: &Device, shape: &[usize], later_calls: usize, rng: &mut XorShift) -> Latency {
    let mut out = Latency {
        op: "rms_norm".into(),
        shape: shape.to_vec(),
        method: "a second device of the same backend opened with an empty temporary CALICO_CACHE_DIR (its own in-memory kernel cache), so the first call compiles; host wall clock until each call returns, synchronising between calls".into(),
        first_call_ms: None,
        first_call_disk_cached_ms: None,
        later_call: None,
        message: None,
        target_first_ms: FIRST_TARGET_MS,
        target_later_ms: LATER_TARGET_MS,
    };
    let dir = temp_cache_dir();
    if let Err(e) = measure_into(dev, shape, later_calls, rng, &dir, &mut out) {
        out.message = Some(format!("latency not measured: {e}"));
    }
    let _ = std::fs::remove_dir_all(&dir);
    out
}

fn temp_cache_dir() -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    std::env::temp_dir().join(format!("calico-bench-cache-{}-{nanos}", std::process::id()))
}

/// Opens a device like `dev` with `CALICO_CACHE_DIR=dir`, restoring the variable after.
fn open_with_cache(dev: &Device, dir: &std::path::Path) -> Result<Device> {
    let previous = std::env::var_os("CALICO_CACHE_DIR");
    // The cache directory is read when a device is created; nothing else in this process reads
    // the variable concurrently (the suite runs on one thread).
    std::env::set_var("CALICO_CACHE_DIR", dir);
    let fresh = Device::open(dev.kind(), dev.device_id().ordinal);
    match previous {
        Some(v) => std::env::set_var("CALICO_CACHE_DIR", v),
        None => std::env::remove_var("CALICO_CACHE_DIR"),
    }
    fresh
}

/// Times one more call of the op prepared by the first.
type LaterCall = Box<dyn FnMut() -> Result<f64>>;

fn measure_into(
    dev: &Device,
    shape: &[usize],
    later_calls: usize,
    rng: &mut XorShift,
    dir: &std::path::Path,
    out: &mut Latency,
) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let cols = shape.last().copied().unwrap_or(1);
    let mut call = |d: &Device| -> Result<(f64, LaterCall)> {
        let x = random_tensor(d, rng, shape, DType::BF16, -2.0, 2.0)?;
        let w = random_tensor(d, rng, &[cols], DType::BF16, 0.5, 1.5)?;
        let mut y = d.zeros(shape, DType::BF16)?;
        d.synchronize()?;
        let t = Instant::now();
        ops::rms_norm(d, &x, &w, 1e-6, &mut y)?;
        let first = t.elapsed().as_secs_f64() * 1e3;
        d.synchronize()?;
        let d = d.clone();
        let again = move || -> Result<f64> {
            let t = Instant::now();
            ops::rms_norm(&d, &x, &w, 1e-6, &mut y)?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            d.synchronize()?;
            Ok(ms)
        };
        Ok((first, Box::new(again)))
    };
    let cold = open_with_cache(dev, dir)?;
    let (first, mut again) = call(&cold)?;
    out.first_call_ms = Some(first);
    let samples = (0..later_calls.max(1))
        .map(|_| again())
        .collect::<Result<Vec<f64>>>()?;
    out.later_call = Stats::from_samples(&samples);
    drop(again);
    drop(cold);
    // A new device (as a new process would be) finds the kernel in the disk cache.
    let warm = open_with_cache(dev, dir)?;
    out.first_call_disk_cached_ms = Some(call(&warm)?.0);
    Ok(())
}
