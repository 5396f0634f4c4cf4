//! `CALICO_ATTN_HOPPER_TRACE=1` (a diagnostic): the Hopper forward kernel stamps %globaltimer at
//! each work unit's milestones (hopper_fwd.cu's TRACE); after the call syncs, this module turns
//! the stamps into one line: how long each phase of a unit took, so that the per-unit cost
//! (docs/perf-log.md, attention forward) can be split into waiting for Q, waiting for the turn,
//! the first S, the key loop, the epilogue and the gap to the next unit.

/// Stamps per (CTA, unit of the CTA, consumer): hopper_fwd.cu's TRACE_SLOTS.
pub(crate) const SLOTS: usize = 12;
const ENTRY: usize = 0;
const Q_LANDED: usize = 1;
const TURN: usize = 2;
const FIRST_S: usize = 3;
const LOOP_DONE: usize = 4;
const EPILOGUE_DONE: usize = 5;
const Q_ISSUED: usize = 6;
const KV_ISSUED: usize = 7;
/// SM cycle counts (clock64): last P V done, O's rows written, staging barrier passed, end of
/// the epilogue (after the global-timer stamp, so the last step is one stamp's own cost).
const CLOCKS: [usize; 4] = [8, 9, 10, 11];

/// For each pair of consecutive milestones in `slots` that record `r` reached (both stamps
/// nonzero): the pair's index and the two stamps.
fn reached_steps<'a>(
    r: &'a [u64],
    slots: &'a [usize],
) -> impl Iterator<Item = (usize, u64, u64)> + 'a {
    slots.windows(2).enumerate().filter_map(|(k, w)| {
        let (a, b) = (r[w[0]], r[w[1]]);
        (a > 0 && b > 0).then_some((k, a, b))
    })
}

/// Where the trace of (cta, unit j of the CTA, consumer) starts in the stamps.
fn record(cta: usize, j: usize, consumer: usize, per_cta: usize, consumers: usize) -> usize {
    ((cta * per_cta + j) * consumers + consumer) * SLOTS
}

/// Median and 90th percentile (us) of `v`, or "-".
fn spread(mut v: Vec<f64>) -> String {
    if v.is_empty() {
        return "-".into();
    }
    v.sort_by(f64::total_cmp);
    format!(
        "{:.2}/{:.2}",
        v[v.len() / 2],
        v[(v.len() * 9 / 10).min(v.len() - 1)]
    )
}

