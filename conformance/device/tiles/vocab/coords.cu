// Element coordinates (map_rc), transposes, and register-vector maps (map, map2, fill on rv),
// written only against the shared tile vocabulary (calico/tiles.h): one source for NVIDIA and
// AMD CDNA.
// One warp/wavefront per R x C tile of a row-major matrix (zeros past its edges). Grid:
// (col tiles, row tiles); block: CALICO_LANES threads.
//
// `z` (f32) receives six outputs, by batch index, from the tile `x` loaded as T in layout L:
//   0: map_rc -> the element's row within its tile      1: map_rc -> its column
//   2: map_rc -> x where (row + 2 col) % 3 == 0, else -x (the value passes through)
// and from `x` loaded as an f32 row_l tile, broadcast back over the tile with row_map/col_map:
//   3: map2(map(row_max, 2v + 1), row_max, a - b)   = the tile row's max + 1
//   4: map(col_max, v / 2)                          = the tile column's max / 2
//   5: fill(row vector, s)                          = s
// `zt` (f32, cols x rows, row stride zt_stride) receives x^T: x loaded col_l, transposed to a
// row_l tile (transpose) and stored.
// All outputs are clipped at the matrix edges.
#include "calico/tiles.h"

namespace vocab_coords {

template <class T, class L, int R, int C>
CALICO_DEVICE void run(const T* x, float* z, float* zt, int rows, int cols, long long x_stride, long long z_stride, long long z_batch,
                       long long zt_stride, float s) {
    const calico::gl<T> gx{const_cast<T*>(x), rows, cols, x_stride, 0};
    const calico::gl<float> gz{z, rows, cols, z_stride, z_batch};
    const int tr = (int)calico::block_y(), tcol = (int)calico::block_x();
    calico::rt<T, R, C, L> xt, yt;
    calico::load(xt, gx, calico::coord{0, tr, tcol});
    calico::map_rc(yt, xt, [](int r, int, float) { return (float)r; });
    calico::store(gz, yt, calico::coord{0, tr, tcol});
    calico::map_rc(yt, xt, [](int, int c, float) { return (float)c; });
    calico::store(gz, yt, calico::coord{1, tr, tcol});
    calico::map_rc(yt, xt, [](int r, int c, float v) { return (r + 2 * c) % 3 == 0 ? v : -v; });
    calico::store(gz, yt, calico::coord{2, tr, tcol});

    calico::rt_fl<R, C> xf, spread;
    calico::load(xf, gx, calico::coord{0, tr, tcol});
    const auto take = [](float, float v) { return v; };
    calico::rv<R, calico::per_row> m, m2;
    calico::row_max(m, xf);
    calico::map(m2, m, [](float v) { return 2.0f * v + 1.0f; });
    calico::map2(m2, m2, m, [](float a, float b) { return a - b; });
    calico::row_map(spread, xf, m2, take);
    calico::store(gz, spread, calico::coord{3, tr, tcol});
    calico::rv<C, calico::per_col> cm;
    calico::col_max(cm, xf);
    calico::map(cm, cm, [](float v) { return 0.5f * v; });
    calico::col_map(spread, xf, cm, take);
    calico::store(gz, spread, calico::coord{4, tr, tcol});
    calico::fill(m, s);
    calico::row_map(spread, xf, m, take);
    calico::store(gz, spread, calico::coord{5, tr, tcol});

    const calico::gl<float> gzt{zt, cols, rows, zt_stride, 0};
    calico::rt<T, R, C, calico::col_l> xc;
    calico::rt<T, C, R, calico::row_l> xtr;
    calico::load(xc, gx, calico::coord{0, tr, tcol});
    calico::transpose(xtr, xc);
    calico::store(gzt, xtr, calico::coord{0, tcol, tr});
}

}  // namespace vocab_coords

#define CALICO_VOCAB_COORDS(NAME, T, L, R, C)                                                                                \
    CALICO_KERNEL CALICO_MAX_THREADS(CALICO_LANES) void NAME(const T* x, float* z, float* zt, int rows, int cols,          \
                                                             long long x_stride, long long z_stride, long long z_batch,      \
                                                             long long zt_stride, float s) {                                 \
        vocab_coords::run<T, calico::L, R, C>(x, z, zt, rows, cols, x_stride, z_stride, z_batch, zt_stride, s);            \
    }

// Entries: tiles_vocab_coords_<dtype>_<layout>_<R>x<C>.
CALICO_VOCAB_COORDS(tiles_vocab_coords_bf16_row_32x64, bf16, row_l, 32, 64)
CALICO_VOCAB_COORDS(tiles_vocab_coords_bf16_col_32x32, bf16, col_l, 32, 32)
CALICO_VOCAB_COORDS(tiles_vocab_coords_f16_col_16x48, f16, col_l, 16, 48)
CALICO_VOCAB_COORDS(tiles_vocab_coords_f32_row_16x16, float, row_l, 16, 16)
