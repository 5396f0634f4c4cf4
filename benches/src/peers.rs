//! Figures from Python peers (`benches/peers/peers.py`), merged into a report by shape.

use crate::report::{PeersInfo, Report};
use serde::Deserialize;
use std::path::Path;

/// The JSON `peers.py` writes.
#[derive(Debug, Deserialize)]
pub struct PeersFile {
    pub torch_version: Option<String>,
    pub device: Option<String>,
    #[serde(default)]
    pub results: Vec<PeerResult>,
}

/// One timed peer case. Memory-bound ops give `shape`; GEMMs give `m`, `n`, `k`.
#[derive(Debug, Deserialize)]
pub struct PeerResult {
    pub op: String,
    #[serde(default)]
    pub shape: Vec<usize>,
    pub m: Option<usize>,
    pub n: Option<usize>,
    pub k: Option<usize>,
    pub median_ms: Option<f64>,
    /// The SDPA backend of an `attention_decode` case: `cudnn` or `flash`.
    #[serde(default)]
    pub backend: Option<String>,
}

/// Reads and parses the peers file at `path`.
pub fn read_file(path: &Path) -> Result<PeersFile, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read peers file {}: {e}", path.display()))?;
    serde_json::from_str(&text)
        .map_err(|e| format!("peers file {} is not valid: {e}", path.display()))
}

/// Puts each peer time next to the Calico case of the same op and shape.
pub fn merge(report: &mut Report, file: &PeersFile, source: &str) {
    let mut matched = 0;
    for r in &file.results {
        let Some(ms) = r.median_ms.filter(|ms| ms.is_finite() && *ms > 0.0) else {
            continue;
        };
        if r.op.starts_with("attention ") {
            if crate::attention::merge_peer(&mut report.attention, &r.op, &r.shape, ms) {
                matched += 1;
            }
        } else if r.op == "attention_decode" {
            // shape = [batch, context(, head_dim)]; torch runs contiguous caches only.
            if let Some(d) = report
                .decode
                .iter_mut()
                .find(|d| d.spec.page_size.is_none() && d.spec.peer_shape() == r.shape)
            {
                match r.backend.as_deref() {
                    Some("cudnn") => d.cudnn_ms = Some(ms),
                    Some("flash") => d.flash_ms = Some(ms),
                    _ => continue,
                }
                matched += 1;
            }
        } else if let Some(h) = report
            .host
            .iter_mut()
            .find(|h| h.op == r.op && h.shape == r.shape)
        {
            h.torch_us = Some(ms * 1e3);
            matched += 1;
        } else if matches!(r.op.as_str(), "gemm" | "matmul" | "linear" | "gemv") {
            // Every case of that shape (a GEMV and a skinny GEMM may share one).
            for g in report
                .gemm
                .iter_mut()
                .filter(|g| Some(g.m) == r.m && Some(g.n) == r.n && Some(g.k) == r.k)
            {
                g.torch_ms = Some(ms);
                matched += 1;
            }
        } else if let Some(c) = report
            .memory
            .iter_mut()
            .find(|c| c.op.name() == r.op && c.shape == r.shape)
        {
            c.torch_ms = Some(ms);
            matched += 1;
        }
    }
    report.peers = Some(PeersInfo {
        file: source.to_string(),
        torch_version: file.torch_version.clone(),
        device: file.device.clone(),
        matched,
    });
    report.derive();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_by_op_and_shape() {
        let mut r = crate::report::tests::fake_report();
        let json = r#"{"torch_version": "2.11", "device": "H100", "results": [
            {"op": "rms_norm", "shape": [65536, 4096], "median_ms": 0.8},
            {"op": "rms_norm", "shape": [65536, 1024], "median_ms": 0.1},
            {"op": "gemm", "m": 4096, "n": 4096, "k": 4096, "median_ms": 0.25},
            {"op": "softmax", "shape": [65536, 4096], "error": "boom"}
        ]}"#;
        let file: PeersFile = serde_json::from_str(json).expect("parse");
        merge(&mut r, &file, "peers.json");
        assert_eq!(r.peers.as_ref().map(|p| p.matched), Some(2));
        assert_eq!(r.memory[0].torch_ms, Some(0.8));
        assert!((r.memory[0].speedup_vs_torch.expect("ratio") - 2.0).abs() < 1e-9);
        assert_eq!(r.gemm[0].torch_ms, Some(0.25));
        assert!(r.gemm[0].torch_tflops.is_some());
        assert!(r.memory[1].torch_ms.is_none());
    }

    #[test]
    fn bad_file_is_an_error_not_a_panic() {
        let missing = read_file(Path::new("/nonexistent/peers.json")).unwrap_err();
        assert!(missing.contains("cannot read peers file"), "{missing}");
        let path = std::env::temp_dir().join(format!("calico-peers-{}.json", std::process::id()));
        std::fs::write(&path, "{ not json").unwrap();
        let invalid = read_file(&path).unwrap_err();
        let _ = std::fs::remove_file(&path);
        assert!(invalid.contains("is not valid"), "{invalid}");
    }
}
