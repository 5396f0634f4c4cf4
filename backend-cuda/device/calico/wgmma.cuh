// Hopper warpgroup MMA (wgmma, sm_90a): shared-memory matrix descriptors and
// wgmma.mma_async m64nNk16 for bf16/f16 inputs with f32 accumulators.
//
// A warpgroup (4 consecutive warps starting at a warp index divisible by 4) computes
// D[64 x N] (+)= A[64 x 16] * B[16 x N]. B always comes from shared memory through a
// descriptor; A from shared memory (ss) or from registers (rs).
//
// Accumulator layout (f32, N/2 registers per thread): warp w of the warpgroup owns rows
// 16w..16w+15; with g = lane / 4 and t = lane % 4, register 4j + {0,1} holds row g,
// cols 8j + 2t + {0,1}, and register 4j + {2,3} holds row g + 8, same cols. This is the
// row-major 16x16 register-tile layout of tile.cuh laid side by side (rt<float,16,N>).
//
// Ordering rules (PTX ISA, "asynchronous warpgroup level matrix"):
//  * fence() before the first wgmma of a batch whenever the accumulator (or A registers)
//    were touched by ordinary instructions, and after smem the wgmma will read was written
//    by ordinary stores (those also need fence_proxy_async from tma.cuh).
//  * commit_group() after issuing a batch; wait_group<N>() before reading accumulators or
//    reusing the shared memory the batch reads.
#pragma once
#include "calico/ptx.cuh"
#include "calico/tile.cuh"

namespace calico {
namespace wgmma {

// Swizzle modes of a shared-memory matrix descriptor (bits 62-63). Values differ from the
// TMA enum: the tensor map's 128B swizzle pairs with mode 1 here.
enum class swizzle : uint64_t { none = 0, b128 = 1, b64 = 2, b32 = 3 };

// Matrix descriptor: start address, leading/stride byte offsets (all >> 4, 14 bits each),
// base offset 0 (tiles are aligned to the swizzle repeat), swizzle mode.
//
// K-major operand (rows of the MMA's M or N, K contiguous), swizzled: rows of
// swizzle-width bytes, 8-row groups `sbo` bytes apart (1024 for 128B rows laid densely);
// lbo is unused (1 by convention). Step K by 16 elements = 32 bytes of start address.
//
// MN-major operand (M or N contiguous), swizzled: atoms of (swizzle-width bytes of MN) x
// (8 K rows); `sbo` = distance between 8-K-row groups, `lbo` = distance between
// swizzle-width chunks along MN. Step K by 16 rows = 2 * sbo.
CALICO_DEVICE uint64_t make_desc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes, swizzle mode) {
    uint64_t d = 0;
    d |= (uint64_t)((smem_addr & 0x3FFFF) >> 4);
    d |= (uint64_t)((lbo_bytes & 0x3FFFF) >> 4) << 16;
    d |= (uint64_t)((sbo_bytes & 0x3FFFF) >> 4) << 32;
    d |= (uint64_t)mode << 62;
    return d;
}

// The descriptor for a tile whose rows are 128 bytes with 128B swizzle, K-major.
CALICO_DEVICE uint64_t desc_kmajor_128b(uint32_t smem_addr) { return make_desc(smem_addr, 16, 1024, swizzle::b128); }

// MN-major, 128B swizzle: 64-element (16-bit) chunks of MN each holding `k_rows` rows of
// 128 bytes, chunks contiguous (what TMA writes for boxes of {64, k_rows} placed back to back).
CALICO_DEVICE uint64_t desc_mnmajor_128b(uint32_t smem_addr, uint32_t k_rows) {
    return make_desc(smem_addr, k_rows * 128, 1024, swizzle::b128);
}

// The descriptor of the operand `bytes` past `desc`'s start address (the start field is bits
// 0-13, address >> 4), as one 32-bit add: shared memory lies below 256 KiB, so the start field
// never carries into the fields above it. Kernels build one base descriptor per tile and step
// K with this instead of a full make_desc per wgmma (mask, shift and merge on the uniform
// datapath each time).
CALICO_DEVICE uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
    const uint32_t lo = (uint32_t)desc + (bytes >> 4);
    return ((desc >> 32) << 32) | lo;
}

