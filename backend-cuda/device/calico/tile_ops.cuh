// Free functions on tiles, destination first: maps, reductions, broadcasts, conversions and
// moves between global memory, shared memory and registers. All register-tile functions are
// called by a whole warp; `lane` below is the lane within the warp.
#pragma once
#include "calico/calico.h"
#include "calico/tile.cuh"
#include "calico/mma_sync.cuh"
#include "calico/cp_async.cuh"
#include "calico/tma.cuh"

namespace calico {

// ---- elementwise maps (any layout: they touch every element the same way)

template <class T, int R, int C, class L, class F>
CALICO_DEVICE void map(rt<T, R, C, L>& dst, const rt<T, R, C, L>& src, F f) {
#pragma unroll
    for (int i = 0; i < R / 16; ++i)
#pragma unroll
        for (int j = 0; j < C / 16; ++j)
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const float2 v = unpack(src.data[i][j][k]);
                dst.data[i][j][k] = pack<T>(f(v.x), f(v.y));
            }
}

template <class T, int R, int C, class L, class F>
CALICO_DEVICE void map2(rt<T, R, C, L>& dst, const rt<T, R, C, L>& a, const rt<T, R, C, L>& b, F f) {
#pragma unroll
    for (int i = 0; i < R / 16; ++i)
#pragma unroll
        for (int j = 0; j < C / 16; ++j)
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const float2 x = unpack(a.data[i][j][k]), y = unpack(b.data[i][j][k]);
                dst.data[i][j][k] = pack<T>(f(x.x, y.x), f(x.y, y.y));
            }
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
    const int lane = thread_x() % 32;
#pragma unroll
    for (int i = 0; i < R / 16; ++i)
#pragma unroll
        for (int j = 0; j < C / 16; ++j)
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                int r0, c0, r1, c1;
                pair_coords<L>(lane, k, 16 * i, 16 * j, r0, c0, r1, c1);
                const float2 v = unpack(src.data[i][j][k]);
                dst.data[i][j][k] = pack<T>(f(r0, c0, v.x), f(r1, c1, v.y));
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
            for (int k = 0; k < 4; ++k) {
                const float2 v = unpack(src.data[i][j][k]);
                dst.data[i][j][k] = pack<D>(v.x, v.y);
            }
}

// dst = src^T: a col_l R x C tile holds, register for register, what a row_l C x R tile of its
// transpose holds (base_coord), so this moves no data between lanes.
template <class T, int R, int C>
CALICO_DEVICE void transpose(rt<T, C, R, row_l>& dst, const rt<T, R, C, col_l>& src) {
#pragma unroll
    for (int i = 0; i < R / 16; ++i)
#pragma unroll
        for (int j = 0; j < C / 16; ++j)
#pragma unroll
            for (int k = 0; k < 4; ++k) dst.data[j][i][k] = src.data[i][j][k];
}

// ---- row / column reductions of row_l tiles (every lane gets the result for its rows/cols)

