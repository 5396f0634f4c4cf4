// Copies up to two strided 16-bit matrices into row-major buffers whose rows start 16-byte
// aligned, so that the Hopper GEMM's TMA loads can read operands with odd shapes or strides
// (K, N or a row stride not a multiple of 8 elements). One launch pads both GEMM operands.
//
// Matrix z = block_y(): `batch` x `rows` x `cols` elements at src (strides src_rs, src_cs,
// src_bs) go to dst (row stride dst_rs, a multiple of 8; batch stride dst_bs). Each thread
// writes 8 destination elements of one row with a 16-byte store; the source is read element
// by element (coalesced across the warp when src_cs = 1). Columns cols .. round_up(cols, 8)
// are written as zeros (the rest of the padded row is never read). A block per row.
#include "calico/calico.h"
#include "gemm/shift.cuh"

using namespace calico;

typedef long long i64;

struct PadMatrix {
    const unsigned short* src;
    unsigned short* dst;
    i64 batch, rows, cols, src_rs, src_cs, src_bs, dst_rs, dst_bs;
};

CALICO_DEVICE void pad_one(const PadMatrix& p) {
    const i64 chunks_per_row = (p.cols + 7) / 8;
    const i64 total_rows = p.batch * p.rows;
    // A block per row (grid-stride), its threads across the row: one division per row.
    for (i64 r = block_x(); r < total_rows; r += grid_dim_x()) {
        const i64 b = r / p.rows;
        const i64 row = r - b * p.rows;
        const unsigned short* src_row = p.src + b * p.src_bs + row * p.src_rs;
        unsigned short* dst_row = p.dst + b * p.dst_bs + row * p.dst_rs;
        for (i64 chunk = thread_x(); chunk < chunks_per_row; chunk += block_dim_x()) {
            const i64 c0 = chunk * 8;
            const unsigned short* s = src_row + c0 * p.src_cs;
            unsigned h[8];
            if (c0 + 8 <= p.cols) {
#pragma unroll
                for (int j = 0; j < 8; ++j) h[j] = s[j * p.src_cs];
            } else {
#pragma unroll
                for (int j = 0; j < 8; ++j) h[j] = c0 + j < p.cols ? unsigned(s[j * p.src_cs]) : 0u;
            }
            uint4 v;
            v.x = h[0] | (h[1] << 16);
            v.y = h[2] | (h[3] << 16);
            v.z = h[4] | (h[5] << 16);
            v.w = h[6] | (h[7] << 16);
            *reinterpret_cast<uint4*>(dst_row + c0) = v;
        }
    }
}

#define CALICO_PAD_PARAMS(i)                                                                            \
    const unsigned short *src##i, unsigned short *dst##i, i64 batch##i, i64 rows##i, i64 cols##i, i64 src_rs##i, \
        i64 src_cs##i, i64 src_bs##i, i64 dst_rs##i, i64 dst_bs##i
#define CALICO_PAD_MATRIX(i) PadMatrix{src##i, dst##i, batch##i, rows##i, cols##i, src_rs##i, src_cs##i, src_bs##i, dst_rs##i, dst_bs##i}

// Two matrices (grid y = 2) or only the first (grid y = 1).
CALICO_KERNEL void calico_gemm_pad(CALICO_PAD_PARAMS(0), CALICO_PAD_PARAMS(1)) {
    if (block_y() == 0) {
        pad_one(CALICO_PAD_MATRIX(0));
    } else {
        pad_one(CALICO_PAD_MATRIX(1));
    }
}

// The 8 elements of a 16-byte aligned row `s` from element e on (e + 8 <= cols), from the one
// or two aligned 16-byte chunks that hold them, shifted by e % 8 elements (gemm/shift.cuh). A
// second chunk that reaches past column `cols` holds padding no one wrote: those pieces are
// read element by element instead.
CALICO_DEVICE uint4 load8_shifted(const unsigned short* s, i64 e, i64 cols) {
    const i64 r = e % 8;
    const uint4* chunk = reinterpret_cast<const uint4*>(s + (e - r));
    if (r == 0) return chunk[0];
    if (e - r + 16 > cols) {
        unsigned h[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) h[j] = s[e + j];
        return uint4{h[0] | (h[1] << 16), h[2] | (h[3] << 16), h[4] | (h[5] << 16), h[6] | (h[7] << 16)};
    }
    const uint4 lo = chunk[0];
    const uint4 hi = chunk[1];
    const gemm::words4 v = gemm::shift_words(int(r), gemm::words4{lo.x, lo.y, lo.z, lo.w}, gemm::words4{hi.x, hi.y, hi.z, hi.w});
    return uint4{v.x, v.y, v.z, v.w};
}

// One row into a contiguous destination row of any (2-byte) alignment: 16-byte stores on the
// destination's 16-byte boundaries (whole sectors instead of 2-byte pieces), element stores
// for the head before the first boundary and the tail after the last.
CALICO_DEVICE void unpad_row_contiguous(const unsigned short* s, unsigned short* d, i64 cols) {
    const i64 head = i64((16 - (reinterpret_cast<unsigned long long>(d) & 15)) & 15) / 2;
    // Piece j covers columns [head + 8 (j - 1), head + 8 j): piece 0 is the head.
    const i64 pieces = 1 + (cols > head ? (cols - head + 7) / 8 : 0);
    for (i64 j = thread_x(); j < pieces; j += block_dim_x()) {
        const i64 lo = head + 8 * (j - 1) > 0 ? head + 8 * (j - 1) : 0;
        const i64 hi = head + 8 * j < cols ? head + 8 * j : cols;
        if (hi - lo == 8) {
            *reinterpret_cast<uint4*>(d + lo) = load8_shifted(s, lo, cols);
        } else {
            for (i64 e = lo; e < hi; ++e) d[e] = s[e];
        }
    }
}

// The reverse for an output: `batch` x `rows` x `cols` elements of a row-major buffer with
// 16-byte aligned rows (src_rs a multiple of 8) go to dst with any strides. Contiguous
// destination rows (dst_cs = 1) take 16-byte stores on their own 16-byte boundaries; others
// 16-byte loads and element stores. A block per row (grid-stride).
CALICO_KERNEL void calico_gemm_unpad(const unsigned short* src, i64 src_rs, i64 src_bs, unsigned short* dst, i64 dst_rs,
                                     i64 dst_cs, i64 dst_bs, i64 batch, i64 rows, i64 cols) {
    const i64 chunks_per_row = (cols + 7) / 8;
    for (i64 r = block_x(); r < batch * rows; r += grid_dim_x()) {
        const i64 b = r / rows;
        const i64 row = r - b * rows;
        const unsigned short* s = src + b * src_bs + row * src_rs;
        unsigned short* d = dst + b * dst_bs + row * dst_rs;
        if (dst_cs == 1) {
            unpad_row_contiguous(s, d, cols);
            continue;
        }
        for (i64 chunk = thread_x(); chunk < chunks_per_row; chunk += block_dim_x()) {
            const i64 c0 = chunk * 8;
            const uint4 v = *reinterpret_cast<const uint4*>(s + c0);
            const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                if (c0 + j < cols) d[(c0 + j) * dst_cs] = (unsigned short)(w[j / 2] >> (16 * (j % 2)));
            }
        }
    }
}
