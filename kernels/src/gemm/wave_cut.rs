//! A Hopper GEMM launch cut in two at a wave boundary.
//!
//! The Hopper kernel runs a persistent grid of one CTA per SM over its output tiles, so its
//! time goes in rounds of `SMs` tiles. A problem whose last round is nearly empty pays a whole
//! round for a few tiles: an LLM's down-projection at 1500 tokens (1500 x 3072 x 14336) is 144
//! tiles of 128 x 256, 132 in the first round and 12 in the second, twice the time of 132 tiles
//! for 9% more work. Cut along M or N at a tile boundary, the head's tiles fill whole rounds and
//! the thin rest (the tail) is a problem of its own that the Hopper launch splits along K over
//! the SMs (or tiles more finely). Two or three launches instead of one, a re-read of one
//! operand by the tail; [`hopper::modeled_us`] weighs that against the round it saves.

use super::hopper::{self, TileConfig, Tune};
use super::GemmProblem;
use calico_core::Arch;

/// What the second launch costs beyond its own modelled time (the first one's drain and the
/// second one's ramp, in microseconds).
const CUT_LAUNCH_US: f64 = 4.0;
/// A cut must save at least this share of the modelled time: the model ranks, it does not
/// measure, and a near tie is not worth a second launch.
const MIN_GAIN: f64 = 0.08;

/// `p` launched as `head` (whole rounds of the uncut tile) then `tail`: the rows (`along_m`) or
/// columns of D from `at` on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct WaveCut {
    pub head: GemmProblem,
    pub tail: GemmProblem,
    pub along_m: bool,
    pub at: usize,
}

/// The cut of `p` the model prefers to one launch, if any. Considered only when the uncut
/// launch's last round fills at most half the SMs and the launch is not split along K; the
/// head keeps the uncut launch's tile, so each of its rounds is as full as the uncut one's.
pub(crate) fn wave_cut(arch: &Arch, p: &GemmProblem, tune: Tune) -> Option<WaveCut> {
    wave_cut_of(arch, p, hopper::config(arch, p)?, tune)
}

/// [`wave_cut`] for a caller that already holds the uncut launch's tile (`whole`).
pub(crate) fn wave_cut_of(
    arch: &Arch,
    p: &GemmProblem,
    whole: TileConfig,
    tune: Tune,
) -> Option<WaveCut> {
    if !tune.allows_wave_cut() {
        return None;
    }
    let sms = arch.compute_units.max(1) as usize;
    let work = whole.work(p);
    if work <= sms || whole.cluster != 1 {
        return None;
    }
    let rounds = work.div_ceil(sms);
    let last = work - (rounds - 1) * sms;
    // A problem split along K as a whole (few of the widest tiles) is not cut as well.
    if last * 2 > sms || hopper::split_plan(arch, p, tune).is_some() {
        return None;
    }
    let k_tiles = p.k.div_ceil(hopper::BK);
    let uncut_us = hopper::modeled_us(p, rounds, k_tiles, whole, 0, tune);
    let head_tiles = (rounds - 1) * sms;
    let row_tiles = p.m.div_ceil(whole.bm);
    let col_tiles = p.n.div_ceil(whole.bn);
    let along = [
        (
            true,
            head_tiles / (col_tiles * p.batch),
            row_tiles,
            whole.bm,
        ),
        (
            false,
            head_tiles / (row_tiles * p.batch),
            col_tiles,
            whole.bn,
        ),
    ];
    along
        .into_iter()
        .filter(|&(_, head, all, _)| head >= 1 && head < all)
        .filter_map(|(along_m, head, _, unit)| {
            let cut = cut_at(p, along_m, head * unit)?;
            let head_us = head_us(arch, &cut.head, whole, k_tiles, tune)?;
            let tail_us = hopper::planned_us(arch, &cut.tail, tune)?;
            Some((head_us + tail_us + CUT_LAUNCH_US, cut))
        })
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .filter(|(us, _)| *us < uncut_us * (1.0 - MIN_GAIN))
        .map(|(_, cut)| cut)
}

/// The head's modelled time, if it runs on the uncut launch's tile (it always should: it has
/// whole rounds of that tile); `None` declines the cut.
fn head_us(
    arch: &Arch,
    head: &GemmProblem,
    whole: TileConfig,
    k_tiles: usize,
    tune: Tune,
) -> Option<f64> {
    let cfg = hopper::config(arch, head).filter(|&c| c == whole)?;
    let sms = arch.compute_units.max(1) as usize;
    let rounds = cfg.work(head).div_ceil(sms);
    Some(hopper::modeled_us(head, rounds, k_tiles, cfg, 0, tune))
}

