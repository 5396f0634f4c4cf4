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

// The reverse for an output: `batch` x `rows` x `cols` elements of a row-major buffer with
// 16-byte aligned rows (src_rs a multiple of 8) go to dst with any strides: 16-byte loads,
// element stores. A block per row (grid-stride).
CALICO_KERNEL void calico_gemm_unpad(const unsigned short* src, i64 src_rs, i64 src_bs, unsigned short* dst, i64 dst_rs,
                                     i64 dst_cs, i64 dst_bs, i64 batch, i64 rows, i64 cols) {
    const i64 chunks_per_row = (cols + 7) / 8;
    for (i64 r = block_x(); r < batch * rows; r += grid_dim_x()) {
        const i64 b = r / rows;
        const i64 row = r - b * rows;
        const unsigned short* s = src + b * src_bs + row * src_rs;
        unsigned short* d = dst + b * dst_bs + row * dst_rs;
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
