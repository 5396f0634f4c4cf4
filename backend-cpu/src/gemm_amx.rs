//! bf16 GEMM on Intel AMX tiles (Sapphire Rapids and later Xeons), for both few-rows forms
//! of gemm.rs: W as [N, K] rows (torch Linear, the dot form) and B as [K, N] rows (the axpy
//! form).
//!
//! One `tdpbf16ps` adds a 16 x 32 bf16 tile times a 32 x 16 bf16 tile into a 16 x 16 f32 tile:
//! 16384 FLOPs, one every 16 cycles per core (3.3 TFLOP/s per core at 3.3 GHz, measured with
//! the operands held in tiles). A 1 KiB tile load took ~55 cycles on the development Xeon, so
//! with four loads per four products (2 x 2 output tiles, the most 8 tiles allow) the loads
//! bound the kernel at ~1 TFLOP/s per core (docs/perf-log.md, session 32).
//! The second operand is stored "pair-interleaved" (VNNI): row `k2` holds, for each of its 16
//! columns, the elements `2 k2` and `2 k2 + 1` side by side. The kernel computes
//! `out[R, C] = X[R, K] Y[K, C]` with X read row-major and Y pair-interleaved:
//! - dot form: X = W itself (tiles loaded straight from the weight's rows, any row stride),
//!   Y = A transposed into pairs (packed once per call: A is the small operand), so the tiles
//!   hold D transposed;
//! - axpy form: X = A (packed, padded to whole tiles), Y = B with rows `2 k2` and `2 k2 + 1`
//!   interleaved (packed once per call).
//!
//! Tiles of four outputs (2 X tiles x 2 Y tiles) run over the whole K in one `asm!` block that
//! configures the tiles, loops, stores the four f32 tiles and releases the tile state: no tile
//! state lives across Rust code. Stable Rust has no AMX intrinsics; the assembler does.
//!
//! Rounding: as `vdpbf16ps` (bf16_pairs.rs): products are exact, sums are f32, subnormal
//! inputs and results are flushed to zero. Each output is summed over K in order by one task,
//! so results do not depend on the thread count.

use crate::gemm_few_rows::Lines;
use calico_core::DType;
use rayon::prelude::*;

/// Rows of X (16 per tile) per rayon task.
const TASK_R: usize = 64;
/// Columns of Y per rayon task.
const TASK_C: usize = 256;
/// Elements of K per tile step.
const KS: usize = 32;
/// Rows (and f32 columns) of a tile.
const T: usize = 16;

/// Whether this CPU and OS run AMX bf16 tiles here: the CPU reports AMX-TILE and AMX-BF16,
/// Linux grants the process the tile state (`arch_prctl(ARCH_REQ_XCOMP_PERM)`, asked once),
/// the SIMD limit in force allows AVX-512 (`CALICO_CPU_SIMD`: AMX counts as part of that tier)
/// and `CALICO_CPU_AMX` is not `0` or `off`.
pub(crate) fn available() -> bool {
    // The environment, the CPU and the OS are asked once; the SIMD limit can change.
    static GRANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    crate::bf16_pairs::available()
        && *GRANTED.get_or_init(|| {
            let allowed = !matches!(std::env::var("CALICO_CPU_AMX").as_deref(), Ok("0" | "off"));
            #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
            {
                allowed && cpu_has_amx_bf16() && request_tile_state()
            }
            #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
            {
                let _ = allowed;
                false
            }
        })
}

/// Whether the few-rows forms should take the AMX path at M rows: below 8 the tiles' 16
/// columns of A rows are mostly padding, and the pair dot products read W as fast.
pub(crate) fn takes(m: usize) -> bool {
    m >= MIN_M && available()
}

/// The fewest A rows that go to the tiles (measured: docs/perf-log.md, session 32).
const MIN_M: usize = 8;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn cpu_has_amx_bf16() -> bool {
    use std::arch::x86_64::__cpuid_count;
    // `cpuid` exists on every x86-64 CPU (a safe intrinsic); a leaf past the highest one
    // returns another leaf's data, so leaf 0's maximum is checked first.
    let (max_leaf, leaf7) = (__cpuid_count(0, 0).eax, __cpuid_count(7, 0));
    // Leaf 7 EDX: bit 22 AMX-BF16, bit 24 AMX-TILE.
    max_leaf >= 7 && leaf7.edx & (1 << 22) != 0 && leaf7.edx & (1 << 24) != 0
}

/// Asks Linux for the tile data state (XTILEDATA, feature 18) for this process; false where the
/// kernel refuses or predates it (before 5.16).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_state() -> bool {
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: arch_prctl(ARCH_REQ_XCOMP_PERM, 18) only changes which extended states the
    // process may use; it reads and writes no memory of ours. The syscall instruction clobbers
    // rcx and r11, declared here; rax carries the number in and the result out.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

/// The X operand of one call: where tile (row tile `rt`, K step `s`) is read from.
struct XSource<'a> {
    /// Full tiles' bodies (K steps below `K / 32`): the base pointer and row stride in bytes.
    base: *const u8,
    stride: usize,
    /// Row tiles read from `base` (the rest come from `tail_rows`).
    full_tiles: usize,
    /// The last, partial row tile's body, zero-padded to 16 rows: row stride `k / 32 * 64`.
    tail_rows: &'a [u16],
    /// Every row tile's last K step (K % 32 elements, zero-padded to 32): 64 bytes a row,
    /// tile `rt` at `rt * 1024` bytes, one zero tile more than there are row tiles. Empty when
    /// K is a multiple of 32.
    k_tail: &'a [u16],
}

