//! The report: what was measured, the derived rates and targets, and the JSON/Markdown writer.

use crate::accounting::{gbps, tflops, MemOp};
use crate::stats::Stats;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The device the report was measured on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub name: String,
    /// Folder name under the output directory, e.g. `nvidia-h100-80gb-hbm3`.
    pub slug: String,
    pub backend: String,
    pub target: String,
    pub lanes: u32,
    pub compute_units: u32,
    pub shared_mem_per_block: usize,
    pub l2_bytes: usize,
    /// Dense bf16 peak used for "% of peak" (H100 SXM: 989), if known for this device.
    pub peak_bf16_tflops: Option<f64>,
}

/// Outcome of one measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    /// The op returned `Error::Unsupported` on this device (or the baseline is missing).
    NotAvailable,
    /// Any other error.
    Failed,
}

/// One timed implementation of one case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timed {
    pub status: Status,
    pub message: Option<String>,
    pub stats: Option<Stats>,
}

impl Timed {
    pub fn ok(stats: Stats) -> Timed {
        Timed {
            status: Status::Ok,
            message: None,
            stats: Some(stats),
        }
    }

    pub fn from_error(e: &calico::Error) -> Timed {
        let status = match e {
            calico::Error::Unsupported(_) => Status::NotAvailable,
            _ => Status::Failed,
        };
        Timed {
            status,
            message: Some(e.to_string()),
            stats: None,
        }
    }

    pub fn not_available(message: impl Into<String>) -> Timed {
        Timed {
            status: Status::NotAvailable,
            message: Some(message.into()),
            stats: None,
        }
    }

    pub fn median_ms(&self) -> Option<f64> {
        self.stats.as_ref().map(|s| s.median_ms)
    }
}

/// Device copy bandwidth, the yardstick of the memory-bound ops.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CopyResult {
    pub buffer_bytes: u64,
    /// Bytes read plus bytes written per copy.
    pub bytes_moved: u64,
    pub timed: Timed,
    pub gbps: Option<f64>,
}

/// One memory-bound case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemCase {
    pub name: String,
    pub op: MemOp,
    pub dtype: String,
    pub shape: Vec<usize>,
    /// Each input read once plus each output written once.
    pub bytes: u64,
    pub rotation_copies: usize,
    pub calico: Timed,
    pub gbps: Option<f64>,
    pub pct_of_copy: Option<f64>,
    /// Target share of the copy bandwidth, in percent.
    pub target_pct: f64,
    /// Target speed-up over torch instead of the copy share (odd row lengths).
    #[serde(default)]
    pub target_vs_torch: Option<f64>,
    pub torch_ms: Option<f64>,
    /// torch's time with the same byte count.
    pub torch_gbps: Option<f64>,
    /// Calico time / torch time inverted: > 1 means Calico is faster.
    pub speedup_vs_torch: Option<f64>,
}

/// One GEMM case: D[M,N] = A[M,K] · W[N,K]^T, bf16 in and out, f32 accumulation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GemmCase {
    pub name: String,
    /// `square`, `llm` or `skinny`.
    pub group: String,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub flops: f64,
    pub rotation_copies: usize,
    pub calico: Timed,
    pub calico_tflops: Option<f64>,
    pub pct_of_peak: Option<f64>,
    pub cublaslt: Option<Timed>,
    pub cublaslt_tflops: Option<f64>,
    /// Calico TFLOP/s over cuBLASLt TFLOP/s.
    pub ratio_cublaslt: Option<f64>,
    /// The ratio to cuBLASLt docs/targets.md asks for.
    pub target_ratio: f64,
    pub torch_ms: Option<f64>,
    pub torch_tflops: Option<f64>,
    pub ratio_torch: Option<f64>,
    /// GEMV: weight bytes (N x K x 2) per second, Calico / cuBLASLt / torch, in GB/s.
    #[serde(default)]
    pub weight_gbps: Option<f64>,
    #[serde(default)]
    pub cublaslt_weight_gbps: Option<f64>,
    #[serde(default)]
    pub torch_weight_gbps: Option<f64>,
    /// GEMV: Calico's weight GB/s as a share of the copy bandwidth, and the target, in percent.
    #[serde(default)]
    pub pct_of_copy: Option<f64>,
    #[serde(default)]
    pub target_pct_of_copy: Option<f64>,
    /// Odd shapes: Calico at the nearest aligned shape (M, N, K rounded to multiples of 8).
    #[serde(default)]
    pub aligned_shape: Option<(usize, usize, usize)>,
    #[serde(default)]
    pub aligned: Option<Timed>,
    #[serde(default)]
    pub aligned_tflops: Option<f64>,
    /// Odd-shape TFLOP/s over the aligned shape's.
    #[serde(default)]
    pub ratio_aligned: Option<f64>,
    #[serde(default)]
    pub target_vs_aligned: Option<f64>,
    /// Odd shapes: the speed-up over torch asked for.
    #[serde(default)]
    pub target_vs_torch: Option<f64>,
}

