//! The stream-K tail of the Hopper GEMM: how many tiles at the end of the tile order are
//! shared out by k-tiles instead of whole, and a host mirror of the kernel's work list
//! (`work_list` in kernels/device/gemm/hopper.cu) that the tests below check.
//!
//! A persistent grid of G CTAs over T tiles runs ceil(T / G) waves; when T % G is small the
//! last wave leaves most SMs idle for a whole tile's time. Stream-K cuts the last `sk` tiles'
//! `sk * k_tiles` k-iterations into G contiguous shares differing by at most one, so every CTA
//! ends together; a
//! tile split between CTAs is finished by the CTA holding its last k-tile, which adds the
//! others' f32 partial sums from a scratch buffer.

/// Bytes of ready flags at the start of the scratch buffer (u32, one per CTA and consumer
/// warpgroup); must match FLAG_BYTES in hopper.cu.
pub(crate) const FLAG_BYTES: usize = 65536;
/// Consumer warpgroups per CTA, each with its own flag.
const CONSUMERS: usize = 2;
/// The most CTAs a stream-K launch may have (one flag per CTA and consumer).
pub(crate) const MAX_CTAS: usize = FLAG_BYTES / 4 / CONSUMERS;
/// Fewest k-tiles per CTA for which splitting pays for the partial-sum traffic.
const MIN_ITERS_PER_CTA: usize = 4;

/// How the tail is scheduled (`CALICO_HOPPER_TUNE` key `sk`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Mode {
    /// Stream-K when the last wave is at most 60% full and each CTA gets enough k-tiles.
    #[default]
    Auto,
    /// Never: whole tiles round robin.
    Off,
    /// The partial last wave (all tiles when there are fewer tiles than CTAs).
    Tail,
    /// The partial last wave and one full wave before it (bigger shares, fewer splits).
    Wide,
}

impl Mode {
    pub(crate) fn parse(value: &str) -> Option<Mode> {
        match value {
            "auto" => Some(Mode::Auto),
            "off" | "0" | "none" => Some(Mode::Off),
            "tail" | "on" | "1" => Some(Mode::Tail),
            "wide" | "2" => Some(Mode::Wide),
            _ => None,
        }
    }
}

/// Tiles (at the end of the order) to share out by k-tiles over `ctas` CTAs; 0 for none.
pub(crate) fn plan(mode: Mode, tiles: usize, ctas: usize, k_tiles: usize) -> usize {
    if k_tiles == 0 || ctas <= 1 || ctas > MAX_CTAS || tiles == 0 {
        return 0;
    }
    let rem = tiles % ctas;
    let tail = if tiles < ctas { tiles } else { rem };
    let wide = if tiles >= rem + ctas && rem > 0 {
        rem + ctas
    } else {
        tail
    };
    let per_cta = |sk: usize| sk * k_tiles / ctas;
    let sk = match mode {
        Mode::Off => 0,
        Mode::Tail => tail,
        Mode::Wide => wide,
        Mode::Auto => {
            // Fewer tiles than CTAs is a tile-shape question (the picker's). Measured on the
            // H100 (docs/perf-log.md): with the last wave 76-88% full the fix-up traffic and
            // the k-offset CTAs' weaker L2 reuse cost more than the idle SMs (4096^3: -2%), so
            // only a last wave at most 60% full is split.
            if tiles < ctas || rem * 10 > ctas * 6 {
                0
            } else if per_cta(rem) < (k_tiles / 4).max(MIN_ITERS_PER_CTA) {
                wide
            } else {
                rem
            }
        }
    };
    // The kernel counts stream-K iterations in 32 bits.
    if sk == 0 || per_cta(sk) < MIN_ITERS_PER_CTA || sk * k_tiles > i32::MAX as usize {
        0
    } else {
        sk
    }
}

/// Scratch bytes for `ctas` CTAs whose consumer warpgroups hold `acc_per_thread` f32
/// accumulators each (128 threads per warpgroup).
pub(crate) fn scratch_bytes(ctas: usize, acc_per_thread: usize) -> usize {
    FLAG_BYTES + ctas * CONSUMERS * 128 * acc_per_thread * 4
}

