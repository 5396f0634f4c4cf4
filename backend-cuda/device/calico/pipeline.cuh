// The warp-specialised, persistent skeleton of Hopper kernels: one producer warpgroup fills a
// ring of shared-memory stages (TMA loads completing on `full` mbarriers), consumer warpgroups
// compute on them and hand each stage back through its `empty` mbarrier; every CTA walks the
// work units blockIdx.x, blockIdx.x + gridDim.x, ... and the consumers run their epilogue per
// unit while the producer already loads the next one.
//
//  * ring<STAGES>: the full/empty barrier pairs of one ring, living in shared memory.
//  * cursor<STAGES>: a running count of stages used, giving slot (count % STAGES) and the
//    parity of the phase to wait for ((count / STAGES) & 1). Producer and consumers each keep
//    one and advance it in the same order, so they agree on slots without talking.
//  * warp_specialised<PRODUCER_REGS, CONSUMER_REGS>(work, produce, consume): the role split.
//    Warpgroup 0 gives registers back (setmaxnreg.dec) and its thread 0 calls produce(unit)
//    for each of the CTA's units; warpgroups 1.. take registers (setmaxnreg.inc) and call
//    consume(consumer_index, unit). Needs __launch_bounds__(threads, 1) on the kernel. An
//    optional assist(unit) runs on warp 1 of warpgroup 0.
//
// The producer's first pass over a fresh ring waits on `empty` with parity 1, which a fresh
// barrier reports as complete: the ring starts empty without any arrivals.
#pragma once
#include "calico/cluster.cuh"
#include "calico/mbarrier.cuh"
#include "calico/warpgroup.cuh"

namespace calico {
namespace pipeline {

template <int STAGES>
struct cursor {
    uint32_t count = 0;
    CALICO_DEVICE int slot() const { return static_cast<int>(count % STAGES); }
    CALICO_DEVICE uint32_t parity() const { return (count / STAGES) & 1u; }
    CALICO_DEVICE void advance() { ++count; }
    // Passes over `n` stages another consumer takes (ping-pong schedules).
    CALICO_DEVICE void skip(uint32_t n) { count += n; }
};

template <int STAGES>
struct ring {
    mbarrier full[STAGES];
    mbarrier empty[STAGES];

    // One thread, before the block barrier that publishes it. `releases` arrivals free a slot.
    CALICO_DEVICE void init(uint32_t releases) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            calico::init(full[s], 1);
            calico::init(empty[s], releases);
        }
    }

    // Producer: waits until the cursor's slot is free and arms its full barrier for `bytes`
    // of copies; returns the barrier the copies complete on.
    CALICO_DEVICE mbarrier& acquire(const cursor<STAGES>& c, uint32_t bytes) {
        calico::wait(empty[c.slot()], c.parity() ^ 1u);
        calico::arrive_expect_tx(full[c.slot()], bytes);
        return full[c.slot()];
    }

    // Consumer: waits until the cursor's slot is filled.
    CALICO_DEVICE void wait_full(const cursor<STAGES>& c) { calico::wait(full[c.slot()], c.parity()); }

    // Consumer: one of the `releases` arrivals that hand the slot back.
    CALICO_DEVICE void release(const cursor<STAGES>& c) { calico::arrive(empty[c.slot()]); }

    // Consumer, thread-block clusters whose producers multicast into every CTA's slot: one
    // arrival on the slot's empty barrier in each of the CLUSTER CTAs (init with `releases`
    // counting every CTA's consumers), so no producer refills a slot a peer still reads.
    template <int CLUSTER>
    CALICO_DEVICE void release_cluster(const cursor<STAGES>& c) {
        if constexpr (CLUSTER == 1) {
            release(c);
        } else {
            const uint32_t addr = smem_addr(&empty[c.slot()]);
#pragma unroll
            for (int r = 0; r < CLUSTER; ++r) cluster::arrive_remote(cluster::map_shared(addr, r));
        }
    }
};

// As below, plus a helper role: all 32 lanes of warp 1 (in warpgroup 0, beside the producer)
// call assist(unit) for each unit, e.g. to store what the consumers staged in shared memory.
template <int PRODUCER_REGS, int CONSUMER_REGS, class Produce, class Consume, class Assist>
CALICO_DEVICE void warp_specialised(int work, Produce&& produce, Consume&& consume, Assist&& assist) {
    if (warpgroup_id() == 0) {
        setmaxnreg_dec<PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            for (int unit = blockIdx.x; unit < work; unit += gridDim.x) produce(unit);
        } else if (threadIdx.x / 32 == 1) {
            for (int unit = blockIdx.x; unit < work; unit += gridDim.x) assist(unit);
        }
    } else {
        setmaxnreg_inc<CONSUMER_REGS>();
        const int consumer = warpgroup_id() - 1;
        for (int unit = blockIdx.x; unit < work; unit += gridDim.x) consume(consumer, unit);
    }
}

template <int PRODUCER_REGS, int CONSUMER_REGS, class Produce, class Consume>
CALICO_DEVICE void warp_specialised(int work, Produce&& produce, Consume&& consume) {
    warp_specialised<PRODUCER_REGS, CONSUMER_REGS>(work, produce, consume, [](int) {});
}

}  // namespace pipeline
}  // namespace calico