impl GemmCase {
    /// The GEMV and odd-shape fields, all unset (a plain GEMM case).
    pub fn extras_none() -> GemmCase {
        GemmCase {
            name: String::new(),
            group: String::new(),
            m: 0,
            n: 0,
            k: 0,
            flops: 0.0,
            rotation_copies: 0,
            calico: Timed::not_available("not run"),
            calico_tflops: None,
            pct_of_peak: None,
            cublaslt: None,
            cublaslt_tflops: None,
            ratio_cublaslt: None,
            target_ratio: 0.0,
            torch_ms: None,
            torch_tflops: None,
            ratio_torch: None,
            weight_gbps: None,
            cublaslt_weight_gbps: None,
            torch_weight_gbps: None,
            pct_of_copy: None,
            target_pct_of_copy: None,
            aligned_shape: None,
            aligned: None,
            aligned_tflops: None,
            ratio_aligned: None,
            target_vs_aligned: None,
            target_vs_torch: None,
        }
    }
}

/// One decode-attention case: K + V bytes per second against the copy bandwidth, beside torch
/// SDPA's cuDNN and flash backends on the same shape (contiguous caches only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecodeCase {
    pub name: String,
    pub spec: crate::cases::decode::DecodeSpec,
    pub kv_bytes: u64,
    pub rotation_copies: usize,
    pub calico: Timed,
    pub gbps: Option<f64>,
    pub pct_of_copy: Option<f64>,
    /// Target share of the copy bandwidth in percent (contexts of 8k and more).
    pub target_pct: Option<f64>,
    pub cudnn_ms: Option<f64>,
    pub flash_ms: Option<f64>,
    pub cudnn_pct_of_copy: Option<f64>,
    pub flash_pct_of_copy: Option<f64>,
}

/// Host time of the first call (compile) and of later calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub op: String,
    pub shape: Vec<usize>,
    /// How the first call was made cold (a fresh device with an empty `CALICO_CACHE_DIR`).
    pub method: String,
    /// First call with an empty disk cache: compile, load and launch.
    pub first_call_ms: Option<f64>,
    /// First call of a fresh device whose disk cache already holds the kernel.
    pub first_call_disk_cached_ms: Option<f64>,
    /// Later calls until the launch returns (host time, in-memory cache).
    pub later_call: Option<Stats>,
    pub message: Option<String>,
    pub target_first_ms: f64,
    pub target_later_ms: f64,
}

/// Where merged peer figures came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeersInfo {
    pub file: String,
    pub torch_version: Option<String>,
    pub device: Option<String>,
    pub matched: usize,
}

/// One line of the targets table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetCheck {
    pub what: String,
    pub target: String,
    pub measured: String,
    /// `None` when it could not be measured in this run.
    pub met: Option<bool>,
}

/// Everything one run measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub calico_version: String,
    pub created_unix_s: u64,
    /// `full`, `quick` or `tiny`.
    pub profile: String,
    pub only: Option<String>,
    pub device: DeviceInfo,
    pub copy: Option<CopyResult>,
    pub memory: Vec<MemCase>,
    pub gemm: Vec<GemmCase>,
    #[serde(default)]
    pub decode: Vec<DecodeCase>,
    #[serde(default)]
    pub attention: Vec<crate::attention::AttnCase>,
    pub latency: Option<Latency>,
    /// Host-loop cases: launch overhead and graph replay.
    #[serde(default)]
    pub host: Vec<crate::host_report::HostCase>,
    pub peers: Option<PeersInfo>,
    pub targets: Vec<TargetCheck>,
    pub notes: Vec<String>,
}

/// Target ratio to cuBLASLt for a GEMM shape (docs/targets.md).
pub fn gemm_target_ratio(group: &str, m: usize, n: usize, k: usize) -> f64 {
    if (m, n, k) == (4096, 4096, 4096) {
        1.05
    } else if (m, n, k) == (8192, 8192, 8192) || group == "llm" {
        1.0
    } else {
        0.9
    }
}

