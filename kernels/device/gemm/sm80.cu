// sm_80 GEMM: D = act(alpha * A @ B + beta * C + bias) with mma.sync m16n8k16 (bf16/f16 in,
// f32 accumulators) fed by a multi-stage cp.async pipeline and ldmatrix.
//
// Block tile 128 x 128 x 32, 8 warps as 2 (M) x 4 (N), each warp 64 x 32 (4 x 4 mma tiles).
//
// CALICO_GEMM_TMA = 1 swaps the producer, nothing else: thread 0 issues TMA tensor loads of
// whole A and B tiles (128 x 64, 128B swizzle, what st<> lays out) into a ring of STAGES slots
// with full/empty mbarriers (calico/pipeline.cuh); the 8 warps wait on `full`, run the same
// compute_stage (ldmatrix + mma.sync) and hand the slot back on `empty` (one arrival per warp),
// with no block barrier in the K loop. BK is 64 there (one 128-byte swizzled row per tile
// row). Thread 0 issues tile t + STAGES - 1 at the top of iteration t, into the slot of tile
// t - 1, so it waits only for the slowest warp to finish t - 1. A dedicated producer warp
// would make 9 warps per CTA: two CTAs per SM then put 5 warps on one SM sub-partition, which
// caps registers at 96 and spills the 64 accumulators + fragments; 8 warps keep 128 registers
// and two CTAs per SM, as without TMA. That is the GEMM of GPUs with TMA but no wgmma (sm_100
// until a tcgen05 kernel exists); it runs on sm_90 too, where the router takes it only when
// told to route as sm_100 (CALICO_GEMM_ROUTE_AS). Out-of-range parts of a box arrive as
// zeros, so M, N and K tails need no code; the epilogue is the same.
//
// Layouts: A has K contiguous (M x K row-major, any row stride); B has K contiguous (an N x K
// row-major weight, CALICO_GEMM_B_KMAJOR=1) or N contiguous (K x N row-major, =0). Base pointers,
// row strides and batch strides of A and B must be multiples of 16 bytes. C, D and bias take
// any strides. Any M, N, K: out-of-range 16-byte chunks are zero-filled, and a chunk cut by a K
// or N tail reads only its elements inside the matrix (cp_async_16_tail).
//
// Defines:
//   CALICO_GEMM_IN        bf16 | f16
//   CALICO_GEMM_OUT       bf16 | f16 | float
//   CALICO_GEMM_B_KMAJOR  1: B is N x K (K contiguous); 0: B is K x N (N contiguous)
//   CALICO_GEMM_STAGES    pipeline depth, 3..5 (default 4; 16 KiB of shared memory per stage);
//                         with CALICO_GEMM_TMA 2..4 (32 KiB per stage)
//   CALICO_GEMM_TMA       0: cp.async by every thread; 1: TMA loads issued by thread 0 (see above)
//   and the epilogue defines of gemm/epilogue.cuh.
// Dynamic shared memory: CALICO_GEMM_STAGES * 16384 bytes; with TMA 1024 (alignment slack for
// the 128B swizzle) + CALICO_GEMM_STAGES * 32768 + the ring's barriers.
#include "calico/calico.h"
#include "calico/tile_ops.cuh"
#include "gemm/epilogue.cuh"
#include "gemm/params.cuh"
#ifndef CALICO_GEMM_TMA
#define CALICO_GEMM_TMA 0
#endif
#if CALICO_GEMM_TMA
#include "calico/pipeline.cuh"
#endif

#ifndef CALICO_GEMM_IN
#define CALICO_GEMM_IN bf16
#endif
#ifndef CALICO_GEMM_OUT
#define CALICO_GEMM_OUT bf16
#endif
#ifndef CALICO_GEMM_B_KMAJOR
#define CALICO_GEMM_B_KMAJOR 1
#endif
#ifndef CALICO_GEMM_STAGES
#define CALICO_GEMM_STAGES 4
#endif

