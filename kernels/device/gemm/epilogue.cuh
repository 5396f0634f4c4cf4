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

// erf(x) to about 1e-7 absolute, from the vendor's exp2 alone (no libm on HIP without
// headers): the Chebyshev fit of erfc in Numerical Recipes (fractional error < 1.2e-7).
CALICO_DEVICE float erf_approx(float x) {
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
    const float erfc_z = t * exp2_approx((p - z * z) * 1.4426950408889634f);
    const float r = 1.0f - erfc_z;
    return x < 0.0f ? -r : r;
}

CALICO_DEVICE float activation(float v) {
#if CALICO_GEMM_EPILOGUE == 1
    return 0.5f * v * (1.0f + erf_approx(v * 0.70710678f));
#elif CALICO_GEMM_EPILOGUE == 2
    return v / (1.0f + exp2_approx(-v * 1.4426950408889634f));
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
