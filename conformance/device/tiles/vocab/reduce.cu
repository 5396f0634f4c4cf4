// Row/column reductions and broadcasts of row_l register tiles, written only against the
// shared tile vocabulary (calico/tiles.h): one source for NVIDIA and AMD CDNA. A portable
// kernel never looks inside a register vector (which lane holds which row differs by vendor),
// so reductions are checked by broadcasting them back over their tile, and the broadcast
// vectors are made by reductions. One warp/wavefront per R x C tile of a row-major matrix
// (zeros past its edges). Grid: (col tiles, row tiles); block: CALICO_LANES threads.
//
// `red` (f32) receives four outputs, by batch index: every element replaced by its tile row's
// max, its tile row's sum, its tile column's max, its tile column's sum (over the whole tile,
// zeros past the matrix edges included).
// `y` (type T) receives five outputs: sub_row, mul_row, div_row with the per-row vector and
// add_col, mul_col with the per-column vector. Those vectors are row_max / col_max of the f32
// matrices `vr` (every row constant) and `vc` (every column constant), which cover whole
// tiles (`v_rows` x `v_cols`, row stride `v_cols`): a max of equal values is exact.
// All outputs are clipped at the matrix edges.
#include "calico/tiles.h"

namespace vocab_reduce {

template <class T, int R, int C>
CALICO_DEVICE void run(const T* x, const float* vr, const float* vc, float* red, T* y, int rows, int cols, int v_rows, int v_cols,
                       long long x_stride, long long red_batch, long long y_stride, long long y_batch) {
    const calico::gl<T> gx{const_cast<T*>(x), rows, cols, x_stride, 0};
    const calico::gl<float> gvr{const_cast<float*>(vr), v_rows, v_cols, v_cols, 0};
    const calico::gl<float> gvc{const_cast<float*>(vc), v_rows, v_cols, v_cols, 0};
    const calico::gl<float> gred{red, rows, cols, cols, red_batch};
    const calico::gl<T> gy{y, rows, cols, y_stride, y_batch};
    const int tr = (int)calico::block_y(), tcol = (int)calico::block_x();
    calico::rt<T, R, C, calico::row_l> xt;
    calico::load(xt, gx, calico::coord{0, tr, tcol});

    calico::rv<R, calico::per_row> rmax, rsum;
    calico::rv<C, calico::per_col> cmax, csum;
    calico::row_max(rmax, xt);
    calico::row_sum(rsum, xt);
    calico::col_max(cmax, xt);
    calico::col_sum(csum, xt);
    calico::rt_fl<R, C> zeros, spread;
    calico::zero(zeros);
    const auto take = [](float, float v) { return v; };
    calico::row_map(spread, zeros, rmax, take);
    calico::store(gred, spread, calico::coord{0, tr, tcol});
    calico::row_map(spread, zeros, rsum, take);
    calico::store(gred, spread, calico::coord{1, tr, tcol});
    calico::col_map(spread, zeros, cmax, take);
    calico::store(gred, spread, calico::coord{2, tr, tcol});
    calico::col_map(spread, zeros, csum, take);
    calico::store(gred, spread, calico::coord{3, tr, tcol});

    calico::rt_fl<R, C> vt;
    calico::rv<R, calico::per_row> v_row;
    calico::rv<C, calico::per_col> v_col;
    calico::load(vt, gvr, calico::coord{0, tr, tcol});
    calico::row_max(v_row, vt);
    calico::load(vt, gvc, calico::coord{0, tr, tcol});
    calico::col_max(v_col, vt);
    calico::rt<T, R, C, calico::row_l> yt;
    calico::sub_row(yt, xt, v_row);
    calico::store(gy, yt, calico::coord{0, tr, tcol});
    calico::mul_row(yt, xt, v_row);
    calico::store(gy, yt, calico::coord{1, tr, tcol});
    calico::div_row(yt, xt, v_row);
    calico::store(gy, yt, calico::coord{2, tr, tcol});
    calico::add_col(yt, xt, v_col);
    calico::store(gy, yt, calico::coord{3, tr, tcol});
    calico::mul_col(yt, xt, v_col);
    calico::store(gy, yt, calico::coord{4, tr, tcol});
}

}  // namespace vocab_reduce

#define CALICO_VOCAB_REDUCE(NAME, T, R, C)                                                                                      \
    CALICO_KERNEL CALICO_MAX_THREADS(CALICO_LANES) void NAME(const T* x, const float* vr, const float* vc, float* red, T* y,   \
                                                             int rows, int cols, int v_rows, int v_cols, long long x_stride,   \
                                                             long long red_batch, long long y_stride, long long y_batch) {     \
        vocab_reduce::run<T, R, C>(x, vr, vc, red, y, rows, cols, v_rows, v_cols, x_stride, red_batch, y_stride, y_batch);    \
    }

// Entries: tiles_vocab_reduce_<dtype>_<R>x<C>.
CALICO_VOCAB_REDUCE(tiles_vocab_reduce_f32_16x64, float, 16, 64)
CALICO_VOCAB_REDUCE(tiles_vocab_reduce_bf16_32x32, bf16, 32, 32)
CALICO_VOCAB_REDUCE(tiles_vocab_reduce_f16_16x32, f16, 16, 32)
CALICO_VOCAB_REDUCE(tiles_vocab_reduce_bf16_64x16, bf16, 64, 16)
