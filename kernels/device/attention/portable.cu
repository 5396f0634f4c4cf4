// Portable attention kernels, written only against the shared vocabulary (calico/calico.h):
// they compile for CUDA and HIP alike and do not depend on the lane count. One warp
// (wavefront) owns one row: the lanes split the head dimension, a warp sum forms each dot
// product, and the online softmax (base 2) runs in scalars every lane agrees on. Any head
// dimension up to 256 works. The forward runs where no tile kernel does: head dims that are
// not multiples of 16 (the vendor-neutral tile forward, tiles.cu, takes the other forwards the
// vendor kernels decline) and GPUs without matrix units; the backward kernels are the AMD
// backward. No two warps write one element, so results are the same bits on every run.
//
// Defines: ELEM (bf16 | f16), HEAD_DIM (1..=256).
#include "calico/calico.h"
#include "attention/common.cuh"

#define WARPS_THREADS (4 * CALICO_LANES)

#ifndef ELEM
#define ELEM bf16
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif

namespace calico {
namespace attention {

constexpr int WARPS = 4;
constexpr int PER_LANE = (HEAD_DIM + CALICO_LANES - 1) / CALICO_LANES;

// Lane `lane`'s elements c = lane + CALICO_LANES * e of a row (0 past the head dimension).
template <class T>
CALICO_DEVICE void load_row(float (&dst)[PER_LANE], const T* row, int lane) {
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) {
        const int c = lane + CALICO_LANES * e;
        dst[e] = c < HEAD_DIM ? to_float(row[c]) : 0.0f;
    }
}

template <class T>
CALICO_DEVICE void store_row(T* row, const float (&src)[PER_LANE], int lane) {
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) {
        const int c = lane + CALICO_LANES * e;
        if (c < HEAD_DIM) row[c] = from_float<T>(src[e]);
    }
}

CALICO_DEVICE float dot(const float (&a)[PER_LANE], const float (&b)[PER_LANE]) {
    float s = 0.0f;
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) s += a[e] * b[e];
    return warp_sum(s);
}

// The transformed score in natural units and its derivative with respect to the scaled dot.
CALICO_DEVICE float score_nat(const params& p, float dot, float& dscore) {
    float s = dot * p.scale;
    dscore = 1.0f;
    if (p.softcap > 0.0f) {
        const float t = tanhf(s / p.softcap);
        s = p.softcap * t;
        dscore = 1.0f - t * t;
    }
    return s;
}

// P of a score given the row's natural-log LSE (0 for a row that sees no key).
CALICO_DEVICE float probability(float s, float lse) {
    return lse == neg_inf() ? 0.0f : exp2_approx((s - lse) * LOG2E);
}

}  // namespace attention
}  // namespace calico

// Forward. Grid: (row blocks of WARPS rows of the longest sequence, query heads, batch).
CALICO_KERNEL void CALICO_MAX_THREADS(WARPS_THREADS) calico_attention_fwd_portable(
    CALICO_ATTN_OPERAND(const ELEM, q), CALICO_ATTN_OPERAND(const ELEM, k), CALICO_ATTN_OPERAND(const ELEM, v),
    CALICO_ATTN_OPERAND(ELEM, o), float* __restrict__ lse, long long lse_sb, long long lse_sh, const int* __restrict__ cu_q,
    const int* __restrict__ cu_k, CALICO_ATTN_PARAMS) {
    CALICO_ATTN_USE(const ELEM, q);
    CALICO_ATTN_USE(const ELEM, k);
    CALICO_ATTN_USE(const ELEM, v);
    CALICO_ATTN_USE(ELEM, o);
    CALICO_ATTN_USE_PARAMS;
    using namespace calico;
    using namespace calico::attention;
    const i64 b = block_z(), h = block_y(), kvh = h / (p.q_heads / p.kv_heads);
    const sequence seq = sequence_of(p, cu_q, cu_k, b);
    const i64 i = (i64)block_x() * WARPS + warp_id();
    if (i >= seq.q_len) return;  // warps work alone: no barriers
    const int lane = lane_id();
    float qr[PER_LANE], acc[PER_LANE], kr[PER_LANE], vr[PER_LANE];
    load_row(qr, q.ptr + b * q.sb + h * q.sh + (seq.q_start + i) * q.sn, lane);
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) acc[e] = 0.0f;
    float max2 = neg_inf(), sum = 0.0f;
    i64 lo, hi;
    visible_keys(p, seq, i, lo, hi);
    for (i64 j = lo; j < hi; ++j) {
        load_row(kr, k.ptr + b * k.sb + kvh * k.sh + (seq.k_start + j) * k.sn, lane);
        const float s = score2(p, dot(qr, kr));
        const float m_new = fmaxf(max2, s);
        const float rescale = exp2_approx(max2 - m_new), pj = exp2_approx(s - m_new);
        sum = sum * rescale + pj;
        load_row(vr, v.ptr + b * v.sb + kvh * v.sh + (seq.k_start + j) * v.sn, lane);
#pragma unroll
        for (int e = 0; e < PER_LANE; ++e) acc[e] = acc[e] * rescale + pj * vr[e];
        max2 = m_new;
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) acc[e] *= inv;
    store_row(o.ptr + b * o.sb + h * o.sh + (seq.q_start + i) * o.sn, acc, lane);
    if (lane == 0) lse[b * lse_sb + h * lse_sh + seq.q_start + i] = row_lse(max2, sum);
}