/// One piece of a CTA's work: k-tiles `k_begin..k_end` of tile `tile`; `last` when it holds
/// the tile's last k-tile (the piece that finishes the tile).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    pub tile: usize,
    pub k_begin: usize,
    pub k_end: usize,
    pub last: bool,
}

/// The host mirror of the kernel's `work_list`: CTA `cta`'s pieces in the order it runs them.
/// Only the tests use it: they prove the kernel's schedule on the CPU.
#[cfg(test)]
#[derive(Debug, Clone)]
pub(crate) struct WorkList {
    dp_tiles: usize,
    k_tiles: usize,
    /// The stream-K iterations are `ctas * base + extra`; CTA g starts at
    /// `g * base + min(g, extra)` (the first `extra` CTAs take one more).
    base: usize,
    extra: usize,
    ctas: usize,
    next_dp: usize,
    pos: usize,
    begin: usize,
}

#[cfg(test)]
impl WorkList {
    pub(crate) fn new(
        tiles: usize,
        sk_tiles: usize,
        k_tiles: usize,
        cta: usize,
        ctas: usize,
    ) -> Self {
        let sk_iters = sk_tiles * k_tiles;
        let mut list = WorkList {
            dp_tiles: tiles - sk_tiles,
            k_tiles,
            base: sk_iters / ctas,
            extra: sk_iters % ctas,
            ctas,
            next_dp: cta,
            pos: 0,
            begin: 0,
        };
        list.begin = list.share_begin(cta);
        list.pos = list.share_begin(cta + 1);
        list
    }

    /// First stream-K iteration of CTA `g`.
    pub(crate) fn share_begin(&self, g: usize) -> usize {
        g * self.base + g.min(self.extra)
    }
}

#[cfg(test)]
impl Iterator for WorkList {
    type Item = Piece;

