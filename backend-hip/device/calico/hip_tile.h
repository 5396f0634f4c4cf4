// The tile vocabulary (calico/tiles.h) on CDNA: register tiles over MFMA 16x16x16, register
// vectors, LDS tiles with a bank-conflict-free swizzle, and the operations, for wave64.
//
// BASE TILE  16 x 16, four values per lane (64 lanes x 4 = 256), with q = lane / 16:
//   row_l: lane holds row lane % 16, columns 4q .. 4q+3   -- MFMA's A fragment
//   col_l: lane holds column lane % 16, rows 4q .. 4q+3   -- MFMA's B fragment
// A row_l tile's values run along a row for every element type, accumulators included: mma_AB
// computes D^T = B^T A^T on the matrix core (B's col_l registers go in as the instruction's A,
// A's row_l registers as its B), and the instruction's D layout for D^T is row_l for D. So a
// float accumulator converts to a bf16 A operand in place (copy), as on NVIDIA.
// calico_core::lanes (Mfma16x16x16) mirrors the instruction layouts this rests on.
//
// REGISTER VECTORS  rv<N, per_row>: one value per lane per 16-row block (row lane % 16);
// rv<N, per_col>: four per lane per 16-column block (columns 4q .. 4q+3).
//
// SHARED TILES  st<T, R, C>: row-major in LDS; inside each 128-byte segment (the 32 banks) the
// 8-byte units are XORed with the row's segment index (see lds_swizzle below), so the 16 lanes
// of a ds_read_b64 phase reading one 8-byte column unit of 16 consecutive rows (a row_l base
// tile) hit 16 different bank pairs. calico_core::lds mirrors and tests the swizzle.
#pragma once
#include "calico/calico.h"
#include "calico/tile_types.h"
#include "calico/mfma.h"

namespace calico {

// The four values of one base tile a lane holds, as the matrix core takes them.
template <class T>
struct base_regs;
template <>
struct base_regs<bf16> {
    typedef hip::bf16x4_t type;
};
template <>
struct base_regs<f16> {
    typedef hip::f16x4_t type;
};
template <>
struct base_regs<float> {
    typedef hip::f32x4_t type;
};

// Element e of a base tile's registers as float, and back (round to nearest even).
CALICO_DEVICE float elem_get(const hip::bf16x4_t& v, int e) {
    return to_float(bf16{static_cast<unsigned short>(v[e])});
}
CALICO_DEVICE float elem_get(const hip::f16x4_t& v, int e) { return static_cast<float>(v[e]); }
CALICO_DEVICE float elem_get(const hip::f32x4_t& v, int e) { return v[e]; }
CALICO_DEVICE void elem_set(hip::bf16x4_t& v, int e, float x) { v[e] = static_cast<short>(from_float<bf16>(x).bits); }
CALICO_DEVICE void elem_set(hip::f16x4_t& v, int e, float x) { v[e] = static_cast<_Float16>(x); }
CALICO_DEVICE void elem_set(hip::f32x4_t& v, int e, float x) { v[e] = x; }

// (row, col) of element e of lane `lane`'s base-tile registers.
template <class L>
CALICO_DEVICE void base_coord(int lane, int e, int& row, int& col) {
    const int a = lane % 16, b = 4 * (lane / 16) + e;
    if constexpr (same_type<L, col_l>::value) {
        row = b;
        col = a;
    } else {
        row = a;
        col = b;
    }
}

template <class T, int R, int C, class L>
struct rt {
    static_assert(R % 16 == 0 && C % 16 == 0, "register tiles are made of 16x16 base tiles");
    typedef T dtype;
    typedef L layout;
    typedef typename base_regs<T>::type regs;
    static constexpr int rows = R, cols = C, height = R / 16, width = C / 16;
    regs data[R / 16][C / 16];
};

template <int N, class Kind>
struct rv {
    static_assert(N % 16 == 0, "register vectors cover whole 16-element blocks");
    static constexpr int blocks = N / 16;
    static constexpr int per_block = same_type<Kind, per_row>::value ? 1 : 4;
    float data[N / 16][per_block];
};

// Byte offset of logical byte `byte_in_row` of row `r` in an LDS tile with `row_bytes`-byte rows,
// for readers that take `unit` (8 or 16) contiguous bytes per lane. 128/unit lanes form one
// LDS phase; they read one unit column of consecutive rows, which the XOR spreads over all 32
// banks. Rows shorter than 128 bytes share a segment, and the XOR stays inside each row.
template <int row_bytes, int unit>
CALICO_DEVICE unsigned lds_swizzle(int r, int byte_in_row) {
    static_assert(unit == 8 || unit == 16, "swizzle units are 8 or 16 bytes");
    static_assert(row_bytes == 32 || row_bytes == 64 || row_bytes % 128 == 0, "LDS tile rows of 32, 64 or k*128 bytes");
    constexpr int rows_per_segment = row_bytes >= 128 ? 1 : 128 / row_bytes;
    constexpr int keys = (128 / unit) / rows_per_segment;
    const unsigned linear = static_cast<unsigned>(r * row_bytes + byte_in_row);
    const unsigned key = static_cast<unsigned>((r / rows_per_segment) % keys);
    return linear ^ (key * unit);
}

template <class T, int R, int C>
struct st {
    typedef T dtype;
    static constexpr int rows = R, cols = C;
    static constexpr int row_bytes = C * (int)sizeof(T);
    static constexpr int bytes = R * row_bytes;
    static_assert(R % 16 == 0 && C % 16 == 0, "shared tiles hold whole 16x16 base tiles");
    alignas(16) unsigned char raw[bytes];

