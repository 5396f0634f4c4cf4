// Stream-K scheduling for the Hopper GEMM (hopper.cu with CALICO_GEMM_STREAM_K = 1).
//
// A persistent grid over whole tiles runs in rounds of gridDim.x tiles, so a problem of 84
// tiles on 132 SMs leaves 48 SMs idle for its whole K loop, and 144 tiles take two rounds for
// 9% more work than one. Stream-K lays the k-tiles of every output tile end to end (tile t's
// k-tiles are positions t * k_tiles .. (t + 1) * k_tiles - 1) and gives CTA b the positions
// [total * b / G, total * (b + 1) / G): every CTA the same work to within one k-tile. A range
// starts and ends anywhere inside a tile, so one tile may be computed by several CTAs, each
// over a piece of its K range:
//  * the piece that starts at k-tile 0 belongs to the tile's owner, the CTA whose range holds
//    the tile's first position; the owner adds the others' sums and runs the real epilogue;
//  * a piece that starts past k-tile 0 can only be the first piece of its CTA's range (every
//    later piece starts a tile), so each CTA publishes at most one partial tile: its f32
//    accumulators go to slot b of a workspace, in the consumers' own register order (the owner
//    reads them back into the same registers: no layout change), and flag b is raised;
//  * the contributors of a tile are the CTAs after its owner whose ranges begin inside the
//    tile; the owner waits for their flags in CTA order and adds their slots in that order, so
//    the result does not depend on timing, and clears each flag it consumed (the counters are
//    zero again for the next launch or graph replay).
// A contributor publishes its first piece before anything else, and the owner's piece is the
// last of its own range, so the owner rarely waits. Every CTA of the grid must be resident at
// once (one per SM at most: the host sizes the grid to the SM count), or an owner could spin on
// a CTA that never starts.
#pragma once

namespace gemm_stream_k {

// The first position of CTA `cta`'s range among `total` k-tiles shared by `ctas` CTAs.
CALICO_DEVICE long long range_begin(long long total, int cta, int ctas) { return total * cta / ctas; }

// Calls f(tile, kt_begin, kt_end) for each piece of this CTA's range, in order.
template <class F>
CALICO_DEVICE void for_each_piece(long long total, int k_tiles, F&& f) {
    const long long end = range_begin(total, blockIdx.x + 1, gridDim.x);
    long long pos = range_begin(total, blockIdx.x, gridDim.x);
    while (pos < end) {
        const int tile = static_cast<int>(pos / k_tiles);
        const int kt_begin = static_cast<int>(pos - static_cast<long long>(tile) * k_tiles);
        const long long left = end - pos;
        const int kt_end = left < k_tiles - kt_begin ? kt_begin + static_cast<int>(left) : k_tiles;
        f(tile, kt_begin, kt_end);
        pos += kt_end - kt_begin;
    }
}

CALICO_DEVICE unsigned load_acquire(const unsigned* flag) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(flag) : "memory");
    return v;
}

CALICO_DEVICE void store_release(unsigned* flag, unsigned v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(flag), "r"(v) : "memory");
}

CALICO_DEVICE void store_relaxed(unsigned* flag, unsigned v) {
    asm volatile("st.relaxed.gpu.global.u32 [%0], %1;\n" ::"l"(flag), "r"(v) : "memory");
}

// The slot of CTA `cta`: ACC floats for each of `threads` consumer threads, stored as float4
// runs (register group r of thread t at float4 index r * threads + t: each warp's stores and
// loads cover 512 contiguous bytes).
template <int ACC>
CALICO_DEVICE float4* slot(float* partials, int cta, int threads) {
    return reinterpret_cast<float4*>(partials + static_cast<long long>(cta) * ACC * threads);
}

// Every consumer thread (`t` of `threads`, all arriving on named barrier `bar`) stores its
// accumulators into this CTA's slot; then one thread raises the CTA's flag with release
// semantics, after the barrier has ordered every thread's stores before it.
template <int ACC>
CALICO_DEVICE void publish(float* partials, unsigned* flags, const float (&acc)[ACC], int t, int threads, int bar) {
    static_assert(ACC % 4 == 0, "float4 runs");
    float4* dst = slot<ACC>(partials, blockIdx.x, threads);
#pragma unroll
    for (int r = 0; r < ACC / 4; ++r) dst[r * threads + t] = make_float4(acc[4 * r], acc[4 * r + 1], acc[4 * r + 2], acc[4 * r + 3]);
    calico::named_barrier_sync(bar, threads);
    // The release store is cumulative: it orders the stores the barrier made visible to
    // this thread as well as its own.
    if (t == 0) store_release(flags + blockIdx.x, 1u);
}

// The owner of the tile whose k-tiles end at position `tile_end` adds the partial sums of its
// contributors (CTAs blockIdx.x + 1, ... whose ranges begin before `tile_end`), in CTA order.
template <int ACC>
CALICO_DEVICE void collect(const float* partials, unsigned* flags, float (&acc)[ACC], long long total, long long tile_end, int t, int threads,
                           int bar) {
    for (int src = blockIdx.x + 1; src < static_cast<int>(gridDim.x) && range_begin(total, src, gridDim.x) < tile_end; ++src) {
        if (t == 0) {
            while (load_acquire(flags + src) == 0u) __nanosleep(32);
            store_relaxed(flags + src, 0u);  // consumed: zero again for the next launch
        }
        calico::named_barrier_sync(bar, threads);
        const float4* from = slot<ACC>(const_cast<float*>(partials), src, threads);
#pragma unroll
        for (int r = 0; r < ACC / 4; ++r) {
            // L2, not L1: the slot was written by another SM.
            const float4 v = __ldcg(from + r * threads + t);
            acc[4 * r] += v.x;
            acc[4 * r + 1] += v.y;
            acc[4 * r + 2] += v.z;
            acc[4 * r + 3] += v.w;
        }
    }
}

}  // namespace gemm_stream_k
