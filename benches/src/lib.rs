//! Calico's benchmark suite: device-event timings of every op against the device's own copy
//! bandwidth, cuBLASLt and (merged from Python) torch, written as JSON, Markdown and SVG under
//! `reports/<device>/`.
//!
//! ```no_run
//! let dev = calico::Device::auto()?;
//! let report = calico_benches::run(&dev, &calico_benches::BenchOptions::default())?;
//! println!("{} memory-bound cases", report.memory.len());
//! # Ok::<(), calico::Error>(())
//! ```

pub mod accounting;
pub mod attention;
pub mod cases;
pub mod cublaslt;
pub mod dry_run;
pub mod gpu_bundle;
pub mod host_report;
pub mod peers;
pub mod plots;
pub mod progress;
pub mod report;
pub mod rng;
pub mod stats;
pub mod timing;

pub use cases::Profile;
pub use report::Report;

use calico::{Device, Error, Result, Vendor};
use progress::{Progress, Watchdog};
use report::{DeviceInfo, Status, Timed};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use timing::Pad;

/// What to run and where to write it.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchOptions {
    /// Reports go to `<out>/<device-slug>/`.
    pub out: PathBuf,
    pub profile: Profile,
    /// Only cases whose name contains this, or one of its comma-separated parts (the copy
    /// bandwidth always runs).
    pub only: Option<String>,
    /// JSON written by `benches/peers/peers.py`, merged as the "torch" column.
    pub peers: Option<PathBuf>,
    /// Write the report files (tests may turn this off).
    pub write: bool,
    /// Cases that would start after this much time are recorded as skipped.
    pub budget: Option<Duration>,
    /// End the process if no case finishes for this long (a hung kernel).
    pub watchdog: Option<Duration>,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            out: PathBuf::from("reports"),
            profile: Profile::Full,
            only: None,
            peers: None,
            write: true,
            budget: None,
            watchdog: None,
        }
    }
}

/// The command-line options shared by `calico-bench` and `calico bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Output directory; the report goes to <OUT>/<device-slug>/.
    #[arg(long, default_value = "reports")]
    pub out: PathBuf,
    /// Fewer shapes and runs.
    #[arg(long)]
    pub quick: bool,
    /// Only run cases whose name contains this substring, or one of its comma-separated parts
    /// (e.g. "rms_norm", "gemm llm", "gemv,odd").
    #[arg(long)]
    pub only: Option<String>,
    /// Merge torch figures from this JSON (written by benches/peers/peers.py).
    #[arg(long)]
    pub peers: Option<PathBuf>,
    /// Seconds after which remaining cases are skipped (recorded as such).
    #[arg(long, default_value_t = 330)]
    pub budget_s: u64,
    /// Exit (code 3) if no case finishes for this many seconds: a hung kernel.
    #[arg(long, default_value_t = 180)]
    pub stall_s: u64,
    /// No device: list the kernels every case (GEMM, row ops, attention, decode) would take on
    /// this compile target (e.g. gfx942) with, on AMD targets, their registers, LDS and
    /// occupancy (an error if any spills to scratch). Nothing is timed or written.
    #[arg(long, value_name = "TARGET")]
    pub dry_run: Option<String>,
}

impl BenchArgs {
    /// What both `calico bench` and `calico-bench` do with these arguments: with `--dry-run`,
    /// list the kernels each case would take on that target (no device, nothing written);
    /// otherwise run the suite on the device `Device::auto()` finds and write the report.
    pub fn execute(&self) -> Result<()> {
        match &self.dry_run {
            Some(target) => dry_run::run(target, self.quick),
            None => Device::auto().and_then(|dev| run(&dev, &self.options()).map(|_| ())),
        }
    }

    pub fn options(&self) -> BenchOptions {
        BenchOptions {
            out: self.out.clone(),
            profile: if self.quick {
                Profile::Quick
            } else {
                Profile::Full
            },
            only: self.only.clone().filter(|s| !s.is_empty()),
            peers: self.peers.clone(),
            write: true,
            budget: Some(Duration::from_secs(self.budget_s)),
            watchdog: Some(Duration::from_secs(self.stall_s.max(10))),
        }
    }
}