template <class Op, class T, int R, int C>
CALICO_DEVICE void row_reduce(rv<R, per_row>& dst, const rt<T, R, C, row_l>& src) {
#pragma unroll
    for (int i = 0; i < R / 16; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // h = 0: row g (regs 0, 2); h = 1: row g + 8 (regs 1, 3)
            float acc = unpack(src.data[i][0][h]).x;
#pragma unroll
            for (int j = 0; j < C / 16; ++j)
#pragma unroll
                for (int kk = 0; kk < 2; ++kk) {
                    const float2 v = unpack(src.data[i][j][h + 2 * kk]);
                    if (j != 0 || kk != 0) acc = Op::apply(acc, v.x);
                    acc = Op::apply(acc, v.y);
                }
            // The four lanes of a quad (t = 0..3) share a row.
            acc = Op::apply(acc, shfl_xor(acc, 1));
            acc = Op::apply(acc, shfl_xor(acc, 2));
            dst.data[i][h] = acc;
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
        for (int half = 0; half < 2; ++half) {  // columns 2t.. (regs 0, 1) and 2t+8.. (regs 2, 3)
            float a = unpack(src.data[0][j][2 * half]).x, b = unpack(src.data[0][j][2 * half]).y;
            {
                const float2 v = unpack(src.data[0][j][2 * half + 1]);
                a = Op::apply(a, v.x);
                b = Op::apply(b, v.y);
            }
#pragma unroll
            for (int i = 1; i < R / 16; ++i)
#pragma unroll
                for (int k = 0; k < 2; ++k) {
                    const float2 v = unpack(src.data[i][j][2 * half + k]);
                    a = Op::apply(a, v.x);
                    b = Op::apply(b, v.y);
                }
            // The eight groups g = 0..7 (lane bits 2..4) share a column.
#pragma unroll
            for (int m = 4; m < 32; m <<= 1) {
                a = Op::apply(a, shfl_xor(a, m));
                b = Op::apply(b, shfl_xor(b, m));
            }
            dst.data[j][2 * half] = a;
            dst.data[j][2 * half + 1] = b;
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

// ---- broadcasts: combine each element with its row's (or column's) vector entry

template <class T, int R, int C, class F>
CALICO_DEVICE void row_map(rt<T, R, C, row_l>& dst, const rt<T, R, C, row_l>& src, const rv<R, per_row>& v, F f) {
#pragma unroll
    for (int i = 0; i < R / 16; ++i)
#pragma unroll
        for (int j = 0; j < C / 16; ++j)
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const float r = v.data[i][k & 1];
                const float2 x = unpack(src.data[i][j][k]);
                dst.data[i][j][k] = pack<T>(f(x.x, r), f(x.y, r));
            }
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
            for (int k = 0; k < 4; ++k) {
                const int half = k >> 1;
                const float2 x = unpack(src.data[i][j][k]);
                dst.data[i][j][k] = pack<T>(f(x.x, v.data[j][2 * half]), f(x.y, v.data[j][2 * half + 1]));
            }
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
    const int lane = thread_x() % 32;
#pragma unroll
    for (int i = 0; i < R / 16; ++i)
#pragma unroll
        for (int j = 0; j < C / 16; ++j)
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                int r, c, r1, c1;
                pair_coords<L>(lane, k, tc.row * R + 16 * i, tc.col * C + 16 * j, r, c, r1, c1);
                const bool ok0 = r < src.rows && c < src.cols, ok1 = r1 < src.rows && c1 < src.cols;
                const float x0 = ok0 ? to_float(*src.at(tc.batch, r, c)) : 0.0f;
                const float x1 = ok1 ? to_float(*src.at(tc.batch, r1, c1)) : 0.0f;
                dst.data[i][j][k] = pack<T>(x0, x1);
            }
}

// Global <- registers (tile `tc` of `dst`); elements outside the matrix are not written.
template <class G, class T, int R, int C, class L>
CALICO_DEVICE void store(const gl<G>& dst, const rt<T, R, C, L>& src, coord tc) {
    const int lane = thread_x() % 32;
#pragma unroll
    for (int i = 0; i < R / 16; ++i)
#pragma unroll
        for (int j = 0; j < C / 16; ++j)
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                int r, c, r1, c1;
                pair_coords<L>(lane, k, tc.row * R + 16 * i, tc.col * C + 16 * j, r, c, r1, c1);
                const float2 v = unpack(src.data[i][j][k]);
                if (r < dst.rows && c < dst.cols) *dst.at(tc.batch, r, c) = from_float<G>(v.x);
                if (r1 < dst.rows && c1 < dst.cols) *dst.at(tc.batch, r1, c1) = from_float<G>(v.y);
            }
}

// Registers <- shared, 16-bit tiles, with ldmatrix: row_l reads rows as stored; col_l reads
// the transpose (an st holding K x N row-major becomes mma's B fragment).
template <class T, int R, int C, class L, int SR, int SC>
CALICO_DEVICE void load(rt<T, R, C, L>& dst, const st<T, SR, SC>& src, int row0 = 0, int col0 = 0) {
    static_assert(sizeof(T) == 2, "ldmatrix moves 16-bit elements");
    const int lane = thread_x() % 32;
    // Lane l addresses row l % 16 of the 16x16 block, column half l / 16: matrices 0..3 are
    // (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 8-15).
    const int lr = lane % 16, lc = 8 * (lane / 16);
#pragma unroll
    for (int i = 0; i < R / 16; ++i)
#pragma unroll
        for (int j = 0; j < C / 16; ++j) {
            uint32_t r[4];
            if constexpr (same_type<L, row_l>::value) {
                ldmatrix_x4(r, src.addr(row0 + 16 * i + lr, col0 + 16 * j + lc));
            } else {
                // dst (i, j) covers rows 16i.. (K) and cols 16j.. (N) of the stored K x N tile;
                // transposed matrices 0..3 give regs (k 0-7 | k 8-15) x (n 0-7 | n 8-15):
                // reg0 = (k 2t, n g), reg1 = (k 2t, n g+8), reg2 = (k 2t+8, n g), reg3 = (k 2t+8, n g+8).
                const int kr = (lane % 8) + 8 * (lane / 16), nc = 8 * ((lane / 8) % 2);
                ldmatrix_x4_trans(r, src.addr(row0 + 16 * i + kr, col0 + 16 * j + nc));
            }
#pragma unroll
            for (int k = 0; k < 4; ++k) dst.data[i][j][k] = *reinterpret_cast<typename packed<T>::type*>(&r[k]);
        }
}

namespace detail {
// Calls f(row, col, pair) for each element pair (row, col), (row, col + 1) a lane holds of a
// row_l register tile, row and col counted from the tile's corner.
template <class S, int R, int C, class F>
CALICO_DEVICE void each_row_pair(const rt<S, R, C, row_l>& src, F&& f) {
    const int lane = thread_x() % 32;
#pragma unroll
    for (int i = 0; i < R / 16; ++i)
#pragma unroll
        for (int j = 0; j < C / 16; ++j)
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                int r, c;
                base_coord<row_l>(lane, k, r, c);
                f(16 * i + r, 16 * j + c, src.data[i][j][k]);
            }
}
}  // namespace detail

