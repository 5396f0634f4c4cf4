// Merges the split partials of decode attention (decode.cu, decode_mma.cu) in split order: one
// warp per output row (sequence, query head, query token). Each split left its normalised
// output o_s and base-2 LSE l_s; the row's output is sum_s 2^(l_s - M) o_s / sum_s 2^(l_s - M) with M = max_s l_s, and
// its LSE (natural log) is (M + log2(sum_s 2^(l_s - M))) * ln 2. A row no split saw (M = -inf)
// gets O = 0 and LSE = -inf. The order of the sums is fixed, so results are bit-identical
// across runs.
//
// MERGE_BATCHED = 1 runs decode_merge_row (decode_common.h: vector loads, a batch of splits in
// flight per lane; the same sums in the same order) instead of the loop below.
//
// Defines: ELEM (output element type), HEAD_DIM, MERGE_BATCHED (0 | 1), HEAD_DIM_USED (the
// real head dim when it is below HEAD_DIM, decode.cu's: only those columns of O are written).
#include "calico/calico.h"
#include "attention/decode_common.h"

using namespace calico;

typedef ELEM T;

constexpr int WARPS = 4;
#ifndef HEAD_DIM_USED
#define HEAD_DIM_USED HEAD_DIM
#endif
constexpr int DIM = HEAD_DIM_USED;
constexpr int PER_LANE = (HEAD_DIM + CALICO_LANES - 1) / CALICO_LANES;

CALICO_KERNEL CALICO_MAX_THREADS(WARPS * CALICO_LANES) void calico_attention_decode_combine(
    const float* part_o, const float* part_lse, T* o, long long o_sb, long long o_sh, long long o_sn,
    float* lse, long long rows, int hq, int nq, int splits) {
    const long long row = (long long)block_x() * WARPS + warp_id();
    if (row >= rows) return;
    const long long qi = row % nq;
    const long long head = (row / nq) % hq;
    const long long b = row / ((long long)nq * hq);
    T* orow = o + b * o_sb + head * o_sh + qi * o_sn;
#if MERGE_BATCHED
    decode_merge_row<T, HEAD_DIM, 0, DIM>(part_o, part_lse, row, splits, orow, lse + row, lane_id());
#else
    const int lane = lane_id();
    const float NEG_INF = decode_neg_inf();
    const float* ls = part_lse + row * splits;

    float mx = NEG_INF;
    for (int s = lane; s < splits; s += CALICO_LANES) mx = fmaxf(mx, ls[s]);
    mx = warp_max(mx);
    const float base = mx == NEG_INF ? 0.0f : mx;
    float total = 0.0f;
    for (int s = lane; s < splits; s += CALICO_LANES) total += exp2_approx(ls[s] - base);
    total = warp_sum(total);

    float out[PER_LANE];
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) out[i] = 0.0f;
    if (total > 0.0f) {
        const float inv = 1.0f / total;
        // Lane j computes the weight of split s0 + j; the loop body has no branch on the data,
        // so the loads of several splits are in flight at once (a serial chain of L2 reads,
        // one per split, was most of this kernel's time at 32 splits). An empty split (LSE
        // -inf) has weight 0 and a zero partial: it adds nothing.
        for (int s0 = 0; s0 < splits; s0 += CALICO_LANES) {
            const int mine = s0 + lane;
            const float w_mine = mine < splits ? exp2_approx(ls[mine] - base) * inv : 0.0f;
            const int n = splits - s0 < CALICO_LANES ? splits - s0 : CALICO_LANES;
            const float* ps = part_o + (row * splits + s0) * HEAD_DIM;
#pragma unroll 16
            for (int j = 0; j < n; ++j) {
                const float w = shfl(w_mine, j);
#pragma unroll
                for (int i = 0; i < PER_LANE; ++i) {
                    const int d = lane + i * CALICO_LANES;
                    if (d < HEAD_DIM) out[i] = fmaf(w, ps[j * HEAD_DIM + d], out[i]);
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        const int d = lane + i * CALICO_LANES;
        if (d < DIM) orow[d] = from_float<T>(out[i]);
    }
    if (lane == 0) lse[row] = total > 0.0f ? (base + decode_log2(total)) * DECODE_LN2 : NEG_INF;
#endif
}