namespace calico {
namespace gemm_sm80 {

using In = CALICO_GEMM_IN;
using Out = CALICO_GEMM_OUT;
typedef long long i64;

constexpr bool TMA = CALICO_GEMM_TMA != 0;
constexpr int BM = 128;
constexpr int BN = 128;
constexpr int BK = TMA ? 64 : 32;
constexpr int THREADS = 256;
constexpr int WARP_M = 64;  // rows per warp
constexpr int WARP_N = 32;  // columns per warp
constexpr int MI = WARP_M / 16;
constexpr int NI = WARP_N / 8;
constexpr int STAGES = CALICO_GEMM_STAGES;
constexpr bool B_KMAJOR = CALICO_GEMM_B_KMAJOR != 0;
constexpr int CHUNK = 8;                     // elements per 16-byte chunk
constexpr int A_BYTES = BM * BK * 2;         // one stage of A
constexpr int B_BYTES = BN * BK * 2;         // one stage of B
constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
// The epilogue stages 64 x 128 floats in the pipeline's memory; the pitch (136) keeps the
// 8-byte fragment stores of a half-warp on distinct banks.
constexpr int OUT_PITCH = BN + 8;
static_assert(TMA ? (STAGES >= 2 && STAGES <= 4) : (STAGES >= 3 && STAGES <= 5), "CALICO_GEMM_STAGES: 3..5, with TMA 2..4");
static_assert(WARP_M * OUT_PITCH * 4 <= STAGES * STAGE_BYTES, "epilogue staging must fit");
static_assert(sizeof(In) == 2, "16-bit inputs only");
// The launch the host (kernels/src/gemm/sm80.rs) makes: its tile, block and shared memory.
static_assert(CALICO_GEMM_TILE_M == BM && CALICO_GEMM_TILE_N == BN && CALICO_GEMM_THREADS == THREADS, "the host's grid and block");

typedef gemm::sm80_params<In, Out> params;
CALICO_CHECK_PARAMS(CALICO_SM80_FIELDS, In, Out, CALICO_SM80_PARAMS, params);

// The stage's shared tiles, swizzled as tile.cuh's st<> lays them out: A as BM x BK and a
// K-major B as BN x BK (64-byte rows, 64B swizzle; with TMA 128-byte rows, 128B swizzle), an
// N-major B as BK x BN (two 128-byte column chunks, 128B swizzle). Either way the 8 rows one
// ldmatrix matrix reads sit in 8 different 16-byte bank groups. Offsets below are
// st<>::offset of (row, 16-byte chunk * 8).
using a_tile = st<In, BM, BK>;
template <bool KMAJOR>
struct b_tile_of {
    typedef st<In, BN, BK> type;
};
template <>
struct b_tile_of<false> {
    typedef st<In, BK, BN> type;
};
using b_tile = b_tile_of<B_KMAJOR>::type;
static_assert(a_tile::bytes == A_BYTES && b_tile::bytes == B_BYTES, "stage tiles fill the stage");
static_assert(!TMA || (a_tile::swizzle_bytes == 128 && b_tile::swizzle_bytes == 128), "TMA boxes use the 128B swizzle (kernels/src/gemm/sm80_tma.rs)");
static_assert(!TMA || (A_BYTES % 1024 == 0 && B_BYTES % 1024 == 0), "TMA slots stay 1024-aligned for the 128B swizzle");

#if CALICO_GEMM_TMA
using ring_t = pipeline::ring<STAGES>;
using cursor_t = pipeline::cursor<STAGES>;
// Slots from the (1024-aligned) base, then the ring's barriers; 1024 bytes of slack to align.
constexpr int RING_OFFSET = STAGES * STAGE_BYTES;
constexpr int SMEM_BYTES = 1024 + RING_OFFSET + (int)sizeof(ring_t);
#else
constexpr int SMEM_BYTES = STAGES * STAGE_BYTES;
#endif
static_assert(CALICO_GEMM_SMEM_BYTES == SMEM_BYTES, "the host allocates this kernel's shared memory");

CALICO_DEVICE unsigned a_offset(int r, int c) { return a_tile::offset(r, c * CHUNK); }
CALICO_DEVICE unsigned b_offset(int r, int c) { return b_tile::offset(r, c * CHUNK); }

// Bytes of a 16-byte chunk that lie inside a run of `left` elements (0..16), without branches.
CALICO_DEVICE int chunk_bytes(i64 left) { return int(left < 0 ? 0 : (left > CHUNK ? CHUNK : left)) * 2; }

// The 16-byte chunks one thread copies per K tile: A_CHUNKS of A and B_CHUNKS of B. Rows, chunk
// positions and shared offsets are fixed per thread; only the global pointers move along K.
constexpr int A_CHUNKS = (BM * BK / CHUNK) / THREADS;
constexpr int B_CHUNKS = (BN * BK / CHUNK) / THREADS;

struct Loader {
    const In* a_ptr[A_CHUNKS];  // this thread's chunks of the next A tile
    const In* b_ptr[B_CHUNKS];
    unsigned a_off[A_CHUNKS];   // byte offsets in a stage
    unsigned b_off[B_CHUNKS];
    int a_k[A_CHUNKS];          // K offset of the chunk within a tile
    int b_k[B_CHUNKS];          // (B_KMAJOR) K offset of the chunk, else its K row
    bool a_in[A_CHUNKS];        // row inside M
    int b_fixed[B_CHUNKS];      // B_KMAJOR: column inside N (0/1); else the bytes inside N
    i64 a_step, b_step;         // pointer advance per K tile

