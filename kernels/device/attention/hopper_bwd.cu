// Hopper (sm_90a) attention backward: dQ, dK, dV from Q, K, V, O, LSE and dO, bf16/f16 in,
// f32 accumulation. Five kernels from this one source (CALICO_ATTN_KERNEL picks one):
//
//  0  prepare:  per query row, delta = rowsum(dO * O) and LSE in base 2 (+inf where the row
//               saw no key, so P = exp2(s - lse) is 0 there), into a workspace padded to whole
//               query blocks; the f32 dQ accumulator of the row set to 0.
//  1  main:     one CTA per (key block of 128 (64 at D = 256), KV head, batch), or per (that
//               unit, part of its query heads) under HEAD_SPLIT; see DESIGN.
//  2  finish:   dQ = scale * accumulator, in the output dtype and strides.
//  3  combine:  (HEAD_SPLIT only) dK = scale * sum of the parts' f32 partials, dV = their
//               sum, in the output dtype and strides.
//  4  dq:       (D = 256 with CALICO_ATTN_DQ_KERNEL, the default there) dQ from the query side,
//               summed in registers; the main kernel then computes dK and dV only and no
//               accumulator or finish kernel is used. See DESIGN (DQ) above the kernel.
//
// DESIGN (main)
//  * One CTA per unit (key block, KV head, batch), the grid in the order of unit_at: chunks of
//    (batch, KV head) pairs, each chunk's first key blocks first (the host picks about one
//    wave of CTAs per chunk under a causal mask, where a head's first key blocks are its
//    longest units; one pair, head by head, otherwise).
//  * Warp-specialised (calico/pipeline.cuh): 384 threads = 3 warpgroups. Warpgroup 0 is the
//    producer: one thread loads the CTA's K and V tiles once (kv_full / kv_empty), then streams
//    the query blocks of every query head of the KV head's group through two rings of STAGES
//    slots: Q with its LSE row, dO with its delta row (separate rings so S^T = K Q^T starts
//    before dO lands). Consumer warpgroups 1 and 2 own keys 0-63 and 64-127 of the block.
//  * Per query block (BQ rows), per consumer warpgroup (keys as the M dimension):
//      S^T  = K Q^T and dP^T = V dO^T    wgmma, both operands K-major in shared memory
//      P^T  = exp2(S^T * scale log2 e - LSE) (soft-cap: cap log2 e tanh(s scale / cap)),
//             masked keys and rows 0
//      dS^T = P^T (dP^T - delta) (times 1 - tanh^2 under a soft-cap)
//      dV  += P^T dO, dK += dS^T Q          wgmma, A from registers (the accumulator layout of
//                                            S^T is the A fragment layout), B N-major
//      dS^T rounded to 16 bits into shared memory (128B swizzle, the layout a TMA box has),
//      both warpgroups meet on a named barrier, then each computes one 64 x 64 tile of
//      dQ_block = dS K (A = dS M-major, B = K N-major) and adds it to the f32 accumulator in
//      global memory with red.global.add (exact f32 sums; their order, hence the last bits,
//      depends on timing: deterministic calls take the tile kernels instead).
//    Two dS buffers alternate: a warpgroup writes buffer i only after the barrier of step i-1,
//    which the other warpgroup reaches only after its dQ product of step i-2 completed.
//  * dK, dV stay in registers over all query heads of the group (the GQA sum, no atomics) and
//    are stored once: dK * scale, dV; keys >= Nkv are not stored.
// DESIGN (WIDE, D = 256)
//  * dK and dV of 128 keys x 256 columns would need 256 f32 registers per consumer thread, so a
//    unit is a block of BKV = 64 keys, and the consumers split the work differently: for each
//    query block (BQ = 64 rows) consumer c computes S^T = K Q_c^T and dP^T = V dO_c^T for all
//    64 keys and its 32 query rows (m64n32 wgmma, both operands K-major), turns them into P^T
//    and dS^T, and writes both (16-bit) into two shared tiles [64 keys][64 rows] (128B swizzle).
//    After a named barrier each consumer owns half of the head dim: dV[:, c] += P^T dO[:, c],
//    dK[:, c] += dS^T Q[:, c] (A K-major from the tiles) and the dQ tile dQ[:, c] = dS K[:, c]
//    (A M-major from the dS^T tile), each m64n128, 64 registers per accumulator.
//  * dQ: by default the dQ kernel (kernel 4) recomputes S and dP from the query side and sums
//    dQ in registers: a step's dQ here is 64 KiB of f32 sums per 64 x 64 x 256 block, twice
//    the d = 128 kernel's per FLOP, and the reductions capped this kernel at 348 TFLOP/s (H100,
//    N = 8192; 650 with them left out), so 3/5 more MMAs without any cost less. With dQ here
//    (CALICO_ATTN_DQ_KERNEL 0; BULK_DQ):
//    too many for per-thread reductions, and no staging tiles fit beside K, V and two stages
//    of Q and dO (208 KiB). So after a second named
//    barrier (both consumers' MMAs of the step done) consumer 0 stages its 64 x 128 tile in
//    the step's Q slot and consumer 1 in its dO slot (32 KiB each, the finish kernel's tile
//    order), one thread of each adds it with one bulk reduction, and the slot goes back to the
//    producer once the reduction has read it (checked during the next step's S^T MMAs); the
//    other slot goes back at once. The accumulator is then in tile order: per query block of
//    64 rows, four 64 x 64 tiles of the head dim's column chunks. Without BULK_DQ the tile
//    goes out with red.global.add from registers while dK runs (the per-row finish kernel).
//  * One P^T / dS^T pair of tiles: a consumer overwrites them only after a named barrier
//    that the other consumer reaches after its MMAs of the step before (their readers)
//    completed: the staging barrier under BULK_DQ, else a second barrier per step.
// DESIGN (HEAD_SPLIT, CALICO_ATTN_HEAD_SPLIT 1)
//  * GQA / MQA with few units (B * Hkv * key blocks below the SM count) leaves most SMs idle:
//    each unit walks all `group` query heads alone. The host then picks `head_split` s (a
//    divisor of the group, hopper_bwd.rs head_split) and runs s CTAs per unit: part r walks
//    the query heads [r * group / s, (r + 1) * group / s) of the group. The work list is unit
//    by unit with the part fastest (w = unit * s + part, unit_at): a unit's parts run side by
//    side (its K / V tiles shared in L2, their dQ reductions on different heads' rows) and the
//    unit order (chunks, longest key blocks first, WALK_STAGGER) is the unsplit one.
//  * A part stores its dK and dV (f32, dK not yet scaled, all D columns, all 128 keys of the
//    block) to the workspace, [s, B * Hkv, nkv_pad, D] for dK then the same for dV (nkv_pad:
//    Nkv rounded up to 128; a block no row sees stores zeros). The combine kernel sums the
//    parts in order 0 .. s - 1 (the result does not depend on timing), scales dK and writes
//    dK and dV (keys < Nkv, the real head-dim columns) with 16-byte stores where alignment
//    allows. Without the define (s = 1) the main kernel is the one described above.
// EDGES
//  * Nq, Nkv not multiples of the blocks: TMA zero-fills Q/dO rows and K/V keys past the end;
//    padded rows have LSE = +inf (P = 0) and land in the padded part of the accumulator; keys
//    >= Nkv are masked. A key block that no row sees loads nothing and stores dK = dV = 0.
//  * Mask (bottom-right aligned, as the forward): row i sees key j iff j < Nkv and, with
//    c = i + Nkv - Nq, c - left <= j (left bounded) and j <= c + right (right bounded).
//  * Head dims below D (multiples of 8, CALICO_ATTN_PADDED): the maps span the real head dim,
//    so TMA fills Q, K, V and dO past it with zeros; S, dP and delta are unchanged, and dQ, dK
//    and dV come out zero there. The prepare kernel reads, and the stores write, only the real
//    columns; the workspace keeps D.
//  * Packed sequences (CALICO_ATTN_VARLEN): one batch of all the rows; key j of sequence b is
//    seen by that sequence's rows only, the mask aligned per sequence (packed_key_rows, a
//    binary search over the offsets per key, once per unit). A key block may span sequences:
//    it walks the query blocks from its first key's first row to its last key's last row, and
//    each key's row range drops the other sequences' rows.
//
// DEFINES (kernels/src/ops/attention/hopper_bwd.rs): CALICO_ATTN_KERNEL 0|1|2, CALICO_ATTN_T
// bf16|f16, CALICO_ATTN_D 64|128|256 (256: see WIDE), CALICO_ATTN_STAGES 2.., CALICO_ATTN_SOFTCAP 0|1,
// CALICO_ATTN_SCHED 1 (serial) | 2 (overlapped, see OVERLAP), CALICO_ATTN_BULK_DQ 0 | 1 (main
// and finish kernels: dQ tiles by bulk reductions, see BULK_DQ), CALICO_ATTN_WIDE_REGS 0 | 1
// (see PRODUCER_REGS), CALICO_ATTN_DEFER_DQ 0 | 1 (see DEFER_DQ), CALICO_ATTN_FTZ_EXP 0 | 1
// (see p_exp2), CALICO_ATTN_VARLEN 0 | 1 (main kernel: packed sequences, see EDGES),
// CALICO_ATTN_PADDED 0 | 1 (all four: `head_dim` below D, see EDGES), CALICO_ATTN_HEAD_SPLIT
// 0 | 1 (main kernel: see HEAD_SPLIT; kernel 3 is its combine kernel).
#include "calico/calico.h"
#include "calico/mbarrier.cuh"
#include "calico/pipeline.cuh"
#include "calico/tma.cuh"
#include "calico/warpgroup.cuh"
#include "calico/wgmma.cuh"
#include "attention/hopper_packed.cuh"

namespace attn_hopper_bwd {

using calico::uint32_t;
using calico::uint64_t;
using in_t = CALICO_ATTN_T;

constexpr int D = CALICO_ATTN_D;
#ifndef CALICO_ATTN_PADDED
#define CALICO_ATTN_PADDED 0
#endif
// A head dim below D (`head_dim`, a multiple of 8; see EDGES): only its columns are read from O
// and dO and written to dQ, dK and dV.
constexpr bool PADDED = CALICO_ATTN_PADDED != 0;
#if CALICO_ATTN_KERNEL == 0 || (CALICO_ATTN_KERNEL == 2 && !CALICO_ATTN_BULK_DQ) || CALICO_ATTN_KERNEL == 3
constexpr int ROW_THREADS = 256;  // prepare / finish: one warp per row; combine: D / 8 lanes per row
#endif

static_assert(sizeof(in_t) == 2, "16-bit inputs");
static_assert(D == 64 || D == 128 || D == 256, "head dim 64, 128 or 256");

#define ATTN_POS_INF __int_as_float(0x7f800000u)
#define ATTN_NEG_INF __int_as_float(0xff800000u)

}  // namespace attn_hopper_bwd

