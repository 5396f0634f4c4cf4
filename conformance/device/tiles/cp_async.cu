// cp.async global -> shared: one block of 96 threads per R x C tile of a row-major matrix
// (cols a multiple of 16 bytes' worth of elements, rows 16-byte aligned) loads the tile
// with load_async, then writes it out twice:
//   tile: the whole R x C tile read through st::ptr (16-byte pieces past the matrix edges
//         must read as zeros), at tile * R * C;
//   raw:  the shared tile's bytes as stored (16-bit words), at tile * st::bytes / 2, for the
//         host to check the swizzle against its own formula.
// Grid: (col tiles, row tiles, batch); block: 96 threads (three warps, so the copy loop's
// stride is not a power of two).
#include "calico/tile_ops.cuh"

namespace tiles_cp_async {

constexpr int THREADS = 96;

template <class T, int R, int C>
CALICO_DEVICE void run(const T* src, T* tile_out, unsigned short* raw_out, int rows, int cols, long long stride, long long batch_stride) {
    typedef calico::st<T, R, C> tile_t;
    __shared__ tile_t sh;
    const calico::gl<T> g{const_cast<T*>(src), rows, cols, stride, batch_stride};
    const calico::coord tc{(int)blockIdx.z, (int)blockIdx.y, (int)blockIdx.x};
    const long long tile = ((long long)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    const int thread = (int)threadIdx.x;
    calico::load_async(sh, g, tc, thread, THREADS);
    calico::cp_async_commit();
    calico::cp_async_wait<0>();
    __syncthreads();
    for (int i = thread; i < R * C; i += THREADS) tile_out[tile * R * C + i] = *sh.ptr(i / C, i % C);
    const unsigned short* words = reinterpret_cast<const unsigned short*>(sh.raw);
    for (int i = thread; i < tile_t::bytes / 2; i += THREADS) raw_out[tile * (tile_t::bytes / 2) + i] = words[i];
}

}  // namespace tiles_cp_async

#define CALICO_TILES_CP_ASYNC(NAME, T, R, C)                                                                                  \
    CALICO_KERNEL void __launch_bounds__(tiles_cp_async::THREADS)                                                             \
        NAME(const T* src, T* tile_out, unsigned short* raw_out, int rows, int cols, long long stride, long long batch_stride) { \
        tiles_cp_async::run<T, R, C>(src, tile_out, raw_out, rows, cols, stride, batch_stride);                               \
    }

// Entries: tiles_cp_async_<dtype>_<R>x<C>; shared-tile swizzles 128B, 64B, 32B, 128B.
CALICO_TILES_CP_ASYNC(tiles_cp_async_bf16_32x64, bf16, 32, 64)
CALICO_TILES_CP_ASYNC(tiles_cp_async_f16_16x32, f16, 16, 32)
CALICO_TILES_CP_ASYNC(tiles_cp_async_bf16_64x16, bf16, 64, 16)
CALICO_TILES_CP_ASYNC(tiles_cp_async_f32_16x32, float, 16, 32)
