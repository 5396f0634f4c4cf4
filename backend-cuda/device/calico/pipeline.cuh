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
//  * split_roles<PRODUCER_REGS, CONSUMER_REGS>(producer, consumer): the role split.
//    Warpgroup 0 gives registers back (setmaxnreg.dec) and its thread 0 runs producer();
//    warpgroups 1.. take registers (setmaxnreg.inc) and run consumer(consumer_index). Needs
//    __launch_bounds__(threads, 1) on the kernel. An optional assist() runs on warp 1 of
//    warpgroup 0. The Hopper GEMM uses it with its own tile walk.
//  * warp_specialised<PRODUCER_REGS, CONSUMER_REGS>(work, produce, consume): split_roles over
//    the CTA-strided unit walk, calling produce(unit) and consume(consumer_index, unit) for
//    each of the CTA's units (the attention kernels).
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

    // Consumer: `count` of the `releases` arrivals for slot `slot`, by one thread (a slot handed
    // back later than its cursor moved on, e.g. after a TMA store from it has read it).
    CALICO_DEVICE void release_slot(int slot, uint32_t count) { calico::arrive(empty[slot], count); }

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

// The role split on its own, for kernels that walk their units their own way (the Hopper
// GEMM: cluster-strided tiles, consumers alternating tiles in ping-pong mode): warpgroup 0
// gives registers back, its thread 0 runs producer() and all 32 lanes of its warp 1 run
// assist(); warpgroups 1.. take registers and run consumer(consumer_index).
template <int PRODUCER_REGS, int CONSUMER_REGS, class Producer, class Consumer, class Assist>
CALICO_DEVICE void split_roles(Producer&& producer, Consumer&& consumer, Assist&& assist) {
    if (warpgroup_id() == 0) {
        setmaxnreg_dec<PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            producer();
        } else if (threadIdx.x / 32 == 1) {
            assist();
        }
    } else {
        setmaxnreg_inc<CONSUMER_REGS>();
        consumer(warpgroup_id() - 1);
    }
}

template <int PRODUCER_REGS, int CONSUMER_REGS, class Producer, class Consumer>
CALICO_DEVICE void split_roles(Producer&& producer, Consumer&& consumer) {
    split_roles<PRODUCER_REGS, CONSUMER_REGS>(producer, consumer, [] {});
}

// The role split over the CTA-strided unit walk (unit = blockIdx.x, += gridDim.x): produce(unit),
// consume(consumer_index, unit) and, on warp 1 of warpgroup 0, assist(unit) for each unit,
// e.g. to store what the consumers staged in shared memory.
template <int PRODUCER_REGS, int CONSUMER_REGS, class Produce, class Consume, class Assist>
CALICO_DEVICE void warp_specialised(int work, Produce&& produce, Consume&& consume, Assist&& assist) {
    split_roles<PRODUCER_REGS, CONSUMER_REGS>(
        [&] {
            for (int unit = blockIdx.x; unit < work; unit += gridDim.x) produce(unit);
        },
        [&](int consumer) {
            for (int unit = blockIdx.x; unit < work; unit += gridDim.x) consume(consumer, unit);
        },
        [&] {
            for (int unit = blockIdx.x; unit < work; unit += gridDim.x) assist(unit);
        });
}

template <int PRODUCER_REGS, int CONSUMER_REGS, class Produce, class Consume>
CALICO_DEVICE void warp_specialised(int work, Produce&& produce, Consume&& consume) {
    warp_specialised<PRODUCER_REGS, CONSUMER_REGS>(work, produce, consume, [](int) {});
}

}  // namespace pipeline
}  // namespace calico
