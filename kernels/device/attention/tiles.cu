// Attention forward written only against the shared tile vocabulary (calico/tiles.h) and the
// attention semantics (attention/common.cuh): no vendor names, no lane arithmetic, nothing
// indexed inside a register tile. The same text compiles for NVIDIA (sm_80, sm_90a: mma.sync
// base tiles, warps of 32) and AMD CDNA (gfx90a, gfx942: MFMA 16x16x16 base tiles, wavefronts
// of 64). It is the example docs/attention.md walks through.
//
// A block of WARPS = 8 warps owns BM = 128 query rows of one (batch, query head); each warp owns
// 16 of them and keeps its Q rows (ELEM) and its output accumulator (f32) in register tiles,
// in chunks of 16 head-dimension columns (any head dim that is a multiple of 16, up to 256).
// Keys come in blocks of BN (64; 16 above head dim 128, for registers). Per block:
//   1. the warps write K's block and V's block transposed into shared tiles (st), each warp
//      moving 16 x 16 pieces global -> registers -> shared (load / store; rows past the
//      sequence read as zeros; V's pieces are loaded col_l and turned into row_l tiles of V^T
//      by `transpose`, which moves no data);
//   2. S = Q K^T (mma_ABt, K's fragments read row_l from the shared tile);
//   3. scale, soft-cap and mask S, in base 2: map_rc gives each score its (row, col), so the
//      mask is common.cuh's `visible` (blocks every row sees in full skip it: one mul);
//   4. online softmax: row_max, the running max and the rescale of the old sum and output
//      (map / map2 on register vectors), sub_row, exp2, row_sum;
//   5. P rounded to ELEM (copy) and O = O * rescale + P V (mul_row, then mma_ABt with V^T's
//      fragments read row_l from its shared tile: D = P (V^T)^T).
// At the end O is divided by the row sums (0 for a row that saw no key) and the natural-log
// LSE is written (-inf for such a row): the per-row vector is broadcast over a 16 x 16 tile
// and its first column stored into an LSE matrix of one column.
//
// Defines: ELEM (bf16 | f16), HEAD_DIM (a multiple of 16, at most 256), BN (keys per block).
// No alignment is required of any operand (the global moves are element-wise).
#include "calico/tiles.h"
#include "attention/common.cuh"

#ifndef ELEM
#define ELEM bf16
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef BN
#define BN 64
#endif

namespace calico {
namespace attention_tiles {

using namespace calico::attention;

constexpr int WARPS = 8;
constexpr int THREADS = WARPS * CALICO_LANES;
constexpr int BM = 16 * WARPS;
constexpr int D = HEAD_DIM;
static_assert(D % 16 == 0 && D <= 256, "head dims are multiples of 16 up to 256");
static_assert(BN % 16 == 0, "key blocks are whole 16-row tiles");
// Head-dimension chunk of the register tiles (one 16-wide base tile per chunk).
constexpr int DC = 16;
constexpr int CHUNKS = D / DC;
// Shared tile width: the head dim rounded up to a width every vendor's swizzle takes (rows of
// 32, 64 or a multiple of 128 bytes); the padding columns are never read.
constexpr int DS = D <= 32 ? D : (D + 63) / 64 * 64;

// Q stays in registers, except above head dim 128 on 32-lane warps, where Q (64 registers a
// lane) beside the accumulator (128) would spill: there each key block re-reads it (L1/L2).
constexpr bool Q_HELD = D <= 128 || CALICO_LANES == 64;
constexpr int Q_TILES = Q_HELD ? CHUNKS : 1;

// K's block as stored (keys x head dims, rows padded to DS) and V's block transposed (head
// dims x keys), so that both are read as row_l fragments (ldmatrix / ds_read_b64).
typedef st<ELEM, BN, DS> k_tile;
typedef st<ELEM, D, BN> vt_tile;

// Shared <- the rows [tile * BN, tile * BN + BN) of K and of V (zeros past the sequence), by
// the whole block: warp w moves the 16 x 16 pieces w, w + WARPS, ... of each, one piece at a
// time through registers; V's pieces are loaded col_l and stored transposed. (Issuing the next
// block's loads before this block's compute, held in registers, measured 7-12% slower on the
// H100 and halves the waves per SIMD at d64 on gfx942: docs/perf-log.md.)
CALICO_DEVICE void stage(k_tile& ks, vt_tile& vts, const gl<ELEM>& kg, const gl<ELEM>& vg, int tile, int warp) {
    constexpr int PIECES = (BN / 16) * CHUNKS;
#pragma unroll
    for (int piece = warp; piece < PIECES; piece += WARPS) {
        const int r = piece / CHUNKS, c = piece % CHUNKS;
        const coord at{0, tile * (BN / 16) + r, c};
        rt<ELEM, 16, 16> kp;
        rt<ELEM, 16, 16, col_l> vp;
        load(kp, kg, at);
        load(vp, vg, at);
        store(ks, kp, 16 * r, 16 * c);
        rt<ELEM, 16, 16> vt;
        transpose(vt, vp);  // col_l R x C -> row_l C x R: the same registers
        store(vts, vt, 16 * c, 16 * r);
    }
}

// Scale, soft-cap, base 2, and -inf outside the mask, for the 16 x BN scores of one warp
// whose first row is query `row0` and first column key `col0`.
CALICO_DEVICE void mask_scores(rt_fl<16, BN>& s, const params& p, const sequence& seq, i64 row0, i64 col0) {
    map_rc(s, s, [&](int r, int c, float x) { return visible(p, seq, row0 + r, col0 + c) ? score2(p, x) : neg_inf(); });
}

}  // namespace attention_tiles
}  // namespace calico

