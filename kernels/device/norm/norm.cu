// RMSNorm and LayerNorm over rows, with an optional fused residual add.
//
// One block per row (grid-stride over rows). Each thread keeps NV vectors of VEC elements of its
// row in registers, so the row is read from memory once and written once: the kernel moves the
// minimum number of bytes. Rows too long for registers (STREAMING=1) are re-read from memory
// (L2 usually), one pass per statistic.
//
// Defines: THREADS (block size), ELEM (the element type, aliased T below) (bf16|f16|float), VEC (elements per access), NV (vectors per thread), STREAMING,
// LAYER (0 = RMSNorm, 1 = LayerNorm), HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS, ALIGN_BODY.
//
// ALIGN_BODY=1 (RMSNorm, register path) takes rows that do not start 16-byte aligned (odd
// lengths or strides; x, residual, y and sum misaligned alike): per row a scalar head up to the
// first aligned element, an aligned body of VEC-wide vectors (the weight, aligned differently,
// is read element by element from L1), and a scalar tail; each thread holds its body vectors
// plus at most one head or tail element.
#include "calico/calico.h"

using namespace calico;

// ELEM, not T, comes in as a macro so that it cannot clash with template parameters.
typedef ELEM T;

#ifndef ALIGN_BODY
#define ALIGN_BODY 0
#endif
static_assert(!(ALIGN_BODY && LAYER), "ALIGN_BODY is for RMSNorm");

struct NormArgs {
    const T* x; long long x_stride;
    const T* residual; long long residual_stride;
    const T* weight;
    const T* bias;
    T* y; long long y_stride;
    T* sum; long long sum_stride;
};


// Reads VEC elements of the (residual-added) row at column c. With a residual, the sum is
// rounded to T first (it is what `sum` stores) and, when `write_sum`, stored.
CALICO_DEVICE void read_input(float (&v)[VEC], const NormArgs& a, long long row, long long c, bool write_sum) {
    load_vec<VEC>(v, a.x + row * a.x_stride + c);
#if HAS_RESIDUAL
    float r[VEC];
    load_vec<VEC>(r, a.residual + row * a.residual_stride + c);
#pragma unroll
    for (int j = 0; j < VEC; ++j) v[j] = to_float(from_float<T>(v[j] + r[j]));
    if (write_sum) store_vec<VEC>(a.sum + row * a.sum_stride + c, v);
#endif
}

// y = (v - mean) * rstd * w + b for VEC elements at column c.
CALICO_DEVICE void write_output(const float (&v)[VEC], const NormArgs& a, long long row, long long c, float mean, float rstd) {
    float out[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) out[j] = (v[j] - mean) * rstd;
#if HAS_WEIGHT
    float w[VEC];
#if ALIGN_BODY
#pragma unroll
    for (int j = 0; j < VEC; ++j) w[j] = to_float(a.weight[c + j]);
#else
    load_vec<VEC>(w, a.weight + c);
#endif
#pragma unroll
    for (int j = 0; j < VEC; ++j) out[j] *= w[j];
#endif
#if HAS_BIAS
    float b[VEC];
    load_vec<VEC>(b, a.bias + c);
#pragma unroll
    for (int j = 0; j < VEC; ++j) out[j] += b[j];
#endif
    store_vec<VEC>(a.y + row * a.y_stride + c, out);
}

#if ALIGN_BODY
// Elements before the first 16-byte aligned one of a row (at most `cols`).
CALICO_DEVICE long long head_of(const T* p, long long cols) {
    const long long mis = (long long)(reinterpret_cast<unsigned long long>(p) % 16) / (long long)sizeof(T);
    const long long h = mis == 0 ? 0 : 16 / (long long)sizeof(T) - mis;
    return h < cols ? h : cols;
}

// read_input and write_output for the one element at column c (RMSNorm).
CALICO_DEVICE float read_one(const NormArgs& a, long long row, long long c) {
    float v = to_float(a.x[row * a.x_stride + c]);
#if HAS_RESIDUAL
    v = to_float(from_float<T>(v + to_float(a.residual[row * a.residual_stride + c])));
    a.sum[row * a.sum_stride + c] = from_float<T>(v);
#endif
    return v;
}

CALICO_DEVICE void write_one(float v, const NormArgs& a, long long row, long long c, float rstd) {
    float out = v * rstd;
#if HAS_WEIGHT
    out *= to_float(a.weight[c]);
#endif
    a.y[row * a.y_stride + c] = from_float<T>(out);
}
#endif

