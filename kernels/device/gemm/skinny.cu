// Skinny GEMM (LLM decode, sm_90): D[M, N] = act(alpha * A[M, K] @ W[N, K]^T + beta * C + bias)
// for M <= 64, with B given as a K-major weight W (row-major N x K, K contiguous).
//
// Why a separate kernel. With M <= 64 the work is reading W once (N * K * 2 bytes, 32 MiB for
// 4096 x 4096: 11 us at 3 TB/s); the FLOPs are nothing. The Hopper wgmma kernel keeps one
// CTA per SM and walks 64 K steps per tile, each a full mbarrier round trip, so it is
// latency-bound. Here the K dimension is split across the CTAs of a thread-block cluster:
//
//   * grid = (SPLIT, ceil(N / 64)), cluster = (SPLIT, 1, 1): cluster y owns columns
//     [64 y, 64 y + 64) and its CTA x (= cluster rank) the K tiles [x * per, (x + 1) * per).
//     For 4096 x 4096 that is 64 clusters x 8 = 512 CTAs, ~4 per SM, all resident at once
//     (<= 48 KiB of shared memory and <= 128 registers per thread for 128 threads).
//   * Each CTA streams its W slab (64 rows x K/SPLIT) and the matching A[0:M, k] (tiny,
//     L2-resident) with 16-byte cp.async through a STAGES-deep ring of 64-wide K tiles;
//     STAGES - 1 = 2..3 W tiles of 8 KiB are in flight per CTA, 64-96 KiB per SM, well above
//     the ~30 KiB that Little's law asks for at full HBM bandwidth (23 GB/s per SM x ~1.3 us).
//   * 4 warps, each 16 columns x all M rows (MT m16 tiles): mma.sync m16n8k16, f32
//     accumulators, fragments by ldmatrix from XOR-swizzled 128-byte rows (conflict free).
//     Rows of A at or past M, columns of W past N and K past the end are zero-filled
//     (cp_async_16_tail: whole chunks by cp.async, a K tail element by element, nothing
//     read outside the operands), so any M, N, K is exact.
//   * The split-K partials are reduced through distributed shared memory instead of a
//     global workspace and a second kernel: each CTA parks its MP x 64 f32 partial tile in its
//     own shared memory, the cluster synchronises, and CTA r sums quads of 4 columns
//     (r*128 + tid, strided by SPLIT*128) over ranks 0..SPLIT-1 in rank order (deterministic,
//     independent of which CTA does it), applies the shared epilogue (gemm/epilogue.cuh) and
//     writes D with any strides. C is read only when CALICO_GEMM_HAS_C; each element of C is
//     read by the thread that then writes that element of D, so C may alias D.
//   No workspace, one launch: the price is sm_90 clusters (SPLIT <= 8, the portable limit), so
//   Ampere keeps the sm_80 kernel. A workspace + second reduction kernel would cost a memset
//   (Backend::alloc zero-fills) and a dependent launch, ~2-4 us against an 11 us floor.
//
// Budget (sm_90a, NVRTC 13): 67 / 86 / 122 registers for MT = 1 / 2 / 4, no local memory;
// 40 / 48 / 48 KiB of shared memory: 4 CTAs (16 warps) per SM for every MT, 5 for MT = 1.
//
// Defines:
//   CALICO_GEMM_IN         bf16 | f16
//   CALICO_GEMM_OUT        bf16 | f16 | float
//   CALICO_SKINNY_MT       m16 tiles of A rows: 1, 2 or 4 (M <= 16, 32, 64)
//   CALICO_SKINNY_STAGES   pipeline depth, 2..6
//   CALICO_SKINNY_SPLIT    CTAs per cluster splitting K: 1, 2, 4 or 8
//   and the epilogue defines of gemm/epilogue.cuh.
// Dynamic shared memory: STAGES * (MT * 16 + 64) * 128 bytes.
#include "calico/calico.h"
#include "calico/cluster.cuh"
#include "calico/tile_ops.cuh"
#include "gemm/epilogue.cuh"
#include "gemm/params.cuh"

#ifndef CALICO_GEMM_IN
#define CALICO_GEMM_IN bf16
#endif
#ifndef CALICO_GEMM_OUT
#define CALICO_GEMM_OUT bf16
#endif
#ifndef CALICO_SKINNY_MT
#define CALICO_SKINNY_MT 1
#endif
#ifndef CALICO_SKINNY_STAGES
#define CALICO_SKINNY_STAGES 4
#endif
#ifndef CALICO_SKINNY_SPLIT
#define CALICO_SKINNY_SPLIT 8
#endif

