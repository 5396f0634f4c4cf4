// Softmax over rows on CDNA (gfx90a, gfx94x), y = exp(x - max) / sum(exp(x - max)) in f32,
// with the rows read and written through buffer resources: one descriptor per row covering
// exactly its bytes, so chunks past the row's end read zeros (masked to -inf here before the
// max) and their stores are dropped by the hardware; the tail needs no branches. The host
// requires rows of whole dwords (the range check is per dword) and BYTES-aligned rows.
//
// GROUP lanes own a row: a wavefront (GROUP = 64, THREADS / 64 rows per workgroup, no LDS, no
// barrier) for rows up to 256 chunks, else the whole workgroup. Each lane holds NV chunks of
// BYTES bytes in registers: the row is read once and written once.
//
// Defines: ELEM (bf16|f16|float), BYTES (4|8|16), NV, GROUP, THREADS. Arguments as
// calico_softmax (softmax.cu).
#include "calico/calico.h"
#include "calico/hip_buffer.h"

using namespace calico;

typedef ELEM T;

namespace calico {
namespace softmax_cdna {

constexpr int VEC = BYTES / (int)sizeof(T);
constexpr int ROWS_PER_BLOCK = THREADS / GROUP;
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LOWEST = -3.402823466e38f;
static_assert(GROUP == 64 || GROUP == THREADS, "a row is owned by a wavefront or by the workgroup");
static_assert(THREADS % 64 == 0 && THREADS <= 1024, "whole wavefronts");

CALICO_DEVICE float row_max(float v, float* scratch) {
    if constexpr (GROUP == 64)
        return warp_max(v);
    else
        return block_max(v, scratch);
}
CALICO_DEVICE float row_sum(float v, float* scratch) {
    if constexpr (GROUP == 64)
        return warp_sum(v);
    else
        return block_sum(v, scratch);
}

}  // namespace softmax_cdna
}  // namespace calico

CALICO_KERNEL CALICO_MAX_THREADS(THREADS) void calico_softmax_cdna(const T* x, long long x_stride, T* y, long long y_stride,
                                                                  long long rows, long long cols) {
    using namespace calico::softmax_cdna;
    __shared__ float scratch[THREADS / 64];
    const int group = ROWS_PER_BLOCK == 1 ? 0 : __builtin_amdgcn_readfirstlane((int)(thread_x() / GROUP));
    const unsigned t = thread_x() % GROUP;
    const unsigned row_bytes = static_cast<unsigned>(cols) * (unsigned)sizeof(T);
    for (long long row = (long long)block_x() * ROWS_PER_BLOCK + group; row < rows; row += (long long)grid_dim_x() * ROWS_PER_BLOCK) {
        const hip::buffer xb = hip::make_buffer(x + row * x_stride, row_bytes);
        const hip::buffer yb = hip::make_buffer(y + row * y_stride, row_bytes);
        float v[NV][VEC];
#pragma unroll
        for (int i = 0; i < NV; ++i) hip::buffer_load_floats<T, BYTES>(v[i], xb, (t + i * GROUP) * VEC);
        float m = LOWEST;
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            const long long c0 = (long long)(t + i * GROUP) * VEC;
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                // Past the row: the zeros the hardware returned take no part (exp2 gives 0).
                if (c0 + j >= cols) v[i][j] = LOWEST;
                m = fmaxf(m, v[i][j]);
            }
        }
        const float ms = row_max(m, scratch) * LOG2E;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < NV; ++i)
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                v[i][j] = exp2_approx(fmaf(v[i][j], LOG2E, -ms));
                s += v[i][j];
            }
        const float inv = 1.0f / row_sum(s, scratch);
#pragma unroll
        for (int i = 0; i < NV; ++i) {
#pragma unroll
            for (int j = 0; j < VEC; ++j) v[i][j] *= inv;
            hip::buffer_store_floats<T, BYTES>(yb, (t + i * GROUP) * VEC, v[i]);
        }
    }
}
