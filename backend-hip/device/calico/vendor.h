// Calico vendor layer for AMD CDNA (gfx90a, gfx94x, gfx95x): the VENDOR CONTRACT of
// calico/calico.h on clang builtins alone. No HIP header is included, so the same text compiles
// under hipRTC (which pre-includes its own runtime header and defines __HIPCC_RTC__) and under
// plain `clang -x hip -nogpuinc -nogpulib`. Every macro a HIP header might also define is
// guarded, and everything else lives in namespace calico or has a calico-specific name.
#pragma once

// ---- prelude: the HIP keywords, as clang attributes, unless a HIP header provided them.
#ifndef __global__
#define __global__ __attribute__((global))
#endif
#ifndef __device__
#define __device__ __attribute__((device))
#endif
#ifndef __host__
#define __host__ __attribute__((host))
#endif
#ifndef __shared__
#define __shared__ __attribute__((shared))
#endif
#ifndef __constant__
#define __constant__ __attribute__((constant))
#endif
#ifndef __forceinline__
#define __forceinline__ inline __attribute__((always_inline))
#endif

// Lanes per wavefront. CDNA runs wave64; a build may override (e.g. RDNA in wave32 mode).
#ifndef CALICO_LANES
#define CALICO_LANES 64
#endif
static_assert(CALICO_LANES == 64 || CALICO_LANES == 32, "CALICO_LANES must be 32 or 64");

#define CALICO_DEVICE __attribute__((device)) inline __attribute__((always_inline))
#define CALICO_KERNEL extern "C" __attribute__((global))
// Caps the block size the compiler plans registers for (HIP's default cap is 1024).
#define CALICO_MAX_THREADS(n) __attribute__((amdgpu_flat_work_group_size(1, n)))

// Float math for compiles with no HIP headers and no device libraries (clang -nogpuinc
// -nogpulib, as in CI): the few functions kernels use, on hardware instructions or short
// polynomials. Under hipRTC the real ones from the device libraries are used.
#ifndef __HIPCC_RTC__
#define CALICO_MATH_FN static __attribute__((device)) inline __attribute__((always_inline))
CALICO_MATH_FN float fmaxf(float a, float b) { return __builtin_fmaxf(a, b); }
CALICO_MATH_FN float fminf(float a, float b) { return __builtin_fminf(a, b); }
CALICO_MATH_FN float fmaf(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
CALICO_MATH_FN float fabsf(float a) { return __builtin_fabsf(a); }
CALICO_MATH_FN float sqrtf(float a) { return __builtin_sqrtf(a); }
CALICO_MATH_FN float rsqrtf(float a) { return __builtin_amdgcn_rsqf(a); }
CALICO_MATH_FN float exp2f(float a) { return __builtin_amdgcn_exp2f(a); }
CALICO_MATH_FN float expf(float a) { return __builtin_amdgcn_exp2f(a * 1.4426950408889634f); }
// erf by Abramowitz & Stegun 7.1.26 (absolute error < 1.5e-7), enough for GELU in f32.
CALICO_MATH_FN float erff(float x) {
    const float ax = __builtin_fabsf(x);
    const float t = 1.0f / (1.0f + 0.3275911f * ax);
    const float poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
    const float r = 1.0f - poly * __builtin_amdgcn_exp2f(-ax * ax * 1.4426950408889634f);
    return x < 0.0f ? -r : r;
}
CALICO_MATH_FN float tanhf(float x) {
    const float e = __builtin_amdgcn_exp2f(-2.0f * __builtin_fabsf(x) * 1.4426950408889634f);
    const float r = (1.0f - e) / (1.0f + e);
    return x < 0.0f ? -r : r;
}
#undef CALICO_MATH_FN
#endif

// ---- 16-bit floats (global namespace, as the contract asks).
// bf16: raw bits; conversions below round to nearest even.
struct alignas(2) bf16 {
    unsigned short bits;
};
// f16: clang's native half type; hardware conversions round to nearest even.
typedef _Float16 f16;

namespace calico {

CALICO_DEVICE float to_float(bf16 v) { return __builtin_bit_cast(float, static_cast<unsigned>(v.bits) << 16); }
CALICO_DEVICE float to_float(f16 v) { return static_cast<float>(v); }

template <class T>
CALICO_DEVICE T from_float(float v);

template <>
CALICO_DEVICE bf16 from_float<bf16>(float v) {
    unsigned u = __builtin_bit_cast(unsigned, v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<unsigned short>((u >> 16) | 0x0040u)};  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // ties go to the even bf16
    return bf16{static_cast<unsigned short>(u >> 16)};
}

template <>
CALICO_DEVICE f16 from_float<f16>(float v) { return static_cast<f16>(v); }

// ---- thread and block indices.
CALICO_DEVICE unsigned thread_x() { return __builtin_amdgcn_workitem_id_x(); }
CALICO_DEVICE unsigned thread_y() { return __builtin_amdgcn_workitem_id_y(); }
CALICO_DEVICE unsigned block_x() { return __builtin_amdgcn_workgroup_id_x(); }
CALICO_DEVICE unsigned block_y() { return __builtin_amdgcn_workgroup_id_y(); }
CALICO_DEVICE unsigned block_z() { return __builtin_amdgcn_workgroup_id_z(); }
// Read from the dispatch packet / implicit kernel arguments by the compiler.
CALICO_DEVICE unsigned block_dim_x() { return __builtin_amdgcn_workgroup_size_x(); }
CALICO_DEVICE unsigned grid_dim_x() {
    // HSA's grid size counts work-items; HIP grids are whole blocks.
    return __builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x();
}

// The hardware lane (0..63), independent of how the block's threads are shaped.
CALICO_DEVICE unsigned hw_lane() { return __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u)); }