/// A folder name for a device: lower case, runs of other characters as one `-`; the CPU's
/// model is prefixed with `cpu-`.
pub fn device_slug(name: &str, vendor: Vendor) -> String {
    let mut slug = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            slug.push(c.to_ascii_lowercase());
        } else if !slug.is_empty() && !slug.ends_with('-') {
            slug.push('-');
        }
    }
    let slug = slug.trim_end_matches('-').to_string();
    let slug = if slug.is_empty() {
        "device".into()
    } else {
        slug
    };
    if vendor == Vendor::Cpu && !slug.starts_with("cpu") {
        format!("cpu-{slug}")
    } else {
        slug
    }
}

/// Dense bf16 peak for "% of peak", where known (docs/targets.md uses 989 for the H100 SXM).
pub fn peak_bf16_tflops(name: &str) -> Option<f64> {
    let n = name.to_ascii_uppercase();
    if n.contains("H100") && n.contains("PCIE") {
        Some(756.0)
    } else if n.contains("H100") && n.contains("NVL") {
        Some(835.0)
    } else if n.contains("H100") || n.contains("H200") || n.contains("GH200") {
        Some(989.0)
    } else {
        None
    }
}

fn device_info(dev: &Device) -> DeviceInfo {
    let a = dev.arch();
    DeviceInfo {
        name: dev.name().to_string(),
        slug: device_slug(dev.name(), a.vendor),
        backend: dev.kind().to_string(),
        target: a.target.clone(),
        lanes: a.lanes,
        compute_units: a.compute_units,
        shared_mem_per_block: a.shared_mem_per_block,
        l2_bytes: a.l2_bytes,
        peak_bf16_tflops: peak_bf16_tflops(dev.name()),
    }
}

/// A rate with a few significant digits.
pub fn rate(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

fn describe(t: &Timed, rate: Option<String>) -> String {
    match (t.status, &t.stats) {
        (Status::Ok, Some(s)) => format!(
            "{:>9.4} ms (min {:.4}, p90 {:.4}, {} runs){}",
            s.median_ms,
            s.min_ms,
            s.p90_ms,
            s.runs,
            rate.map_or_else(String::new, |r| format!("  {r}"))
        ),
        (Status::NotAvailable, _) => format!(
            "not available: {}",
            t.message
                .as_deref()
                .unwrap_or("")
                .lines()
                .next()
                .unwrap_or("")
        ),
        _ => format!(
            "FAILED: {}",
            t.message
                .as_deref()
                .unwrap_or("")
                .lines()
                .next()
                .unwrap_or("")
        ),
    }
}

/// The progress line of a host-loop case.
fn host_line(case: &host_report::HostCase) -> String {
    let value = match (case.calico_us, &case.message) {
        (Some(us), _) => format!("{us:.2} us"),
        (None, Some(m)) => format!("not measured ({m})"),
        (None, None) => "not measured".into(),
    };
    format!("{:<34} {value}", case.name)
}

/// An argument the run cannot start with, as an error the binaries print.
fn invalid_argument(message: String) -> Error {
    Error::Io(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        message,
    ))
}

