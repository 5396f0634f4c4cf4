//! The GEMM's axpy form (B = [K, N] rows, contiguous along N; gemm_few_rows.rs) for bf16 A and
//! bf16 B on x86-64 CPUs with AVX512_BF16. Two B rows (k, k + 1) are interleaved into the
//! (k, k + 1) pairs of 16 columns per vector and each A row's (k, k + 1) pair is broadcast, so
//! one `vdpbf16ps` adds two K steps into 16 outputs; a block of 4 A rows x 64 columns keeps its
//! 16 vectors of sums in registers (4 loads, 4 interleaves and 4 broadcasts per 16
//! instructions). The output lanes are the columns: no sum across lanes.
//!
//! Rounding as in bf16_pairs.rs (pairs of exact products added in turn, subnormals flushed).
//! Each output sums its K pairs in order, so results do not depend on the thread count.

#[cfg(target_arch = "x86_64")]
use crate::bf16_pairs::as_pairs;
use crate::bf16_pairs::with_bf16_bits;
use crate::gemm_few_rows::Lines;
use calico_core::DType;
use rayon::prelude::*;

/// Output columns per rayon task (4 vectors of 16).
const TASK_COLS: usize = 64;
/// A rows per rayon task.
const TASK_ROWS: usize = 256;
/// K rows of B per pass over the task's A rows (their 64 columns: 32 KiB, in L1).
const K_BLOCK: usize = 256;

/// `acc[i, j] = alpha * sum_k a[i, k] * b[k, j]`, as `gemm_few_rows::axpy`: `a` is `m x k`
/// row-major and holds bf16 values (widened, so the narrowing here is exact), B's row `k` is
/// line `k` of `b` (bf16, n elements), `acc` is `m x n` row-major, `tiles` scratch. Any M.
/// Call only where `bf16_pairs::available()` says so.
pub(crate) fn axpy(
    a: &[f32],
    (m, n, k): (usize, usize, usize),
    b: Lines,
    alpha: f32,
    acc: &mut [f32],
    tiles: &mut Vec<f32>,
) {
    assert!(crate::bf16_pairs::available() && b.dtype == DType::BF16);
    assert!(m > 0 && n > 0 && k > 0 && a.len() == m * k && acc.len() == m * n);
    // Every B row read lies inside b.bytes (the caller checked the view fits; the raw loads
    // below rely on it, so it is checked again here).
    let last_end = (b.start + (k - 1) * b.stride + n) * 2;
    assert!(b.bytes.len() >= last_end, "B rows past the tensor's bytes");
    let (n_tasks, rows) = (n.div_ceil(TASK_COLS), m.min(TASK_ROWS));
    let tile = rows * TASK_COLS;
    tiles.clear();
    tiles.resize(n_tasks * m.div_ceil(rows) * tile, 0.0);
    with_bf16_bits(a, |a_bits| {
        tiles
            .par_chunks_mut(tile)
            .enumerate()
            .for_each(|(task, out)| {
                let (first_row, first_col) = (task / n_tasks * rows, task % n_tasks * TASK_COLS);
                let (rows, cols) = ((m - first_row).min(rows), (n - first_col).min(TASK_COLS));
                let a_rows = &a_bits[first_row * k..(first_row + rows) * k];
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `available()` (asserted above) detected AVX-512 F/BW and AVX512_BF16, the
                // features `task_block` enables; `a_rows` holds `rows` rows of k; B's rows 0..k lie
                // in b.bytes (asserted above) and columns first_col..first_col + cols <= n.
                unsafe {
                    task_block(a_rows, (rows, k), &b, (first_col, cols), out)
                }
                #[cfg(not(target_arch = "x86_64"))]
                unreachable!("available() is false off x86-64 ({out:p})");
            });
    });
    // Tile (i / rows, j / TASK_COLS) holds its A rows' 64 sums each.
    acc.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
        let (mt, ii) = (i / rows, i % rows);
        for (t, part) in row.chunks_mut(TASK_COLS).enumerate() {
            let tile = &tiles[(mt * n_tasks + t) * tile + ii * TASK_COLS..];
            for (v, &s) in part.iter_mut().zip(tile) {
                *v = alpha * s;
            }
        }
    });
}

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::{
    __m512, __m512bh, __m512i, _mm512_dpbf16_ps, _mm512_maskz_loadu_epi16,
    _mm512_permutex2var_epi16, _mm512_set1_epi32, _mm512_setzero_ps, _mm512_setzero_si512,
    _mm512_storeu_ps,
};

