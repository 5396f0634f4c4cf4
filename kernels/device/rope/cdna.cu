// Rotary position embedding on CDNA (gfx90a, gfx94x) through buffer resources: one descriptor
// each over x, y, cos and sin (each under 2 GiB, checked on the host). Each thread rotates P
// pairs of one (b, s, h) row, as rope.cu; a thread past the end of the work gets an offset
// beyond every buffer, so its loads read zeros and its stores are dropped by the hardware:
// the last round needs no branch, and the loop's trip count is the same for the whole block.
//
// Defines: ELEM (bf16|f16|float), P (pairs per thread), XW (elements of x per access; XW *
// sizeof(ELEM) is 4, 8 or 16 bytes), HALF_SPLIT. Arguments as calico_rope (rope.cu) plus the
// byte sizes of the four buffers.
#include "calico/calico.h"
#include "calico/hip_buffer.h"

using namespace calico;

typedef ELEM T;

namespace calico {
namespace rope_cdna {

constexpr int XBYTES = XW * (int)sizeof(T);
constexpr int CW = P < 4 ? P : 4;  // floats of cos / sin per access
static_assert(XBYTES == 4 || XBYTES == 8 || XBYTES == 16, "x moves in 4, 8 or 16-byte accesses");
// An element index past every buffer (each is under 2 GiB): loads read 0, stores are dropped.
constexpr unsigned OUT_OF_RANGE = 0x80000000u / (unsigned)sizeof(T);
constexpr unsigned OUT_OF_RANGE_F32 = 0x80000000u / 4u;

// N elements of T from element `at` on (OUT_OF_RANGE: zeros), as N / XW accesses.
template <int N>
CALICO_DEVICE void load_x(float (&v)[N], const hip::buffer& b, unsigned at, bool ok) {
#pragma unroll
    for (int c = 0; c < N / XW; ++c) {
        float part[XW];
        hip::buffer_load_floats<T, XBYTES>(part, b, ok ? at + c * XW : OUT_OF_RANGE);
#pragma unroll
        for (int j = 0; j < XW; ++j) v[c * XW + j] = part[j];
    }
}

template <int N>
CALICO_DEVICE void store_x(const hip::buffer& b, unsigned at, bool ok, const float (&v)[N]) {
#pragma unroll
    for (int c = 0; c < N / XW; ++c) {
        float part[XW];
#pragma unroll
        for (int j = 0; j < XW; ++j) part[j] = v[c * XW + j];
        hip::buffer_store_floats<T, XBYTES>(b, ok ? at + c * XW : OUT_OF_RANGE, part);
    }
}

// P floats of a cos / sin row from element `at` on.
CALICO_DEVICE void load_table(float (&v)[P], const hip::buffer& b, unsigned at, bool ok) {
#pragma unroll
    for (int c = 0; c < P / CW; ++c) {
        float part[CW];
        hip::buffer_load_floats<float, 4 * CW>(part, b, ok ? at + c * CW : OUT_OF_RANGE_F32);
#pragma unroll
        for (int j = 0; j < CW; ++j) v[c * CW + j] = part[j];
    }
}

}  // namespace rope_cdna
}  // namespace calico

CALICO_KERNEL CALICO_MAX_THREADS(256) void calico_rope_cdna(const T* x, long long xb, long long xs, long long xh, T* y, long long yb, long long ys,
                                    long long yh, const float* cos, const float* sin, long long batch, long long seq,
                                    long long heads, long long dim, long long pos_offset, long long x_bytes, long long y_bytes,
                                    long long table_bytes) {
    using namespace calico::rope_cdna;
    const hip::buffer xbuf = hip::make_buffer(x, static_cast<unsigned>(x_bytes));
    const hip::buffer ybuf = hip::make_buffer(y, static_cast<unsigned>(y_bytes));
    const hip::buffer cbuf = hip::make_buffer(cos, static_cast<unsigned>(table_bytes));
    const hip::buffer sbuf = hip::make_buffer(sin, static_cast<unsigned>(table_bytes));
    const long long half = dim / 2;
    const long long chunks = half / P;  // chunks of P pairs per row
    const long long total = batch * seq * heads * chunks;
    const long long stride = (long long)grid_dim_x() * block_dim_x();
    for (long long base = (long long)block_x() * block_dim_x(); base < total; base += stride) {
        const long long w = base + thread_x();
        const bool ok = w < total;
        const long long chunk = w % chunks;
        const long long row = w / chunks;
        const long long h = row % heads;
        const long long s = (row / heads) % seq;
        const long long b = row / (heads * seq);
        const long long i0 = chunk * P;
        const unsigned xr = static_cast<unsigned>(b * xb + s * xs + h * xh + i0 * (HALF_SPLIT ? 1 : 2));
        const unsigned yr = static_cast<unsigned>(b * yb + s * ys + h * yh + i0 * (HALF_SPLIT ? 1 : 2));
        const unsigned tr = static_cast<unsigned>((pos_offset + s) * half + i0);
        float c[P], sn[P];
        load_table(c, cbuf, tr, ok);
        load_table(sn, sbuf, tr, ok);
#if HALF_SPLIT
        float lo[P], hi[P];
        load_x(lo, xbuf, xr, ok);
        load_x(hi, xbuf, xr + static_cast<unsigned>(half), ok);
        float olo[P], ohi[P];
#pragma unroll
        for (int j = 0; j < P; ++j) {
            olo[j] = lo[j] * c[j] - hi[j] * sn[j];
            ohi[j] = lo[j] * sn[j] + hi[j] * c[j];
        }
        store_x(ybuf, yr, ok, olo);
        store_x(ybuf, yr + static_cast<unsigned>(half), ok, ohi);
#else
        float v[2 * P];
        load_x(v, xbuf, xr, ok);
        float o[2 * P];
#pragma unroll
        for (int j = 0; j < P; ++j) {
            o[2 * j] = v[2 * j] * c[j] - v[2 * j + 1] * sn[j];
            o[2 * j + 1] = v[2 * j] * sn[j] + v[2 * j + 1] * c[j];
        }
        store_x(ybuf, yr, ok, o);
#endif
    }
}