// ---- descriptors from the shared-tile type (tile.cuh's st<>)
// The swizzle mode, the 8-row group stride (8 rows of the swizzle width) and, for MN-major
// operands, the distance between swizzle-width column chunks (st::chunk_bytes) all follow
// from the tile type, so a kernel names tiles and element coordinates, never byte offsets.
template <class ST>
constexpr swizzle swizzle_of() {
    return ST::swizzle_bytes == 128 ? swizzle::b128 : ST::swizzle_bytes == 64 ? swizzle::b64 : swizzle::b32;
}

// K-major operand: `ST` holds MN rows x K columns (K contiguous), at shared address `tile`.
// The descriptor of the 8-row groups from row `row0` (a multiple of 8) at K column `k0` (a
// multiple of 16): wgmma reads 16 K elements of every row from there.
template <class ST>
CALICO_DEVICE uint64_t desc_k(uint32_t tile, int row0, int k0) {
    static_assert(sizeof(typename ST::dtype) == 2, "wgmma descriptors here are for 16-bit operands");
    static_assert(ST::cols % 16 == 0 && ST::rows % 8 == 0, "K in steps of 16, rows in groups of 8");
    const uint32_t at = tile + (k0 / ST::chunk_cols) * ST::chunk_bytes + row0 * ST::swizzle_bytes + (k0 % ST::chunk_cols) * 2;
    return make_desc(at, 16, 8 * ST::swizzle_bytes, swizzle_of<ST>());
}

// MN-major operand: `ST` holds K rows x MN columns (MN contiguous). The descriptor at K row
// `k0` (a multiple of 16) and column `col0` (a multiple of the chunk width): the 16 K rows
// from there, over the chunks that follow.
template <class ST>
CALICO_DEVICE uint64_t desc_mn(uint32_t tile, int k0, int col0) {
    static_assert(sizeof(typename ST::dtype) == 2, "wgmma descriptors here are for 16-bit operands");
    static_assert(ST::rows % 16 == 0, "K in steps of 16");
    const uint32_t at = tile + (col0 / ST::chunk_cols) * ST::chunk_bytes + k0 * ST::swizzle_bytes;
    return make_desc(at, ST::chunk_bytes, 8 * ST::swizzle_bytes, swizzle_of<ST>());
}

// Makes register and shared-memory writes by this warpgroup visible to the next wgmma.
CALICO_DEVICE void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
// Closes the batch of wgmma issued since the last commit.
CALICO_DEVICE void commit_group() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed batches are still running.
template <int N>
CALICO_DEVICE void wait_group() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving accumulator reads/writes across an asynchronous wgmma.
template <int R>
CALICO_DEVICE void fence_operands(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The operand lists are mechanical (N/2 "+f" outputs); TY is the PTX type name.
// clang-format off
#include "calico/wgmma_ops.cuh"
// clang-format on

// D[64 x N] (+)= A * B for T in {bf16, f16}. scale_d = 0 ignores D's old value (D = A*B).
// TRANS_B = 0: B is K-major in shared memory; 1: B is N-major (16-bit types only). TRANS_A
// (ss only) likewise for A: 1 reads an M-major A (M contiguous).
template <class T, int N>
struct mma;

#define CALICO_WGMMA_DEFINE(T, TY, N)                                                                       \
    template <>                                                                                             \
    struct mma<T, N> {                                                                                      \
        template <int TRANS_B, int TRANS_A = 0>                                                             \
        static CALICO_DEVICE void ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {    \
            CALICO_WGMMA_SS_N##N(TY);                                                                       \
        }                                                                                                   \
        template <int TRANS_B>                                                                              \
        static CALICO_DEVICE void rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) { \
            CALICO_WGMMA_RS_N##N(TY);                                                                       \
        }                                                                                                   \
    };

