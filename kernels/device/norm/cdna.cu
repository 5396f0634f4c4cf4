// RMSNorm and LayerNorm on CDNA (gfx90a, gfx94x): the row read and written through buffer
// resources, one descriptor per row operand and row. A buffer covers exactly the row's bytes,
// so a lane whose chunk lies (partly) past the row's end reads zeros and its stores are
// dropped by the hardware: the tail needs no branches. The host requires every row to be a
// whole number of dwords (the range check is per dword) and BYTES-aligned rows.
//
// GROUP lanes own a row: a wavefront (GROUP = 64, THREADS / 64 rows per workgroup, reductions
// by cross-lane exchange only, no LDS, no barrier) for rows up to 256 chunks, else the whole
// workgroup (GROUP = THREADS, one wave64 reduction per wave then one through LDS). Each lane
// holds NV chunks of BYTES bytes of its row in registers: the row is read once and written once.
//
// Defines: ELEM (bf16|f16|float), BYTES (4|8|16 bytes per access), NV, GROUP, THREADS, LAYER,
// HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS. The kernel's arguments are calico_norm's (norm.cu).
#include "calico/calico.h"
#include "calico/hip_buffer.h"

using namespace calico;

typedef ELEM T;

namespace calico {
namespace norm_cdna {

constexpr int VEC = BYTES / (int)sizeof(T);  // elements per access
constexpr int ROWS_PER_BLOCK = THREADS / GROUP;
static_assert(GROUP == 64 || GROUP == THREADS, "a row is owned by a wavefront or by the workgroup");
static_assert(THREADS % 64 == 0 && THREADS <= 1024, "whole wavefronts");

CALICO_DEVICE float row_sum(float v, float* scratch) {
    if constexpr (GROUP == 64)
        return warp_sum(v);
    else
        return block_sum(v, scratch);
}

CALICO_DEVICE moments row_moments(moments v, float* scratch) {
    if constexpr (GROUP == 64)
        return warp_moments(v);
    else
        return block_moments(v, scratch);
}

}  // namespace norm_cdna
}  // namespace calico

CALICO_KERNEL CALICO_MAX_THREADS(THREADS) void calico_norm_cdna(const T* x, long long x_stride, const T* residual,
                                                               long long residual_stride, const T* weight, const T* bias, T* y,
                                                               long long y_stride, T* sum, long long sum_stride, long long rows,
                                                               long long cols, float eps) {
    using namespace calico::norm_cdna;
    __shared__ float scratch[3 * (THREADS / 64)];
    // Wave-uniform: the row (and every descriptor built from it) stays in scalar registers.
    const int group = ROWS_PER_BLOCK == 1 ? 0 : __builtin_amdgcn_readfirstlane((int)(thread_x() / GROUP));
    const unsigned t = thread_x() % GROUP;
    const unsigned row_bytes = static_cast<unsigned>(cols) * (unsigned)sizeof(T);
    const float inv_cols = 1.0f / (float)cols;
    // The weight and bias chunks are the same for every row a lane visits: read them once.
#if HAS_WEIGHT
    float w[NV][VEC];
    {
        const hip::buffer wb = hip::make_buffer(weight, row_bytes);
#pragma unroll
        for (int i = 0; i < NV; ++i) hip::buffer_load_floats<T, BYTES>(w[i], wb, (t + i * GROUP) * VEC);
    }
#endif
#if HAS_BIAS
    float bi[NV][VEC];
    {
        const hip::buffer bb = hip::make_buffer(bias, row_bytes);
#pragma unroll
        for (int i = 0; i < NV; ++i) hip::buffer_load_floats<T, BYTES>(bi[i], bb, (t + i * GROUP) * VEC);
    }
#endif
    for (long long row = (long long)block_x() * ROWS_PER_BLOCK + group; row < rows; row += (long long)grid_dim_x() * ROWS_PER_BLOCK) {
        const hip::buffer xb = hip::make_buffer(x + row * x_stride, row_bytes);
        const hip::buffer yb = hip::make_buffer(y + row * y_stride, row_bytes);
        float v[NV][VEC];
#pragma unroll
        for (int i = 0; i < NV; ++i) hip::buffer_load_floats<T, BYTES>(v[i], xb, (t + i * GROUP) * VEC);
#if HAS_RESIDUAL
        {
            const hip::buffer rb = hip::make_buffer(residual + row * residual_stride, row_bytes);
            const hip::buffer sb = hip::make_buffer(sum + row * sum_stride, row_bytes);
#pragma unroll
            for (int i = 0; i < NV; ++i) {
                float r[VEC];
                hip::buffer_load_floats<T, BYTES>(r, rb, (t + i * GROUP) * VEC);
                // The sum is rounded to T first: it is what `sum` stores and what is normalised.
#pragma unroll
                for (int j = 0; j < VEC; ++j) v[i][j] = to_float(from_float<T>(v[i][j] + r[j]));
                hip::buffer_store_floats<T, BYTES>(sb, (t + i * GROUP) * VEC, v[i]);
            }
        }
#endif
        // Elements past the row read as 0: they add nothing to the sums below.
        float mean = 0.0f, rstd;
#if LAYER
        // (count, mean, M2) of this lane's own elements, exact, then Chan's combination.
        float n = 0.0f, local_sum = 0.0f;
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            const long long left = cols - (long long)(t + i * GROUP) * VEC;
            n += (float)(left <= 0 ? 0 : (left < VEC ? left : VEC));
#pragma unroll
            for (int j = 0; j < VEC; ++j) local_sum += v[i][j];
        }
        const float local_mean = n > 0.0f ? local_sum / n : 0.0f;
        float local_m2 = 0.0f;
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            const long long c0 = (long long)(t + i * GROUP) * VEC;
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                const float d = v[i][j] - local_mean;
                local_m2 += c0 + j < cols ? d * d : 0.0f;
            }
        }
        const moments m = row_moments({n, local_mean, local_m2}, scratch);
        mean = m.mean;
        rstd = rsqrtf(m.m2 * inv_cols + eps);
#else
        float sq = 0.0f;
#pragma unroll
        for (int i = 0; i < NV; ++i)
#pragma unroll
            for (int j = 0; j < VEC; ++j) sq += v[i][j] * v[i][j];
        rstd = rsqrtf(row_sum(sq, scratch) * inv_cols + eps);
#endif
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            const unsigned c = (t + i * GROUP) * VEC;
            float out[VEC];
#pragma unroll
            for (int j = 0; j < VEC; ++j) out[j] = (v[i][j] - mean) * rstd;
#if HAS_WEIGHT
#pragma unroll
            for (int j = 0; j < VEC; ++j) out[j] *= w[i][j];
#endif
#if HAS_BIAS
#pragma unroll
            for (int j = 0; j < VEC; ++j) out[j] += bi[i][j];
#endif
            hip::buffer_store_floats<T, BYTES>(yb, c, out);
        }
    }
}
