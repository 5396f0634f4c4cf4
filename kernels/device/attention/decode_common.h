// Small helpers shared by the decode attention kernel and its split combiner.
#pragma once

#define DECODE_LOG2E 1.4426950408889634f
#define DECODE_LN2 0.6931471805599453f

namespace calico {

// -infinity without a math header (NVRTC and clang -nogpuinc alike).
CALICO_DEVICE float decode_neg_inf() {
    union {
        unsigned u;
        float f;
    } bits = {0xff800000u};
    return bits.f;
}

// 2^(m - mn): the factor that moves a softmax state with max m onto the larger max mn; 0 for an
// empty state (m = -inf), also when mn is -inf (where m - mn would be NaN).
CALICO_DEVICE float decode_rescale(float m, float mn) {
    return m == decode_neg_inf() ? 0.0f : exp2_approx(m - mn);
}

// log2 of a positive float.
CALICO_DEVICE float decode_log2(float x) {
#if defined(__HIP__)
    return __builtin_log2f(x);
#else
    return log2f(x);
#endif
}

// A float written by another block of the running launch: read from L2 (ld.global.cg on
// NVIDIA, whose L1 is not coherent); a plain load on AMD, where only a later launch reads.
CALICO_DEVICE float decode_load_l2(const float* p) {
#if defined(__HIP__)
    return *p;
#else
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
#endif
}

// Merges the split partials of one output row (sequence, query head, query token) in split
// order, one warp per row: each split left its normalised output o_s (HEAD_DIM floats at
// part_o + (row * splits + s) * HEAD_DIM) and base-2 LSE l_s (part_lse[row * splits + s]).
// The row's output is sum_s 2^(l_s - M) o_s / sum_s 2^(l_s - M) with M = max_s l_s, written
// to orow, and its LSE (natural log) (M + log2(sum_s 2^(l_s - M))) * ln 2 to *lse_out. A row
// no split saw (M = -inf) gets O = 0 and LSE = -inf. The order of the sums is fixed, so the
// result is bit-identical across runs and whichever kernel (the combiner or the last block
// of a split group) does the merge.
template <typename T, int HD>
CALICO_DEVICE void decode_merge_row(const float* part_o, const float* part_lse, long long row, int splits,
                                    T* orow, float* lse_out, int lane) {
    constexpr int PER_LANE = (HD + CALICO_LANES - 1) / CALICO_LANES;
    const float NEG_INF = decode_neg_inf();
    const float* ls = part_lse + row * splits;

    float mx = NEG_INF;
    for (int s = lane; s < splits; s += CALICO_LANES) mx = fmaxf(mx, decode_load_l2(ls + s));
    mx = warp_max(mx);
    const float base = mx == NEG_INF ? 0.0f : mx;
    float total = 0.0f;
    for (int s = lane; s < splits; s += CALICO_LANES) total += exp2_approx(decode_load_l2(ls + s) - base);
    total = warp_sum(total);

    float out[PER_LANE];
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) out[i] = 0.0f;
    if (total > 0.0f) {
        const float inv = 1.0f / total;
        // Lane j computes the weight of split s0 + j; the loop body has no branch on the data,
        // so the loads of several splits are in flight at once (a serial chain of L2 reads,
        // one per split, would dominate at 32 splits). An empty split (LSE -inf) has weight 0
        // and a zero partial: it adds nothing.
        for (int s0 = 0; s0 < splits; s0 += CALICO_LANES) {
            const int mine = s0 + lane;
            const float w_mine = mine < splits ? exp2_approx(decode_load_l2(ls + mine) - base) * inv : 0.0f;
            const int n = splits - s0 < CALICO_LANES ? splits - s0 : CALICO_LANES;
            const float* ps = part_o + (row * splits + s0) * HD;
#pragma unroll 16
            for (int j = 0; j < n; ++j) {
                const float w = shfl(w_mine, j);
#pragma unroll
                for (int i = 0; i < PER_LANE; ++i) {
                    const int d = lane + i * CALICO_LANES;
                    if (d < HD) out[i] = fmaf(w, decode_load_l2(ps + j * HD + d), out[i]);
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        const int d = lane + i * CALICO_LANES;
        if (d < HD) orow[d] = from_float<T>(out[i]);
    }
    if (lane == 0) *lse_out = total > 0.0f ? (base + decode_log2(total)) * DECODE_LN2 : NEG_INF;
}

}  // namespace calico
