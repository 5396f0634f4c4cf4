//! Launch shapes for the CDNA row kernels (kernels/device/{norm,softmax}/cdna.cu): rows read
//! and written through buffer resources, owned by a wavefront or by a whole workgroup.

use calico_core::{Arch, AsyncCopy, LaunchConfig, Vendor};

/// Lanes of a CDNA wavefront.
const WAVE: usize = 64;
/// Chunks each lane keeps in registers, at most (more: the portable kernel, which streams).
const MAX_CHUNKS_PER_LANE: usize = 4;
/// Workgroup of the wave-per-row kernels: four rows at a time.
const ROW_PER_WAVE_THREADS: usize = 256;
/// Largest workgroup for a row: 1024 threads leave each lane 128 registers, enough for four
/// 16-byte chunks of the row, the weight and the bias in f32.
const MAX_THREADS: usize = 1024;
/// Row operands past this many bytes cannot be described by one buffer resource.
const MAX_ROW_BYTES: usize = 1 << 31;

/// True on a CDNA GPU (gfx90a, gfx94x, gfx95x): buffer resources in the gfx9 format.
pub(crate) fn is_cdna(arch: &Arch) -> bool {
    arch.vendor == Vendor::Amd && arch.has_async_copy(AsyncCopy::BufferLoadToLds)
}

/// How a CDNA row kernel covers a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct CdnaRowPlan {
    /// Bytes per buffer access (4, 8 or 16).
    pub bytes: u32,
    /// Accesses each lane keeps in registers.
    pub chunks_per_lane: u32,
    /// Lanes that own a row: 64 (a wavefront) or `threads` (the workgroup).
    pub group: u32,
    pub threads: u32,
}

impl CdnaRowPlan {
    pub(crate) fn rows_per_block(&self) -> u32 {
        self.threads / self.group
    }

    /// The defines the kernels take for the plan.
    pub(crate) fn defines(&self) -> [(&'static str, String); 4] {
        [
            ("BYTES", self.bytes.to_string()),
            ("NV", self.chunks_per_lane.to_string()),
            ("GROUP", self.group.to_string()),
            ("THREADS", self.threads.to_string()),
        ]
    }
}

/// The plan for rows of `cols` elements of `elem` bytes whose operands start at `addresses`
/// and whose rows are `row_strides` elements apart, or `None` when the CDNA kernels do not
/// apply: not a CDNA device, a row that is not a whole number of dwords (the hardware's range
/// check is per dword, so a half-valid dword would be lost or overwritten), an operand not
/// 4-byte aligned, or a row too long to keep in registers.
pub(crate) fn plan(
    arch: &Arch,
    elem: usize,
    cols: usize,
    addresses: &[u64],
    row_strides: &[usize],
) -> Option<CdnaRowPlan> {
    let row_bytes = cols.checked_mul(elem)?;
    if !is_cdna(arch) || row_bytes == 0 || row_bytes % 4 != 0 || row_bytes >= MAX_ROW_BYTES {
        return None;
    }
    let bytes = [16usize, 8, 4].into_iter().find(|&b| {
        addresses.iter().all(|a| a % b as u64 == 0)
            && row_strides
                .iter()
                .all(|s| s.checked_mul(elem).is_some_and(|s| s % b == 0))
    })?;
    let chunks = row_bytes.div_ceil(bytes);
    let (group, threads) = if chunks <= WAVE * MAX_CHUNKS_PER_LANE {
        (WAVE, ROW_PER_WAVE_THREADS)
    } else {
        let t = chunks
            .div_ceil(MAX_CHUNKS_PER_LANE)
            .next_multiple_of(WAVE)
            .min(MAX_THREADS);
        (t, t)
    };
    let chunks_per_lane = chunks.div_ceil(group);
    if chunks_per_lane > MAX_CHUNKS_PER_LANE {
        return None;
    }
    Some(CdnaRowPlan {
        bytes: bytes as u32,
        chunks_per_lane: chunks_per_lane as u32,
        group: group as u32,
        threads: threads as u32,
    })
}

/// Enough workgroups for every row (capped; the kernels loop over rows).
pub(crate) fn config(rows: usize, plan: CdnaRowPlan) -> LaunchConfig {
    let blocks = rows
        .div_ceil(plan.rows_per_block() as usize)
        .clamp(1, 1 << 20) as u32;
    LaunchConfig::linear(blocks, plan.threads, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gfx942() -> Arch {
        Arch::for_target("gfx942").unwrap()
    }

    #[test]
    fn plans_cover_every_row_length() {
        let arch = gfx942();
        for elem in [2usize, 4] {
            for cols in (2..5000).step_by(2).chain([8192, 16384, 32768]) {
                let Some(p) = plan(&arch, elem, cols, &[0x1000], &[cols]) else {
                    assert!(cols * elem > 1024 * 4 * 16, "{elem} {cols}");
                    continue;
                };
                let covered = p.group as usize * p.chunks_per_lane as usize * p.bytes as usize;
                assert!(covered >= cols * elem, "{elem} {cols} {p:?}");
                assert!(p.chunks_per_lane as usize <= MAX_CHUNKS_PER_LANE);
                assert!(p.threads % 64 == 0 && p.threads <= 1024);
                assert!(p.group == 64 || p.group == p.threads);
            }
        }
    }

    #[test]
    fn short_rows_take_a_wave_long_rows_the_workgroup() {
        let arch = gfx942();
        let p = plan(&arch, 2, 2048, &[0], &[2048]).unwrap();
        assert_eq!(
            (p.bytes, p.group, p.threads, p.chunks_per_lane),
            (16, 64, 256, 4)
        );
        assert_eq!(config(10, p).grid.0, 3, "four rows per workgroup");
        let p = plan(&arch, 2, 8192, &[0], &[8192]).unwrap();
        assert_eq!((p.group, p.threads, p.chunks_per_lane), (256, 256, 4));
        assert_eq!(config(10, p).grid.0, 10);
        assert!(plan(&arch, 2, 1 << 20, &[0], &[1 << 20]).is_none());
    }

    #[test]
    fn access_width_follows_alignment_and_rows_must_be_whole_dwords() {
        let arch = gfx942();
        assert_eq!(plan(&arch, 2, 4096, &[0x1008], &[4096]).unwrap().bytes, 8);
        assert_eq!(plan(&arch, 2, 4096, &[0x1000], &[4098]).unwrap().bytes, 4);
        assert!(plan(&arch, 2, 4096, &[0x1002], &[4096]).is_none());
        assert!(plan(&arch, 2, 4095, &[0x1000], &[4096]).is_none());
        assert!(plan(&arch, 4, 4095, &[0x1000], &[4096]).is_some());
        let sm90 = Arch::for_target("sm_90a").unwrap();
        assert!(plan(&sm90, 2, 4096, &[0], &[4096]).is_none());
        let rdna = Arch::amd("gfx1100", 48, 65536, 32, 6 << 20);
        assert!(plan(&rdna, 2, 4096, &[0], &[4096]).is_none());
    }
}
