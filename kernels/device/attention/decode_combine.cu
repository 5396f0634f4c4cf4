// Merges the split partials of decode attention (decode.cu, decode_mma.cu) in a second launch:
// one warp per output row (sequence, query head, query token), through decode_merge_row
// (decode_common.h: split order fixed, bit-identical across runs).
//
// Defines: ELEM (output element type), HEAD_DIM.
#include "calico/calico.h"
#include "attention/decode_common.h"

using namespace calico;

typedef ELEM T;

constexpr int WARPS = 4;

CALICO_KERNEL CALICO_MAX_THREADS(WARPS * CALICO_LANES) void calico_attention_decode_combine(
    const float* part_o, const float* part_lse, T* o, long long o_sb, long long o_sh, long long o_sn,
    float* lse, long long rows, int hq, int nq, int splits) {
    const long long row = (long long)block_x() * WARPS + warp_id();
    if (row >= rows) return;
    const long long qi = row % nq;
    const long long head = (row / nq) % hq;
    const long long b = row / ((long long)nq * hq);
    decode_merge_row<T, HEAD_DIM>(part_o, part_lse, row, splits, o + b * o_sb + head * o_sh + qi * o_sn, lse + row,
                                  lane_id());
}