// dQ. Grid as the forward. d_o is strided like o's operand; lse as in the forward.
CALICO_KERNEL void CALICO_MAX_THREADS(WARPS_THREADS) calico_attention_bwd_dq_portable(
    CALICO_ATTN_OPERAND(const ELEM, q), CALICO_ATTN_OPERAND(const ELEM, k), CALICO_ATTN_OPERAND(const ELEM, v),
    CALICO_ATTN_OPERAND(const ELEM, o), CALICO_ATTN_OPERAND(const ELEM, d_o), const float* __restrict__ lse, long long lse_sb,
    long long lse_sh, CALICO_ATTN_OPERAND(ELEM, dq), const int* __restrict__ cu_q, const int* __restrict__ cu_k,
    CALICO_ATTN_PARAMS) {
    CALICO_ATTN_USE(const ELEM, q);
    CALICO_ATTN_USE(const ELEM, k);
    CALICO_ATTN_USE(const ELEM, v);
    CALICO_ATTN_USE(const ELEM, o);
    CALICO_ATTN_USE(const ELEM, d_o);
    CALICO_ATTN_USE(ELEM, dq);
    CALICO_ATTN_USE_PARAMS;
    using namespace calico;
    using namespace calico::attention;
    const i64 b = block_z(), h = block_y(), kvh = h / (p.q_heads / p.kv_heads);
    const sequence seq = sequence_of(p, cu_q, cu_k, b);
    const i64 i = (i64)block_x() * WARPS + warp_id();
    if (i >= seq.q_len) return;
    const int lane = lane_id();
    const i64 pos = seq.q_start + i;
    float qr[PER_LANE], gr[PER_LANE], kr[PER_LANE], vr[PER_LANE], acc[PER_LANE];
    load_row(qr, q.ptr + b * q.sb + h * q.sh + pos * q.sn, lane);
    load_row(gr, o.ptr + b * o.sb + h * o.sh + pos * o.sn, lane);
    load_row(kr, d_o.ptr + b * d_o.sb + h * d_o.sh + pos * d_o.sn, lane);
    const float delta = dot(gr, kr);  // dO . O
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) {
        gr[e] = kr[e];
        acc[e] = 0.0f;
    }
    const float row = lse[b * lse_sb + h * lse_sh + pos];
    i64 lo, hi;
    visible_keys(p, seq, i, lo, hi);
    for (i64 j = lo; j < hi; ++j) {
        load_row(kr, k.ptr + b * k.sb + kvh * k.sh + (seq.k_start + j) * k.sn, lane);
        load_row(vr, v.ptr + b * v.sb + kvh * v.sh + (seq.k_start + j) * v.sn, lane);
        float dscore;
        const float s = score_nat(p, dot(qr, kr), dscore);
        const float ds = probability(s, row) * (dot(gr, vr) - delta) * dscore;
#pragma unroll
        for (int e = 0; e < PER_LANE; ++e) acc[e] += ds * kr[e];
    }
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) acc[e] *= p.scale;
    store_row(dq.ptr + b * dq.sb + h * dq.sh + pos * dq.sn, acc, lane);
}