namespace calico {
namespace gemm_skinny {

using In = CALICO_GEMM_IN;
using Out = CALICO_GEMM_OUT;
typedef long long i64;

constexpr int MT = CALICO_SKINNY_MT;
constexpr int MP = MT * 16;  // A rows held (zero past M)
constexpr int BN = 64;
constexpr int BK = 64;  // one 128-byte row of 16-bit elements per stage
constexpr int THREADS = 128;
constexpr int WARP_N = BN / (THREADS / 32);  // 16 columns per warp
constexpr int STAGES = CALICO_SKINNY_STAGES;
constexpr int SPLIT = CALICO_SKINNY_SPLIT;
constexpr int CHUNK = 8;                 // elements per 16-byte chunk
constexpr int ROW_CHUNKS = BK / CHUNK;  // 8
constexpr int A_BYTES = MP * BK * 2;
constexpr int W_BYTES = BN * BK * 2;
constexpr int STAGE_BYTES = A_BYTES + W_BYTES;
constexpr int A_CHUNKS = MP * ROW_CHUNKS / THREADS;  // per thread per stage: 1, 2 or 4
constexpr int W_CHUNKS = BN * ROW_CHUNKS / THREADS;  // 4
// The partial tile: MP x 64 f32 with a pitch of 72 floats, so the 8-byte fragment stores of a
// half-warp hit distinct banks and every row starts 16-byte aligned (for v4 remote loads).
constexpr int OUT_PITCH = BN + 8;
constexpr int QUADS_PER_ROW = BN / 4;
// Quads of the partial tile each thread reduces (the tile's MP * 16 quads over the cluster).
constexpr int QUADS_PER_THREAD = (MP * QUADS_PER_ROW + SPLIT * THREADS - 1) / (SPLIT * THREADS);

static_assert(MT == 1 || MT == 2 || MT == 4, "CALICO_SKINNY_MT must be 1, 2 or 4");
static_assert(STAGES >= 2 && STAGES <= 6, "CALICO_SKINNY_STAGES must be 2..6");
static_assert(SPLIT == 1 || SPLIT == 2 || SPLIT == 4 || SPLIT == 8, "CALICO_SKINNY_SPLIT must be 1, 2, 4 or 8");
static_assert(MP * OUT_PITCH * 4 <= STAGES * STAGE_BYTES, "the partial tile must fit in the pipeline's memory");
static_assert(A_CHUNKS * THREADS == MP * ROW_CHUNKS && W_CHUNKS * THREADS == BN * ROW_CHUNKS, "whole chunks per thread");
static_assert(sizeof(In) == 2, "16-bit inputs only");
// The launch the host (kernels/src/gemm/skinny.rs) makes: its column tile, block and shared memory.
static_assert(CALICO_GEMM_TILE_N == BN && CALICO_GEMM_THREADS == THREADS, "the host's grid and block");
static_assert(CALICO_GEMM_SMEM_BYTES == STAGES * STAGE_BYTES, "the host allocates this kernel's shared memory");

typedef gemm::weight_params<In, Out> params;
CALICO_CHECK_PARAMS(CALICO_WEIGHT_FIELDS, In, Out, CALICO_WEIGHT_PARAMS, params);

// A stage holds A as an MP x 64 and W as a 64 x 64 shared tile (tile.cuh's st<>: 128-byte
// rows, 16-byte chunk c of row r at c ^ (r % 8)), so the 8 rows one ldmatrix matrix reads
// (same logical chunk) sit in 8 different 16-byte bank groups.
using a_tile = st<In, MP, BK>;
using w_tile = st<In, BN, BK>;
static_assert(a_tile::bytes == A_BYTES && w_tile::bytes == W_BYTES, "stage tiles fill the stage");
// The warp's MP x 16 f32 accumulators: m16n8 tile (mi, ni) is half ni of base tile (mi, 0).
using acc_tile = rt<float, MP, WARP_N, row_l>;

// Bytes of a 16-byte chunk that lie inside a run of `left` elements (0..16).
CALICO_DEVICE int chunk_bytes(i64 left) { return int(left <= 0 ? 0 : (left >= CHUNK ? CHUNK : left)) * 2; }

// Four consecutive floats of shared::cluster memory (another CTA's, or this one's).
CALICO_DEVICE void ld_cluster_v4(float (&v)[4], unsigned addr) {
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3])
                 : "r"(addr)
                 : "memory");
}

