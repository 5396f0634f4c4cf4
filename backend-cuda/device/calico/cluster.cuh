// Thread-block clusters (sm_90): CTA rank, cluster-wide barriers, remote mbarrier arrivals
// and TMA loads multicast to several CTAs of the cluster.
//
// A kernel gets a cluster shape at compile time with __cluster_dims__(x, y, z); an ordinary
// launch then works as long as the grid is a multiple of it. Before a CTA touches another
// CTA's shared memory (remote arrive, multicast), every CTA must have initialised its
// barriers and passed a cluster barrier (sync()); before a CTA exits, the others must be done
// touching its shared memory (a cluster barrier at the end).
#pragma once
#include "calico/ptx.cuh"
#include "calico/mbarrier.cuh"
#include "calico/tma.cuh"

namespace calico {
namespace cluster {

// This CTA's rank in its cluster.
CALICO_DEVICE uint32_t ctarank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}

// Every thread of every (non-exited) CTA of the cluster arrives, then waits for all others.
// Release/acquire: shared-memory writes before it are visible to the cluster after it.
CALICO_DEVICE void sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

// The shared::cluster address of the object at shared::cta address `addr` in CTA `rank`.
CALICO_DEVICE uint32_t map_shared(uint32_t addr, uint32_t rank) {
    uint32_t out;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(addr), "r"(rank));
    return out;
}

// One arrival on the mbarrier at shared::cluster address `cluster_addr` (any CTA of the
// cluster, this one included). Default semantics (release at CTA scope): enough to hand a slot
// back once the wgmma that read it retired; a cluster-scope release would cost a MEMBAR.GPU.
CALICO_DEVICE void arrive_remote(uint32_t cluster_addr) {
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_addr) : "memory");
}

// Global -> shared of every CTA in `cta_mask`, at the same shared-memory offset in each, and
// completing the box bytes on the mbarrier at the same offset in each.
CALICO_DEVICE void load_3d_multicast(void* dst, const tensor_map& m, int c0, int c1, int c2, mbarrier& bar, unsigned short cta_mask) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3, "
        "%4}], [%5], %6;\n" ::"r"(smem_addr(dst)),
        "l"(tma::map_addr(m)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(&bar)), "h"(cta_mask)
        : "memory");
}

}  // namespace cluster
}  // namespace calico
