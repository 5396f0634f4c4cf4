//! GEMMs with few rows of A (decode shapes, M up to [`MAX_M`]): every element of B is read
//! once, straight from the tensor's bytes, and widened once, where the general path first
//! widens all of B into an f32 copy (for a 4096 x 4096 weight, 64 MiB written and read again
//! per call, which made a decode GEMV ~20x slower than its memory read). Two forms, by which
//! of B's dimensions is contiguous:
//! - dot: B = W^T with W an [N, K] weight (torch Linear). Four W rows are widened a block of K
//!   at a time and every A row is multiplied against them while they sit in L1.
//! - axpy: B is [K, N] rows. Each B row is widened a block of N at a time and added into every
//!   A row's block of output, scaled by A's element.
//!
//! With bf16 A and B on CPUs with AVX512_BF16, gemm.rs takes both forms to bf16 pair kernels
//! instead (gemm_bf16_dot.rs, gemm_bf16_axpy.rs).
//!
//! Work is split over N. Each output's sum runs in a fixed order (lanes over K, the lanes
//! added in a fixed tree, K blocks in order), so results do not depend on the thread count.

use crate::gemm::load_line;
use crate::lanes::{self, W};
use crate::simd::{vectorised_fma, MulAdd};
use calico_core::DType;
use rayon::prelude::*;

/// The largest M this path takes. On the 2-core development machine (AVX-512, release build,
/// bf16) it ran every shape measured up to M = 256 at least as fast as the general path
/// (4096 x 4096 weight: M = 1 2.5 against 6.7 ms, M = 16 8.3 against 23.7, M = 64 18.9 against
/// 37.8, M = 256 83 against 87; 256^3 0.64 against 1.18 ms); past it the general path's packed
/// kernels reuse each widened element over enough rows to win.
pub(crate) const MAX_M: usize = 256;

/// W rows multiplied together in the dot form.
const ROWS: usize = 4;
/// K elements of each W row widened at a time (4 rows x 1024 x 4 B = 16 KiB, in L1).
const K_BLOCK: usize = 1024;
/// W rows (outputs) per rayon task in the dot form.
const DOT_TASK: usize = 64;
/// Output columns per rayon task in the axpy form.
const AXPY_TASK: usize = 256;

/// Lines of equal length in a tensor's bytes: element `j` of line `i` is element
/// `start + i * stride + j` (the line's elements are contiguous).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lines<'a> {
    pub bytes: &'a [u8],
    pub dtype: DType,
    pub start: usize,
    pub stride: usize,
}

impl Lines<'_> {
    /// Widens elements `from..from + dst.len()` of line `line` into `dst`.
    #[inline(always)]
    fn widen(&self, line: usize, from: usize, dst: &mut [f32]) {
        let at = self.start + line * self.stride + from;
        load_line(self.bytes, self.dtype, at, 1, dst);
    }
}

/// `acc[i, j] = alpha * sum_k a[i, k] * w[j, k]`: `a` is `m x k` row-major f32, W's row `j`
/// is line `j` of `w` (k elements), `acc` is `m x n` row-major; `acc_t` is scratch.
pub(crate) fn dot(
    a: &[f32],
    (m, n, k): (usize, usize, usize),
    w: Lines,
    alpha: f32,
    acc: &mut [f32],
    acc_t: &mut Vec<f32>,
) {
    // Each task owns DOT_TASK whole rows of the transposed result (n x m).
    acc_t.clear();
    acc_t.resize(n * m, 0.0);
    acc_t
        .par_chunks_mut(DOT_TASK * m)
        .enumerate()
        .for_each_init(
            || vec![0.0f32; ROWS * K_BLOCK],
            |scratch, (task, out)| {
                let first = task * DOT_TASK;
                vectorised_fma!(|M| dot_rows::<M>(a, (m, k), &w, first, scratch, out));
            },
        );
    acc.par_chunks_mut(n.max(1))
        .enumerate()
        .for_each(|(i, row)| {
            for (j, v) in row.iter_mut().enumerate() {
                *v = alpha * acc_t[j * m + i];
            }
        });
}