#if CALICO_ATTN_KERNEL == 0
// Rows r of [B * Hq, nq_pad] (the workspace's layout): r = (b * Hq + h) * nq_pad + i.
// o, d_o: element strides (batch, head, row); lse: f32 [B, Hq, Nq] contiguous.
// vec (O's and dO's bases and strides multiples of 8 elements): D / 8 lanes per row, each
// taking 8 elements of O and dO with one 16-byte load apiece and zeroing 8 floats of the
// accumulator with two 16-byte stores (rows = threads * 8 / D); else a warp per row with
// element loads (rows = warps). A row's sum goes in a fixed order either way.
CALICO_KERNEL void __launch_bounds__(attn_hopper_bwd::ROW_THREADS)
    calico_attention_hopper_bwd_prepare(const attn_hopper_bwd::in_t* o, long long o_sb, long long o_sh, long long o_sn,
                                        const attn_hopper_bwd::in_t* d_o, long long do_sb, long long do_sh, long long do_sn,
                                        const float* lse, float* lse_log2, float* delta, float* dq_acc, int q_heads, int q_len,
                                        int nq_pad, long long rows, int vec, int head_dim) {
    using namespace attn_hopper_bwd;
    constexpr float LOG2E = 1.4426950408889634f;
    const int lane = threadIdx.x % 32;
    if (vec) {
        constexpr int LANES = D / 8;
        using pair_t = typename calico::packed<in_t>::type;
        const int sub = lane % LANES;
        const long long r = ((long long)blockIdx.x * ROW_THREADS + threadIdx.x) / LANES;
        // Every lane stays for the shuffles; rows past the end only skip their memory work.
        const bool active = r < rows;
        float sum = 0.0f, l2 = ATTN_POS_INF;
        if (active) {
            const long long bh = r / nq_pad;
            const int i = (int)(r - bh * nq_pad);
            const long long b = bh / q_heads, h = bh - b * q_heads;
            float4* acc = reinterpret_cast<float4*>(dq_acc + r * D + 8 * sub);
            acc[0] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            acc[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (i < q_len) {
                // Padded head dims: the lanes past the real columns add nothing.
                if (!PADDED || 8 * sub < head_dim) {
                    const uint4 ov = *reinterpret_cast<const uint4*>(o + b * o_sb + h * o_sh + i * o_sn + 8 * sub);
                    const uint4 gv = *reinterpret_cast<const uint4*>(d_o + b * do_sb + h * do_sh + i * do_sn + 8 * sub);
                    const uint32_t ow[4] = {ov.x, ov.y, ov.z, ov.w};
                    const uint32_t gw[4] = {gv.x, gv.y, gv.z, gv.w};
#pragma unroll
                    for (int k = 0; k < 4; ++k) {
                        const float2 of = calico::unpack(*reinterpret_cast<const pair_t*>(&ow[k]));
                        const float2 gf = calico::unpack(*reinterpret_cast<const pair_t*>(&gw[k]));
                        sum += of.x * gf.x + of.y * gf.y;
                    }
                }
                if (sub == 0) {
                    const float l = lse[bh * q_len + i];
                    l2 = l == ATTN_NEG_INF ? ATTN_POS_INF : l * LOG2E;
                }
            }
        }
#pragma unroll
        for (int m = LANES / 2; m >= 1; m /= 2) sum += calico::shfl_xor(sum, m);
        if (active && sub == 0) {
            delta[r] = sum;
            lse_log2[r] = l2;
        }
        return;
    }
    const long long r = (long long)blockIdx.x * (ROW_THREADS / 32) + threadIdx.x / 32;
    if (r >= rows) return;
    const long long bh = r / nq_pad;
    const int i = (int)(r - bh * nq_pad);
    const long long b = bh / q_heads, h = bh - b * q_heads;
    float* acc = dq_acc + r * D;
#pragma unroll
    for (int k = 0; k < D / 32; ++k) acc[lane + 32 * k] = 0.0f;
    float sum = 0.0f, l2 = ATTN_POS_INF;
    if (i < q_len) {
        const attn_hopper_bwd::in_t* orow = o + b * o_sb + h * o_sh + i * o_sn;
        const attn_hopper_bwd::in_t* grow = d_o + b * do_sb + h * do_sh + i * do_sn;
#pragma unroll
        for (int k = 0; k < D / 32; ++k) {
            if (!PADDED || lane + 32 * k < head_dim) sum += calico::to_float(orow[lane + 32 * k]) * calico::to_float(grow[lane + 32 * k]);
        }
        const float l = lse[bh * q_len + i];
        l2 = l == ATTN_NEG_INF ? ATTN_POS_INF : l * LOG2E;
    }
#pragma unroll
    for (int m = 16; m >= 1; m /= 2) sum += calico::shfl_xor(sum, m);
    if (lane == 0) {
        delta[r] = sum;
        lse_log2[r] = l2;
    }
}
#endif

#if CALICO_ATTN_KERNEL == 2
#if CALICO_ATTN_BULK_DQ
// One block of 128 threads per 64 x 64 tile of the accumulator (two per query block of BQ
// rows: split along the head dim at d = 128, along the rows at d = 64; four along the head dim
// at d = 256), so that it reads and
// writes whole lines. Thread T holds what consumer thread T of the main kernel staged
// (stage_dq_tile): 32 floats at T * 32, its 16-byte pieces rotated by T % 8, taken as eight
// 16-byte loads; piece p holds columns 8p + 2t, +1 of the thread's rows g and g + 8 of its
// warp's 16 (the wgmma accumulator layout). The rows go out scaled, in the dtype, as whole
// 8-column chunks (calico::store_row: 16-byte stores) where dQ's base and strides allow, else
// as pairs or elements (store: calico::ROW_STORE_*). Rows >= Nq (the padded block's) are skipped.
// count: the tiles, B * Hq * nq_pad * D / 4096.
CALICO_KERNEL void __launch_bounds__(calico::WARPGROUP_THREADS)
    calico_attention_hopper_bwd_finish(const float* dq_acc, attn_hopper_bwd::in_t* dq, long long dq_sb, long long dq_sh,
                                       long long dq_sn, float scale, int q_heads, int q_len, int nq_pad, long long count,
                                       int store, int head_dim) {
    using namespace attn_hopper_bwd;
    constexpr int BQ = D == 64 ? 128 : 64;
    constexpr int TILES = BQ * D / (64 * 64);
    static_assert(TILES == 2 || (D == 256 && TILES == 4), "two 64 x 64 tiles per query block (four at d = 256)");
    const long long tile = blockIdx.x;
    if (tile >= count) return;
    const int thread = threadIdx.x;
    const int lane = thread % 32;
    const int g = lane / 4;
    const int t = lane % 4;
    const long long qblock = tile / TILES;
    const int c = (int)(tile % TILES);
    const int blocks = nq_pad / BQ;
    const long long bh = qblock / blocks;
    const int qb = (int)(qblock - bh * blocks);
    const float* src = dq_acc + (bh * nq_pad + (long long)qb * BQ) * D + c * 64 * 64 + thread * 32;
    float4 piece[8];
#pragma unroll
    for (int p = 0; p < 8; ++p) piece[p] = *reinterpret_cast<const float4*>(src + 4 * (p ^ (thread % 8)));
    const long long b = bh / q_heads, h = bh - b * q_heads;
    const int row0 = qb * BQ + (D == 64 ? 64 * c : 0) + 16 * (thread / 32) + g;
    const int col0 = D >= 128 ? 64 * c : 0;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int i = row0 + 8 * half;
        float2 v[8];
#pragma unroll
        for (int p = 0; p < 8; ++p) {
            v[p] = half ? make_float2(scale * piece[p].z, scale * piece[p].w) : make_float2(scale * piece[p].x, scale * piece[p].y);
        }
        in_t* row = dq + b * dq_sb + h * dq_sh + i * dq_sn + col0;
        if constexpr (PADDED) {
            calico::store_row_upto(row, v, t, store, i < q_len, head_dim - col0);
        } else {
            calico::store_row(row, v, t, store, i < q_len);
        }
    }
}
#else
// One warp per row r = (b * Hq + h) * Nq + i of dQ (count: the rows); store is not used.
CALICO_KERNEL void __launch_bounds__(attn_hopper_bwd::ROW_THREADS)
    calico_attention_hopper_bwd_finish(const float* dq_acc, attn_hopper_bwd::in_t* dq, long long dq_sb, long long dq_sh,
                                       long long dq_sn, float scale, int q_heads, int q_len, int nq_pad, long long count,
                                       int store, int head_dim) {
    using namespace attn_hopper_bwd;
    (void)store;
    const int lane = threadIdx.x % 32;
    const long long r = (long long)blockIdx.x * (ROW_THREADS / 32) + threadIdx.x / 32;
    if (r >= count) return;
    const long long bh = r / q_len;
    const int i = (int)(r - bh * q_len);
    const long long b = bh / q_heads, h = bh - b * q_heads;
    attn_hopper_bwd::in_t* out = dq + b * dq_sb + h * dq_sh + i * dq_sn;
    const float* acc = dq_acc + (bh * nq_pad + i) * D;
#pragma unroll
    for (int k = 0; k < D / 32; ++k) {
        if (!PADDED || lane + 32 * k < head_dim) out[lane + 32 * k] = calico::from_float<attn_hopper_bwd::in_t>(scale * acc[lane + 32 * k]);
    }
}
#endif
#endif

#if CALICO_ATTN_KERNEL == 3
namespace attn_hopper_bwd {

// Writes 8 consecutive columns (8-aligned) of a dK or dV row: one 16-byte store, four 4-byte
// pairs or eight elements, as `mode` (calico::ROW_STORE_*) allows.
CALICO_DEVICE void store_eight(in_t* at, const float (&v)[8], int mode) {
    if (mode == calico::ROW_STORE_CHUNKS) {
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = calico::pack_word<in_t>(v[2 * i], v[2 * i + 1]);
        calico::store_chunk(at, w);
    } else if (mode == calico::ROW_STORE_PAIRS) {
#pragma unroll
        for (int i = 0; i < 4; ++i) *reinterpret_cast<uint32_t*>(at + 2 * i) = calico::pack_word<in_t>(v[2 * i], v[2 * i + 1]);
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) at[i] = calico::from_float<in_t>(v[i]);
    }
}

// Adds the 8 floats (32 bytes, 16-byte aligned) at `src` to `acc`.
CALICO_DEVICE void add_eight(float (&acc)[8], const float* src) {
    const float4 a = *reinterpret_cast<const float4*>(src);
    const float4 b = *reinterpret_cast<const float4*>(src + 4);
    const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] += x[i];
}

}  // namespace attn_hopper_bwd

// HEAD_SPLIT's combine: D / 8 threads per key row r = (b * Hkv + hk) * Nkv + j (count: the
// rows times D / 8), each summing 8 columns of the `splits` f32 partials of dK and of dV
// (part: [splits, B * Hkv, nkv_pad, D] for dK, then the same for dV; `section` floats per
// part) in order, dK times `scale`, and storing them in the dtype (stores: dK's
// calico::ROW_STORE_* mode in bits 0-1, dV's in bits 2-3). Padded head dims: only the chunks
// below head_dim.
CALICO_KERNEL void __launch_bounds__(attn_hopper_bwd::ROW_THREADS)
    calico_attention_hopper_bwd_combine(const float* part, attn_hopper_bwd::in_t* dk, long long dk_sb, long long dk_sh,
                                        long long dk_sn, attn_hopper_bwd::in_t* dv, long long dv_sb, long long dv_sh,
                                        long long dv_sn, float scale, int kv_heads, int k_len, int nkv_pad, int splits,
                                        long long section, long long count, int stores, int head_dim) {
    using namespace attn_hopper_bwd;
    constexpr int LANES = D / 8;
    const long long idx = (long long)blockIdx.x * ROW_THREADS + threadIdx.x;
    if (idx >= count) return;
    const int c = (int)(idx % LANES);
    if (PADDED && 8 * c >= head_dim) return;
    const long long r = idx / LANES;
    const long long bh = r / k_len;
    const int j = (int)(r - bh * k_len);
    const long long b = bh / kv_heads, hk = bh - b * kv_heads;
    const float* src = part + (bh * nkv_pad + j) * D + 8 * c;
    const long long dv_at = (long long)splits * section;
    float k[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int s = 0; s < splits; ++s) {
        add_eight(k, src + s * section);
        add_eight(v, src + dv_at + s * section);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) k[i] *= scale;
    store_eight(dk + b * dk_sb + hk * dk_sh + j * dk_sn + 8 * c, k, stores & 3);
    store_eight(dv + b * dv_sb + hk * dv_sh + j * dv_sn + 8 * c, v, (stores >> 2) & 3);
}
#endif