    fn next(&mut self) -> Option<Piece> {
        if self.next_dp < self.dp_tiles {
            let p = Piece {
                tile: self.next_dp,
                k_begin: 0,
                k_end: self.k_tiles,
                last: true,
            };
            self.next_dp += self.ctas;
            return Some(p);
        }
        if self.pos <= self.begin {
            return None;
        }
        let k = self.k_tiles;
        let t = (self.pos - 1) / k;
        let tile_start = t * k;
        let from = self.begin.max(tile_start);
        let p = Piece {
            tile: self.dp_tiles + t,
            k_begin: from - tile_start,
            k_end: self.pos - tile_start,
            last: self.pos == tile_start + k,
        };
        self.pos = from;
        Some(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs every CTA's list the way the kernel does and checks the schedule: each (tile,
    /// k-tile) is computed exactly once; each tile is finished exactly once, by the piece
    /// holding its last k-tile; the finishing CTA's contributors (found as the kernel finds
    /// them: g - 1, g - 2, ... while share_begin(g) > the tile's first iteration) are exactly
    /// the other CTAs that computed part of the tile, all lower than it; a CTA publishes at
    /// most one partial, as its first stream-K piece, and finishes split tiles only as its
    /// last piece.
    fn check(tiles: usize, sk: usize, k_tiles: usize, ctas: usize) {
        let mut done = vec![vec![0u8; k_tiles]; tiles];
        let mut finished = vec![0u32; tiles];
        let mut holders: Vec<Vec<usize>> = vec![Vec::new(); tiles];
        let mut contributors_found: Vec<Vec<usize>> = vec![Vec::new(); tiles];
        for cta in 0..ctas {
            let list = WorkList::new(tiles, sk, k_tiles, cta, ctas);
            let pieces: Vec<Piece> = list.clone().collect();
            let mut published = 0;
            for (i, p) in pieces.iter().enumerate() {
                assert!(p.k_begin < p.k_end || k_tiles == 0, "{p:?}");
                for count in &mut done[p.tile][p.k_begin..p.k_end] {
                    *count += 1;
                }
                if !holders[p.tile].contains(&cta) {
                    holders[p.tile].push(cta);
                }
                if !p.last {
                    published += 1;
                    let first_sk = pieces.iter().position(|q| q.tile >= tiles - sk).unwrap();
                    assert_eq!(i, first_sk, "a partial is the first stream-K piece");
                    continue;
                }
                finished[p.tile] += 1;
                if p.k_begin > 0 {
                    assert_eq!(i, pieces.len() - 1, "split tiles are finished last");
                    let tile_start = (p.tile - (tiles - sk)) * k_tiles;
                    let mut from = cta;
                    loop {
                        assert!(from > 0, "a split tile always has a lower contributor");
                        from -= 1;
                        if list.share_begin(from) == list.share_begin(from + 1) {
                            continue; // an empty share
                        }
                        contributors_found[p.tile].push(from);
                        if list.share_begin(from) <= tile_start {
                            break;
                        }
                    }
                }
            }
            assert!(published <= 1);
        }
        for t in 0..tiles {
            assert!(done[t].iter().all(|&c| c == 1), "tile {t}: {:?}", done[t]);
            assert_eq!(finished[t], 1, "tile {t}");
            let finisher = *holders[t].iter().max().unwrap();
            let mut others: Vec<usize> = holders[t]
                .iter()
                .copied()
                .filter(|&g| g != finisher)
                .collect();
            others.sort_unstable_by(|a, b| b.cmp(a));
            assert_eq!(contributors_found[t], others, "tile {t}");
        }
    }

    #[test]
    fn schedules_cover_every_k_tile_once_with_consistent_fixups() {
        for &(tiles, ctas, k_tiles) in &[
            (512, 132, 64),
            (1024, 132, 64),
            (2048, 132, 128),
            (3584, 132, 64),
            (32, 132, 64),
            (7, 5, 3),
            (13, 4, 1),
            (3, 8, 2),
            (1, 3, 7),
            (100, 7, 11),
        ] {
            // Every split the kernel could be given, thresholds aside, and what plan picks.
            let rem = tiles % ctas;
            let mut options = vec![0, if tiles < ctas { tiles } else { rem }];
            if rem > 0 && tiles >= rem + ctas {
                options.push(rem + ctas);
            }
            options.push(plan(Mode::Auto, tiles, ctas, k_tiles));
            for sk in options {
                check(tiles, sk, k_tiles, ctas);
            }
        }
    }

    #[test]
    fn auto_splits_part_empty_last_waves_only() {
        // 8192^3 with 128x256 tiles: 2048 tiles, 68 in the last wave of 132.
        assert_eq!(plan(Mode::Auto, 2048, 132, 128), 68);
        // A full last wave, or one more than 60% full (4096^3: 116 of 132): left alone.
        assert_eq!(plan(Mode::Auto, 512, 132, 64), 0);
        assert_eq!(plan(Mode::Auto, 528, 132, 64), 0);
        assert_eq!(plan(Mode::Auto, 128, 132, 64), 0);
        // A nearly empty last wave gets a full wave added, so shares stay large.
        assert_eq!(plan(Mode::Auto, 3584, 132, 64), 20 + 132);
        // Too few k-tiles to share out.
        assert_eq!(plan(Mode::Auto, 200, 132, 1), 0);
        assert_eq!(plan(Mode::Tail, 3, 8, 2), 0);
        assert_eq!(plan(Mode::Off, 512, 132, 64), 0);
        assert_eq!(plan(Mode::Tail, 32, 132, 64), 32);
        assert_eq!(plan(Mode::Wide, 512, 132, 64), 248);
        // K = 0 or more CTAs than there are flags: never.
        assert_eq!(plan(Mode::Tail, 512, 132, 0), 0);
        assert_eq!(plan(Mode::Tail, 50_000, MAX_CTAS + 1, 64), 0);
    }

    #[test]
    fn modes_parse() {
        assert_eq!(Mode::parse("off"), Some(Mode::Off));
        assert_eq!(Mode::parse("tail"), Some(Mode::Tail));
        assert_eq!(Mode::parse("wide"), Some(Mode::Wide));
        assert_eq!(Mode::parse("auto"), Some(Mode::Auto));
        assert_eq!(Mode::parse("sideways"), None);
    }

    #[test]
    fn scratch_holds_flags_and_one_slot_per_cta() {
        assert_eq!(scratch_bytes(132, 128), 65536 + 132 * 131072);
    }
}
