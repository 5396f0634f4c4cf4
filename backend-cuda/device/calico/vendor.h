// NVIDIA vendor layer: the primitives core/device/calico/calico.h's VENDOR CONTRACT asks for.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define CALICO_LANES 32
#define CALICO_DEVICE __device__ __forceinline__
#define CALICO_KERNEL extern "C" __global__
// The most threads a block of this kernel is launched with (lets the compiler budget registers).
#define CALICO_MAX_THREADS(n) __launch_bounds__(n)

typedef __nv_bfloat16 bf16;
typedef __half f16;

namespace calico {

CALICO_DEVICE unsigned thread_x() { return threadIdx.x; }
CALICO_DEVICE unsigned block_x() { return blockIdx.x; }
CALICO_DEVICE unsigned block_y() { return blockIdx.y; }
CALICO_DEVICE unsigned block_z() { return blockIdx.z; }
CALICO_DEVICE unsigned block_dim_x() { return blockDim.x; }
CALICO_DEVICE unsigned grid_dim_x() { return gridDim.x; }

CALICO_DEVICE float to_float(bf16 v) { return __bfloat162float(v); }
CALICO_DEVICE float to_float(f16 v) { return __half2float(v); }
template <class T> CALICO_DEVICE T from_float(float v);
template <> CALICO_DEVICE bf16 from_float<bf16>(float v) { return __float2bfloat16_rn(v); }
template <> CALICO_DEVICE f16 from_float<f16>(float v) { return __float2half_rn(v); }

CALICO_DEVICE float shfl_xor(float v, int lane_mask) { return __shfl_xor_sync(0xffffffffu, v, lane_mask); }
CALICO_DEVICE float shfl(float v, int src_lane) { return __shfl_sync(0xffffffffu, v, src_lane); }
CALICO_DEVICE void sync_threads() { __syncthreads(); }

// exp2f compiles to MUFU.EX2 plus range handling; softmax inputs are <= 0 after
// max-subtraction, where its 2-ulp error is well inside bf16/f16 rounding.
CALICO_DEVICE float exp2_approx(float x) { return exp2f(x); }
CALICO_DEVICE float rsqrt_approx(float x) { return rsqrtf(x); }

}  // namespace calico