#if CALICO_ATTN_KERNEL == 1 || CALICO_ATTN_KERNEL == 4
namespace attn_hopper_bwd {

constexpr int BQ = D == 64 ? 128 : 64;  // query rows per streamed block
// Head dim 256 (see WIDE): 64 keys per CTA, each consumer owning half the head dim.
constexpr bool WIDE = D == 256;
constexpr int BKV = WIDE ? 64 : 128;     // keys per CTA, 64 per consumer warpgroup (WIDE: 64 shared)
constexpr int STAGES = CALICO_ATTN_STAGES;
constexpr bool SOFTCAP = CALICO_ATTN_SOFTCAP != 0;
constexpr bool BULK_DQ = CALICO_ATTN_BULK_DQ != 0;
// Schedule 1 (serial): each MMA batch is waited for before the next step of the block.
// Schedule 2 (overlapped): P^T is computed while dP^T runs, and the dQ reductions while dK runs.
constexpr bool OVERLAP = CALICO_ATTN_SCHED == 2;
#ifndef CALICO_ATTN_VARLEN
#define CALICO_ATTN_VARLEN 0
#endif
// Packed sequences (see VARLEN in EDGES): the key and query bounds come from the offsets.
constexpr bool VARLEN = CALICO_ATTN_VARLEN != 0;
#ifndef CALICO_ATTN_HEAD_SPLIT
#define CALICO_ATTN_HEAD_SPLIT 0
#endif
// A unit's query heads over several CTAs, dK and dV to f32 partials (see HEAD_SPLIT).
constexpr bool HEAD_SPLIT = CALICO_ATTN_HEAD_SPLIT != 0;
// Masks as row ranges: blocks that need no mask run a P^T pass with no mask code at all, the
// others one select per element against the rows that see the thread's key (a branch per
// element, the form before session 8, kept ptxas from scheduling the exp2s together).
// dQ by bulk reductions: each consumer stages its dQ tile in shared memory and warp 1 of the
// producer warpgroup adds it to the accumulator with one cp.reduce.async.bulk (BULK_DQ).
constexpr int CHUNK = 64;  // 16-bit elements per 128-byte swizzled row
constexpr int CHUNKS = D / CHUNK;
constexpr int Q_BYTES = BQ * D * 2;
constexpr int KV_BYTES = BKV * D * 2;
constexpr int ROW_BYTES = BQ * 4;  // one block's LSE or delta
constexpr int DS_BYTES = BKV * BQ * 2;
constexpr int S_REGS = BQ / 2;      // S^T, dP^T: 64 keys x BQ rows per warpgroup
constexpr int ACC_REGS = D / 2;     // dK, dV: 64 keys x D
constexpr int DQ_REGS = 32;         // one 64 x 64 tile of dQ per warpgroup
constexpr int P_STEPS = BQ / 16;    // k-steps of dV += P^T dO
// WIDE: a consumer's S^T and dP^T are 64 keys x half the block's query rows; its dK, dV and
// dQ tile are half the head dim's columns.
constexpr int WIDE_ROWS = BQ / 2;
constexpr int WIDE_COLS = D / 2;
constexpr int WIDE_S_REGS = WIDE_ROWS / 2;
constexpr int WIDE_ACC_REGS = WIDE_COLS / 2;
constexpr int CONSUMERS = 2;
constexpr int THREADS = (CONSUMERS + 1) * calico::WARPGROUP_THREADS;
constexpr int RELEASES = CONSUMERS * calico::WARPGROUP_WARPS;  // lane 0 of each consumer warp
// The dQ warp (BULK_DQ) shares the producer's budget: give it room for its addresses, unless
// CALICO_ATTN_WIDE_REGS gives the consumers the most the CTA's 168 x 384 registers allow (the
// d128 consumers spill loop state at 232).
#ifndef CALICO_ATTN_WIDE_REGS
#define CALICO_ATTN_WIDE_REGS 0
#endif
// CALICO_ATTN_DEFER_DQ (overlapped schedule with bulk dQ): the consumers no longer meet on a
// named barrier every step. Each signals its half of dS^T written on an mbarrier (ds_full) and
// computes the dQ tile of a step one step later, when the other half has long been written;
// a dS buffer is rewritten once both consumers' dQ MMAs of its previous use completed
// (ds_empty). The last step's tile follows the unit's loop.
#ifndef CALICO_ATTN_DEFER_DQ
#define CALICO_ATTN_DEFER_DQ 0
#endif
constexpr bool DEFER_DQ = CALICO_ATTN_DEFER_DQ != 0;
static_assert(!DEFER_DQ || (OVERLAP && BULK_DQ), "deferred dQ needs the overlapped schedule and bulk dQ");
constexpr int PRODUCER_REGS = BULK_DQ && !WIDE && !CALICO_ATTN_WIDE_REGS ? 40 : 24;
constexpr int CONSUMER_REGS = BULK_DQ && !WIDE && !CALICO_ATTN_WIDE_REGS ? 232 : 240;
static_assert(PRODUCER_REGS * 128 + CONSUMER_REGS * 256 <= 168 * 384, "setmaxnreg within the launch registers");
constexpr int DS_BARRIER = 1;  // named barrier of the two consumer warpgroups

static_assert(STAGES >= 2, "at least two stages");
// dQ_block (BQ x D) is two 64 x 64 tiles, one per consumer: split along D at 128, along the
// query rows at 64 (WIDE: two 64 x 128 tiles, split along D).
static_assert(WIDE || BQ * D == CONSUMERS * 64 * 64, "one 64 x 64 dQ tile per consumer");
static_assert(!WIDE || (BQ == 64 && !DEFER_DQ), "WIDE: 64-row query blocks, no deferred dQ tiles");
// WIDE with BULK_DQ: a consumer stages its 64 x 128 dQ tile (32 KiB) in a Q or dO slot its step
// has finished with, and one bulk reduction adds it (see DESIGN (WIDE)).
#ifndef CALICO_ATTN_DQ_KERNEL
#define CALICO_ATTN_DQ_KERNEL 0
#endif
// WIDE with the dQ kernel (kernel 4, see DESIGN (DQ)): the main kernel computes dK and dV only.
constexpr bool WIDE_NO_DQ = WIDE && CALICO_ATTN_DQ_KERNEL;
static_assert(!CALICO_ATTN_DQ_KERNEL || WIDE, "the dQ kernel is the head-dim-256 backward's");
constexpr bool WIDE_BULK = WIDE && BULK_DQ && !WIDE_NO_DQ;
constexpr int WIDE_STAGE_BARRIER = 2;  // + consumer: a consumer's staging writes done

// Byte offsets in dynamic shared memory after rounding its base up to 1024.
constexpr int K_OFFSET = 0;
constexpr int V_OFFSET = K_OFFSET + KV_BYTES;
constexpr int Q_OFFSET = V_OFFSET + KV_BYTES;
constexpr int DO_OFFSET = Q_OFFSET + STAGES * Q_BYTES;
constexpr int DS_OFFSET = DO_OFFSET + STAGES * Q_BYTES;
constexpr int LSE_OFFSET = DS_OFFSET + 2 * DS_BYTES;
constexpr int DELTA_OFFSET = LSE_OFFSET + STAGES * ROW_BYTES;
constexpr int DQ_TILE_BYTES = 64 * 64 * 4;
constexpr int DQ_STAGE_OFFSET = DELTA_OFFSET + STAGES * ROW_BYTES;
constexpr int BAR_OFFSET = DQ_STAGE_OFFSET + (BULK_DQ && !WIDE ? CONSUMERS * DQ_TILE_BYTES : 0);
// Barriers: the Q ring, the dO ring, kv_full, kv_empty (DEFER_DQ: and ds_full, ds_empty). The
// host allocates SMEM_BYTES = 1024 + BAR_OFFSET + (4 * STAGES + 2 + (DEFER_DQ ? 4 : 0)) * 8.
// Named barriers of a consumer warpgroup (128 threads) and the dQ warp (32): staging tile full,
// staging tile empty.
constexpr int DQ_FULL_BARRIER = 2;   // + consumer
constexpr int DQ_EMPTY_BARRIER = 4;  // + consumer
constexpr int DQ_BARRIER_THREADS = calico::WARPGROUP_THREADS + 32;

struct barriers {
    calico::pipeline::ring<STAGES> q;
    calico::pipeline::ring<STAGES> d;
    calico::mbarrier kv_full;
    calico::mbarrier kv_empty;
#if CALICO_ATTN_DEFER_DQ
    calico::mbarrier ds_full[2];   // both consumers' halves of a dS^T buffer written
    calico::mbarrier ds_empty[2];  // both consumers' dQ MMAs reading it completed
#endif
};

struct params {
    int batch, q_heads, kv_heads, group, q_len, k_len, nq_pad, n_blocks;
    // HEAD_SPLIT: CTAs per unit, and the query heads each walks (1 and group without it).
    int split, part_heads;
    int has_left, has_right, walk;  // walk: WALK_STAGGER, and the chunk above it (unit_at)
    long long left, right;
    // Packed sequences (VARLEN): offsets of n_seqs sequences in one batch of all the rows.
    const int* cu_q;
    const int* cu_k;
    int n_seqs;
};

struct unit {
    int b, hk, n0;
    int part, hq0;   // HEAD_SPLIT: the part of the unit, its first query head in the group
    int m_lo, m_hi;  // query blocks [m_lo, m_hi) of each head; none when m_hi <= m_lo
    int rot;         // the walk over them starts at m_lo + rot and wraps around
    // VARLEN: the rows that see the block's last key start at vis_lo, those that see its first
    // key end at vis_hi (block_visible's bounds).
    int vis_lo, vis_hi;
};

// VARLEN: the query rows [lo, hi] (hi < lo: none) that see packed key j: the rows of j's
// sequence (a binary search over the key offsets) under the mask aligned per sequence. Both
// bounds grow with j (clamped inside the sequence's rows), as unit_at and block_visible need.
CALICO_DEVICE void packed_key_rows(const params& p, long long j, int& lo, int& hi) {
    using calico::attention::packed_offset;
    if (j < packed_offset(p.cu_k, 0, p.k_len)) {
        lo = 0;
        hi = -1;
        return;
    }
    if (j >= packed_offset(p.cu_k, p.n_seqs, p.k_len)) {
        lo = p.q_len;
        hi = p.q_len - 1;
        return;
    }
    const int a = calico::attention::packed_sequence(p.cu_k, p.n_seqs, p.k_len, j);
    const int q0 = packed_offset(p.cu_q, a, p.q_len);
    const long long lq = max(q0, packed_offset(p.cu_q, a + 1, p.q_len)) - q0;
    const int k0 = packed_offset(p.cu_k, a, p.k_len);
    const long long lk = max(k0, packed_offset(p.cu_k, a + 1, p.k_len)) - k0;
    const long long off = lk - lq;
    const long long jl = j - k0;
    long long l = p.has_right ? jl - off - p.right : 0;
    long long h = p.has_left ? jl - off + p.left : lq - 1;
    l = l < 0 ? 0 : (l > lq ? lq : l);
    h = h > lq - 1 ? lq - 1 : (h < -1 ? -1 : h);
    lo = q0 + (int)l;
    hi = q0 + (int)h;
}

// The query block of the unit's k-th step within a head.
CALICO_DEVICE int block_at(const unit& u, int k) {
    const int count = u.m_hi - u.m_lo;
    const int r = k + u.rot;
    return u.m_lo + (r >= count ? r - count : r);
}

// The order of the grid's units: chunks of C (batch, KV head) pairs (C = walk >> 1, at least
// 1), and inside a chunk every pair's first key block, then every pair's second, .. C = 1 is
// head by head, each head's key blocks first to last; a larger C starts more heads' first key
// blocks, which under a causal mask are their longest units (they see every query block), at
// the start. WALK_STAGGER rotates each key block's walk over the query blocks. HEAD_SPLIT:
// entry w is part w % split of the unit at w / split in that order.
constexpr int WALK_STAGGER = 1;

CALICO_DEVICE unit unit_at(const params& p, int w) {
    unit u;
    u.vis_lo = u.vis_hi = 0;
    u.part = 0;
    if constexpr (HEAD_SPLIT) {
        u.part = w % p.split;
        w /= p.split;
    }
    u.hq0 = u.part * p.part_heads;
    const int pairs = p.batch * p.kv_heads;
    const int chunk = max(1, min(p.walk >> 1, pairs));
    const int per_chunk = chunk * p.n_blocks;
    const int c = w / per_chunk;
    const int r = w - c * per_chunk;
    const int here = min(chunk, pairs - c * chunk);
    const int n = r / here;
    const int bh = c * chunk + (r - n * here);
    u.b = bh / p.kv_heads;
    u.hk = bh - u.b * p.kv_heads;
    u.n0 = n * BKV;
    const long long n1 = min(u.n0 + BKV, p.k_len);
    long long i_lo, i_hi;
    if constexpr (VARLEN) {
        // The first key's rows start lowest and the last key's end highest.
        int lo_first, hi_first, lo_last, hi_last;
        packed_key_rows(p, u.n0, lo_first, hi_first);
        packed_key_rows(p, n1 - 1, lo_last, hi_last);
        i_lo = lo_first;
        i_hi = hi_last;
        u.vis_lo = lo_last;
        u.vis_hi = hi_first;
    } else {
        // Rows that see a key of [n0, n1): c + right >= n0 and c - left <= n1 - 1, c = i + off.
        const long long off = (long long)p.k_len - p.q_len;
        i_lo = p.has_right ? u.n0 - off - p.right : 0;
        i_hi = p.has_left ? n1 - 1 - off + p.left : p.q_len - 1;
    }
    i_lo = i_lo < 0 ? 0 : i_lo;
    i_hi = i_hi > p.q_len - 1 ? p.q_len - 1 : i_hi;
    u.m_lo = (int)(i_lo / BQ);
    u.m_hi = i_hi >= i_lo ? (int)(i_hi / BQ) + 1 : u.m_lo;
    // Staggered: key blocks of a head start on different query blocks, so their dQ reductions
    // do not all hit the same rows at the same time.
    u.rot = (p.walk & WALK_STAGGER) && u.m_hi > u.m_lo ? n % (u.m_hi - u.m_lo) : 0;
    return u;
}

// Every (row, key) of the query block at m0 and the key block at n0 is visible.
CALICO_DEVICE bool block_visible(const params& p, const unit& u, long long m0, long long n0) {
    if constexpr (VARLEN) {
        // Bounds that grow with the key: the last key's first row and the first key's last row.
        return n0 + BKV <= p.k_len && m0 + BQ <= p.q_len && u.vis_lo <= m0 && u.vis_hi >= m0 + BQ - 1;
    }
    const long long off = (long long)p.k_len - p.q_len;
    return n0 + BKV <= p.k_len && m0 + BQ <= p.q_len && (!p.has_right || n0 + BKV - 1 <= m0 + off + p.right) &&
           (!p.has_left || n0 >= m0 + BQ - 1 + off - p.left);
}

// The query rows lo .. lo + count - 1 of the block at m0, relative to m0, that see key j.
struct row_range {
    int lo, count;
    // Column `col` of the block is one of them (one unsigned compare: col < lo wraps around).
    CALICO_DEVICE bool has(int col) const { return (unsigned)(col - lo) < (unsigned)count; }
};
// The rows of the block at m0 among the global rows [lo, hi] (hi < lo: none) that see a key.
CALICO_DEVICE row_range rows_in_block(long long lo, long long hi, long long m0) {
    lo -= m0;
    hi -= m0;
    lo = lo < 0 ? 0 : lo;
    hi = hi > BQ - 1 ? BQ - 1 : hi;
    row_range r;
    r.lo = lo > BQ ? BQ : (int)lo;
    r.count = hi < lo ? 0 : (int)(hi - lo + 1);
    return r;
}

CALICO_DEVICE row_range rows_seeing(const params& p, long long m0, long long j) {
    // Row i sees j iff i < Nq, j < Nkv, j >= c - left and j <= c + right (c = i + Nkv - Nq).
    const long long off = (long long)p.k_len - p.q_len;
    long long lo = p.has_right ? j - off - p.right : 0;
    long long hi = p.has_left ? j - off + p.left : p.q_len - 1;
    hi = hi > p.q_len - 1 ? p.q_len - 1 : hi;
    if (j >= p.k_len) hi = -1;
    return rows_in_block(lo, hi, m0);
}

// P = 2^x. CALICO_ATTN_FTZ_EXP: one MUFU.EX2 with results below 2^-126
// flushed to 0 (they vanish in any 16-bit P or dS anyway), instead of exp2f's range fix-up
// (a compare, a scale before and a square after each MUFU.EX2).
#ifndef CALICO_ATTN_FTZ_EXP
#define CALICO_ATTN_FTZ_EXP 0
#endif
CALICO_DEVICE float p_exp2(float x) {
#if CALICO_ATTN_FTZ_EXP
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
#else
    return calico::exp2_approx(x);
#endif
}

// A compile-time flag for generic lambdas (masked and unmasked passes).
template <bool B>
struct flag {
    static constexpr bool value = B;
};
// WIDE's element pass over S^T / dP^T: 0 P^T only, 1 P^T and dS^T together, 2 dS^T from P^T.
template <int K>
struct pass_kind {
    static constexpr int value = K;
};

// ---- WIDE (head dim 256): what the main kernel (keys as the tiles' rows) and the dQ kernel
// (query rows as the tiles' rows) share: a consumer's 64 x 32 score tiles, the element pass
// over them and the 16-bit tiles they go to.
static_assert(!WIDE || (BKV == 64 && BQ == 64), "WIDE tiles: 64 rows per 128-byte-row chunk");

// Issues the 16 k-steps of a 64 x 32 score tile over the head dim into `acc` (no fence, no
// commit): A = the 64 rows of a [chunk][64 rows][128 B] tile at `a`, B = 32 rows of such a
// tile from `b`, both K-major.
CALICO_DEVICE void wide_scores(float (&acc)[WIDE_S_REGS], uint32_t a, uint32_t b) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t at = (kk / 4) * 64 * 128 + (kk % 4) * 32;
        const uint64_t da = calico::wgmma::desc_advance(calico::wgmma::desc_kmajor_128b(a), at);
        const uint64_t db = calico::wgmma::desc_advance(calico::wgmma::desc_kmajor_128b(b), at);
        calico::wgmma::mma<in_t, WIDE_ROWS>::template ss<0>(acc, da, db, kk > 0 ? 1 : 0);
    }
}

