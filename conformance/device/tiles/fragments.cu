// Fragment dumps: one warp fills a 16x16 register tile and writes every lane's registers out
// unchanged, so the host can compare each (lane, register) with calico_core::lanes. The input
// matrix holds 16 * row + col at (row, col) (exact in every dtype), so each dumped value names
// the element it came from.
//
//   MODE 0  load from global (tile.cuh's base_coord: the software side of the layout)
//   MODE 1  cp.async into a shared tile, then ldmatrix (.trans for col_l): the hardware's
//   MODE 2  mma.sync: D = I * X with I the identity (row_l A) and X the input (col_l B), so D
//           arrives in the accumulator layout the tensor core itself writes.
//
// out: 32 lanes x 8 floats, lane-major; float 2k + p of a lane is element p of register k of
// the (only) base tile. Block: 32 threads.
#include "calico/tile_ops.cuh"

namespace tiles_fragments {

template <class T, class L, int MODE>
CALICO_DEVICE void run(const T* src, float* out) {
    const calico::gl<T> g{const_cast<T*>(src), 16, 16, 16, 0};
    const calico::coord tc{0, 0, 0};
    const int lane = (int)threadIdx.x;
    float dump[8];
    if constexpr (MODE == 2) {
        // The identity as a row_l A tile: element (r, c) is 1 where r == c.
        calico::rt<T, 16, 16, calico::row_l> a;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            int r, c;
            calico::base_coord<calico::row_l>(lane, k, r, c);
            a.data[0][0][k] = calico::pack<T>(r == c ? 1.0f : 0.0f, r == c + 1 ? 1.0f : 0.0f);
        }
        calico::rt<T, 16, 16, calico::col_l> b;
        calico::load(b, g, tc);
        calico::rt_fl<16, 16> d;
        calico::zero(d);
        calico::mma_AB(d, a, b, d);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            dump[2 * k] = d.data[0][0][k].x;
            dump[2 * k + 1] = d.data[0][0][k].y;
        }
    } else {
        calico::rt<T, 16, 16, L> t;
        if constexpr (MODE == 0) {
            calico::load(t, g, tc);
        } else {
            __shared__ calico::st<T, 16, 16> sh;
            calico::load_async(sh, g, tc, lane, 32);
            calico::cp_async_commit();
            calico::cp_async_wait<0>();
            __syncwarp();
            calico::load(t, sh);
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const float2 v = calico::unpack(t.data[0][0][k]);
            dump[2 * k] = v.x;
            dump[2 * k + 1] = v.y;
        }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) out[lane * 8 + e] = dump[e];
}

}  // namespace tiles_fragments

#define CALICO_TILES_FRAGMENTS(NAME, T, L, MODE) \
    CALICO_KERNEL void __launch_bounds__(32) NAME(const T* src, float* out) { tiles_fragments::run<T, calico::L, MODE>(src, out); }

CALICO_TILES_FRAGMENTS(tiles_fragments_f32_row_m0, float, row_l, 0)
CALICO_TILES_FRAGMENTS(tiles_fragments_f32_col_m0, float, col_l, 0)
CALICO_TILES_FRAGMENTS(tiles_fragments_bf16_row_m0, bf16, row_l, 0)
CALICO_TILES_FRAGMENTS(tiles_fragments_bf16_col_m0, bf16, col_l, 0)
CALICO_TILES_FRAGMENTS(tiles_fragments_bf16_row_m1, bf16, row_l, 1)
CALICO_TILES_FRAGMENTS(tiles_fragments_bf16_col_m1, bf16, col_l, 1)
CALICO_TILES_FRAGMENTS(tiles_fragments_f16_row_m1, f16, row_l, 1)
CALICO_TILES_FRAGMENTS(tiles_fragments_f16_col_m1, f16, col_l, 1)
CALICO_TILES_FRAGMENTS(tiles_fragments_bf16_acc_m2, bf16, row_l, 2)
CALICO_TILES_FRAGMENTS(tiles_fragments_f16_acc_m2, f16, row_l, 2)