#define CALICO_WGMMA_DEFINE_ALL_N(T, TY) \
    CALICO_WGMMA_DEFINE(T, TY, 16)       \
    CALICO_WGMMA_DEFINE(T, TY, 32)       \
    CALICO_WGMMA_DEFINE(T, TY, 64)       \
    CALICO_WGMMA_DEFINE(T, TY, 80)       \
    CALICO_WGMMA_DEFINE(T, TY, 96)       \
    CALICO_WGMMA_DEFINE(T, TY, 128)      \
    CALICO_WGMMA_DEFINE(T, TY, 160)      \
    CALICO_WGMMA_DEFINE(T, TY, 176)      \
    CALICO_WGMMA_DEFINE(T, TY, 192)      \
    CALICO_WGMMA_DEFINE(T, TY, 256)

CALICO_WGMMA_DEFINE_ALL_N(bf16, "bf16")
CALICO_WGMMA_DEFINE_ALL_N(f16, "f16")

#undef CALICO_WGMMA_DEFINE_ALL_N
#undef CALICO_WGMMA_DEFINE

// ---- warpgroup MMA on shared tiles
// acc[64 x N] (+)= A * B for one k16 step, both operands in shared tiles of one dtype:
// A = rows a_row0..a_row0+63, K columns k0..k0+15 of SA (MN rows x K columns); B = rows
// b_mn0..b_mn0+N-1 of SB holding N x K (B_KMAJOR, a torch Linear weight: acc += A B^T), or K
// rows k0.. and columns b_mn0..b_mn0+N-1 of SB holding K x N. Shapes are checked here; the
// offsets must stay inside the tiles.
template <bool B_KMAJOR, int N, class SA, class SB>
CALICO_DEVICE void mma_k16(float (&acc)[N / 2], uint32_t a, int a_row0, uint32_t b, int b_mn0, int k0) {
    typedef typename SA::dtype T;
    static_assert(same_type<T, typename SB::dtype>::value, "A and B share a dtype");
    static_assert(SA::rows >= 64, "A gives 64 rows");
    static_assert(B_KMAJOR ? (SB::rows >= N && SB::cols == SA::cols) : (SB::cols >= N && SB::rows == SA::cols),
                  "B gives N columns over A's K");
    const uint64_t da = desc_k<SA>(a, a_row0, k0);
    const uint64_t db = B_KMAJOR ? desc_k<SB>(b, b_mn0, k0) : desc_mn<SB>(b, k0, b_mn0);
    mma<T, N>::template ss<B_KMAJOR ? 0 : 1>(acc, da, db, 1);
}

// A warp's 16 x N share of a warpgroup's 64 x N f32 accumulator is a row-layout register
// tile: rt<float, 16, N>'s registers, in memory order, are the instruction's D fragment
// registers (see the layout at the top of this file), so wgmma accumulates into the tile.
template <int N>
using acc_tile = rt<float, 16, N, row_l>;

// The accumulator tile's registers as the instruction's operand list.
template <int N>
CALICO_DEVICE float (&regs(acc_tile<N>& t))[N / 2] {
    static_assert(sizeof(acc_tile<N>) == N / 2 * sizeof(float), "the fragment's registers are contiguous");
    return *reinterpret_cast<float(*)[N / 2]>(&t.data[0][0][0]);
}

// D (+)= A B for one 16-deep k step into a warp's accumulator tile (see above).
template <bool B_KMAJOR, int N, class SA, class SB>
CALICO_DEVICE void mma_k16(acc_tile<N>& acc, uint32_t a, int a_row0, uint32_t b, int b_mn0, int k0) {
    mma_k16<B_KMAJOR, N, SA, SB>(regs(acc), a, a_row0, b, b_mn0, k0);
}

}  // namespace wgmma
}  // namespace calico
