// The tile vocabulary's types, declared once for both vendors. Each vendor defines rt, rv and
// st (forward-declared here, with their default arguments) over its own base tile; the tags,
// global layouts and coordinates below are the same everywhere. See calico/tiles.h for the
// operations and their semantics.
#pragma once
#include "calico/calico.h"

namespace calico {

// Register-tile layouts. row_l: the layout of an MMA's A operand and of its accumulator (a
// lane's values run along a row); col_l: the layout of the B operand (values run down a
// column). Where exactly each element sits is the vendor's base tile (tile.cuh, hip_tile.h)
// and is mirrored in Rust by calico_core::lanes.
struct row_l {};
struct col_l {};

// Register-vector kinds: one value per tile row (per_row) or per tile column (per_col).
struct per_row {};
struct per_col {};

template <class A, class B>
struct same_type {
    static constexpr bool value = false;
};
template <class A>
struct same_type<A, A> {
    static constexpr bool value = true;
};

// rt<T, R, C, L>: an R x C register tile (R, C multiples of 16) held by one warp/wavefront.
template <class T, int R, int C, class L = row_l>
struct rt;
// rv<N, Kind>: N floats (a multiple of 16), one per row or column of a tile, spread over lanes
// the way the tile's rows (columns) are.
template <int N, class Kind>
struct rv;
// st<T, R, C>: an R x C tile in shared memory / LDS with the vendor's swizzle.
template <class T, int R, int C>
struct st;

template <int R, int C, class L = row_l>
using rt_fl = rt<float, R, C, L>;
template <int R, int C, class L = row_l>
using rt_bf = rt<bf16, R, C, L>;
template <int R, int C, class L = row_l>
using rt_hf = rt<f16, R, C, L>;
template <int R, int C>
using st_bf = st<bf16, R, C>;
template <int R, int C>
using st_hf = st<f16, R, C>;

// One value per row / per column of a tile shaped like TILE.
template <class TILE>
using row_vec = rv<TILE::rows, per_row>;
template <class TILE>
using col_vec = rv<TILE::cols, per_col>;

// A (batch of) row-major matrices in global memory; strides in elements.
template <class T>
struct gl {
    T* ptr;
    int rows, cols;
    long long row_stride, batch_stride;
    CALICO_DEVICE T* at(int batch, int r, int c) const { return ptr + batch * batch_stride + (long long)r * row_stride + c; }
};

// Tile coordinates: which R x C tile of a matrix (and which batch).
struct coord {
    int batch, row, col;
};

}  // namespace calico