/// One line over every unit but each CTA's first (which also fills the pipeline): the median
/// and 90th percentile (us) of each phase, of the whole unit (entry to the next unit's entry)
/// and of the key loop per block, and how long before a consumer entered its unit the producer
/// had issued the unit's Q and first K/V. `stamps` holds `SLOTS` u64 per record in
/// [`record`]'s order; a zero is a milestone not reached (or a unit the CTA did not have).
pub(crate) fn summary(
    stamps: &[u64],
    ctas: usize,
    per_cta: usize,
    consumers: usize,
    blocks_per_unit: usize,
) -> String {
    let mut phase: [Vec<f64>; 6] = Default::default();
    let mut unit = Vec::new();
    let mut per_block = Vec::new();
    let mut q_lead = Vec::new();
    let mut kv_lead = Vec::new();
    let mut clock_steps: [Vec<f64>; 3] = Default::default();
    let us = |a: u64, b: u64| (b as f64 - a as f64) / 1000.0;
    for cta in 0..ctas {
        for j in 1..per_cta {
            for c in 0..consumers {
                let at = record(cta, j, c, per_cta, consumers);
                let Some(r) = stamps.get(at..at + SLOTS) else {
                    continue;
                };
                if r[ENTRY] == 0 || r[EPILOGUE_DONE] == 0 {
                    continue;
                }
                let steps = [ENTRY, Q_LANDED, TURN, FIRST_S, LOOP_DONE, EPILOGUE_DONE];
                for (k, a, b) in reached_steps(r, &steps) {
                    phase[k].push(us(a, b));
                }
                if r[FIRST_S] > 0 && r[LOOP_DONE] > 0 && blocks_per_unit > 1 {
                    per_block.push(us(r[FIRST_S], r[LOOP_DONE]) / (blocks_per_unit - 1) as f64);
                }
                let next = record(cta, j + 1, c, per_cta, consumers);
                if let Some(n) = stamps.get(next..next + SLOTS) {
                    if n[ENTRY] > 0 {
                        phase[5].push(us(r[EPILOGUE_DONE], n[ENTRY]));
                        unit.push(us(r[ENTRY], n[ENTRY]));
                    }
                }
                for (k, a, b) in reached_steps(r, &CLOCKS) {
                    if b >= a {
                        clock_steps[k].push((b - a) as f64);
                    }
                }
                if c == 0 {
                    if r[Q_ISSUED] > 0 {
                        q_lead.push(us(r[Q_ISSUED], r[ENTRY]));
                    }
                    if r[KV_ISSUED] > 0 {
                        kv_lead.push(us(r[KV_ISSUED], r[ENTRY]));
                    }
                }
            }
        }
    }
    let [q_wait, turn, first_s, key_loop, epilogue, gap] = phase;
    let [o_written, staged, stamp_cost] = clock_steps;
    format!(
        "attention trace (us, median/p90 over units after each CTA's first): unit {}, \
         Q wait {}, turn wait {}, first S {}, key loop {} ({} per later block), epilogue {}, \
         gap to next unit {}; producer issued Q {} and the first K/V {} before the consumer entered; \
         epilogue in SM cycles: O and LSE written {}, staging barrier and TMA issue {}, one stamp {}",
        spread(unit),
        spread(q_wait),
        spread(turn),
        spread(first_s),
        spread(key_loop),
        spread(per_block),
        spread(epilogue),
        spread(gap),
        spread(q_lead),
        spread(kv_lead),
        spread(o_written),
        spread(staged),
        spread(stamp_cost),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_are_taken_between_consecutive_milestones() {
        // One CTA, three units, one consumer; units start every 10 us (10_000 ns).
        let unit = |start: u64| -> Vec<u64> {
            let mut r: Vec<u64> = [0, 1000, 1500, 2500, 8500, 9000]
                .iter()
                .map(|d| start + d)
                .collect();
            r.push(start - 3000); // Q issued 3 us before entry
            r.push(start - 4000); // first K/V 4 us before
                                  // Cycles: O written 600 after the loop, barrier 100 later, a stamp 50.
            r.extend([1_000_000, 1_000_600, 1_000_700, 1_000_750]);
            r
        };
        let mut stamps = Vec::new();
        for j in 0..3 {
            stamps.extend(unit(100_000 + 10_000 * j));
        }
        let line = summary(&stamps, 1, 3, 1, 4);
        assert!(line.contains("unit 10.00/10.00"), "{line}");
        assert!(line.contains("Q wait 1.00/1.00"), "{line}");
        assert!(line.contains("turn wait 0.50/0.50"), "{line}");
        assert!(line.contains("first S 1.00/1.00"), "{line}");
        assert!(
            line.contains("key loop 6.00/6.00 (2.00/2.00 per later block)"),
            "{line}"
        );
        assert!(line.contains("epilogue 0.50/0.50"), "{line}");
        assert!(line.contains("gap to next unit 1.00/1.00"), "{line}");
        assert!(
            line.contains("issued Q 3.00/3.00 and the first K/V 4.00/4.00"),
            "{line}"
        );
        // spread() prints cycles with two decimals as well.
        assert!(
            line.contains("O and LSE written 600.00/600.00, staging barrier and TMA issue 100.00/100.00, one stamp 50.00/50.00"),
            "{line}"
        );
        // A unit never reached (zeros) is skipped, not read as time zero.
        let mut holes = stamps.clone();
        holes.extend(vec![0; SLOTS]);
        assert!(summary(&holes, 1, 4, 1, 4).contains("unit 10.00/10.00"));
    }
}
