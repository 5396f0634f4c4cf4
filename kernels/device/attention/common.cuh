// What every attention kernel shares: the problem description passed by value, the sequence
// a block works on (fixed-length or packed with cu_seqlens offsets), and the mask.
#pragma once
#include "calico/calico.h"

namespace calico {
namespace attention {

typedef long long i64;

// One operand: element strides of (batch, head, position); packed tensors have batch 0.
template <class T>
struct operand {
    T* ptr;
    i64 sb, sh, sn;
};

// Kernel parameter lists are flat scalars (what every backend's launch passes): an operand is
// its pointer and three strides, rebuilt into the structs below at the top of each kernel.
#define CALICO_ATTN_OPERAND(T, n) T* __restrict__ n##_ptr, long long n##_sb, long long n##_sh, long long n##_sn
#define CALICO_ATTN_USE(T, n) const calico::attention::operand<T> n{n##_ptr, n##_sb, n##_sh, n##_sn}
#define CALICO_ATTN_PARAMS                                                                                       \
    long long p_batch, long long p_q_heads, long long p_kv_heads, long long p_q_len, long long p_k_len, float p_scale, \
        float p_softcap, long long p_left, long long p_right
#define CALICO_ATTN_USE_PARAMS \
    const calico::attention::params p{p_batch, p_q_heads, p_kv_heads, p_q_len, p_k_len, p_scale, p_softcap, p_left, p_right}

// Everything a launch needs beyond the pointers (one struct keeps the parameter lists short).
struct params {
    i64 batch, q_heads, kv_heads, q_len, k_len;
    float scale;       // multiplies q . k
    float softcap;     // 0: none
    i64 left, right;   // window around i + k_len - q_len; -1: unbounded
};

// Natural log of 2 and log2(e): the kernels keep scores in base 2 (exp2 is one instruction).
constexpr float LN2 = 0.69314718055994531f;
constexpr float LOG2E = 1.44269504088896341f;

// The rows of one sequence: where its queries and keys start and how many there are. With
// offsets (packed batches) the values are clamped into the packed lengths, so offsets that
// are out of order or too large never lead outside the tensors.
struct sequence {
    i64 q_start, q_len, k_start, k_len;
};

CALICO_DEVICE sequence sequence_of(const params& p, const int* cu_q, const int* cu_k, i64 b) {
    sequence s;
    if (cu_q == nullptr) {
        s.q_start = 0;
        s.q_len = p.q_len;
        s.k_start = 0;
        s.k_len = p.k_len;
        return s;
    }
    auto clamp = [](i64 v, i64 lo, i64 hi) { return v < lo ? lo : (v > hi ? hi : v); };
    s.q_start = clamp(cu_q[b], 0, p.q_len);
    s.q_len = clamp(cu_q[b + 1], s.q_start, p.q_len) - s.q_start;
    s.k_start = clamp(cu_k[b], 0, p.k_len);
    s.k_len = clamp(cu_k[b + 1], s.k_start, p.k_len) - s.k_start;
    return s;
}

// The keys row `i` sees: [lo, hi) (empty when hi <= lo). Bottom-right aligned: the diagonal
// of row i is key i + k_len - q_len.
CALICO_DEVICE void visible_keys(const params& p, const sequence& s, i64 i, i64& lo, i64& hi) {
    const i64 diag = i + s.k_len - s.q_len;
    lo = p.left < 0 ? 0 : diag - p.left;
    hi = p.right < 0 ? s.k_len : diag + p.right + 1;
    if (lo < 0) lo = 0;
    if (hi > s.k_len) hi = s.k_len;
}

CALICO_DEVICE bool visible(const params& p, const sequence& s, i64 i, i64 j) {
    const i64 diag = i + s.k_len - s.q_len;
    return j < s.k_len && (p.left < 0 || j >= diag - p.left) && (p.right < 0 || j <= diag + p.right);
}

// The score as the softmax sees it, in base 2: scale, soft-cap, log2(e).
CALICO_DEVICE float score2(const params& p, float dot) {
    float s = dot * p.scale;
    if (p.softcap > 0.0f) s = p.softcap * tanhf(s / p.softcap);
    return s * LOG2E;
}

}  // namespace attention
}  // namespace calico

namespace calico {
namespace attention {

// log2(x) for x > 0 with no libm (the HIP prelude has none): exponent from the bits, the
// mantissa's log from the atanh series around 1 (error below 1e-7).
CALICO_DEVICE float log2_positive(float x) {
    union {
        float f;
        unsigned u;
    } bits;
    bits.f = x;
    int e = (int)((bits.u >> 23) & 0xff) - 127;
    bits.u = (bits.u & 0x007fffffu) | 0x3f800000u;  // mantissa in [1, 2)
    float m = bits.f;
    if (m > 1.41421356f) {
        m *= 0.5f;
        e += 1;
    }
    const float z = (m - 1.0f) / (m + 1.0f), z2 = z * z;
    const float series = z * (2.0f + z2 * (2.0f / 3.0f + z2 * (2.0f / 5.0f + z2 * (2.0f / 7.0f + z2 * (2.0f / 9.0f)))));
    return (float)e + series * LOG2E;
}

CALICO_DEVICE float neg_inf() {
    union {
        unsigned u;
        float f;
    } bits;
    bits.u = 0xff800000u;
    return bits.f;
}

// The natural-log LSE of a row from its running max (base 2) and sum; -inf when empty.
CALICO_DEVICE float row_lse(float max2, float sum) {
    return sum > 0.0f ? (max2 + log2_positive(sum)) * LN2 : neg_inf();
}

}  // namespace attention
}  // namespace calico
