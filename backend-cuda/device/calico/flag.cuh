// Flags in global memory that one CTA raises and another waits for, within one launch (the
// stream-K fix-up of partial tiles). A raised flag holds the launch's epoch, a number the host
// changes for every launch, so flags never need clearing between launches.
//
// Publishing: every thread of a group writes its data, the group synchronises, then one
// thread makes the writes visible device-wide (fence) and stores the flag with release
// semantics. Waiting: every thread spins on acquire loads until the flag holds the epoch, then
// reads the data (with loads that bypass L1, which is not coherent between SMs).
#pragma once
#include "calico/ptx.cuh"

namespace calico {

CALICO_DEVICE uint32_t load_acquire_gpu(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

CALICO_DEVICE void store_release_gpu(uint32_t* p, uint32_t v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// Called by one thread after its group's writes and a group barrier.
CALICO_DEVICE void raise_flag(uint32_t* flag, uint32_t epoch) {
    __threadfence();
    store_release_gpu(flag, epoch);
}

// Called by every thread of a (converged) warp: each lane's own acquire load sees the flag up,
// so each may read the data after it. The exit test is a warp vote, uniform by construction,
// so the compiler keeps treating the warp as converged afterwards (a lane-divergent spin
// loop here costs the GEMM's main loop its uniform datapath).
CALICO_DEVICE void wait_flag(const uint32_t* flag, uint32_t epoch) {
    while (!__all_sync(0xffffffffu, load_acquire_gpu(flag) == epoch)) __nanosleep(64);
}

}  // namespace calico
