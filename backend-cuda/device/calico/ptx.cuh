// Small pieces every CUDA tile header uses: fixed-width integers (NVRTC has no <cstdint>
// without extra include paths) and shared-memory addresses for inline PTX.
#pragma once
#include "calico/vendor.h"

namespace calico {

typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;

// The 32-bit shared-state-space address of a pointer into shared memory.
CALICO_DEVICE uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

}  // namespace calico
