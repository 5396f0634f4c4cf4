// Register-tile round trips: one warp per R x C tile of a (batched) row-major matrix moves
// the tile from global memory into a register tile of layout L and back, by one of three
// paths. Matrix sizes need not be multiples of the tile: loads read zeros outside the matrix
// and stores clip, so the output must equal the input inside the matrix and be untouched
// outside it. Grid: (col tiles, row tiles, batch); block: 32 threads.
//
//   PATH 0  gl -> rt<L> -> gl                       (load/store with global layouts)
//   PATH 1  gl -cp.async-> st -ldmatrix-> rt<L> -> gl   (16-bit; cols a multiple of 8)
//   PATH 2  gl -> rt<row> -> st -ldmatrix-> rt<L> -> gl (16-bit; shared stores, swizzle)
#include "calico/tile_ops.cuh"

namespace tiles_roundtrip {

template <class T, class L, int R, int C, int PATH>
CALICO_DEVICE void run(const T* src, T* dst, int rows, int cols, long long src_stride, long long src_batch, long long dst_stride,
                       long long dst_batch) {
    const calico::gl<T> s{const_cast<T*>(src), rows, cols, src_stride, src_batch};
    const calico::gl<T> d{dst, rows, cols, dst_stride, dst_batch};
    const calico::coord tc{(int)blockIdx.z, (int)blockIdx.y, (int)blockIdx.x};
    calico::rt<T, R, C, L> t;
    if constexpr (PATH == 0) {
        calico::load(t, s, tc);
    } else if constexpr (PATH == 1) {
        __shared__ calico::st<T, R, C> sh;
        calico::load_async(sh, s, tc, (int)threadIdx.x, 32);
        calico::cp_async_commit();
        calico::cp_async_wait<0>();
        __syncwarp();
        calico::load(t, sh);
    } else {
        __shared__ calico::st<T, R, C> sh;
        calico::rt<T, R, C, calico::row_l> r;
        calico::load(r, s, tc);
        calico::store(sh, r);
        __syncwarp();
        calico::load(t, sh);
    }
    calico::store(d, t, tc);
}

}  // namespace tiles_roundtrip

#define CALICO_TILES_ROUNDTRIP(NAME, T, L, R, C, PATH)                                                                          \
    CALICO_KERNEL void __launch_bounds__(32) NAME(const T* src, T* dst, int rows, int cols, long long src_stride,            \
                                                  long long src_batch, long long dst_stride, long long dst_batch) {           \
        tiles_roundtrip::run<T, calico::L, R, C, PATH>(src, dst, rows, cols, src_stride, src_batch, dst_stride, dst_batch); \
    }

// Entries: tiles_roundtrip_<dtype>_<layout>_p<path>_<R>x<C>. The host's VARIANTS list names
// the same set.
CALICO_TILES_ROUNDTRIP(tiles_roundtrip_f32_row_p0_32x32, float, row_l, 32, 32, 0)
CALICO_TILES_ROUNDTRIP(tiles_roundtrip_f32_col_p0_32x32, float, col_l, 32, 32, 0)
CALICO_TILES_ROUNDTRIP(tiles_roundtrip_bf16_row_p0_32x64, bf16, row_l, 32, 64, 0)
CALICO_TILES_ROUNDTRIP(tiles_roundtrip_bf16_col_p0_32x64, bf16, col_l, 32, 64, 0)
CALICO_TILES_ROUNDTRIP(tiles_roundtrip_f16_row_p0_16x32, f16, row_l, 16, 32, 0)
CALICO_TILES_ROUNDTRIP(tiles_roundtrip_f16_col_p0_16x32, f16, col_l, 16, 32, 0)
// cp.async + ldmatrix at each shared-tile swizzle: 32B (16 cols), 64B (32 cols), 128B (64 cols).
CALICO_TILES_ROUNDTRIP(tiles_roundtrip_bf16_row_p1_32x64, bf16, row_l, 32, 64, 1)
CALICO_TILES_ROUNDTRIP(tiles_roundtrip_bf16_col_p1_32x64, bf16, col_l, 32, 64, 1)
CALICO_TILES_ROUNDTRIP(tiles_roundtrip_f16_row_p1_16x32, f16, row_l, 16, 32, 1)
CALICO_TILES_ROUNDTRIP(tiles_roundtrip_f16_col_p1_32x16, f16, col_l, 32, 16, 1)
// register -> shared stores, then ldmatrix (plain and transposed).
CALICO_TILES_ROUNDTRIP(tiles_roundtrip_bf16_row_p2_16x64, bf16, row_l, 16, 64, 2)
CALICO_TILES_ROUNDTRIP(tiles_roundtrip_bf16_col_p2_16x64, bf16, col_l, 16, 64, 2)
CALICO_TILES_ROUNDTRIP(tiles_roundtrip_f16_col_p2_32x32, f16, col_l, 32, 32, 2)
