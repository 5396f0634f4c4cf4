//! How the CDNA attention forward (`kernels/device/attention/cdna_fwd.cu`) stages a block of
//! K or V in LDS, mirrored so it is checked on the CPU: which 16-byte chunk of the block each
//! thread loads, where the chunk lands in LDS (K row-major, V transposed, both under the
//! swizzle of [`crate::lds`]), and what the wave's `row_l` fragment reads then hold. The tests
//! prove the loads cover the block once, the writes cover the LDS tile once, and every
//! fragment element is the K or V element the matrix product needs.

use crate::lds::lds_swizzle;

/// Elements of a 16-bit type per 16-byte chunk.
pub const CHUNK_ELEMS: usize = 8;

/// `(row, col)` of the block (`rows x head_dim`, 16-bit) that thread `thread` of `threads`
/// loads as its `i`-th chunk of [`CHUNK_ELEMS`] elements (`Block::place`).
pub fn chunk_place(thread: usize, i: usize, threads: usize, head_dim: usize) -> (usize, usize) {
    let per_row = head_dim / CHUNK_ELEMS;
    let id = thread + i * threads;
    (id / per_row, (id % per_row) * CHUNK_ELEMS)
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
                let (r, c) = chunk_place(t, i, THREADS, d);
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
                    let (r, c) = chunk_place(t, i, THREADS, d);
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
}
