// Register-tile round trips written only against the shared tile vocabulary (calico/tiles.h),
// so this one source runs on NVIDIA (warps of 32) and AMD CDNA (wavefronts of 64). One
// warp/wavefront per R x C tile of a (batched) row-major matrix moves the tile into a register
// tile of layout L and back. Sizes need not be multiples of the tile: loads read zeros outside
// the matrix and stores clip. Grid: (col tiles, row tiles, batch); block: CALICO_LANES threads.
//
//   PATH 0  gl -> rt<L> -> gl
//   PATH 2  gl -> rt<row_l> -> st -> rt<L> -> gl      (16-bit; the shared tile's swizzle)
//   PATH 3  gl -> gt -> st -> rt<L> -> gl              (16-bit, 16-byte chunks; rows of the
//                                                      source must start on 16-byte boundaries)
#include "calico/tiles.h"

namespace vocab_roundtrip {

template <class T, class L, int R, int C, int PATH>
CALICO_DEVICE void run(const T* src, T* dst, int rows, int cols, long long src_stride, long long src_batch, long long dst_stride,
                       long long dst_batch) {
    const calico::gl<T> s{const_cast<T*>(src), rows, cols, src_stride, src_batch};
    const calico::gl<T> d{dst, rows, cols, dst_stride, dst_batch};
    const calico::coord tc{(int)calico::block_z(), (int)calico::block_y(), (int)calico::block_x()};
    calico::rt<T, R, C, L> t;
    if constexpr (PATH == 0) {
        calico::load(t, s, tc);
    } else if constexpr (PATH == 3) {
        __shared__ calico::st<T, R, C> sh;
        calico::gt<T, R, C, CALICO_LANES> staged;
        const int thread = static_cast<int>(calico::thread_x());
        calico::load(staged, s, tc, thread);
        calico::store(sh, staged, thread);
        calico::sync_threads();
        calico::load(t, sh);
    } else {
        __shared__ calico::st<T, R, C> sh;
        calico::rt<T, R, C, calico::row_l> r;
        calico::load(r, s, tc);
        calico::store(sh, r);
        calico::sync_threads();
        calico::load(t, sh);
    }
    calico::store(d, t, tc);
}

}  // namespace vocab_roundtrip

#define CALICO_VOCAB_ROUNDTRIP(NAME, T, L, R, C, PATH)                                                                         \
    CALICO_KERNEL CALICO_MAX_THREADS(CALICO_LANES) void NAME(const T* src, T* dst, int rows, int cols, long long src_stride, \
                                                             long long src_batch, long long dst_stride, long long dst_batch) {  \
        vocab_roundtrip::run<T, calico::L, R, C, PATH>(src, dst, rows, cols, src_stride, src_batch, dst_stride, dst_batch);  \
    }

// Entries: tiles_vocab_roundtrip_<dtype>_<layout>_p<path>_<R>x<C>. Shared tiles with rows of
// 32, 64 and 128 bytes (16, 32 and 64 16-bit columns).
CALICO_VOCAB_ROUNDTRIP(tiles_vocab_roundtrip_f32_row_p0_32x32, float, row_l, 32, 32, 0)
CALICO_VOCAB_ROUNDTRIP(tiles_vocab_roundtrip_f32_col_p0_32x32, float, col_l, 32, 32, 0)
CALICO_VOCAB_ROUNDTRIP(tiles_vocab_roundtrip_bf16_row_p0_32x64, bf16, row_l, 32, 64, 0)
CALICO_VOCAB_ROUNDTRIP(tiles_vocab_roundtrip_bf16_col_p0_32x64, bf16, col_l, 32, 64, 0)
CALICO_VOCAB_ROUNDTRIP(tiles_vocab_roundtrip_f16_row_p0_16x32, f16, row_l, 16, 32, 0)
CALICO_VOCAB_ROUNDTRIP(tiles_vocab_roundtrip_f16_col_p0_16x32, f16, col_l, 16, 32, 0)
CALICO_VOCAB_ROUNDTRIP(tiles_vocab_roundtrip_bf16_row_p2_16x64, bf16, row_l, 16, 64, 2)
CALICO_VOCAB_ROUNDTRIP(tiles_vocab_roundtrip_bf16_col_p2_16x64, bf16, col_l, 16, 64, 2)
CALICO_VOCAB_ROUNDTRIP(tiles_vocab_roundtrip_f16_row_p2_32x32, f16, row_l, 32, 32, 2)
CALICO_VOCAB_ROUNDTRIP(tiles_vocab_roundtrip_f16_col_p2_32x32, f16, col_l, 32, 32, 2)
CALICO_VOCAB_ROUNDTRIP(tiles_vocab_roundtrip_bf16_row_p2_32x16, bf16, row_l, 32, 16, 2)
CALICO_VOCAB_ROUNDTRIP(tiles_vocab_roundtrip_bf16_col_p2_32x16, bf16, col_l, 32, 16, 2)
// Path 3 (16-byte chunks through gt; a block of one warp/wavefront moves the whole tile).
CALICO_VOCAB_ROUNDTRIP(tiles_vocab_roundtrip_bf16_row_p3_16x64, bf16, row_l, 16, 64, 3)
CALICO_VOCAB_ROUNDTRIP(tiles_vocab_roundtrip_f16_col_p3_32x32, f16, col_l, 32, 32, 3)
CALICO_VOCAB_ROUNDTRIP(tiles_vocab_roundtrip_bf16_col_p3_32x16, bf16, col_l, 32, 16, 3)