/// Runs the suite on `dev` and writes the report (unless `opts.write` is off). Per-case errors
/// are recorded in the report, never returned; only writing the files can fail.
pub fn run(dev: &Device, opts: &BenchOptions) -> Result<Report> {
    let started = Instant::now();
    // Read the peers first: a wrong path or a broken file must not cost a whole run.
    let peers_file = match &opts.peers {
        Some(path) => Some((path, peers::read_file(path).map_err(invalid_argument)?)),
        None => None,
    };
    let gpu = dev.as_gpu().is_some();
    let profile = opts.profile;
    let plan = cases::plan(gpu, profile);
    let wanted = |name: &str| {
        opts.only
            .as_deref()
            .is_none_or(|o| o.split(',').any(|part| name.contains(part)))
    };
    let mem_specs: Vec<_> = cases::memory_specs(gpu, profile)
        .into_iter()
        .filter(|s| wanted(&s.name()))
        .collect();
    let gemm_specs: Vec<_> = cases::gemm_specs(gpu, profile)
        .into_iter()
        .filter(|s| wanted(&s.name()))
        .collect();
    let decode_specs: Vec<_> = cases::decode::decode_specs(gpu, profile)
        .into_iter()
        .filter(|s| wanted(&s.name()))
        .collect();
    let attn_specs: Vec<_> = attention::specs(gpu, profile)
        .into_iter()
        .filter(|s| wanted(&s.name()))
        .collect();
    let latency_name = "latency rms_norm";
    let run_latency = wanted(latency_name);
    let over_budget = || opts.budget.is_some_and(|b| started.elapsed() > b);
    let skipped = || {
        Timed::not_available(format!(
            "skipped: the run's time budget of {} s was spent",
            opts.budget.map_or(0, |b| b.as_secs())
        ))
    };
    let out_dir = opts.out.join(device_slug(dev.name(), dev.arch().vendor));
    // The files as they stand after each case, so a run cut short still leaves its results.
    let save_partial = |report: &Report| {
        if opts.write {
            let mut r = report.clone();
            r.derive();
            r.notes.push("partial: the run had not finished".into());
            let _ = std::fs::create_dir_all(&out_dir);
            if let Ok(json) = serde_json::to_string_pretty(&r) {
                let _ = std::fs::write(out_dir.join("report.json"), json);
            }
            let _ = std::fs::write(out_dir.join("report.md"), r.markdown());
        }
    };

    let mut report = Report {
        calico_version: env!("CARGO_PKG_VERSION").to_string(),
        created_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        profile: profile.name().to_string(),
        only: opts.only.clone(),
        device: device_info(dev),
        copy: None,
        memory: Vec::new(),
        gemm: Vec::new(),
        decode: Vec::new(),
        attention: Vec::new(),
        latency: None,
        host: Vec::new(),
        peers: None,
        targets: Vec::new(),
        notes: Vec::new(),
    };
    let host_cases = cases::host_loop::loop_specs(profile == Profile::Tiny)
        .iter()
        .filter(|s| wanted(&s.name()))
        .count()
        + usize::from(wanted("graph replay decode step"));
    let selected = usize::from(run_latency)
        + host_cases
        + mem_specs.len()
        + gemm_specs.len()
        + decode_specs.len()
        + attn_specs.len();
    if let (0, Some(only)) = (selected, &opts.only) {
        // A typo must not replace a report with an empty one.
        let examples: Vec<String> = [
            cases::memory_specs(gpu, profile).first().map(|s| s.name()),
            cases::gemm_specs(gpu, profile).first().map(|s| s.name()),
            Some(latency_name.to_string()),
        ]
        .into_iter()
        .flatten()
        .collect();
        return Err(Error::unsupported(format!(
            "--only `{only}` selects none of the {} profile's cases on {} (names such as `{}`); \
             nothing was run or written",
            profile.name(),
            dev.name(),
            examples.join("`, `")
        )));
    }
    println!(
        "calico-bench: {} ({}, {}), profile {}, {} memory-bound and {} GEMM cases",
        report.device.name,
        report.device.backend,
        report.device.target,
        profile.name(),
        mem_specs.len(),
        gemm_specs.len()
    );
    let progress = Progress::new(1 + selected);
    let watchdog = opts.watchdog.map(Watchdog::start);
    let tick = || {
        if let Some(w) = &watchdog {
            w.tick();
        }
    };
    let mut rng = rng::XorShift::new(0x00ca_11c0);

    progress.start("copy bandwidth");
    let copy_bytes = cases::copy_buffer_bytes(gpu, profile);
    let copy = cases::copy::measure(dev, &plan, copy_bytes, &mut rng);
    let copy_gbps = copy
        .timed
        .median_ms()
        .map(|ms| accounting::gbps(copy.bytes_moved, ms));
    progress.done(format!(
        "{:<34} {}",
        format!("copy {} MiB", copy_bytes >> 20),
        describe(&copy.timed, copy_gbps.map(|g| format!("{} GB/s", rate(g))))
    ));
    report.copy = Some(copy);
    tick();

    if run_latency {
        progress.start(latency_name);
        let shape = if profile == Profile::Tiny {
            [64, 256]
        } else {
            [1024, 4096]
        };
        let calls = if profile == Profile::Full { 50 } else { 10 };
        let l = cases::latency::measure(dev, &shape, calls, &mut rng);
        progress.done(format!(
            "{:<34} first call {} ms, later calls {} ms (median){}",
            latency_name,
            l.first_call_ms.map_or("-".into(), |v| format!("{v:.1}")),
            l.later_call
                .as_ref()
                .map_or("-".into(), |s| format!("{:.4}", s.median_ms)),
            l.message
                .as_ref()
                .map_or_else(String::new, |m| format!(" ({m})"))
        ));
        report.latency = Some(l);
        tick();
        save_partial(&report);
    }

    let tiny = profile == Profile::Tiny;
    for spec in cases::host_loop::loop_specs(tiny)
        .into_iter()
        .filter(|s| wanted(&s.name()))
    {
        progress.start(&spec.name());
        let calls = if tiny { 20 } else { 1000 };
        let case = cases::host_loop::run_loop(dev, &spec, calls, &mut rng);
        progress.done(host_line(&case));
        report.host.push(case);
        tick();
    }
    if wanted("graph replay decode step") {
        progress.start("graph replay decode step");
        let steps = if tiny { 5 } else { 200 };
        for case in cases::host_loop::run_graph(dev, steps, tiny, &mut rng) {
            progress.done(host_line(&case));
            report.host.push(case);
        }
        tick();
        save_partial(&report);
    }

    // The pad hides the host's launch cost on GPUs (see `timing::Pad`).
    let pad = if gpu && profile != Profile::Tiny {
        match Pad::new(dev, Pad::GPU_BYTES) {
            Ok(p) => Some(p),
            Err(e) => {
                report.notes.push(format!(
                    "no launch-hiding pad copy (allocation failed: {e})"
                ));
                None
            }
        }
    } else {
        None
    };

    for spec in &mem_specs {
        progress.start(&spec.name());
        let skip = over_budget();
        let mut case = cases::memory::run_case(dev, spec, &plan, pad.as_ref(), &mut rng, skip);
        if skip {
            case.calico = skipped();
        }
        let rate_text = case.calico.median_ms().map(|ms| {
            let g = accounting::gbps(case.bytes, ms);
            match copy_gbps {
                Some(c) if c > 0.0 => {
                    format!("{} GB/s, {:.1}% of copy", rate(g), 100.0 * g / c)
                }
                _ => format!("{} GB/s", rate(g)),
            }
        });
        progress.done(format!(
            "{:<34} {}",
            case.name,
            describe(&case.calico, rate_text)
        ));
        report.memory.push(case);
        tick();
        save_partial(&report);
    }

    if !gemm_specs.is_empty() {
        let baseline = cases::gemm::Baseline::new(dev);
        match &baseline {
            cases::gemm::Baseline::Ready(lt) => {
                if let Some(p) = &lt.source {
                    report
                        .notes
                        .push(format!("cuBLASLt preloaded from {}", p.display()));
                }
            }
            cases::gemm::Baseline::Unavailable(why) => {
                report.notes.push(format!("cuBLASLt unavailable: {why}"));
            }
            cases::gemm::Baseline::Absent => {}
        }
        for spec in &gemm_specs {
            progress.start(&spec.name());
            let case = if over_budget() {
                cases::gemm::skipped_case(spec, skipped())
            } else {
                cases::gemm::run_case(dev, spec, &plan, pad.as_ref(), &mut rng, &baseline)
            };
            let tf = |t: &Timed| {
                t.median_ms()
                    .map(|ms| format!("{} TFLOP/s", rate(accounting::tflops(case.flops, ms))))
            };
            let mut line = format!(
                "{:<34} calico   {}",
                case.name,
                describe(&case.calico, tf(&case.calico))
            );
            if let Some(lt) = &case.cublaslt {
                line.push_str(&format!("\n{:<34} cuBLASLt {}", "", describe(lt, tf(lt))));
            }
            progress.done(line);
            report.gemm.push(case);
            tick();
            save_partial(&report);
        }
    }
    for spec in &decode_specs {
        progress.start(&spec.name());
        let case = if over_budget() {
            cases::decode::skipped_case(spec, skipped())
        } else {
            cases::decode::run_case(dev, spec, &plan, pad.as_ref(), &mut rng)
        };
        let rate_text = case.calico.median_ms().map(|ms| {
            let g = accounting::gbps(case.kv_bytes, ms);
            match copy_gbps {
                Some(c) if c > 0.0 => format!("{} GB/s, {:.1}% of copy", rate(g), 100.0 * g / c),
                _ => format!("{} GB/s", rate(g)),
            }
        });
        progress.done(format!(
            "{:<34} {}",
            case.name,
            describe(&case.calico, rate_text)
        ));
        report.decode.push(case);
        tick();
        save_partial(&report);
    }
    for spec in &attn_specs {
        progress.start(&spec.name());
        let case = if over_budget() {
            attention::skipped_case(spec, skipped())
        } else {
            attention::run_case(dev, spec, &plan, pad.as_ref(), &mut rng)
        };
        let tf = case
            .calico
            .median_ms()
            .map(|ms| format!("{} TFLOP/s", rate(accounting::tflops(case.flops, ms))));
        progress.done(format!(
            "{:<34} calico   {}",
            case.name,
            describe(&case.calico, tf)
        ));
        report.attention.push(case);
        tick();
        save_partial(&report);
    }
    progress.finish();
    drop(pad);
    drop(watchdog);

    if !gpu {
        report.notes.push("CPU: small shapes and few runs; times are the host wall clock; the bf16 peak and cuBLASLt do not apply.".into());
    }
    report.notes.push(format!(
        "the suite took {:.0} s",
        started.elapsed().as_secs_f64()
    ));
    report.derive();
    if let Some((path, file)) = &peers_file {
        peers::merge(&mut report, file, &path.display().to_string());
    }
    if opts.write {
        let written = report.write(&out_dir)?;
        for p in written {
            println!("wrote {}", p.display());
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs() {
        assert_eq!(
            device_slug("NVIDIA H100 80GB HBM3", Vendor::Nvidia),
            "nvidia-h100-80gb-hbm3"
        );
        assert_eq!(
            device_slug("Intel(R) Xeon(R) Platinum 8480+", Vendor::Cpu),
            "cpu-intel-r-xeon-r-platinum-8480"
        );
        assert_eq!(device_slug("", Vendor::Cpu), "cpu-device");
        assert_eq!(device_slug("CPU", Vendor::Cpu), "cpu");
    }

    #[test]
    fn peaks() {
        assert_eq!(peak_bf16_tflops("NVIDIA H100 80GB HBM3"), Some(989.0));
        assert_eq!(peak_bf16_tflops("NVIDIA H100 PCIe"), Some(756.0));
        assert_eq!(peak_bf16_tflops("AMD Instinct MI300X"), None);
    }

    /// The whole pipeline on the CPU, restricted to one tiny case.
    #[test]
    fn cpu_smoke_one_tiny_case() {
        let dir = std::env::temp_dir().join(format!("calico-bench-smoke-{}", std::process::id()));
        let opts = BenchOptions {
            out: dir.clone(),
            profile: Profile::Tiny,
            only: Some("softmax bf16 64x256".into()),
            peers: None,
            write: true,
            budget: None,
            watchdog: None,
        };
        let report = run(&Device::cpu(), &opts).expect("suite runs");
        assert_eq!(report.memory.len(), 1, "{:?}", report.memory);
        assert!(report.gemm.is_empty());
        assert!(report.latency.is_none());
        let m = &report.memory[0];
        assert_eq!(m.calico.status, Status::Ok, "{:?}", m.calico);
        assert!(m.gbps.is_some_and(|g| g > 0.0));
        assert!(report.copy.as_ref().and_then(|c| c.gbps).is_some());
        let out = dir.join(&report.device.slug);
        for f in ["report.json", "report.md", "memory.svg", "gemm.svg"] {
            assert!(out.join(f).exists(), "{f}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Runs `opts` on the CPU (tiny profile, writing into a fresh directory named after
    /// `tag`), expects it to be refused before anything is written, and returns the error.
    fn refused(tag: &str, opts: BenchOptions) -> String {
        let dir = std::env::temp_dir().join(format!("calico-bench-{tag}-{}", std::process::id()));
        let opts = BenchOptions {
            out: dir.clone(),
            profile: Profile::Tiny,
            write: true,
            ..opts
        };
        let msg = run(&Device::cpu(), &opts)
            .expect_err("the run is refused")
            .to_string();
        assert!(!dir.exists(), "{} was written", dir.display());
        msg
    }

    /// A typo in --only is an error before anything runs, not an empty report written over
    /// the last one.
    #[test]
    fn an_only_that_selects_nothing_is_an_error_and_writes_nothing() {
        let only = Some("sofmtax,gem square".into());
        let msg = refused(
            "typo",
            BenchOptions {
                only,
                ..BenchOptions::default()
            },
        );
        assert!(msg.contains("`sofmtax,gem square` selects none"), "{msg}");
        assert!(msg.contains("nothing was run or written"), "{msg}");
    }

    /// A peers file that cannot be read stops the run before any case, not after all of them.
    #[test]
    fn an_unreadable_peers_file_is_an_error_before_anything_runs() {
        let peers = Some("/nonexistent/peers.json".into());
        let msg = refused(
            "peers",
            BenchOptions {
                peers,
                ..BenchOptions::default()
            },
        );
        assert!(
            msg.contains("cannot read peers file /nonexistent/peers.json"),
            "{msg}"
        );
    }

    #[test]
    fn spent_budget_skips_cases() {
        let opts = BenchOptions {
            profile: Profile::Tiny,
            only: Some("softmax".into()),
            write: false,
            budget: Some(Duration::ZERO),
            ..BenchOptions::default()
        };
        let report = run(&Device::cpu(), &opts).expect("suite runs");
        assert_eq!(report.memory.len(), 1);
        let t = &report.memory[0].calico;
        assert_eq!(t.status, Status::NotAvailable);
        assert!(t.message.as_deref().is_some_and(|m| m.contains("budget")));
    }

    #[test]
    fn cpu_tiny_gemm_and_latency() {
        let opts = BenchOptions {
            profile: Profile::Tiny,
            only: Some("gemm".into()),
            write: false,
            ..BenchOptions::default()
        };
        let report = run(&Device::cpu(), &opts).expect("suite runs");
        assert_eq!(report.gemm.len(), 1);
        assert_eq!(
            report.gemm[0].calico.status,
            Status::Ok,
            "{:?}",
            report.gemm[0].calico
        );
        assert!(report.gemm[0].cublaslt.is_none());
        let opts = BenchOptions {
            only: Some("latency".into()),
            ..opts
        };
        let report = run(&Device::cpu(), &opts).expect("suite runs");
        let l = report.latency.expect("latency measured");
        assert!(l.first_call_ms.is_some(), "{:?}", l.message);
        assert!(l.later_call.is_some());
    }

    #[test]
    fn cpu_tiny_host_loops() {
        let opts = BenchOptions {
            profile: Profile::Tiny,
            write: false,
            ..BenchOptions::default()
        };
        for only in ["launch overhead", "graph replay"] {
            let opts = BenchOptions {
                only: Some(only.into()),
                ..opts.clone()
            };
            let report = run(&Device::cpu(), &opts).expect("suite runs");
            assert!(!report.host.is_empty());
            let eager = &report.host[0];
            assert!(eager.calico_us.is_some_and(|us| us > 0.0), "{eager:?}");
            // No target on the CPU: host time there is compute time.
            assert!(report.host.iter().all(|h| h.target_us.is_none()));
        }
    }
}