    CALICO_DEVICE void init(const In* a, i64 a_rs, const In* b, i64 b_rs, i64 b_cs, i64 m0, i64 n0, i64 m, i64 n,
                            unsigned tid) {
#pragma unroll
        for (int i = 0; i < A_CHUNKS; ++i) {
            const int id = int(tid) + i * THREADS;
            const int r = id / (BK / CHUNK);
            const int c = id % (BK / CHUNK);
            a_in[i] = m0 + r < m;
            a_ptr[i] = a + (a_in[i] ? (m0 + r) * a_rs : 0) + c * CHUNK;
            a_off[i] = a_offset(r, c);
            a_k[i] = c * CHUNK;
        }
        a_step = BK;
#pragma unroll
        for (int i = 0; i < B_CHUNKS; ++i) {
            const int id = int(tid) + i * THREADS;
            if (B_KMAJOR) {
                // B as N x K: 128 rows (n) x 4 chunks (k); b_rs == 1, b_cs is the row stride.
                const int r = id / (BK / CHUNK);
                const int c = id % (BK / CHUNK);
                b_fixed[i] = n0 + r < n;
                b_ptr[i] = b + (b_fixed[i] ? (n0 + r) * b_cs : 0) + c * CHUNK;
                b_off[i] = A_BYTES + b_offset(r, c);
                b_k[i] = c * CHUNK;
            } else {
                // B as K x N: 32 rows (k) x 16 chunks (n); b_cs == 1, b_rs is the row stride.
                const int r = id / (BN / CHUNK);
                const int c = id % (BN / CHUNK);
                b_fixed[i] = chunk_bytes(n - (n0 + c * CHUNK));
                b_ptr[i] = b + r * b_rs + (b_fixed[i] ? n0 + c * CHUNK : 0);
                b_off[i] = A_BYTES + b_offset(r, c);
                b_k[i] = r;
            }
        }
        b_step = B_KMAJOR ? BK : BK * b_rs;
    }

    // Issues the copies of K tile `kt` (which must be the tile after the last one issued) into
    // the stage at shared address `st`. Chunks outside the matrix read nothing and land as
    // zeros; tail chunks read only their elements inside the matrix.
    CALICO_DEVICE void issue(unsigned st, i64 k, i64 kt) {
        const i64 k0 = kt * BK;
#pragma unroll
        for (int i = 0; i < A_CHUNKS; ++i) {
            const int bytes = a_in[i] ? chunk_bytes(k - k0 - a_k[i]) : 0;
            cp_async_16_tail(st + a_off[i], a_ptr[i], bytes);
            a_ptr[i] += a_step;
        }
#pragma unroll
        for (int i = 0; i < B_CHUNKS; ++i) {
            const int bytes = B_KMAJOR ? (b_fixed[i] ? chunk_bytes(k - k0 - b_k[i]) : 0)
                                       : (k0 + b_k[i] < k ? b_fixed[i] : 0);
            cp_async_16_tail(st + b_off[i], b_ptr[i], bytes);
            b_ptr[i] += b_step;
        }
    }
};

// One BK slice of the stage at `st`: 2 k16 steps of MI x NI mma tiles per warp.
// The warp's 64 x 32 f32 accumulators; m16n8 tile (mi, ni) is the ni % 2 half of base tile
// (mi, ni / 2).
using acc_tile = rt<float, WARP_M, WARP_N, row_l>;

CALICO_DEVICE void compute_stage(acc_tile& acc, unsigned st, int wm, int wn, int lane) {
    const unsigned sb = st + A_BYTES;
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
        unsigned af[MI][4];
        unsigned bf[NI][2];
        // A: matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15) -> a0..a7 of the m16n8k16 A fragment.
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
            const int r = wm * WARP_M + mi * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
            const int c = kk * 2 + (lane >> 4);
            ldmatrix_x4(af[mi], st + a_offset(r, c));
        }
        // B: one x4 covers two n8 tiles: (n tile j, k 0-7), (j, k 8-15), (j+1, k 0-7), (j+1, k 8-15).
#pragma unroll
        for (int nj = 0; nj < NI; nj += 2) {
            unsigned r4[4];
            if (B_KMAJOR) {
                const int r = wn * WARP_N + nj * 8 + (lane & 7) + (lane >> 4) * 8;
                const int c = kk * 2 + ((lane >> 3) & 1);
                ldmatrix_x4(r4, sb + b_offset(r, c));
            } else {
                const int kr = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                const int c = (wn * WARP_N + nj * 8) / CHUNK + (lane >> 4);
                ldmatrix_x4_trans(r4, sb + b_offset(kr, c));
            }
            bf[nj][0] = r4[0];
            bf[nj][1] = r4[1];
            bf[nj + 1][0] = r4[2];
            bf[nj + 1][1] = r4[3];
        }
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int ni = 0; ni < NI; ++ni) mma_16816<In>(mma_half(acc, mi, ni / 2, ni % 2), af[mi], bf[ni][0], bf[ni][1]);
    }
}

