// Rotary position embedding over [B, S, H, D] (B = 1 for rank 3), any strides but the last.
//
// Each thread rotates P pairs of one (b, s, h) row: with HALF_SPLIT the pairs are (x[i], x[i+D/2])
// for P consecutive i, read as two vectors; interleaved, the pairs are (x[2i], x[2i+1]) read as
// one vector of 2P. cos/sin are f32 [positions, D/2]; position = pos_offset + s.
// Defines: ELEM (the element type, aliased T below), P (pairs per thread), XW (elements of x per
// memory access: P when half-split, up to 2P when interleaved, 1 when x is not aligned), HALF_SPLIT.
#include "calico/calico.h"

using namespace calico;

// ELEM, not T, comes in as a macro so that it cannot clash with template parameters.
typedef ELEM T;

// N elements as N / W accesses of W elements (W divides N).
template <int N, int W>
CALICO_DEVICE void load_chunks(float (&v)[N], const T* p) {
#pragma unroll
    for (int c = 0; c < N / W; ++c) {
        float part[W];
        load_vec<W>(part, p + c * W);
#pragma unroll
        for (int j = 0; j < W; ++j) v[c * W + j] = part[j];
    }
}
template <int N, int W>
CALICO_DEVICE void store_chunks(T* p, const float (&v)[N]) {
#pragma unroll
    for (int c = 0; c < N / W; ++c) {
        float part[W];
#pragma unroll
        for (int j = 0; j < W; ++j) part[j] = v[c * W + j];
        store_vec<W>(p + c * W, part);
    }
}

struct RopeArgs {
    const T* x; long long xb, xs, xh;
    T* y; long long yb, ys, yh;
    const float* cos; const float* sin;
    long long batch, seq, heads, dim, pos_offset;
};

CALICO_KERNEL void calico_rope(const T* x, long long xb, long long xs, long long xh, T* y, long long yb, long long ys,
                               long long yh, const float* cos, const float* sin, long long batch, long long seq,
                               long long heads, long long dim, long long pos_offset) {
    const RopeArgs a{x, xb, xs, xh, y, yb, ys, yh, cos, sin, batch, seq, heads, dim, pos_offset};
    const long long half = a.dim / 2;
    const long long chunks = half / P;  // chunks of P pairs per row
    const long long rows = a.batch * a.seq * a.heads;
    const long long total = rows * chunks;
    for (long long w = (long long)block_x() * block_dim_x() + thread_x(); w < total; w += (long long)grid_dim_x() * block_dim_x()) {
        const long long chunk = w % chunks;
        const long long row = w / chunks;
        const long long h = row % a.heads;
        const long long s = (row / a.heads) % a.seq;
        const long long b = row / (a.heads * a.seq);
        const long long i0 = chunk * P;
        const T* xr = a.x + b * a.xb + s * a.xs + h * a.xh;
        T* yr = a.y + b * a.yb + s * a.ys + h * a.yh;
        const long long pos = a.pos_offset + s;
        float c[P], sn[P];
        load_vec<P>(c, a.cos + pos * half + i0);
        load_vec<P>(sn, a.sin + pos * half + i0);
#if HALF_SPLIT
        float lo[P], hi[P];
        load_chunks<P, XW>(lo, xr + i0);
        load_chunks<P, XW>(hi, xr + i0 + half);
        float olo[P], ohi[P];
#pragma unroll
        for (int j = 0; j < P; ++j) {
            olo[j] = lo[j] * c[j] - hi[j] * sn[j];
            ohi[j] = lo[j] * sn[j] + hi[j] * c[j];
        }
        store_chunks<P, XW>(yr + i0, olo);
        store_chunks<P, XW>(yr + i0 + half, ohi);
#else
        float v[2 * P];
        load_chunks<2 * P, XW>(v, xr + 2 * i0);
        float o[2 * P];
#pragma unroll
        for (int j = 0; j < P; ++j) {
            o[2 * j] = v[2 * j] * c[j] - v[2 * j + 1] * sn[j];
            o[2 * j + 1] = v[2 * j] * sn[j] + v[2 * j + 1] * c[j];
        }
        store_chunks<2 * P, XW>(yr + 2 * i0, o);
#endif
    }
}
