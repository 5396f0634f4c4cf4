//! Launch shapes for the row kernels (norms, softmax): one block per row, the row in registers.

use calico_core::{Arch, LaunchConfig, Result, Tensor};

/// How a row kernel covers a row of `cols` elements read `vec` at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct RowPlan {
    pub threads: u32,
    /// Vectors each thread keeps in registers (0 when streaming).
    pub vectors_per_thread: u32,
    pub streaming: bool,
}

/// Most vectors a thread holds in registers before the kernel streams instead.
const MAX_VECTORS: usize = 8;
/// Vectors per thread aimed for: enough bytes in flight per thread, enough threads per row
/// (LayerNorm and softmax).
pub(crate) const TARGET_VECTORS: usize = 4;
/// The same for RMSNorm (with or without the residual add): twice the threads per row, half
/// the vectors each. H200, session 27 (65536 rows of 1024 / 2048 / 4096 / 8192 bf16): rms_norm
/// 83 / 87 / 86 / 77% of the copy bandwidth with 4, 94 / 98 / 95 / 80% with 2; add_rms_norm
/// 93-98% -> 98-101%; LayerNorm lost 20-37 points with 2 and softmax 4 at 4096 columns, so
/// they keep 4. H100, session 28 (same rows, mirrored A/B): rms_norm 91-97% with 4, 97-101%
/// with 2.
pub(crate) const RMS_TARGET_VECTORS: usize = 2;
/// Largest block that keeps rows in registers: 512 threads leave each up to 128 registers
/// (1024 would cap them at 64 and fail to launch the LayerNorm variants that need more).
const MAX_REGISTER_THREADS: usize = 512;

/// Overrides from `CALICO_ROWS_TUNE` (A/B runs; entries that do not parse are ignored):
/// `vectors=N` vectors per thread aimed for (1-8), `blocks=N` at most N blocks per SM, each
/// looping over rows (the kernels are grid-stride).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Tune {
    vectors: Option<usize>,
    blocks_per_sm: Option<usize>,
}

impl Tune {
    fn parse(text: &str) -> Tune {
        let mut t = Tune::default();
        for (key, value) in crate::knobs::pairs(text) {
            let num = value.parse::<usize>().ok();
            match key {
                "vectors" => t.vectors = num.filter(|v| (1..=MAX_VECTORS).contains(v)),
                "blocks" => t.blocks_per_sm = num.filter(|v| (1..=64).contains(v)),
                _ => {}
            }
        }
        t
    }

    fn get() -> Tune {
        static TUNE: std::sync::OnceLock<Tune> = std::sync::OnceLock::new();
        crate::knobs::read(&TUNE, "CALICO_ROWS_TUNE", Tune::parse)
    }
}

/// The plan for rows of `cols` elements read `vec` at a time, each thread aiming at
/// [`TARGET_VECTORS`] vectors ([`plan_aiming`] for another aim).
pub(crate) fn plan(cols: usize, vec: usize, arch: &Arch) -> RowPlan {
    plan_aiming(cols, vec, arch, TARGET_VECTORS)
}

/// [`plan`] with `aim` vectors per thread (`CALICO_ROWS_TUNE=vectors=N` overrides it).
pub(crate) fn plan_aiming(cols: usize, vec: usize, arch: &Arch, aim: usize) -> RowPlan {
    let lanes = arch.lanes.max(1) as usize;
    let vectors = cols.div_ceil(vec);
    let threads = vectors
        .div_ceil(Tune::get().vectors.unwrap_or(aim).max(1))
        .next_multiple_of(lanes)
        .clamp(lanes, MAX_REGISTER_THREADS.max(lanes));
    let per_thread = vectors.div_ceil(threads);
    if per_thread > MAX_VECTORS {
        return RowPlan {
            threads: 1024,
            vectors_per_thread: 0,
            streaming: true,
        };
    }
    RowPlan {
        threads: threads as u32,
        vectors_per_thread: per_thread.max(1) as u32,
        streaming: false,
    }
}

/// True when every row of two row-major operands (base address, row stride in elements of
/// `elem` bytes) starts at the same offset from a 16-byte boundary, and that offset is a whole
/// element: their rows' aligned bodies then line up (the ALIGN_BODY row kernels).
pub(crate) fn same_misalignment(
    elem: usize,
    x: (u64, usize),
    y: (u64, usize),
    rows: usize,
) -> bool {
    let elem_ok = elem > 0 && x.0.is_multiple_of(elem as u64) && y.0.is_multiple_of(elem as u64);
    let bases = x.0 % 16 == y.0 % 16;
    let strides = rows <= 1 || (x.1 * elem) % 16 == (y.1 * elem) % 16;
    elem_ok && bases && strides
}

/// A row operand as the routers see it: device address (1, misaligned, when unknown) and row
/// stride in elements.
pub(crate) fn operand(t: &Tensor) -> Result<(u64, usize)> {
    Ok((
        t.device_ptr().unwrap_or(1),
        t.layout().as_rows()?.row_stride,
    ))
}

/// A grid of one block per row, capped (the kernels loop over rows).
pub(crate) fn config(rows: usize, plan: RowPlan, arch: &Arch) -> LaunchConfig {
    let cap = Tune::get()
        .blocks_per_sm
        .map_or(1 << 20, |b| b * arch.compute_units.max(1) as usize);
    let blocks = rows.clamp(1, cap.min(1 << 20)) as u32;
    LaunchConfig::linear(blocks, plan.threads, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_cover_the_row() {
        let arch = Arch::nvidia(9, 0, 132, 227 * 1024, 50 << 20);
        for cols in [1usize, 7, 64, 1000, 4096, 8192, 65536, 1 << 20] {
            for vec in [1usize, 2, 4, 8] {
                let p = plan(cols, vec, &arch);
                assert!(p.threads.is_multiple_of(32) && p.threads <= 1024);
                if !p.streaming {
                    assert!(
                        p.threads as usize * p.vectors_per_thread as usize * vec >= cols,
                        "{cols} {vec} {p:?}"
                    );
                    assert!(p.vectors_per_thread as usize <= MAX_VECTORS);
                }
            }
        }
        let p = plan(4096, 8, &arch);
        assert_eq!(
            (p.threads, p.vectors_per_thread, p.streaming),
            (128, 4, false)
        );
    }

    #[test]
    fn misalignment_must_match_row_by_row() {
        assert!(same_misalignment(2, (0x1002, 4097), (0x2002, 4097), 4097));
        assert!(!same_misalignment(2, (0x1002, 4097), (0x2000, 4097), 4097));
        assert!(!same_misalignment(2, (0x1000, 4097), (0x2000, 4098), 2));
        assert!(same_misalignment(2, (0x1000, 4097), (0x2000, 4098), 1));
        assert!(!same_misalignment(2, (0x1001, 8), (0x2001, 8), 1));
    }

    #[test]
    fn wave64_blocks_are_whole_wavefronts() {
        let arch = Arch::amd("gfx942", 304, 65536, 64, 4 << 20);
        assert_eq!(plan(100, 8, &arch).threads, 64);
    }
}
