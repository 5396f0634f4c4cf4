// TMA (sm_90) round trips: one block per box loads the box into a shared tile with TMA,
// dumps it through st::ptr (so the host sees what landed in shared memory: zeros for the
// parts of the box outside the tensor) and stores it back with TMA into a second tensor
// (which must receive exactly the in-bounds part: the host poisons everything around it, and
// accepts only the box's zeros in the rest of a row's last 16-byte chunk, which TMA stores
// write whole).
// Loads may start before the tensor; stores may not (tma.cuh): boxes whose store coordinates
// are negative are refused by tma::try_store_* and reported (status -3), their in-bounds part
// left unwritten. With `unchecked` != 0 the stores are issued regardless (tma::store_*), to
// show that the hardware faults on them.
//
// 2-D: tma::load_2d / store_2d, one box {C, R} per tile (C * sizeof(T) <= 128: one swizzle
//      chunk). Box (x, y) starts at element (col_origin + C * x, row_origin + R * y); the
//      origins may be negative, so the first boxes hang over the top/left edges too.
// 3-D: tile_ops' load_tma (one box {64, R, 1} per 128-byte chunk of an R x 128 bf16 tile,
//      the layout of st<bf16, R, 128>) and tma::store_3d per chunk; block z is the batch.
//
// tile_out: the R x C tile as read through st::ptr, at tile * R * C (tile = block index,
// x fastest). status[tile]: 1 when done, -1 when the shared tile is not 1024-aligned, -2 when
// the mbarrier never completed (a bounded wait instead of a hang), -3 when the store was
// refused (a negative or misaligned store coordinate). Block: 32 threads.
#include "calico/tile_ops.cuh"

namespace tiles_tma {

constexpr unsigned MAX_POLLS = 1u << 24;

CALICO_DEVICE bool bounded_wait(calico::mbarrier& bar, calico::uint32_t parity) {
    for (unsigned i = 0; i < MAX_POLLS; ++i)
        if (calico::test_wait(bar, parity)) return true;
    return false;
}

template <class T, int R, int C, int RANK>
CALICO_DEVICE void run(const calico::tensor_map& in_map, const calico::tensor_map& out_map, T* tile_out, int* status, int col_origin,
                       int row_origin, int unchecked) {
    typedef calico::st<T, R, C> tile_t;
    static_assert(RANK == 3 || C * (int)sizeof(T) <= 128, "2-D boxes are one swizzle chunk wide");
    __shared__ tile_t sh;
    __shared__ calico::mbarrier bar;
    const long long tile = ((long long)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    const int thread = (int)threadIdx.x;
    if (calico::smem_addr(&sh) % 1024 != 0) {
        if (thread == 0) status[tile] = -1;
        return;
    }
    const int c0 = col_origin + C * (int)blockIdx.x, r0 = row_origin + R * (int)blockIdx.y, batch = (int)blockIdx.z;
    if (thread == 0) {
        calico::init(bar, 1);
        calico::fence_barrier_init();
    }
    __syncthreads();
    if (thread == 0) {
        calico::tma::prefetch(in_map);
        calico::arrive_expect_tx(bar, tile_t::bytes);
        if constexpr (RANK == 2) {
            calico::tma::load_2d(sh.raw, in_map, c0, r0, bar);
        } else {
            calico::load_tma(sh, in_map, calico::coord{batch, (int)blockIdx.y, (int)blockIdx.x}, bar);
        }
    }
    if (!bounded_wait(bar, 0)) {
        if (thread == 0) status[tile] = -2;
        return;
    }
    for (int i = thread; i < R * C; i += 32) tile_out[tile * R * C + i] = *sh.ptr(i / C, i % C);
    // Only the async proxy wrote the tile, but be explicit before handing it to the TMA store.
    calico::fence_proxy_async();
    __syncthreads();
    if (thread == 0) {
        bool stored = true;
        if constexpr (RANK == 2) {
            if (unchecked)
                calico::tma::store_2d(out_map, sh.raw, c0, r0);
            else
                stored = calico::tma::try_store_2d<T>(out_map, sh.raw, c0, r0);
        } else {
#pragma unroll
            for (int chunk = 0; chunk < C / tile_t::chunk_cols; ++chunk) {
                const unsigned char* src = sh.raw + chunk * tile_t::chunk_bytes;
                const int cc = c0 + chunk * tile_t::chunk_cols;
                if (unchecked)
                    calico::tma::store_3d(out_map, src, cc, r0, batch);
                else
                    stored = calico::tma::try_store_3d<T>(out_map, src, cc, r0, batch) && stored;
            }
        }
        calico::tma::store_commit();
        calico::tma::store_wait<0>();
        status[tile] = stored ? 1 : -3;
    }
}

}  // namespace tiles_tma

#define CALICO_TILES_TMA(NAME, T, R, C, RANK)                                                                                     \
    CALICO_KERNEL void __launch_bounds__(32)                                                                                     \
        NAME(const __grid_constant__ calico::tensor_map in_map, const __grid_constant__ calico::tensor_map out_map, T* tile_out, \
             int* status, int col_origin, int row_origin, int unchecked) {                                                       \
        tiles_tma::run<T, R, C, RANK>(in_map, out_map, tile_out, status, col_origin, row_origin, unchecked);                    \
    }

// Entries: tiles_tma_<rank>d_<dtype>_<R>x<C>; 2-D boxes at each swizzle (128B, 64B, 32B, and
// f32 at 128B).
CALICO_TILES_TMA(tiles_tma_2d_bf16_32x64, bf16, 32, 64, 2)
CALICO_TILES_TMA(tiles_tma_2d_f16_16x32, f16, 16, 32, 2)
CALICO_TILES_TMA(tiles_tma_2d_bf16_64x16, bf16, 64, 16, 2)
CALICO_TILES_TMA(tiles_tma_2d_f32_8x32, float, 8, 32, 2)
CALICO_TILES_TMA(tiles_tma_3d_bf16_16x128, bf16, 16, 128, 3)