// ---- cross-lane exchange. ds_bpermute reads `v` from the lane whose byte address is given;
// the address wraps modulo the wavefront, so every lane of a wave64 is reachable.
CALICO_DEVICE float shfl(float v, int src_lane) {
    int r = __builtin_amdgcn_ds_bpermute(src_lane << 2, __builtin_bit_cast(int, v));
    return __builtin_bit_cast(float, r);
}

CALICO_DEVICE float shfl_xor(float v, int lane_mask) {
    int x = __builtin_bit_cast(int, v);
    // Within a quad, DPP moves data without touching LDS hardware; used when the mask is a
    // compile-time constant (as in unrolled reductions).
    if (__builtin_constant_p(lane_mask) && lane_mask == 1)
        return __builtin_bit_cast(float, __builtin_amdgcn_update_dpp(0, x, 0xB1, 0xF, 0xF, true));  // quad_perm 1,0,3,2
    if (__builtin_constant_p(lane_mask) && lane_mask == 2)
        return __builtin_bit_cast(float, __builtin_amdgcn_update_dpp(0, x, 0x4E, 0xF, 0xF, true));  // quad_perm 2,3,0,1
    int src = static_cast<int>(hw_lane()) ^ lane_mask;
    return __builtin_bit_cast(float, __builtin_amdgcn_ds_bpermute(src << 2, x));
}

// ---- barriers: release this thread's LDS/global writes to the workgroup, meet, acquire.
CALICO_DEVICE void sync_threads() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

// ---- fast special functions (one hardware instruction each; ~1 ulp, denormals flushed).
// (__builtin_amdgcn_exp2f is LLVM 17+; older hipRTC, e.g. ROCm 5.x on LLVM 15, lowers exp2f
// straight to v_exp_f32.)
#if __has_builtin(__builtin_amdgcn_exp2f)
CALICO_DEVICE float exp2_approx(float x) { return __builtin_amdgcn_exp2f(x); }
#else
CALICO_DEVICE float exp2_approx(float x) { return __builtin_exp2f(x); }
#endif
CALICO_DEVICE float rsqrt_approx(float x) { return __builtin_amdgcn_rsqf(x); }

}  // namespace calico
