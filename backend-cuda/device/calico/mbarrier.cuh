// Shared-memory barriers (mbarrier, sm_80+; transaction counts sm_90): the handshake between
// TMA producers and MMA consumers.
//
// A barrier completes a phase when its pending arrival count reaches zero and (sm_90) its
// transaction count, raised by expect_tx and lowered by bytes TMA delivers, is zero too. It
// then flips its phase parity and re-arms with the count given at init. wait(parity) returns
// once the phase with that parity has completed: on a fresh barrier (phase 0 in progress)
// wait(1) returns at once, which is how a producer's first pass over empty slots proceeds.
#pragma once
#include "calico/ptx.cuh"

namespace calico {

// A 64-bit mbarrier in shared memory.
struct alignas(8) mbarrier {
    uint64_t state;
};

// One thread initialises; make it visible with fence_barrier_init() and a block barrier
// before any other thread or the copy engine uses the barrier.
CALICO_DEVICE void init(mbarrier& b, uint32_t arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(&b)), "r"(arrivals) : "memory");
}

// Orders the preceding mbarrier.init before later uses by other threads and the async proxy.
CALICO_DEVICE void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// Counts one arrival.
CALICO_DEVICE void arrive(mbarrier& b) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(smem_addr(&b)) : "memory");
}

// Counts `count` arrivals at once (sm_90): one thread standing in for several.
CALICO_DEVICE void arrive(mbarrier& b, uint32_t count) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(smem_addr(&b)), "r"(count) : "memory");
}

// Counts one arrival and raises the expected transaction bytes of the current phase.
CALICO_DEVICE void arrive_expect_tx(mbarrier& b, uint32_t bytes) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(smem_addr(&b)), "r"(bytes)
                 : "memory");
}

// Raises the expected transaction bytes without arriving.
CALICO_DEVICE void expect_tx(mbarrier& b, uint32_t bytes) {
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(&b)), "r"(bytes) : "memory");
}

// True once the phase of parity `parity` has completed (does not block for long).
CALICO_DEVICE bool test_wait(mbarrier& b, uint32_t parity) {
    uint32_t done;
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(&b)), "r"(parity)
        : "memory");
    return done != 0;
}

// Blocks until the phase of parity `parity` has completed. try_wait suspends in hardware for
// a bounded time, so the loop rarely spins.
CALICO_DEVICE void wait(mbarrier& b, uint32_t parity) {
    while (!test_wait(b, parity)) {
    }
}

}  // namespace calico
