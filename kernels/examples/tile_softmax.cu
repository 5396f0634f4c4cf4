// A user tile kernel (docs/tile-kernels.md builds it step by step): softmax(x * scale) over
// rows of a bf16 matrix with COLS columns (a multiple of 16, set from Rust), into f32. One
// warp (NVIDIA, 32 lanes) or wavefront (AMD, 64 lanes) per block handles 16 rows; rows past
// the end read as 0 and are not written. Only the shared tile vocabulary is used, so the same
// text compiles for sm_80, sm_90a, gfx90a and gfx942.
#include "calico/tiles.h"

using namespace calico;

CALICO_KERNEL CALICO_MAX_THREADS(CALICO_LANES) void tile_softmax(const bf16* x, float* y, int rows, float scale_log2e) {
    const gl<bf16> xg = {const_cast<bf16*>(x), rows, COLS, COLS, 0};
    const gl<float> yg = {y, rows, COLS, COLS, 0};
    const coord tile = {0, static_cast<int>(block_x()), 0};

    rt_bf<16, COLS> xb;
    load(xb, xg, tile);
    rt_fl<16, COLS> s;
    copy(s, xb);
    mul(s, s, scale_log2e);  // softmax(v) = 2^(v log2 e - max) / sum

    row_vec<rt_fl<16, COLS>> row_m, row_l;
    row_max(row_m, s);
    sub_row(s, s, row_m);
    exp2(s, s);
    row_sum(row_l, s);
    div_row(s, s, row_l);
    store(yg, s, tile);
}
