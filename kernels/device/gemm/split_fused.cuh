// Split-K summed inside the Hopper GEMM (hopper.cu with CALICO_GEMM_SPLIT_FUSED = 1).
//
// For problems whose widest tiles fill between 60% and all of the SMs once (777 x 3072 x
// 14336: 84 tiles of 128 x 256 on 132 SMs), one round of whole tiles leaves SMs idle for the
// whole K loop. Cut every tile's K range into S pieces (the work list is S copies of the tile
// list, as SPLIT_K's) and the pieces fill the rounds: 252 pieces of a third of K run in two
// rounds, two thirds of the time of one round of whole tiles. The copies run in order, so the
// CTAs of a round work through the same K range together and the operands' k-slices they share
// are read from L2 while still there (a schedule that staggers CTAs along K, stream-K, lost
// that reuse and ran at half speed: docs/perf-log.md, session 26).
//
// Each piece stores its f32 accumulators into its own slot of a workspace (in the consumers'
// register order: the reader is the same thread of another CTA, no layout change) and counts
// itself on the tile's counter; the piece that brings the count to S reads every slot back in
// piece order (its own included), so the sum does not depend on which piece came last, runs
// the real epilogue, and clears the counter for the next launch or graph replay.
#pragma once

namespace gemm_split_fused {

// The slot of work item `w`: ACC floats for each of `threads` consumer threads, as float4 runs
// (register group r of thread t at float4 index r * threads + t: each warp's accesses cover
// 512 contiguous bytes).
template <int ACC>
CALICO_DEVICE float4* slot(float* partials, int w, int threads) {
    return reinterpret_cast<float4*>(partials + static_cast<long long>(w) * ACC * threads);
}

// Called by every consumer thread (`t` of `threads`, named barrier `bar`) after the main loop of
// piece `split` of `tile` (work item `split * tiles + tile`). Returns true in the CTA that ran
// the tile's last piece, with `acc` holding the tile's whole sum; false elsewhere.
template <int ACC>
CALICO_DEVICE bool merge(float* partials, unsigned* counters, float (&acc)[ACC], int tile, int split, int splits, int tiles, int t,
                         int threads, int bar) {
    static_assert(ACC % 4 == 0, "float4 runs");
    __shared__ int last_piece;
    float4* mine = slot<ACC>(partials, split * tiles + tile, threads);
#pragma unroll
    for (int r = 0; r < ACC / 4; ++r) mine[r * threads + t] = make_float4(acc[4 * r], acc[4 * r + 1], acc[4 * r + 2], acc[4 * r + 3]);
    calico::named_barrier_sync(bar, threads);
    if (t == 0) {
        // Release the CTA's slot stores (ordered before this thread by the barrier), count the
        // piece, and in the last piece acquire the others' slots.
        asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
        const bool last = atomicAdd(counters + tile, 1u) == static_cast<unsigned>(splits - 1);
        if (last) {
            counters[tile] = 0u;
            asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
        }
        last_piece = last;
    }
    calico::named_barrier_sync(bar, threads);
    if (!last_piece) return false;
    // Every piece in order, from L2 (the slots were written by other SMs): the first one
    // replaces this piece's own sums, the others add to it.
    const float4* first = slot<ACC>(partials, tile, threads);
#pragma unroll
    for (int r = 0; r < ACC / 4; ++r) {
        const float4 v = __ldcg(first + r * threads + t);
        acc[4 * r] = v.x;
        acc[4 * r + 1] = v.y;
        acc[4 * r + 2] = v.z;
        acc[4 * r + 3] = v.w;
    }
    for (int s = 1; s < splits; ++s) {
        const float4* from = slot<ACC>(partials, s * tiles + tile, threads);
#pragma unroll
        for (int r = 0; r < ACC / 4; ++r) {
            const float4 v = __ldcg(from + r * threads + t);
            acc[4 * r] += v.x;
            acc[4 * r + 1] += v.y;
            acc[4 * r + 2] += v.z;
            acc[4 * r + 3] += v.w;
        }
    }
    return true;
}

}  // namespace gemm_split_fused
