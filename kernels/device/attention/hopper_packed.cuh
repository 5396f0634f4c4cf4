// Packed sequences (varlen) in the Hopper attention kernels: the offsets, which the host does
// not read back (that would synchronise) and the kernels therefore do not trust. CUDA only.
#pragma once
#include "calico/calico.h"

namespace calico {
namespace attention {

// Offset b of a packed batch, clamped to [0, total]: no bound derived from it leaves the
// tensors, whatever the offsets hold.
CALICO_DEVICE int packed_offset(const int* cu, int b, int total) { return min(max(__ldg(cu + b), 0), total); }

// The sequence b with at(b) <= x < at(b + 1) for an x between the first and the last of the
// n + 1 offsets that `at` returns (clamped, so non-decreasing or not, the search ends): a
// binary search.
template <class Offset>
CALICO_DEVICE int packed_sequence_by(const Offset& at, int n, long long x) {
    int a = 0, z = n;  // at(a) <= x < at(z)
    while (z - a > 1) {
        const int mid = (a + z) / 2;
        if (at(mid) <= x) a = mid;
        else z = mid;
    }
    return a;
}

// packed_sequence_by over the offsets in global memory.
CALICO_DEVICE int packed_sequence(const int* cu, int n, int total, long long x) {
    return packed_sequence_by([&](int b) { return packed_offset(cu, b, total); }, n, x);
}

// One side's offsets (query rows or keys) in global memory, clamped on every read.
struct packed_side {
    const int* cu;
    int total;
    CALICO_DEVICE int at(int b) const { return packed_offset(cu, b, total); }
    // The sequence holding row (or key) x, as packed_sequence.
    CALICO_DEVICE int sequence(int n, long long x) const { return packed_sequence(cu, n, total, x); }
};

// The block's threads copy the n + 1 offsets of `side`, clamped, to `dst` in shared memory,
// where a unit's sequence lookups cost a few shared loads instead of a chain of dependent L2
// round trips. The caller synchronises the block before anyone reads them.
CALICO_DEVICE void stage_packed_offsets(const packed_side& side, int n, int* dst) {
    for (int i = threadIdx.x; i <= n; i += blockDim.x) dst[i] = side.at(i);
}

}  // namespace attention
}  // namespace calico
