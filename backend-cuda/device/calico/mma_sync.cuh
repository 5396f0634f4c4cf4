// Warp-level tensor-core MMA (mma.sync m16n8k16, sm_80+) and ldmatrix, on register tiles.
#pragma once
#include "calico/tile.cuh"

namespace calico {

CALICO_DEVICE uint32_t as_u32(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t*>(&v); }
CALICO_DEVICE uint32_t as_u32(__half2 v) { return *reinterpret_cast<uint32_t*>(&v); }

// d[16x8] = a[16x16] * b[16x8] + c, f32 accumulate. a: 4 regs (row_l base tile), b: 2 regs
// (a col_l base tile's reg pair for one 8-column half), c/d: 4 floats.
template <class T>
CALICO_DEVICE void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4]);
template <>
CALICO_DEVICE void mma_16816<bf16>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}
template <>
CALICO_DEVICE void mma_16816<f16>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

// d += a * b for one m16n8k16 step on raw fragments (a from ldmatrix, b0/b1 one n8 half of a
// col_l base tile): the form kernels use when they stream fragments instead of whole tiles.
template <class T>
CALICO_DEVICE void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    const uint32_t b[2] = {b0, b1};
    mma_16816<T>(d, a, b, d);
}

// The four f32 accumulators of mma.sync's C/D fragment for the 8-column half h of base tile
// (i, j) of a float row_l tile: regs 2h (row g) and 2h + 1 (row g + 8), each a pair along the
// row, are c0 c1 and c2 c3 in that order (see the register mapping below).
template <int R, int C>
CALICO_DEVICE float (&mma_half(rt<float, R, C, row_l>& t, int i, int j, int h))[4] {
    return *reinterpret_cast<float(*)[4]>(&t.data[i][j][2 * h]);
}

// D = A * B + C on register tiles: A M x K (row_l), B K x N (col_l), C and D M x N float row_l.
// Register mapping per base tile: our reg order (g,2t), (g+8,2t), (g,2t+8), (g+8,2t+8) is
// exactly the instruction's a0a1, a2a3, a4a5, a6a7; an 8-column half h of the C/D tile is
// regs {2h, 2h+1} in the same order as c0c1, c2c3 once the row-major pairs are split; B's
// half h is col_l regs {h, h + 2} (k = 2t.. and k = 2t+8.. at column g + 8h).
//
// The transposed forms need no data movement: a col_l K x M tile holds, register for
// register, what a row_l M x K tile of its transpose holds (and a row_l N x K tile what a
// col_l K x N tile holds), so A^T and B^T only swap the base-tile indices.
namespace detail {
// Base tile (r, c) of the operand as the MMA sees it; (c, r) of the stored tile when transposed.
template <bool TRANSPOSED, class TILE>
CALICO_DEVICE const auto& block(const TILE& t, int r, int c) {
    if constexpr (TRANSPOSED)
        return t.data[c][r];
    else
        return t.data[r][c];
}

template <bool A_T, bool B_T, class T, int M, int N, int K, class AT, class BT>
CALICO_DEVICE void mma_tiles(rt<float, M, N, row_l>& d, const AT& a, const BT& b, const rt<float, M, N, row_l>& c) {
#pragma unroll
    for (int i = 0; i < M / 16; ++i) {
#pragma unroll
        for (int j = 0; j < N / 16; ++j) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                // C/D half h: rows g and g+8 at columns 2t + 8h  ->  regs h*2 (row g) and h*2+1 (row g+8).
                float acc[4] = {c.data[i][j][2 * h].x, c.data[i][j][2 * h].y, c.data[i][j][2 * h + 1].x, c.data[i][j][2 * h + 1].y};
#pragma unroll
                for (int kk = 0; kk < K / 16; ++kk) {
                    const auto& ab = block<A_T>(a, i, kk);
                    const auto& bb = block<B_T>(b, kk, j);
                    const uint32_t af[4] = {as_u32(ab[0]), as_u32(ab[1]), as_u32(ab[2]), as_u32(ab[3])};
                    const uint32_t bf[2] = {as_u32(bb[h]), as_u32(bb[h + 2])};
                    mma_16816<T>(acc, af, bf, acc);
                }
                d.data[i][j][2 * h] = make_float2(acc[0], acc[1]);
                d.data[i][j][2 * h + 1] = make_float2(acc[2], acc[3]);
            }
        }
    }
}
}  // namespace detail

template <class T, int M, int N, int K>
CALICO_DEVICE void mma_AB(rt<float, M, N, row_l>& d, const rt<T, M, K, row_l>& a, const rt<T, K, N, col_l>& b,
                          const rt<float, M, N, row_l>& c) {
    detail::mma_tiles<false, false, T, M, N, K>(d, a, b, c);
}
// D = A * B^T + C: B given as N x K (row_l), e.g. a row-major weight or K stored by rows.
template <class T, int M, int N, int K>
CALICO_DEVICE void mma_ABt(rt<float, M, N, row_l>& d, const rt<T, M, K, row_l>& a, const rt<T, N, K, row_l>& b,
                           const rt<float, M, N, row_l>& c) {
    detail::mma_tiles<false, true, T, M, N, K>(d, a, b, c);
}
// D = A^T * B + C: A given as K x M (col_l).
template <class T, int M, int N, int K>
CALICO_DEVICE void mma_AtB(rt<float, M, N, row_l>& d, const rt<T, K, M, col_l>& a, const rt<T, K, N, col_l>& b,
                           const rt<float, M, N, row_l>& c) {
    detail::mma_tiles<true, false, T, M, N, K>(d, a, b, c);
}
// D = A^T * B^T + C: A given as K x M (col_l), B as N x K (row_l).
template <class T, int M, int N, int K>
CALICO_DEVICE void mma_AtBt(rt<float, M, N, row_l>& d, const rt<T, K, M, col_l>& a, const rt<T, N, K, row_l>& b,
                            const rt<float, M, N, row_l>& c) {
    detail::mma_tiles<true, true, T, M, N, K>(d, a, b, c);
}

// Loads four 8x8 16-bit matrices from shared memory; lane l supplies the row address of row
// l % 8 of matrix l / 8. With .trans each matrix arrives transposed.
CALICO_DEVICE void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
CALICO_DEVICE void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

}  // namespace calico
