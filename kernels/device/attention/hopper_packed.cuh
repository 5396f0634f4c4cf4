// Packed sequences (varlen) in the Hopper attention kernels: the offsets, which the host does
// not read back (that would synchronise) and the kernels therefore do not trust. CUDA only.
#pragma once
#include "calico/calico.h"

namespace calico {
namespace attention {

// Offset b of a packed batch, clamped to [0, total]: no bound derived from it leaves the
// tensors, whatever the offsets hold.
CALICO_DEVICE int packed_offset(const int* cu, int b, int total) { return min(max(__ldg(cu + b), 0), total); }

// The sequence b with cu[b] <= x < cu[b + 1] (clamped offsets) for an x between the first
// and the last of the n + 1 offsets: a binary search.
CALICO_DEVICE int packed_sequence(const int* cu, int n, int total, long long x) {
    int a = 0, z = n;  // cu[a] <= x < cu[z]
    while (z - a > 1) {
        const int mid = (a + z) / 2;
        if (packed_offset(cu, mid, total) <= x) a = mid;
        else z = mid;
    }
    return a;
}

}  // namespace attention
}  // namespace calico