// SAFETY: `base` points into a byte slice borrowed for the call (the weight's or a packed
// buffer); tasks only read through it.
unsafe impl Sync for XSource<'_> {}

impl XSource<'_> {
    /// The body pointer and row stride of row tile `rt`.
    fn body(&self, rt: usize) -> (*const u8, usize) {
        if rt < self.full_tiles {
            (self.base.wrapping_add(rt * T * self.stride), self.stride)
        } else {
            (self.tail_rows.as_ptr().cast(), self.tail_rows.len() / T * 2)
        }
    }

    /// Row tile `rt`'s last K step, or null when K is a multiple of 32.
    fn tail(&self, rt: usize) -> *const u8 {
        if self.k_tail.is_empty() {
            std::ptr::null()
        } else {
            self.k_tail[rt * T * KS..].as_ptr().cast()
        }
    }
}

/// The Y operand: pair-interleaved, tile (column tile `ct`, K step `s`) at
/// `ct * ct_bytes + s * step_bytes`, rows `stride` bytes apart.
struct YSource<'a> {
    packed: &'a [u32],
    ct_bytes: usize,
    step_bytes: usize,
    stride: usize,
}

/// How the outputs `out[r, c]` of [`multiply`] land in `acc`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Orient {
    /// `acc[r, c]`.
    AsIs,
    /// `acc[c, r]` (the dot form's tiles hold D transposed).
    Transposed,
}

/// `acc = alpha * out` (oriented by `orient`), `out[r, c] = sum_k X[r, k] Y[k, c]` for `rows` x
/// `cols` outputs over `k`. Each task writes its own tile of `tiles` (TASK_R x TASK_C f32, laid
/// out as `acc` will be), then a pass over `acc`'s rows gathers them.
#[allow(clippy::too_many_arguments)]
fn multiply(
    x: &XSource,
    y: &YSource,
    (rows, cols, k): (usize, usize, usize),
    tiles: &mut Vec<f32>,
    orient: Orient,
    alpha: f32,
    acc: &mut [f32],
) {
    let steps = k / KS;
    let (r_tasks, c_tasks) = (rows.div_ceil(TASK_R), cols.div_ceil(TASK_C));
    let tile_len = TASK_R * TASK_C;
    // Not cleared: the last pass reads only what the tasks wrote.
    if tiles.len() < r_tasks * c_tasks * tile_len {
        tiles.resize(r_tasks * c_tasks * tile_len, 0.0);
    }
    let tiles = &mut tiles[..r_tasks * c_tasks * tile_len];
    tiles
        .par_chunks_mut(tile_len)
        .enumerate()
        .for_each(|(task, out)| {
            let (r0, c0) = (task / c_tasks * TASK_R, task % c_tasks * TASK_C);
            let (r_tiles, c_tiles) = (
                (rows - r0).min(TASK_R).div_ceil(T),
                (cols - c0).min(TASK_C).div_ceil(T),
            );
            let mut four = Four::default();
            let mut rp = 0;
            while rp < r_tiles {
                let rt = r0 / T + rp;
                // A pair of full tiles shares one stride; a partial tile runs alone (twice).
                let pair = rp + 1 < r_tiles && rt + 1 < x.full_tiles;
                let (x0, x_stride) = x.body(rt);
                let x1 = if pair { x.body(rt + 1).0 } else { x0 };
                for cp in (0..c_tiles).step_by(2) {
                    let ct = c0 / T + cp;
                    let y0 = y.packed.as_ptr().cast::<u8>().wrapping_add(ct * y.ct_bytes);
                    let y1 = if cp + 1 < c_tiles {
                        y0.wrapping_add(y.ct_bytes)
                    } else {
                        y0
                    };
                    // SAFETY: (pointers) every X body tile lies inside the weight's bytes
                    // (full tiles: checked by the callers) or `tail_rows` (16 rows of
                    // `steps` steps), every tail tile (and the one after it) inside `k_tail`,
                    // every Y tile of `steps` steps (plus one where there is a K tail) inside
                    // `packed` (the packers size them so); (CPU) `available()` held before any
                    // caller got here.
                    unsafe {
                        four.run(
                            [x0, x1],
                            x_stride,
                            x.tail(rt),
                            [y0, y1],
                            (y.stride, y.step_bytes),
                            steps,
                        )
                    };
                    for (q, tile) in four.out.iter().enumerate() {
                        let (dr, dc) = (q / 2, q % 2);
                        if (dr == 1 && !pair) || (dc == 1 && cp + 1 >= c_tiles) {
                            continue;
                        }
                        let (tr, tc) = ((rp + dr) * T, (cp + dc) * T);
                        match orient {
                            // The tile's rows up to `rows` (r0 + tr < rows: the tile is live).
                            Orient::AsIs => {
                                let live = tile.chunks_exact(T).take(rows - r0 - tr);
                                for (i, row) in live.enumerate() {
                                    out[(tr + i) * TASK_C + tc..][..T].copy_from_slice(row);
                                }
                            }
                            // Whole tiles: rows past `rows` land in the task's tile too, where
                            // no one reads them.
                            Orient::Transposed => {
                                let t = transpose_16x16(tile);
                                for (j, col) in t.chunks_exact(T).enumerate() {
                                    out[(tc + j) * TASK_R + tr..][..T].copy_from_slice(col);
                                }
                            }
                        }
                    }
                }
                rp += if pair { 2 } else { 1 };
            }
        });
    let tile = |rt: usize, ct: usize| &tiles[(rt * c_tasks + ct) * tile_len..][..tile_len];
    match orient {
        Orient::AsIs => acc.par_chunks_mut(cols).enumerate().for_each(|(r, row)| {
            let (rt, rr) = (r / TASK_R, r % TASK_R);
            for (ct, part) in row.chunks_mut(TASK_C).enumerate() {
                let from = &tile(rt, ct)[rr * TASK_C..][..part.len()];
                part.iter_mut().zip(from).for_each(|(d, &v)| *d = alpha * v);
            }
        }),
        Orient::Transposed => acc.par_chunks_mut(rows).enumerate().for_each(|(c, row)| {
            let (ct, cc) = (c / TASK_C, c % TASK_C);
            for (rt, part) in row.chunks_mut(TASK_R).enumerate() {
                let from = &tile(rt, ct)[cc * TASK_R..][..part.len()];
                part.iter_mut().zip(from).for_each(|(d, &v)| *d = alpha * v);
            }
        }),
    }
}

