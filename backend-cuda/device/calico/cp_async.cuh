// Ampere-style asynchronous global -> shared copies (cp.async, sm_80+), 16 bytes per thread,
// with zero fill for out-of-bounds sources.
#pragma once
#include "calico/ptx.cuh"

namespace calico {

// Copies 16 bytes from `src` to shared `dst`; when `valid` is false nothing is read and the
// destination is zero-filled (src-size 0). L2 only (.cg): the data is reused via shared memory.
CALICO_DEVICE void cp_async_16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
CALICO_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N committed groups are in flight (then a block barrier publishes them).
template <int N>
CALICO_DEVICE void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace calico