/// 4 A rows x 4 vectors of 16 columns.
#[cfg(target_arch = "x86_64")]
type Sums = [[__m512; 4]; 4];

/// Sums of A rows `0..rows` (`a`, `rows x k`) times B's columns `first..first + cols` into
/// `out` (row `i` at `i * TASK_COLS`).
///
/// # Safety
/// The CPU has AVX-512 F/BW and AVX512_BF16; `a` holds `rows` rows of `k`; B's rows `0..k`
/// lie inside `b.bytes`, each at least `first + cols` elements long.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn task_block(
    a: &[u16],
    (rows, k): (usize, usize),
    b: &Lines,
    (first, cols): (usize, usize),
    out: &mut [f32],
) {
    // Element masks of the column block's two 32-element halves.
    let half_mask = |h: usize| -> u32 {
        let n = cols.saturating_sub(32 * h).min(32);
        if n == 32 {
            u32::MAX
        } else {
            (1u32 << n) - 1
        }
    };
    let masks = [half_mask(0), half_mask(1)];
    let b_row = |kk: usize| {
        b.bytes
            .as_ptr()
            .wrapping_add((b.start + kk * b.stride + first) * 2)
    };
    let groups = rows.div_ceil(4);
    let mut sums: Vec<Sums> = vec![[[_mm512_setzero_ps(); 4]; 4]; groups];
    for from in (0..k).step_by(K_BLOCK) {
        let to = (from + K_BLOCK).min(k);
        for (g, block) in sums.iter_mut().enumerate() {
            let r0 = 4 * g;
            // A short last group repeats its last row; the copies' sums are not kept.
            let a4 = [0, 1, 2, 3].map(|i| a.as_ptr().wrapping_add((r0 + i).min(rows - 1) * k));
            // SAFETY: the features are there (this function's contract); A rows below `rows`
            // hold k elements, B rows from..to < k hold the block's columns (masked past
            // `cols`).
            unsafe { accumulate(block, a4, &b_row, masks, (from, to)) };
        }
    }
    for (g, block) in sums.iter().enumerate() {
        for (r, row) in block.iter().enumerate().take(rows - 4 * g) {
            let at = (4 * g + r) * TASK_COLS;
            for (v, &s) in row.iter().enumerate() {
                // SAFETY: `out` holds rows x TASK_COLS f32 and v * 16 + 16 <= TASK_COLS.
                unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(at + 16 * v), s) };
            }
        }
    }
}