// The cp.async main loop: every thread copies its chunks of the tile STAGES - 1 ahead, and one
// block barrier per K tile both publishes the landed tile and frees the stage it reuses.
CALICO_DEVICE void mainloop_cp_async(acc_tile& acc, const In* a, i64 a_rs, const In* b, i64 b_rs, i64 b_cs, i64 m0, i64 n0, i64 m,
                                     i64 n, i64 k, unsigned tid, int wm, int wn, int lane, unsigned base) {
    Loader ld;
    ld.init(a, a_rs, b, b_rs, b_cs, m0, n0, m, n, tid);
    const i64 k_tiles = (k + BK - 1) / BK;
    // Prologue: STAGES - 1 tiles in flight. Every slot commits a group (possibly empty) so the
    // wait counts below stay uniform.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < k_tiles) ld.issue(base + s * STAGE_BYTES, k, s);
        cp_async_commit();
    }
    for (i64 t = 0; t < k_tiles; ++t) {
        cp_async_wait<STAGES - 2>();
        // Tile t has landed for every thread, and every warp is done with tile t - 1, whose
        // stage the next load reuses.
        sync_threads();
        const i64 next = t + STAGES - 1;
        if (next < k_tiles) ld.issue(base + unsigned(next % STAGES) * STAGE_BYTES, k, next);
        cp_async_commit();
        compute_stage(acc, base + unsigned(t % STAGES) * STAGE_BYTES, wm, wn, lane);
    }
    cp_async_wait<0>();
}

// D's 128 x 128 tile from the accumulators, one warp row (64 x 128) per pass through shared
// memory at `out` (the pipeline's), so that consecutive threads finish consecutive columns and
// C and D are accessed row by row. Every thread of the block calls it (block barriers). The
// caller has made `out` free to write.
CALICO_DEVICE void epilogue(const acc_tile& acc, const Out* c, i64 c_rs, i64 c_cs, Out* d, i64 d_rs, i64 d_cs, const Out* bias, i64 m,
                            i64 n, float alpha, float beta, i64 m0, i64 n0, unsigned tid, int wm, int wn, float* out) {
#pragma unroll
    for (int h = 0; h < BM / WARP_M; ++h) {
        if (wm == h) {
            store_rows(out, OUT_PITCH, acc, 0, wn * WARP_N);
            // With TMA the next batch's loads (async proxy) rewrite what these generic stores wrote.
            if constexpr (TMA) fence_proxy_async();
        }
        sync_threads();
#pragma unroll 4
        for (int q = 0; q < WARP_M * BN / THREADS; ++q) {
            const int e = int(tid) + q * THREADS;
            const int r = e / BN;
            const int cl = e % BN;
            const i64 row = m0 + h * WARP_M + r;
            const i64 col = n0 + cl;
            if (row < m && col < n) {
                const Out* c_at = CALICO_GEMM_HAS_C ? c + row * c_rs + col * c_cs : nullptr;
                const Out* bias_at = CALICO_GEMM_HAS_BIAS ? bias + col : nullptr;
                d[row * d_rs + col * d_cs] = gemm::finish<Out>(out[r * OUT_PITCH + cl], alpha, beta, c_at, bias_at);
            }
        }
        // The next pass (or the next batch's loads) overwrites what was just read.
        sync_threads();
    }
}

