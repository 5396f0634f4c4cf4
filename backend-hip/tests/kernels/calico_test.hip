// Exercises the vendor contract for bf16, f16 and float, plus hip_buffer.h.
#include "calico/calico.h"
#include "calico/hip_buffer.h"

using namespace calico;

// One row per block: 16-byte loads, a wave64-correct block sum, 16-byte stores.
template <class T>
CALICO_DEVICE void scale_rows(T* y, const T* x, unsigned cols, float* scratch) {
    constexpr int N = elems_per_16b<T>::value;
    const T* row = x + block_x() * cols;
    float acc = 0.0f;
    for (unsigned c = thread_x() * N; c + N <= cols; c += block_dim_x() * N) {
        float v[N];
        load_float<T, N>(v, row + c);
#pragma unroll
        for (int i = 0; i < N; ++i) acc += v[i] * v[i];
    }
    float total = block_sum(acc, scratch);
    float peak = warp_max(acc);
    float r = rsqrt_approx(total / cols) * exp2_approx(peak * 0.0f);
    for (unsigned c = thread_x() * N; c + N <= cols; c += block_dim_x() * N) {
        float v[N];
        load_float<T, N>(v, row + c);
#pragma unroll
        for (int i = 0; i < N; ++i) v[i] *= r;
        store_float<T, N>(y + block_x() * cols + c, v);
    }
}

CALICO_KERNEL void scale_bf16(bf16* y, const bf16* x, unsigned cols) {
    __shared__ float scratch[1024 / CALICO_LANES];
    scale_rows<bf16>(y, x, cols, scratch);
}
CALICO_KERNEL void scale_f16(f16* y, const f16* x, unsigned cols) {
    __shared__ float scratch[1024 / CALICO_LANES];
    scale_rows<f16>(y, x, cols, scratch);
}
CALICO_KERNEL void scale_f32(float* y, const float* x, unsigned cols) {
    __shared__ float scratch[1024 / CALICO_LANES];
    scale_rows<float>(y, x, cols, scratch);
}

// Bounds-checked buffer loads: reads past `n` elements come back as zero.
CALICO_KERNEL void copy_buffer_bf16(bf16* y, const bf16* x, unsigned n) {
    hip::buffer in = hip::make_buffer(x, n * 2u);
    hip::buffer out = hip::make_buffer(y, n * 2u);
    unsigned i = (block_x() * block_dim_x() + thread_x()) * 8u;
    float v[8];
    hip::buffer_load_float<bf16>(v, in, i);
    v[0] = shfl(v[0], 0);
    hip::buffer_store_float<bf16>(out, i, v);
}