impl Report {
    /// Fills every derived figure (rates, percentages, ratios, targets) from the timings.
    pub fn derive(&mut self) {
        if let Some(c) = &mut self.copy {
            c.gbps = c.timed.median_ms().map(|ms| gbps(c.bytes_moved, ms));
        }
        let copy_gbps = self.copy.as_ref().and_then(|c| c.gbps);
        for m in &mut self.memory {
            m.gbps = m.calico.median_ms().map(|ms| gbps(m.bytes, ms));
            m.pct_of_copy = match (m.gbps, copy_gbps) {
                (Some(g), Some(c)) if c > 0.0 => Some(100.0 * g / c),
                _ => None,
            };
            m.torch_gbps = m.torch_ms.map(|ms| gbps(m.bytes, ms));
            m.speedup_vs_torch = match (m.calico.median_ms(), m.torch_ms) {
                (Some(c), Some(t)) if c > 0.0 => Some(t / c),
                _ => None,
            };
        }
        let peak = self.device.peak_bf16_tflops;
        for g in &mut self.gemm {
            g.calico_tflops = g.calico.median_ms().map(|ms| tflops(g.flops, ms));
            g.pct_of_peak = match (g.calico_tflops, peak) {
                (Some(t), Some(p)) => Some(100.0 * t / p),
                _ => None,
            };
            g.cublaslt_tflops = g
                .cublaslt
                .as_ref()
                .and_then(Timed::median_ms)
                .map(|ms| tflops(g.flops, ms));
            g.ratio_cublaslt = ratio(g.calico_tflops, g.cublaslt_tflops);
            g.torch_tflops = g.torch_ms.map(|ms| tflops(g.flops, ms));
            g.ratio_torch = ratio(g.calico_tflops, g.torch_tflops);
            if g.group == "gemv" {
                let weight = 2 * (g.n as u64) * (g.k as u64);
                g.weight_gbps = g.calico.median_ms().map(|ms| gbps(weight, ms));
                g.cublaslt_weight_gbps = g
                    .cublaslt
                    .as_ref()
                    .and_then(Timed::median_ms)
                    .map(|ms| gbps(weight, ms));
                g.torch_weight_gbps = g.torch_ms.map(|ms| gbps(weight, ms));
                g.pct_of_copy = match (g.weight_gbps, copy_gbps) {
                    (Some(w), Some(c)) if c > 0.0 => Some(100.0 * w / c),
                    _ => None,
                };
            }
            if let Some((m, n, k)) = g.aligned_shape {
                let flops = crate::accounting::gemm_flops(m, n, k);
                g.aligned_tflops = g
                    .aligned
                    .as_ref()
                    .and_then(Timed::median_ms)
                    .map(|ms| tflops(flops, ms));
                g.ratio_aligned = ratio(g.calico_tflops, g.aligned_tflops);
            }
        }
        for h in &mut self.host {
            h.derive();
        }
        let pct = |ms: Option<f64>, bytes: u64| match (ms, copy_gbps) {
            (Some(ms), Some(c)) if c > 0.0 => Some(100.0 * gbps(bytes, ms) / c),
            _ => None,
        };
        for d in &mut self.decode {
            d.gbps = d.calico.median_ms().map(|ms| gbps(d.kv_bytes, ms));
            d.pct_of_copy = pct(d.calico.median_ms(), d.kv_bytes);
            d.cudnn_pct_of_copy = pct(d.cudnn_ms, d.kv_bytes);
            d.flash_pct_of_copy = pct(d.flash_ms, d.kv_bytes);
        }
        crate::attention::derive(&mut self.attention, peak);
        self.targets = self.check_targets();
    }

