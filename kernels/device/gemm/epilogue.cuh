// The epilogue every GEMM kernel shares: D = act(alpha * (A @ B) + beta * C + bias[col]).
// Written against the vendor contract only, so it serves CUDA and HIP alike.
//
// Defines (all optional):
//   CALICO_GEMM_EPILOGUE  0 none, 1 GELU (erf form), 2 SiLU
//   CALICO_GEMM_HAS_C     1 when C is read (beta * C is added)
//   CALICO_GEMM_HAS_BIAS  1 when bias[N] is added
#pragma once

#ifndef CALICO_GEMM_EPILOGUE
#define CALICO_GEMM_EPILOGUE 0
#endif
#ifndef CALICO_GEMM_HAS_C
#define CALICO_GEMM_HAS_C 0
#endif
#ifndef CALICO_GEMM_HAS_BIAS
#define CALICO_GEMM_HAS_BIAS 0
#endif

namespace calico {
namespace gemm {

// The activations match the CPU backend's (backend-cpu/src/math.rs) term for term, so a GEMM
// gives the same numbers on every device and every kernel (hopper, sm_80, skinny, portable):
// GELU in its exact erf form written as 0.5 x erfc(-x / sqrt 2), which keeps full relative
// accuracy for large negative x (1 + erf(x) would cancel), and SiLU as x / (1 + e^-x) with the
// vendor's full-precision expf (CUDA's libdevice; on HIP the device library's, or the vendor
// header's exp2-based one where no device library is linked).

// erfc(x), fractional error < 1.2e-7: the Chebyshev fit of Numerical Recipes' erfcc.
CALICO_DEVICE float erfc_fit(float x) {
    const float z = x < 0.0f ? -x : x;
    const float t = 1.0f / (1.0f + 0.5f * z);
    float p = 0.17087277f;
    p = p * t - 0.82215223f;
    p = p * t + 1.48851587f;
    p = p * t - 1.13520398f;
    p = p * t + 0.27886807f;
    p = p * t - 0.18628806f;
    p = p * t + 0.09678418f;
    p = p * t + 0.37409196f;
    p = p * t + 1.00002368f;
    p = p * t - 1.26551223f;
    const float r = t * expf(p - z * z);
    return x < 0.0f ? 2.0f - r : r;
}

// GELU, exact (erf) form: 0.5 x (1 + erf(x / sqrt 2)) = 0.5 x erfc(-x / sqrt 2).
CALICO_DEVICE float gelu(float x) { return 0.5f * x * erfc_fit(-x * 0.70710678118654752f); }

// SiLU: x / (1 + e^-x).
CALICO_DEVICE float silu(float x) { return x / (1.0f + expf(-x)); }

CALICO_DEVICE float activation(float v) {
#if CALICO_GEMM_EPILOGUE == 1
    return gelu(v);
#elif CALICO_GEMM_EPILOGUE == 2
    return silu(v);
#else
    return v;
#endif
}

// One output element: `acc` is the f32 dot product; `c` and `bias` point at this element's C
// value and its column's bias (either may be null when its define is 0).
template <class Out>
CALICO_DEVICE Out finish(float acc, float alpha, float beta, const Out* c, const Out* bias) {
    float v = alpha * acc;
#if CALICO_GEMM_HAS_C
    v += beta * to_float(*c);
#endif
#if CALICO_GEMM_HAS_BIAS
    v += to_float(*bias);
#endif
    (void)c;
    (void)bias;
    (void)beta;
    return from_float<Out>(activation(v));
}

}  // namespace gemm
}  // namespace calico