CALICO_KERNEL CALICO_MAX_THREADS(THREADS) void calico_norm(const T* x, long long x_stride, const T* residual, long long residual_stride,
                               const T* weight, const T* bias, T* y, long long y_stride, T* sum, long long sum_stride,
                               long long rows, long long cols, float eps) {
    const NormArgs a{x, x_stride, residual, residual_stride, weight, bias, y, y_stride, sum, sum_stride};
    __shared__ float scratch[96];
    const long long step = (long long)VEC * block_dim_x();
    const float inv_cols = 1.0f / (float)cols;
    for (long long row = block_x(); row < rows; row += grid_dim_x()) {
#if ALIGN_BODY && !STREAMING
        const long long head = head_of(a.x + row * a.x_stride, cols);
        const long long body_end = head + (cols - head) / VEC * VEC;
        const long long t = thread_x();
        // This thread's head or tail element, if any.
        const long long ec = t < head ? t : (t - head < cols - body_end ? body_end + (t - head) : -1);
        float v[NV][VEC];
        float e = 0.0f;
        if (ec >= 0) e = read_one(a, row, ec);
        float sq = e * e;
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            const long long c = head + (long long)VEC * t + i * step;
            if (c < body_end) {
                read_input(v[i], a, row, c, true);
#pragma unroll
                for (int j = 0; j < VEC; ++j) sq += v[i][j] * v[i][j];
            }
        }
        const float rstd = rsqrtf(block_sum(sq, scratch) * inv_cols + eps);
        if (ec >= 0) write_one(e, a, row, ec, rstd);
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            const long long c = head + (long long)VEC * t + i * step;
            if (c < body_end) write_output(v[i], a, row, c, 0.0f, rstd);
        }
#elif !STREAMING
        float v[NV][VEC];
        float sq = 0.0f;  // RMSNorm: sum of squares
        int n = 0;        // LayerNorm: this thread's count, mean and M2, exact over its registers
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            const long long c = (long long)VEC * thread_x() + i * step;
            if (c < cols) {
                read_input(v[i], a, row, c, true);
                n += VEC;
#pragma unroll
                for (int j = 0; j < VEC; ++j) sq += v[i][j] * v[i][j];
            } else {
#pragma unroll
                for (int j = 0; j < VEC; ++j) v[i][j] = 0.0f;
            }
        }
        float mean = 0.0f;
        float rstd;
#if LAYER
        // One block reduction for mean and variance (Chan's combination), robust to a large
        // mean: each thread's (count, mean, M2) is exact over its own registers first.
        float local_sum = 0.0f;
#pragma unroll
        for (int i = 0; i < NV; ++i)
#pragma unroll
            for (int j = 0; j < VEC; ++j) local_sum += v[i][j];
        const float local_mean = n > 0 ? local_sum / (float)n : 0.0f;
        float local_m2 = 0.0f;
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            const long long c = (long long)VEC * thread_x() + i * step;
            if (c < cols) {
#pragma unroll
                for (int j = 0; j < VEC; ++j) local_m2 += (v[i][j] - local_mean) * (v[i][j] - local_mean);
            }
        }
        const moments m = block_moments({(float)n, local_mean, local_m2}, scratch);
        mean = m.mean;
        rstd = rsqrtf(m.m2 * inv_cols + eps);
#else
        rstd = rsqrtf(block_sum(sq, scratch) * inv_cols + eps);
#endif
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            const long long c = (long long)VEC * thread_x() + i * step;
            if (c < cols) write_output(v[i], a, row, c, mean, rstd);
        }
#else
        // Streaming: pass 1 forms (and stores) the residual sum and the first statistic; later
        // passes re-read the stored sum so every pass sees the same rounded values.
        float acc = 0.0f;
        for (long long c = (long long)VEC * thread_x(); c < cols; c += step) {
            float v[VEC];
            read_input(v, a, row, c, true);
#pragma unroll
            for (int j = 0; j < VEC; ++j) acc += LAYER ? v[j] : v[j] * v[j];
        }
#if HAS_RESIDUAL
        sync_threads();  // this block's sum writes are visible to its own re-reads
        NormArgs b = a;
        b.x = a.sum; b.x_stride = a.sum_stride;
        b.residual = nullptr;
#else
        const NormArgs& b = a;
#endif
        float mean = 0.0f;
        float rstd;
#if LAYER
        mean = block_sum(acc, scratch) * inv_cols;
        float sq = 0.0f;
        for (long long c = (long long)VEC * thread_x(); c < cols; c += step) {
            float v[VEC];
            load_vec<VEC>(v, b.x + row * b.x_stride + c);
#pragma unroll
            for (int j = 0; j < VEC; ++j) sq += (v[j] - mean) * (v[j] - mean);
        }
        rstd = rsqrtf(block_sum(sq, scratch) * inv_cols + eps);
#else
        rstd = rsqrtf(block_sum(acc, scratch) * inv_cols + eps);
#endif
        for (long long c = (long long)VEC * thread_x(); c < cols; c += step) {
            float v[VEC];
            load_vec<VEC>(v, b.x + row * b.x_stride + c);
            write_output(v, a, row, c, mean, rstd);
        }
#endif
    }
}