    fn check_targets(&self) -> Vec<TargetCheck> {
        let mut out = Vec::new();
        for m in &self.memory {
            if let Some(want) = m.target_vs_torch {
                out.push(TargetCheck {
                    what: m.name.clone(),
                    target: format!(">= {want:.2}x torch"),
                    measured: m
                        .speedup_vs_torch
                        .map_or_else(|| "not measured".into(), |r| format!("{r:.2}x")),
                    met: m.speedup_vs_torch.map(|r| r >= want),
                });
                continue;
            }
            out.push(TargetCheck {
                what: m.name.clone(),
                target: format!(">= {:.0}% of copy BW", m.target_pct),
                measured: m
                    .pct_of_copy
                    .map_or_else(|| "not measured".into(), |p| format!("{p:.1}%")),
                met: m.pct_of_copy.map(|p| p >= m.target_pct),
            });
        }
        for g in &self.gemm {
            if let Some(want) = g.target_pct_of_copy {
                out.push(TargetCheck {
                    what: g.name.clone(),
                    target: format!(">= {want:.0}% of copy BW (weight bytes)"),
                    measured: g
                        .pct_of_copy
                        .map_or_else(|| "not measured".into(), |p| format!("{p:.1}%")),
                    met: g.pct_of_copy.map(|p| p >= want),
                });
            }
            if let Some(want) = g.target_vs_torch {
                out.push(TargetCheck {
                    what: format!("{} vs torch", g.name),
                    target: format!(">= {want:.2}x torch.matmul"),
                    measured: g
                        .ratio_torch
                        .map_or_else(|| "not measured".into(), |r| format!("{r:.2}x")),
                    met: g.ratio_torch.map(|r| r >= want),
                });
            }
            if let Some(want) = g.target_vs_aligned {
                let (m, n, k) = g.aligned_shape.unwrap_or_default();
                out.push(TargetCheck {
                    what: format!("{} vs Calico {m}x{n}x{k}", g.name),
                    target: format!(">= {want:.2}x the aligned shape"),
                    measured: g
                        .ratio_aligned
                        .map_or_else(|| "not measured".into(), |r| format!("{r:.2}x")),
                    met: g.ratio_aligned.map(|r| r >= want),
                });
            }
            if g.group == "gemv" || g.group == "odd" {
                continue;
            }
            out.push(TargetCheck {
                what: g.name.clone(),
                target: format!(">= {:.2}x cuBLASLt", g.target_ratio),
                measured: g
                    .ratio_cublaslt
                    .map_or_else(|| "not measured".into(), |r| format!("{r:.2}x")),
                met: g.ratio_cublaslt.map(|r| r >= g.target_ratio),
            });
        }
        out.extend(self.host.iter().filter_map(|h| h.target()));
        for d in &self.decode {
            if let Some(t) = d.target_pct {
                out.push(TargetCheck {
                    what: d.name.clone(),
                    target: format!(">= {t:.0}% of copy BW (K + V bytes)"),
                    measured: d
                        .pct_of_copy
                        .map_or_else(|| "not measured".into(), |p| format!("{p:.1}%")),
                    met: d.pct_of_copy.map(|p| p >= t),
                });
            }
        }
        out.extend(crate::attention::targets(&self.attention));
        if let Some(l) = &self.latency {
            out.push(TargetCheck {
                what: format!("first call of {} (compile)", l.op),
                target: format!("< {:.0} ms", l.target_first_ms),
                measured: fmt_opt(l.first_call_ms, 1, " ms"),
                met: l.first_call_ms.map(|v| v < l.target_first_ms),
            });
            let later = l.later_call.as_ref().map(|s| s.median_ms);
            out.push(TargetCheck {
                what: format!("later calls of {} (cache)", l.op),
                target: format!("< {:.0} ms", l.target_later_ms),
                measured: fmt_opt(later, 3, " ms"),
                met: later.map(|v| v < l.target_later_ms),
            });
        }
        out
    }

    /// Writes `report.json`, `report.md` and the SVG plots into `dir` (created if missing);
    /// returns the paths written.
    pub fn write(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
        std::fs::create_dir_all(dir)?;
        let json = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        let mut written = Vec::new();
        let mut put = |name: &str, text: &str| -> std::io::Result<()> {
            let p = dir.join(name);
            std::fs::write(&p, text)?;
            written.push(p);
            Ok(())
        };
        put("report.json", &json)?;
        put("report.md", &self.markdown())?;
        for (name, svg) in crate::plots::render(self) {
            put(&name, &svg)?;
        }
        Ok(written)
    }

    /// The Markdown report.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let d = &self.device;
        let _ = writeln!(s, "# Calico benchmarks: {}\n", d.name);
        let _ = writeln!(s, "| device | {} |\n| --- | --- |", d.name);
        let _ = writeln!(s, "| backend | {} |", d.backend);
        let _ = writeln!(s, "| target | {} |", d.target);
        let _ = writeln!(s, "| compute units | {} |", d.compute_units);
        let _ = writeln!(s, "| lanes | {} |", d.lanes);
        let _ = writeln!(
            s,
            "| shared memory per block | {} KiB |",
            d.shared_mem_per_block / 1024
        );
        let _ = writeln!(s, "| L2 | {} MiB |", d.l2_bytes >> 20);
        let _ = writeln!(
            s,
            "| bf16 dense peak | {} |",
            fmt_opt(d.peak_bf16_tflops, 0, " TFLOP/s")
        );
        let _ = writeln!(s, "| calico | {} |", self.calico_version);
        let _ = writeln!(s, "| profile | {} |", self.profile);
        if let Some(only) = &self.only {
            let _ = writeln!(s, "| only | `{only}` |");
        }
        let _ = writeln!(s, "| created | {} (unix s) |", self.created_unix_s);
        if let Some(p) = &self.peers {
            let _ = writeln!(
                s,
                "| peers | {} (torch {}, {}; {} cases matched) |",
                p.file,
                p.torch_version.as_deref().unwrap_or("?"),
                p.device.as_deref().unwrap_or("?"),
                p.matched
            );
        }

