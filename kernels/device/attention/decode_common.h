// Small helpers shared by the decode attention kernel and its split combiner.
#pragma once

#define DECODE_LOG2E 1.4426950408889634f
#define DECODE_LN2 0.6931471805599453f

namespace calico {

// -infinity without a math header (NVRTC and clang -nogpuinc alike).
CALICO_DEVICE float decode_neg_inf() {
    union {
        unsigned u;
        float f;
    } bits = {0xff800000u};
    return bits.f;
}

// 2^(m - mn): the factor that moves a softmax state with max m onto the larger max mn; 0 for an
// empty state (m = -inf), also when mn is -inf (where m - mn would be NaN).
CALICO_DEVICE float decode_rescale(float m, float mn) {
    return m == decode_neg_inf() ? 0.0f : exp2_approx(m - mn);
}

// log2 of a positive float.
CALICO_DEVICE float decode_log2(float x) {
#if defined(__HIP__)
    return __builtin_log2f(x);
#else
    return log2f(x);
#endif
}

}  // namespace calico
