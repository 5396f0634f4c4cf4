// Attention forward on CDNA (gfx90a, gfx94x): the tile vocabulary on MFMA 16x16x16, K and V
// staged in LDS through buffer loads. The same masks and options as the other forwards
// (attention/common.cuh): bottom-right causal and windows, soft-cap, GQA, packed batches, any
// lengths.
//
// Workgroup: WAVES = 8 wavefronts (512 threads), BM = 128 query rows of one (batch, query
// head); each wave owns 16 rows and keeps its Q rows (bf16/f16) and its output accumulator
// (f32) in register tiles. Keys come in blocks of BN (64; 32 at head dim 256):
//   - K's block is stored row-major as st<ELEM, BN, D> (the LDS swizzle of hip_tile.h, so the
//     row_l fragment reads are conflict-free ds_read_b64) and S = Q K^T is mma_ABt;
//   - V's block is stored transposed, st<ELEM, D, BN>, so its fragments are row_l reads of V^T
//     too and O += P V is mma_ABt(acc, P, V^T).
// The block after the current one is fetched with buffer_load_dwordx4 into registers while the
// matrix cores work on the current one, and written to LDS after the barrier that ends it (one
// LDS stage: 2 * BN * D * 2 bytes = 32 KiB at head dims 128 and 256, 16 KiB at 64).
// Rows of K/V past the sequence get an offset past the buffer: the hardware returns zeros.
// The online softmax runs in base 2 (exp2 is one instruction): per key block, scale and mask,
// row max, rescale of the running sum and accumulator, exp2, row sum, P rounded to ELEM.
// Rows that see no key get O = 0 and LSE = -inf.
//
// Defines: ELEM (bf16 | f16), HEAD_DIM (64 | 128 | 256), BN (keys per block: 64 or 32),
// HEAD_DIM_USED (the problem's head dim, a multiple of 8 up to HEAD_DIM; default HEAD_DIM).
// Requirements (host): rows of K and V 16-byte aligned, K's and V's row stride at least
// HEAD_DIM, each of K and V under 2 GiB.
#include "calico/tiles.h"
#include "calico/hip_buffer.h"
#include "attention/common.cuh"

#ifndef ELEM
#define ELEM bf16
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef BN
#define BN 64
#endif

namespace calico {
namespace attention_cdna {

using namespace calico::attention;

constexpr int WAVES = 8;
constexpr int THREADS = 64 * WAVES;
constexpr int BM = 16 * WAVES;
constexpr int D = HEAD_DIM;
#ifndef HEAD_DIM_USED
#define HEAD_DIM_USED HEAD_DIM
#endif
// The problem's head dim (a multiple of 8, at most D): K and V pieces past it are loaded as the
// out-of-range zeros, Q's are zero-filled by its view, and O is written up to it.
constexpr int DIM = HEAD_DIM_USED;
static_assert(DIM % 8 == 0 && DIM <= D, "a real head dim of whole 16-byte pieces, at most D");
// Head-dimension chunk of the register tiles: Q, O and the K / V^T fragments go 64 wide.
constexpr int DC = 64;
constexpr int CHUNKS = D / DC;
static_assert(D % DC == 0, "head dims are multiples of 64");
constexpr int ELEMS = 16 / (int)sizeof(ELEM);  // elements per 16-byte chunk
// An offset past every buffer (K and V are under 2 GiB): the load returns zeros.
constexpr unsigned OUT_OF_RANGE = 0x80000000u;

typedef st<ELEM, BN, D> k_tile;
typedef st<ELEM, D, BN> vt_tile;

struct Shared {
    k_tile k;
    vt_tile vt;
};

// One block of BN keys of K or V (BN x D, rows `stride` elements apart), prefetched into
// registers: N 16-byte pieces per thread.
struct Block {
    static constexpr int PER_ROW = D / ELEMS;
    static constexpr int N = BN * PER_ROW / THREADS;
    static_assert(N * THREADS == BN * PER_ROW, "16-byte chunks divide among the threads");
    // One load instruction of a wave takes 16 keys x 4 consecutive chunks (64 bytes of each
    // key row). For V's transposed writes this spreads a wave's 64 lanes over the banks (at
    // most 2 lanes per bank, where 4 keys x 16 chunks would put 8-16 on one);
    // calico_core::cdna_staging mirrors the placement and counts the conflicts.
    static constexpr int KEYS_PER_LOAD = 16, CHUNKS_PER_KEY = 4;
    static_assert(BN % KEYS_PER_LOAD == 0 && PER_ROW % CHUNKS_PER_KEY == 0, "whole key groups");
    hip::i32x4 regs[N];