// The two halves of cluster::sync(): arrive (releasing this thread's prior memory accesses to
// the cluster) and wait (acquiring the others').
CALICO_DEVICE void cluster_arrive_release() { asm volatile("barrier.cluster.arrive.release;\n" ::: "memory"); }
CALICO_DEVICE void cluster_wait() { asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory"); }

// One CTA: the partial product of columns [n0, n0 + 64) over K tiles [t0, t1), reduced across
// the cluster and finished into D.
CALICO_DEVICE void run(const In* __restrict__ a, i64 a_rs, const In* __restrict__ w, i64 w_rs,
                       const Out* c, i64 c_rs, i64 c_cs, Out* d, i64 d_rs, i64 d_cs,
                       const Out* __restrict__ bias, i64 m, i64 n, i64 k, float alpha, float beta,
                       unsigned char* smem) {
    const int tid = int(thread_x());
    const int lane = tid % 32;
    const int warp = tid / 32;
    const int rank = int(block_x());  // == %cluster_ctarank: the grid is one cluster wide
    const i64 n0 = i64(block_y()) * BN;
    const unsigned base = smem_addr(smem);

    const i64 k_tiles = (k + BK - 1) / BK;
    const i64 per = (k_tiles + SPLIT - 1) / SPLIT;
    const i64 t0 = rank * per;
    const i64 t1 = t0 + per < k_tiles ? t0 + per : k_tiles;
    const int nt = t1 > t0 ? int(t1 - t0) : 0;

    // This thread's chunks: fixed rows, chunk positions and shared offsets; the pointers move
    // along K by BK per copy. Chunk i of a stage is (row id / 8, chunk id % 8) with
    // id = tid + i * THREADS, so 8 consecutive threads copy one contiguous 128-byte row piece.
    // Every thread's chunks share one K offset `kc`, hence one byte count per tile.
    const int c_log = tid % ROW_CHUNKS;
    const int kc = c_log * CHUNK;
    const In* a_src[A_CHUNKS];
    const In* w_src[W_CHUNKS];
    bool a_in[A_CHUNKS];
    bool w_in[W_CHUNKS];
#pragma unroll
    for (int i = 0; i < A_CHUNKS; ++i) {
        const int r = (tid + i * THREADS) / ROW_CHUNKS;
        a_in[i] = r < m;
        a_src[i] = a + (a_in[i] ? i64(r) * a_rs : 0) + t0 * BK + kc;
    }
#pragma unroll
    for (int i = 0; i < W_CHUNKS; ++i) {
        const int r = (tid + i * THREADS) / ROW_CHUNKS;
        w_in[i] = n0 + r < n;
        w_src[i] = w + (w_in[i] ? (n0 + r) * w_rs : 0) + t0 * BK + kc;
    }
    i64 k_left = k - t0 * BK - kc;  // elements of K from this thread's next chunk to the end

    // Copies the next K tile (t0, t0 + 1, ... in order) into the stage at `st`. Chunks outside
    // the matrix read nothing and land as zeros; a chunk cut by the end of K reads only its
    // elements inside K (cp_async_16_tail), never 16 bytes past the end of a row.
    auto issue = [&](unsigned st) {
        const int bytes_k = chunk_bytes(k_left);
#pragma unroll
        for (int i = 0; i < A_CHUNKS; ++i) {
            const int r = (tid + i * THREADS) / ROW_CHUNKS;
            const int bytes = a_in[i] ? bytes_k : 0;
            cp_async_16_tail(st + a_tile::offset(r, kc), a_src[i], bytes);
            a_src[i] += BK;
        }
#pragma unroll
        for (int i = 0; i < W_CHUNKS; ++i) {
            const int r = (tid + i * THREADS) / ROW_CHUNKS;
            const int bytes = w_in[i] ? bytes_k : 0;
            cp_async_16_tail(st + A_BYTES + w_tile::offset(r, kc), w_src[i], bytes);
            w_src[i] += BK;
        }
        k_left -= BK;
    };

    acc_tile acc;
    zero(acc);

    // Prologue: STAGES - 1 tiles in flight; every slot commits a group (maybe empty) so the
    // wait counts stay uniform.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nt) issue(base + unsigned(s) * STAGE_BYTES);
        cp_async_commit();
    }
    int read_stage = 0;               // the stage tile j sits in: j % STAGES
    int write_stage = STAGES - 1;     // the stage tile j + STAGES - 1 goes to
    for (int j = 0; j < nt; ++j) {
        cp_async_wait<STAGES - 2>();
        // Tile j has landed for every thread, and every warp is done with tile j - 1, whose
        // stage the next copy reuses.
        sync_threads();
        if (j + STAGES - 1 < nt) issue(base + unsigned(write_stage) * STAGE_BYTES);
        cp_async_commit();
        write_stage = write_stage == STAGES - 1 ? 0 : write_stage + 1;
        const unsigned st = base + unsigned(read_stage) * STAGE_BYTES;
        read_stage = read_stage == STAGES - 1 ? 0 : read_stage + 1;
        const unsigned sw = st + A_BYTES;
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            // W: one x4 = (n tile 0, k 0-7), (0, k 8-15), (n tile 1, k 0-7), (1, k 8-15).
            unsigned bw[4];
            {
                const int r = warp * WARP_N + (lane & 7) + (lane >> 4) * 8;
                const int cc = kk * 2 + ((lane >> 3) & 1);
                ldmatrix_x4(bw, sw + w_tile::offset(r, cc * CHUNK));
            }
#pragma unroll
            for (int mi = 0; mi < MT; ++mi) {
                // A: (rows 0-7 | 8-15) x (k 0-7 | 8-15) -> a0..a3 of the m16n8k16 A fragment.
                unsigned af[4];
                const int r = mi * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                const int cc = kk * 2 + (lane >> 4);
                ldmatrix_x4(af, st + a_tile::offset(r, cc * CHUNK));
                mma_16816<In>(mma_half(acc, mi, 0, 0), af, bw[0], bw[1]);
                mma_16816<In>(mma_half(acc, mi, 0, 1), af, bw[2], bw[3]);
            }
        }
    }
    cp_async_wait<0>();
    // Every warp is done reading the stages the partial tile overwrites.
    sync_threads();

    // Park the partial tile.
    float* part = reinterpret_cast<float*>(smem);
    store_rows(part, OUT_PITCH, acc, 0, warp * WARP_N);
    // Release this CTA's partial tile to the cluster and acquire the others'.
    cluster::sync();

    // Quads of 4 columns: rows 0..M-1 x 16 quads, dealt round-robin to the cluster's CTAs.
    // Each quad is the sum over ranks 0..SPLIT-1 in rank order, whichever CTA computes it.
    // All remote reads happen first; then this CTA tells the cluster it is done with their
    // shared memory (arrive) and writes D while the others finish, and waits for all of them
    // before exiting (its own shared memory must outlive their reads).
    const int rows = m < MP ? int(m) : MP;
    const int quads = rows * QUADS_PER_ROW;
    float sum[QUADS_PER_THREAD][4];
