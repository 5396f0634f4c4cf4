// Attention forward in the tile vocabulary: the kernel the docs walk through (docs/attention.md).
//
// A block of 4 warps owns BM = 64 query rows of one (batch, query head); each warp owns 16 of
// them and keeps its Q rows (bf16/f16) and its output accumulator (f32) in register tiles.
// K and V stream through shared tiles in blocks of BN keys, double-buffered with async copies.
// Per block of keys a warp computes S = Q K^T (mma_ABt), scales, soft-caps and masks it, runs
// the online softmax in base 2 (row max, exp2, row sum; the accumulator rescaled when the max
// grows), rounds P to the input type and accumulates O += P V (mma_AB). At the end O is
// divided by the row sums and the log-sum-exp is written. Rows that see no key get O = 0 and
// LSE = -inf: the max stays -inf, every exp2 is 0, the sum is 0.
//
// Defines: ELEM (bf16 | f16), HEAD_DIM (64 | 128 | 256), BN (keys per block: 64, or 32 at
// HEAD_DIM 256 to keep registers), ALIGNED (1: rows of K and V are 16-byte aligned, loaded
// with cp.async; 0: element loads), HEAD_DIM_USED (the problem's head dim, default HEAD_DIM).
#include "calico/calico.h"
#include "calico/tile_ops.cuh"
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
#ifndef ALIGNED
#define ALIGNED 1
#endif

namespace calico {
namespace attention {

constexpr int WARPS = 4;
constexpr int BM = 16 * WARPS;
constexpr int D = HEAD_DIM;
#ifndef HEAD_DIM_USED
#define HEAD_DIM_USED HEAD_DIM
#endif
// The problem's head dim (a multiple of 8, at most D): the global views end there, so the
// loads past it give zeros (no change to any score) and the stores past it are dropped.
constexpr int DIM = HEAD_DIM_USED;
static_assert(DIM % 8 == 0 && DIM <= D, "a real head dim of whole 16-byte chunks, at most D");
// Head-dimension chunk of the register tiles (a 16 x 64 tile per chunk).
constexpr int DC = 64;
constexpr int CHUNKS = D / DC;
static_assert(D % DC == 0, "head dims are multiples of 64");

typedef st<ELEM, BN, D> kv_tile;

// Shared <- global rows [row0, row0 + BN) of `src` (zeros past `rows`).
CALICO_DEVICE void load_keys(kv_tile& dst, const gl<ELEM>& src, int tile) {
#if ALIGNED
    load_async(dst, src, coord{0, tile, 0}, (int)thread_x(), WARPS * 32);
#else
    for (int idx = thread_x(); idx < BN * D; idx += WARPS * 32) {
        const int r = idx / D, c = idx % D, gr = tile * BN + r;
        *dst.ptr(r, c) = gr < src.rows && c < src.cols ? *src.at(0, gr, c) : from_float<ELEM>(0.0f);
    }
#endif
}

// Scale, soft-cap, base 2, and -inf outside the mask, for the 16 x BN scores of one warp
// whose first row is query `row0` and first column key `col0`.
CALICO_DEVICE void mask_scores(rt_fl<16, BN>& s, const params& p, const sequence& seq, i64 row0, i64 col0) {
    const int lane = thread_x() % 32;
#pragma unroll
    for (int j = 0; j < BN / 16; ++j)
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            int r, c;
            base_coord<row_l>(lane, k, r, c);
            const i64 i = row0 + r, key = col0 + 16 * j + c;
            float2 v = s.data[0][j][k];
            v.x = visible(p, seq, i, key) ? score2(p, v.x) : neg_inf();
            v.y = visible(p, seq, i, key + 1) ? score2(p, v.y) : neg_inf();
            s.data[0][j][k] = v;
        }
}

}  // namespace attention
}  // namespace calico

