// Attention backward in the tile vocabulary, two kernels with no atomics (so every run gives
// the same bits, and dQ is summed exactly in f32 registers):
//
//   calico_attention_bwd_dq: a block of 4 warps owns 64 query rows of one (batch, query head);
//     each warp keeps its Q and dO rows and its dQ accumulator in register tiles, computes
//     delta = rowsum(dO * O) (written for the second kernel), and streams blocks of K and V
//     through shared memory: S = Q K^T, P = exp2(S - LSE) (base 2), dP = dO V^T,
//     dS = P * (dP - delta), dQ += dS K.
//   calico_attention_bwd_dkdv: a block owns 64 keys of one (batch, KV head); each warp keeps
//     16 keys' K and V rows and their dK, dV accumulators, and streams blocks of Q and dO of
//     every query head of the group: S^T = K Q^T, P^T, dV += P^T dO, dP^T = V dO^T,
//     dS^T = P^T * (dP^T - delta), dK += dS^T Q. The GQA reduction over query heads is this
//     loop, in a fixed order.
//
// Defines: ELEM, HEAD_DIM (64 | 128), BWD_BLOCK (rows per streamed block: 64 at head dim 64,
// 32 at 128), ALIGNED (cp.async for the streamed blocks), HEAD_DIM_USED (the problem's head
// dim, default HEAD_DIM).
#include "calico/calico.h"
#include "calico/tile_ops.cuh"
#include "attention/common.cuh"

#ifndef ELEM
#define ELEM bf16
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef BWD_BLOCK
#define BWD_BLOCK 32
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
constexpr int DC = 64;
constexpr int CHUNKS = D / DC;
constexpr int KB = BWD_BLOCK;
static_assert(D % DC == 0, "head dims are multiples of 64");

typedef st<ELEM, KB, D> stream_tile;

CALICO_DEVICE void load_block(stream_tile& dst, const gl<ELEM>& src, int tile) {
#if ALIGNED
    load_async(dst, src, coord{0, tile, 0}, (int)thread_x(), WARPS * 32);
#else
    for (int idx = thread_x(); idx < KB * D; idx += WARPS * 32) {
        const int r = idx / D, c = idx % D, gr = tile * KB + r;
        *dst.ptr(r, c) = gr < src.rows && c < src.cols ? *src.at(0, gr, c) : from_float<ELEM>(0.0f);
    }
#endif
}

// Calls f(r, c, x, y) for every element of two 16 x N tiles, (r, c) its coordinates.
template <int N, class F>
CALICO_DEVICE void for_each_pair(rt_fl<16, N>& x, rt_fl<16, N>& y, F f) {
    const int lane = thread_x() % 32;
#pragma unroll
    for (int j = 0; j < N / 16; ++j)
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            int r, c;
            base_coord<row_l>(lane, k, r, c);
            f(r, 16 * j + c, x.data[0][j][k].x, y.data[0][j][k].x);
            f(r, 16 * j + c + 1, x.data[0][j][k].y, y.data[0][j][k].y);
        }
}

// dS (with respect to the scaled dot product) from a raw dot product and dP:
// dS = P (dP - delta) dcap with P = exp(s - lse), s the scaled and soft-capped score and dcap
// its derivative; `lse` and `delta` belong to the element's query row. P goes to `prob`.
CALICO_DEVICE float grad_score(const params& p, float dot, float dp, float lse, float delta, bool seen, float& prob) {
    float s = dot * p.scale, dcap = 1.0f;
    if (p.softcap > 0.0f) {
        const float t = tanhf(s / p.softcap);
        s = p.softcap * t;
        dcap = 1.0f - t * t;
    }
    prob = (seen && lse != neg_inf()) ? exp2_approx((s - lse) * LOG2E) : 0.0f;
    return prob * (dp - delta) * dcap;
}

}  // namespace attention
}  // namespace calico

