// Hopper's tensor memory accelerator (cp.async.bulk.tensor, sm_90): whole tiles copied
// between global and shared memory by the copy engine, described by a tensor map.
//
// The tensor map (CUtensorMap, 128 bytes) is encoded on the host (calico_cuda::tma) and passed
// by value as a `const __grid_constant__ calico::tensor_map` kernel parameter; its address
// is then a generic address the copy engine can read. Coordinates are element indices,
// innermost first; the innermost one must fall on a 16-byte boundary (coordinate x element size
// a multiple of 16), for loads too: a load box starting 2 bytes past a boundary stopped the
// H100 with an illegal instruction (benches/gpu/tma_class_probe.cu), so rows that do not start
// on 16-byte boundaries cannot be read by TMA at all, whatever the tensor map. A load box may
// start before the tensor (negative coordinates) or run past its end: elements outside read
// as zero, and a load always completes the full box size in
// bytes on its mbarrier, edge boxes included. A store box may run past the end (those elements
// are not written) but must not start before the tensor: a negative store coordinate, like a
// misaligned innermost one, is not clipped but faults (illegal instruction at the UTMASTG,
// which poisons the context). try_store_2d / try_store_3d check both and refuse such boxes;
// calico_cuda::tma::check_coords is the host-side mirror. The clipping past the end has one
// exception: stores write whole 16-byte chunks of a row, so where the innermost extent ends
// inside a chunk, the rest of that chunk (up to the row's next 16-byte boundary) receives the
// box's contents there. Keep that padding free: a destination that is a column slice of a wider
// tensor needs an innermost extent in whole 16-byte pieces.
//
// Shared-memory destinations must be aligned to 128 bytes, and to the swizzle repeat
// (1024 bytes for 128B swizzle) so the smem layout matches tile.cuh's st<> and wgmma's
// descriptors.
#pragma once
#include "calico/ptx.cuh"
#include "calico/mbarrier.cuh"

namespace calico {

struct alignas(64) tensor_map {
    unsigned long long opaque[16];
};

namespace tma {

CALICO_DEVICE uint64_t map_addr(const tensor_map& m) { return reinterpret_cast<uint64_t>(&m); }

// Fetches the tensor map into the cache ahead of the first copy.
CALICO_DEVICE void prefetch(const tensor_map& m) { asm volatile("prefetch.tensormap [%0];\n" ::"l"(map_addr(m)) : "memory"); }

// Global -> shared, completing `box bytes` on `bar`.
CALICO_DEVICE void load_2d(void* dst, const tensor_map& m, int c0, int c1, mbarrier& bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
            smem_addr(dst)),
        "l"(map_addr(m)), "r"(c0), "r"(c1), "r"(smem_addr(&bar))
        : "memory");
}

CALICO_DEVICE void load_3d(void* dst, const tensor_map& m, int c0, int c1, int c2, mbarrier& bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(
            smem_addr(dst)),
        "l"(map_addr(m)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(&bar))
        : "memory");
}

CALICO_DEVICE void load_4d(void* dst, const tensor_map& m, int c0, int c1, int c2, int c3, mbarrier& bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(
            smem_addr(dst)),
        "l"(map_addr(m)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(&bar))
        : "memory");
}

// Shared -> global reduction without a tensor map: adds `bytes` of f32 values (a multiple of
// 16; both addresses 16-byte aligned) to global memory, element by element, in the L2. Groups
// with store_commit / store_wait_read / store_wait like the tensor stores; the smem source must
// have been written before a fence_proxy_async() and a barrier, as for those.
CALICO_DEVICE void bulk_reduce_add_f32(float* dst, const void* src, uint32_t bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(smem_addr(src)),
                 "r"(bytes)
                 : "memory");
}

// L2 eviction policies for cache-hinted loads: evict_last keeps lines that later CTAs will
// read again, evict_first lets a stream leave the L2 first.
CALICO_DEVICE uint64_t policy_evict_last() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}
CALICO_DEVICE uint64_t policy_evict_first() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}

// load_3d with an L2 eviction policy from policy_evict_*().
CALICO_DEVICE void load_3d_hint(void* dst, const tensor_map& m, int c0, int c1, int c2, mbarrier& bar, uint64_t policy) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3, %4}], [%5], "
        "%6;\n" ::"r"(smem_addr(dst)),
        "l"(map_addr(m)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(&bar)), "l"(policy)
        : "memory");
}

// Shared -> global. The smem source must have been written before a fence_proxy_async()
// by every writing thread and a barrier among them.
CALICO_DEVICE void store_2d(const tensor_map& m, const void* src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(map_addr(m)), "r"(c0), "r"(c1),
                 "r"(smem_addr(src))
                 : "memory");
}

CALICO_DEVICE void store_3d(const tensor_map& m, const void* src, int c0, int c1, int c2) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(map_addr(m)), "r"(c0),
                 "r"(c1), "r"(c2), "r"(smem_addr(src))
                 : "memory");
}

CALICO_DEVICE void store_4d(const tensor_map& m, const void* src, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(map_addr(m)),
                 "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(src))
                 : "memory");
}

// Whether a store box at these coordinates can be issued (see the top of this file): the
// innermost coordinate on a 16-byte boundary for elements of `elem_bytes`, none negative.
CALICO_DEVICE bool store_coords_ok(int elem_bytes, int c0, int c1, int c2 = 0) {
    return ((long long)c0 * elem_bytes) % 16 == 0 && c0 >= 0 && c1 >= 0 && c2 >= 0;
}

// store_2d / store_3d when store_coords_ok, for elements of T; false (nothing issued) otherwise.
template <class T>
CALICO_DEVICE bool try_store_2d(const tensor_map& m, const void* src, int c0, int c1) {
    if (!store_coords_ok((int)sizeof(T), c0, c1)) return false;
    store_2d(m, src, c0, c1);
    return true;
}
template <class T>
CALICO_DEVICE bool try_store_3d(const tensor_map& m, const void* src, int c0, int c1, int c2) {
    if (!store_coords_ok((int)sizeof(T), c0, c1, c2)) return false;
    store_3d(m, src, c0, c1, c2);
    return true;
}

// Groups the stores issued so far; wait until at most N groups still read shared memory
// (the smem may then be rewritten) or, with wait_group, until N groups are fully written.
CALICO_DEVICE void store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N>
CALICO_DEVICE void store_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
CALICO_DEVICE void store_wait() {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace tma

// Makes this thread's ordinary shared-memory writes visible to the async proxy (TMA stores,
// wgmma operand reads). Each writing thread runs it before the barrier that hands over.
CALICO_DEVICE void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

}  // namespace calico
