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
