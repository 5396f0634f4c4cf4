//! The few-rows dot form (gemm_few_rows.rs) for bf16 A and bf16 W on x86-64 CPUs with
//! AVX512_BF16. `vdpbf16ps` multiplies 32 bf16 pairs read straight from W's bytes and adds
//! them into 16 f32 lanes: W is neither widened nor copied, and a block of 4 W rows x 4 A
//! rows keeps its 16 sums in registers (8 loads per 16 instructions of 32 pairs each). On the
//! 2-core development machine the widening form was bound by its loads and conversions
//! (M = 16 on a 4096 x 4096 weight: a quarter of the copy bandwidth); see docs/perf-log.md.
//!
//! Rounding: a product of two bf16 values is exact in f32; the instruction adds a pair's two
//! products into the lane one after the other (f32, round to nearest even) and treats
//! subnormal inputs and results as zero (below 2^-126 in magnitude), where the widening form
//! keeps them. Each output's sum runs in a fixed order (lanes over K, K in order, then a
//! fixed tree over the lanes), so results do not depend on the thread count.

#[cfg(target_arch = "x86_64")]
use crate::bf16_pairs::{available, with_bf16_bits};
use crate::gemm_few_rows::Lines;
use calico_core::DType;
use rayon::prelude::*;

/// W rows (outputs) per rayon task.
const TASK_ROWS: usize = 64;
/// A rows per rayon task (their K block, 512 KiB, in L2).
const TASK_COLS: usize = 256;
/// K elements of each W row per pass over the A rows (4 rows x 2 KiB in L1). 512 measured
/// the same within the machine's noise, 256 slower (M = 16 to 64: 10-25%).
const K_BLOCK: usize = 1024;

/// `acc[i, j] = alpha * sum_k a[i, k] * w[j, k]`, as `gemm_few_rows::dot`: `a` is `m x k`
/// row-major and holds bf16 values (widened, so the narrowing here is exact), W's row `j` is
/// line `j` of `w` (bf16), `acc` is `m x n` row-major, `tiles` scratch. Any M: each rayon task
/// takes [`TASK_ROWS`] W rows against [`TASK_COLS`] A rows, and writes its own tile of
/// `tiles`. Call only where [`available`] says so.
#[cfg(target_arch = "x86_64")]
pub(crate) fn dot(
    a: &[f32],
    (m, n, k): (usize, usize, usize),
    w: Lines,
    alpha: f32,
    acc: &mut [f32],
    tiles: &mut Vec<f32>,
) {
    assert!(available() && w.dtype == DType::BF16);
    assert!(m > 0 && n > 0 && k > 0 && a.len() == m * k && acc.len() == m * n);
    // Every W row read lies inside w.bytes (the caller checked the view fits; the raw loads
    // below rely on it, so it is checked again here).
    let last_end = (w.start + (n - 1) * w.stride + k) * 2;
    assert!(w.bytes.len() >= last_end, "W rows past the tensor's bytes");
    let (n_tasks, cols) = (n.div_ceil(TASK_ROWS), m.min(TASK_COLS));
    let tile = TASK_ROWS * cols;
    tiles.clear();
    tiles.resize(n_tasks * m.div_ceil(cols) * tile, 0.0);
    with_bf16_bits(a, |a_bits| {
        tiles
            .par_chunks_mut(tile)
            .enumerate()
            .for_each_init(Vec::new, |sums, (task, out)| {
                let (first_col, first_row) = (task / n_tasks * cols, task % n_tasks * TASK_ROWS);
                let (rows, cols) = ((n - first_row).min(TASK_ROWS), (m - first_col).min(cols));
                let a_rows = &a_bits[first_col * k..(first_col + cols) * k];
                // SAFETY: `available()` (asserted above) detected AVX-512 F/BW and AVX512_BF16,
                // the features `task_rows` enables; `a_rows` holds `cols` rows of k; W's rows
                // first_row.. first_row + rows <= n lie in w.bytes (asserted above).
                unsafe {
                    task_rows(
                        a_rows,
                        (cols, k),
                        &w,
                        first_row,
                        &mut out[..rows * cols],
                        sums,
                    )
                }
            });
    });
    // Tile (i / cols, j / TASK_ROWS) holds rows of its A columns for each of its W rows.
    acc.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
        let (mt, ii) = (i / cols, i % cols);
        let width = (m - mt * cols).min(cols);
        for (t, part) in row.chunks_mut(TASK_ROWS).enumerate() {
            let tile = &tiles[(mt * n_tasks + t) * tile..];
            for (jj, v) in part.iter_mut().enumerate() {
                *v = alpha * tile[jj * width + ii];
            }
        }
    });
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn dot(
    _: &[f32],
    _: (usize, usize, usize),
    _: Lines,
    _: f32,
    _: &mut [f32],
    _: &mut Vec<f32>,
) {
    unreachable!("bf16_pairs::available() is false off x86-64")
}

#[cfg(target_arch = "x86_64")]
use crate::bf16_pairs::{accumulate, sums_of, Block};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::_mm512_setzero_ps;