// One batch's tile with cp.async loads.
CALICO_DEVICE void tile(const In* a, i64 a_rs, const In* b, i64 b_rs, i64 b_cs, const Out* c, i64 c_rs, i64 c_cs, Out* d,
                        i64 d_rs, i64 d_cs, const Out* bias, i64 m, i64 n, i64 k, float alpha, float beta,
                        unsigned char* smem) {
    const unsigned tid = thread_x();
    const int lane = int(tid % 32);
    const int warp = int(tid / 32);
    const int wm = warp / (BN / WARP_N);
    const int wn = warp % (BN / WARP_N);
    const i64 m0 = i64(block_y()) * BM;
    const i64 n0 = i64(block_x()) * BN;

    acc_tile acc;
    zero(acc);
    mainloop_cp_async(acc, a, a_rs, b, b_rs, b_cs, m0, n0, m, n, k, tid, wm, wn, lane, smem_addr(smem));
    // The epilogue stages through stages other warps may still be reading.
    sync_threads();
    epilogue(acc, c, c_rs, c_cs, d, d_rs, d_cs, bias, m, n, alpha, beta, m0, n0, tid, wm, wn, reinterpret_cast<float*>(smem));
}

#if CALICO_GEMM_TMA
// The producer (thread 0): waits for the cursor's slot to be free, arms its full barrier for
// one stage and issues the A tile (a_batch, block row, kt) and the B tile (b_batch, block
// column, kt) or, N-major, (b_batch, kt, block column).
CALICO_DEVICE void issue_tma(const tensor_map& map_a, const tensor_map& map_b, int a_batch, int b_batch, int tile_m, int tile_n, int kt,
                             ring_t& ring, cursor_t& produced, unsigned char* smem) {
    mbarrier& full = ring.acquire(produced, STAGE_BYTES);
    unsigned char* slot = smem + produced.slot() * STAGE_BYTES;
    load_tma(*reinterpret_cast<a_tile*>(slot), map_a, coord{a_batch, tile_m, kt}, full);
    const coord b_at = B_KMAJOR ? coord{b_batch, tile_n, kt} : coord{b_batch, kt, tile_n};
    load_tma(*reinterpret_cast<b_tile*>(slot + A_BYTES), map_b, b_at, full);
    produced.advance();
}

// One batch's tile with TMA loads: thread 0 keeps STAGES - 1 tiles ahead; each warp waits for
// a slot, computes on it and hands it back with one arrival (lane 0, after the warp's reads).
// The cursors run on across batches, as the ring's phases do. `smem` is 1024-aligned.
CALICO_DEVICE void tile_tma(const tensor_map& map_a, const tensor_map& map_b, int a_batch, int b_batch, ring_t& ring, cursor_t& produced,
                            cursor_t& consumed, const Out* c, i64 c_rs, i64 c_cs, Out* d, i64 d_rs, i64 d_cs, const Out* bias, i64 m,
                            i64 n, i64 k, float alpha, float beta, unsigned char* smem) {
    const unsigned tid = thread_x();
    const int lane = int(tid % 32);
    const int warp = int(tid / 32);
    const int wm = warp / (BN / WARP_N);
    const int wn = warp % (BN / WARP_N);
    const int tile_m = int(block_y());
    const int tile_n = int(block_x());
    const int k_tiles = int((k + BK - 1) / BK);
    const unsigned base = smem_addr(smem);
    const bool producer = tid == 0;

    acc_tile acc;
    zero(acc);
    if (producer) {
        for (int kt = 0; kt < STAGES - 1 && kt < k_tiles; ++kt) issue_tma(map_a, map_b, a_batch, b_batch, tile_m, tile_n, kt, ring, produced, smem);
    }
    for (int kt = 0; kt < k_tiles; ++kt, consumed.advance()) {
        // Into the slot of tile kt - 1: waits until every warp has handed that one back.
        if (producer && kt + STAGES - 1 < k_tiles) issue_tma(map_a, map_b, a_batch, b_batch, tile_m, tile_n, kt + STAGES - 1, ring, produced, smem);
        __syncwarp();
        ring.wait_full(consumed);
        // Lanes leave the wait loop on their own; ldmatrix and mma.sync need the whole warp.
        __syncwarp();
        compute_stage(acc, base + unsigned(consumed.slot()) * STAGE_BYTES, wm, wn, lane);
        // Every lane's ldmatrix reads of the slot are done before it is handed back.
        __syncwarp();
        if (lane == 0) ring.release(consumed);
    }
    // Every slot's copies have landed and been read: the epilogue may stage through them.
    sync_threads();
    epilogue(acc, c, c_rs, c_cs, d, d_rs, d_cs, bias, m, n, alpha, beta, i64(tile_m) * BM, i64(tile_n) * BN, tid, wm, wn,
             reinterpret_cast<float*>(smem));
}
#endif

}  // namespace gemm_sm80
}  // namespace calico