// P and dS in place of the scores S and dP, whose two MMA batches (S, then dP) are the last
// committed; register i = 4j + 2hh + e. terms(j, hh, e, lse, delta) gives a register's LSE
// (base 2) and delta; visible(j, hh, e) whether its (key, row) pair is seen, asked only when
// `masked`. Without a soft-cap P is computed while dP is still running.
template <class Terms, class Visible>
CALICO_DEVICE void wide_probs(float (&s)[WIDE_S_REGS], float (&dp)[WIDE_S_REGS], bool masked, float score_scale, float cap_log2,
                              Terms&& terms, Visible&& visible) {
    auto pass = [&](auto mask, auto kind) {
#pragma unroll
        for (int j = 0; j < WIDE_ROWS / 8; ++j) {
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int i = 4 * j + 2 * hh + e;
                    float l, dl;
                    terms(j, hh, e, l, dl);
                    if constexpr (decltype(kind)::value != 2) {
                        float x = s[i], dcap = 1.0f;
                        if constexpr (SOFTCAP) {
                            const float th = tanhf(x * score_scale);
                            x = cap_log2 * th;
                            dcap = 1.0f - th * th;
                        } else {
                            x *= score_scale;
                        }
                        float pr = p_exp2(x - l);
                        if constexpr (decltype(mask)::value) pr = visible(j, hh, e) ? pr : 0.0f;
                        s[i] = pr;
                        if constexpr (decltype(kind)::value == 1) dp[i] = pr * (dp[i] - dl) * dcap;
                    } else {
                        dp[i] = s[i] * (dp[i] - dl);
                    }
                }
            }
        }
    };
    auto with_mask = [&](auto kind) {
        if (masked) {
            pass(flag<true>{}, kind);
        } else {
            pass(flag<false>{}, kind);
        }
    };
    if constexpr (!SOFTCAP) {
        calico::wgmma::wait_group<1>();
        calico::wgmma::fence_operands(s);
        with_mask(pass_kind<0>{});
        calico::wgmma::wait_group<0>();
        calico::wgmma::fence_operands(dp);
        pass(flag<false>{}, pass_kind<2>{});
    } else {
        calico::wgmma::wait_group<0>();
        calico::wgmma::fence_operands(s);
        calico::wgmma::fence_operands(dp);
        with_mask(pass_kind<1>{});
    }
}

// Writes a 64 x 32 register tile in 16 bits into columns [col0, col0 + 32) of a [64 rows][64
// columns] tile, 128B swizzle: element (r, c) at r * 128 + ((c / 8) ^ (r % 8)) * 16 + (c % 8) * 2.
CALICO_DEVICE void wide_store_tile(unsigned char* tile, const float (&v)[WIDE_S_REGS], int col0) {
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int row0 = 16 * calico::warpgroup_warp() + g;
#pragma unroll
    for (int j = 0; j < WIDE_ROWS / 8; ++j) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int at = (row0 + 8 * hh) * 128 + ((((col0 / 8) + j) ^ g) * 16) + 4 * t;
            *reinterpret_cast<uint32_t*>(tile + at) = calico::pack_word<in_t>(v[4 * j + 2 * hh], v[4 * j + 2 * hh + 1]);
        }
    }
}

// Adds two adjacent floats to global memory (8-byte aligned), result unused.
CALICO_DEVICE void red_add2(float* addr, float a, float b) {
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(addr), "f"(a), "f"(b) : "memory");
}

// Adds a warpgroup's 64 x (2 R) dQ tile (accumulator layout; 64 x 64, WIDE 64 x 128) to the
// f32 accumulator at `tile` (row stride D): exact f32 sums of every key block's share; rows
// past Nq land in the padding.
template <int R>
CALICO_DEVICE void add_dq_tile(const float (&dq)[R], float* tile, int warp) {
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        float* row = tile + (long long)(16 * warp + g + 8 * hh) * D + 2 * t;
#pragma unroll
        for (int j = 0; j < R / 4; ++j) red_add2(row + 8 * j, dq[4 * j + 2 * hh], dq[4 * j + 2 * hh + 1]);
    }
}

// Stages a warpgroup's 64 x 64 dQ tile for the bulk reduction: thread i's 32 registers are
// floats 32i..32i+31 of the tile (the order the finish kernel decodes), its eight 16-byte
// pieces rotated by i % 8 so that no two threads of a quarter-warp hit the same banks.
CALICO_DEVICE void stage_dq_tile(const float (&dq)[DQ_REGS], unsigned char* tile) {
    const int i = calico::warpgroup_thread();
    float4* mine = reinterpret_cast<float4*>(tile) + i * 8;
#pragma unroll
    for (int q = 0; q < 8; ++q) mine[q ^ (i % 8)] = make_float4(dq[4 * q], dq[4 * q + 1], dq[4 * q + 2], dq[4 * q + 3]);
}

// Keeps 16-bit A fragments in their registers until the wgmma reading them has completed
// (the compiler sees the asm consume them at issue and could reuse the registers).
template <int N>
CALICO_DEVICE void keep_fragments(uint32_t (&a)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(a[i][r])::"memory");
}

// Stores a warp's 16 keys x (2 R) columns of a register tile (accumulator layout; D columns,
// WIDE half of them from `base`) times `mul`, keys from key0; keys >= k_len skipped, and under
// PADDED the columns from `head_dim` (counted from `base`) on.
template <int R>
CALICO_DEVICE void store_keys(const float (&acc)[R], float mul, in_t* base, long long sn, bool pairs, long long key0, int k_len,
                              int head_dim) {
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const long long key = key0 + g + 8 * hh;
        float2 v[R / 4];
#pragma unroll
        for (int j = 0; j < R / 4; ++j) v[j] = make_float2(acc[4 * j + 2 * hh] * mul, acc[4 * j + 2 * hh + 1] * mul);
        const int mode = pairs ? calico::ROW_STORE_PAIRS : calico::ROW_STORE_ELEMENTS;
        if constexpr (PADDED) {
            calico::store_row_upto(base + key * sn, v, t, mode, key < k_len, head_dim);
        } else {
            calico::store_row(base + key * sn, v, t, mode, key < k_len);
        }
    }
}

// HEAD_SPLIT: stores a warp's 16 keys x (2 R) columns of a register tile as f32 at `base` (the
// warp's first key's row of a [keys, D] partial, WIDE offset to the warpgroup's half): 8-byte
// stores, a quad's four fill 32 bytes.
template <int R>
CALICO_DEVICE void store_partial(const float (&acc)[R], float* base) {
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        float* row = base + (long long)(g + 8 * hh) * D + 2 * t;
#pragma unroll
        for (int j = 0; j < R / 4; ++j) *reinterpret_cast<float2*>(row + 8 * j) = make_float2(acc[4 * j + 2 * hh], acc[4 * j + 2 * hh + 1]);
    }
}

}  // namespace attn_hopper_bwd
#endif

#if CALICO_ATTN_KERNEL == 1
// Parameters (kernels/src/ops/attention/hopper_bwd.rs builds them):
//  map_q, map_do: 4-D maps {D, Nq, Hq, B} (real strides), box {64, BQ, 1, 1}, 128B swizzle.
//  map_k, map_v: {D, Nkv, Hkv, B}, box {64, BKV, 1, 1}, 128B swizzle.
//  map_rows: 2-D map {B * Hq * nq_pad, 2} over the prepare kernel's f32 rows, LSE (base 2) at
//  index 0 and delta at 1 (back to back in the workspace), box {BQ, 1}, no swizzle: a TMA tensor
//  load like the Q and dO tiles (a non-tensor cp.async.bulk is reported as a race by
//  compute-sanitizer's racecheck even in a minimal correct kernel). dq_acc f32 [B * Hq, nq_pad, D].
//  dk, dv: first elements and element strides (head dim contiguous); pairs bit 0 / 1: dk / dv
//  base and strides even (2-element stores).
//  scale: the softmax scale (multiplies dK here, dQ in the finish kernel); score_scale and
//  cap_log2 as the forward's. left/right: window sides (flags say whether each is bounded).
//  walk: WALK_STAGGER (bit 0) rotates each key block's walk over the query blocks; walk >> 1
//  pairs of (batch, KV head) per chunk of the unit order (see unit_at).
//  dkv_part, head_split (HEAD_SPLIT): the f32 partials ([head_split, B * Hkv, nkv_pad, D]
//  for dK, then for dV) and the CTAs per unit; dk, dv and pairs are not used then.
CALICO_KERNEL void __launch_bounds__(attn_hopper_bwd::THREADS, 1)
    calico_attention_hopper_bwd(const __grid_constant__ calico::tensor_map map_q, const __grid_constant__ calico::tensor_map map_k,
                                const __grid_constant__ calico::tensor_map map_v, const __grid_constant__ calico::tensor_map map_do,
                                const __grid_constant__ calico::tensor_map map_rows, float* dq_acc, attn_hopper_bwd::in_t* dk,
                                attn_hopper_bwd::in_t* dv, int batch, int q_heads, int group, int q_len, int k_len, int nq_pad,
                                long long dk_sb, long long dk_sh, long long dk_sn, long long dv_sb, long long dv_sh, long long dv_sn,
                                int pairs, float scale, float score_scale, float cap_log2, int has_left, long long left,
                                int has_right, long long right, int walk, const int* cu_q, const int* cu_k,
                                int n_seqs, int head_dim, float* dkv_part, int head_split) {
    using namespace attn_hopper_bwd;
    namespace pl = calico::pipeline;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024 - (calico::smem_addr(smem_raw) & 1023)) & 1023);
    barriers& bars = *reinterpret_cast<barriers*>(smem + BAR_OFFSET);

    params p;
    p.batch = batch;
    p.q_heads = q_heads;
    p.kv_heads = q_heads / group;
    p.group = group;
    p.q_len = q_len;
    p.k_len = k_len;
    p.nq_pad = nq_pad;
    p.n_blocks = (k_len + BKV - 1) / BKV;
    p.has_left = has_left;
    p.has_right = has_right;
    p.left = left;
    p.right = right;
    p.walk = walk;
    p.cu_q = cu_q;
    p.cu_k = cu_k;
    p.n_seqs = n_seqs;
    p.split = HEAD_SPLIT ? head_split : 1;
    p.part_heads = HEAD_SPLIT ? group / p.split : group;
    const int work = batch * p.kv_heads * p.n_blocks * p.split;

    if (threadIdx.x == 0) {
        bars.q.init(RELEASES);
        bars.d.init(RELEASES);
        calico::init(bars.kv_full, 1);
        calico::init(bars.kv_empty, RELEASES);
#if CALICO_ATTN_DEFER_DQ
        for (int b = 0; b < 2; ++b) {
            calico::init(bars.ds_full[b], CONSUMERS * calico::WARPGROUP_THREADS);
            calico::init(bars.ds_empty[b], RELEASES);
        }
#endif
        calico::fence_barrier_init();
    }
    __syncthreads();

    // Each thread keeps only its role's copies of these.
    pl::cursor<STAGES> qc, dc;
    uint32_t kv_loads = 0;