        let _ = writeln!(s, "\n## Copy bandwidth\n");
        match &self.copy {
            Some(c) => {
                let _ = writeln!(
                    s,
                    "Device-to-device copy of {} MiB, counting bytes read + written: **{}** (median of {} runs; {}).",
                    c.buffer_bytes >> 20,
                    c.gbps.map_or_else(|| "-".into(), |g| format!("{} GB/s", crate::rate(g))),
                    c.timed.stats.as_ref().map_or(0, |t| t.runs),
                    timing_summary(&c.timed)
                );
            }
            None => {
                let _ = writeln!(s, "Not measured.");
            }
        }

        if !self.memory.is_empty() {
            let _ = writeln!(s, "\n## Memory-bound ops\n");
            let _ = writeln!(s, "Bytes = each input read once + each output written once. % is of the copy bandwidth above.\n");
            let _ = writeln!(s, "| case | MB | median ms | min ms | p90 ms | runs | GB/s | % copy | torch GB/s | speedup vs torch | target | met |");
            let _ = writeln!(s, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: |");
            for m in &self.memory {
                let st = m.calico.stats.as_ref();
                let _ = writeln!(
                    s,
                    "| {} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    m.name,
                    m.bytes as f64 / 1e6,
                    or_status(&m.calico, st.map(|t| format!("{:.4}", t.median_ms))),
                    fmt_opt(st.map(|t| t.min_ms), 4, ""),
                    fmt_opt(st.map(|t| t.p90_ms), 4, ""),
                    st.map_or("-".into(), |t| t.runs.to_string()),
                    fmt_rate(m.gbps),
                    fmt_opt(m.pct_of_copy, 1, "%"),
                    fmt_rate(m.torch_gbps),
                    fmt_opt(m.speedup_vs_torch, 2, "x"),
                    match m.target_vs_torch {
                        Some(r) => format!("{r:.2}x torch"),
                        None => format!("{:.0}%", m.target_pct),
                    },
                    met(match m.target_vs_torch {
                        Some(r) => m.speedup_vs_torch.map(|v| v >= r),
                        None => m.pct_of_copy.map(|p| p >= m.target_pct),
                    }),
                );
            }
        }

        if !self.gemm.is_empty() {
            let _ = writeln!(s, "\n## GEMM\n");
            let _ = writeln!(s, "bf16 in, bf16 out, f32 accumulation; D[M,N] = A[M,K] · W[N,K]^T (B is the transposed view of a row-major weight, as in torch Linear). TFLOP/s = 2·M·N·K / median time.\n");
            let _ = writeln!(s, "| case | median ms | runs | TFLOP/s | % peak | cuBLASLt TFLOP/s | vs cuBLASLt | torch TFLOP/s | vs torch | target | met |");
            let _ = writeln!(
                s,
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: |"
            );
            for g in &self.gemm {
                let st = g.calico.stats.as_ref();
                let lt = match &g.cublaslt {
                    None => "-".to_string(),
                    Some(t) => or_status(t, g.cublaslt_tflops.map(crate::rate)),
                };
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2}x | {} |",
                    g.name,
                    or_status(&g.calico, st.map(|t| format!("{:.4}", t.median_ms))),
                    st.map_or("-".into(), |t| t.runs.to_string()),
                    fmt_rate(g.calico_tflops),
                    fmt_opt(g.pct_of_peak, 1, "%"),
                    lt,
                    fmt_opt(g.ratio_cublaslt, 2, "x"),
                    fmt_rate(g.torch_tflops),
                    fmt_opt(g.ratio_torch, 2, "x"),
                    g.target_ratio,
                    met(g.ratio_cublaslt.map(|r| r >= g.target_ratio)),
                );
            }
        }

        crate::host_report::markdown(&mut s, &self.host);
        self.gemv_markdown(&mut s);
        self.odd_markdown(&mut s);
        if !self.decode.is_empty() {
            let _ = writeln!(s, "\n## Attention decode\n");
            let _ = writeln!(s, "One query token per sequence, GQA 32:8, head_dim 128 (96 where the name says d96), bf16; bandwidth = K + V bytes / median time; % is of the copy bandwidth. torch SDPA (cuDNN, flash) runs on contiguous caches of the same size.\n");
            let _ = writeln!(s, "| case | MB | median ms | runs | GB/s | % copy | cuDNN % copy | flash % copy | target | met |");
            let _ = writeln!(
                s,
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: |"
            );
            for d in &self.decode {
                let st = d.calico.stats.as_ref();
                let _ = writeln!(
                    s,
                    "| {} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    d.name,
                    d.kv_bytes as f64 / 1e6,
                    or_status(&d.calico, st.map(|t| format!("{:.4}", t.median_ms))),
                    st.map_or("-".into(), |t| t.runs.to_string()),
                    fmt_rate(d.gbps),
                    fmt_opt(d.pct_of_copy, 1, "%"),
                    fmt_opt(d.cudnn_pct_of_copy, 1, "%"),
                    fmt_opt(d.flash_pct_of_copy, 1, "%"),
                    fmt_opt(d.target_pct, 0, "%"),
                    met(d.target_pct.and_then(|t| d.pct_of_copy.map(|p| p >= t))),
                );
            }
        }

        if let Some(l) = &self.latency {
            let _ = writeln!(s, "\n## First-call and later-call latency\n");
            let _ = writeln!(s, "`{}` on {:?}; {}.\n", l.op, l.shape, l.method);
            let _ = writeln!(s, "| call | host ms | target |\n| --- | ---: | ---: |");
            let _ = writeln!(
                s,
                "| first (empty disk cache: compile + load + launch) | {} | < {:.0} ms |",
                fmt_opt(l.first_call_ms, 1, ""),
                l.target_first_ms
            );
            let _ = writeln!(
                s,
                "| first of a new device, kernel in the disk cache | {} | |",
                fmt_opt(l.first_call_disk_cached_ms, 2, "")
            );
            let _ = writeln!(
                s,
                "| later (median of {}, until the launch returns) | {} | < {:.0} ms |",
                l.later_call.as_ref().map_or(0, |t| t.runs),
                fmt_opt(l.later_call.as_ref().map(|t| t.median_ms), 4, ""),
                l.target_later_ms
            );
            if let Some(msg) = &l.message {
                let _ = writeln!(s, "\n{msg}");
            }
        }

        s.push_str(&crate::attention::markdown(&self.attention));
        let _ = writeln!(s, "\n## Targets (docs/targets.md)\n");
        let met_count = self.targets.iter().filter(|t| t.met == Some(true)).count();
        let measured = self.targets.iter().filter(|t| t.met.is_some()).count();
        let _ = writeln!(s, "{met_count} of {measured} measured targets met.");
        if d.peak_bf16_tflops.is_none() {
            let _ = writeln!(s, "The targets are stated for the H100; on this device they are for orientation only.");
        }
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "| what | target | measured | met |\n| --- | --- | ---: | :---: |"
        );
        for t in &self.targets {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} |",
                t.what,
                t.target,
                t.measured,
                met(t.met)
            );
        }

        let failures: Vec<String> = self
            .memory
            .iter()
            .map(|m| (&m.name, &m.calico, "calico"))
            .chain(self.gemm.iter().map(|g| (&g.name, &g.calico, "calico")))
            .chain(self.decode.iter().map(|d| (&d.name, &d.calico, "calico")))
            .chain(
                self.gemm
                    .iter()
                    .filter_map(|g| g.cublaslt.as_ref().map(|t| (&g.name, t, "cuBLASLt"))),
            )
            .filter_map(|(name, t, who)| {
                t.message
                    .as_ref()
                    .map(|msg| format!("- {name} ({who}, {:?}): {}", t.status, first_line(msg)))
            })
            .collect();
        if !failures.is_empty() {
            let _ = writeln!(s, "\n## Not available or failed\n");
            for f in failures {
                let _ = writeln!(s, "{f}");
            }
        }

        let _ = writeln!(s, "\n## Method\n");
        let _ = writeln!(s, "- Each case: warm-up runs (the first compiles), then device-event times (`Backend::time_ms`) of repeated runs: at least 20 on a GPU, stopping once 1.5 s have passed (10 s at most); median, min and p90 reported.");
        let _ = writeln!(s, "- Inputs are random (xorshift), never zeros, and rotated among enough copies that the rotated set exceeds twice the L2.");
        let _ = writeln!(s, "- On a GPU each timed run follows an untimed read-only pad on the same stream (a matrix-vector product over a 512 MiB matrix), so the host's launch cost is hidden and the L2 is cold but clean (no write-back of dirty lines inside the timed run).");
        let _ = writeln!(s, "- cuBLASLt runs in the same process on the same stream and buffers, with the heuristic's first algorithm and a 32 MiB workspace; descriptors are built once, outside the timing.");
        let _ = writeln!(s, "- torch figures (if any) come from `benches/peers/peers.py` (median of CUDA-event times, each run after the same read-only pad) run on the same machine, converted with the same byte and FLOP counts.");
        for n in &self.notes {
            let _ = writeln!(s, "- {n}");
        }
        s
    }
}

