// The tile vocabulary: include this (and nothing vendor-specific) to write a kernel that
// compiles for NVIDIA (sm_80, sm_90a) and AMD CDNA (gfx90a, gfx942) alike.
//
// Types (calico/tile_types.h): rt<T, R, C, L> (rt_fl, rt_bf, rt_hf), rv<N, per_row|per_col>
// (row_vec<TILE>, col_vec<TILE>), st<T, R, C> (st_bf, st_hf), gl<T>, coord, row_l, col_l.
//
// Operations, destination first, called by a whole warp (32 lanes) or wavefront (64 lanes);
// every vendor implements each with these signatures (T: bf16, f16 or float unless noted):
//   map(dst, src, f)  map2(dst, a, b, f)     elementwise f(float) / f(float, float)
//   fill(dst, v)  zero(dst)  exp2(dst, src)  mul(dst, src, s)  add(dst, a, b)  mul(dst, a, b)
//   map_rc(dst, src, f)                      f(row, col, x): row, col of the element within
//                                            the tile (any layout), e.g. to mask scores
//   copy(dst, src)                           convert between element types, same layout
//   transpose(dst, src)                      dst: C x R row_l = (src: R x C col_l)^T; moves no
//                                            data (e.g. to store a tile transposed)
//   map(v, u, f)  map2(v, a, b, f)  fill(v, x)   register vectors (rv), elementwise
//   row_max(v, t)  row_sum(v, t)             rv<R, per_row> from an rt<T, R, C, row_l>
//   col_max(v, t)  col_sum(v, t)             rv<C, per_col> from an rt<T, R, C, row_l>
//   row_map(dst, src, v, f)  sub_row  mul_row  div_row     broadcast a per_row vector
//   col_map(dst, src, v, f)  add_col  mul_col              broadcast a per_col vector
//   load(rt, gl, coord)  store(gl, rt, coord)   tile `coord` of a matrix; outside reads 0,
//                                               outside writes are dropped
//   load(rt, st, row0, col0)  store(st, rt, row0, col0)     16-bit shared tiles; row0/col0
//                                               default to 0; callers sync_threads() between
//   load(gt, gl, coord, thread)  store(st, gt, thread)   a 16-bit tile global -> shared by a
//                                               whole block in 16-byte chunks, through the
//                                               staging registers gt<T, R, C, THREADS> (below;
//                                               written once here; each vendor places a
//                                               16-byte chunk in its swizzle: st_store16)
//   mma_AB(d, a, b, c)   d, c: rt<float, M, N, row_l>; a: rt<T, M, K, row_l>; b: rt<T, K, N, col_l>
//   mma_ABt(d, a, b, c)  b: rt<T, N, K, row_l>   (D = A B^T + C)
//   mma_AtB(d, a, b, c)  a: rt<T, K, M, col_l>   (D = A^T B + C)
//   mma_AtBt(d, a, b, c) a: K x M col_l, b: N x K row_l
// A register tile is always used by whole warps/wavefronts: which lane holds what differs by
// vendor, so a kernel never indexes rt::data itself in portable code.
#pragma once
#include "calico/calico.h"
#include "calico/tile_types.h"
#include "calico/vendor_tiles.h"

namespace calico {

// gt<T, R, C, THREADS>: an R x C tile of 16-bit T on its way from global to shared memory,
// moved by all THREADS threads of a block in 16-byte chunks (8 elements of a row), each thread
// holding R * C / (8 * THREADS) of them in registers; consecutive threads take consecutive
// chunks of a row, so the global loads coalesce.
// A chunk as four 32-bit words (element pairs), the registers a 16-byte load fills.
struct alignas(16) chunk16 {
    unsigned w[4];
};

template <class T, int R, int C, int THREADS>
struct gt {
    static_assert(sizeof(T) == 2, "gt moves 16-bit elements");
    static_assert(C % 8 == 0 && (R * C / 8) % THREADS == 0, "whole chunks, the same count per thread");
    static constexpr int chunks_per_row = C / 8;
    static constexpr int per_thread = R * C / 8 / THREADS;
    chunk16 data[per_thread];
};

// Registers <- global: tile `tc` of `src` (R x C elements). A chunk wholly inside the matrix is
// one 16-byte load, so the element at every chunk's start must be 16-byte aligned: src.ptr,
// row_stride and batch_stride multiples of 16 bytes. A chunk across the right or bottom edge
// is read element by element, zeros outside.
template <class T, int R, int C, int THREADS>
CALICO_DEVICE void load(gt<T, R, C, THREADS>& dst, const gl<T>& src, coord tc, int thread) {
#pragma unroll
    for (int i = 0; i < gt<T, R, C, THREADS>::per_thread; ++i) {
        const int idx = thread + i * THREADS;
        const int r = tc.row * R + idx / gt<T, R, C, THREADS>::chunks_per_row;
        const int c = tc.col * C + (idx % gt<T, R, C, THREADS>::chunks_per_row) * 8;
        if (r < src.rows && c + 8 <= src.cols) {
            dst.data[i] = *reinterpret_cast<const chunk16*>(src.at(tc.batch, r, c));
        } else {
#pragma unroll
            for (int e = 0; e < 8; e += 2) {
                const bool lo = r < src.rows && c + e < src.cols, hi = r < src.rows && c + e + 1 < src.cols;
                const unsigned x0 = lo ? *reinterpret_cast<const unsigned short*>(src.at(tc.batch, r, c + e)) : 0u;
                const unsigned x1 = hi ? *reinterpret_cast<const unsigned short*>(src.at(tc.batch, r, c + e + 1)) : 0u;
                dst.data[i].w[e / 2] = x0 | (x1 << 16);
            }
        }
    }
}

// Shared <- registers: the chunks `thread` loaded, at the same place in `dst` (R x C), one
// 16-byte shared store each (the vendor's detail::st_store16 places it in the swizzle).
// Callers sync_threads() before the tile is read.
template <class T, int R, int C, int THREADS>
CALICO_DEVICE void store(st<T, R, C>& dst, const gt<T, R, C, THREADS>& src, int thread) {
#pragma unroll
    for (int i = 0; i < gt<T, R, C, THREADS>::per_thread; ++i) {
        const int idx = thread + i * THREADS;
        const int r = idx / gt<T, R, C, THREADS>::chunks_per_row;
        const int c = (idx % gt<T, R, C, THREADS>::chunks_per_row) * 8;
        const unsigned* w = src.data[i].w;
        detail::st_store16(dst, r, c, w[0], w[1], w[2], w[3]);
    }
}

}  // namespace calico