// Shared <- registers (row_l), element pairs; callers sync (and fence_proxy_async() before
// TMA or wgmma read the tile).
template <class T, int SR, int SC, class S, int R, int C>
CALICO_DEVICE void store(st<T, SR, SC>& dst, const rt<S, R, C, row_l>& src, int row0 = 0, int col0 = 0) {
    detail::each_row_pair(src, [&](int r, int c, const typename packed<S>::type& p) {
        const float2 v = unpack(p);
        *reinterpret_cast<typename packed<T>::type*>(dst.ptr(row0 + r, col0 + c)) = pack<T>(v.x, v.y);
    });
}

namespace detail {
// Shared tile <- 16 bytes: 8 elements of row r from column c (a multiple of 8) on, in one
// STS.128. st's swizzle XORs whole 16-byte units, so the 8 stay contiguous and aligned.
template <class T, int R, int C>
CALICO_DEVICE void st_store16(st<T, R, C>& dst, int r, int c, unsigned w0, unsigned w1, unsigned w2, unsigned w3) {
    *reinterpret_cast<uint4*>(dst.ptr(r, c)) = make_uint4(w0, w1, w2, w3);
}
}  // namespace detail

// A plain row-major f32 array (shared or global; `pitch` floats per row, e.g. padded against
// bank conflicts) <- registers, element pairs at (row0 + r, col0 + c); `dst` and the pitch must
// keep pairs 8-byte aligned.
template <int R, int C>
CALICO_DEVICE void store_rows(float* dst, int pitch, const rt<float, R, C, row_l>& src, int row0 = 0, int col0 = 0) {
    detail::each_row_pair(src, [&](int r, int c, const float2& p) {
        *reinterpret_cast<float2*>(&dst[(row0 + r) * pitch + col0 + c]) = p;
    });
}

// Shared <- global with cp.async, by all `threads` threads of the caller (16 bytes each per
// step); out-of-bounds 16-byte pieces are zero-filled. Rows of `src` must be 16-byte aligned
// and cols a multiple of 16 / sizeof(T) for the partial-row check to be exact.
template <class T, int R, int C>
CALICO_DEVICE void load_async(st<T, R, C>& dst, const gl<T>& src, coord tc, int thread, int threads) {
    constexpr int per_row = C * (int)sizeof(T) / 16;
    constexpr int elems = 16 / (int)sizeof(T);
    for (int idx = thread; idx < R * per_row; idx += threads) {
        const int r = idx / per_row, c = (idx % per_row) * elems;
        const int gr = tc.row * R + r, gc = tc.col * C + c;
        const bool valid = gr < src.rows && gc < src.cols;
        const T* p = valid ? src.at(tc.batch, gr, gc) : src.ptr;
        cp_async_16(dst.ptr(r, c), p, valid);
    }
}

// Shared <- global with TMA: one box per swizzle chunk of the tile, all completing on `bar`
// (which must expect st::bytes). The tensor map's box is {st::chunk_cols, R, 1}.
template <class T, int R, int C>
CALICO_DEVICE void load_tma(st<T, R, C>& dst, const tensor_map& map, coord tc, mbarrier& bar) {
#pragma unroll
    for (int chunk = 0; chunk < C / st<T, R, C>::chunk_cols; ++chunk)
        tma::load_3d(dst.raw + chunk * st<T, R, C>::chunk_bytes, map, tc.col * C + chunk * st<T, R, C>::chunk_cols, tc.row * R, tc.batch,
                     bar);
}

// load_tma with an L2 eviction policy (tma::policy_evict_*()).
template <class T, int R, int C>
CALICO_DEVICE void load_tma(st<T, R, C>& dst, const tensor_map& map, coord tc, mbarrier& bar, uint64_t policy) {
#pragma unroll
    for (int chunk = 0; chunk < C / st<T, R, C>::chunk_cols; ++chunk)
        tma::load_3d_hint(dst.raw + chunk * st<T, R, C>::chunk_bytes, map, tc.col * C + chunk * st<T, R, C>::chunk_cols, tc.row * R,
                          tc.batch, bar, policy);
}

// Global <- shared with TMA, one box per swizzle chunk, clipped at the tensor's end by the
// copy engine (see tma.cuh for what that needs). Every thread that wrote `src` runs
// fence_proxy_async() and a barrier first; then one thread issues this, and
// tma::store_commit() / store_wait_read<> before `src` is written again. `tc` at element
// (row0, col0) instead of a tile index: store boxes often sit at offsets inside an output tile.
template <class T, int R, int C>
CALICO_DEVICE void store_tma_at(const tensor_map& map, const st<T, R, C>& src, int batch, int row0, int col0) {
#pragma unroll
    for (int chunk = 0; chunk < C / st<T, R, C>::chunk_cols; ++chunk)
        tma::store_3d(map, src.raw + chunk * st<T, R, C>::chunk_bytes, col0 + chunk * st<T, R, C>::chunk_cols, row0, batch);
}

}  // namespace calico
