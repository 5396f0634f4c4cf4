//! The report's host-loop cases: launch overhead and graph replay (see `cases::host_loop`).

use crate::report::TargetCheck;
use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// Host time per call (or per step) of a loop a user would write, beside torch eager.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostCase {
    pub name: String,
    /// Matched against the peers file's `op` (with `shape`).
    pub op: String,
    pub shape: Vec<usize>,
    /// What was timed.
    pub method: String,
    /// Median host microseconds per call (or per step).
    pub calico_us: Option<f64>,
    /// The same loop in PyTorch (peers.py).
    pub torch_us: Option<f64>,
    /// torch / Calico: above 1 when Calico is faster.
    pub speedup_vs_torch: Option<f64>,
    /// At most this many microseconds (absent where no target applies).
    pub target_us: Option<f64>,
    pub message: Option<String>,
}

impl HostCase {
    pub fn new(
        name: String,
        op: &str,
        shape: Vec<usize>,
        method: String,
        target_us: Option<f64>,
    ) -> HostCase {
        HostCase {
            name,
            op: op.to_string(),
            shape,
            method,
            calico_us: None,
            torch_us: None,
            speedup_vs_torch: None,
            target_us,
            message: None,
        }
    }

    pub(crate) fn derive(&mut self) {
        self.speedup_vs_torch = match (self.calico_us, self.torch_us) {
            (Some(c), Some(t)) if c > 0.0 => Some(t / c),
            _ => None,
        };
    }

    pub(crate) fn target(&self) -> Option<TargetCheck> {
        let target = self.target_us?;
        Some(TargetCheck {
            what: self.name.clone(),
            target: format!("<= {target:.1} us per call"),
            measured: self
                .calico_us
                .map_or_else(|| "not measured".into(), |v| format!("{v:.2} us")),
            met: self.calico_us.map(|v| v <= target),
        })
    }
}

/// The Markdown section for `cases`.
pub(crate) fn markdown(s: &mut String, cases: &[HostCase]) {
    if cases.is_empty() {
        return;
    }
    let _ = writeln!(s, "\n## What a user's loop sees (host time)\n");
    let _ = writeln!(s, "Host wall clock, not device events: launch overhead is the median time of one call among calls queued back to back without synchronising; graph replay is the time per decode step of a loop synchronised at its end, eager and replayed from one CUDA graph. torch: the same loop in PyTorch eager (and torch.cuda.graphs for the graph row); `-` where none is run (attention_varlen and attention_backward have no torch loop).\n");
    let _ = writeln!(
        s,
        "| case | calico us | torch us | speedup vs torch | target | met | method |"
    );
    let _ = writeln!(s, "| --- | ---: | ---: | ---: | ---: | :---: | --- |");
    for c in cases {
        let opt = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.2}"));
        let met = match c.target().and_then(|t| t.met) {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "-",
        };
        let method = match &c.message {
            Some(m) => format!("{} ({m})", c.method),
            None => c.method.clone(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            c.name,
            opt(c.calico_us),
            opt(c.torch_us),
            c.speedup_vs_torch
                .map_or_else(|| "-".to_string(), |v| format!("{v:.2}x")),
            c.target_us
                .map_or_else(|| "-".to_string(), |v| format!("<= {v:.1} us")),
            met,
            method
        );
    }
}