#if CALICO_ATTN_DEFER_DQ
    pl::cursor<2> dsc;  // dS^T buffers used, across units
#endif

    auto produce = [&](int w) {
        const unit u = unit_at(p, w);
        if (u.m_hi <= u.m_lo) return;
        if (kv_loads == 0) {
            calico::tma::prefetch(map_q);
            calico::tma::prefetch(map_k);
            calico::tma::prefetch(map_v);
            calico::tma::prefetch(map_do);
            calico::tma::prefetch(map_rows);
        }
        calico::wait(bars.kv_empty, (kv_loads & 1u) ^ 1u);
        calico::arrive_expect_tx(bars.kv_full, 2 * KV_BYTES);
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            calico::tma::load_4d(smem + K_OFFSET + c * BKV * 128, map_k, c * CHUNK, u.n0, u.hk, u.b, bars.kv_full);
            calico::tma::load_4d(smem + V_OFFSET + c * BKV * 128, map_v, c * CHUNK, u.n0, u.hk, u.b, bars.kv_full);
        }
        ++kv_loads;
        for (int hq = 0; hq < p.part_heads; ++hq) {
            const int h = u.hk * p.group + u.hq0 + hq;
            const long long row0 = ((long long)u.b * p.q_heads + h) * p.nq_pad;
            for (int k = 0; k < u.m_hi - u.m_lo; ++k) {
                const int m = block_at(u, k);
                calico::mbarrier& qb = bars.q.acquire(qc, Q_BYTES + ROW_BYTES);
                unsigned char* qd = smem + Q_OFFSET + qc.slot() * Q_BYTES;
#pragma unroll
                for (int c = 0; c < CHUNKS; ++c) calico::tma::load_4d(qd + c * BQ * 128, map_q, c * CHUNK, m * BQ, h, u.b, qb);
                calico::tma::load_2d(smem + LSE_OFFSET + qc.slot() * ROW_BYTES, map_rows, (int)(row0 + m * BQ), 0, qb);
                qc.advance();
                calico::mbarrier& db = bars.d.acquire(dc, Q_BYTES + ROW_BYTES);
                unsigned char* dd = smem + DO_OFFSET + dc.slot() * Q_BYTES;
#pragma unroll
                for (int c = 0; c < CHUNKS; ++c) calico::tma::load_4d(dd + c * BQ * 128, map_do, c * CHUNK, m * BQ, h, u.b, db);
                calico::tma::load_2d(smem + DELTA_OFFSET + dc.slot() * ROW_BYTES, map_rows, (int)(row0 + m * BQ), 1, db);
                dc.advance();
            }
        }
    };

#if CALICO_ATTN_D != 256
    auto consume = [&](int consumer, int w) {
        const unit u = unit_at(p, w);
        const int warp = calico::warpgroup_warp();
        const int lane = threadIdx.x % 32;
        const int g = lane / 4;
        const int t = lane % 4;
        // This warpgroup's keys within the block, and this thread's first key.
        const int wg_key0 = consumer * 64;
        const int key_in_block = wg_key0 + 16 * warp + g;  // and + 8
        // The dQ tile of this warpgroup: query chunk and head-dim chunk of the block.
        const int dq_rows = BQ == 128 ? consumer : 0;
        const int dq_cols = D == 128 ? consumer : 0;

        // The dQ tile of a query block starting at accumulator row `first_row`: reductions from
        // registers, or staged for the dQ warp.
        auto hand_over_dq = [&](const float (&dq)[DQ_REGS], long long first_row) {
            if constexpr (BULK_DQ) {
                calico::named_barrier_sync(DQ_EMPTY_BARRIER + consumer, DQ_BARRIER_THREADS);
                stage_dq_tile(dq, smem + DQ_STAGE_OFFSET + consumer * DQ_TILE_BYTES);
                calico::fence_proxy_async();
                calico::named_barrier_arrive(DQ_FULL_BARRIER + consumer, DQ_BARRIER_THREADS);
            } else {
                add_dq_tile(dq, dq_acc + (first_row + dq_rows * 64) * D + dq_cols * 64, warp);
            }
        };

        float dk_acc[ACC_REGS], dv_acc[ACC_REGS];
#pragma unroll
        for (int i = 0; i < ACC_REGS; ++i) {
            dk_acc[i] = 0.0f;
            dv_acc[i] = 0.0f;
        }
        // VARLEN: the global rows that see this thread's two keys, found once per unit.
        int key_lo[2] = {0, 0}, key_hi[2] = {-1, -1};
        if constexpr (VARLEN) {
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) packed_key_rows(p, u.n0 + key_in_block + 8 * hh, key_lo[hh], key_hi[hh]);
        }

        if (u.m_hi > u.m_lo) {
            calico::wait(bars.kv_full, kv_loads & 1u);
            ++kv_loads;
            const uint32_t k_wg = calico::smem_addr(smem + K_OFFSET) + wg_key0 * 128;
            const uint32_t v_wg = calico::smem_addr(smem + V_OFFSET) + wg_key0 * 128;
            const uint32_t k_dq = calico::smem_addr(smem + K_OFFSET) + dq_cols * BKV * 128;
            const uint32_t q_base = calico::smem_addr(smem + Q_OFFSET);
            const uint32_t do_base = calico::smem_addr(smem + DO_OFFSET);
            const uint32_t ds_base = calico::smem_addr(smem + DS_OFFSET);
#if CALICO_ATTN_DEFER_DQ
            // The step whose dQ tile is still to be computed: its dS^T buffer and phase.
            bool dq_pending = false;
            int pending_buf = 0;
            uint32_t pending_parity = 0;
            // Waits for both halves of the pending step's dS^T and issues its dQ tile into
            // `tile` (one commit group). The tile's registers live only from here to
            // finish_pending_dq, inside one step. With no pending step (a unit's first), the
            // same MMAs run on K (stable for the whole unit) and their result is dropped: a
            // wgmma batch issued on one path only makes ptxas serialize every wgmma.
            auto issue_pending_dq = [&](float (&dq_acc_tile)[DQ_REGS]) {
                if (dq_pending) calico::wait(bars.ds_full[pending_buf], pending_parity);
                const uint32_t ds_tile = dq_pending ? ds_base + pending_buf * DS_BYTES + dq_rows * BKV * 128 : k_dq;
                calico::wgmma::fence();
#pragma unroll
                for (int kk = 0; kk < BKV / 16; ++kk) {
                    const uint64_t a = calico::wgmma::desc_advance(calico::wgmma::desc_mnmajor_128b(ds_tile, BKV), kk * 16 * 128);
                    const uint64_t b = calico::wgmma::desc_advance(calico::wgmma::desc_mnmajor_128b(k_dq, BKV), kk * 16 * 128);
                    calico::wgmma::mma<in_t, 64>::template ss<1, 1>(dq_acc_tile, a, b, kk > 0 ? 1 : 0);
                }
                calico::wgmma::commit_group();
            };
            // After the wait that covers the pending dQ tile: free its buffer, hand the tile over.
            auto finish_pending_dq = [&](float (&dq_acc_tile)[DQ_REGS]) {
                calico::wgmma::fence_operands(dq_acc_tile);
                if (lane == 0) calico::arrive(bars.ds_empty[pending_buf]);
                hand_over_dq(dq_acc_tile, 0);
                dq_pending = false;
            };
#endif
            int step = 0;
            for (int hq = 0; hq < p.part_heads; ++hq) {
                const int h = u.hk * p.group + u.hq0 + hq;
                const long long row0 = ((long long)u.b * p.q_heads + h) * p.nq_pad;
                for (int k = 0; k < u.m_hi - u.m_lo; ++k, ++step) {
                    const int m0 = block_at(u, k) * BQ;
                    float s[S_REGS], dp[S_REGS], dq[DQ_REGS];
                    // S^T = K Q^T.
                    bars.q.wait_full(qc);
                    const uint32_t q_slot = q_base + qc.slot() * Q_BYTES;
                    calico::wgmma::fence();
#pragma unroll
                    for (int kk = 0; kk < D / 16; ++kk) {
                        const uint64_t da = calico::wgmma::desc_advance(calico::wgmma::desc_kmajor_128b(k_wg), (kk / 4) * BKV * 128 + (kk % 4) * 32);
                        const uint64_t db = calico::wgmma::desc_advance(calico::wgmma::desc_kmajor_128b(q_slot), (kk / 4) * BQ * 128 + (kk % 4) * 32);
                        calico::wgmma::mma<in_t, BQ>::template ss<0>(s, da, db, kk > 0 ? 1 : 0);
                    }
                    calico::wgmma::commit_group();
                    // dP^T = V dO^T.
                    bars.d.wait_full(dc);
                    const uint32_t do_slot = do_base + dc.slot() * Q_BYTES;
                    calico::wgmma::fence();
#pragma unroll
                    for (int kk = 0; kk < D / 16; ++kk) {
                        const uint64_t da = calico::wgmma::desc_advance(calico::wgmma::desc_kmajor_128b(v_wg), (kk / 4) * BKV * 128 + (kk % 4) * 32);
                        const uint64_t db = calico::wgmma::desc_advance(calico::wgmma::desc_kmajor_128b(do_slot), (kk / 4) * BQ * 128 + (kk % 4) * 32);
                        calico::wgmma::mma<in_t, BQ>::template ss<0>(dp, da, db, kk > 0 ? 1 : 0);
                    }
                    calico::wgmma::commit_group();

                    // P^T and dS^T in place of S^T and dP^T. Columns are query rows.
                    const float* lse_s = reinterpret_cast<const float*>(smem + LSE_OFFSET + qc.slot() * ROW_BYTES);
                    const float* delta_s = reinterpret_cast<const float*>(smem + DELTA_OFFSET + dc.slot() * ROW_BYTES);
                    const bool need_mask = !block_visible(p, u, m0, u.n0);
                    // The rows that see this thread's two keys (masked blocks only).
                    row_range seen[2] = {{0, BQ}, {0, BQ}};
                    if (need_mask) {
#pragma unroll
                        for (int hh = 0; hh < 2; ++hh) {
                            seen[hh] = VARLEN ? rows_in_block(key_lo[hh], key_hi[hh], m0)
                                              : rows_seeing(p, m0, u.n0 + key_in_block + 8 * hh);
                        }
                    }
                    // P^T with the mask as a select per element, or (unmasked blocks) none.
                    auto masked_p = [&](auto masked, float pr, int col, int hh) {
                        if constexpr (decltype(masked)::value) {
                            return seen[hh].has(col) ? pr : 0.0f;
                        }
                        return pr;
                    };
                    // Runs pass(flag<need_mask>): each block kind gets its own branch-free copy.
                    auto with_mask = [&](auto&& pass) {
                        if (need_mask) {
                            pass(flag<true>{});
                        } else {
                            pass(flag<false>{});
                        }
                    };
                    if constexpr (OVERLAP && !SOFTCAP) {
                        // P^T while dP^T is still being computed, then dS^T.
                        calico::wgmma::wait_group<1>();
                        calico::wgmma::fence_operands(s);
                        with_mask([&](auto masked) {
#pragma unroll
                            for (int j = 0; j < BQ / 8; ++j) {
                                const int col = 8 * j + 2 * t;
                                const float2 l = *reinterpret_cast<const float2*>(lse_s + col);
#pragma unroll
                                for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
                                    for (int e = 0; e < 2; ++e) {
                                        const int i = 4 * j + 2 * hh + e;
                                        s[i] = masked_p(masked, p_exp2(s[i] * score_scale - (e ? l.y : l.x)), col + e, hh);
                                    }
                                }
                            }
                        });
                        calico::wgmma::wait_group<0>();
                        calico::wgmma::fence_operands(dp);
#pragma unroll
                        for (int j = 0; j < BQ / 8; ++j) {
                            const float2 dl = *reinterpret_cast<const float2*>(delta_s + 8 * j + 2 * t);
#pragma unroll
                            for (int hh = 0; hh < 2; ++hh) {
                                dp[4 * j + 2 * hh] = s[4 * j + 2 * hh] * (dp[4 * j + 2 * hh] - dl.x);
                                dp[4 * j + 2 * hh + 1] = s[4 * j + 2 * hh + 1] * (dp[4 * j + 2 * hh + 1] - dl.y);
                            }
                        }
                    } else {
                        calico::wgmma::wait_group<0>();
                        calico::wgmma::fence_operands(s);
                        calico::wgmma::fence_operands(dp);
                        with_mask([&](auto masked) {
#pragma unroll
                            for (int j = 0; j < BQ / 8; ++j) {
                                const int col = 8 * j + 2 * t;
                                const float2 l = *reinterpret_cast<const float2*>(lse_s + col);
                                const float2 dl = *reinterpret_cast<const float2*>(delta_s + col);
#pragma unroll
                                for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
                                    for (int e = 0; e < 2; ++e) {
                                        const int i = 4 * j + 2 * hh + e;
                                        float x = s[i], dcap = 1.0f;
                                        if constexpr (SOFTCAP) {
                                            const float th = tanhf(x * score_scale);
                                            x = cap_log2 * th;
                                            dcap = 1.0f - th * th;
                                        } else {
                                            x *= score_scale;
                                        }
                                        const float pr = masked_p(masked, p_exp2(x - (e ? l.y : l.x)), col + e, hh);
                                        s[i] = pr;
                                        dp[i] = pr * (dp[i] - (e ? dl.y : dl.x)) * dcap;
                                    }
                                }
                            }
                        });
                    }
                    // 16-bit A fragments: k-step kk covers query rows 16kk..16kk+15.
                    uint32_t pa[P_STEPS][4], da[P_STEPS][4];
#pragma unroll
                    for (int kk = 0; kk < P_STEPS; ++kk) {
#pragma unroll
                        for (int r = 0; r < 4; ++r) {
                            pa[kk][r] = calico::pack_word<in_t>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
                            da[kk][r] = calico::pack_word<in_t>(dp[8 * kk + 2 * r], dp[8 * kk + 2 * r + 1]);
                        }
                    }
                    // dS^T to shared memory, [query chunk][key][64 queries], 128B swizzle:
                    // element (key, col) of a chunk at key * 128 + ((col / 8) ^ (key % 8)) * 16.
#if CALICO_ATTN_DEFER_DQ
                    auto store_ds_into = [&](int buf) {
                        unsigned char* ds_buf = smem + DS_OFFSET + buf * DS_BYTES;
#pragma unroll
                        for (int j = 0; j < BQ / 8; ++j) {
#pragma unroll
                            for (int hh = 0; hh < 2; ++hh) {
                                const int key = key_in_block + 8 * hh;
                                unsigned char* at = ds_buf + (j / 8) * BKV * 128 + key * 128 + (((j % 8) ^ g) * 16) + 4 * t;
                                *reinterpret_cast<uint32_t*>(at) = da[j / 2][2 * (j % 2) + hh];
                            }
                        }
                        calico::fence_proxy_async();
                    };
#endif
                    auto store_ds = [&]() {
                        unsigned char* ds_buf = smem + DS_OFFSET + (step & 1) * DS_BYTES;
#pragma unroll
                        for (int j = 0; j < BQ / 8; ++j) {
#pragma unroll
                            for (int hh = 0; hh < 2; ++hh) {
                                const int key = key_in_block + 8 * hh;
                                unsigned char* at = ds_buf + (j / 8) * BKV * 128 + key * 128 + (((j % 8) ^ g) * 16) + 4 * t;
                                *reinterpret_cast<uint32_t*>(at) = da[j / 2][2 * (j % 2) + hh];
                            }
                        }
                        calico::fence_proxy_async();
                    };

                    // The three MMA batches of a step (issued, not committed): dV += P^T dO and
                    // dK += dS^T Q with A from registers and B N-major (head dim contiguous), and
                    // the dQ tile = dS K over all 128 keys from the dS^T tile in shared memory.
                    auto issue_dv = [&] {
#pragma unroll
                        for (int kk = 0; kk < P_STEPS; ++kk) {
                            const uint64_t db = calico::wgmma::desc_advance(calico::wgmma::desc_mnmajor_128b(do_slot, BQ), kk * 16 * 128);
                            calico::wgmma::mma<in_t, D>::template rs<1>(dv_acc, pa[kk], db, 1);
                        }
                    };
                    auto issue_dk = [&] {
#pragma unroll
                        for (int kk = 0; kk < P_STEPS; ++kk) {
                            const uint64_t db = calico::wgmma::desc_advance(calico::wgmma::desc_mnmajor_128b(q_slot, BQ), kk * 16 * 128);
                            calico::wgmma::mma<in_t, D>::template rs<1>(dk_acc, da[kk], db, 1);
                        }
                    };
                    auto issue_dq = [&](uint32_t ds_tile) {
#pragma unroll
                        for (int kk = 0; kk < BKV / 16; ++kk) {
                            const uint64_t a = calico::wgmma::desc_advance(calico::wgmma::desc_mnmajor_128b(ds_tile, BKV), kk * 16 * 128);
                            const uint64_t b = calico::wgmma::desc_advance(calico::wgmma::desc_mnmajor_128b(k_dq, BKV), kk * 16 * 128);
                            calico::wgmma::mma<in_t, 64>::template ss<1, 1>(dq, a, b, kk > 0 ? 1 : 0);
                        }
                    };

                    if constexpr (OVERLAP) {
                        // dV += P^T dO, then (both dS^T halves written) the dQ tile, then
                        // dK += dS^T Q; the dQ reductions run while dK is computed.
                        calico::wgmma::fence_operands(dv_acc);
                        calico::wgmma::fence();
                        issue_dv();
                        calico::wgmma::commit_group();
#if CALICO_ATTN_DEFER_DQ
                        {
                            // This step's dS^T half into its buffer once the buffer is free,
                            // then the previous step's dQ tile, then dK.
                            const int buf = dsc.slot();
                            calico::wait(bars.ds_empty[buf], dsc.parity() ^ 1u);
                            store_ds_into(buf);
                            calico::arrive(bars.ds_full[buf]);
                            const bool had_pending = dq_pending;
                            issue_pending_dq(dq);
                            calico::wgmma::fence_operands(dk_acc);
                            calico::wgmma::fence();
                            issue_dk();
                            calico::wgmma::commit_group();
                            calico::wgmma::wait_group<1>();  // dV and the pending dQ tile done
                            calico::wgmma::fence_operands(dv_acc);
                            keep_fragments(pa);
                            if (lane == 0) bars.d.release(dc);  // dO's last reader was dV
                            dc.advance();
                            if (had_pending) {
                                calico::wgmma::fence_operands(dq);
                                finish_pending_dq(dq);
                            }
                            calico::wgmma::wait_group<0>();
                            calico::wgmma::fence_operands(dk_acc);
                            keep_fragments(da);
                            if (lane == 0) bars.q.release(qc);
                            qc.advance();
                            dq_pending = true;
                            pending_buf = buf;
                            pending_parity = dsc.parity();
                            dsc.advance();
                            continue;
                        }
#endif
                        store_ds();
                        calico::named_barrier_sync(DS_BARRIER, CONSUMERS * calico::WARPGROUP_THREADS);
                        const uint32_t ds_tile = ds_base + (step & 1) * DS_BYTES + dq_rows * BKV * 128;
                        calico::wgmma::fence();
                        issue_dq(ds_tile);
                        calico::wgmma::commit_group();
                        calico::wgmma::fence_operands(dk_acc);
                        calico::wgmma::fence();
                        issue_dk();
                        calico::wgmma::commit_group();
                        calico::wgmma::wait_group<1>();  // dV and the dQ tile done
                        calico::wgmma::fence_operands(dv_acc);
                        calico::wgmma::fence_operands(dq);
                        keep_fragments(pa);
                        if (lane == 0) bars.d.release(dc);  // dO's last reader was dV
                        dc.advance();
                        hand_over_dq(dq, row0 + m0);
                        calico::wgmma::wait_group<0>();
                        calico::wgmma::fence_operands(dk_acc);
                        keep_fragments(da);
                        if (lane == 0) bars.q.release(qc);
                        qc.advance();
                        continue;
                    }
                    store_ds();
                    // dV += P^T dO, dK += dS^T Q (B operands N-major: head dim contiguous).
                    calico::wgmma::fence_operands(dv_acc);
                    calico::wgmma::fence_operands(dk_acc);
                    calico::wgmma::fence();
                    issue_dv();
                    issue_dk();
                    calico::wgmma::commit_group();

                    // Both halves of dS^T written: dQ tile = dS K over all 128 keys.
                    calico::named_barrier_sync(DS_BARRIER, CONSUMERS * calico::WARPGROUP_THREADS);
                    const uint32_t ds_tile = ds_base + (step & 1) * DS_BYTES + dq_rows * BKV * 128;
                    calico::wgmma::fence();
                    issue_dq(ds_tile);
                    calico::wgmma::commit_group();
                    calico::wgmma::wait_group<0>();
                    calico::wgmma::fence_operands(dv_acc);
                    calico::wgmma::fence_operands(dk_acc);
                    calico::wgmma::fence_operands(dq);
                    keep_fragments(pa);
                    keep_fragments(da);
                    if (lane == 0) {
                        bars.q.release(qc);
                        bars.d.release(dc);
                    }
                    qc.advance();
                    dc.advance();

                    hand_over_dq(dq, row0 + m0);
                }
            }
