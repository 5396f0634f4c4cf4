// Warpgroups (4 consecutive warps, 128 threads) and warp specialisation on Hopper.
//
// setmaxnreg moves registers between warpgroups: producers that only issue TMA shrink,
// MMA consumers with large accumulators grow. It takes effect only when the kernel has a
// register cap at entry (__launch_bounds__(threads, 1)), every warp of the warpgroup runs
// it, and the counts are multiples of 8 in [24, 256].
#pragma once
#include "calico/ptx.cuh"

namespace calico {

inline constexpr int WARPGROUP_THREADS = 128;
inline constexpr int WARPGROUP_WARPS = 4;

CALICO_DEVICE int warpgroup_id() { return static_cast<int>(threadIdx.x) / WARPGROUP_THREADS; }
// Thread index within the warpgroup (0..127).
CALICO_DEVICE int warpgroup_thread() { return static_cast<int>(threadIdx.x) % WARPGROUP_THREADS; }
// Warp index within the warpgroup (0..3), uniform across the warp.
CALICO_DEVICE int warpgroup_warp() { return __shfl_sync(0xffffffffu, warpgroup_thread() / 32, 0); }

template <int REGS>
CALICO_DEVICE void setmaxnreg_inc() {
    static_assert(REGS % 8 == 0 && REGS >= 24 && REGS <= 256, "setmaxnreg takes multiples of 8 in [24, 256]");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
CALICO_DEVICE void setmaxnreg_dec() {
    static_assert(REGS % 8 == 0 && REGS >= 24 && REGS <= 256, "setmaxnreg takes multiples of 8 in [24, 256]");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

// Barrier among `threads` threads (a multiple of 32) on hardware barrier `id` (1..15; 0 is
// __syncthreads). Lets one warpgroup synchronise without stalling the others.
CALICO_DEVICE void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
CALICO_DEVICE void named_barrier_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// True in exactly one lane of the calling (converged) warp.
CALICO_DEVICE bool elect_one() {
    uint32_t is_leader;
    asm volatile(
        "{\n.reg .pred p;\n.reg .b32 lane;\nelect.sync lane|p, 0xffffffff;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(is_leader));
    return is_leader != 0;
}

}  // namespace calico
