// CDNA matrix cores, scheduling hints and LDS-direct buffer loads: the vendor extras under the
// tile vocabulary (hip_tile.h) and the tuned CDNA kernels.
//
// MFMA operand layouts (CDNA3 ISA, "Matrix fused multiply-add", mirrored and tested in Rust by
// calico_core::lanes): for v_mfma_f32_16x16x16 lane l holds A[l % 16][4 (l / 16) + e] and
// B[4 (l / 16) + e][l % 16], e = 0..3, and D[4 (l / 16) + e][l % 16]; for 32x32x8 lane l holds
// A[l % 32][4 (l / 32) + e], B[4 (l / 32) + e][l % 32] and D[8 (e / 4) + 4 (l / 32) + e % 4][l % 32],
// e = 0..15; for the gfx94x fp8 16x16x32, A[l % 16][8 (l / 16) + e], e = 0..7 (bytes of two
// registers), D as 16x16x16. The compiler keeps accumulators in AGPRs when they do not fit
// beside the other VGPRs (gfx90a/gfx94x have one 512-entry file split between the two).
#pragma once
#include "calico/calico.h"

#if defined(__HIP_DEVICE_COMPILE__) && !defined(__gfx90a__) && !defined(__gfx940__) && !defined(__gfx941__) && \
    !defined(__gfx942__) && !defined(__gfx950__)
#error "calico/mfma.h: MFMA needs a CDNA2 or newer target (gfx90a, gfx94x, gfx950)"
#endif

#if defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__)
#define CALICO_HAS_FP8_FNUZ_MFMA 1
#endif

namespace calico {
namespace hip {

typedef short bf16x4_t __attribute__((ext_vector_type(4)));
typedef _Float16 f16x4_t __attribute__((ext_vector_type(4)));
typedef float f32x4_t __attribute__((ext_vector_type(4)));
typedef float f32x16_t __attribute__((ext_vector_type(16)));

// The four 16-bit inputs a lane feeds one MFMA, per element type.
template <class T>
struct mfma_in;
template <>
struct mfma_in<bf16> {
    typedef bf16x4_t type;
};
template <>
struct mfma_in<f16> {
    typedef f16x4_t type;
};

// D = A * B + C for one 16x16x16 block (a: A's fragment, b: B's fragment).
template <class T>
CALICO_DEVICE f32x4_t mfma_16x16x16(typename mfma_in<T>::type a, typename mfma_in<T>::type b, f32x4_t c);
template <>
CALICO_DEVICE f32x4_t mfma_16x16x16<bf16>(bf16x4_t a, bf16x4_t b, f32x4_t c) {
    return __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, c, 0, 0, 0);
}
template <>
CALICO_DEVICE f32x4_t mfma_16x16x16<f16>(f16x4_t a, f16x4_t b, f32x4_t c) {
    return __builtin_amdgcn_mfma_f32_16x16x16f16(a, b, c, 0, 0, 0);
}

// D = A * B + C for one 32x32x8 block.
template <class T>
CALICO_DEVICE f32x16_t mfma_32x32x8(typename mfma_in<T>::type a, typename mfma_in<T>::type b, f32x16_t c);
template <>
CALICO_DEVICE f32x16_t mfma_32x32x8<bf16>(bf16x4_t a, bf16x4_t b, f32x16_t c) {
    return __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(a, b, c, 0, 0, 0);
}
template <>
CALICO_DEVICE f32x16_t mfma_32x32x8<f16>(f16x4_t a, f16x4_t b, f32x16_t c) {
    return __builtin_amdgcn_mfma_f32_32x32x8f16(a, b, c, 0, 0, 0);
}

#ifdef CALICO_HAS_FP8_FNUZ_MFMA
// D = A * B + C for one 16x16x32 block of FNUZ fp8 (e4m3): eight inputs per lane, byte e of
// the 64-bit value is element e.
CALICO_DEVICE f32x4_t mfma_16x16x32_fp8(long a, long b, f32x4_t c) {
    return __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8(a, b, c, 0, 0, 0);
}
// The same with e5m2 (bf8) inputs.
CALICO_DEVICE f32x4_t mfma_16x16x32_bf8(long a, long b, f32x4_t c) {
    return __builtin_amdgcn_mfma_f32_16x16x32_bf8_bf8(a, b, c, 0, 0, 0);
}
#endif

// ---- scheduling. The masks of sched_barrier / sched_group_barrier (LLVM AMDGPU):
constexpr int kSchedNone = 0x0;          // nothing may be moved across
constexpr int kSchedAlu = 0x1;           // non-memory, non-side-effect instructions
constexpr int kSchedValu = 0x2;
constexpr int kSchedSalu = 0x4;
constexpr int kSchedMfma = 0x8;
constexpr int kSchedVmem = 0x10;
constexpr int kSchedVmemRead = 0x20;
constexpr int kSchedVmemWrite = 0x40;
constexpr int kSchedDs = 0x80;
constexpr int kSchedDsRead = 0x100;
constexpr int kSchedDsWrite = 0x200;

// A fence for the compiler's scheduler only: nothing crosses it (no hardware effect).
CALICO_DEVICE void sched_barrier() { __builtin_amdgcn_sched_barrier(kSchedNone); }
// Asks the scheduler for `count` instructions of `mask` next in group `sync_id`; a run of these
// interleaves MFMAs with loads.
#define CALICO_SCHED_GROUP(mask, count, sync_id) __builtin_amdgcn_sched_group_barrier((mask), (count), (sync_id))

// Wave priority for instruction issue (0..3): raised around MFMA bursts so the wave holding
// the matrix core keeps it while the other half of the workgroup loads.
template <int P>
CALICO_DEVICE void set_priority() {
    static_assert(P >= 0 && P <= 3, "s_setprio takes 0..3");
    __builtin_amdgcn_s_setprio(P);
}

// Barrier for the waves of a workgroup with no memory fence (the caller orders memory with
// explicit waits); sync_threads() is the fenced one.
CALICO_DEVICE void barrier_only() { __builtin_amdgcn_s_barrier(); }

// Waits until at most N vector-memory loads of this wave are outstanding (gfx9 s_waitcnt
// encoding: vmcnt in bits 3:0 and 15:14; expcnt 6:4 and lgkmcnt 11:8 left at their maxima).
template <int N>
CALICO_DEVICE void wait_vmem() {
    static_assert(N >= 0 && N < 64, "vmcnt is 6 bits");
    __builtin_amdgcn_s_waitcnt((N & 0xf) | ((N >> 4) << 14) | (0x7 << 4) | (0xf << 8));
}
// Waits until this wave's LDS operations are done (lgkmcnt 0; vmcnt, expcnt at their maxima).
CALICO_DEVICE void wait_lds() { __builtin_amdgcn_s_waitcnt(0xf | (0x3 << 14) | (0x7 << 4)); }

}  // namespace hip
}  // namespace calico
