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

// N floats written by another block of the running launch (16-byte aligned when N is a
// multiple of 4, 8-byte when even): read from L2 (ld.global.cg on NVIDIA, whose L1 is not
// coherent); plain loads on AMD, where only a later launch reads them.
template <int N>
CALICO_DEVICE void decode_load_l2(const float* p, float (&v)[N]) {
#if defined(__HIP__)
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = p[i];
#else
    if constexpr (N % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 4)
            asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
                         : "=f"(v[i]), "=f"(v[i + 1]), "=f"(v[i + 2]), "=f"(v[i + 3])
                         : "l"(p + i));
    } else if constexpr (N % 2 == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 2)
            asm volatile("ld.global.cg.v2.f32 {%0, %1}, [%2];" : "=f"(v[i]), "=f"(v[i + 1]) : "l"(p + i));
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v[i]) : "l"(p + i));
    }
#endif
}

CALICO_DEVICE float decode_load_l2(const float* p) {
    float v[1];
    decode_load_l2<1>(p, v);
    return v[0];
}

// Merges the split partials of one output row (sequence, query head, query token) in split
// order, one warp per row: each split left its normalised output o_s (HD floats at
// part_o + (row * splits + s) * HD) and base-2 LSE l_s (part_lse[row * splits + s]). The
// row's output is sum_s 2^(l_s - M) o_s / sum_s 2^(l_s - M) with M = max_s l_s, written to
// orow, and its LSE (natural log) (M + log2(sum_s 2^(l_s - M))) * ln 2 to *lse_out. A row no
// split saw (M = -inf) gets O = 0 and LSE = -inf. Each output element sums its splits in
// split order with the same weights as decode_combine.cu's serial loop, so the result is
// bit-identical to it, across runs, and whichever kernel does the merge.
//
// Lane j owns HD / lanes consecutive elements, read with vector loads, and the loads of a
// batch of splits are all issued before the first multiply-add: a compiler free to interleave
// each load with its use leaves one or two loads in flight per lane, a serial chain of L2 (or
// DRAM) round trips that made the two-launch combiner take 17-19 us at 32 splits.
//
// BATCH_SPLITS > 0 sets the splits in flight (at most the lanes); 0: 64 floats of registers.
// COLS < HD: only the row's first COLS elements are written (a head dim padded up to HD).
template <typename T, int HD, int BATCH_SPLITS = 0, int COLS = HD>
CALICO_DEVICE void decode_merge_row(const float* part_o, const float* part_lse, long long row, int splits,
                                    T* orow, float* lse_out, int lane) {
    static_assert(HD % CALICO_LANES == 0, "whole elements per lane");
    static_assert(BATCH_SPLITS >= 0 && BATCH_SPLITS <= CALICO_LANES, "a batch is at most one split per lane");
    constexpr int PER_LANE = HD / CALICO_LANES;
    constexpr int BATCH = BATCH_SPLITS > 0 ? BATCH_SPLITS : (PER_LANE >= 8 ? 8 : 16);
    const float NEG_INF = decode_neg_inf();
    const float* ls = part_lse + row * splits;
    const float* ps_row = part_o + row * splits * HD + lane * PER_LANE;

    // The first batch of partials and this lane's first LSE are requested together, before
    // anything waits: the merge costs about two round trips, not one per reduction.
    float v[BATCH][PER_LANE];
#pragma unroll
    for (int j = 0; j < BATCH; ++j)
        if (j < splits) decode_load_l2<PER_LANE>(ps_row + j * HD, v[j]);
    const float l_first = lane < splits ? decode_load_l2(ls + lane) : NEG_INF;

    float mx = fmaxf(NEG_INF, l_first);
    for (int s = lane + CALICO_LANES; s < splits; s += CALICO_LANES) mx = fmaxf(mx, decode_load_l2(ls + s));
    mx = warp_max(mx);
    const float base = mx == NEG_INF ? 0.0f : mx;
    float total = 0.0f;
    if (lane < splits) total += exp2_approx(l_first - base);
    for (int s = lane + CALICO_LANES; s < splits; s += CALICO_LANES) total += exp2_approx(decode_load_l2(ls + s) - base);
    total = warp_sum(total);

    float out[PER_LANE];
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) out[i] = 0.0f;
    if (total > 0.0f) {
        const float inv = 1.0f / total;
        for (int s0 = 0; s0 < splits; s0 += CALICO_LANES) {
            const int mine = s0 + lane;  // lane j computes the weight of split s0 + j
            const float l_mine = s0 == 0 ? l_first : (mine < splits ? decode_load_l2(ls + mine) : NEG_INF);
            const float w_mine = mine < splits ? exp2_approx(l_mine - base) * inv : 0.0f;
            const int n = splits - s0 < CALICO_LANES ? splits - s0 : CALICO_LANES;
            const float* ps = ps_row + s0 * HD;
            for (int j0 = 0; j0 < n; j0 += BATCH) {
                if (s0 > 0 || j0 > 0) {  // the first batch is already in flight
#pragma unroll
                    for (int j = 0; j < BATCH; ++j)
                        if (j0 + j < n) decode_load_l2<PER_LANE>(ps + (j0 + j) * HD, v[j]);
                }
#pragma unroll
                for (int j = 0; j < BATCH; ++j) {
                    const float w = shfl(w_mine, (j0 + j) % CALICO_LANES);
                    if (j0 + j < n) {
#pragma unroll
                        for (int i = 0; i < PER_LANE; ++i) out[i] = fmaf(w, v[j][i], out[i]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        if (COLS == HD || lane * PER_LANE + i < COLS) orow[lane * PER_LANE + i] = from_float<T>(out[i]);
    }
    if (lane == 0) *lse_out = total > 0.0f ? (base + decode_log2(total)) * DECODE_LN2 : NEG_INF;
}

// decode_merge_row with its LSE reads hoisted (the fused kernel's `mpipe=1`): the same sums in
// the same order (bit-identical), but each lane reads the LSEs of splits lane, lane + lanes,
// ... (up to LSE_PER_LANE of them) once, beside the first batch of partials. decode_merge_row
// reads an LSE past the first lane's worth three times, each read waited for in turn (33 splits
// at b1 32k: ~5 dependent round trips after the count); here a row costs one round trip per
// batch of BATCH_SPLITS partials (0: 64 floats of registers). More splits than
// LSE_PER_LANE * lanes take decode_merge_row.
template <typename T, int HD, int BATCH_SPLITS = 0, int LSE_PER_LANE = 4, int COLS = HD>
CALICO_DEVICE void decode_merge_row_early(const float* part_o, const float* part_lse, long long row, int splits,
                                          T* orow, float* lse_out, int lane) {
    constexpr int LANES = CALICO_LANES;
    constexpr int PER_LANE = HD / LANES;
    constexpr int BATCH = BATCH_SPLITS > 0 ? BATCH_SPLITS : (PER_LANE >= 8 ? 8 : 16);
    static_assert(LANES % BATCH == 0, "a batch lies within one lane's stride of splits");
    if (splits > LSE_PER_LANE * LANES) {
        decode_merge_row<T, HD, BATCH_SPLITS, COLS>(part_o, part_lse, row, splits, orow, lse_out, lane);
        return;
    }
    const float NEG_INF = decode_neg_inf();
    const float* ls = part_lse + row * splits;
    const float* ps_row = part_o + row * splits * HD + lane * PER_LANE;
    float v[BATCH][PER_LANE];
    auto load_batch = [&](int s0) {
#pragma unroll
        for (int j = 0; j < BATCH; ++j)
            if (s0 + j < splits) decode_load_l2<PER_LANE>(ps_row + (s0 + j) * HD, v[j]);
    };
    load_batch(0);
    float lw[LSE_PER_LANE];  // the LSEs of splits lane + k * LANES, then their weights
#pragma unroll
    for (int k = 0; k < LSE_PER_LANE; ++k) lw[k] = lane + k * LANES < splits ? decode_load_l2(ls + lane + k * LANES) : NEG_INF;

    // The row's max and sum in decode_merge_row's order: this lane's splits in turn, then the
    // warp.
    float mx = NEG_INF;
#pragma unroll
    for (int k = 0; k < LSE_PER_LANE; ++k) mx = fmaxf(mx, lw[k]);
    mx = warp_max(mx);
    const float base = mx == NEG_INF ? 0.0f : mx;
    float total = 0.0f;
#pragma unroll
    for (int k = 0; k < LSE_PER_LANE; ++k)
        if (lane + k * LANES < splits) total += exp2_approx(lw[k] - base);
    total = warp_sum(total);

    float out[PER_LANE];
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) out[i] = 0.0f;
    // No branch on total > 0 (decode_merge_row's): ptxas moved loads of the first batch into
    // it, after the reductions, one round trip later. A row no split saw has weights 0 and
    // partials 0 (each split writes 0 there), so its sums are 0 as before.
    {
        const float inv = total > 0.0f ? 1.0f / total : 0.0f;
#pragma unroll
        for (int k = 0; k < LSE_PER_LANE; ++k) lw[k] = lane + k * LANES < splits ? exp2_approx(lw[k] - base) * inv : 0.0f;
        for (int s0 = 0; s0 < splits; s0 += BATCH) {
            if (s0 > 0) load_batch(s0);  // the first batch is already in flight
            // The weights of this batch's splits sit in lw[0] of lanes s0 % LANES ..: the next
            // lane's worth moves down at each multiple of LANES (moves, not an index into lw,
            // which the compiler put in local memory).
            if (s0 > 0 && s0 % LANES == 0) {
#pragma unroll
                for (int k = 0; k + 1 < LSE_PER_LANE; ++k) lw[k] = lw[k + 1];
            }
#pragma unroll
            for (int j = 0; j < BATCH; ++j) {
                const float wj = shfl(lw[0], (s0 + j) % LANES);
                if (s0 + j < splits) {
#pragma unroll
                    for (int i = 0; i < PER_LANE; ++i) out[i] = fmaf(wj, v[j][i], out[i]);
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        if (COLS == HD || lane * PER_LANE + i < COLS) orow[lane * PER_LANE + i] = from_float<T>(out[i]);
    }
    if (lane == 0) *lse_out = total > 0.0f ? (base + decode_log2(total)) * DECODE_LN2 : NEG_INF;
}

}  // namespace calico