/// Adds K rows `from..to` of A rows `a` times the block's columns into `block`.
///
/// # Safety
/// The CPU has AVX-512 F/BW and AVX512_BF16; each A pointer starts `to` readable elements;
/// `b_row(kk)` for kk in `from..to` starts the block's readable columns (the masks' bits).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
unsafe fn accumulate(
    block: &mut Sums,
    a: [*const u16; 4],
    b_row: &impl Fn(usize) -> *const u8,
    masks: [u32; 2],
    (from, to): (usize, usize),
) {
    let mut acc = *block;
    let (lo, hi) = (interleave_index(0), interleave_index(16));
    let load = |kk: usize, h: usize| -> __m512i {
        // SAFETY: the masked bits are readable columns of row kk (the contract).
        unsafe { _mm512_maskz_loadu_epi16(masks[h], b_row(kk).add(64 * h) as *const i16) }
    };
    let mut kk = from;
    while kk < to {
        let pair = kk + 1 < to;
        let (r0, r1) = (
            [load(kk, 0), load(kk, 1)],
            if pair {
                [load(kk + 1, 0), load(kk + 1, 1)]
            } else {
                [_mm512_setzero_si512(); 2]
            },
        );
        let bv: [__m512bh; 4] = [
            _mm512_permutex2var_epi16(r0[0], lo, r1[0]),
            _mm512_permutex2var_epi16(r0[0], hi, r1[0]),
            _mm512_permutex2var_epi16(r0[1], lo, r1[1]),
            _mm512_permutex2var_epi16(r0[1], hi, r1[1]),
        ]
        .map(as_pairs);
        for (row, &ap) in acc.iter_mut().zip(&a) {
            // SAFETY: elements kk (and kk + 1 when paired) of the row are below `to` <= k.
            let (x0, x1) = unsafe { (*ap.add(kk), if pair { *ap.add(kk + 1) } else { 0 }) };
            let av = as_pairs(_mm512_set1_epi32(
                (u32::from(x1) << 16 | u32::from(x0)) as i32,
            ));
            for (s, &v) in row.iter_mut().zip(&bv) {
                *s = _mm512_dpbf16_ps(*s, v, av);
            }
        }
        kk += 2;
    }
    *block = acc;
}

/// Permutation indices that interleave two rows' 32 bf16 columns into the (row 0, row 1)
/// pairs of 16 columns from `first`: element 2c is row 0's column first + c, 2c + 1 row 1's
/// (indices from 32 pick the second operand).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn interleave_index(first: usize) -> __m512i {
    let e: [u16; 32] = std::array::from_fn(|e| (first + e / 2 + 32 * (e % 2)) as u16);
    // SAFETY: 32 u16 are 64 bytes of plain bits, as __m512i is.
    unsafe { std::mem::transmute::<[u16; 32], __m512i>(e) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm_few_rows::tests::{
        assert_product, assert_same_at_thread_counts, bf16_bytes, bf16_pairs_here, values,
    };

    /// One product with B rows `stride` elements apart from element `skip`.
    fn run(
        a: &[f32],
        (m, n, k): (usize, usize, usize),
        b: &[u8],
        skip: usize,
        stride: usize,
    ) -> Vec<f32> {
        let lines = Lines {
            bytes: b,
            dtype: DType::BF16,
            start: skip,
            stride,
        };
        let mut got = vec![f32::NAN; m * n];
        axpy(a, (m, n, k), lines, 0.5, &mut got, &mut vec![7.0; 3]);
        got
    }

    /// Against an f64 reference, at sizes on and off every edge: K odd and even, across the K
    /// block; N across the 16-column vectors, the 32-element halves and the 64-column tasks
    /// (masked); M across the 4-row groups and the 256-row tasks; B rows padded and offset.
    #[test]
    fn matches_the_f64_product() {
        if !bf16_pairs_here() {
            return;
        }
        let (skip, pad) = (3usize, 5usize);
        for &(m, n, k) in &[
            (1, 1, 1),
            (1, 15, 2),
            (2, 16, 3),
            (3, 17, 255),
            (4, 33, 256),
            (5, 64, 257),
            (6, 65, 513),
            (17, 130, 31),
            (257, 70, 9),
            (600, 3, 4),
        ] {
            let stride = n + pad;
            let a = values(m * k, 3);
            let b = values(skip + k * stride, 4);
            let got = run(&a, (m, n, k), &bf16_bytes(&b), skip, stride);
            assert_product(&got, &a, (m, n, k), 0.5, |kk, j| b[skip + kk * stride + j]);
        }
    }

    #[test]
    fn results_do_not_depend_on_the_thread_count() {
        if !bf16_pairs_here() {
            return;
        }
        let (m, n, k) = (300, 200, 701);
        let a = values(m * k, 7);
        let b = bf16_bytes(&values(k * n, 8));
        assert_same_at_thread_counts(|| run(&a, (m, n, k), &b, 0, n));
    }
}
