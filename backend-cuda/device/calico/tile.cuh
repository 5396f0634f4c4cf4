// Register tiles, register vectors, shared tiles and global layouts for CUDA.
//
// REGISTER TILES  rt<T, R, C, L>: an R x C tile (multiples of 16) held by one warp as a grid of
// 16x16 base tiles. With g = lane / 4 and t = lane % 4, each base tile is four registers of
// two elements (`packed<T>`, a pair of bf16/f16 or a float2; `pack<T>(a, b)` makes one, and
// `pack_word<T>(a, b)` the same 16-bit pair as the 32-bit word a register-operand wgmma reads):
//   row layout (row_l): reg 0 = (g, 2t..2t+1), reg 1 = (g+8, 2t..), reg 2 = (g, 2t+8..),
//                       reg 3 = (g+8, 2t+8..)            -- pairs run along a row
//   col layout (col_l): the transpose: reg 0 = (2t..2t+1, g), reg 1 = (2t.., g+8),
//                       reg 2 = (2t+8.., g), reg 3 = (2t+8.., g+8)  -- pairs run down a column
// row_l is mma.sync m16n8k16's A and C/D fragment and wgmma's A-register fragment and (for
// float) its accumulator; col_l is mma.sync's B fragment (K x N with pairs along K). The Rust
// lane maps in calico_core::lanes mirror these.
//
// REGISTER VECTORS  rv<T, N, Kind>: per_row vectors hold one value per tile row (for row_max,
// broadcasts across columns): for each 16-row block, the values of rows g and g+8 (2 per
// block). per_col vectors hold one value per tile column: for each 16-column block, columns
// 2t, 2t+1, 2t+8, 2t+9 (4 per block).
//
// SHARED TILES  st<T, R, C>: R x C in shared memory, laid out the way TMA writes boxes of
// {swizzle width, R} with the matching swizzle: columns are cut into chunks of W bytes
// (W = 128, 64 or 32: the largest that divides a row), each chunk is R rows of W bytes, chunks
// follow one another, and inside each 8-row x W block the 16-byte unit u of row r sits at
// u ^ ((r * W / 128) % (W/16)) -- TMA's 32/64/128B swizzle (address bits 4.. XOR bits 7..;
// for W = 128 that is u ^ (r % 8), for 64 u ^ ((r / 2) % 4), for 32 u ^ ((r / 4) % 2)). 8 consecutive
// rows of one 16-byte column then fall in 8 different bank groups, so ldmatrix-style accesses
// are conflict-free. The tile base must be aligned to 8 * W bytes (1024 for 128B).
//
// GLOBAL LAYOUTS  gl<T>: a pointer with row and batch strides in elements (column stride 1).
//
// The type names, tags, gl and coord are declared once for both vendors in calico/tile_types.h.
#pragma once
#include "calico/ptx.cuh"
#include "calico/tile_types.h"