#if CALICO_ATTN_DEFER_DQ
            // The last step's dQ tile (it reads K: before K and V are handed back).
            {
                // Every unit that gets here ran at least one step, so a tile is pending.
                float dq[DQ_REGS];
                issue_pending_dq(dq);
                calico::wgmma::wait_group<0>();
                finish_pending_dq(dq);
            }
#endif
            if (lane == 0) calico::arrive(bars.kv_empty);
        }

        const long long key0 = (long long)u.n0 + wg_key0 + 16 * warp;
        if constexpr (HEAD_SPLIT) {
            // This part's partials: all 128 keys of the block (the section's rows are padded).
            const long long bhs = (long long)batch * p.kv_heads;
            const long long nkv_pad = (long long)p.n_blocks * BKV;
            const long long section = bhs * nkv_pad * D;
            float* at = dkv_part + (((long long)u.part * bhs + (long long)u.b * p.kv_heads + u.hk) * nkv_pad + key0) * D;
            store_partial(dk_acc, at);
            store_partial(dv_acc, at + p.split * section);
        } else {
            store_keys(dk_acc, scale, dk + u.b * dk_sb + u.hk * dk_sh, dk_sn, (pairs & 1) != 0, key0, p.k_len, head_dim);
            store_keys(dv_acc, 1.0f, dv + u.b * dv_sb + u.hk * dv_sh, dv_sn, (pairs & 2) != 0, key0, p.k_len, head_dim);
        }
    };
