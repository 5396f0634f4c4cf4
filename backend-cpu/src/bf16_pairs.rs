//! Dot products of bf16 rows in 32-element pairs with AVX512_BF16 (`vdpbf16ps`), shared by
//! the GEMM's dot form (gemm_bf16_dot.rs) and the attention's scores (key_blocks.rs): a block
//! of 4 "W" rows x 4 "A" rows keeps its 16 sums in registers, 8 loads per 16 instructions of
//! 32 pairs each, the rows read straight from the tensors' bytes.
//!
//! Rounding: a product of two bf16 values is exact in f32; the instruction adds a pair's two
//! products into the lane one after the other (f32, round to nearest even) and treats
//! subnormal inputs and results as zero (below 2^-126 in magnitude), where widening to f32
//! keeps them. Sums run in a fixed order (lanes over K, K in order, then a fixed tree over the
//! lanes).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::{
    __m512, __m512bh, __m512i, _mm512_add_ps, _mm512_castpd_ps, _mm512_castps_pd, _mm512_dpbf16_ps,
    _mm512_loadu_si512, _mm512_maskz_loadu_epi16, _mm512_setzero_ps, _mm512_shuffle_f32x4,
    _mm512_storeu_ps, _mm512_unpackhi_pd, _mm512_unpackhi_ps, _mm512_unpacklo_pd,
    _mm512_unpacklo_ps, _mm_prefetch, _MM_HINT_T0,
};

/// Whether the CPU has AVX512_BF16 and the SIMD limit in force (`CALICO_CPU_SIMD`) allows
/// AVX-512.
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::simd::tier() == crate::simd::Tier::Avx512
            && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The bf16 bits of values widened from bf16 (exact: the upper half of each f32).
pub(crate) fn bf16_bits(x: &[f32]) -> impl Iterator<Item = u16> + '_ {
    x.iter().map(|v| (v.to_bits() >> 16) as u16)
}

