// The second half of the Hopper GEMM's split-K form (hopper.cu, SPLIT_K): sums the f32
// partials of the k-splits and applies the GEMM epilogue,
//   D = act(alpha * (P[0] + P[1] + ... + P[splits - 1]) + beta * C + bias[col]),
// in split order, so the result does not depend on which CTA finished first.
//
// part: splits * batch matrices of M x N f32, contiguous rows (row stride N); partial s of
// batch b starts at (s * batch + b) * M * N. Each thread takes four consecutive columns of one
// row (16-byte loads of every partial when N is a multiple of 4; element loads otherwise), so
// the partials are read once, in whole lines. C is read only by the thread that then writes
// the same elements of D, so C may alias D.
//
// Defines: CALICO_GEMM_OUT bf16|f16|float and the epilogue defines of gemm/epilogue.cuh.
#include "calico/calico.h"
#include "gemm/epilogue.cuh"

#ifndef CALICO_GEMM_OUT
#define CALICO_GEMM_OUT bf16
#endif

namespace gemm_splitk {
using out_t = CALICO_GEMM_OUT;
constexpr int THREADS = 256;
constexpr int COLS = 4;  // columns per thread
}  // namespace gemm_splitk

CALICO_KERNEL void __launch_bounds__(gemm_splitk::THREADS)
    calico_gemm_splitk_reduce(const float* __restrict__ part, int splits, int m, int n, int batch, gemm_splitk::out_t* d,
                              long long d_row_stride, long long d_batch_stride, const gemm_splitk::out_t* c, long long c_row_stride,
                              long long c_batch_stride, const gemm_splitk::out_t* __restrict__ bias, float alpha, float beta) {
    using namespace gemm_splitk;
    const long long quads_per_row = (n + COLS - 1) / COLS;
    const long long item = (long long)blockIdx.x * THREADS + threadIdx.x;
    if (item >= quads_per_row * m * batch) return;
    const long long row_all = item / quads_per_row;  // batch * M + row
    const int col0 = (int)(item - row_all * quads_per_row) * COLS;
    const int b = (int)(row_all / m);
    const int row = (int)(row_all - (long long)b * m);
    const long long matrix = (long long)m * n;
    const long long split_step = matrix * batch;
    const float* src = part + (long long)b * matrix + (long long)row * n + col0;
    const int cols = min(COLS, n - col0);

    float acc[COLS] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (cols == COLS && n % COLS == 0) {
        for (int s = 0; s < splits; ++s) {
            const float4 v = *reinterpret_cast<const float4*>(src + s * split_step);
            acc[0] += v.x;
            acc[1] += v.y;
            acc[2] += v.z;
            acc[3] += v.w;
        }
    } else {
        for (int s = 0; s < splits; ++s) {
#pragma unroll
            for (int j = 0; j < COLS; ++j) {
                if (j < cols) acc[j] += src[s * split_step + j];
            }
        }
    }

    out_t* dst = d + (long long)b * d_batch_stride + (long long)row * d_row_stride + col0;
    // C and bias are read only under their defines (gemm/epilogue.cuh's finish).
    constexpr bool HAS_C = CALICO_GEMM_HAS_C != 0, HAS_BIAS = CALICO_GEMM_HAS_BIAS != 0;
    const out_t* cs = HAS_C ? c + (long long)b * c_batch_stride + (long long)row * c_row_stride + col0 : nullptr;
#pragma unroll
    for (int j = 0; j < COLS; ++j) {
        if (j >= cols) break;
        dst[j] = calico::gemm::finish<out_t>(acc[j], alpha, beta, HAS_C ? cs + j : nullptr, HAS_BIAS ? bias + col0 + j : nullptr);
    }
}
