// wgmma (sm_90a) SS tile products: one warpgroup per 64 x N tile of D = A * B over all K
// tiles of 64. A (m x k, row-major) is loaded with cp.async into st<T, 64, 64> (128-byte rows,
// 128B swizzle: the K-major descriptor); B either
//   KMAJOR 1: stored n x k (B^T row-major) into st<T, N, 64>, K-major descriptor, or
//   KMAJOR 0: stored k x n into st<T, 64, N>, MN-major descriptor (64-column chunks, 8 KB apart).
// cp.async zero-fills past the matrix edges (k and, for N-major B, n must be multiples of 8).
//
// d: D (m x n, f32) stored from the accumulators viewed as rt_fl<16, N> per warp (the layout
//    wgmma.cuh documents), clipped at the edges;
// raw: the accumulator registers as they are, (tile * 128 + thread) * N / 2 + register, for the
//    host to check against calico_core::lanes' wgmma accumulator map;
// status[tile]: 1 when done, -1 when a shared tile is not 1024-aligned.
// Grid: (N tiles, M tiles); block: 128 threads.
#include "calico/tile_ops.cuh"
#include "calico/wgmma.cuh"

namespace tiles_wgmma {

constexpr int BK = 64;

template <class T, int N, int KMAJOR>
CALICO_DEVICE void run(const T* a, const T* b, float* d, float* raw, int* status, int m, int n, int k, long long a_stride,
                       long long b_stride, long long d_stride) {
    typedef calico::st<T, 64, BK> a_tile;
    typedef calico::st<T, KMAJOR ? N : BK, KMAJOR ? BK : N> b_tile;
    __shared__ a_tile sa;
    __shared__ b_tile sb;
    const calico::gl<T> ga{const_cast<T*>(a), m, k, a_stride, 0};
    const calico::gl<T> gb{const_cast<T*>(b), KMAJOR ? n : k, KMAJOR ? k : n, b_stride, 0};
    const calico::gl<float> gd{d, m, n, d_stride, 0};
    const int thread = (int)threadIdx.x, warp = thread / 32;
    const int mi = (int)blockIdx.y, nj = (int)blockIdx.x;
    const long long tile = (long long)blockIdx.y * gridDim.x + blockIdx.x;
    if (calico::smem_addr(&sa) % 1024 != 0 || calico::smem_addr(&sb) % 1024 != 0) {
        if (thread == 0) status[tile] = -1;
        return;
    }
    float acc[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) acc[i] = 0.0f;
    for (int kt = 0; kt * BK < k; ++kt) {
        calico::load_async(sa, ga, calico::coord{0, mi, kt}, thread, 128);
        calico::load_async(sb, gb, KMAJOR ? calico::coord{0, nj, kt} : calico::coord{0, kt, nj}, thread, 128);
        calico::cp_async_commit();
        calico::cp_async_wait<0>();
        // cp.async wrote through the generic proxy; wgmma reads through the async proxy.
        calico::fence_proxy_async();
        __syncthreads();
        calico::wgmma::fence_operands(acc);
        calico::wgmma::fence();
        const calico::uint32_t a_base = calico::smem_addr(sa.raw), b_base = calico::smem_addr(sb.raw);
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            const calico::uint64_t desc_a = calico::wgmma::desc_kmajor_128b(a_base + kk * 32);
            const calico::uint64_t desc_b = KMAJOR ? calico::wgmma::desc_kmajor_128b(b_base + kk * 32)
                                                   : calico::wgmma::desc_mnmajor_128b(b_base + kk * 16 * 128, BK);
            calico::wgmma::mma<T, N>::template ss<KMAJOR ? 0 : 1>(acc, desc_a, desc_b, 1);
        }
        calico::wgmma::commit_group();
        calico::wgmma::wait_group<0>();
        calico::wgmma::fence_operands(acc);
        // Every warp's wgmma has read the tiles before they are overwritten.
        __syncthreads();
    }
    calico::rt_fl<16, N> dt;
#pragma unroll
    for (int jb = 0; jb < N / 16; ++jb)
#pragma unroll
        for (int r = 0; r < 4; ++r) dt.data[0][jb][r] = make_float2(acc[8 * jb + 2 * r], acc[8 * jb + 2 * r + 1]);
    calico::store(gd, dt, calico::coord{0, 4 * mi + warp, nj});
#pragma unroll
    for (int i = 0; i < N / 2; ++i) raw[(tile * 128 + thread) * (N / 2) + i] = acc[i];
    if (thread == 0) status[tile] = 1;
}

}  // namespace tiles_wgmma

#define CALICO_TILES_WGMMA(NAME, T, N, KMAJOR)                                                                                  \
    CALICO_KERNEL void __launch_bounds__(128) NAME(const T* a, const T* b, float* d, float* raw, int* status, int m, int n, int k, \
                                                   long long a_stride, long long b_stride, long long d_stride) {                \
        tiles_wgmma::run<T, N, KMAJOR>(a, b, d, raw, status, m, n, k, a_stride, b_stride, d_stride);                            \
    }

// Entries: tiles_wgmma_<dtype>_n<N>_<kmajor|nmajor> (B's layout).
CALICO_TILES_WGMMA(tiles_wgmma_bf16_n64_kmajor, bf16, 64, 1)
CALICO_TILES_WGMMA(tiles_wgmma_bf16_n128_nmajor, bf16, 128, 0)
CALICO_TILES_WGMMA(tiles_wgmma_f16_n32_kmajor, f16, 32, 1)