/// `p` cut into D's rows (or columns) before `at` and from `at` on.
pub(crate) fn cut_at(p: &GemmProblem, along_m: bool, at: usize) -> Option<WaveCut> {
    let extent = if along_m { p.m } else { p.n };
    if at == 0 || at >= extent {
        return None;
    }
    Some(WaveCut {
        head: part(p, along_m, 0, at)?,
        tail: part(p, along_m, at, extent - at)?,
        along_m,
        at,
    })
}

/// `p` restricted to `len` of D's rows (`along_m`) or columns from `from` on.
fn part(p: &GemmProblem, along_m: bool, from: usize, len: usize) -> Option<GemmProblem> {
    if along_m {
        p.part(from, len, 0, p.n)
    } else {
        p.part(0, p.m, from, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::portable::tests::{h100, problem};

    #[test]
    fn a_nearly_empty_last_round_is_cut_into_whole_rounds() {
        // 12 x 12 tiles of 128 x 256: 132 in the first round, 12 in the second.
        let p = problem(1500, 3072, 14336, true);
        let cut = wave_cut(&h100(), &p, Tune::default()).expect("cut");
        let whole = hopper::config(&h100(), &p).unwrap();
        let head = hopper::config(&h100(), &cut.head).unwrap();
        assert_eq!(head, whole);
        assert!(head.work(&cut.head) <= 132);
        assert!(head.work(&cut.head) > 120);
        // Along N: the head's columns are whole 256-column tiles.
        assert!(!cut.along_m);
        assert_eq!(cut.at % 256, 0);
        assert_eq!((cut.head.n, cut.tail.n), (cut.at, p.n - cut.at));
        assert_eq!((cut.head.m, cut.tail.m), (p.m, p.m));
        // The tail is split along K over the idle SMs.
        assert!(hopper::k_splits(&h100(), &p) >= 2);
    }

    #[test]
    fn full_last_rounds_and_tuning_runs_are_not_cut() {
        for (m, n, k) in [(4096, 4096, 4096), (8192, 8192, 8192), (2048, 2048, 2048)] {
            let p = problem(m, n, k, true);
            assert_eq!(wave_cut(&h100(), &p, Tune::default()), None, "{m}x{n}x{k}");
        }
        let p = problem(1500, 3072, 14336, true);
        for tune in ["cut=0", "split=1", "bm=128,bn=256", "cluster=2"] {
            assert_eq!(wave_cut(&h100(), &p, Tune::parse(tune)), None, "{tune}");
        }
        assert!(wave_cut(&h100(), &p, Tune::parse("cut=1")).is_some());
    }

    #[test]
    fn the_views_of_a_cut_move_every_operand() {
        let mut p = problem(1000, 600, 64, true);
        p.c = Some(p.d);
        p.bias = Some(4 << 20);
        let (a, b, d) = (p.a, p.b, p.d);
        let rows_cut = cut_at(&p, true, 256).unwrap();
        let (head, tail) = (rows_cut.head, rows_cut.tail);
        assert_eq!((head.m, tail.m, tail.n), (256, 744, 600));
        assert_eq!(tail.a.ptr, a.ptr + (256 * a.row_stride * 2) as u64);
        assert_eq!(tail.d.ptr, d.ptr + (256 * d.row_stride * 2) as u64);
        assert_eq!(tail.c.unwrap().ptr, tail.d.ptr);
        assert_eq!((tail.b, tail.bias, head.a.ptr), (b, p.bias, a.ptr));
        assert_eq!((head.a.rows, tail.a.rows, tail.d.rows), (256, 744, 744));
        let cols_cut = cut_at(&p, false, 512).unwrap();
        let tail = cols_cut.tail;
        assert_eq!((tail.m, tail.n, tail.a), (1000, 88, a));
        assert_eq!(tail.b.ptr, b.ptr + (512 * b.col_stride * 2) as u64);
        assert_eq!(tail.d.ptr, d.ptr + 512 * 2);
        assert_eq!(tail.bias, Some((4 << 20) + 512 * 2));
        assert_eq!((tail.b.cols, tail.d.cols), (88, 88));
        assert!(cut_at(&p, true, 0).is_none());
        assert!(cut_at(&p, false, 600).is_none());
    }
}
