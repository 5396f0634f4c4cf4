//! How the CDNA attention forward (`kernels/device/attention/cdna_fwd.cu`) stages a block of
//! K or V in LDS, mirrored so it is checked on the CPU: which 16-byte chunk of the block each
//! thread loads, where the chunk lands in LDS (K row-major, V transposed, both under the
//! swizzle of [`crate::lds`]), and what the wave's `row_l` fragment reads then hold. The tests
//! prove the loads cover the block once, the writes cover the LDS tile once, and every
//! fragment element is the K or V element the matrix product needs.

use crate::lds::lds_swizzle;

/// Elements of a 16-bit type per 16-byte chunk.
pub const CHUNK_ELEMS: usize = 8;

/// Keys one wave-wide load takes (16 keys x [`CHUNKS_PER_KEY`] chunks = 64 lanes).
pub const KEYS_PER_LOAD: usize = 16;
/// Consecutive chunks of a key row one wave-wide load takes.
pub const CHUNKS_PER_KEY: usize = 4;

/// `(row, col)` of the block (`keys x head_dim`, 16-bit) that thread `thread` of `threads`
/// loads as its `i`-th chunk of [`CHUNK_ELEMS`] elements (`Block::place`): the `g`-th load of
/// wave `w` (`g = w * per_thread + i`) takes keys `16 (g % (keys / 16))..+16` and chunks
/// `4 (g / (keys / 16))..+4`, lane `l` key `l % 16` and chunk `l / 16` of them.
pub fn chunk_place(
    thread: usize,
    i: usize,
    keys: usize,
    head_dim: usize,
    threads: usize,
) -> (usize, usize) {
    let (wave, lane) = (thread / 64, thread % 64);
    let g = wave * chunks_per_thread(keys, head_dim, threads) + i;
    let groups = keys / KEYS_PER_LOAD;
    let key = (g % groups) * KEYS_PER_LOAD + lane % KEYS_PER_LOAD;
    let chunk = (g / groups) * CHUNKS_PER_KEY + lane / KEYS_PER_LOAD;
    (key, chunk * CHUNK_ELEMS)
}

/// Chunks each thread loads for a block of `rows` keys.
pub fn chunks_per_thread(rows: usize, head_dim: usize, threads: usize) -> usize {
    rows * head_dim / CHUNK_ELEMS / threads
}

/// Byte offset in LDS of element `(row, col)` of a 16-bit tile with `cols` columns (the
/// `st<T, R, C>::offset` of hip_tile.h: 8-byte swizzle units).
pub fn tile_offset(cols: usize, row: usize, col: usize) -> usize {
    lds_swizzle(cols * 2, 8, row, col * 2)
}

/// `(row, col)` of the tile that element `e` (0..4) of lane `lane`'s `row_l` base tile
/// `(i, j)` holds: row `16 i + lane % 16`, column `16 j + 4 (lane / 16) + e`.
pub fn row_l_coord(lane: usize, i: usize, j: usize, e: usize) -> (usize, usize) {
    (16 * i + lane % 16, 16 * j + 4 * (lane / 16) + e)
}

#[cfg(test)]
mod tests {
    use super::*;

    const THREADS: usize = 512;
    /// (head dim, keys per block) of the kernel's variants.
    const SHAPES: [(usize, usize); 3] = [(64, 64), (128, 64), (256, 32)];
    /// Register tiles go 64 head dims wide.
    const DC: usize = 64;

    /// The value of block element (key, dim): distinct for every element.
    fn value(key: usize, dim: usize) -> u16 {
        (key * 256 + dim) as u16
    }

    /// LDS after one block is staged: K row-major (`keys x d`), V transposed (`d x keys`).
    fn stage(d: usize, keys: usize) -> (Vec<Option<u16>>, Vec<Option<u16>>) {
        let mut k_lds = vec![None; keys * d];
        let mut vt_lds = vec![None; d * keys];
        for t in 0..THREADS {
            for i in 0..chunks_per_thread(keys, d, THREADS) {
                let (r, c) = chunk_place(t, i, keys, d, THREADS);
                for e in 0..CHUNK_ELEMS {
                    let k_at = tile_offset(d, r, c + e) / 2;
                    assert!(k_lds[k_at].is_none(), "K: two writes to one element");
                    k_lds[k_at] = Some(value(r, c + e));
                    let v_at = tile_offset(keys, c + e, r) / 2;
                    assert!(vt_lds[v_at].is_none(), "V^T: two writes to one element");
                    vt_lds[v_at] = Some(value(r, c + e));
                }
            }
        }
        (k_lds, vt_lds)
    }

    #[test]
    fn every_chunk_of_a_block_is_loaded_once() {
        for (d, keys) in SHAPES {
            let n = chunks_per_thread(keys, d, THREADS);
            assert_eq!(n * THREADS * CHUNK_ELEMS, keys * d, "d{d}: chunks divide");
            let mut seen = vec![false; keys * d / CHUNK_ELEMS];
            for t in 0..THREADS {
                for i in 0..n {
                    let (r, c) = chunk_place(t, i, keys, d, THREADS);
                    assert!(r < keys && c < d && c % CHUNK_ELEMS == 0);
                    let id = r * (d / CHUNK_ELEMS) + c / CHUNK_ELEMS;
                    assert!(!seen[id], "d{d}: chunk loaded twice");
                    seen[id] = true;
                }
            }
            assert!(seen.iter().all(|&s| s), "d{d}: a chunk is never loaded");
        }
    }