// dK and dV, summed over the query heads of each KV head. Grid: (row blocks of the longest
// key sequence, KV heads, batch).
CALICO_KERNEL void CALICO_MAX_THREADS(WARPS_THREADS) calico_attention_bwd_dkdv_portable(
    CALICO_ATTN_OPERAND(const ELEM, q), CALICO_ATTN_OPERAND(const ELEM, k), CALICO_ATTN_OPERAND(const ELEM, v),
    CALICO_ATTN_OPERAND(const ELEM, o), CALICO_ATTN_OPERAND(const ELEM, d_o), const float* __restrict__ lse, long long lse_sb,
    long long lse_sh, CALICO_ATTN_OPERAND(ELEM, dk), CALICO_ATTN_OPERAND(ELEM, dv), const int* __restrict__ cu_q,
    const int* __restrict__ cu_k, CALICO_ATTN_PARAMS) {
    CALICO_ATTN_USE(const ELEM, q);
    CALICO_ATTN_USE(const ELEM, k);
    CALICO_ATTN_USE(const ELEM, v);
    CALICO_ATTN_USE(const ELEM, o);
    CALICO_ATTN_USE(const ELEM, d_o);
    CALICO_ATTN_USE(ELEM, dk);
    CALICO_ATTN_USE(ELEM, dv);
    CALICO_ATTN_USE_PARAMS;
    using namespace calico;
    using namespace calico::attention;
    const i64 b = block_z(), kvh = block_y(), group = p.q_heads / p.kv_heads;
    const sequence seq = sequence_of(p, cu_q, cu_k, b);
    const i64 j = (i64)block_x() * WARPS + warp_id();
    if (j >= seq.k_len) return;
    const int lane = lane_id();
    const i64 kpos = seq.k_start + j;
    float kr[PER_LANE], vr[PER_LANE], qr[PER_LANE], gr[PER_LANE], orow[PER_LANE], dk_acc[PER_LANE], dv_acc[PER_LANE];
    load_row(kr, k.ptr + b * k.sb + kvh * k.sh + kpos * k.sn, lane);
    load_row(vr, v.ptr + b * v.sb + kvh * v.sh + kpos * v.sn, lane);
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) dk_acc[e] = dv_acc[e] = 0.0f;
    // Queries that see key j: the diagonal of row i is i + k_len - q_len.
    const i64 shift = seq.k_len - seq.q_len;
    i64 lo = p.right < 0 ? 0 : j - p.right - shift;
    i64 hi = p.left < 0 ? seq.q_len : j + p.left - shift + 1;
    if (lo < 0) lo = 0;
    if (hi > seq.q_len) hi = seq.q_len;
    for (i64 h = kvh * group; h < (kvh + 1) * group; ++h) {
        for (i64 i = lo; i < hi; ++i) {
            const i64 pos = seq.q_start + i;
            load_row(qr, q.ptr + b * q.sb + h * q.sh + pos * q.sn, lane);
            load_row(gr, d_o.ptr + b * d_o.sb + h * d_o.sh + pos * d_o.sn, lane);
            load_row(orow, o.ptr + b * o.sb + h * o.sh + pos * o.sn, lane);
            const float delta = dot(gr, orow);
            float dscore;
            const float s = score_nat(p, dot(qr, kr), dscore);
            const float pij = probability(s, lse[b * lse_sb + h * lse_sh + pos]);
            const float ds = pij * (dot(gr, vr) - delta) * dscore;
#pragma unroll
            for (int e = 0; e < PER_LANE; ++e) {
                dv_acc[e] += pij * gr[e];
                dk_acc[e] += ds * qr[e];
            }
        }
    }
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) dk_acc[e] *= p.scale;
    store_row(dk.ptr + b * dk.sb + kvh * dk.sh + kpos * dk.sn, dk_acc, lane);
    store_row(dv.ptr + b * dv.sb + kvh * dv.sh + kpos * dv.sn, dv_acc, lane);
}
