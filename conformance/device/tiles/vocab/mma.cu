// Register-tile products written only against the shared tile vocabulary (calico/tiles.h):
// one source for NVIDIA (mma.sync) and AMD CDNA (MFMA 16x16x16). One warp/wavefront per M x N
// tile of D = op(A) op(B) + C over all K tiles. Operands come from global memory in the layout
// each form takes (zeros past the matrix edges, so partial K tiles add nothing); C and D are
// f32, D clipped at the edges. Grid: (N tiles, M tiles); block: CALICO_LANES threads.
//
//   FORM 0  mma_AB    A stored m x k (row_l tiles), B stored k x n (col_l)
//   FORM 1  mma_ABt   A stored m x k (row_l),       B stored n x k (row_l)
//   FORM 2  mma_AtB   A stored k x m (col_l),       B stored k x n (col_l)
//   FORM 3  mma_AtBt  A stored k x m (col_l),       B stored n x k (row_l)
//   FORM 4  mma_AB with both operands staged through shared tiles: A and B loaded row_l,
//           stored to st, read back as row_l (A) and col_l (B), as a GEMM main loop does
#include "calico/tiles.h"

namespace vocab_mma {

template <class T, int FORM, int M, int N, int K>
CALICO_DEVICE void run(const T* a, const T* b, const float* c, float* d, int m, int n, int k, long long a_stride, long long b_stride,
                       long long c_stride, long long d_stride) {
    constexpr bool A_T = FORM == 2 || FORM == 3, B_T = FORM == 1 || FORM == 3;
    const calico::gl<T> ga{const_cast<T*>(a), A_T ? k : m, A_T ? m : k, a_stride, 0};
    const calico::gl<T> gb{const_cast<T*>(b), B_T ? n : k, B_T ? k : n, b_stride, 0};
    const calico::gl<float> gc{const_cast<float*>(c), m, n, c_stride, 0};
    const calico::gl<float> gd{d, m, n, d_stride, 0};
    const int mi = (int)calico::block_y(), nj = (int)calico::block_x();
    calico::rt_fl<M, N> acc;
    calico::load(acc, gc, calico::coord{0, mi, nj});
    for (int kt = 0; kt * K < k; ++kt) {
        if constexpr (FORM == 0) {
            calico::rt<T, M, K, calico::row_l> ta;
            calico::rt<T, K, N, calico::col_l> tb;
            calico::load(ta, ga, calico::coord{0, mi, kt});
            calico::load(tb, gb, calico::coord{0, kt, nj});
            calico::mma_AB(acc, ta, tb, acc);
        } else if constexpr (FORM == 1) {
            calico::rt<T, M, K, calico::row_l> ta;
            calico::rt<T, N, K, calico::row_l> tb;
            calico::load(ta, ga, calico::coord{0, mi, kt});
            calico::load(tb, gb, calico::coord{0, nj, kt});
            calico::mma_ABt(acc, ta, tb, acc);
        } else if constexpr (FORM == 2) {
            calico::rt<T, K, M, calico::col_l> ta;
            calico::rt<T, K, N, calico::col_l> tb;
            calico::load(ta, ga, calico::coord{0, kt, mi});
            calico::load(tb, gb, calico::coord{0, kt, nj});
            calico::mma_AtB(acc, ta, tb, acc);
        } else if constexpr (FORM == 3) {
            calico::rt<T, K, M, calico::col_l> ta;
            calico::rt<T, N, K, calico::row_l> tb;
            calico::load(ta, ga, calico::coord{0, kt, mi});
            calico::load(tb, gb, calico::coord{0, nj, kt});
            calico::mma_AtBt(acc, ta, tb, acc);
        } else {
            __shared__ calico::st<T, M, K> sa;
            __shared__ calico::st<T, K, N> sb;
            calico::rt<T, M, K, calico::row_l> ta;
            calico::rt<T, K, N, calico::row_l> tb_rows;
            calico::load(ta, ga, calico::coord{0, mi, kt});
            calico::load(tb_rows, gb, calico::coord{0, kt, nj});
            calico::store(sa, ta);
            calico::store(sb, tb_rows);
            calico::sync_threads();
            calico::rt<T, K, N, calico::col_l> tb;
            calico::load(ta, sa);
            calico::load(tb, sb);
            // The next iteration overwrites the shared tiles.
            calico::sync_threads();
            calico::mma_AB(acc, ta, tb, acc);
        }
    }
    calico::store(gd, acc, calico::coord{0, mi, nj});
}

}  // namespace vocab_mma

#define CALICO_VOCAB_MMA(NAME, T, FORM, M, N, K)                                                                              \
    CALICO_KERNEL CALICO_MAX_THREADS(CALICO_LANES) void NAME(const T* a, const T* b, const float* c, float* d, int m, int n, \
                                                             int k, long long a_stride, long long b_stride,                  \
                                                             long long c_stride, long long d_stride) {                       \
        vocab_mma::run<T, FORM, M, N, K>(a, b, c, d, m, n, k, a_stride, b_stride, c_stride, d_stride);                      \
    }

// Entries: tiles_vocab_mma_<dtype>_<form>_<M>x<N>x<K>; `_smem` marks FORM 4 (shared tiles need
// rows of 32, 64 or 128 bytes on CDNA: no 48-column shared tiles).
CALICO_VOCAB_MMA(tiles_vocab_mma_bf16_ab_32x32x32, bf16, 0, 32, 32, 32)
CALICO_VOCAB_MMA(tiles_vocab_mma_bf16_abt_32x32x32, bf16, 1, 32, 32, 32)
CALICO_VOCAB_MMA(tiles_vocab_mma_bf16_atb_32x32x32, bf16, 2, 32, 32, 32)
CALICO_VOCAB_MMA(tiles_vocab_mma_bf16_atbt_32x32x32, bf16, 3, 32, 32, 32)
CALICO_VOCAB_MMA(tiles_vocab_mma_f16_ab_16x48x16, f16, 0, 16, 48, 16)
CALICO_VOCAB_MMA(tiles_vocab_mma_f16_abt_16x48x16, f16, 1, 16, 48, 16)
CALICO_VOCAB_MMA(tiles_vocab_mma_f16_atb_48x16x32, f16, 2, 48, 16, 32)
CALICO_VOCAB_MMA(tiles_vocab_mma_f16_atbt_48x16x32, f16, 3, 48, 16, 32)
CALICO_VOCAB_MMA(tiles_vocab_mma_bf16_ab_smem_32x32x32, bf16, 4, 32, 32, 32)
CALICO_VOCAB_MMA(tiles_vocab_mma_f16_ab_smem_16x64x32, f16, 4, 16, 64, 32)
