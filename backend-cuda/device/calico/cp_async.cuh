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
// The same with the destination as a shared-state-space address (what st<>::addr gives).
CALICO_DEVICE void cp_async_16(uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}

// Fills the 16 bytes at shared address `dst` from the first `src_bytes` (0..16, even) bytes at
// `src`, zeros after them. Only whole chunks go through cp.async: a 16-byte copy whose source
// runs past the end of a tensor reads memory that may not exist (the end of an allocation),
// even with a smaller src-size (compute-sanitizer reports it as an out-of-bounds 16-byte
// read), so a tail chunk is read element by element and an empty one is never read at all.
// `src` is not dereferenced when `src_bytes` is 0. The tail's shared stores are plain
// st.shared: visible to the block after the barrier that follows the cp.async wait, like the
// async copies.
CALICO_DEVICE void cp_async_16_tail(uint32_t dst, const void* src, int src_bytes) {
    if (src_bytes == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, 16;\n" ::"r"(dst), "l"(src) : "memory");
        return;
    }
    uint32_t w[4] = {0u, 0u, 0u, 0u};
    const unsigned short* s = static_cast<const unsigned short*>(src);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        if (2 * e < src_bytes) w[e / 2] |= uint32_t(s[e]) << (16 * (e % 2));
    }
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]) : "memory");
}

CALICO_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N committed groups are in flight (then a block barrier publishes them).
template <int N>
CALICO_DEVICE void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace calico