// Grid: (query blocks of the longest sequence, query heads, batch). `delta` is laid out as
// the LSE and written here for the dK/dV kernel.
CALICO_KERNEL void CALICO_MAX_THREADS(128) calico_attention_bwd_dq(
    CALICO_ATTN_OPERAND(const ELEM, q), CALICO_ATTN_OPERAND(const ELEM, k), CALICO_ATTN_OPERAND(const ELEM, v),
    CALICO_ATTN_OPERAND(const ELEM, o), CALICO_ATTN_OPERAND(const ELEM, d_o), const float* __restrict__ lse, long long lse_sb,
    long long lse_sh, float* __restrict__ delta_out, CALICO_ATTN_OPERAND(ELEM, dq), const int* __restrict__ cu_q,
    const int* __restrict__ cu_k, CALICO_ATTN_PARAMS) {
    CALICO_ATTN_USE(const ELEM, q);
    CALICO_ATTN_USE(const ELEM, k);
    CALICO_ATTN_USE(const ELEM, v);
    CALICO_ATTN_USE(const ELEM, o);
    CALICO_ATTN_USE(const ELEM, d_o);
    CALICO_ATTN_USE(ELEM, dq);
    CALICO_ATTN_USE_PARAMS;
    using namespace calico;
    using namespace calico::attention;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    stream_tile* ks = reinterpret_cast<stream_tile*>(smem);  // ks[0], ks[1]
    stream_tile* vs = ks + 2;

    const i64 b = block_z(), h = block_y(), kvh = h / (p.q_heads / p.kv_heads);
    const sequence seq = sequence_of(p, cu_q, cu_k, b);
    const i64 m0 = (i64)block_x() * BM;
    if (m0 >= seq.q_len) return;
    const int warp = thread_x() / 32, lane = thread_x() % 32;
    const int row_tile = (int)(m0 / 16) + warp;
    auto rows_of = [&](const operand<const ELEM>& t, i64 head) {
        return gl<ELEM>{const_cast<ELEM*>(t.ptr + b * t.sb + head * t.sh + seq.q_start * t.sn), (int)seq.q_len, DIM, t.sn, 0};
    };
    const gl<ELEM> kg{const_cast<ELEM*>(k.ptr + b * k.sb + kvh * k.sh + seq.k_start * k.sn), (int)seq.k_len, DIM, k.sn, 0};
    const gl<ELEM> vg{const_cast<ELEM*>(v.ptr + b * v.sb + kvh * v.sh + seq.k_start * v.sn), (int)seq.k_len, DIM, v.sn, 0};

    rt<ELEM, 16, DC> qr[CHUNKS], gr[CHUNKS];
    rt_fl<16, DC> acc[CHUNKS];
    rv<16, per_row> delta, row_lse;
    {
        const gl<ELEM> qg = rows_of(q, h), og = rows_of(o, h), dog = rows_of(d_o, h);
        for (int x = 0; x < 2; ++x) delta.data[0][x] = 0.0f;
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            load(qr[c], qg, coord{0, row_tile, c});
            load(gr[c], dog, coord{0, row_tile, c});
            rt_fl<16, DC> of, gf, prod;
            load(of, og, coord{0, row_tile, c});
            copy(gf, gr[c]);
            mul(prod, of, gf);
            rv<16, per_row> part;
            row_sum(part, prod);
            for (int x = 0; x < 2; ++x) delta.data[0][x] += part.data[0][x];
            zero(acc[c]);
        }
        for (int x = 0; x < 2; ++x) {
            const i64 i = m0 + 16 * warp + lane / 4 + 8 * x;
            const i64 at = b * lse_sb + h * lse_sh + seq.q_start + i;
            row_lse.data[0][x] = i < seq.q_len ? lse[at] : 0.0f;
            if (i < seq.q_len && lane % 4 == 0) delta_out[at] = delta.data[0][x];
        }
    }

    const i64 last = (m0 + BM < seq.q_len ? m0 + BM : seq.q_len) - 1;
    i64 lo, hi, lo_last, hi_last;
    visible_keys(p, seq, m0, lo, hi);
    visible_keys(p, seq, last, lo_last, hi_last);
    const int first_tile = (int)(lo / KB);
    const int end_tile = hi_last > lo ? (int)((hi_last + KB - 1) / KB) : first_tile;

    if (first_tile < end_tile) {
        load_block(ks[0], kg, first_tile);
        load_block(vs[0], vg, first_tile);
    }
    cp_async_commit();
    for (int t = first_tile; t < end_tile; ++t) {
        const int stage = (t - first_tile) & 1;
        if (t + 1 < end_tile) {
            load_block(ks[stage ^ 1], kg, t + 1);
            load_block(vs[stage ^ 1], vg, t + 1);
        }
        cp_async_commit();
        cp_async_wait<1>();
        sync_threads();

        rt_fl<16, KB> s, dp;
        zero(s);
        zero(dp);
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            rt<ELEM, KB, DC> kf, vf;
            load(kf, ks[stage], 0, c * DC);
            mma_ABt(s, qr[c], kf, s);
            load(vf, vs[stage], 0, c * DC);
            mma_ABt(dp, gr[c], vf, dp);
        }
        const i64 row0 = m0 + 16 * warp, col0 = (i64)t * KB;
        for_each_pair(s, dp, [&](int r, int c, float& sv, float& dpv) {
            const i64 i = row0 + r;
            float prob;
            const int x = r >= 8 ? 1 : 0;
            sv = grad_score(p, sv, dpv, row_lse.data[0][x], delta.data[0][x], i < seq.q_len && visible(p, seq, i, col0 + c), prob);
        });
        rt<ELEM, 16, KB> ds;
        copy(ds, s);
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            rt<ELEM, KB, DC, col_l> kf;
            load(kf, ks[stage], 0, c * DC);
            mma_AB(acc[c], ds, kf, acc[c]);
        }
        sync_threads();
    }
    cp_async_wait<0>();
    const gl<ELEM> dqg{dq.ptr + b * dq.sb + h * dq.sh + seq.q_start * dq.sn, (int)seq.q_len, DIM, dq.sn, 0};
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
        mul(acc[c], acc[c], p.scale);
        store(dqg, acc[c], coord{0, row_tile, c});
    }
}

