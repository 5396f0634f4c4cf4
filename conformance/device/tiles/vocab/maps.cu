// Elementwise maps and conversions of register tiles, written only against the shared tile
// vocabulary (calico/tiles.h): one source for NVIDIA and AMD CDNA. One warp/wavefront per
// R x C tile (row_l or col_l: maps must not care). Grid: (col tiles, row tiles); block:
// CALICO_LANES threads.
//
// `z` (type TI) receives five outputs, by batch index: exp2(x), x + y, x * y, x * s, and
// zero(t) + fill(u, s) (i.e. s everywhere). `w` (type TO) receives copy<TO>(x): the register
// conversion, rounding to nearest even. All outputs are clipped at the matrix edges.
#include "calico/tiles.h"

namespace vocab_maps {

template <class TI, class TO, class L, int R, int C>
CALICO_DEVICE void run(const TI* x, const TI* y, TI* z, TO* w, int rows, int cols, long long in_stride, long long z_stride,
                       long long z_batch, long long w_stride, float s) {
    const calico::gl<TI> gx{const_cast<TI*>(x), rows, cols, in_stride, 0};
    const calico::gl<TI> gy{const_cast<TI*>(y), rows, cols, in_stride, 0};
    const calico::gl<TI> gz{z, rows, cols, z_stride, z_batch};
    const calico::gl<TO> gw{w, rows, cols, w_stride, 0};
    const int tr = (int)calico::block_y(), tcol = (int)calico::block_x();
    calico::rt<TI, R, C, L> xt, yt, zt;
    calico::load(xt, gx, calico::coord{0, tr, tcol});
    calico::load(yt, gy, calico::coord{0, tr, tcol});
    calico::exp2(zt, xt);
    calico::store(gz, zt, calico::coord{0, tr, tcol});
    calico::add(zt, xt, yt);
    calico::store(gz, zt, calico::coord{1, tr, tcol});
    calico::mul(zt, xt, yt);
    calico::store(gz, zt, calico::coord{2, tr, tcol});
    calico::mul(zt, xt, s);
    calico::store(gz, zt, calico::coord{3, tr, tcol});
    calico::zero(zt);
    calico::rt<TI, R, C, L> ft;
    calico::fill(ft, s);
    calico::add(zt, zt, ft);
    calico::store(gz, zt, calico::coord{4, tr, tcol});
    calico::rt<TO, R, C, L> wt;
    calico::copy(wt, xt);
    calico::store(gw, wt, calico::coord{0, tr, tcol});
}

}  // namespace vocab_maps

#define CALICO_VOCAB_MAPS(NAME, TI, TO, L, R, C)                                                                              \
    CALICO_KERNEL CALICO_MAX_THREADS(CALICO_LANES) void NAME(const TI* x, const TI* y, TI* z, TO* w, int rows, int cols,    \
                                                             long long in_stride, long long z_stride, long long z_batch,     \
                                                             long long w_stride, float s) {                                  \
        vocab_maps::run<TI, TO, calico::L, R, C>(x, y, z, w, rows, cols, in_stride, z_stride, z_batch, w_stride, s);        \
    }

// Entries: tiles_vocab_maps_<in>_to_<out>_<layout>_<R>x<C>.
CALICO_VOCAB_MAPS(tiles_vocab_maps_f32_to_bf16_row_32x32, float, bf16, row_l, 32, 32)
CALICO_VOCAB_MAPS(tiles_vocab_maps_bf16_to_f32_col_32x32, bf16, float, col_l, 32, 32)
CALICO_VOCAB_MAPS(tiles_vocab_maps_f32_to_f16_col_16x32, float, f16, col_l, 16, 32)
CALICO_VOCAB_MAPS(tiles_vocab_maps_f16_to_f32_row_16x16, f16, float, row_l, 16, 16)