namespace calico {

template <class T>
struct packed;
template <>
struct packed<bf16> {
    typedef __nv_bfloat162 type;
};
template <>
struct packed<f16> {
    typedef __half2 type;
};
template <>
struct packed<float> {
    typedef float2 type;
};

template <class T>
CALICO_DEVICE typename packed<T>::type pack(float a, float b);
template <>
CALICO_DEVICE __nv_bfloat162 pack<bf16>(float a, float b) {
    return __floats2bfloat162_rn(a, b);
}
template <>
CALICO_DEVICE __half2 pack<f16>(float a, float b) {
    return __floats2half2_rn(a, b);
}
template <>
CALICO_DEVICE float2 pack<float>(float a, float b) {
    return make_float2(a, b);
}
// Two values rounded to the 16-bit T as one 32-bit register, the first in the low half: the
// word a register-operand wgmma's A fragment holds.
template <class T>
CALICO_DEVICE uint32_t pack_word(float a, float b) {
    static_assert(sizeof(typename packed<T>::type) == 4, "pairs of 16-bit elements");
    typename packed<T>::type v = pack<T>(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
}
// One row of an MMA accumulator (a base tile's or a wgmma's), packed to 16-bit pairs: thread t
// of a quad holds word j = columns 8j + 2t, 8j + 2t + 1. Two exchanges inside the quad give
// thread t the whole 8-column chunks 4c + t (c < N / 4), 16 bytes each, for 16-byte stores:
// the first pairs neighbours (t ^ 1) into 4-column halves of chunks 2k + (t & 1), the second
// (t ^ 2) joins the halves.
template <int N>
CALICO_DEVICE void quad_to_chunks(const uint32_t (&words)[N], int t, uint32_t (&chunks)[N / 4][4]) {
    static_assert(N % 4 == 0, "whole groups of four chunks");
    const bool odd = (t & 1) != 0;
    uint32_t halves[N / 2][2];  // chunk 2k + (t & 1), columns 4 * (t >> 1) .. + 3
#pragma unroll
    for (int k = 0; k < N / 2; ++k) {
        const uint32_t got = __shfl_xor_sync(0xffffffffu, odd ? words[2 * k] : words[2 * k + 1], 1);
        halves[k][0] = odd ? got : words[2 * k];
        halves[k][1] = odd ? words[2 * k + 1] : got;
    }
    const bool upper = (t & 2) != 0;
#pragma unroll
    for (int c = 0; c < N / 4; ++c) {
        const uint32_t got0 = __shfl_xor_sync(0xffffffffu, upper ? halves[2 * c][0] : halves[2 * c + 1][0], 2);
        const uint32_t got1 = __shfl_xor_sync(0xffffffffu, upper ? halves[2 * c][1] : halves[2 * c + 1][1], 2);
        chunks[c][0] = upper ? got0 : halves[2 * c][0];
        chunks[c][1] = upper ? got1 : halves[2 * c][1];
        chunks[c][2] = upper ? halves[2 * c + 1][0] : got0;
        chunks[c][3] = upper ? halves[2 * c + 1][1] : got1;
    }
}

// One 16-byte global store of a chunk (dst 16-byte aligned). Written out because NVVM split
// the equivalent uint4 store into four 4-byte ones in the backward's finish kernel.
CALICO_DEVICE void store_chunk(void* dst, const uint32_t (&w)[4]) {
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]) : "memory");
}

// How store_row may write a row: what the destination's base and strides allow.
constexpr int ROW_STORE_ELEMENTS = 0;  // element by element
constexpr int ROW_STORE_PAIRS = 1;     // 4-byte pairs: base and strides even
constexpr int ROW_STORE_CHUNKS = 2;    // 16-byte chunks: base 16-byte aligned, strides multiples of 8

// Stores one row of an MMA accumulator, rounded to the 16-bit T, at `row`: thread t of a quad
// holds v[j] = columns 8j + 2t, 8j + 2t + 1 (j < N). ROW_STORE_CHUNKS first gathers whole
// 8-column chunks in each thread (quad_to_chunks: shuffles), so every lane of the warp must
// call it; `keep` false only skips this thread's stores (rows past a tensor's end). With
// LIMIT, only the columns below `cols` (a multiple of 8) are written: a row narrower than the
// tile (a head dim padded up to the kernel's, store_row_upto).
template <bool LIMIT, class T, int N>
CALICO_DEVICE void store_row_cols(T* row, const float2 (&v)[N], int t, int mode, bool keep, int cols) {
    if (mode == ROW_STORE_CHUNKS) {
        uint32_t words[N];
#pragma unroll
        for (int j = 0; j < N; ++j) words[j] = pack_word<T>(v[j].x, v[j].y);
        uint32_t chunks[N / 4][4];
        quad_to_chunks(words, t, chunks);
        if (keep) {
#pragma unroll
            for (int c = 0; c < N / 4; ++c) {
                if (!LIMIT || 8 * (4 * c + t) < cols) store_chunk(row + 8 * (4 * c + t), chunks[c]);
            }
        }
    } else if (keep) {
#pragma unroll
        for (int j = 0; j < N; ++j) {
            if (LIMIT && 8 * j + 2 * t >= cols) continue;
            T* at = row + 8 * j + 2 * t;
            if (mode == ROW_STORE_PAIRS) {
                *reinterpret_cast<uint32_t*>(at) = pack_word<T>(v[j].x, v[j].y);
            } else {
                at[0] = from_float<T>(v[j].x);
                at[1] = from_float<T>(v[j].y);
            }
        }
    }
}

// The whole row: all 8N columns.
template <class T, int N>
CALICO_DEVICE void store_row(T* row, const float2 (&v)[N], int t, int mode, bool keep) {
    store_row_cols<false>(row, v, t, mode, keep, 8 * N);
}