    // Key r and element column c of the chunk this thread moves as its i-th.
    static CALICO_DEVICE void place(int i, int& r, int& c) {
        const int lane = static_cast<int>(thread_x()) % 64;
        const int g = static_cast<int>(thread_x()) / 64 * N + i;  // the wave's g-th load
        constexpr int GROUPS = BN / KEYS_PER_LOAD;
        r = (g % GROUPS) * KEYS_PER_LOAD + lane % KEYS_PER_LOAD;
        c = ((g / GROUPS) * CHUNKS_PER_KEY + lane / KEYS_PER_LOAD) * ELEMS;
    }

    // Rows [row0, row0 + BN) of a buffer of `rows` rows; rows past it read as zeros.
    CALICO_DEVICE void fetch(const hip::buffer& buf, i64 row0, i64 rows, i64 stride) {
#pragma unroll
        for (int i = 0; i < N; ++i) {
            int r, c;
            place(i, r, c);
            const i64 gr = row0 + r;
            const bool in = gr < rows && (DIM == D || c < DIM);
            const unsigned off = in ? static_cast<unsigned>((gr * stride + c) * (i64)sizeof(ELEM)) : OUT_OF_RANGE;
            regs[i] = hip::load_16b(buf, off);
        }
    }

    // Row-major into K's tile: two 8-byte writes (the swizzle permutes 8-byte units).
    CALICO_DEVICE void commit(k_tile& t) const {
        typedef int i2 __attribute__((ext_vector_type(2)));
#pragma unroll
        for (int i = 0; i < N; ++i) {
            int r, c;
            place(i, r, c);
            *reinterpret_cast<i2*>(t.ptr(r, c)) = i2{regs[i].x, regs[i].y};
            *reinterpret_cast<i2*>(t.ptr(r, c + ELEMS / 2)) = i2{regs[i].z, regs[i].w};
        }
    }

    // Transposed into V^T's tile: key r, dims c..c+7 land in column r of rows c..c+7.
    CALICO_DEVICE void commit_transposed(vt_tile& t) const {
        typedef short s8 __attribute__((ext_vector_type(8)));
#pragma unroll
        for (int i = 0; i < N; ++i) {
            int r, c;
            place(i, r, c);
            const s8 v = __builtin_bit_cast(s8, regs[i]);
#pragma unroll
            for (int e = 0; e < ELEMS; ++e) *reinterpret_cast<short*>(t.ptr(c + e, r)) = v[e];
        }
    }
};

// Scale, soft-cap, base 2, and -inf outside the mask, for the 16 x BN scores of one wave whose
// first row is query `row0` and first column key `col0`.
CALICO_DEVICE void mask_scores(rt_fl<16, BN>& s, const params& p, const sequence& seq, i64 row0, i64 col0) {
    const int lane = static_cast<int>(hw_lane());
#pragma unroll
    for (int j = 0; j < BN / 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            int r, c;
            base_coord<row_l>(lane, e, r, c);
            const i64 i = row0 + r, key = col0 + 16 * j + c;
            const float v = elem_get(s.data[0][j], e);
            elem_set(s.data[0][j], e, visible(p, seq, i, key) ? score2(p, v) : neg_inf());
        }
}

// Bytes a K or V operand spans for one sequence of `len` rows (0 when empty).
CALICO_DEVICE unsigned span_bytes(i64 len, i64 stride) {
    return len > 0 ? static_cast<unsigned>(((len - 1) * stride + DIM) * (i64)sizeof(ELEM)) : 0u;
}

}  // namespace attention_cdna
}  // namespace calico