#pragma unroll
    for (int i = 0; i < QUADS_PER_THREAD; ++i) {
        const int q = (i * SPLIT + rank) * THREADS + tid;
#pragma unroll
        for (int e = 0; e < 4; ++e) sum[i][e] = 0.0f;
        if (q < quads) {
            const unsigned local = base + unsigned(((q / QUADS_PER_ROW) * OUT_PITCH + (q % QUADS_PER_ROW) * 4) * 4);
#pragma unroll
            for (int s = 0; s < SPLIT; ++s) {
                float v[4];
                ld_cluster_v4(v, cluster::map_shared(local, unsigned(s)));
#pragma unroll
                for (int e = 0; e < 4; ++e) sum[i][e] += v[e];
            }
        }
    }
    cluster_arrive_release();
#pragma unroll
    for (int i = 0; i < QUADS_PER_THREAD; ++i) {
        const int q = (i * SPLIT + rank) * THREADS + tid;
        if (q < quads) {
            const i64 r = q / QUADS_PER_ROW;
            const i64 col0 = n0 + (q % QUADS_PER_ROW) * 4;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const i64 col = col0 + e;
                if (col < n) {
                    const Out* c_at = CALICO_GEMM_HAS_C ? c + r * c_rs + col * c_cs : nullptr;
                    const Out* bias_at = CALICO_GEMM_HAS_BIAS ? bias + col : nullptr;
                    d[r * d_rs + col * d_cs] = gemm::finish<Out>(sum[i][e], alpha, beta, c_at, bias_at);
                }
            }
        }
    }
    cluster_wait();
}

}  // namespace gemm_skinny
}  // namespace calico

// One parameter struct (gemm/params.cuh, strides in elements). A is M x K with K contiguous
// (a_rs: its row stride); W is the N x K weight with K contiguous (w_rs: its row stride, i.e.
// B's column stride); C and D take any strides. A, W and their row strides must be 16-byte
// aligned. Grid (SPLIT, ceil(N / 64), row groups): z takes rows [z * MP, z * MP + MP) of A, C
// and D, so a narrow N can still give every SM a few CTAs (each re-reads its W slab from L2).
// A whole cluster shares z, so a cluster past M returns together.
CALICO_KERNEL void __cluster_dims__(CALICO_SKINNY_SPLIT, 1, 1) __launch_bounds__(128, 4)
    calico_gemm_skinny(const calico::gemm_skinny::params p) {
    extern __shared__ __align__(128) unsigned char calico_gemm_smem[];
    const long long r0 = (long long)blockIdx.z * calico::gemm_skinny::MP;
    if (r0 >= p.m) return;
    calico::gemm_skinny::run(p.a + r0 * p.a_rs, p.a_rs, p.w, p.w_rs, p.c ? p.c + r0 * p.c_rs : p.c, p.c_rs, p.c_cs,
                             p.d + r0 * p.d_rs, p.d_rs, p.d_cs, p.bias, p.m - r0, p.n, p.k, p.alpha, p.beta,
                             calico_gemm_smem);
}