#if CALICO_GEMM_TMA
// TMA producer: map_a over A {K, M, batch}, box {64, 128, 1}; map_b over B K-major {K, N, batch},
// box {64, 128, 1}, or N-major {N, K, batch}, box {64, 64, 1}; all 128B swizzle (the host builds
// them in kernels/src/gemm/sm80_tma.rs). The struct's a / b pointers are unused; a_bs / b_bs
// only say whether an operand has a batch dimension (0: broadcast, map batch extent 1).
// Block (x, y) computes D[y*128.., x*128..] of batches z, z + grid_z, ...
CALICO_KERNEL void __launch_bounds__(256, 2)
    calico_gemm_sm80_tma(const __grid_constant__ calico::tensor_map map_a, const __grid_constant__ calico::tensor_map map_b,
                         const calico::gemm_sm80::params p) {
    using namespace calico::gemm_sm80;
    extern __shared__ __align__(1024) unsigned char calico_gemm_smem[];
    // Dynamic shared memory is only guaranteed 16-byte alignment; the 128B swizzle needs 1024.
    unsigned char* smem = calico_gemm_smem + ((1024 - (calico::smem_addr(calico_gemm_smem) & 1023)) & 1023);
    ring_t& ring = *reinterpret_cast<ring_t*>(smem + RING_OFFSET);
    if (calico::thread_x() == 0) {
        // One arrival per warp frees a slot.
        ring.init(THREADS / 32);
        calico::fence_barrier_init();
        calico::tma::prefetch(map_a);
        calico::tma::prefetch(map_b);
    }
    calico::sync_threads();
    cursor_t produced, consumed;
    const Out* __restrict__ c = p.c;
    Out* __restrict__ d = p.d;
    for (i64 z = calico::block_z(); z < p.batch; z += p.grid_z) {
        const Out* cz = CALICO_GEMM_HAS_C ? c + z * p.c_bs : nullptr;
        tile_tma(map_a, map_b, p.a_bs != 0 ? int(z) : 0, p.b_bs != 0 ? int(z) : 0, ring, produced, consumed, cz, p.c_rs, p.c_cs,
                 d + z * p.d_bs, p.d_rs, p.d_cs, p.bias, p.m, p.n, p.k, p.alpha, p.beta, smem);
    }
}
#else
// One parameter struct (gemm/params.cuh, strides in elements); a_cs must be 1, and b_rs
// (B_KMAJOR) or b_cs (otherwise) must be 1. Block (x, y) computes D[y*128.., x*128..] of
// batches z, z + grid_z, ...
CALICO_KERNEL void __launch_bounds__(256, 2) calico_gemm_sm80(const calico::gemm_sm80::params p) {
    using namespace calico::gemm_sm80;
    extern __shared__ __align__(128) unsigned char calico_gemm_smem[];
    const In* __restrict__ a = p.a;
    const In* __restrict__ b = p.b;
    const Out* __restrict__ c = p.c;
    Out* __restrict__ d = p.d;
    for (i64 z = calico::block_z(); z < p.batch; z += p.grid_z) {
        const Out* cz = CALICO_GEMM_HAS_C ? c + z * p.c_bs : nullptr;
        tile(a + z * p.a_bs, p.a_rs, b + z * p.b_bs, p.b_rs, p.b_cs, cz, p.c_rs, p.c_cs, d + z * p.d_bs, p.d_rs, p.d_cs, p.bias, p.m,
             p.n, p.k, p.alpha, p.beta, calico_gemm_smem);
    }
}
#endif