// Grid: (query blocks of BM rows of the longest sequence, query heads, batch); THREADS threads.
// Packed batches pass cu_q / cu_k (else null) and the packed lengths in p.q_len / p.k_len. The
// argument list is calico_attention_fwd's (forward.cu).
CALICO_KERNEL CALICO_MAX_THREADS(8 * CALICO_LANES) void calico_attention_tiles_fwd(
    CALICO_ATTN_OPERAND(const ELEM, q), CALICO_ATTN_OPERAND(const ELEM, k), CALICO_ATTN_OPERAND(const ELEM, v),
    CALICO_ATTN_OPERAND(ELEM, o), float* __restrict__ lse, long long lse_sb, long long lse_sh, const int* __restrict__ cu_q,
    const int* __restrict__ cu_k, CALICO_ATTN_PARAMS) {
    CALICO_ATTN_USE(const ELEM, q);
    CALICO_ATTN_USE(const ELEM, k);
    CALICO_ATTN_USE(const ELEM, v);
    CALICO_ATTN_USE(ELEM, o);
    CALICO_ATTN_USE_PARAMS;
    using namespace calico;
    using namespace calico::attention_tiles;
    static_assert(THREADS == 8 * CALICO_LANES, "the launch bound above is the block size");
    __shared__ k_tile ks;
    __shared__ vt_tile vts;

    const i64 b = block_z(), h = block_y(), kvh = h / (p.q_heads / p.kv_heads);
    const sequence seq = sequence_of(p, cu_q, cu_k, b);
    const i64 m0 = (i64)block_x() * BM;
    if (m0 >= seq.q_len) return;  // the whole block: no barrier is skipped by part of it
    const int warp = (int)(thread_x() / CALICO_LANES);

    const gl<ELEM> qg{const_cast<ELEM*>(q.ptr + b * q.sb + h * q.sh + seq.q_start * q.sn), (int)seq.q_len, D, q.sn, 0};
    const gl<ELEM> kg{const_cast<ELEM*>(k.ptr + b * k.sb + kvh * k.sh + seq.k_start * k.sn), (int)seq.k_len, D, k.sn, 0};
    const gl<ELEM> vg{const_cast<ELEM*>(v.ptr + b * v.sb + kvh * v.sh + seq.k_start * v.sn), (int)seq.k_len, D, v.sn, 0};
    const gl<ELEM> og{o.ptr + b * o.sb + h * o.sh + seq.q_start * o.sn, (int)seq.q_len, D, o.sn, 0};
    // The LSE of this (batch, head) as a matrix of one column.
    const gl<float> lg{lse + b * lse_sb + h * lse_sh + seq.q_start, (int)seq.q_len, 1, 1, 0};

    // This warp's 16 query rows.
    const int row_tile = (int)(m0 / 16) + warp;
    rt<ELEM, 16, DC> qr[Q_TILES];
    if constexpr (Q_HELD) {
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) load(qr[c], qg, coord{0, row_tile, c});
    }

    rt_fl<16, DC> acc[CHUNKS];
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) zero(acc[c]);
    // Per row: the running max (base 2) and sum.
    rv<16, per_row> run_max, run_sum;
    fill(run_max, neg_inf());
    fill(run_sum, 0.0f);

    // The keys any row of the block sees.
    const i64 last = (m0 + BM < seq.q_len ? m0 + BM : seq.q_len) - 1;
    i64 lo, hi, lo_last, hi_last;
    visible_keys(p, seq, m0, lo, hi);
    visible_keys(p, seq, last, lo_last, hi_last);
    const int first_tile = (int)(lo / BN);
    const int end_tile = hi_last > lo ? (int)((hi_last + BN - 1) / BN) : first_tile;

    for (int t = first_tile; t < end_tile; ++t) {
        // Every warp is past the previous block's fragment reads (the barrier ending it).
        stage(ks, vts, kg, vg, t, warp);
        sync_threads();

        // S = Q K^T over the head dimension.
        rt_fl<16, BN> s;
        zero(s);
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            rt<ELEM, BN, DC> kf;
            load(kf, ks, 0, c * DC);
            if constexpr (!Q_HELD) load(qr[0], qg, coord{0, row_tile, c});
            mma_ABt(s, qr[Q_HELD ? c : 0], kf, s);
        }
        {
            // Blocks every row of this warp sees in full (most of them) skip the per-element
            // mask: one multiply by scale * log2(e).
            const i64 row0 = m0 + 16 * warp, col0 = (i64)t * BN;
            const i64 diag0 = row0 + seq.k_len - seq.q_len;
            const bool full = col0 + BN <= seq.k_len && (p.left < 0 || col0 >= diag0 + 15 - p.left) &&
                              (p.right < 0 || col0 + BN - 1 <= diag0 + p.right);
            if (full && p.softcap <= 0.0f)
                mul(s, s, p.scale * LOG2E);
            else
                mask_scores(s, p, seq, row0, col0);
        }

        // Online softmax in base 2.
        rv<16, per_row> new_max, sub, rescale, block_sum;
        row_max(new_max, s);
        map2(new_max, run_max, new_max, [](float a, float b) { return fmaxf(a, b); });
        // A row that has seen no key yet keeps max -inf; subtract 0 so exp2 gives 0, not NaN.
        map(sub, new_max, [](float m) { return m == neg_inf() ? 0.0f : m; });
        map2(rescale, run_max, sub, [](float old, float m) { return exp2_approx(old - m); });
        run_max = new_max;
        sub_row(s, s, sub);
        exp2(s, s);
        row_sum(block_sum, s);
        map2(run_sum, run_sum, rescale, [](float sum, float r) { return sum * r; });
        map2(run_sum, run_sum, block_sum, [](float sum, float x) { return sum + x; });

        // O = O * rescale + P V.
        rt<ELEM, 16, BN> pr;
        copy(pr, s);
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            mul_row(acc[c], acc[c], rescale);
            rt<ELEM, DC, BN> vf;
            load(vf, vts, c * DC, 0);
            mma_ABt(acc[c], pr, vf, acc[c]);
        }
        // The next block's staging overwrites the tiles just read.
        sync_threads();
    }

    rv<16, per_row> inv;
    map(inv, run_sum, [](float sum) { return sum > 0.0f ? 1.0f / sum : 0.0f; });
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
        mul_row(acc[c], acc[c], inv);
        store(og, acc[c], coord{0, row_tile, c});
    }
    rv<16, per_row> row_lses;
    map2(row_lses, run_max, run_sum, [](float m, float sum) { return row_lse(m, sum); });
    rt_fl<16, 16> lse_tile;
    zero(lse_tile);
    row_map(lse_tile, lse_tile, row_lses, [](float, float x) { return x; });
    store(lg, lse_tile, coord{0, row_tile, 0});
}