#else
    // WIDE (head dim 256; see DESIGN (WIDE)): consumer c computes S^T and dP^T for the block's
    // 64 keys and its half of the step's query rows, writes P^T and dS^T into the shared tiles,
    // and after both halves are in, dV, dK and the dQ tile for its half of the head dim.
    auto consume = [&](int consumer, int w) {
        const unit u = unit_at(p, w);
        const int warp = calico::warpgroup_warp();
        const int lane = threadIdx.x % 32;
        const int g = lane / 4;
        const int t = lane % 4;
        const int key_in_block = 16 * warp + g;        // and + 8
        const int row_half = consumer * WIDE_ROWS;     // S^T / dP^T columns: query rows of a block
        const int col_half = consumer * WIDE_COLS;     // dK, dV, dQ columns: the head dim
        float dk_acc[WIDE_ACC_REGS], dv_acc[WIDE_ACC_REGS];
#pragma unroll
        for (int i = 0; i < WIDE_ACC_REGS; ++i) {
            dk_acc[i] = 0.0f;
            dv_acc[i] = 0.0f;
        }
        int key_lo[2] = {0, 0}, key_hi[2] = {-1, -1};
        if constexpr (VARLEN) {
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) packed_key_rows(p, u.n0 + key_in_block + 8 * hh, key_lo[hh], key_hi[hh]);
        }

        if (u.m_hi > u.m_lo) {
            calico::wait(bars.kv_full, kv_loads & 1u);
            ++kv_loads;
            const uint32_t k_base = calico::smem_addr(smem + K_OFFSET);
            const uint32_t v_base = calico::smem_addr(smem + V_OFFSET);
            const uint32_t k_half = k_base + (col_half / CHUNK) * BKV * 128;  // K's 64-column chunks of this half
            const uint32_t q_base = calico::smem_addr(smem + Q_OFFSET);
            const uint32_t do_base = calico::smem_addr(smem + DO_OFFSET);
            const uint32_t p_tile = calico::smem_addr(smem + DS_OFFSET);
            const uint32_t ds_tile = p_tile + DS_BYTES;
            // [key][64 query rows], 128B swizzle: element (key, col) at key * 128 + ((col / 8) ^ (key % 8)) * 16.
            unsigned char* const p_buf = smem + DS_OFFSET;
            unsigned char* const ds_buf = smem + DS_OFFSET + DS_BYTES;
            // WIDE_BULK: the slot (Q ring for consumer 0, dO ring for 1) holding this consumer's
            // last staged dQ tile, handed back once its bulk reduction has read it; -1: none.
            int staged_slot = -1;
            auto hand_back_staged = [&] {
                if (staged_slot < 0) return;
                if (calico::warpgroup_thread() == 0) {
                    calico::tma::store_wait_read<0>();
                    if (consumer == 0) {
                        bars.q.release_slot(staged_slot, calico::WARPGROUP_WARPS);
                    } else {
                        bars.d.release_slot(staged_slot, calico::WARPGROUP_WARPS);
                    }
                }
                staged_slot = -1;
            };
            for (int hq = 0; hq < p.part_heads; ++hq) {
                const int h = u.hk * p.group + u.hq0 + hq;
                const long long row0 = ((long long)u.b * p.q_heads + h) * p.nq_pad;
                for (int k = 0; k < u.m_hi - u.m_lo; ++k) {
                    const int m0 = block_at(u, k) * BQ;
                    float s[WIDE_S_REGS], dp[WIDE_S_REGS];
                    // S^T = K Q^T and dP^T = V dO^T over this consumer's query rows.
                    bars.q.wait_full(qc);
                    const uint32_t q_slot = q_base + qc.slot() * Q_BYTES;
                    calico::wgmma::fence();
                    wide_scores(s, k_base, q_slot + row_half * 128);
                    calico::wgmma::commit_group();
                    bars.d.wait_full(dc);
                    const uint32_t do_slot = do_base + dc.slot() * Q_BYTES;
                    calico::wgmma::fence();
                    wide_scores(dp, v_base, do_slot + row_half * 128);
                    calico::wgmma::commit_group();
                    if constexpr (WIDE_BULK) hand_back_staged();  // the last step's, read by now

                    // P^T and dS^T in place of S^T and dP^T; column j of the registers is query
                    // row row_half + j of the block.
                    const float* lse_s = reinterpret_cast<const float*>(smem + LSE_OFFSET + qc.slot() * ROW_BYTES);
                    const float* delta_s = reinterpret_cast<const float*>(smem + DELTA_OFFSET + dc.slot() * ROW_BYTES);
                    const bool need_mask = !block_visible(p, u, m0, u.n0);
                    row_range seen[2] = {{0, BQ}, {0, BQ}};
                    if (need_mask) {
#pragma unroll
                        for (int hh = 0; hh < 2; ++hh) {
                            seen[hh] = VARLEN ? rows_in_block(key_lo[hh], key_hi[hh], m0)
                                              : rows_seeing(p, m0, u.n0 + key_in_block + 8 * hh);
                        }
                    }
                    // Column j of the registers is query row row_half + j of the block.
                    auto terms = [&](int j, int hh, int e, float& l, float& dl) {
                        const int col = row_half + 8 * j + 2 * t;
                        const float2 lv = *reinterpret_cast<const float2*>(lse_s + col);
                        const float2 dv = *reinterpret_cast<const float2*>(delta_s + col);
                        l = e ? lv.y : lv.x;
                        dl = e ? dv.y : dv.x;
                    };
                    auto visible = [&](int j, int hh, int e) { return seen[hh].has(row_half + 8 * j + 2 * t + e); };
                    wide_probs(s, dp, need_mask, score_scale, cap_log2, terms, visible);
                    // The tiles are rewritten once both consumers' MMAs of the last step (the
                    // tiles' readers) completed: each waited for its own before getting here
                    // (WIDE_BULK: the barrier that ended the last step said so).
                    if constexpr (!WIDE_BULK) calico::named_barrier_sync(DS_BARRIER, CONSUMERS * calico::WARPGROUP_THREADS);
                    wide_store_tile(p_buf, s, row_half);
                    wide_store_tile(ds_buf, dp, row_half);
                    calico::fence_proxy_async();
                    calico::named_barrier_sync(DS_BARRIER, CONSUMERS * calico::WARPGROUP_THREADS);

                    // dV += P^T dO and dK += dS^T Q over the block's 64 query rows (A K-major:
                    // the tiles' rows are keys; B N-major: the head dim's half, contiguous), and
                    // the dQ tile = dS K (A M-major from the dS^T tile, B N-major) in between.
                    float dq[WIDE_ACC_REGS];
                    calico::wgmma::fence_operands(dv_acc);
                    calico::wgmma::fence_operands(dk_acc);
                    calico::wgmma::fence();
#pragma unroll
                    for (int kk = 0; kk < P_STEPS; ++kk) {
                        const uint64_t da = calico::wgmma::desc_advance(calico::wgmma::desc_kmajor_128b(p_tile), kk * 32);
                        const uint64_t db = calico::wgmma::desc_advance(
                            calico::wgmma::desc_mnmajor_128b(do_slot + (col_half / CHUNK) * BQ * 128, BQ), kk * 16 * 128);
                        calico::wgmma::mma<in_t, WIDE_COLS>::template ss<1>(dv_acc, da, db, 1);
                    }
                    calico::wgmma::commit_group();
                    if constexpr (!WIDE_NO_DQ) {
#pragma unroll
                        for (int kk = 0; kk < BKV / 16; ++kk) {
                            const uint64_t da = calico::wgmma::desc_advance(calico::wgmma::desc_mnmajor_128b(ds_tile, BKV), kk * 16 * 128);
                            const uint64_t db = calico::wgmma::desc_advance(calico::wgmma::desc_mnmajor_128b(k_half, BKV), kk * 16 * 128);
                            calico::wgmma::mma<in_t, WIDE_COLS>::template ss<1, 1>(dq, da, db, kk > 0 ? 1 : 0);
                        }
                        calico::wgmma::commit_group();
                    }
#pragma unroll
                    for (int kk = 0; kk < P_STEPS; ++kk) {
                        const uint64_t da = calico::wgmma::desc_advance(calico::wgmma::desc_kmajor_128b(ds_tile), kk * 32);
                        const uint64_t db = calico::wgmma::desc_advance(
                            calico::wgmma::desc_mnmajor_128b(q_slot + (col_half / CHUNK) * BQ * 128, BQ), kk * 16 * 128);
                        calico::wgmma::mma<in_t, WIDE_COLS>::template ss<1>(dk_acc, da, db, 1);
                    }
                    calico::wgmma::commit_group();
                    if constexpr (WIDE_BULK) {
                        // Both consumers' MMAs of the step done: consumer 0 stages its dQ tile in
                        // the step's Q slot and hands the dO slot back, consumer 1 the other way.
                        calico::wgmma::wait_group<0>();
                        calico::wgmma::fence_operands(dv_acc);
                        calico::wgmma::fence_operands(dq);
                        calico::wgmma::fence_operands(dk_acc);
                        calico::named_barrier_sync(DS_BARRIER, CONSUMERS * calico::WARPGROUP_THREADS);
                        const int slot = consumer == 0 ? qc.slot() : dc.slot();
                        if (lane == 0) {
                            if (consumer == 0) {
                                bars.d.release(dc);
                            } else {
                                bars.q.release(qc);
                            }
                        }
                        unsigned char* stage = smem + (consumer == 0 ? Q_OFFSET : DO_OFFSET) + slot * Q_BYTES;
                        // Registers 0-31 are columns 0-63 of the half, 32-63 the next 64: two
                        // 64 x 64 tiles in the order the finish kernel decodes.
                        stage_dq_tile(*reinterpret_cast<const float(*)[DQ_REGS]>(&dq[0]), stage);
                        stage_dq_tile(*reinterpret_cast<const float(*)[DQ_REGS]>(&dq[DQ_REGS]), stage + DQ_TILE_BYTES);
                        calico::fence_proxy_async();
                        calico::named_barrier_sync(WIDE_STAGE_BARRIER + consumer, calico::WARPGROUP_THREADS);
                        if (calico::warpgroup_thread() == 0) {
                            calico::tma::bulk_reduce_add_f32(dq_acc + (row0 + m0) * D + consumer * 2 * 64 * 64, stage, 2 * DQ_TILE_BYTES);
                            calico::tma::store_commit();
                        }
                        staged_slot = slot;
                        qc.advance();
                        dc.advance();
                        continue;
                    }
                    if constexpr (WIDE_NO_DQ) {
                        calico::wgmma::wait_group<1>();  // dV done: dO's last reader
                        calico::wgmma::fence_operands(dv_acc);
                        if (lane == 0) bars.d.release(dc);
                        dc.advance();
                        calico::wgmma::wait_group<0>();  // dK done: Q's last reader
                        calico::wgmma::fence_operands(dk_acc);
                        if (lane == 0) bars.q.release(qc);
                        qc.advance();
                        continue;
                    }
                    calico::wgmma::wait_group<2>();  // dV done: dO's last reader
                    calico::wgmma::fence_operands(dv_acc);
                    if (lane == 0) bars.d.release(dc);
                    dc.advance();
                    calico::wgmma::wait_group<1>();  // the dQ tile, added while dK runs
                    calico::wgmma::fence_operands(dq);
                    add_dq_tile(dq, dq_acc + (row0 + m0) * D + col_half, warp);
                    calico::wgmma::wait_group<0>();  // dK done: Q's last reader
                    calico::wgmma::fence_operands(dk_acc);
                    if (lane == 0) bars.q.release(qc);
                    qc.advance();
                }
            }
            if constexpr (WIDE_BULK) {
                hand_back_staged();
                // The reductions complete before the CTA goes away.
                if (calico::warpgroup_thread() == 0) calico::tma::store_wait<0>();
            }
            if (lane == 0) calico::arrive(bars.kv_empty);
        }

        const long long key0 = (long long)u.n0 + 16 * warp;
        if constexpr (HEAD_SPLIT) {
            // This part's partials: all 64 keys of the block, this consumer's half of the columns.
            const long long bhs = (long long)batch * p.kv_heads;
            const long long nkv_pad = (long long)p.n_blocks * BKV;
            const long long section = bhs * nkv_pad * D;
            float* at = dkv_part + (((long long)u.part * bhs + (long long)u.b * p.kv_heads + u.hk) * nkv_pad + key0) * D + col_half;
            store_partial(dk_acc, at);
            store_partial(dv_acc, at + p.split * section);
        } else {
            store_keys(dk_acc, scale, dk + u.b * dk_sb + u.hk * dk_sh + col_half, dk_sn, (pairs & 1) != 0, key0, p.k_len,
                       head_dim - col_half);
            store_keys(dv_acc, 1.0f, dv + u.b * dv_sb + u.hk * dv_sh + col_half, dv_sn, (pairs & 2) != 0, key0, p.k_len,
                       head_dim - col_half);
        }
    };
#endif

    // BULK_DQ: warp 1 adds each staged tile to the accumulator, whose query block of BQ x D
    // floats holds the two consumers' tiles back to back (4096 floats each, staging order).
    auto reduce_dq = [&](int w) {
        const unit u = unit_at(p, w);
        if (u.m_hi <= u.m_lo) return;
        const int lane = threadIdx.x % 32;
        const int steps = p.part_heads * (u.m_hi - u.m_lo);
        // The staging tiles start empty.
        for (int c = 0; c < CONSUMERS; ++c) calico::named_barrier_arrive(DQ_EMPTY_BARRIER + c, DQ_BARRIER_THREADS);
        int step = 0;
        for (int hq = 0; hq < p.part_heads; ++hq) {
            const int h = u.hk * p.group + u.hq0 + hq;
            const long long row0 = ((long long)u.b * p.q_heads + h) * p.nq_pad;
            for (int k = 0; k < u.m_hi - u.m_lo; ++k, ++step) {
                float* block = dq_acc + (row0 + (long long)block_at(u, k) * BQ) * D;
                for (int c = 0; c < CONSUMERS; ++c) {
                    calico::named_barrier_sync(DQ_FULL_BARRIER + c, DQ_BARRIER_THREADS);
                    if (lane == 0) {
                        calico::tma::bulk_reduce_add_f32(block + c * (DQ_TILE_BYTES / 4), smem + DQ_STAGE_OFFSET + c * DQ_TILE_BYTES,
                                                         DQ_TILE_BYTES);
                        calico::tma::store_commit();
                    }
                }
                // Hand each tile back once its reduction has read it (the last ones stay).
                if (lane == 0) calico::tma::store_wait_read<1>();
                __syncwarp();
                if (step + 1 < steps) calico::named_barrier_arrive(DQ_EMPTY_BARRIER + 0, DQ_BARRIER_THREADS);
                if (lane == 0) calico::tma::store_wait_read<0>();
                __syncwarp();
                if (step + 1 < steps) calico::named_barrier_arrive(DQ_EMPTY_BARRIER + 1, DQ_BARRIER_THREADS);
            }
        }
        // The reductions finish before the CTA (and its shared memory) goes away.
        if (lane == 0) calico::tma::store_wait<0>();
        __syncwarp();
    };

    if constexpr (BULK_DQ && !WIDE) {
        pl::warp_specialised<PRODUCER_REGS, CONSUMER_REGS>(work, produce, consume, reduce_dq);
    } else {
        pl::warp_specialised<PRODUCER_REGS, CONSUMER_REGS>(work, produce, consume);
    }
}
#endif