impl Report {
    fn gemv_markdown(&self, s: &mut String) {
        let rows: Vec<&GemmCase> = self.gemm.iter().filter(|g| g.group == "gemv").collect();
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(s, "\n## Decode GEMV\n");
        let _ = writeln!(s, "D[M,N] = A[M,K] · W[N,K]^T; GB/s = weight bytes (N·K·2) / median time; % is of the copy bandwidth above.\n");
        let _ = writeln!(
            s,
            "| case | median ms | GB/s | % copy | cuBLASLt GB/s | torch GB/s | target | met |"
        );
        let _ = writeln!(
            s,
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | :---: |"
        );
        for g in rows {
            let want = g.target_pct_of_copy;
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                g.name,
                or_status(&g.calico, g.calico.median_ms().map(|ms| format!("{ms:.4}"))),
                fmt_rate(g.weight_gbps),
                fmt_opt(g.pct_of_copy, 1, "%"),
                fmt_rate(g.cublaslt_weight_gbps),
                fmt_rate(g.torch_weight_gbps),
                fmt_opt(want, 0, "%"),
                met(g.pct_of_copy.zip(want).map(|(p, want)| p >= want)),
            );
        }
    }

    fn odd_markdown(&self, s: &mut String) {
        let rows: Vec<&GemmCase> = self.gemm.iter().filter(|g| g.group == "odd").collect();
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(s, "\n## GEMM, odd shapes\n");
        let _ = writeln!(s, "K, N or a row stride not a multiple of 8 elements; \"aligned\" is Calico at the nearest shape with every dimension a multiple of 8, in the same run.\n");
        let _ = writeln!(s, "| case | median ms | TFLOP/s | cuBLASLt TFLOP/s | torch TFLOP/s | vs torch | aligned shape | aligned TFLOP/s | vs aligned |");
        let _ = writeln!(
            s,
            "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |"
        );
        for g in rows {
            let (m, n, k) = g.aligned_shape.unwrap_or_default();
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {m}x{n}x{k} | {} | {} |",
                g.name,
                or_status(&g.calico, g.calico.median_ms().map(|ms| format!("{ms:.4}"))),
                fmt_rate(g.calico_tflops),
                fmt_rate(g.cublaslt_tflops),
                fmt_rate(g.torch_tflops),
                fmt_opt(g.ratio_torch, 2, "x"),
                fmt_rate(g.aligned_tflops),
                fmt_opt(g.ratio_aligned, 2, "x"),
            );
        }
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

