// Softmax over rows: y = exp(x - max) / sum(exp(x - max)), in f32.
//
// Same shape as the norm kernel: one block per row, the row held in registers (NV vectors of
// VEC per thread) so it is read once and written once; STREAMING=1 re-reads long rows.
// ALIGN_BODY=1 takes rows that do not start 16-byte aligned (odd lengths or strides; x and y
// misaligned alike): per row a scalar head up to the first aligned element, an aligned body of
// VEC-wide vectors, and a scalar tail; each thread holds its body vectors plus at most one head
// or tail element (head and tail are each shorter than VEC, the block is at least 2 VEC wide).
// Defines: THREADS (block size), ELEM (the element type, aliased T below), VEC, NV, STREAMING,
// ALIGN_BODY (register path only).
#include "calico/calico.h"

using namespace calico;

// ELEM, not T, comes in as a macro so that it cannot clash with template parameters.
typedef ELEM T;

#define LOG2E 1.4426950408889634f

#ifndef ALIGN_BODY
#define ALIGN_BODY 0
#endif

// Elements before the first 16-byte aligned one of a row (at most `cols`).
CALICO_DEVICE long long head_of(const T* p, long long cols) {
    const long long mis = (long long)(reinterpret_cast<unsigned long long>(p) % 16) / (long long)sizeof(T);
    const long long h = mis == 0 ? 0 : 16 / (long long)sizeof(T) - mis;
    return h < cols ? h : cols;
}


CALICO_KERNEL CALICO_MAX_THREADS(THREADS) void calico_softmax(const T* x, long long x_stride, T* y, long long y_stride, long long rows, long long cols) {
    __shared__ float scratch[32];
    const long long step = (long long)VEC * block_dim_x();
    for (long long row = block_x(); row < rows; row += grid_dim_x()) {
        const T* xr = x + row * x_stride;
        T* yr = y + row * y_stride;
#if ALIGN_BODY && !STREAMING
        const long long head = head_of(xr, cols);
        const long long body_end = head + (cols - head) / VEC * VEC;
        const long long t = thread_x();
        // This thread's head or tail element, if any.
        const long long ec = t < head ? t : (t - head < cols - body_end ? body_end + (t - head) : -1);
        float v[NV][VEC];
        float e = -3.402823466e38f;
        float m = -3.402823466e38f;
        if (ec >= 0) {
            e = to_float(xr[ec]);
            m = e;
        }
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            const long long c = head + (long long)VEC * t + i * step;
            if (c < body_end) {
                load_vec<VEC>(v[i], xr + c);
#pragma unroll
                for (int j = 0; j < VEC; ++j) m = fmaxf(m, v[i][j]);
            }
        }
        m = block_max(m, scratch);
        const float ms = m * LOG2E;
        float s = 0.0f;
        if (ec >= 0) {
            e = exp2_approx(fmaf(e, LOG2E, -ms));
            s = e;
        }
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            const long long c = head + (long long)VEC * t + i * step;
            if (c < body_end) {
#pragma unroll
                for (int j = 0; j < VEC; ++j) {
                    v[i][j] = exp2_approx(fmaf(v[i][j], LOG2E, -ms));
                    s += v[i][j];
                }
            }
        }
        const float inv = 1.0f / block_sum(s, scratch);
        if (ec >= 0) yr[ec] = from_float<T>(e * inv);
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            const long long c = head + (long long)VEC * t + i * step;
            if (c < body_end) {
#pragma unroll
                for (int j = 0; j < VEC; ++j) v[i][j] *= inv;
                store_vec<VEC>(yr + c, v[i]);
            }
        }
#elif !STREAMING
        float v[NV][VEC];
        float m = -3.402823466e38f;
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            const long long c = (long long)VEC * thread_x() + i * step;
            if (c < cols) {
                load_vec<VEC>(v[i], xr + c);
#pragma unroll
                for (int j = 0; j < VEC; ++j) m = fmaxf(m, v[i][j]);
            }
        }
        m = block_max(m, scratch);
        const float ms = m * LOG2E;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            const long long c = (long long)VEC * thread_x() + i * step;
            if (c < cols) {
#pragma unroll
                for (int j = 0; j < VEC; ++j) {
                    v[i][j] = exp2_approx(fmaf(v[i][j], LOG2E, -ms));
                    s += v[i][j];
                }
            }
        }
        const float inv = 1.0f / block_sum(s, scratch);
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            const long long c = (long long)VEC * thread_x() + i * step;
            if (c < cols) {
#pragma unroll
                for (int j = 0; j < VEC; ++j) v[i][j] *= inv;
                store_vec<VEC>(yr + c, v[i]);
            }
        }
#else
        // Online max/sum in one pass (rescaling the running sum when the max grows), then a
        // second pass that writes.
        float m = -3.402823466e38f, s = 0.0f;
        for (long long c = (long long)VEC * thread_x(); c < cols; c += step) {
            float v[VEC];
            load_vec<VEC>(v, xr + c);
            float cm = m;
#pragma unroll
            for (int j = 0; j < VEC; ++j) cm = fmaxf(cm, v[j]);
            s *= exp2_approx((m - cm) * LOG2E);
#pragma unroll
            for (int j = 0; j < VEC; ++j) s += exp2_approx((v[j] - cm) * LOG2E);
            m = cm;
        }
        const float gm = block_max(m, scratch);
        s = (m == -3.402823466e38f) ? 0.0f : s * exp2_approx((m - gm) * LOG2E);
        const float inv = 1.0f / block_sum(s, scratch);
        const float ms = gm * LOG2E;
        for (long long c = (long long)VEC * thread_x(); c < cols; c += step) {
            float v[VEC];
            load_vec<VEC>(v, xr + c);
#pragma unroll
            for (int j = 0; j < VEC; ++j) v[j] = exp2_approx(fmaf(v[j], LOG2E, -ms)) * inv;
            store_vec<VEC>(yr + c, v);
        }
#endif
    }
}