// Grid: (query blocks of the longest sequence, query heads, batch). Packed batches pass
// cu_q / cu_k (else null) and the packed lengths in p.q_len / p.k_len.
CALICO_KERNEL void CALICO_MAX_THREADS(128) calico_attention_fwd(CALICO_ATTN_OPERAND(const ELEM, q), CALICO_ATTN_OPERAND(const ELEM, k),
                                                                CALICO_ATTN_OPERAND(const ELEM, v), CALICO_ATTN_OPERAND(ELEM, o),
                                                                float* __restrict__ lse, long long lse_sb, long long lse_sh,
                                                                const int* __restrict__ cu_q, const int* __restrict__ cu_k,
                                                                CALICO_ATTN_PARAMS) {
    CALICO_ATTN_USE(const ELEM, q);
    CALICO_ATTN_USE(const ELEM, k);
    CALICO_ATTN_USE(const ELEM, v);
    CALICO_ATTN_USE(ELEM, o);
    CALICO_ATTN_USE_PARAMS;
    using namespace calico;
    using namespace calico::attention;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    kv_tile* ks = reinterpret_cast<kv_tile*>(smem);  // ks[0], ks[1]
    kv_tile* vs = ks + 2;                            // vs[0], vs[1]

    const i64 b = block_z(), h = block_y(), kvh = h / (p.q_heads / p.kv_heads);
    const sequence seq = sequence_of(p, cu_q, cu_k, b);
    const i64 m0 = (i64)block_x() * BM;
    if (m0 >= seq.q_len) return;  // the whole block: no barrier is skipped by part of it
    const int warp = thread_x() / 32, lane = thread_x() % 32;

    const ELEM* qb = q.ptr + b * q.sb + h * q.sh + seq.q_start * q.sn;
    const gl<ELEM> qg{const_cast<ELEM*>(qb), (int)seq.q_len, DIM, q.sn, 0};
    const gl<ELEM> kg{const_cast<ELEM*>(k.ptr + b * k.sb + kvh * k.sh + seq.k_start * k.sn), (int)seq.k_len, DIM, k.sn, 0};
    const gl<ELEM> vg{const_cast<ELEM*>(v.ptr + b * v.sb + kvh * v.sh + seq.k_start * v.sn), (int)seq.k_len, DIM, v.sn, 0};
    const gl<ELEM> og{o.ptr + b * o.sb + h * o.sh + seq.q_start * o.sn, (int)seq.q_len, DIM, o.sn, 0};

    // This warp's 16 query rows, in chunks of 64 columns.
    const int row_tile = (int)(m0 / 16) + warp;
    rt<ELEM, 16, DC> qr[CHUNKS];
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) load(qr[c], qg, coord{0, row_tile, c});

    rt_fl<16, DC> acc[CHUNKS];
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) zero(acc[c]);
    rv<16, per_row> row_max2, sums;
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        row_max2.data[0][x] = neg_inf();
        sums.data[0][x] = 0.0f;
    }

    // The keys any row of the block sees.
    const i64 last = (m0 + BM < seq.q_len ? m0 + BM : seq.q_len) - 1;
    i64 lo, hi, lo_last, hi_last;
    visible_keys(p, seq, m0, lo, hi);
    visible_keys(p, seq, last, lo_last, hi_last);
    const int first_tile = (int)(lo / BN);
    const int end_tile = hi_last > lo ? (int)((hi_last + BN - 1) / BN) : first_tile;

    if (first_tile < end_tile) {
        load_keys(ks[0], kg, first_tile);
        load_keys(vs[0], vg, first_tile);
    }
    cp_async_commit();
    for (int t = first_tile; t < end_tile; ++t) {
        const int stage = (t - first_tile) & 1;
        if (t + 1 < end_tile) {
            load_keys(ks[stage ^ 1], kg, t + 1);
            load_keys(vs[stage ^ 1], vg, t + 1);
        }
        cp_async_commit();
        cp_async_wait<1>();
        sync_threads();

        // S = Q K^T over the head dimension, 64 columns at a time.
        rt_fl<16, BN> s;
        zero(s);
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            rt<ELEM, BN, DC> kf;
            load(kf, ks[stage], 0, c * DC);
            mma_ABt(s, qr[c], kf, s);
        }
        {
            // Tiles every row of this warp sees in full (most of them) skip the per-element
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
        rv<16, per_row> tile_max, scale_old, tile_sum;
        row_max(tile_max, s);
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            const float m_new = fmaxf(row_max2.data[0][x], tile_max.data[0][x]);
            // A row that has seen no key yet keeps max -inf; subtract 0 so exp2 gives 0, not NaN.
            const float m_use = m_new == neg_inf() ? 0.0f : m_new;
            scale_old.data[0][x] = exp2_approx(row_max2.data[0][x] - m_use);
            row_max2.data[0][x] = m_new;
            tile_max.data[0][x] = m_use;
        }
        sub_row(s, s, tile_max);
        exp2(s, s);
        row_sum(tile_sum, s);
#pragma unroll
        for (int x = 0; x < 2; ++x) sums.data[0][x] = sums.data[0][x] * scale_old.data[0][x] + tile_sum.data[0][x];

        // O = O * rescale + P V.
        rt<ELEM, 16, BN> pr;
        copy(pr, s);
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            mul_row(acc[c], acc[c], scale_old);
            rt<ELEM, BN, DC, col_l> vf;
            load(vf, vs[stage], 0, c * DC);
            mma_AB(acc[c], pr, vf, acc[c]);
        }
        // The next iteration's copies overwrite the stage just read.
        sync_threads();
    }
    cp_async_wait<0>();

    rv<16, per_row> inv;
#pragma unroll
    for (int x = 0; x < 2; ++x) inv.data[0][x] = sums.data[0][x] > 0.0f ? 1.0f / sums.data[0][x] : 0.0f;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
        mul_row(acc[c], acc[c], inv);
        store(og, acc[c], coord{0, row_tile, c});
    }
    if (lane % 4 == 0) {
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            const i64 i = m0 + 16 * warp + lane / 4 + 8 * x;
            if (i < seq.q_len) lse[b * lse_sb + h * lse_sh + seq.q_start + i] = row_lse(row_max2.data[0][x], sums.data[0][x]);
        }
    }
}