/// The outputs of W rows `first..first + out.len() / m` into `out` (one row of `m` per W row).
#[inline(always)]
fn dot_rows<M: MulAdd>(
    a: &[f32],
    (m, k): (usize, usize),
    w: &Lines,
    first: usize,
    scratch: &mut [f32],
    out: &mut [f32],
) {
    let rows = out.len() / m;
    for r0 in (0..rows).step_by(ROWS) {
        let r = ROWS.min(rows - r0);
        for kb in (0..k).step_by(K_BLOCK) {
            let kc = K_BLOCK.min(k - kb);
            for (i, line) in scratch.chunks_exact_mut(K_BLOCK).enumerate() {
                if i < r {
                    w.widen(first + r0 + i, kb, &mut line[..kc]);
                } else {
                    // A short last group multiplies zero rows and keeps none of it.
                    line[..kc].fill(0.0);
                }
            }
            let [w0, w1, w2, w3] = [0, 1, 2, 3].map(|i| &scratch[i * K_BLOCK..i * K_BLOCK + kc]);
            for i in 0..m {
                let x = &a[i * k + kb..i * k + kb + kc];
                let sums = dot4::<M>(x, [w0, w1, w2, w3]);
                for (q, s) in sums.iter().take(r).enumerate() {
                    out[(r0 + q) * m + i] += s;
                }
            }
        }
    }
}

/// `v` in chunks of W elements.
#[inline(always)]
fn chunks(v: &[f32]) -> std::slice::ChunksExact<'_, f32> {
    v.chunks_exact(W)
}

/// The four dot products of `x` with `w[0..4]` (each as long as `x`).
#[inline(always)]
fn dot4<M: MulAdd>(x: &[f32], [w0, w1, w2, w3]: [&[f32]; ROWS]) -> [f32; ROWS] {
    // Four named accumulators (not an array of them) stay in registers.
    let (mut s0, mut s1, mut s2, mut s3) = ([0.0f32; W], [0.0f32; W], [0.0f32; W], [0.0f32; W]);
    for ((((xv, v0), v1), v2), v3) in chunks(x)
        .zip(chunks(w0))
        .zip(chunks(w1))
        .zip(chunks(w2))
        .zip(chunks(w3))
    {
        for l in 0..W {
            s0[l] = M::mul_add(xv[l], v0[l], s0[l]);
            s1[l] = M::mul_add(xv[l], v1[l], s1[l]);
            s2[l] = M::mul_add(xv[l], v2[l], s2[l]);
            s3[l] = M::mul_add(xv[l], v3[l], s3[l]);
        }
    }
    let full = x.len() / W * W;
    let mut out = [s0, s1, s2, s3].map(lanes::hsum);
    for (o, wr) in out.iter_mut().zip([w0, w1, w2, w3]) {
        let mut tail = 0.0f32;
        for (&xj, &wj) in x[full..].iter().zip(&wr[full..]) {
            tail = M::mul_add(xj, wj, tail);
        }
        *o += tail;
    }
    out
}

