// Inline-PTX helpers of the sm_80 GEMM: cp.async with zero-fill, ldmatrix, mma.sync m16n8k16.
// CUDA only (sm_80 and later).
#pragma once

namespace calico {
namespace sm80 {

CALICO_DEVICE unsigned smem_addr(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

// Copies 16 bytes global -> shared without staging in registers. Only the first `src_bytes`
// (0..16) are read; the rest of the 16 bytes are zero-filled, so edges need no second path.
CALICO_DEVICE void cp_async_16(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// Fills the 16 bytes at shared address `dst` from `src_bytes` (0..16, even) bytes at `src`,
// zeros after them. Only whole chunks go through cp.async: a 16-byte copy whose source runs
// past the end of a tensor reads memory that may not exist (the end of an allocation), even
// with a smaller src-size (compute-sanitizer reports it as an out-of-bounds 16-byte read), so
// a tail chunk is read element by element and an empty one is never read at all. `src` is
// not dereferenced when `src_bytes` is 0. The shared stores are plain st.shared: visible to
// the block after the barrier that follows the cp.async wait, like the async copies.
CALICO_DEVICE void copy_chunk_16(unsigned dst, const void* src, int src_bytes) {
    if (src_bytes == 16) {
        cp_async_16(dst, src, 16);
        return;
    }
    unsigned w[4] = {0u, 0u, 0u, 0u};
    const unsigned short* s = static_cast<const unsigned short*>(src);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        if (2 * e < src_bytes) w[e / 2] |= unsigned(s[e]) << (16 * (e % 2));
    }
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
                 : "memory");
}

CALICO_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most N committed groups are still in flight.
template <int N>
CALICO_DEVICE void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, and register i of
// every lane receives its part of matrix i (lane l: row l / 4, columns 2 (l % 4) and + 1).
CALICO_DEVICE void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// As ldmatrix_x4, each matrix transposed (lane l: column l / 4, rows 2 (l % 4) and + 1).
CALICO_DEVICE void ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// d += a * b for one m16n8k16 tile, f32 accumulators (fragments as in core/src/lanes.rs).
template <class T>
CALICO_DEVICE void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1);

template <>
CALICO_DEVICE void mma_16816<bf16>(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
CALICO_DEVICE void mma_16816<f16>(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Writes one warp's MI x NI m16n8 f32 accumulator tiles into a row-major f32 tile in shared
// memory (`pitch` floats per row), the warp's columns starting at col0. Tile (mi, ni) holds
// e0, e1 at row g = lane / 4, columns 2 (lane % 4) and + 1, and e2, e3 at row g + 8.
template <int MI, int NI>
CALICO_DEVICE void store_accumulators(float* out, int pitch, int col0, const float (&acc)[MI][NI][4], int lane) {
    const int g = lane / 4;
    const int t4 = lane % 4;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                vec<float, 2> v2;
                v2.v[0] = acc[mi][ni][2 * e];
                v2.v[1] = acc[mi][ni][2 * e + 1];
                const int r = mi * 16 + e * 8 + g;
                const int cl = col0 + ni * 8 + t4 * 2;
                *reinterpret_cast<vec<float, 2>*>(&out[r * pitch + cl]) = v2;
            }
}

}  // namespace sm80
}  // namespace calico
