//! `CALICO_DECODE_TUNE=trace=1` (a diagnostic): the tensor-core decode kernel stamps
//! %globaltimer at each block's milestones (decode_mma.cu's TRACE); after the call syncs, this
//! module turns the stamps into one line per call: when the blocks reached each milestone.

/// Stamps per block (decode_mma.cu's TRACE_SLOTS): eight times in ns, then the SM id with the
/// merge flag (bit 16) and a reached flag (bit 32).
pub(crate) const SLOTS: usize = 9;
const MILESTONES: [&str; 8] = [
    "entry",
    "first copies",
    "ranges",
    "first tile",
    "loop done",
    "written",
    "counted",
    "exit",
];

/// One line: for each milestone, the min / median / max over blocks of its time (us after the
/// earliest entry); then the merging blocks' exits, the SMs used and the span. `stamps` holds
/// `SLOTS` u64 per block; a zero time is a milestone the block did not reach.
pub(crate) fn summary(stamps: &[u64]) -> String {
    let blocks: Vec<&[u64]> = stamps
        .chunks_exact(SLOTS)
        .filter(|b| b[SLOTS - 1] >> 32 == 1)
        .collect();
    let Some(t0) = blocks.iter().map(|b| b[0]).filter(|&t| t > 0).min() else {
        return "decode trace: no block reached its exit".into();
    };
    let us = |t: u64| t.saturating_sub(t0) as f64 / 1000.0;
    let spread = |mut v: Vec<f64>| -> String {
        if v.is_empty() {
            return "-".into();
        }
        v.sort_by(f64::total_cmp);
        format!("{:.2}/{:.2}/{:.2}", v[0], v[v.len() / 2], v[v.len() - 1])
    };
    let mut parts = Vec::new();
    for (k, name) in MILESTONES.iter().enumerate() {
        let times: Vec<f64> = blocks
            .iter()
            .filter(|b| b[k] > 0)
            .map(|b| us(b[k]))
            .collect();
        parts.push(format!("{name} {}", spread(times)));
    }
    let merged: Vec<f64> = blocks
        .iter()
        .filter(|b| b[SLOTS - 1] >> 16 & 1 == 1)
        .map(|b| us(b[7]))
        .collect();
    let mut sms: Vec<u64> = blocks.iter().map(|b| b[SLOTS - 1] & 0xffff).collect();
    sms.sort_unstable();
    sms.dedup();
    let end = blocks.iter().map(|b| us(b[7])).fold(0.0, f64::max);
    format!(
        "decode trace: {} blocks on {} SMs, us after the first entry (min/median/max): {}; \
         merging blocks' exit {}; span {end:.2} us",
        blocks.len(),
        sms.len(),
        parts.join(", "),
        spread(merged),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milestones_are_spread_over_the_blocks_that_reached_them() {
        let block = |base: u64, sm: u64, merged: bool, first_tile: u64| -> Vec<u64> {
            let mut b: Vec<u64> = (0..8).map(|k| base + 1000 * k).collect();
            b[3] = first_tile;
            b.push(sm | u64::from(merged) << 16 | 1 << 32);
            b
        };
        let mut stamps = block(5_000, 3, false, 8_000);
        stamps.extend(block(6_000, 4, true, 0)); // no tile of its own
        stamps.extend(vec![0; SLOTS]); // a block that never wrote
        let line = summary(&stamps);
        assert!(line.contains("2 blocks on 2 SMs"), "{line}");
        assert!(line.contains("entry 0.00/1.00/1.00"), "{line}");
        assert!(line.contains("first tile 3.00/3.00/3.00"), "{line}");
        assert!(line.contains("exit 7.00/8.00/8.00"), "{line}");
        assert!(
            line.contains("merging blocks' exit 8.00/8.00/8.00"),
            "{line}"
        );
        assert!(line.ends_with("span 8.00 us"), "{line}");
        assert_eq!(
            summary(&[0; SLOTS]),
            "decode trace: no block reached its exit"
        );
    }
}
