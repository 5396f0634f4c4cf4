// Register-tile round trips through CUDA's async copy: one warp per R x C tile of a (batched)
// row-major matrix moves the tile gl -cp.async-> st -ldmatrix-> rt<L> -> gl (16-bit; cols a
// multiple of 8). Matrix sizes need not be multiples of the tile: loads read zeros outside the
// matrix and stores clip, so the output must equal the input inside the matrix and be
// untouched outside it. Grid: (col tiles, row tiles, batch); block: 32 threads.
//
// The vendor-neutral paths (gl -> rt -> gl, and register -> shared stores -> rt) are tested on
// both vendors by vocab/roundtrip.cu; this file keeps only what is CUDA's own.
#include "calico/tile_ops.cuh"

namespace tiles_roundtrip {

template <class T, class L, int R, int C>
CALICO_DEVICE void run(const T* src, T* dst, int rows, int cols, long long src_stride, long long src_batch, long long dst_stride,
                       long long dst_batch) {
    const calico::gl<T> s{const_cast<T*>(src), rows, cols, src_stride, src_batch};
    const calico::gl<T> d{dst, rows, cols, dst_stride, dst_batch};
    const calico::coord tc{(int)blockIdx.z, (int)blockIdx.y, (int)blockIdx.x};
    calico::rt<T, R, C, L> t;
    __shared__ calico::st<T, R, C> sh;
    calico::load_async(sh, s, tc, (int)threadIdx.x, 32);
    calico::cp_async_commit();
    calico::cp_async_wait<0>();
    __syncwarp();
    calico::load(t, sh);
    calico::store(d, t, tc);
}

}  // namespace tiles_roundtrip

#define CALICO_TILES_ROUNDTRIP(NAME, T, L, R, C)                                                                          \
    CALICO_KERNEL void __launch_bounds__(32) NAME(const T* src, T* dst, int rows, int cols, long long src_stride,            \
                                                  long long src_batch, long long dst_stride, long long dst_batch) {           \
        tiles_roundtrip::run<T, calico::L, R, C>(src, dst, rows, cols, src_stride, src_batch, dst_stride, dst_batch); \
    }

// Entries: tiles_roundtrip_<dtype>_<layout>_<R>x<C>, cp.async + ldmatrix at each shared-tile
// swizzle: 32B (16 cols), 64B (32 cols), 128B (64 cols). The host's ROUNDTRIP list names the
// same set.
CALICO_TILES_ROUNDTRIP(tiles_roundtrip_bf16_row_32x64, bf16, row_l, 32, 64)
CALICO_TILES_ROUNDTRIP(tiles_roundtrip_bf16_col_32x64, bf16, col_l, 32, 64)
CALICO_TILES_ROUNDTRIP(tiles_roundtrip_f16_row_16x32, f16, row_l, 16, 32)
CALICO_TILES_ROUNDTRIP(tiles_roundtrip_f16_col_32x16, f16, col_l, 32, 16)