// Grid: (key blocks of the longest sequence, KV heads, batch). Runs after the dQ kernel,
// which wrote `delta`.
CALICO_KERNEL void CALICO_MAX_THREADS(128) calico_attention_bwd_dkdv(
    CALICO_ATTN_OPERAND(const ELEM, q), CALICO_ATTN_OPERAND(const ELEM, k), CALICO_ATTN_OPERAND(const ELEM, v),
    CALICO_ATTN_OPERAND(const ELEM, o), CALICO_ATTN_OPERAND(const ELEM, d_o), const float* __restrict__ lse, long long lse_sb,
    long long lse_sh, const float* __restrict__ delta_in, CALICO_ATTN_OPERAND(ELEM, dk), CALICO_ATTN_OPERAND(ELEM, dv),
    const int* __restrict__ cu_q, const int* __restrict__ cu_k, CALICO_ATTN_PARAMS) {
    CALICO_ATTN_USE(const ELEM, q);
    CALICO_ATTN_USE(const ELEM, k);
    CALICO_ATTN_USE(const ELEM, v);
    CALICO_ATTN_USE(const ELEM, d_o);
    CALICO_ATTN_USE(ELEM, dk);
    CALICO_ATTN_USE(ELEM, dv);
    CALICO_ATTN_USE_PARAMS;
    (void)o_ptr;
    (void)o_sb;
    (void)o_sh;
    (void)o_sn;
    using namespace calico;
    using namespace calico::attention;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    stream_tile* qs = reinterpret_cast<stream_tile*>(smem);  // qs[0], qs[1]
    stream_tile* gs = qs + 2;                                // dO

    const i64 b = block_z(), kvh = block_y(), group = p.q_heads / p.kv_heads;
    const sequence seq = sequence_of(p, cu_q, cu_k, b);
    const i64 n0 = (i64)block_x() * BM;
    if (n0 >= seq.k_len) return;
    const int warp = thread_x() / 32;
    const int row_tile = (int)(n0 / 16) + warp;
    const gl<ELEM> kg{const_cast<ELEM*>(k.ptr + b * k.sb + kvh * k.sh + seq.k_start * k.sn), (int)seq.k_len, DIM, k.sn, 0};
    const gl<ELEM> vg{const_cast<ELEM*>(v.ptr + b * v.sb + kvh * v.sh + seq.k_start * v.sn), (int)seq.k_len, DIM, v.sn, 0};

    rt<ELEM, 16, DC> kr[CHUNKS], vr[CHUNKS];
    rt_fl<16, DC> dk_acc[CHUNKS], dv_acc[CHUNKS];
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
        load(kr[c], kg, coord{0, row_tile, c});
        load(vr[c], vg, coord{0, row_tile, c});
        zero(dk_acc[c]);
        zero(dv_acc[c]);
    }

    // The queries any key of the block is seen by (diagonal of row i: i + k_len - q_len).
    const i64 shift = seq.k_len - seq.q_len;
    const i64 last = (n0 + BM < seq.k_len ? n0 + BM : seq.k_len) - 1;
    i64 lo = p.right < 0 ? 0 : n0 - p.right - shift;
    i64 hi = p.left < 0 ? seq.q_len : last + p.left - shift + 1;
    if (lo < 0) lo = 0;
    if (hi > seq.q_len) hi = seq.q_len;
    const int first_block = (int)(lo / KB);
    const int blocks = hi > lo ? (int)((hi + KB - 1) / KB) - first_block : 0;
    const int steps = blocks * (int)group;

    auto rows_of = [&](const operand<const ELEM>& t, i64 head) {
        return gl<ELEM>{const_cast<ELEM*>(t.ptr + b * t.sb + head * t.sh + seq.q_start * t.sn), (int)seq.q_len, DIM, t.sn, 0};
    };
    auto stage_load = [&](int step, int stage) {
        const i64 head = kvh * group + step / blocks;
        const int blk = first_block + step % blocks;
        load_block(qs[stage], rows_of(q, head), blk);
        load_block(gs[stage], rows_of(d_o, head), blk);
    };
    if (steps > 0) stage_load(0, 0);
    cp_async_commit();
    for (int step = 0; step < steps; ++step) {
        const int stage = step & 1;
        if (step + 1 < steps) stage_load(step + 1, stage ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
        sync_threads();

        const i64 head = kvh * group + step / blocks;
        const i64 i0 = (i64)(first_block + step % blocks) * KB;
        rt_fl<16, KB> s, dp;
        zero(s);
        zero(dp);
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            rt<ELEM, KB, DC> qf, gf;
            load(qf, qs[stage], 0, c * DC);
            mma_ABt(s, kr[c], qf, s);  // S^T: keys x queries
            load(gf, gs[stage], 0, c * DC);
            mma_ABt(dp, vr[c], gf, dp);  // dP^T
        }
        const i64 key0 = n0 + 16 * warp;
        for_each_pair(s, dp, [&](int r, int c, float& sv, float& dpv) {
            const i64 i = i0 + c, j = key0 + r;
            const bool seen = i < seq.q_len && visible(p, seq, i, j);
            const i64 at = b * lse_sb + head * lse_sh + seq.q_start + (i < seq.q_len ? i : 0);
            const float l = seen ? lse[at] : 0.0f, dl = seen ? delta_in[at] : 0.0f;
            float pr;
            sv = grad_score(p, sv, dpv, l, dl, seen, pr);
            dpv = pr;
        });
        rt<ELEM, 16, KB> pt, dst;
        copy(pt, dp);
        copy(dst, s);
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            rt<ELEM, KB, DC, col_l> gf, qf;
            load(gf, gs[stage], 0, c * DC);
            mma_AB(dv_acc[c], pt, gf, dv_acc[c]);
            load(qf, qs[stage], 0, c * DC);
            mma_AB(dk_acc[c], dst, qf, dk_acc[c]);
        }
        sync_threads();
    }
    cp_async_wait<0>();
    const gl<ELEM> dkg{dk.ptr + b * dk.sb + kvh * dk.sh + seq.k_start * dk.sn, (int)seq.k_len, DIM, dk.sn, 0};
    const gl<ELEM> dvg{dv.ptr + b * dv.sb + kvh * dv.sh + seq.k_start * dv.sn, (int)seq.k_len, DIM, dv.sn, 0};
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
        mul(dk_acc[c], dk_acc[c], p.scale);
        store(dkg, dk_acc[c], coord{0, row_tile, c});
        store(dvg, dv_acc[c], coord{0, row_tile, c});
    }
}