thread_local! {
    /// Rows narrowed by [`with_bf16_bits`], kept by the calling thread for its next call.
    static BITS: std::cell::Cell<Vec<u16>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Calls `f` with [`bf16_bits`] of `x` in a buffer the calling thread keeps between calls.
/// The buffer is taken out while `f` runs: a thread waiting in a parallel loop inside `f` may
/// run another call's tasks, which then start from an empty buffer.
pub(crate) fn with_bf16_bits<R>(x: &[f32], f: impl FnOnce(&[u16]) -> R) -> R {
    let mut bits = BITS.take();
    bits.clear();
    bits.extend(bf16_bits(x));
    let out = f(&bits);
    BITS.set(bits);
    out
}

/// 4 W rows x 4 A rows of sums, 16 lanes each.
#[cfg(target_arch = "x86_64")]
pub(crate) type Block = [[__m512; 4]; 4];

/// How far ahead of its reads a prefetching pass asks for each W row's lines.
#[cfg(target_arch = "x86_64")]
const PREFETCH_BYTES: usize = 2048;

/// The 16 sums of a block, `[W row][A row]`, each over its 16 lanes in a fixed tree (three
/// levels of shuffles and adds over all 16 vectors at once: a third of the instructions of
/// 16 separate reductions).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) fn sums_of(block: &Block) -> [[f32; 4]; 4] {
    let v: [__m512; 16] = std::array::from_fn(|i| block[i / 4][i % 4]);
    // 1: two vectors' 256-bit halves added: [v0 lo + hi (2 lanes of 4) | v1 lo + hi].
    let halves: [__m512; 8] = std::array::from_fn(|i| {
        let (x, y) = (v[2 * i], v[2 * i + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(x, y),
        )
    });
    // 2: 128-bit quarters: each 128-bit lane l of quarters[i] holds 4 partial sums of
    // v[4i + l].
    let quarters: [__m512; 4] = std::array::from_fn(|i| {
        let (x, y) = (halves[2 * i], halves[2 * i + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
        )
    });
    // 3: the 4 values inside each 128-bit lane, pairs then the two halves: element e of lane l
    // ends as the sum of v[4e + l].
    let pair =
        |x: __m512, y: __m512| _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
    let (c0, c1) = (
        pair(quarters[0], quarters[1]),
        pair(quarters[2], quarters[3]),
    );
    let (c0, c1) = (_mm512_castps_pd(c0), _mm512_castps_pd(c1));
    let total = _mm512_add_ps(
        _mm512_castpd_ps(_mm512_unpacklo_pd(c0, c1)),
        _mm512_castpd_ps(_mm512_unpackhi_pd(c0, c1)),
    );
    let mut flat = [0.0f32; 16];
    // SAFETY: `flat` holds 16 f32; an unaligned store is allowed.
    unsafe { _mm512_storeu_ps(flat.as_mut_ptr(), total) };
    // flat[4 l + e] = sum of v[4 e + l] = block[e][l].
    std::array::from_fn(|r| std::array::from_fn(|c| flat[4 * c + r]))
}

/// Adds elements `from..to` of the dot products of W rows `w` with the first `C` A rows `a`
/// into `block` (columns past `C` untouched).
///
/// # Safety
/// The CPU has AVX-512 F/BW and AVX512_BF16; each pointer starts at least `to` readable bf16
/// elements (no alignment needed).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
pub(crate) unsafe fn accumulate<const C: usize, const PREFETCH: bool>(
    block: &mut Block,
    w: [*const u8; 4],
    a: [*const u8; 4],
    from: usize,
    to: usize,
) {
    // Copied into locals so that the sums live in registers for the whole block.
    let mut acc: [[__m512; C]; 4] = [[_mm512_setzero_ps(); C]; 4];
    for (dst, src) in acc.iter_mut().zip(block.iter()) {
        dst.copy_from_slice(&src[..C]);
    }
    let full = from + (to - from) / 32 * 32;
    let mut at = from;
    while at < full {
        // SAFETY: elements at..at + 32 of every row are below to (at + 32 <= full <= to).
        unsafe { step::<C, PREFETCH>(&mut acc, &w, &a, at * 2, None) };
        at += 32;
    }
    if full < to {
        let mask = (1u32 << (to - full)) - 1;
        // SAFETY: the mask keeps elements full..to; masked-off lanes are not read (AVX-512
        // masked loads do not fault on them).
        unsafe { step::<C, false>(&mut acc, &w, &a, full * 2, Some(mask)) };
    }
    for (dst, src) in block.iter_mut().zip(acc.iter()) {
        dst[..C].copy_from_slice(src);
    }
}

/// One K step of 32 elements at byte offset `byte` of every row (elements past a mask's bits
/// read as zero).
///
/// # Safety
/// The CPU has AVX-512 F/BW and AVX512_BF16; the 64 bytes at `byte` of every row (those the
/// mask keeps, if given) are readable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
unsafe fn step<const C: usize, const PREFETCH: bool>(
    acc: &mut [[__m512; C]; 4],
    w: &[*const u8; 4],
    a: &[*const u8; 4],
    byte: usize,
    mask: Option<u32>,
) {
    let load = |p: *const u8| -> __m512bh {
        let p = p.wrapping_add(byte);
        // SAFETY: readable by this function's contract; unaligned loads are allowed.
        as_pairs(unsafe {
            match mask {
                None => _mm512_loadu_si512(p as *const _),
                Some(mask) => _mm512_maskz_loadu_epi16(mask, p as *const i16),
            }
        })
    };
    if PREFETCH {
        for &p in w {
            // A prefetch reads nothing and never faults, wherever it points.
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(byte + PREFETCH_BYTES) as *const i8);
        }
    }
    let wv = [load(w[0]), load(w[1]), load(w[2]), load(w[3])];
    let mut av = [wv[0]; C];
    for (v, &p) in av.iter_mut().zip(a) {
        *v = load(p);
    }
    for (row, &wr) in acc.iter_mut().zip(&wv) {
        for (s, &ac) in row.iter_mut().zip(&av) {
            *s = _mm512_dpbf16_ps(*s, wr, ac);
        }
    }
}

/// `out[r * stride + j] = q_r . k_j` (f32 sums of bf16 pairs) for every key row `k_rows[j]`
/// and every query row `r` of `q` (`rows x dim` bf16 bits) in a group of 4 rows where
/// `wanted` holds for one; other entries are left as they were. Each key row is `dim` bf16
/// elements (2 `dim` bytes).
///
/// # Panics
/// Where [`available`] is false, or the slices are shorter than the shapes say.
pub(crate) fn dots(
    (q, rows, dim): (&[u16], usize, usize),
    k_rows: &[&[u8]],
    wanted: impl Fn(usize) -> bool,
    (out, stride): (&mut [f32], usize),
) {
    assert!(available(), "bf16_pairs::dots without AVX512_BF16");
    assert!(q.len() >= rows * dim && k_rows.len() <= stride);
    assert!(k_rows.iter().all(|k| k.len() >= 2 * dim));
    assert!(rows == 0 || out.len() >= (rows - 1) * stride + k_rows.len());
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `available()` detected AVX-512 F/BW and AVX512_BF16 (asserted); the slices hold
    // what the shapes say (asserted).
    unsafe {
        dots_x86((q, rows, dim), k_rows, wanted, (out, stride))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (wanted, out);
        unreachable!("available() is false off x86-64")
    }
}

/// [`dots`], on the CPU's AVX512_BF16.
///
/// # Safety
/// The CPU has AVX-512 F/BW and AVX512_BF16; the slices hold what [`dots`] asserts.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn dots_x86(
    (q, rows, dim): (&[u16], usize, usize),
    k_rows: &[&[u8]],
    wanted: impl Fn(usize) -> bool,
    (out, stride): (&mut [f32], usize),
) {
    let keys = k_rows.len();
    if keys == 0 {
        return;
    }
    for r0 in (0..rows).step_by(4) {
        let group = (rows - r0).min(4);
        if !(r0..r0 + group).any(&wanted) {
            continue;
        }
        // A short group repeats its last row; the copies' sums are not kept.
        let q4 = [0, 1, 2, 3]
            .map(|i| q.as_ptr().wrapping_add((r0 + i.min(group - 1)) * dim) as *const u8);
        for j0 in (0..keys).step_by(4) {
            let n = (keys - j0).min(4);
            let k4 = [0, 1, 2, 3].map(|i| k_rows[j0 + i.min(n - 1)].as_ptr());
            let mut block: Block = [[_mm512_setzero_ps(); 4]; 4];
            // SAFETY: the CPU has the features (this function's contract); every pointer
            // starts `dim` readable bf16 elements (rows of `q` below `rows`, key rows of at
            // least 2 dim bytes).
            unsafe {
                match group {
                    1 => accumulate::<1, false>(&mut block, k4, q4, 0, dim),
                    2 => accumulate::<2, false>(&mut block, k4, q4, 0, dim),
                    3 => accumulate::<3, false>(&mut block, k4, q4, 0, dim),
                    _ => accumulate::<4, false>(&mut block, k4, q4, 0, dim),
                }
            }
            let sums = sums_of(&block);
            for (j, key) in sums.iter().enumerate().take(n) {
                for (c, &v) in key.iter().enumerate().take(group) {
                    out[(r0 + c) * stride + j0 + j] = v;
                }
            }
        }
    }
}

/// The same 64 bytes read as 32 bf16 values.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn as_pairs(v: __m512i) -> __m512bh {
    // SAFETY: both types are 64 bytes of plain bits with no invalid patterns.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
}