/// `acc[i, j] = alpha * sum_k a[i, k] * b[k, j]`: `a` is `m x k` row-major f32, B's row `k`
/// is line `k` of `b` (n elements), `acc` is `m x n` row-major; `blocks` is scratch.
pub(crate) fn axpy(
    a: &[f32],
    (m, n, k): (usize, usize, usize),
    b: Lines,
    alpha: f32,
    acc: &mut [f32],
    blocks: &mut Vec<f32>,
) {
    // Task t computes the m x cols block of columns t * AXPY_TASK.., stored block after block.
    blocks.clear();
    blocks.resize(m * n, 0.0);
    blocks
        .par_chunks_mut(AXPY_TASK * m)
        .enumerate()
        .for_each_init(
            || vec![0.0f32; AXPY_TASK],
            |b_row, (task, block)| {
                let first = task * AXPY_TASK;
                let cols = block.len() / m;
                vectorised_fma!(|M| {
                    for kk in 0..k {
                        b.widen(kk, first, &mut b_row[..cols]);
                        for (i, out) in block.chunks_exact_mut(cols).enumerate() {
                            let s = a[i * k + kk];
                            for (o, &v) in out.iter_mut().zip(&b_row[..cols]) {
                                *o = M::mul_add(s, v, *o);
                            }
                        }
                    }
                });
            },
        );
    acc.par_chunks_mut(n.max(1))
        .enumerate()
        .for_each(|(i, row)| {
            for (t, cols) in row.chunks_mut(AXPY_TASK).enumerate() {
                let width = cols.len();
                let block = &blocks[t * AXPY_TASK * m..];
                for (j, v) in cols.iter_mut().enumerate() {
                    *v = alpha * block[i * width + j];
                }
            }
        });
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Values in [-1, 1) from a fixed sequence, exact in bf16.
    pub(crate) fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                half::bf16::from_f32(((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0).to_f32()
            })
            .collect()
    }

    pub(crate) fn bf16_bytes(v: &[f32]) -> Vec<u8> {
        v.iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_bits().to_ne_bytes())
            .collect()
    }

    /// Both forms against an f64 reference, at sizes on and off every block edge: K across the
    /// lanes and the K block, N across the four-row groups and the tasks, M from 1.
    #[test]
    fn both_forms_match_the_f64_product() {
        let (alpha, skip) = (0.75f32, 3usize);
        for &(m, n, k) in &[
            (1, 1, 1),
            (1, 5, 17),
            (3, 7, 1023),
            (2, 65, 1025),
            (5, 257, 33),
            (1, 4, 2049),
            (17, 300, 100),
        ] {
            let a = values(m * k, 1);
            let b = values(n * k + skip, 2);
            let bytes = bf16_bytes(&b);
            // W [n, k] with rows `k + 0` apart (dot), the same numbers read as B [k, n] rows
            // (axpy) with a 3-element offset.
            let w = Lines {
                bytes: &bytes,
                dtype: DType::BF16,
                start: skip,
                stride: k,
            };
            let mut got = vec![f32::NAN; m * n];
            dot(&a, (m, n, k), w, alpha, &mut got, &mut Vec::new());
            assert_product(&got, &a, (m, n, k), alpha as f64, |kk, j| {
                b[skip + j * k + kk]
            });

            let rows = Lines { stride: n, ..w };
            let mut got = vec![f32::NAN; m * n];
            let scratch = &mut vec![1.0; 3];
            axpy(&a, (m, n, k), rows, alpha, &mut got, scratch);
            assert_product(&got, &a, (m, n, k), alpha as f64, |kk, j| {
                b[skip + kk * n + j]
            });
        }
    }

    /// f32 sums of k products of values below 1: ~k * 2^-24 of sum |terms| <= k.
    fn product_tolerance(k: usize) -> f64 {
        4.0 * k as f64 * f64::from(f32::EPSILON)
    }

    /// Asserts that `got` (m x n, row-major) is `alpha * sum_k a[i, k] * b(k, j)` within f32
    /// rounding, `a` being m x k row-major.
    pub(crate) fn assert_product(
        got: &[f32],
        a: &[f32],
        (m, n, k): (usize, usize, usize),
        alpha: f64,
        b: impl Fn(usize, usize) -> f32,
    ) {
        let tol = product_tolerance(k);
        for i in 0..m {
            for j in 0..n {
                let sum: f64 = (0..k)
                    .map(|kk| a[i * k + kk] as f64 * b(kk, j) as f64)
                    .sum();
                let (g, want) = (got[i * n + j] as f64, alpha * sum);
                assert!(
                    (g - want).abs() <= tol,
                    "{m}x{n}x{k}: ({i}, {j}) is {g}, expected {want} (tolerance {tol})"
                );
            }
        }
    }

    /// `run` in pools of 1 and 3 threads gives finite values and the same bits.
    pub(crate) fn assert_same_at_thread_counts(run: impl Fn() -> Vec<f32> + Send + Sync) {
        let on = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap_or_else(|e| panic!("thread pool: {e}"));
            pool.install(&run)
        };
        let one = on(1);
        assert!(one.iter().all(|v| v.is_finite()));
        assert_eq!(one, on(3));
    }

    /// Whether the bf16 pair forms run here; says so when they do not.
    pub(crate) fn bf16_pairs_here() -> bool {
        let here = crate::bf16_pairs::available();
        if !here {
            println!("skipped: this CPU (or CALICO_CPU_SIMD) has no AVX512_BF16");
        }
        here
    }

    #[test]
    fn results_do_not_depend_on_the_thread_count() {
        let (m, n, k) = (3, 300, 3000);
        let a = values(m * k, 5);
        let bytes = bf16_bytes(&values(n * k, 6));
        let w = Lines {
            bytes: &bytes,
            dtype: DType::BF16,
            start: 0,
            stride: k,
        };
        assert_same_at_thread_counts(|| {
            let mut out = vec![0.0f32; m * n];
            dot(&a, (m, n, k), w, 1.0, &mut out, &mut Vec::new());
            out
        });
    }
}