// The row's first `cols` columns (a multiple of 8, at most 8N; columns past it untouched).
template <class T, int N>
CALICO_DEVICE void store_row_upto(T* row, const float2 (&v)[N], int t, int mode, bool keep, int cols) {
    store_row_cols<true>(row, v, t, mode, keep, cols);
}

CALICO_DEVICE float2 unpack(__nv_bfloat162 v) { return __bfloat1622float2(v); }
CALICO_DEVICE float2 unpack(__half2 v) { return __half22float2(v); }
CALICO_DEVICE float2 unpack(float2 v) { return v; }

// The (row, col) of the first element of register `reg` of a base tile, for lane `lane`.
template <class L>
CALICO_DEVICE void base_coord(int lane, int reg, int& row, int& col) {
    const int g = lane / 4, t = lane % 4;
    const int r = g + 8 * (reg & 1), c = 2 * t + 8 * (reg >> 1);
    if constexpr (same_type<L, col_l>::value) {
        row = c;
        col = r;
    } else {
        row = r;
        col = c;
    }
}

// Both elements of register `reg` for lane `lane` of a base tile whose top-left corner is
// (row0, col0): (r0, c0) and (r1, c1). Pairs run along the row (row_l) or down the column
// (col_l).
template <class L>
CALICO_DEVICE void pair_coords(int lane, int reg, int row0, int col0, int& r0, int& c0, int& r1, int& c1) {
    base_coord<L>(lane, reg, r0, c0);
    r0 += row0;
    c0 += col0;
    r1 = same_type<L, col_l>::value ? r0 + 1 : r0;
    c1 = same_type<L, col_l>::value ? c0 : c0 + 1;
}

template <class T, int R, int C, class L>
struct rt {
    static_assert(R % 16 == 0 && C % 16 == 0, "register tiles are made of 16x16 base tiles");
    typedef T dtype;
    typedef L layout;
    typedef typename packed<T>::type pair;
    static constexpr int rows = R, cols = C, height = R / 16, width = C / 16;
    pair data[R / 16][C / 16][4];
};

template <int N, class Kind>
struct rv {
    static_assert(N % 16 == 0, "register vectors cover whole 16-element blocks");
    static constexpr int blocks = N / 16;
    static constexpr int per_block = same_type<Kind, per_row>::value ? 2 : 4;
    float data[N / 16][per_block];
};

// Shared tile with a TMA-compatible swizzle (see the top of this file).
template <class T, int R, int C>
struct st {
    typedef T dtype;
    static constexpr int rows = R, cols = C;
    static constexpr int row_bytes = C * (int)sizeof(T);
    static constexpr int swizzle_bytes = row_bytes % 128 == 0 ? 128 : row_bytes % 64 == 0 ? 64 : 32;
    static_assert(row_bytes % 32 == 0, "shared tile rows must be a multiple of 32 bytes");
    static_assert(R % 8 == 0, "shared tiles hold whole 8-row swizzle blocks");
    static constexpr int chunk_cols = swizzle_bytes / (int)sizeof(T);
    static constexpr int chunk_bytes = R * swizzle_bytes;
    static constexpr int bytes = R * row_bytes;
    static constexpr int alignment = 8 * swizzle_bytes;
    alignas(1024) unsigned char raw[bytes];

    // Byte offset of element (r, c) from the tile base.
    // The swizzle XORs address bits 4.. with bits 7..; chunks are whole 8-row blocks and a
    // byte within a row never carries into bit 7 of r * W, so the XOR term depends on the row
    // alone and only touches the byte within the row (kept apart so the compiler sees that).
    static CALICO_DEVICE uint32_t offset(int r, int c) {
        const int chunk = c / chunk_cols;
        const uint32_t in_row = (c % chunk_cols) * (int)sizeof(T);
        constexpr uint32_t mask = swizzle_bytes / 16 - 1;
        const uint32_t phase = ((uint32_t)(r * swizzle_bytes) >> 7) & mask;
        return chunk * chunk_bytes + r * swizzle_bytes + (in_row ^ (phase << 4));
    }
    CALICO_DEVICE T* ptr(int r, int c) { return reinterpret_cast<T*>(raw + offset(r, c)); }
    CALICO_DEVICE const T* ptr(int r, int c) const { return reinterpret_cast<const T*>(raw + offset(r, c)); }
    CALICO_DEVICE uint32_t addr(int r, int c) const { return smem_addr(raw) + offset(r, c); }
};

}  // namespace calico