    static CALICO_DEVICE unsigned offset(int r, int c) { return lds_swizzle<row_bytes, 8>(r, c * (int)sizeof(T)); }
    CALICO_DEVICE T* ptr(int r, int c) { return reinterpret_cast<T*>(raw + offset(r, c)); }
    CALICO_DEVICE const T* ptr(int r, int c) const { return reinterpret_cast<const T*>(raw + offset(r, c)); }
};

// ---- elementwise maps

template <class T, int R, int C, class L, class F>
CALICO_DEVICE void map(rt<T, R, C, L>& dst, const rt<T, R, C, L>& src, F f) {
#pragma unroll
    for (int i = 0; i < R / 16; ++i)
#pragma unroll
        for (int j = 0; j < C / 16; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) elem_set(dst.data[i][j], e, f(elem_get(src.data[i][j], e)));
}

template <class T, int R, int C, class L, class F>
CALICO_DEVICE void map2(rt<T, R, C, L>& dst, const rt<T, R, C, L>& a, const rt<T, R, C, L>& b, F f) {
#pragma unroll
    for (int i = 0; i < R / 16; ++i)
#pragma unroll
        for (int j = 0; j < C / 16; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                elem_set(dst.data[i][j], e, f(elem_get(a.data[i][j], e), elem_get(b.data[i][j], e)));
}

template <class T, int R, int C, class L>
CALICO_DEVICE void fill(rt<T, R, C, L>& dst, float v) {
    map(dst, dst, [v](float) { return v; });
}
template <class T, int R, int C, class L>
CALICO_DEVICE void zero(rt<T, R, C, L>& dst) {
    fill(dst, 0.0f);
}
template <class T, int R, int C, class L>
CALICO_DEVICE void exp2(rt<T, R, C, L>& dst, const rt<T, R, C, L>& src) {
    map(dst, src, [](float x) { return exp2_approx(x); });
}
template <class T, int R, int C, class L>
CALICO_DEVICE void mul(rt<T, R, C, L>& dst, const rt<T, R, C, L>& src, float s) {
    map(dst, src, [s](float x) { return x * s; });
}
template <class T, int R, int C, class L>
CALICO_DEVICE void add(rt<T, R, C, L>& dst, const rt<T, R, C, L>& a, const rt<T, R, C, L>& b) {
    map2(dst, a, b, [](float x, float y) { return x + y; });
}
template <class T, int R, int C, class L>
CALICO_DEVICE void mul(rt<T, R, C, L>& dst, const rt<T, R, C, L>& a, const rt<T, R, C, L>& b) {
    map2(dst, a, b, [](float x, float y) { return x * y; });
}

// Elementwise with the element's place: f(row, col, x), row and col counted from the tile's
// top-left corner (any layout), e.g. for masks.
template <class T, int R, int C, class L, class F>
CALICO_DEVICE void map_rc(rt<T, R, C, L>& dst, const rt<T, R, C, L>& src, F f) {
    const int lane = static_cast<int>(hw_lane());
#pragma unroll
    for (int i = 0; i < R / 16; ++i)
#pragma unroll
        for (int j = 0; j < C / 16; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int r, c;
                base_coord<L>(lane, e, r, c);
                elem_set(dst.data[i][j], e, f(16 * i + r, 16 * j + c, elem_get(src.data[i][j], e)));
            }
}

// Register vectors, elementwise (every lane applies f to the entries it holds).
template <int N, class K, class F>
CALICO_DEVICE void map(rv<N, K>& dst, const rv<N, K>& src, F f) {
#pragma unroll
    for (int i = 0; i < N / 16; ++i)
#pragma unroll
        for (int e = 0; e < rv<N, K>::per_block; ++e) dst.data[i][e] = f(src.data[i][e]);
}
template <int N, class K, class F>
CALICO_DEVICE void map2(rv<N, K>& dst, const rv<N, K>& a, const rv<N, K>& b, F f) {
#pragma unroll
    for (int i = 0; i < N / 16; ++i)
#pragma unroll
        for (int e = 0; e < rv<N, K>::per_block; ++e) dst.data[i][e] = f(a.data[i][e], b.data[i][e]);
}
template <int N, class K>
CALICO_DEVICE void fill(rv<N, K>& dst, float v) {
    map(dst, dst, [v](float) { return v; });
}

// Conversion between element types (same layout), rounding to nearest even.
template <class D, class S, int R, int C, class L>
CALICO_DEVICE void copy(rt<D, R, C, L>& dst, const rt<S, R, C, L>& src) {
#pragma unroll
    for (int i = 0; i < R / 16; ++i)
#pragma unroll
        for (int j = 0; j < C / 16; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) elem_set(dst.data[i][j], e, elem_get(src.data[i][j], e));
}

// dst = src^T: a col_l R x C tile holds, register for register, what a row_l C x R tile of its
// transpose holds (base_coord), so this moves no data between lanes.
template <class T, int R, int C>
CALICO_DEVICE void transpose(rt<T, C, R, row_l>& dst, const rt<T, R, C, col_l>& src) {
#pragma unroll
    for (int i = 0; i < R / 16; ++i)
#pragma unroll
        for (int j = 0; j < C / 16; ++j) dst.data[j][i] = src.data[i][j];
}

// ---- row / column reductions of row_l tiles (every lane gets the result for its rows/cols)

template <class Op, class T, int R, int C>
CALICO_DEVICE void row_reduce(rv<R, per_row>& dst, const rt<T, R, C, row_l>& src) {
#pragma unroll
    for (int i = 0; i < R / 16; ++i) {
        float acc = elem_get(src.data[i][0], 0);
#pragma unroll
        for (int j = 0; j < C / 16; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (j != 0 || e != 0) acc = Op::apply(acc, elem_get(src.data[i][j], e));
        // Lanes l, l+16, l+32, l+48 hold the four column groups of row l % 16.
        acc = Op::apply(acc, shfl_xor(acc, 16));
        acc = Op::apply(acc, shfl_xor(acc, 32));
        dst.data[i][0] = acc;
    }
}
template <class T, int R, int C>
CALICO_DEVICE void row_max(rv<R, per_row>& dst, const rt<T, R, C, row_l>& src) {
    row_reduce<op_max>(dst, src);
}
template <class T, int R, int C>
CALICO_DEVICE void row_sum(rv<R, per_row>& dst, const rt<T, R, C, row_l>& src) {
    row_reduce<op_sum>(dst, src);
}

template <class Op, class T, int R, int C>
CALICO_DEVICE void col_reduce(rv<C, per_col>& dst, const rt<T, R, C, row_l>& src) {
#pragma unroll
    for (int j = 0; j < C / 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float acc = elem_get(src.data[0][j], e);
#pragma unroll
            for (int i = 1; i < R / 16; ++i) acc = Op::apply(acc, elem_get(src.data[i][j], e));
            // The 16 lanes of a quarter-wave (rows 0..15) share the columns.
#pragma unroll
            for (int m = 1; m < 16; m <<= 1) acc = Op::apply(acc, shfl_xor(acc, m));
            dst.data[j][e] = acc;
        }
}
template <class T, int R, int C>
CALICO_DEVICE void col_sum(rv<C, per_col>& dst, const rt<T, R, C, row_l>& src) {
    col_reduce<op_sum>(dst, src);
}
template <class T, int R, int C>
CALICO_DEVICE void col_max(rv<C, per_col>& dst, const rt<T, R, C, row_l>& src) {
    col_reduce<op_max>(dst, src);
}

// ---- broadcasts

template <class T, int R, int C, class F>
CALICO_DEVICE void row_map(rt<T, R, C, row_l>& dst, const rt<T, R, C, row_l>& src, const rv<R, per_row>& v, F f) {
#pragma unroll
    for (int i = 0; i < R / 16; ++i)
#pragma unroll
        for (int j = 0; j < C / 16; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) elem_set(dst.data[i][j], e, f(elem_get(src.data[i][j], e), v.data[i][0]));
}
template <class T, int R, int C>
CALICO_DEVICE void sub_row(rt<T, R, C, row_l>& dst, const rt<T, R, C, row_l>& src, const rv<R, per_row>& v) {
    row_map(dst, src, v, [](float x, float r) { return x - r; });
}
template <class T, int R, int C>
CALICO_DEVICE void mul_row(rt<T, R, C, row_l>& dst, const rt<T, R, C, row_l>& src, const rv<R, per_row>& v) {
    row_map(dst, src, v, [](float x, float r) { return x * r; });
}
template <class T, int R, int C>
CALICO_DEVICE void div_row(rt<T, R, C, row_l>& dst, const rt<T, R, C, row_l>& src, const rv<R, per_row>& v) {
    row_map(dst, src, v, [](float x, float r) { return x / r; });
}

template <class T, int R, int C, class F>
CALICO_DEVICE void col_map(rt<T, R, C, row_l>& dst, const rt<T, R, C, row_l>& src, const rv<C, per_col>& v, F f) {
#pragma unroll
    for (int i = 0; i < R / 16; ++i)
#pragma unroll
        for (int j = 0; j < C / 16; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) elem_set(dst.data[i][j], e, f(elem_get(src.data[i][j], e), v.data[j][e]));
}
template <class T, int R, int C>
CALICO_DEVICE void add_col(rt<T, R, C, row_l>& dst, const rt<T, R, C, row_l>& src, const rv<C, per_col>& v) {
    col_map(dst, src, v, [](float x, float c) { return x + c; });
}
template <class T, int R, int C>
CALICO_DEVICE void mul_col(rt<T, R, C, row_l>& dst, const rt<T, R, C, row_l>& src, const rv<C, per_col>& v) {
    col_map(dst, src, v, [](float x, float c) { return x * c; });
}

// ---- moves

// Registers <- global (tile `tc` of `src`), any layout; elements outside the matrix read 0.
template <class T, int R, int C, class L, class G>
CALICO_DEVICE void load(rt<T, R, C, L>& dst, const gl<G>& src, coord tc) {
    const int lane = static_cast<int>(hw_lane());
#pragma unroll
    for (int i = 0; i < R / 16; ++i)
#pragma unroll
        for (int j = 0; j < C / 16; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int r, c;
                base_coord<L>(lane, e, r, c);
                r += tc.row * R + 16 * i;
                c += tc.col * C + 16 * j;
                const bool ok = r < src.rows && c < src.cols;
                elem_set(dst.data[i][j], e, ok ? to_float(*src.at(tc.batch, r, c)) : 0.0f);
            }
}

// Global <- registers (tile `tc` of `dst`); elements outside the matrix are not written.
template <class G, class T, int R, int C, class L>
CALICO_DEVICE void store(const gl<G>& dst, const rt<T, R, C, L>& src, coord tc) {
    const int lane = static_cast<int>(hw_lane());
#pragma unroll
    for (int i = 0; i < R / 16; ++i)
#pragma unroll
        for (int j = 0; j < C / 16; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int r, c;
                base_coord<L>(lane, e, r, c);
                r += tc.row * R + 16 * i;
                c += tc.col * C + 16 * j;
                if (r < dst.rows && c < dst.cols) *dst.at(tc.batch, r, c) = from_float<G>(elem_get(src.data[i][j], e));
            }
}

// Registers <- LDS, 16-bit tiles. row_l: each lane reads its four consecutive columns as one
// ds_read_b64 (conflict-free under st's swizzle); col_l reads the four rows one by one.
template <class T, int R, int C, class L, int SR, int SC>
CALICO_DEVICE void load(rt<T, R, C, L>& dst, const st<T, SR, SC>& src, int row0 = 0, int col0 = 0) {
    static_assert(sizeof(T) == 2, "shared tiles move 16-bit elements");
    const int lane = static_cast<int>(hw_lane());
#pragma unroll
    for (int i = 0; i < R / 16; ++i)
#pragma unroll
        for (int j = 0; j < C / 16; ++j) {
            if constexpr (same_type<L, row_l>::value) {
                int r, c;
                base_coord<row_l>(lane, 0, r, c);
                dst.data[i][j] = *reinterpret_cast<const typename base_regs<T>::type*>(src.ptr(row0 + 16 * i + r, col0 + 16 * j + c));
            } else {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    int r, c;
                    base_coord<col_l>(lane, e, r, c);
                    elem_set(dst.data[i][j], e, to_float(*src.ptr(row0 + 16 * i + r, col0 + 16 * j + c)));
                }
            }
        }
}

// LDS <- registers (row_l, any element type, converted to T): one ds_write_b64 per base tile.
template <class T, int SR, int SC, class S, int R, int C>
CALICO_DEVICE void store(st<T, SR, SC>& dst, const rt<S, R, C, row_l>& src, int row0 = 0, int col0 = 0) {
    static_assert(sizeof(T) == 2, "shared tiles move 16-bit elements");
    const int lane = static_cast<int>(hw_lane());
#pragma unroll
    for (int i = 0; i < R / 16; ++i)
#pragma unroll
        for (int j = 0; j < C / 16; ++j) {
            typename base_regs<T>::type v;
#pragma unroll
            for (int e = 0; e < 4; ++e) elem_set(v, e, elem_get(src.data[i][j], e));
            int r, c;
            base_coord<row_l>(lane, 0, r, c);
            *reinterpret_cast<typename base_regs<T>::type*>(dst.ptr(row0 + 16 * i + r, col0 + 16 * j + c)) = v;
        }
}

namespace detail {
typedef unsigned u32x4 __attribute__((ext_vector_type(4)));
// LDS tile <- 16 bytes: 8 elements of row r from column c (a multiple of 8) on, in one
// ds_write_b128. st's swizzle XORs 8-byte units with a row key: the chunk's two halves stay in
// one aligned 16-byte unit, swapped when the key is odd (bit 3 of the first half's offset).
template <class T, int R, int C>
CALICO_DEVICE void st_store16(st<T, R, C>& dst, int r, int c, unsigned w0, unsigned w1, unsigned w2, unsigned w3) {
    const unsigned o = st<T, R, C>::offset(r, c);
    const u32x4 v = (o & 8u) ? u32x4{w2, w3, w0, w1} : u32x4{w0, w1, w2, w3};
    *reinterpret_cast<u32x4*>(dst.raw + (o & ~15u)) = v;
}
}  // namespace detail

// ---- matrix multiply on the matrix cores (16x16x16 per base-tile triple)
namespace detail {
template <bool TRANSPOSED, class TILE>
CALICO_DEVICE const auto& block(const TILE& t, int r, int c) {
    if constexpr (TRANSPOSED)
        return t.data[c][r];
    else
        return t.data[r][c];
}

// The transposed forms move no data: a col_l K x M tile holds, register for register, what a
// row_l M x K tile of its transpose holds.
template <bool A_T, bool B_T, class T, int M, int N, int K, class AT, class BT>
CALICO_DEVICE void mma_tiles(rt<float, M, N, row_l>& d, const AT& a, const BT& b, const rt<float, M, N, row_l>& c) {
#pragma unroll
    for (int i = 0; i < M / 16; ++i)
#pragma unroll
        for (int j = 0; j < N / 16; ++j) {
            hip::f32x4_t acc = c.data[i][j];
#pragma unroll
            for (int kk = 0; kk < K / 16; ++kk)
                // D^T = B^T A^T: B's fragment is the instruction's A operand (see the top).
                acc = hip::mfma_16x16x16<T>(block<B_T>(b, kk, j), block<A_T>(a, i, kk), acc);
            d.data[i][j] = acc;
        }
}
}  // namespace detail

template <class T, int M, int N, int K>
CALICO_DEVICE void mma_AB(rt<float, M, N, row_l>& d, const rt<T, M, K, row_l>& a, const rt<T, K, N, col_l>& b,
                          const rt<float, M, N, row_l>& c) {
    detail::mma_tiles<false, false, T, M, N, K>(d, a, b, c);
}
template <class T, int M, int N, int K>
CALICO_DEVICE void mma_ABt(rt<float, M, N, row_l>& d, const rt<T, M, K, row_l>& a, const rt<T, N, K, row_l>& b,
                           const rt<float, M, N, row_l>& c) {
    detail::mma_tiles<false, true, T, M, N, K>(d, a, b, c);
}
template <class T, int M, int N, int K>
CALICO_DEVICE void mma_AtB(rt<float, M, N, row_l>& d, const rt<T, K, M, col_l>& a, const rt<T, K, N, col_l>& b,
                           const rt<float, M, N, row_l>& c) {
    detail::mma_tiles<true, false, T, M, N, K>(d, a, b, c);
}
template <class T, int M, int N, int K>
CALICO_DEVICE void mma_AtBt(rt<float, M, N, row_l>& d, const rt<T, K, M, col_l>& a, const rt<T, N, K, row_l>& b,
                            const rt<float, M, N, row_l>& c) {
    detail::mma_tiles<true, true, T, M, N, K>(d, a, b, c);
}

}  // namespace calico