/// Outputs of W rows `first..first + out.len() / m` into `out` (row `j - first` holds the m
/// outputs of W row `j`). Each group of 4 W rows runs over K in blocks of [`K_BLOCK`]: the
/// block's 4 W row pieces (8 KiB) stay in L1 while every group of 4 A rows takes its turn,
/// its 16 sums kept in `sums` between blocks (W is read from memory once).
///
/// # Safety
/// The CPU has AVX-512 F/BW and AVX512_BF16; `a` holds `m` rows of `k`; W's rows up to
/// `first + out.len() / m` lie inside `w.bytes`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn task_rows(
    a: &[u16],
    (m, k): (usize, usize),
    w: &Lines,
    first: usize,
    out: &mut [f32],
    sums: &mut Vec<Block>,
) {
    let rows = out.len() / m;
    let w_row = |j: usize| w.bytes.as_ptr().wrapping_add((w.start + j * w.stride) * 2);
    let a_row = |i: usize| a.as_ptr().wrapping_add(i.min(m - 1) * k) as *const u8;
    sums.clear();
    sums.resize(m.div_ceil(4), [[_mm512_setzero_ps(); 4]; 4]);
    for r0 in (0..rows).step_by(4) {
        // A short last group repeats its last row; the copies' outputs are not kept.
        let last = rows - 1;
        let ws = [0, 1, 2, 3].map(|i| w_row(first + (r0 + i).min(last)));
        sums.fill([[_mm512_setzero_ps(); 4]; 4]);
        for from in (0..k).step_by(K_BLOCK) {
            let to = (from + K_BLOCK).min(k);
            for (g, block) in sums.iter_mut().enumerate() {
                let i0 = 4 * g;
                let a4 = [0, 1, 2, 3].map(|i| a_row(i0 + i));
                // SAFETY: the CPU has the features (this function's contract); every pointer
                // starts a row of k elements inside its buffer (A rows clamped below m, W rows
                // <= first + rows - 1, inside w.bytes by the contract), and from..to <= k.
                unsafe {
                    match (m - i0, g == 0) {
                        // One A row reads W at the pace of memory, the hardware's prefetch
                        // keeping up (measured: software prefetch slowed it).
                        (1, _) => accumulate::<1, false>(block, ws, a4, from, to),
                        (2, _) => accumulate::<2, true>(block, ws, a4, from, to),
                        (3, _) => accumulate::<3, true>(block, ws, a4, from, to),
                        (_, true) => accumulate::<4, true>(block, ws, a4, from, to),
                        (_, false) => accumulate::<4, false>(block, ws, a4, from, to),
                    }
                }
            }
        }
        for (g, block) in sums.iter().enumerate() {
            let (i0, cols) = (4 * g, (m - 4 * g).min(4));
            for (r, row) in sums_of(block).iter().enumerate().take(rows - r0) {
                out[(r0 + r) * m + i0..][..cols].copy_from_slice(&row[..cols]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm_few_rows::tests::{
        assert_product, assert_same_at_thread_counts, bf16_bytes, bf16_pairs_here, values,
    };

    /// One product with W rows `stride` elements apart from element `skip`.
    fn run(
        a: &[f32],
        (m, n, k): (usize, usize, usize),
        w: &[u8],
        skip: usize,
        stride: usize,
    ) -> Vec<f32> {
        let lines = Lines {
            bytes: w,
            dtype: DType::BF16,
            start: skip,
            stride,
        };
        let mut got = vec![f32::NAN; m * n];
        dot(a, (m, n, k), lines, 0.5, &mut got, &mut vec![7.0; 3]);
        got
    }

    /// Against an f64 reference, at sizes on and off every edge: K across the 32-element
    /// steps and the K block (masked tails), N across the 4-row groups and the tasks, M
    /// across the 4-row groups and the 256-row task columns; W rows padded and offset.
    #[test]
    fn matches_the_f64_product() {
        if !bf16_pairs_here() {
            return;
        }
        let (skip, pad) = (3usize, 5usize);
        for &(m, n, k) in &[
            (1, 1, 1),
            (1, 5, 31),
            (2, 4, 32),
            (3, 7, 33),
            (4, 63, 511),
            (5, 65, 513),
            (17, 130, 1025),
            (255, 9, 64),
            (257, 66, 100),
            (600, 3, 7),
        ] {
            let stride = k + pad;
            let a = values(m * k, 1);
            let w = values(skip + n * stride, 2);
            let got = run(&a, (m, n, k), &bf16_bytes(&w), skip, stride);
            assert_product(&got, &a, (m, n, k), 0.5, |kk, j| w[skip + j * stride + kk]);
        }
    }

    #[test]
    fn results_do_not_depend_on_the_thread_count() {
        if !bf16_pairs_here() {
            return;
        }
        let (m, n, k) = (300, 200, 700);
        let a = values(m * k, 5);
        let w = bf16_bytes(&values(n * k, 6));
        assert_same_at_thread_counts(|| run(&a, (m, n, k), &w, 0, k));
    }
}