fn fmt_opt(v: Option<f64>, digits: usize, unit: &str) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.digits$}{unit}"))
}

fn fmt_rate(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), crate::rate)
}

fn met(m: Option<bool>) -> &'static str {
    match m {
        Some(true) => "yes",
        Some(false) => "**no**",
        None => "-",
    }
}

fn or_status(t: &Timed, value: Option<String>) -> String {
    match (t.status, value) {
        (Status::Ok, Some(v)) => v,
        (Status::NotAvailable, _) => "n/a".into(),
        (Status::Failed, _) => "failed".into(),
        (Status::Ok, None) => "-".into(),
    }
}

fn timing_summary(t: &Timed) -> String {
    match &t.stats {
        Some(s) => format!(
            "median {:.3} ms, min {:.3} ms, p90 {:.3} ms",
            s.median_ms, s.min_ms, s.p90_ms
        ),
        None => t.message.clone().unwrap_or_default(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn stats(ms: f64) -> Stats {
        Stats::from_samples(&[ms, ms * 1.01, ms * 0.99]).expect("finite")
    }

    /// A report with one case of every kind, no device needed.
    pub(crate) fn fake_report() -> Report {
        let mut r = Report {
            calico_version: "0.1.0".into(),
            created_unix_s: 0,
            profile: "full".into(),
            only: None,
            device: DeviceInfo {
                name: "NVIDIA H100 80GB HBM3".into(),
                slug: "nvidia-h100-80gb-hbm3".into(),
                backend: "cuda".into(),
                target: "sm_90a".into(),
                lanes: 32,
                compute_units: 132,
                shared_mem_per_block: 227 << 10,
                l2_bytes: 50 << 20,
                peak_bf16_tflops: Some(989.0),
            },
            copy: Some(CopyResult {
                buffer_bytes: 1 << 30,
                bytes_moved: 2 << 30,
                timed: Timed::ok(stats((2u64 << 30) as f64 / 3e9)),
                gbps: None,
            }),
            memory: vec![
                MemCase {
                    name: "rms_norm bf16 65536x4096".into(),
                    op: MemOp::RmsNorm,
                    dtype: "bf16".into(),
                    shape: vec![65536, 4096],
                    bytes: crate::accounting::mem_bytes(MemOp::RmsNorm, &[65536, 4096], 2),
                    rotation_copies: 1,
                    calico: Timed::ok(stats(0.4)),
                    gbps: None,
                    pct_of_copy: None,
                    target_pct: 90.0,
                    target_vs_torch: None,
                    torch_ms: Some(0.5),
                    torch_gbps: None,
                    speedup_vs_torch: None,
                },
                MemCase {
                    name: "softmax bf16 65536x4096".into(),
                    op: MemOp::Softmax,
                    dtype: "bf16".into(),
                    shape: vec![65536, 4096],
                    bytes: 1 << 30,
                    rotation_copies: 1,
                    calico: Timed::from_error(&calico::Error::Runtime {
                        backend: "cuda",
                        call: "cuLaunchKernel".into(),
                        message: "boom".into(),
                    }),
                    gbps: None,
                    pct_of_copy: None,
                    target_pct: 85.0,
                    target_vs_torch: None,
                    torch_ms: None,
                    torch_gbps: None,
                    speedup_vs_torch: None,
                },
            ],
            gemm: vec![GemmCase {
                name: "gemm square 4096x4096x4096".into(),
                group: "square".into(),
                m: 4096,
                n: 4096,
                k: 4096,
                flops: crate::accounting::gemm_flops(4096, 4096, 4096),
                rotation_copies: 3,
                calico: Timed::not_available("GEMM kernels for sm_90a are not wired in yet"),
                calico_tflops: None,
                pct_of_peak: None,
                cublaslt: Some(Timed::ok(stats(0.19))),
                cublaslt_tflops: None,
                ratio_cublaslt: None,
                target_ratio: gemm_target_ratio("square", 4096, 4096, 4096),
                torch_ms: Some(0.2),
                torch_tflops: None,
                ratio_torch: None,
                ..GemmCase::extras_none()
            }],
            decode: Vec::new(),
            attention: Vec::new(),
            latency: Some(Latency {
                op: "rms_norm".into(),
                shape: vec![4096, 4096],
                method: "fresh device".into(),
                first_call_ms: Some(800.0),
                first_call_disk_cached_ms: Some(3.0),
                later_call: Some(stats(0.02)),
                message: None,
                target_first_ms: 2000.0,
                target_later_ms: 10.0,
            }),
            host: Vec::new(),
            peers: None,
            targets: Vec::new(),
            notes: vec!["a note".into()],
        };
        r.derive();
        r
    }

    #[test]
    fn derived_figures() {
        let r = fake_report();
        let copy = r.copy.as_ref().and_then(|c| c.gbps).expect("copy GB/s");
        assert!((copy - 3000.0).abs() < 1.0, "{copy}");
        let m = &r.memory[0];
        let g = m.gbps.expect("GB/s");
        assert!((g - m.bytes as f64 / 0.4e-3 / 1e9).abs() < 1e-6);
        assert!((m.pct_of_copy.expect("pct") - 100.0 * g / copy).abs() < 1e-9);
        assert!((m.speedup_vs_torch.expect("vs torch") - 1.25).abs() < 1e-9);
        assert_eq!(r.memory[1].calico.status, Status::Failed);
        let gm = &r.gemm[0];
        assert_eq!(gm.calico.status, Status::NotAvailable);
        assert!(gm.ratio_cublaslt.is_none());
        assert!((gm.cublaslt_tflops.expect("lt") - 723.4).abs() < 0.5);
        assert_eq!(gm.target_ratio, 1.05);
        // rms_norm (met or not), softmax (-), gemm (-), two latency lines.
        assert_eq!(r.targets.len(), 5);
        assert_eq!(r.targets[1].met, None);
        assert_eq!(r.targets[3].met, Some(true));
    }

    #[test]
    fn target_ratios() {
        assert_eq!(gemm_target_ratio("square", 8192, 8192, 8192), 1.0);
        assert_eq!(gemm_target_ratio("llm", 8192, 14336, 4096), 1.0);
        assert_eq!(gemm_target_ratio("square", 2048, 2048, 2048), 0.9);
        assert_eq!(gemm_target_ratio("skinny", 16, 4096, 4096), 0.9);
    }

    #[test]
    fn writes_markdown_json_and_svg() {
        let r = fake_report();
        let dir = std::env::temp_dir().join(format!("calico-report-test-{}", std::process::id()));
        let written = r.write(&dir).expect("write report");
        let names: Vec<String> = written
            .iter()
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        for want in ["report.json", "report.md", "memory.svg", "gemm.svg"] {
            assert!(
                names.iter().any(|n| n == want),
                "{want} missing from {names:?}"
            );
        }
        let md = std::fs::read_to_string(dir.join("report.md")).expect("md");
        assert!(md.contains("| rms_norm bf16 65536x4096 |"));
        assert!(md.contains("n/a"));
        assert!(md.contains("failed"));
        let json = std::fs::read_to_string(dir.join("report.json")).expect("json");
        let back: Report = serde_json::from_str(&json).expect("parse back");
        assert_eq!(back.memory.len(), r.memory.len());
        assert_eq!(back.gemm[0].calico.status, Status::NotAvailable);
        assert_eq!(back.targets.len(), r.targets.len());
        let svg = std::fs::read_to_string(dir.join("gemm.svg")).expect("svg");
        assert!(svg.starts_with("<svg") && svg.contains("cuBLASLt"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
