//! The CDNA LDS tile swizzle (`lds_swizzle` in the HIP device header `calico/hip_tile.h`),
//! mirrored in Rust so its two promises are checked on the CPU: it permutes each row's bytes
//! within the row, and the reads the MFMA tiles make are free of bank conflicts.
//!
//! CDNA's LDS has 32 banks of 4 bytes. A wave's `ds_read_b64` is served in phases of 16 lanes
//! and `ds_read_b128` in phases of 8; a phase without two lanes on one bank takes one pass.

/// Byte offset of logical byte `byte_in_row` of row `row` in a tile with `row_bytes`-byte
/// rows, for readers taking `unit` (8 or 16) contiguous bytes per lane: within each 128-byte
/// segment the units are XORed with the row's segment index. `row_bytes` is 32, 64 or a
/// multiple of 128; `unit` divides `byte_in_row`'s unit grid (the caller's reads are aligned).
pub fn lds_swizzle(row_bytes: usize, unit: usize, row: usize, byte_in_row: usize) -> usize {
    let rows_per_segment = if row_bytes >= 128 { 1 } else { 128 / row_bytes };
    let keys = (128 / unit) / rows_per_segment;
    let linear = row * row_bytes + byte_in_row;
    let key = (row / rows_per_segment) % keys;
    linear ^ (key * unit)
}

/// The 4-byte banks (0..32) that an access of `bytes` bytes at `offset` touches.
pub fn banks(offset: usize, bytes: usize) -> impl Iterator<Item = usize> {
    (offset / 4..(offset + bytes) / 4).map(|word| word % 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROW_BYTES: [usize; 5] = [32, 64, 128, 256, 512];

    #[test]
    fn every_row_is_permuted_within_itself() {
        for row_bytes in ROW_BYTES {
            for unit in [8, 16] {
                for row in 0..64 {
                    let mut seen = vec![false; row_bytes];
                    for b in 0..row_bytes {
                        let off = lds_swizzle(row_bytes, unit, row, b);
                        assert_eq!(
                            off / row_bytes,
                            row,
                            "{row_bytes} {unit}: byte leaves its row"
                        );
                        assert!(!seen[off % row_bytes], "{row_bytes} {unit}: twice");
                        seen[off % row_bytes] = true;
                    }
                    // Units stay contiguous: a read of `unit` bytes is one access.
                    for u in (0..row_bytes).step_by(unit) {
                        let first = lds_swizzle(row_bytes, unit, row, u);
                        for b in 1..unit {
                            assert_eq!(lds_swizzle(row_bytes, unit, row, u + b), first + b);
                        }
                    }
                }
            }
        }
    }

    /// A phase of 128 / unit lanes reading the same unit column of as many consecutive rows
    /// (an MFMA row_l base tile read: lane l reads row l % 16) touches every bank once.
    #[test]
    fn mfma_tile_reads_are_conflict_free() {
        for row_bytes in ROW_BYTES {
            for unit in [8, 16] {
                let lanes = 128 / unit;
                for first_row in (0..64).step_by(lanes) {
                    for u in (0..row_bytes).step_by(unit) {
                        let mut hits = [0u32; 32];
                        for lane in 0..lanes {
                            let off = lds_swizzle(row_bytes, unit, first_row + lane, u);
                            for bank in banks(off, unit) {
                                hits[bank] += 1;
                            }
                        }
                        assert!(
                            hits.iter().all(|&h| h == 1),
                            "rows of {row_bytes} B, {unit}-byte reads at row {first_row} byte {u}: {hits:?}"
                        );
                    }
                }
            }
        }
    }

    /// Without the swizzle the same reads of 128-byte rows all land on the same banks.
    #[test]
    fn unswizzled_reads_would_conflict() {
        let hits = (0..16)
            .flat_map(|row| banks(row * 128, 8))
            .filter(|&b| b == 0)
            .count();
        assert_eq!(hits, 16);
    }
}