/// Four output tiles and the tile configuration, 64-byte aligned (the configuration is read
/// from memory, the tiles written to it).
#[repr(C, align(64))]
struct Four {
    config: [u8; 64],
    out: [[f32; T * T]; 4],
}

impl Default for Four {
    fn default() -> Self {
        // Palette 1; tiles 0-7 all 16 rows of 64 bytes (f32 outputs, bf16 operands).
        let mut config = [0u8; 64];
        config[0] = 1;
        for t in 0..8 {
            config[16 + 2 * t] = 64;
            config[48 + t] = T as u8;
        }
        Four {
            config,
            out: [[0.0; T * T]; 4],
        }
    }
}

impl Four {
    /// `out[2 i + j] = X_i Y_j` over `steps` K steps (plus the tail step when `x_tail` is not
    /// null): X tile `i` at `x[i] + s * 64` (rows `x_stride` apart), its tail at
    /// `x_tail + i * 1024` (rows 64 apart); Y tile `j` at `y[j] + s * y_step` (rows `y_stride`
    /// apart), the tail step's after the last.
    ///
    /// # Safety
    /// The CPU runs AMX-BF16 and the OS granted the tile state ([`available`]); every tile
    /// named above lies in readable memory.
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn run(
        &mut self,
        x: [*const u8; 2],
        x_stride: usize,
        x_tail: *const u8,
        y: [*const u8; 2],
        (y_stride, y_step): (usize, usize),
        steps: usize,
    ) {
        let base: *mut u8 = (self as *mut Four).cast();
        // SAFETY: the caller's contract covers the loads; the four stores write 4 KiB at
        // `base + 64`, exactly `self.out`; the configuration at `base` is valid (palette 1,
        // 16 x 64-byte tiles). The block starts by configuring the tiles and ends by
        // releasing them, so no tile state outlives it.
        unsafe {
            std::arch::asm!(
                "ldtilecfg [{base}]",
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                "test {steps}, {steps}",
                "jz 3f",
                "2:",
                "tileloadd tmm4, [{x0} + {xs}*1]",
                "tileloadd tmm6, [{y0} + {ys}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tileloadd tmm7, [{y1} + {ys}*1]",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tileloadd tmm5, [{x1} + {xs}*1]",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                "add {x0}, 64",
                "add {x1}, 64",
                "add {y0}, {ystep}",
                "add {y1}, {ystep}",
                "dec {steps}",
                "jnz 2b",
                "3:",
                "test {xt}, {xt}",
                "jz 4f",
                "mov {xs}, 64",
                "tileloadd tmm4, [{xt} + {xs}*1]",
                "tileloadd tmm6, [{y0} + {ys}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tileloadd tmm7, [{y1} + {ys}*1]",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "add {xt}, 1024",
                "tileloadd tmm5, [{xt} + {xs}*1]",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                "4:",
                "mov {xs}, 64",
                "tilestored [{base} + {xs}*1 + 64], tmm0",
                "tilestored [{base} + {xs}*1 + 1088], tmm1",
                "tilestored [{base} + {xs}*1 + 2112], tmm2",
                "tilestored [{base} + {xs}*1 + 3136], tmm3",
                "tilerelease",
                base = in(reg) base,
                x0 = inout(reg) x[0] => _,
                x1 = inout(reg) x[1] => _,
                xs = inout(reg) x_stride => _,
                xt = inout(reg) x_tail => _,
                y0 = inout(reg) y[0] => _,
                y1 = inout(reg) y[1] => _,
                ys = in(reg) y_stride,
                ystep = in(reg) y_step,
                steps = inout(reg) steps => _,
                options(nostack),
            );
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    unsafe fn run(
        &mut self,
        _: [*const u8; 2],
        _: usize,
        _: *const u8,
        _: [*const u8; 2],
        _: (usize, usize),
        _: usize,
    ) {
        unreachable!("AMX is x86-64 only")
    }
}

/// `t[j * 16 + i] = m[i * 16 + j]`: a 16 x 16 tile of 32-bit values transposed, in 16
/// AVX-512 registers (four rounds of unpacks and lane shuffles).
fn transpose_16x16(m: &[f32; T * T]) -> [f32; T * T] {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::tier() == crate::simd::Tier::Avx512 {
        // SAFETY: the Avx512 tier detected AVX-512 F, the feature the function enables.
        return unsafe { transpose_16x16_avx512(m) };
    }
    std::array::from_fn(|n| m[(n % T) * T + n / T])
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn transpose_16x16_avx512(m: &[f32; T * T]) -> [f32; T * T] {
    use std::arch::x86_64::*;
    let r: [__m512i; T] = std::array::from_fn(|i| {
        // SAFETY: row i of `m` is 16 f32 (64 bytes) from `m[i * 16]`; unaligned loads have no
        // alignment requirement.
        unsafe { _mm512_loadu_si512(m[i * T..].as_ptr().cast()) }
    });
    // Rows 2i and 2i + 1 interleaved: in each 128-bit block, columns 4b, 4b + 1 (lo) or
    // 4b + 2, 4b + 3 (hi) of the two rows.
    let t: [__m512i; T] = std::array::from_fn(|i| {
        let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_epi32(a, b)
        } else {
            _mm512_unpackhi_epi32(a, b)
        }
    });
    // u[4i + e]: in block b, column 4b + e of rows 4i .. 4i + 3.
    let u: [__m512i; T] = std::array::from_fn(|n| {
        let (i, e) = (n / 4, n % 4);
        let (a, b) = (t[4 * i + e / 2], t[4 * i + 2 + e / 2]);
        if e % 2 == 0 {
            _mm512_unpacklo_epi64(a, b)
        } else {
            _mm512_unpackhi_epi64(a, b)
        }
    });
    // Column 4b + e: block b of u[e], u[4 + e], u[8 + e], u[12 + e].
    let mut out = [0.0f32; T * T];
    for e in 0..4 {
        let v0 = _mm512_shuffle_i32x4::<0x88>(u[e], u[4 + e]);
        let v1 = _mm512_shuffle_i32x4::<0xdd>(u[e], u[4 + e]);
        let w0 = _mm512_shuffle_i32x4::<0x88>(u[8 + e], u[12 + e]);
        let w1 = _mm512_shuffle_i32x4::<0xdd>(u[8 + e], u[12 + e]);
        let cols = [
            (e, _mm512_shuffle_i32x4::<0x88>(v0, w0)),
            (4 + e, _mm512_shuffle_i32x4::<0x88>(v1, w1)),
            (8 + e, _mm512_shuffle_i32x4::<0xdd>(v0, w0)),
            (12 + e, _mm512_shuffle_i32x4::<0xdd>(v1, w1)),
        ];
        for (col, v) in cols {
            // SAFETY: row `col` of `out` is 16 f32 (64 bytes) from `out[col * 16]`; unaligned
            // stores have no alignment requirement.
            unsafe { _mm512_storeu_si512(out[col * T..].as_mut_ptr().cast(), v) };
        }
    }
    out
}

/// Row `r` of `a`'s `k`-element bf16 rows, as bits.
fn bits_row<'a>(a: &Lines<'a>, r: usize, k: usize) -> &'a [u16] {
    let at = (a.start + r * a.stride) * 2;
    // Callers (gemm.rs `Mat::amx_rows`) pass 2-byte aligned bytes.
    as_bits(&a.bytes[at..at + k * 2])
}