// Grid: (query blocks of BM rows of the longest sequence, query heads, batch). Packed batches
// pass cu_q / cu_k (else null) and the packed lengths in p.q_len / p.k_len. The argument list
// is calico_attention_fwd's (forward.cu).
CALICO_KERNEL CALICO_MAX_THREADS(512) void calico_attention_cdna_fwd(
    CALICO_ATTN_OPERAND(const ELEM, q), CALICO_ATTN_OPERAND(const ELEM, k), CALICO_ATTN_OPERAND(const ELEM, v),
    CALICO_ATTN_OPERAND(ELEM, o), float* __restrict__ lse, long long lse_sb, long long lse_sh, const int* __restrict__ cu_q,
    const int* __restrict__ cu_k, CALICO_ATTN_PARAMS) {
    CALICO_ATTN_USE(const ELEM, q);
    CALICO_ATTN_USE(const ELEM, k);
    CALICO_ATTN_USE(const ELEM, v);
    CALICO_ATTN_USE(ELEM, o);
    CALICO_ATTN_USE_PARAMS;
    using namespace calico;
    using namespace calico::attention_cdna;
    __shared__ Shared sh;

    const i64 b = block_z(), h = block_y(), kvh = h / (p.q_heads / p.kv_heads);
    const sequence seq = sequence_of(p, cu_q, cu_k, b);
    const i64 m0 = (i64)block_x() * BM;
    if (m0 >= seq.q_len) return;  // the whole workgroup: no barrier is skipped by part of it
    // Wave-uniform; readfirstlane keeps what derives from it in scalar registers.
    const int wave = __builtin_amdgcn_readfirstlane(static_cast<int>(thread_x()) / 64);
    const int lane = static_cast<int>(hw_lane());

    const ELEM* qb = q.ptr + b * q.sb + h * q.sh + seq.q_start * q.sn;
    const ELEM* kb = k.ptr + b * k.sb + kvh * k.sh + seq.k_start * k.sn;
    const ELEM* vb = v.ptr + b * v.sb + kvh * v.sh + seq.k_start * v.sn;
    const gl<ELEM> qg{const_cast<ELEM*>(qb), (int)seq.q_len, DIM, q.sn, 0};
    const gl<ELEM> og{o.ptr + b * o.sb + h * o.sh + seq.q_start * o.sn, (int)seq.q_len, DIM, o.sn, 0};
    const hip::buffer kbuf = hip::make_buffer(kb, span_bytes(seq.k_len, k.sn));
    const hip::buffer vbuf = hip::make_buffer(vb, span_bytes(seq.k_len, v.sn));

    // This wave's 16 query rows, in chunks of 64 columns.
    const int row_tile = (int)(m0 / 16) + wave;
    rt<ELEM, 16, DC> qr[CHUNKS];
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) load(qr[c], qg, coord{0, row_tile, c});

    rt_fl<16, DC> acc[CHUNKS];
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) zero(acc[c]);
    // Per row (lane % 16): the running max (base 2) and sum.
    rv<16, per_row> row_max2, sums;
    row_max2.data[0][0] = neg_inf();
    sums.data[0][0] = 0.0f;

    // The keys any row of the workgroup sees.
    const i64 last = (m0 + BM < seq.q_len ? m0 + BM : seq.q_len) - 1;
    i64 lo, hi, lo_last, hi_last;
    visible_keys(p, seq, m0, lo, hi);
    visible_keys(p, seq, last, lo_last, hi_last);
    const int first_tile = (int)(lo / BN);
    const int end_tile = hi_last > lo ? (int)((hi_last + BN - 1) / BN) : first_tile;

    Block kn, vn;
    if (first_tile < end_tile) {
        kn.fetch(kbuf, (i64)first_tile * BN, seq.k_len, k.sn);
        vn.fetch(vbuf, (i64)first_tile * BN, seq.k_len, v.sn);
    }
    for (int t = first_tile; t < end_tile; ++t) {
        // Every wave is past the previous block's fragment reads (the barrier ending it).
        kn.commit(sh.k);
        vn.commit_transposed(sh.vt);
        sync_threads();
        // The next block travels while the matrix cores work on this one.
        if (t + 1 < end_tile) {
            kn.fetch(kbuf, (i64)(t + 1) * BN, seq.k_len, k.sn);
            vn.fetch(vbuf, (i64)(t + 1) * BN, seq.k_len, v.sn);
        }

        // S = Q K^T over the head dimension, 64 columns at a time.
        rt_fl<16, BN> s;
        zero(s);
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            rt<ELEM, BN, DC> kf;
            load(kf, sh.k, 0, c * DC);
            mma_ABt(s, qr[c], kf, s);
        }
        {
            // Blocks every row of this wave sees in full (most of them) skip the per-element
            // mask: one multiply by scale * log2(e).
            const i64 row0 = m0 + 16 * wave, col0 = (i64)t * BN;
            const i64 diag0 = row0 + seq.k_len - seq.q_len;
            const bool full = col0 + BN <= seq.k_len && (p.left < 0 || col0 >= diag0 + 15 - p.left) &&
                              (p.right < 0 || col0 + BN - 1 <= diag0 + p.right);
            if (full && p.softcap <= 0.0f)
                mul(s, s, p.scale * LOG2E);
            else
                mask_scores(s, p, seq, row0, col0);
        }

        // Online softmax in base 2.
        rv<16, per_row> tile_max, scale_old, tile_sum;
        row_max(tile_max, s);
        {
            const float m_new = fmaxf(row_max2.data[0][0], tile_max.data[0][0]);
            // A row that has seen no key yet keeps max -inf; subtract 0 so exp2 gives 0, not NaN.
            const float m_use = m_new == neg_inf() ? 0.0f : m_new;
            scale_old.data[0][0] = exp2_approx(row_max2.data[0][0] - m_use);
            row_max2.data[0][0] = m_new;
            tile_max.data[0][0] = m_use;
        }
        sub_row(s, s, tile_max);
        exp2(s, s);
        row_sum(tile_sum, s);
        sums.data[0][0] = sums.data[0][0] * scale_old.data[0][0] + tile_sum.data[0][0];

        // O = O * rescale + P V, with V^T's fragments as mma_ABt's B.
        rt<ELEM, 16, BN> pr;
        copy(pr, s);
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            mul_row(acc[c], acc[c], scale_old);
            rt<ELEM, DC, BN> vf;
            load(vf, sh.vt, c * DC, 0);
            mma_ABt(acc[c], pr, vf, acc[c]);
        }
        // The next iteration's LDS writes overwrite the block just read.
        sync_threads();
    }

    rv<16, per_row> inv;
    inv.data[0][0] = sums.data[0][0] > 0.0f ? 1.0f / sums.data[0][0] : 0.0f;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
        mul_row(acc[c], acc[c], inv);
        store(og, acc[c], coord{0, row_tile, c});
    }
    // Lanes 0..15 hold rows 0..15 of the wave (lanes l + 16, l + 32, l + 48 hold copies).
    if (lane < 16) {
        const i64 i = m0 + 16 * wave + lane;
        if (i < seq.q_len) lse[b * lse_sb + h * lse_sh + seq.q_start + i] = row_lse(row_max2.data[0][0], sums.data[0][0]);
    }
}