    #[test]
    fn staged_tiles_fill_lds_exactly() {
        for (d, keys) in SHAPES {
            let (k_lds, vt_lds) = stage(d, keys);
            assert!(k_lds.iter().all(Option::is_some), "d{d}: K tile has holes");
            assert!(
                vt_lds.iter().all(Option::is_some),
                "d{d}: V^T tile has holes"
            );
        }
    }

    /// What `load(kf, sh.k, 0, c * DC)` and `load(vf, sh.vt, c * DC, 0)` give each lane:
    /// kf (keys x DC, row_l) holds K[key][c DC + dim], vf (DC x keys, row_l) holds
    /// V[key][c DC + dim] at (dim, key), i.e. V^T, the B operand mma_ABt needs for P V.
    #[test]
    fn fragments_read_from_lds_hold_k_and_v_transposed() {
        for (d, keys) in SHAPES {
            let (k_lds, vt_lds) = stage(d, keys);
            for c in 0..d / DC {
                for lane in 0..64 {
                    for e in 0..4 {
                        // kf: keys / 16 x DC / 16 base tiles.
                        for i in 0..keys / 16 {
                            for j in 0..DC / 16 {
                                let (key, dim) = row_l_coord(lane, i, j, e);
                                let got = k_lds[tile_offset(d, key, c * DC + dim) / 2];
                                assert_eq!(got, Some(value(key, c * DC + dim)), "K d{d}");
                            }
                        }
                        // vf: DC / 16 x keys / 16 base tiles of V^T.
                        for i in 0..DC / 16 {
                            for j in 0..keys / 16 {
                                let (dim, key) = row_l_coord(lane, i, j, e);
                                let got = vt_lds[tile_offset(keys, c * DC + dim, key) / 2];
                                assert_eq!(got, Some(value(key, c * DC + dim)), "V d{d}");
                            }
                        }
                    }
                }
            }
        }
    }

    /// A lane's four values of a row_l base tile are one contiguous 8-byte unit in LDS (one
    /// ds_read_b64), for both staged tiles.
    #[test]
    fn fragment_reads_are_single_8_byte_accesses() {
        for (d, keys) in SHAPES {
            for (rows, cols) in [(keys, d), (d, keys)] {
                for lane in 0..64 {
                    for i in 0..rows / 16 {
                        for j in 0..cols / 16 {
                            let (r, c0) = row_l_coord(lane, i, j, 0);
                            let first = tile_offset(cols, r, c0);
                            assert_eq!(first % 8, 0);
                            for e in 1..4 {
                                let (r, c) = row_l_coord(lane, i, j, e);
                                assert_eq!(tile_offset(cols, r, c), first + 2 * e);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Most lanes of one LDS access that hit one bank at different dwords (the accesses a
    /// bank serves one after another; lanes sharing a dword share its cycle).
    fn conflict_degree(dwords: impl Iterator<Item = usize>) -> usize {
        let mut per_bank: Vec<Vec<usize>> = vec![Vec::new(); 32];
        for w in dwords {
            if !per_bank[w % 32].contains(&w) {
                per_bank[w % 32].push(w);
            }
        }
        per_bank.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// The transposed V writes (`ds_write_b16`, one per element of a chunk) of one wave-wide
    /// load put at most two dwords on a bank; the row-major K writes (`ds_write_b64`, two per
    /// chunk, served by half-waves) likewise.
    #[test]
    fn staging_writes_spread_over_the_banks() {
        for (d, keys) in SHAPES {
            for t0 in (0..THREADS).step_by(64) {
                for i in 0..chunks_per_thread(keys, d, THREADS) {
                    let place = |lane: usize| chunk_place(t0 + lane, i, keys, d, THREADS);
                    for e in 0..CHUNK_ELEMS {
                        let v = (0..64).map(|l| {
                            let (r, c) = place(l);
                            tile_offset(keys, c + e, r) / 4
                        });
                        assert!(conflict_degree(v) <= 2, "V^T d{d} element {e}");
                    }
                    for half in [0, CHUNK_ELEMS / 2] {
                        for phase in [0..32, 32..64] {
                            let k = phase.flat_map(|l| {
                                let (r, c) = place(l);
                                let at = tile_offset(d, r, c + half) / 4;
                                [at, at + 1]
                            });
                            assert!(conflict_degree(k) <= 2, "K d{d}");
                        }
                    }
                }
            }
        }
    }

    /// The placement the kernel had first (consecutive threads along a row: 4-8 keys x 8-16
    /// chunks per load) put 8 (d128) to 16 (d256) dwords on one bank for V's writes.
    #[test]
    fn row_major_placement_would_conflict_on_transposed_writes() {
        let (d, keys) = (256, 32);
        let per_row = d / CHUNK_ELEMS;
        let v = (0..64).map(|t| {
            let (r, c) = (t / per_row, (t % per_row) * CHUNK_ELEMS);
            tile_offset(keys, c, r) / 4
        });
        assert_eq!(conflict_degree(v), 16);
    }
}