/// Checks that `lines` are bf16 and that each of their first `m` lines of `k` lies in their
/// bytes (before any is read; `what` names them in the panic).
fn check_rows(lines: &Lines, m: usize, k: usize, what: &str) {
    assert!(lines.dtype == DType::BF16, "{what} must be bf16");
    assert!(
        lines.bytes.len() >= (lines.start + (m - 1) * lines.stride + k) * 2,
        "{what} rows past the tensor's bytes"
    );
}

/// A pair of bf16 bits as one u32, the first in the low half (little-endian order in memory).
#[inline(always)]
fn pair(lo: u16, hi: u16) -> u32 {
    u32::from(lo) | (u32::from(hi) << 16)
}

thread_local! {
    /// Packed operands and the tasks' tiles, kept by the calling thread for its next call.
    static BUFFERS: std::cell::Cell<(Vec<u32>, Vec<u16>, Vec<u16>)> =
        const { std::cell::Cell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// The `m` rows of `k` bf16 values that `row` gives, transposed into pairs for the Y operand:
/// column tile `ct` (rows `16 ct ..`) holds `k2` rows of 16 pairs (zeros past `k` and `m`).
/// Returns the u32 words of one column tile (`k2 * 16`).
fn pack_transposed<'a>(
    row: impl Fn(usize) -> &'a [u16] + Sync,
    (m, k): (usize, usize),
    packed: &mut Vec<u32>,
) -> usize {
    let k2 = k.div_ceil(KS) * KS / 2;
    let ct_words = k2 * T;
    // Zeroed whole: the padding past k and m must read as zeros.
    packed.clear();
    packed.resize(m.div_ceil(T) * ct_words, 0);
    let pack = |(ct, tile): (usize, &mut [u32])| {
        // Sixteen rows at a time, so each 64-byte row of the tile is written whole.
        let rows: [&[u16]; T] = std::array::from_fn(|c| row((ct * T + c).min(m - 1)));
        let live = T.min(m - ct * T);
        // Whole groups of 16 pairs by vector transposes; the rest pair by pair.
        let groups = k / KS;
        for (g, out) in tile.chunks_exact_mut(T * T).take(groups).enumerate() {
            let pairs: [[u32; T]; T] = std::array::from_fn(|c| {
                let mut p = [0u32; T];
                if c < live {
                    let at = &rows[c][g * KS..][..KS];
                    p.iter_mut()
                        .enumerate()
                        .for_each(|(j, v)| *v = pair(at[2 * j], at[2 * j + 1]));
                }
                p
            });
            let flat: [u32; T * T] = bytemuck::cast(pairs);
            let t = transpose_16x16(&bytemuck::cast(flat));
            out.copy_from_slice(&bytemuck::cast::<[f32; T * T], [u32; T * T]>(t));
        }
        for (k2, out) in tile
            .chunks_exact_mut(T)
            .take(k / 2)
            .enumerate()
            .skip(groups * T)
        {
            for (o, row) in out.iter_mut().zip(&rows).take(live) {
                *o = pair(row[2 * k2], row[2 * k2 + 1]);
            }
        }
        if k % 2 == 1 {
            let out = &mut tile[k / 2 * T..][..T];
            for (o, row) in out.iter_mut().zip(&rows).take(live) {
                *o = pair(row[k - 1], 0);
            }
        }
    };
    if m * k >= 1 << 16 {
        packed.par_chunks_mut(ct_words).enumerate().for_each(pack);
    } else {
        packed.chunks_mut(ct_words).enumerate().for_each(pack);
    }
    ct_words
}

/// Queries packed once for [`Scores::block`]: their rows transposed into pairs.
pub(crate) struct Scores {
    queries: Vec<u32>,
    ct_words: usize,
    rows: usize,
    dim: usize,
    keys: Vec<u16>,
    sums: Vec<f32>,
    tiles: Vec<f32>,
    probs: Vec<u16>,
    values: Vec<u32>,
}

impl Scores {
    /// `rows` query rows of `dim` bf16 values (`q`, row-major).
    pub(crate) fn new(q: &[u16], rows: usize, dim: usize) -> Scores {
        let mut queries = Vec::new();
        let ct_words = pack_transposed(|i| &q[i * dim..][..dim], (rows, dim), &mut queries);
        Scores {
            queries,
            ct_words,
            rows,
            dim,
            keys: Vec::new(),
            sums: Vec::new(),
            tiles: Vec::new(),
            probs: Vec::new(),
            values: Vec::new(),
        }
    }

    /// `out[r * stride + j] = q_r . k_j` for the keys `k_rows` (at most 64, bf16 bytes of
    /// `dim` elements each) and every query row: the keys' rows copied into whole tiles (zeros
    /// past `dim` and past the last key), the queries' pairs as packed.
    pub(crate) fn block(&mut self, k_rows: &[&[u8]], (out, stride): (&mut [f32], usize)) {
        assert!(available() && k_rows.len() <= 64 && stride >= k_rows.len());
        let (dim, kp) = (self.dim, self.dim.div_ceil(KS) * KS);
        let key_tiles = k_rows.len().div_ceil(T).max(1);
        // Every element is written: a key's row, zeros past `dim`, zero rows past the keys.
        self.keys.resize(key_tiles * T * kp, 0);
        for (j, row) in self.keys.chunks_exact_mut(kp).enumerate() {
            match k_rows.get(j) {
                Some(k) => {
                    row[..dim].copy_from_slice(as_bits(&k[..dim * 2]));
                    row[dim..].fill(0);
                }
                None => row.fill(0),
            }
        }
        let x = XSource {
            base: self.keys.as_ptr().cast(),
            stride: kp * 2,
            full_tiles: key_tiles,
            tail_rows: &[],
            k_tail: &[],
        };
        let y = YSource {
            packed: &self.queries,
            ct_bytes: self.ct_words * 4,
            step_bytes: T * T * 4,
            stride: T * 4,
        };
        // The tiles hold the scores transposed: (key, row); `sums` is rows x keys.
        let keys = k_rows.len();
        self.sums.resize(self.rows * keys, 0.0);
        let sums = &mut self.sums[..self.rows * keys];
        multiply(
            &x,
            &y,
            (keys, self.rows, kp),
            &mut self.tiles,
            Orient::Transposed,
            1.0,
            sums,
        );
        for (o, s) in out.chunks_mut(stride).zip(self.sums.chunks_exact(keys)) {
            o[..keys].copy_from_slice(s);
        }
    }

    /// `acc[r, :] += P[r, :] V` for the block's keys `v_rows` (at most 64, bf16 bytes of `dim`
    /// elements each): P (`p[r * stride + j]`, f32) rounded to bf16 (nearest even) as the
    /// X operand, V's rows interleaved in pairs as the Y operand.
    pub(crate) fn weighted(
        &mut self,
        (p, stride): (&[f32], usize),
        v_rows: &[&[u8]],
        acc: &mut [f32],
    ) {
        assert!(available() && v_rows.len() <= 64 && stride >= 64);
        let (rows, dim, keys) = (self.rows, self.dim, 64);
        let row_tiles = rows.div_ceil(T);
        // Every element of both is written below: the padding with zeros.
        self.probs.resize(row_tiles * T * keys, 0);
        // Keys 2 k2 and 2 k2 + 1 interleaved into row k2 of dp pairs (zeros past the keys).
        let dp = dim.div_ceil(T) * T;
        self.values.resize(keys / 2 * dp, 0);
        let n = v_rows.len();
        let (probs, values) = (&mut self.probs, &mut self.values);
        // Compiled for the CPU's widest vectors (these loops are as long as the products).
        crate::simd::vectorised(
            #[inline(always)]
            || {
                for (r, dst) in probs[..row_tiles * T * keys]
                    .chunks_exact_mut(keys)
                    .enumerate()
                {
                    if r < rows {
                        let src = &p[r * stride..][..n];
                        for (d, &v) in dst.iter_mut().zip(src) {
                            *d = crate::convert::f32_to_bf16_bits(v);
                        }
                        dst[n..].fill(0);
                    } else {
                        dst.fill(0);
                    }
                }
                for (k2, out) in values[..keys / 2 * dp].chunks_exact_mut(dp).enumerate() {
                    let Some(lo) = v_rows.get(2 * k2) else {
                        out.fill(0);
                        continue;
                    };
                    out[dim..].fill(0);
                    let lo = as_bits(&lo[..dim * 2]);
                    match v_rows.get(2 * k2 + 1) {
                        Some(hi) => {
                            let hi = as_bits(&hi[..dim * 2]);
                            for ((o, &l), &h) in out.iter_mut().zip(lo).zip(hi) {
                                *o = pair(l, h);
                            }
                        }
                        None => {
                            for (o, &l) in out.iter_mut().zip(lo) {
                                *o = pair(l, 0);
                            }
                        }
                    }
                }
            },
        );
        let x = XSource {
            base: self.probs.as_ptr().cast(),
            stride: keys * 2,
            full_tiles: row_tiles,
            tail_rows: &[],
            k_tail: &[],
        };
        let y = YSource {
            packed: &self.values,
            ct_bytes: T * 4,
            step_bytes: T * dp * 4,
            stride: dp * 4,
        };
        self.sums.resize(rows * dim, 0.0);
        let sums = &mut self.sums[..rows * dim];
        multiply(
            &x,
            &y,
            (rows, dim, keys),
            &mut self.tiles,
            Orient::AsIs,
            1.0,
            sums,
        );
        crate::simd::vectorised(
            #[inline(always)]
            || acc.iter_mut().zip(sums.iter()).for_each(|(a, s)| *a += s),
        );
    }
}

/// bf16 bytes as bits (the tensors' rows are 2-byte aligned: element offsets of 64-byte
/// aligned storage).
fn as_bits(bytes: &[u8]) -> &[u16] {
    bytemuck::cast_slice(bytes)
}

/// `acc[i, j] = alpha * sum_k a[i, k] * w[j, k]`, as `gemm_bf16_dot::dot`: A's row `i` is
/// line `i` of `a` and W's row `j` line `j` of `w` (bf16, 2-byte aligned), `acc` is `m x n`.
/// Call only where [`available`] says so.
pub(crate) fn dot(
    a: Lines,
    (m, n, k): (usize, usize, usize),
    w: Lines,
    alpha: f32,
    acc: &mut [f32],
    tiles: &mut Vec<f32>,
) {
    assert!(available() && w.dtype == DType::BF16);
    assert!(m > 0 && n > 0 && k > 0 && acc.len() == m * n);
    check_rows(&a, m, k, "A");
    // Full tiles of W are read in place: their rows, and the first `k / 32 * 32` elements of
    // each, lie inside w.bytes (checked here, as the raw loads rely on it).
    let full_tiles = n / T;
    if full_tiles > 0 {
        check_rows(&w, full_tiles * T, k, "W");
    }
    let (steps, tail) = (k / KS, k % KS);
    let w_elem = |j: usize, kk: usize| {
        let at = (w.start + j * w.stride + kk) * 2;
        u16::from_le_bytes([w.bytes[at], w.bytes[at + 1]])
    };
    let (mut y_packed, mut tail_rows, mut k_tail) = BUFFERS.take();
    // W's last partial tile of rows, zero-padded to 16 rows (the full steps only).
    tail_rows.clear();
    tail_rows.resize(T * steps * KS, 0);
    for (r, row) in tail_rows.chunks_exact_mut((steps * KS).max(1)).enumerate() {
        let j = full_tiles * T + r;
        if j < n && steps > 0 {
            row.iter_mut()
                .enumerate()
                .for_each(|(kk, v)| *v = w_elem(j, kk));
        }
    }
    // Every row's last K % 32 elements, zero-padded, and one zero tile more.
    k_tail.clear();
    if tail > 0 {
        k_tail.resize((n.div_ceil(T) + 1) * T * KS, 0);
        for (j, row) in k_tail.chunks_exact_mut(KS).take(n).enumerate() {
            for (kk, v) in row[..tail].iter_mut().enumerate() {
                *v = w_elem(j, steps * KS + kk);
            }
        }
    }
    let ct_words = pack_transposed(|i| bits_row(&a, i, k), (m, k), &mut y_packed);
    let x = XSource {
        base: w.bytes.as_ptr().wrapping_add(w.start * 2),
        stride: w.stride * 2,
        full_tiles,
        tail_rows: &tail_rows,
        k_tail: &k_tail,
    };
    let y = YSource {
        packed: &y_packed,
        ct_bytes: ct_words * 4,
        step_bytes: T * T * 4,
        stride: T * 4,
    };
    // The tiles hold D transposed: output (r, c) is D[c, r].
    multiply(&x, &y, (n, m, k), tiles, Orient::Transposed, alpha, acc);
    BUFFERS.set((y_packed, tail_rows, k_tail));
}

/// `acc[i, j] = alpha * sum_k a[i, k] * b[k, j]`, as `gemm_few_rows::axpy`: A's row `i` is
/// line `i` of `a` (bf16, 2-byte aligned), B's row `k` is line `k` of `b` (bf16, N
/// contiguous), `acc` is `m x n`. Call only where [`available`] says so.
pub(crate) fn axpy(
    a: Lines,
    (m, n, k): (usize, usize, usize),
    b: Lines,
    alpha: f32,
    acc: &mut [f32],
    tiles: &mut Vec<f32>,
) {
    assert!(available() && b.dtype == DType::BF16);
    assert!(m > 0 && n > 0 && k > 0 && acc.len() == m * n);
    check_rows(&a, m, k, "A");
    let kp = k.div_ceil(KS) * KS;
    let (mut y_packed, mut x_packed, spare) = BUFFERS.take();
    // A padded to whole tiles: m rounded up to 16 rows of kp (zeros past k and m).
    x_packed.clear();
    x_packed.resize(m.div_ceil(T) * T * kp, 0);
    x_packed
        .par_chunks_mut(kp)
        .take(m)
        .enumerate()
        .for_each(|(i, dst)| dst[..k].copy_from_slice(bits_row(&a, i, k)));
    // B's rows 2 k2 and 2 k2 + 1 interleaved into row k2 of np pairs (zeros past k and n).
    let np = n.div_ceil(T) * T;
    let b_row = |kk: usize| {
        let at = (b.start + kk * b.stride) * 2;
        &b.bytes[at..at + n * 2]
    };
    y_packed.clear();
    y_packed.resize(kp / 2 * np, 0);
    y_packed
        .par_chunks_mut(np)
        .enumerate()
        .for_each(|(k2, row)| {
            if 2 * k2 >= k {
                return; // padding: zeros
            }
            let lo = b_row(2 * k2);
            let hi = (2 * k2 + 1 < k).then(|| b_row(2 * k2 + 1));
            for (j, v) in row[..n].iter_mut().enumerate() {
                let h = hi.map_or(0, |h| u16::from_le_bytes([h[2 * j], h[2 * j + 1]]));
                *v = pair(u16::from_le_bytes([lo[2 * j], lo[2 * j + 1]]), h);
            }
        });
    let x = XSource {
        base: x_packed.as_ptr().cast(),
        stride: kp * 2,
        full_tiles: m.div_ceil(T),
        tail_rows: &[],
        k_tail: &[],
    };
    let y = YSource {
        packed: &y_packed,
        ct_bytes: T * 4,
        step_bytes: T * np * 4,
        stride: np * 4,
    };
    // Steps cover kp: the packed A and B hold zeros past k, so no tail step.
    multiply(&x, &y, (m, n, kp), tiles, Orient::AsIs, alpha, acc);
    BUFFERS.set((y_packed, x_packed, spare));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm_few_rows::tests::{
        assert_product, assert_same_at_thread_counts, bf16_bytes, values,
    };

    fn lines(bytes: &[u8], start: usize, stride: usize) -> Lines<'_> {
        Lines {
            bytes,
            dtype: DType::BF16,
            start,
            stride,
        }
    }

    /// Both forms against an f64 reference at sizes on and off every edge: K across the
    /// 32-element steps (with and without a tail step, and below one step), N and M across
    /// the 16-row tiles, the pairs of tiles and the tasks' 64 x 256 blocks; operands padded
    /// and offset. Skipped (and said so) where the CPU has no AMX.
    #[test]
    fn both_forms_match_the_f64_product() {
        if !available() {
            eprintln!("skipped: no AMX-BF16 tiles on this CPU (or CALICO_CPU_AMX=0)");
            return;
        }
        let (skip, pad) = (3usize, 5usize);
        for &(m, n, k) in &[
            (16, 16, 32),
            (16, 1, 1),
            (17, 15, 31),
            (31, 33, 33),
            (32, 64, 64),
            (33, 65, 95),
            (47, 200, 130),
            (64, 17, 1025),
            (100, 300, 7),
            (257, 70, 100),
            (300, 129, 64),
        ] {
            // A's rows `k + 1` apart from element 2.
            let a_all = values(2 + m * (k + 1), 1);
            let a: Vec<f32> = (0..m)
                .flat_map(|i| a_all[2 + i * (k + 1)..][..k].to_vec())
                .collect();
            let a_bytes = bf16_bytes(&a_all);
            // Dot form: W [N, K] rows `k + pad` apart from element `skip`.
            let stride = k + pad;
            let w = values(skip + n * stride, 2);
            let mut got = vec![f32::NAN; m * n];
            let w_bytes = bf16_bytes(&w);
            dot(
                lines(&a_bytes, 2, k + 1),
                (m, n, k),
                lines(&w_bytes, skip, stride),
                0.5,
                &mut got,
                &mut vec![7.0; 3],
            );
            assert_product(&got, &a, (m, n, k), 0.5, |kk, j| w[skip + j * stride + kk]);
            // Axpy form: B [K, N] rows `n + pad` apart.
            let stride = n + pad;
            let b = values(skip + k * stride, 3);
            let b_bytes = bf16_bytes(&b);
            let mut got = vec![f32::NAN; m * n];
            axpy(
                lines(&a_bytes, 2, k + 1),
                (m, n, k),
                lines(&b_bytes, skip, stride),
                0.5,
                &mut got,
                &mut Vec::new(),
            );
            assert_product(&got, &a, (m, n, k), 0.5, |kk, j| b[skip + kk * stride + j]);
        }
    }

    /// The attention's score blocks against f64: query rows below, at and past one tile,
    /// head dims on and off the 32-element steps, blocks of 1 to 64 keys.
    #[test]
    fn score_blocks_match_the_f64_dots() {
        if !available() {
            eprintln!("skipped: no AMX-BF16 tiles on this CPU (or CALICO_CPU_AMX=0)");
            return;
        }
        for (rows, dim) in [(1, 64), (16, 128), (33, 72), (50, 256)] {
            let q = values(rows * dim, 11);
            let q_bits: Vec<u16> = bf16_bytes(&q)
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
                .collect();
            let mut scores = Scores::new(&q_bits, rows, dim);
            // After a full block, partial ones reuse the buffers (their padding rewritten).
            for keys in [64, 1, 17, 64] {
                let k = values(keys * (dim + 3), 12);
                let k_bytes = bf16_bytes(&k);
                let k_rows: Vec<&[u8]> = (0..keys)
                    .map(|j| &k_bytes[j * (dim + 3) * 2..][..dim * 2])
                    .collect();
                let mut out = vec![f32::NAN; rows * 64];
                scores.block(&k_rows, (&mut out, 64));
                let k_t: Vec<f32> = (0..dim * keys)
                    .map(|i| k[(i % keys) * (dim + 3) + i / keys])
                    .collect();
                let got: Vec<f32> = (0..rows)
                    .flat_map(|r| out[r * 64..r * 64 + keys].to_vec())
                    .collect();
                assert_product(&got, &q, (rows, keys, dim), 1.0, |d, j| k_t[d * keys + j]);
            }
        }
    }

    /// The attention's P V blocks against f64: P rounded to bf16 first, added into `acc`.
    #[test]
    fn weighted_blocks_match_the_f64_products() {
        if !available() {
            eprintln!("skipped: no AMX-BF16 tiles on this CPU (or CALICO_CPU_AMX=0)");
            return;
        }
        for (rows, dim, keys) in [(1, 128, 1), (16, 128, 64), (33, 72, 17), (20, 256, 63)] {
            let q_bits = vec![0u16; rows * dim];
            let mut scores = Scores::new(&q_bits, rows, dim);
            // A full block first, so the block checked reuses buffers holding other values.
            let full = bf16_bytes(&values(64 * dim, 15));
            let full_rows: Vec<&[u8]> = full.chunks_exact(dim * 2).collect();
            scores.weighted(
                (&vec![1.0; rows * 64], 64),
                &full_rows,
                &mut vec![0.0; rows * dim],
            );
            let p: Vec<f32> = values(rows * 64, 13).iter().map(|v| v.abs()).collect();
            let v = values(keys * dim, 14);
            let v_bytes = bf16_bytes(&v);
            let v_rows: Vec<&[u8]> = (0..keys)
                .map(|j| &v_bytes[j * dim * 2..][..dim * 2])
                .collect();
            let mut acc = vec![0.0f32; rows * dim];
            scores.weighted((&p, 64), &v_rows, &mut acc);
            let rounded: Vec<f32> = (0..rows * keys)
                .map(|i| half::bf16::from_f32(p[i / keys * 64 + i % keys]).to_f32())
                .collect();
            assert_product(&acc, &rounded, (rows, dim, keys), 1.0, |kk, j| {
                v[kk * dim + j]
            });
        }
    }

    #[test]
    fn tiles_transpose() {
        let m: [f32; T * T] = std::array::from_fn(|i| i as f32 * 1.5 - 7.0);
        let t = transpose_16x16(&m);
        for i in 0..T {
            for j in 0..T {
                assert_eq!(t[j * T + i], m[i * T + j], "({i}, {j})");
            }
        }
    }

    /// W ending exactly at the end of its bytes: the in-place tiles read no further.
    #[test]
    fn a_weight_that_ends_its_allocation() {
        if !available() {
            eprintln!("skipped: no AMX-BF16 tiles on this CPU (or CALICO_CPU_AMX=0)");
            return;
        }
        let (m, n, k) = (20, 48, 96);
        let a = values(m * k, 4);
        let a_bytes = bf16_bytes(&a);
        let w = values(n * k, 5);
        let w_bytes = bf16_bytes(&w);
        let mut got = vec![0.0; m * n];
        dot(
            lines(&a_bytes, 0, k),
            (m, n, k),
            lines(&w_bytes, 0, k),
            1.0,
            &mut got,
            &mut Vec::new(),
        );
        assert_product(&got, &a, (m, n, k), 1.0, |kk, j| w[j * k + kk]);
    }

    /// The scratch a larger call left behind (longer than this call's tiles) is used only in
    /// part: a second, smaller call on the same scratch still matches the reference.
    #[test]
    fn a_scratch_kept_from_a_larger_call() {
        if !available() {
            eprintln!("skipped: no AMX-BF16 tiles on this CPU (or CALICO_CPU_AMX=0)");
            return;
        }
        let mut scratch = Vec::new();
        for (m, n, k) in [(64, 700, 64), (16, 100, 33)] {
            let a = values(m * k, 7);
            let a_bytes = bf16_bytes(&a);
            let w = values(n * k, 8);
            let w_bytes = bf16_bytes(&w);
            let mut got = vec![0.0; m * n];
            dot(
                lines(&a_bytes, 0, k),
                (m, n, k),
                lines(&w_bytes, 0, k),
                1.0,
                &mut got,
                &mut scratch,
            );
            assert_product(&got, &a, (m, n, k), 1.0, |kk, j| w[j * k + kk]);
        }
    }

    #[test]
    fn results_do_not_depend_on_the_thread_count() {
        if !available() {
            eprintln!("skipped: no AMX-BF16 tiles on this CPU (or CALICO_CPU_AMX=0)");
            return;
        }
        let (m, n, k) = (300, 200, 700);
        let a = bf16_bytes(&values(m * k, 5));
        let w = bf16_bytes(&values(n * k, 6));
        assert_same_at_thread_counts(|| {
            let mut got = vec![0.0; m * n];
            dot(
                lines(&a, 0, k),
                (m, n, k),
                lines(&w, 0, k),
                1.0,
                &mut got,
                &mut Vec::new(),
            );
            let mut more = vec![0.0; m * n];
            axpy(
                lines(&a, 0, k),
                (m, n, k),
                lines(&w, 0, n),
                1.0,
                &mut more,
                &mut Vec::new(),
            );
            got.extend(more);
            got
        });
    }
}
