// Row/column reductions and broadcasts of row_l register tiles. One warp per R x C tile of
// a row-major matrix (zeros past its edges). Grid: (col tiles, row tiles); block: 32 threads.
//
// reductions: every lane writes its whole register vectors, so the host checks both the
//   values and the rv layout (per_row: rows 16i + g + 8h; per_col: cols 16j + 2t + {0, 1}
//   and 16j + 2t + 8 + {0, 1}) and that every lane of a quad / column group got the result.
//   Per lane, PER_LANE floats: row_max[R/16][2], row_sum[R/16][2], col_max[C/16][4],
//   col_sum[C/16][4]; lane record (tile * 32 + lane) * PER_LANE.
// broadcasts: five outputs (batch index of `y`): sub_row, mul_row, div_row with v_row (one
//   float per matrix row), add_col, mul_col with v_col (one per column); clipped at the edges.
#include "calico/tile_ops.cuh"

namespace tiles_reduce {

template <class T, int R, int C>
CALICO_DEVICE void run(const T* x, const float* v_row, const float* v_col, float* red, T* y, int rows, int cols, long long x_stride,
                       long long y_stride, long long y_batch) {
    constexpr int PER_LANE = 2 * (R / 16) * 2 + 2 * (C / 16) * 4;
    const calico::gl<T> gx{const_cast<T*>(x), rows, cols, x_stride, 0};
    const calico::gl<T> gy{y, rows, cols, y_stride, y_batch};
    const int lane = (int)threadIdx.x, g = lane / 4, t = lane % 4;
    const int tr = (int)blockIdx.y, tcol = (int)blockIdx.x;
    const int tile = tr * (int)gridDim.x + tcol;
    calico::rt<T, R, C, calico::row_l> xt;
    calico::load(xt, gx, calico::coord{0, tr, tcol});

    calico::rv<R, calico::per_row> rmax, rsum;
    calico::rv<C, calico::per_col> cmax, csum;
    calico::row_max(rmax, xt);
    calico::row_sum(rsum, xt);
    calico::col_max(cmax, xt);
    calico::col_sum(csum, xt);
    float* out = red + ((long long)tile * 32 + lane) * PER_LANE;
    int o = 0;
#pragma unroll
    for (int i = 0; i < R / 16; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) out[o++] = rmax.data[i][h];
#pragma unroll
    for (int i = 0; i < R / 16; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) out[o++] = rsum.data[i][h];
#pragma unroll
    for (int j = 0; j < C / 16; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) out[o++] = cmax.data[j][q];
#pragma unroll
    for (int j = 0; j < C / 16; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) out[o++] = csum.data[j][q];

    // Broadcast vectors in the documented rv layouts (1 past the edges: harmless for div).
    calico::rv<R, calico::per_row> vr;
    calico::rv<C, calico::per_col> vc;
#pragma unroll
    for (int i = 0; i < R / 16; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = tr * R + 16 * i + g + 8 * h;
            vr.data[i][h] = r < rows ? v_row[r] : 1.0f;
        }
#pragma unroll
    for (int j = 0; j < C / 16; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int c = tcol * C + 16 * j + 2 * t + (q & 1) + 8 * (q >> 1);
            vc.data[j][q] = c < cols ? v_col[c] : 1.0f;
        }
    calico::rt<T, R, C, calico::row_l> yt;
    calico::sub_row(yt, xt, vr);
    calico::store(gy, yt, calico::coord{0, tr, tcol});
    calico::mul_row(yt, xt, vr);
    calico::store(gy, yt, calico::coord{1, tr, tcol});
    calico::div_row(yt, xt, vr);
    calico::store(gy, yt, calico::coord{2, tr, tcol});
    calico::add_col(yt, xt, vc);
    calico::store(gy, yt, calico::coord{3, tr, tcol});
    calico::mul_col(yt, xt, vc);
    calico::store(gy, yt, calico::coord{4, tr, tcol});
}

}  // namespace tiles_reduce

#define CALICO_TILES_REDUCE(NAME, T, R, C)                                                                                      \
    CALICO_KERNEL void __launch_bounds__(32) NAME(const T* x, const float* v_row, const float* v_col, float* red, T* y, int rows, \
                                                  int cols, long long x_stride, long long y_stride, long long y_batch) {        \
        tiles_reduce::run<T, R, C>(x, v_row, v_col, red, y, rows, cols, x_stride, y_stride, y_batch);                          \
    }

// Entries: tiles_reduce_<dtype>_<R>x<C>.
CALICO_TILES_REDUCE(tiles_reduce_f32_16x64, float, 16, 64)
CALICO_TILES_REDUCE(tiles_reduce_bf16_32x32, bf16, 32, 32)
CALICO_TILES_REDUCE(tiles_reduce_f16_16x32, f16, 16, 32)