#if CALICO_ATTN_KERNEL == 4
namespace attn_hopper_bwd {

// DQ KERNEL (D = 256): one CTA per (block of BQ query rows, query head, batch); see DESIGN (DQ).
static_assert(WIDE, "the dQ kernel is the head-dim-256 backward's");
constexpr int DQ_Q_OFFSET = 0;
constexpr int DQ_DO_OFFSET = DQ_Q_OFFSET + Q_BYTES;
constexpr int DQ_KV_OFFSET = DQ_DO_OFFSET + Q_BYTES;       // STAGES x (K block, V block)
constexpr int DQ_DS_OFFSET = DQ_KV_OFFSET + STAGES * 2 * KV_BYTES;  // two dS tiles [row][key]
constexpr int DQ_ROWS_OFFSET = DQ_DS_OFFSET + 2 * DS_BYTES;         // LSE then delta of the block
constexpr int DQ_BAR_OFFSET = DQ_ROWS_OFFSET + 2 * ROW_BYTES;
// The host allocates DQ_SMEM_BYTES = 1024 + DQ_BAR_OFFSET + (2 * STAGES + 2) * 8.

struct dq_barriers {
    calico::pipeline::ring<STAGES> kv;
    calico::mbarrier qd_full;   // Q, dO and their rows loaded
    calico::mbarrier qd_empty;  // the consumers are done with them
};

// The keys [lo, hi] (hi < lo: none) that query row i sees.
CALICO_DEVICE void row_keys(const params& p, long long i, long long& lo, long long& hi) {
    long long k0 = 0, lk = p.k_len, il = i, off = (long long)p.k_len - p.q_len;
    if constexpr (VARLEN) {
        using calico::attention::packed_offset;
        if (i < packed_offset(p.cu_q, 0, p.q_len) || i >= packed_offset(p.cu_q, p.n_seqs, p.q_len)) {
            lo = 0;
            hi = -1;
            return;
        }
        const int a = calico::attention::packed_sequence(p.cu_q, p.n_seqs, p.q_len, i);
        const int q0 = packed_offset(p.cu_q, a, p.q_len);
        const long long lq = max(q0, packed_offset(p.cu_q, a + 1, p.q_len)) - q0;
        k0 = packed_offset(p.cu_k, a, p.k_len);
        lk = max((int)k0, packed_offset(p.cu_k, a + 1, p.k_len)) - k0;
        il = i - q0;
        off = lk - lq;
    } else if (i >= p.q_len) {
        lo = 0;
        hi = -1;
        return;
    }
    long long l = p.has_left ? il + off - p.left : 0;
    long long h = p.has_right ? il + off + p.right : lk - 1;
    l = l < 0 ? 0 : l;
    h = h > lk - 1 ? lk - 1 : h;
    lo = k0 + l;
    hi = k0 + h;
}

struct dq_unit {
    int b, h, m0;
    int n_lo, n_hi;  // key blocks [n_lo, n_hi) that rows of the block see
};

// Units with the query blocks of a head last to first (under a causal mask the last rows see
// the most keys: the longest units start first).
CALICO_DEVICE dq_unit dq_unit_at(const params& p, int w) {
    const int blocks = p.nq_pad / BQ;
    dq_unit u;
    const int bh = w / blocks;
    u.b = bh / p.q_heads;
    u.h = bh - u.b * p.q_heads;
    u.m0 = (blocks - 1 - (w - bh * blocks)) * BQ;
    const int last = min(u.m0 + BQ, p.q_len) - 1;
    long long lo_first, hi_first, lo_last, hi_last;
    row_keys(p, u.m0, lo_first, hi_first);
    row_keys(p, last, lo_last, hi_last);
    u.n_lo = (int)(lo_first / BKV);
    u.n_hi = hi_last >= lo_first ? (int)(hi_last / BKV) + 1 : u.n_lo;
    u.n_lo = max(u.n_lo, 0);
    u.n_hi = min(u.n_hi, p.n_blocks);
    return u;
}

}  // namespace attn_hopper_bwd

// DESIGN (DQ, D = 256): the head-dim-256 main kernel (CALICO_ATTN_DQ_KERNEL) leaves dQ to this
// kernel, which recomputes S and dP from the query side, so dQ is summed in registers in key
// order (no atomics: the result does not depend on timing). Q, dO and the rows' LSE and delta
// stay in shared memory; the producer streams the key blocks the rows see (K and V of 64
// keys) through a ring of STAGES. Consumer c computes S and dP for the block's 64 rows and its
// 32 keys of the key block (m64n32, A = Q / dO K-major, B = K / V K-major), turns them into
// dS and writes it (16-bit) into a [row][key] tile (two, alternating: one named barrier per
// step); after the barrier it adds dS K[:, c] to its half (128 columns) of dQ (m64n128, A
// K-major from the tile, B N-major). dQ = scale * sum goes out in the dtype at the end.
// Parameters as the main kernel's (maps, window, packed offsets); dq: first element and
// element strides (batch, head, row); pairs: dQ's base and strides even (2-element stores).
CALICO_KERNEL void __launch_bounds__(attn_hopper_bwd::THREADS, 1)
    calico_attention_hopper_bwd_dq(const __grid_constant__ calico::tensor_map map_q, const __grid_constant__ calico::tensor_map map_k,
                                   const __grid_constant__ calico::tensor_map map_v, const __grid_constant__ calico::tensor_map map_do,
                                   const __grid_constant__ calico::tensor_map map_rows, attn_hopper_bwd::in_t* dq, long long dq_sb,
                                   long long dq_sh, long long dq_sn, int pairs, int batch, int q_heads, int group, int q_len,
                                   int k_len, int nq_pad, float scale, float score_scale, float cap_log2, int has_left,
                                   long long left, int has_right, long long right, const int* cu_q, const int* cu_k, int n_seqs,
                                   int head_dim) {
    using namespace attn_hopper_bwd;
    namespace pl = calico::pipeline;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024 - (calico::smem_addr(smem_raw) & 1023)) & 1023);
    dq_barriers& bars = *reinterpret_cast<dq_barriers*>(smem + DQ_BAR_OFFSET);

    params p;
    p.batch = batch;
    p.q_heads = q_heads;
    p.kv_heads = q_heads / group;
    p.group = group;
    p.q_len = q_len;
    p.k_len = k_len;
    p.nq_pad = nq_pad;
    p.n_blocks = (k_len + BKV - 1) / BKV;
    p.split = 1;
    p.part_heads = 1;
    p.has_left = has_left;
    p.has_right = has_right;
    p.left = left;
    p.right = right;
    p.walk = 0;
    p.cu_q = cu_q;
    p.cu_k = cu_k;
    p.n_seqs = n_seqs;
    const int work = batch * q_heads * (nq_pad / BQ);

    if (threadIdx.x == 0) {
        bars.kv.init(RELEASES);
        calico::init(bars.qd_full, 1);
        calico::init(bars.qd_empty, RELEASES);
        calico::fence_barrier_init();
    }
    __syncthreads();

    pl::cursor<STAGES> kc;
    uint32_t units = 0;  // units this thread's role has taken (the Q / dO phase)

    auto produce = [&](int w) {
        const dq_unit u = dq_unit_at(p, w);
        if (units == 0) {
            calico::tma::prefetch(map_q);
            calico::tma::prefetch(map_k);
            calico::tma::prefetch(map_v);
            calico::tma::prefetch(map_do);
            calico::tma::prefetch(map_rows);
        }
        const int hk = u.h / p.group;
        const long long row0 = ((long long)u.b * p.q_heads + u.h) * p.nq_pad;
        calico::wait(bars.qd_empty, (units & 1u) ^ 1u);
        calico::arrive_expect_tx(bars.qd_full, 2 * Q_BYTES + 2 * ROW_BYTES);
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            calico::tma::load_4d(smem + DQ_Q_OFFSET + c * BQ * 128, map_q, c * CHUNK, u.m0, u.h, u.b, bars.qd_full);
            calico::tma::load_4d(smem + DQ_DO_OFFSET + c * BQ * 128, map_do, c * CHUNK, u.m0, u.h, u.b, bars.qd_full);
        }
        calico::tma::load_2d(smem + DQ_ROWS_OFFSET, map_rows, (int)(row0 + u.m0), 0, bars.qd_full);
        calico::tma::load_2d(smem + DQ_ROWS_OFFSET + ROW_BYTES, map_rows, (int)(row0 + u.m0), 1, bars.qd_full);
        ++units;
        for (int n = u.n_lo; n < u.n_hi; ++n) {
            calico::mbarrier& kb = bars.kv.acquire(kc, 2 * KV_BYTES);
            unsigned char* slot = smem + DQ_KV_OFFSET + kc.slot() * 2 * KV_BYTES;
#pragma unroll
            for (int c = 0; c < CHUNKS; ++c) {
                calico::tma::load_4d(slot + c * BKV * 128, map_k, c * CHUNK, n * BKV, hk, u.b, kb);
                calico::tma::load_4d(slot + KV_BYTES + c * BKV * 128, map_v, c * CHUNK, n * BKV, hk, u.b, kb);
            }
            kc.advance();
        }
    };

    auto consume = [&](int consumer, int w) {
        const dq_unit u = dq_unit_at(p, w);
        const int warp = calico::warpgroup_warp();
        const int lane = threadIdx.x % 32;
        const int g = lane / 4;
        const int t = lane % 4;
        const int key_half = consumer * WIDE_ROWS;  // this consumer's 32 keys of a key block
        const int col_half = consumer * WIDE_COLS;  // its 128 columns of dQ
        const int row_in_block = 16 * warp + g;     // and + 8
        // The keys each of this thread's two rows sees.
        long long key_lo[2], key_hi[2];
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) row_keys(p, u.m0 + row_in_block + 8 * hh, key_lo[hh], key_hi[hh]);
        // Every row of the block sees every key of [n0, n0 + BKV) (VARLEN: always masked).
        auto block_visible_rows = [&](long long n0) {
            if constexpr (VARLEN) return false;
            if (u.m0 + BQ > p.q_len || n0 + BKV > p.k_len) return false;
            long long lo_last, hi_last, lo_first, hi_first;
            row_keys(p, u.m0 + BQ - 1, lo_last, hi_last);
            row_keys(p, u.m0, lo_first, hi_first);
            return lo_last <= n0 && hi_first >= n0 + BKV - 1;
        };
        float dq_acc_r[WIDE_ACC_REGS];
#pragma unroll
        for (int i = 0; i < WIDE_ACC_REGS; ++i) dq_acc_r[i] = 0.0f;

        calico::wait(bars.qd_full, units & 1u);
        ++units;
        const float* rows_s = reinterpret_cast<const float*>(smem + DQ_ROWS_OFFSET);
        const float lse_r[2] = {rows_s[row_in_block], rows_s[row_in_block + 8]};
        const float delta_r[2] = {rows_s[BQ + row_in_block], rows_s[BQ + row_in_block + 8]};
        const uint32_t q_base = calico::smem_addr(smem + DQ_Q_OFFSET);
        const uint32_t do_base = calico::smem_addr(smem + DQ_DO_OFFSET);
        for (int n = u.n_lo, step = 0; n < u.n_hi; ++n, ++step) {
            bars.kv.wait_full(kc);
            const uint32_t k_slot = calico::smem_addr(smem + DQ_KV_OFFSET + kc.slot() * 2 * KV_BYTES);
            const uint32_t v_slot = k_slot + KV_BYTES;
            float s[WIDE_S_REGS], dp[WIDE_S_REGS];
            calico::wgmma::fence();
            wide_scores(s, q_base, k_slot + key_half * 128);
            calico::wgmma::commit_group();
            wide_scores(dp, do_base, v_slot + key_half * 128);
            calico::wgmma::commit_group();

            // Register i = 4j + 2hh + e: row row_in_block + 8hh, key n0 + key_half + 8j + 2t + e.
            const long long key0 = (long long)n * BKV + key_half;
            const bool need_mask = !block_visible_rows((long long)n * BKV);
            auto terms = [&](int, int hh, int, float& l, float& dl) {
                l = lse_r[hh];
                dl = delta_r[hh];
            };
            auto visible = [&](int j, int hh, int e) {
                const long long key = key0 + 8 * j + 2 * t + e;
                return key >= key_lo[hh] && key <= key_hi[hh];
            };
            wide_probs(s, dp, need_mask, score_scale, cap_log2, terms, visible);
            // dS into its [row][key] tile, 128B swizzle: element (row, key) at row * 128 +
            // ((key / 8) ^ (row % 8)) * 16 + (key % 8) * 2. Two tiles alternate (see DESIGN).
            unsigned char* ds_buf = smem + DQ_DS_OFFSET + (step & 1) * DS_BYTES;
            wide_store_tile(ds_buf, dp, key_half);
            calico::fence_proxy_async();
            calico::named_barrier_sync(DS_BARRIER, CONSUMERS * calico::WARPGROUP_THREADS);
            // dQ[:, half] += dS K[:, half] over the block's 64 keys.
            const uint32_t ds_tile = calico::smem_addr(ds_buf);
            calico::wgmma::fence_operands(dq_acc_r);
            calico::wgmma::fence();
#pragma unroll
            for (int kk = 0; kk < BKV / 16; ++kk) {
                const uint64_t da = calico::wgmma::desc_advance(calico::wgmma::desc_kmajor_128b(ds_tile), kk * 32);
                const uint64_t db = calico::wgmma::desc_advance(calico::wgmma::desc_mnmajor_128b(k_slot + (col_half / CHUNK) * BKV * 128, BKV),
                                                                kk * 16 * 128);
                calico::wgmma::mma<in_t, WIDE_COLS>::template ss<1>(dq_acc_r, da, db, 1);
            }
            calico::wgmma::commit_group();
            calico::wgmma::wait_group<0>();
            calico::wgmma::fence_operands(dq_acc_r);
            if (lane == 0) bars.kv.release(kc);
            kc.advance();
        }
        if (lane == 0) calico::arrive(bars.qd_empty);
        in_t* base = dq + u.b * dq_sb + u.h * dq_sh + col_half;
        store_keys(dq_acc_r, scale, base, dq_sn, pairs != 0, (long long)u.m0 + 16 * warp, p.q_len, head_dim - col_half);
    };

    pl::warp_specialised<PRODUCER_REGS, CONSUMER_REGS>(work, produce, consume);
}
#endif
