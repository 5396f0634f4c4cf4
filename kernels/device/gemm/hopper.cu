// Hopper (sm_90a) GEMM: D = act(alpha * A·B + beta * C + bias), bf16/f16 in, f32 accumulate,
// bf16/f16/f32 out, batched, any M, N, K.
//
// DESIGN
// Warp-specialised, persistent, TMA + wgmma:
//  * 384 threads = 3 warpgroups. Warpgroup 0 is the producer: after setmaxnreg.dec to 40
//    registers, one thread issues TMA loads into a ring of STAGES shared-memory slots. The two
//    consumer warpgroups (setmaxnreg.inc to 232, for 128 f32 accumulators each) run wgmma
//    m64n{WG_N}k16 on the slots. 128*40 + 256*232 = 64512 registers <= 64K.
//  * Tile BM x BN x 64. BM = 128: consumer c owns rows 64c..64c+63, all BN columns (the
//    128x256 default keeps 2 x 128 accumulators and needs 48 KB per stage, 4 stages = 192 KB).
//    BM = 64 (skinny M): both consumers share the 64 rows and split the columns, so small
//    M still gets two warpgroups of MMA issue and more CTAs (smaller BN) to spread B's bytes.
//  * Slots: A box {64 (K), BM} and B box {64 (K), BN} (B K-major, torch Linear weight) or
//    BN/64 boxes {64 (N), 64 (K)} (B N-major, KxN row-major), all with 128B swizzle. K-major
//    operands use wgmma descriptors with SBO = 1024 (8 rows of 128 B) and step K by 32 bytes;
//    N-major B uses the MN-major form (LBO = 64*128 between 64-column chunks, SBO = 1024) with
//    the transpose bit, stepping K by 16 rows = 2048 bytes. Slot bases are 1024-aligned.
//  * Handshake per slot: full[s] (1 arrival: the producer's arrive.expect_tx of the stage's
//    bytes, completed by TMA) and empty[s] (8 arrivals x CLUSTER: lane 0 of each consumer warp after its
//    wgmma reading the slot retired). A running counter `it` over all tiles gives slot
//    it % STAGES and parity (it / STAGES) & 1; the producer waits on empty with the opposite
//    parity, so its first pass over fresh barriers does not block.
//  * Consumers keep one wgmma batch in flight: issue k-tile kt, commit, wait_group<1> (so
//    k-tile kt-1 is done), release slot of kt-1.
//  * Persistent grid (grid = min(tiles, SMs)); CTA i takes tiles i, i + grid, ... in a grouped
//    order: GROUP_M row-tiles sweep all column tiles before moving on, so concurrently running
//    CTAs share A rows and B columns in L2. Batches follow one another.
//  * Epilogue (TMA_STORE = 0) in registers straight from the wgmma layout: alpha, beta*C,
//    bias[n], GELU (erf) or SiLU (gemm/epilogue.cuh, shared by every GEMM kernel), converted to the output type, stored as 2-element vectors
//    when D (and C) are aligned for it, scalars otherwise. While consumers run it, the
//    producer already fills the ring for their next tile.
//  * Epilogue (TMA_STORE = 1, 16-bit D with 16-byte aligned base and strides): the same math,
//    but each warpgroup writes its tile 64x64 at a time into one of two 128B-swizzled staging
//    boxes (8 KB each, conflict-free st.shared.b32), fence.proxy.async, a named barrier of the
//    warpgroup (ids 1 and 2), then its leader thread issues a bulk tensor store (clipped at
//    M/N by the copy engine) and moves on without waiting for it: global writes are coalesced
//    and asynchronous, and the next tile's wgmma starts right after the last box is handed
//    over. The leader waits (wait_group.read 0) before the barrier of the next box, so a
//    staging box is reused only after the store that read it two boxes ago is done.
//  * PINGPONG = 1 (opt-in, CALICO_HOPPER_TUNE mode=pingpong): each consumer warpgroup owns a
//    whole BM x BN tile (BM/64 m64nBNk16 accumulators, at most 128 registers: 128x128, 64x256,
//    ...) and the two take the CTA's tiles in turn: consumer c computes local tiles c, c + 2,
//    ... of the persistent sequence. The producer is unchanged (one ring, tile order); a slot
//    is read by one warpgroup only, so empty[s] counts 4 arrivals x CLUSTER. An ordering
//    handshake on named barriers ORDER_BAR + c (ids 3 and 4, 256 threads: one warpgroup
//    bar.arrive's, the other bar.sync's) hands the tensor cores over: local tile j > 0 starts
//    its main loop only after tile j - 1's main loop has passed all its full[] waits and issued
//    its wgmma, and that consumer then runs its epilogue while the partner's main loop runs.
//    The hand-over is also what keeps the full[] parities right: a consumer skips its
//    partner's k-tiles, so it may only wait on a slot once every earlier phase of that slot
//    has completed, which the chain of turns guarantees. Tile j signals j + 1 only when the
//    CTA has a tile j + 1, so every arrive meets exactly one sync (odd tile counts end with
//    consumer 0's tile and no signal; a CTA with one tile leaves consumer 1 idle).
//  * CLUSTER = 2 (__cluster_dims__): CTAs 2i, 2i+1 take row tiles 2p, 2p+1 of one column tile.
//    Each loads its A and half of the B slot, multicast to both CTAs, so B's L2 -> SM bytes
//    are halved. full[s] still expects STAGE_BYTES (own A + both halves of B); empty[s]
//    counts 16 arrivals (the consumer warps of both CTAs arrive on both CTAs' barriers), so
//    neither producer overwrites a slot its peer still reads. Cluster barriers after the
//    barrier init and before exit (no remote arrive may reach an exited CTA).
//  * SPLIT_K (problems with fewer tiles than half the SMs and a long K): the work list is
//    k_splits copies of the tile list, copy s computing k-tiles [s * per, (s + 1) * per) of
//    every tile (per = ceil(k-tiles / k_splits)), so k_splits CTAs share each tile. D is then
//    an f32 workspace of k_splits * batch matrices, partial s of batch b at matrix s * batch + b,
//    stored raw (the host passes alpha 1 and no C, bias or activation); a second kernel
//    (splitk.cu) sums the partials in split order and applies the real epilogue, so the result
//    does not depend on timing.
//  * SPLIT_FUSED (widest tiles filling between 60% and all of the SMs once): the same work
//    list, but the pieces' f32 sums meet in the kernel: each piece parks them in a workspace
//    slot and counts itself on its tile's counter; the last piece adds every slot in piece
//    order and runs the real epilogue (gemm/split_fused.cuh).
// EDGES
//  * M, N, K not multiples of the tile: TMA zero-fills out-of-bounds parts of a box (and
//    still reports full box bytes), so partial K tiles add zeros; rows >= M and columns >= N
//    are masked at the store. K = 0 gives D = beta*C + bias (accumulators start at zero).
//  * Batches: 3-D tensor maps {inner, rows, batch}; a_batch_step/b_batch_step = 0 broadcasts
//    an operand (batch stride 0) over the batch.
//  * TMA needs 16-byte aligned bases and row/batch strides that are multiples of 16 bytes;
//    the host only picks this kernel when that holds (and the inner dimension is contiguous).
//
// DEFINES (set by kernels/src/gemm/hopper.rs):
//  CALICO_GEMM_IN bf16|f16, CALICO_GEMM_OUT bf16|f16|float, CALICO_GEMM_BM 64|128,
//  CALICO_GEMM_BN 32..256 (multiple of 32 for K-major B; 128|256 for N-major, 64|128|256 when BM=128),
//  CALICO_GEMM_STAGES 2..16, CALICO_GEMM_B_KMAJOR 0|1, CALICO_GEMM_EPILOGUE 0 none|1 gelu|2 silu,
//  CALICO_GEMM_HAS_BIAS 0|1, CALICO_GEMM_HAS_C 0|1, CALICO_GEMM_TMA_STORE 0|1 (16-bit out, warpgroup columns a multiple of 64),
//  CALICO_GEMM_CLUSTER 1|2 (B K-major, or N-major with an even number of 64-column chunks),
//  CALICO_GEMM_PINGPONG 0|1 (BM * BN <= 32768; N-major B needs BN a multiple of 64),
//  CALICO_GEMM_L2_HINT_A / _B 0 none|1 evict_first|2 evict_last (B: without a cluster),
//  CALICO_GEMM_SPLIT_K 1 (f32 D, register epilogue, no cluster or ping-pong; see SPLIT_K),
//  CALICO_GEMM_SPLIT_FUSED 1 (no cluster or ping-pong; p.split_partials, p.split_counters; see
//  SPLIT_FUSED),
//  CALICO_GEMM_STAGED_STORE 1 (with TMA_STORE; the host's default for odd-width D beside
//  aligned operands, CALICO_GEMM_ODD): the staging boxes go to D by the warpgroup's threads,
//  not by TMA, for 16-bit D rows TMA cannot store
//  (odd widths): 16-byte stores on D's own 16-byte boundaries, element stores at row ends.
#include "calico/calico.h"
#include "calico/cluster.cuh"
#include "calico/pipeline.cuh"
#include "calico/tile_ops.cuh"
#include "calico/warpgroup.cuh"
#include "calico/wgmma.cuh"
#include "gemm/epilogue.cuh"
#include "gemm/params.cuh"
#if CALICO_GEMM_STAGED_STORE
#include "gemm/shift.cuh"
#endif
#include "gemm/split_fused.cuh"  // named by if-constexpr branches of every variant

#ifndef CALICO_GEMM_STAGED_STORE
#define CALICO_GEMM_STAGED_STORE 0
#endif
#ifndef CALICO_GEMM_TMA_STORE
#define CALICO_GEMM_TMA_STORE 0
#endif
#ifndef CALICO_GEMM_CLUSTER
#define CALICO_GEMM_CLUSTER 1
#endif
#ifndef CALICO_GEMM_PINGPONG
#define CALICO_GEMM_PINGPONG 0
#endif
#ifndef CALICO_GEMM_SPLIT_K
#define CALICO_GEMM_SPLIT_K 0
#endif
#ifndef CALICO_GEMM_SPLIT_FUSED
#define CALICO_GEMM_SPLIT_FUSED 0
#endif
#ifndef CALICO_GEMM_L2_HINT_A
#define CALICO_GEMM_L2_HINT_A 0
#endif
#ifndef CALICO_GEMM_L2_HINT_B
#define CALICO_GEMM_L2_HINT_B 0
#endif

namespace gemm_hopper {

using calico::uint32_t;
using calico::uint64_t;
using in_t = CALICO_GEMM_IN;
using out_t = CALICO_GEMM_OUT;

constexpr int BM = CALICO_GEMM_BM;
constexpr int BN = CALICO_GEMM_BN;
constexpr int BK = 64;  // one 128-byte swizzled row of 16-bit elements
constexpr int STAGES = CALICO_GEMM_STAGES;
constexpr bool B_KMAJOR = CALICO_GEMM_B_KMAJOR != 0;
constexpr bool TMA_STORE = CALICO_GEMM_TMA_STORE != 0;
constexpr bool STAGED_STORE = CALICO_GEMM_STAGED_STORE != 0;
constexpr int CLUSTER = CALICO_GEMM_CLUSTER;
constexpr bool PINGPONG = CALICO_GEMM_PINGPONG != 0;
constexpr bool SPLIT_K = CALICO_GEMM_SPLIT_K != 0;
constexpr bool SPLIT_FUSED = CALICO_GEMM_SPLIT_FUSED != 0;
// Either split form: the work list is k_splits copies of the tile list.
constexpr bool SPLITS = SPLIT_K || SPLIT_FUSED;
// SPLIT_FUSED's handshake between the two consumer warpgroups (all 256 threads).
constexpr int SPLIT_FUSED_BAR = 5;
// L2 eviction hints for the operand loads: 0 none, 1 evict_first, 2 evict_last.
constexpr int L2_HINT_A = CALICO_GEMM_L2_HINT_A;
constexpr int L2_HINT_B = CALICO_GEMM_L2_HINT_B;
constexpr int CONSUMERS = 2;
constexpr int THREADS = (CONSUMERS + 1) * calico::WARPGROUP_THREADS;
constexpr bool SPLIT_N = !PINGPONG && BM == 64;
constexpr int WG_N = SPLIT_N ? BN / 2 : BN;
constexpr int ACC = WG_N / 2;
// m64 accumulator blocks per consumer warpgroup: its 64 rows (cooperative), or all BM rows of
// its own tile (ping-pong).
constexpr int MI = PINGPONG ? BM / 64 : 1;
// Consumer warpgroups reading (and releasing) each ring slot.
constexpr int SLOT_READERS = PINGPONG ? 1 : CONSUMERS;
// Ping-pong hand-over: named barrier ORDER_BAR + c means "consumer c may run its main loop"
// (the TMA-store epilogue uses ids 1 and 2).
constexpr int ORDER_BAR = 3;
constexpr int ORDER_THREADS = 2 * calico::WARPGROUP_THREADS;
constexpr int A_STAGE_BYTES = BM * BK * 2;
constexpr int B_STAGE_BYTES = BN * BK * 2;
constexpr int STAGE_BYTES = A_STAGE_BYTES + B_STAGE_BYTES;
constexpr int N_CHUNK = 64;                      // columns per N-major TMA box (128 bytes)
constexpr int N_CHUNK_BYTES = N_CHUNK * BK * 2;  // one N-major box: 64 K rows of 128 bytes
constexpr int B_PART_BYTES = B_STAGE_BYTES / CLUSTER;  // the part of a B slot each CTA of a cluster loads
constexpr int STORE_COLS = 64;                          // columns per TMA-store box (128 bytes of 16-bit)
constexpr int STORE_ROWS = 64;                          // rows per TMA-store box: one warpgroup's rows
constexpr int STORE_BOX_BYTES = STORE_ROWS * STORE_COLS * 2;
constexpr int STAGING_BYTES = TMA_STORE ? CONSUMERS * 2 * STORE_BOX_BYTES : 0;  // two boxes per consumer
constexpr int PRODUCER_REGS = 40;
constexpr int CONSUMER_REGS = 232;

static_assert(sizeof(in_t) == 2, "inputs are 16-bit");
static_assert(BM == 64 || BM == 128, "BM is 64 or 128");
static_assert(WG_N % 16 == 0 && WG_N >= 16 && WG_N <= 256 && (WG_N & (WG_N - 1)) == 0, "wgmma N per warpgroup is 16..256, a power of two");
static_assert(B_KMAJOR || WG_N % N_CHUNK == 0, "N-major B needs 64-column chunks per warpgroup");
static_assert(STAGES >= 2 && STAGES <= 16, "2..16 stages");
static_assert(MI * ACC <= 128, "at most 128 f32 accumulators per thread");
static_assert(A_STAGE_BYTES % 1024 == 0 && B_STAGE_BYTES % 1024 == 0, "slots stay 1024-aligned");
static_assert(!TMA_STORE || (sizeof(out_t) == 2 && WG_N % STORE_COLS == 0), "TMA store: 16-bit output, 64-column boxes per warpgroup");
static_assert(CLUSTER == 1 || CLUSTER == 2, "clusters of 1 or 2 CTAs");
static_assert(!STAGED_STORE || TMA_STORE, "the staged store writes out the TMA-store staging boxes");
static_assert(!SPLIT_K || (sizeof(out_t) == 4 && !TMA_STORE && !PINGPONG && CLUSTER == 1 && CALICO_GEMM_EPILOGUE == 0 &&
                           !CALICO_GEMM_HAS_C && !CALICO_GEMM_HAS_BIAS),
              "split-K partials: raw f32 from registers, one CTA per tile share, no ping-pong");
static_assert(!SPLIT_FUSED || (!SPLIT_K && !PINGPONG && CLUSTER == 1), "fused split-K: cooperative consumers, no cluster");
static_assert(CLUSTER == 1 || (B_KMAJOR ? B_PART_BYTES % 1024 == 0 : (BN / N_CHUNK) % CLUSTER == 0),
              "each CTA of a cluster loads a 1024-aligned part of B");

// The shared tiles of one ring slot (tile.cuh's st<>, 128B swizzle, what TMA writes): A as
// BM x BK; B as BN x BK (K-major) or BK x BN (N-major, 64-column chunks of BK rows); and a
// TMA-store staging box of 64 x 64 outputs.
using a_tile = calico::st<in_t, BM, BK>;
template <bool KMAJOR>
struct b_tile_of {
    typedef calico::st<in_t, BN, BK> type;
};
template <>
struct b_tile_of<false> {
    typedef calico::st<in_t, BK, BN> type;
};
using b_tile = b_tile_of<B_KMAJOR>::type;
using store_box = calico::st<out_t, STORE_ROWS, STORE_COLS>;
using ring_t = calico::pipeline::ring<STAGES>;
using cursor_t = calico::pipeline::cursor<STAGES>;
static_assert(sizeof(a_tile) == A_STAGE_BYTES && sizeof(b_tile) == B_STAGE_BYTES, "a slot is one A and one B tile");
static_assert(a_tile::swizzle_bytes == 128 && b_tile::swizzle_bytes == 128, "operand tiles use the 128B swizzle of the tensor maps");
static_assert(B_KMAJOR || b_tile::chunk_bytes == N_CHUNK_BYTES, "N-major B: one TMA box per 64-column chunk");
static_assert(!TMA_STORE || sizeof(store_box) == STORE_BOX_BYTES, "staging boxes are 64 x 64 16-bit outputs");
static_assert(sizeof(ring_t) == 2 * STAGES * 8, "the ring is a full and an empty barrier per slot");

// Byte offsets in dynamic shared memory after rounding its base up to 1024.
constexpr int A_OFFSET = 0;
constexpr int B_OFFSET = STAGES * A_STAGE_BYTES;
constexpr int STAGING_OFFSET = B_OFFSET + STAGES * B_STAGE_BYTES;
constexpr int BAR_OFFSET = STAGING_OFFSET + STAGING_BYTES;
// What the host allocates (its TileConfig::smem_bytes, emitted as CALICO_GEMM_SMEM_BYTES):
// 1024 bytes of alignment slack, the slots, the staging boxes and the ring's barriers.
static_assert(CALICO_GEMM_SMEM_BYTES == 1024 + BAR_OFFSET + (int)sizeof(ring_t), "the host allocates this kernel's shared memory");

// The kernel's parameters after the tensor maps (params.rs: HopperParams).
typedef calico::gemm::hopper_params<out_t> params;
CALICO_CHECK_PARAMS(CALICO_HOPPER_FIELDS, in_t, out_t, CALICO_HOPPER_PARAMS, params);

struct tile_coord {
    int m, n, batch;
};

// Tile t of the grouped order: within a batch, GROUP_M row-tiles walk all column tiles.
CALICO_DEVICE tile_coord tile_at(int t, int m_tiles, int n_tiles, int group_m) {
    const int per_batch = m_tiles * n_tiles;
    const int batch = t / per_batch;
    const int r = t - batch * per_batch;
    const int per_group = group_m * n_tiles;
    const int group = r / per_group;
    const int first_m = group * group_m;
    const int rows = min(m_tiles - first_m, group_m);
    const int in_group = r - group * per_group;
    return {first_m + in_group % rows, in_group / rows, batch};
}

template <class T>
CALICO_DEVICE float load_out(const T* p) {
    return calico::to_float(*p);
}

template <class T>
CALICO_DEVICE bool pairs_aligned(const T* p, long long row_stride, long long batch_stride) {
    return (reinterpret_cast<unsigned long long>(p) % (2 * sizeof(T))) == 0 && row_stride % 2 == 0 && batch_stride % 2 == 0;
}

struct epilogue_args {
    out_t* d;
    const out_t* c;
    const out_t* bias;
    int m, n;
    long long d_row_stride, c_row_stride;
    float alpha, beta;
    bool d_pairs, c_pairs;
};

// alpha * acc + beta * C + bias, activated, for (row, col) and (row, col + 1). C is read only
// when `in_range` (row < M, col < N); has_second says whether col + 1 < N.
CALICO_DEVICE void finish_pair(const epilogue_args& e, float a0, float a1, int row, int col, bool in_range, bool has_second, float bias0,
                               float bias1, float& v0, float& v1) {
    v0 = e.alpha * a0;
    v1 = e.alpha * a1;
#if CALICO_GEMM_HAS_C
    if (in_range) {
        const out_t* cp = e.c + (long long)row * e.c_row_stride + col;
        if (has_second && e.c_pairs) {
            const calico::vec<out_t, 2> cv = *reinterpret_cast<const calico::vec<out_t, 2>*>(cp);
            v0 += e.beta * calico::to_float(cv.v[0]);
            v1 += e.beta * calico::to_float(cv.v[1]);
        } else {
            v0 += e.beta * load_out(cp);
            if (has_second) v1 += e.beta * load_out(cp + 1);
        }
    }
#endif
    v0 = calico::gemm::activation(v0 + bias0);
    v1 = calico::gemm::activation(v1 + bias1);
}

// Applies the epilogue to one warp's 16 x WG_N accumulator slice and stores it to global
// memory from registers (masked at M and N).
CALICO_DEVICE void store_tile(const epilogue_args& e, float (&acc)[ACC], int row0, int col0) {
#pragma unroll
    for (int j = 0; j < WG_N / 8; ++j) {
        const int col = col0 + 8 * j;
        if (col >= e.n) continue;
        const bool has_second = col + 1 < e.n;
        float bias0 = 0.0f, bias1 = 0.0f;
#if CALICO_GEMM_HAS_BIAS
        bias0 = load_out(e.bias + col);
        if (has_second) bias1 = load_out(e.bias + col + 1);
#endif
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + 8 * h;
            if (row >= e.m) continue;
            float v0, v1;
            finish_pair(e, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1], row, col, true, has_second, bias0, bias1, v0, v1);
            out_t* dp = e.d + (long long)row * e.d_row_stride + col;
            if (has_second && e.d_pairs) {
                calico::vec<out_t, 2> dv;
                dv.v[0] = calico::from_float<out_t>(v0);
                dv.v[1] = calico::from_float<out_t>(v1);
                *reinterpret_cast<calico::vec<out_t, 2>*>(dp) = dv;
            } else {
                dp[0] = calico::from_float<out_t>(v0);
                if (has_second) dp[1] = calico::from_float<out_t>(v1);
            }
        }
    }
}

CALICO_DEVICE void st_shared_b32(uint32_t addr, uint32_t v) { asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory"); }

#if CALICO_GEMM_STAGED_STORE
CALICO_DEVICE calico::gemm::words4 ld_shared_v4(uint32_t addr) {
    calico::gemm::words4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
    return v;
}

CALICO_DEVICE unsigned short ld_shared_u16(uint32_t addr) {
    unsigned short v;
    asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(addr) : "memory");
    return v;
}

// The staged store: a finished 64 x 64 staging box (rows row_base.., columns col0.. of D) goes
// to D by the warpgroup's 128 threads. Each D row is cut on D's own 16-byte boundaries into a
// head of 0..7 elements, whole 16-byte chunks and a tail: the chunks are whole-sector stores,
// their words shifted out of two swizzled 16-byte shared chunks (gemm/shift.cuh); head, tail
// and columns past N go element by element. Rows >= M are not written.
CALICO_DEVICE void store_box_rows(const epilogue_args& e, uint32_t box_addr, int row_base, int col0, int tid) {
    constexpr int PIECES = STORE_COLS / 8 + 1;
    const int cols = min(STORE_COLS, e.n - col0);
    if (cols <= 0) return;
    for (int idx = tid; idx < STORE_ROWS * PIECES; idx += calico::WARPGROUP_THREADS) {
        const int r = idx / PIECES;
        const int piece = idx - r * PIECES;
        const int row = row_base + r;
        if (row >= e.m) continue;
        out_t* dst = e.d + (long long)row * e.d_row_stride + col0;
        const int head = int(((16 - (reinterpret_cast<unsigned long long>(dst) & 15)) & 15) / 2);
        const int lo = max(0, head + 8 * (piece - 1));
        const int hi = min(cols, head + 8 * piece);
        if (hi - lo == 8) {
            const int shift = lo % 8;
            const calico::gemm::words4 first = ld_shared_v4(box_addr + store_box::offset(r, lo - shift));
            const calico::gemm::words4 v =
                shift == 0 ? first : calico::gemm::shift_words(shift, first, ld_shared_v4(box_addr + store_box::offset(r, lo - shift + 8)));
            asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst + lo), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                         : "memory");
        } else {
            for (int col = lo; col < hi; ++col) {
                const unsigned short h = ld_shared_u16(box_addr + store_box::offset(r, col));
                *reinterpret_cast<unsigned short*>(dst + col) = h;
            }
        }
    }
}
#endif

// The TMA-store epilogue of one consumer warpgroup: its 64 x WG_N tile, at (row_base,
// col_base) of batch `batch`, goes out in 64 x 64 boxes. Each box is written (epilogue
// applied, converted) into one of the warpgroup's two 128B-swizzled staging buffers, fenced
// to the async proxy, and stored by the warpgroup's leader thread with a bulk tensor store
// that clips at M and N; the warpgroup does not wait for the global writes. `stores` counts
// this warpgroup's boxes over the whole kernel and picks the buffer.
//
// Buffer reuse: box q writes buffer q % 2, last read by the store of box q - 2. The leader
// waits (wait_group.read 0) for every store it issued before the named barrier that ends
// box q - 1, and store q - 1 is only issued after that barrier; so once box q - 1's barrier is
// passed, store q - 2 has finished reading.
CALICO_DEVICE void store_tile_tma(const epilogue_args& e, float (&acc)[ACC], const calico::tensor_map& map_d, store_box* staging,
                                  uint32_t& stores, int row_base, int col_base, int batch, int warp, int lane, int bar_id, bool leader) {
    const int g = lane / 4;
    const int t = lane % 4;
#pragma unroll
    for (int q = 0; q < WG_N / STORE_COLS; ++q) {
        store_box& buf = staging[stores & 1];
        const uint32_t buf_addr = calico::smem_addr(buf.raw);
#pragma unroll
        for (int jj = 0; jj < STORE_COLS / 8; ++jj) {
            const int j = q * (STORE_COLS / 8) + jj;
            const int col = col_base + 8 * j + 2 * t;
            const bool col_ok = col < e.n;
            const bool has_second = col + 1 < e.n;
            float bias0 = 0.0f, bias1 = 0.0f;
#if CALICO_GEMM_HAS_BIAS
            if (col_ok) bias0 = load_out(e.bias + col);
            if (has_second) bias1 = load_out(e.bias + col + 1);
#endif
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = 16 * warp + 8 * h + g;  // row within the box
                const int row = row_base + r;
                float v0, v1;
                finish_pair(e, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1], row, col, col_ok && row < e.m, has_second, bias0, bias1, v0, v1);
                calico::vec<out_t, 2> dv;
                dv.v[0] = calico::from_float<out_t>(v0);
                dv.v[1] = calico::from_float<out_t>(v1);
                st_shared_b32(buf_addr + store_box::offset(r, 8 * jj + 2 * t), *reinterpret_cast<const uint32_t*>(&dv));
            }
        }
#if CALICO_GEMM_STAGED_STORE
        // Every thread has copied box q - 1 out before this barrier, so box q + 1 may
        // overwrite that buffer once it is passed.
        (void)map_d;
        (void)batch;
        (void)leader;
        calico::named_barrier_sync(bar_id, calico::WARPGROUP_THREADS);
        store_box_rows(e, buf_addr, row_base, col_base + q * STORE_COLS, warp * 32 + lane);
#else
        calico::fence_proxy_async();
        if (leader) calico::tma::store_wait_read<0>();
        calico::named_barrier_sync(bar_id, calico::WARPGROUP_THREADS);
        if (leader) {
            calico::store_tma_at(map_d, buf, batch, row_base, col_base + q * STORE_COLS);
            calico::tma::store_commit();
        }
#endif
        ++stores;
    }
}

CALICO_DEVICE uint64_t l2_policy(int hint) {
    return hint == 2 ? calico::tma::policy_evict_last() : calico::tma::policy_evict_first();
}

// An operand tile load (tile `tc`), with the L2 eviction hint HINT (0: none).
template <int HINT, class TILE>
CALICO_DEVICE void load_operand(TILE& dst, const calico::tensor_map& map, calico::coord tc, calico::mbarrier& bar, uint64_t policy) {
    if constexpr (HINT == 0) {
        calico::load_tma(dst, map, tc, bar);
    } else {
        calico::load_tma(dst, map, tc, bar, policy);
    }
}

}  // namespace gemm_hopper

// Parameters (the host builds them in kernels/src/gemm/hopper.rs):
//  map_a: 3-D tensor map over A {K, M, batch}, box {64, BM, 1}, 128B swizzle.
//  map_b: B K-major: {K, N, batch}, box {64, BN / CLUSTER, 1}; N-major: {N, K, batch}, box {64, 64, 1}.
//  map_d: with TMA_STORE, D {N, M, batch}, box {64, 64, 1}, 128B swizzle; unused otherwise.
//  p (gemm/params.cuh): d, c, bias: output, optional C (may equal d), optional bias[N];
//  element strides for d/c rows and batches; a/b_batch_step: 1, or 0 to broadcast an operand
//  over batches; group_m; alpha, beta.
// CLUSTER = 2: CTAs 2i and 2i + 1 form a cluster and take row tiles 2p and 2p + 1 of the same
// column tile; each loads its own A and half of the shared B slot, multicast to both.
#if CALICO_GEMM_CLUSTER > 1
#define CALICO_GEMM_CLUSTER_DIMS __cluster_dims__(CALICO_GEMM_CLUSTER, 1, 1)
#else
#define CALICO_GEMM_CLUSTER_DIMS
#endif
CALICO_KERNEL void __launch_bounds__(gemm_hopper::THREADS, 1) CALICO_GEMM_CLUSTER_DIMS
    calico_gemm_hopper(const __grid_constant__ calico::tensor_map map_a, const __grid_constant__ calico::tensor_map map_b,
                       const __grid_constant__ calico::tensor_map map_d, const gemm_hopper::params p) {
    using namespace gemm_hopper;
    out_t* const d = p.d;
    const out_t* const c = p.c;
    const out_t* __restrict__ const bias = p.bias;
    const int m = p.m, n = p.n, k = p.k, batch = p.batch;
    const long long d_row_stride = p.d_row_stride, d_batch_stride = p.d_batch_stride;
    const long long c_row_stride = p.c_row_stride, c_batch_stride = p.c_batch_stride;
    const int a_batch_step = p.a_batch_step, b_batch_step = p.b_batch_step, group_m = p.group_m;
    const float alpha = p.alpha, beta = p.beta;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    // Dynamic shared memory is only guaranteed 16-byte alignment; 128B swizzle needs 1024.
    // (The padding is the same in every CTA of a cluster: same kernel, same static layout.)
    unsigned char* smem = smem_raw + ((1024 - (calico::smem_addr(smem_raw) & 1023)) & 1023);
    a_tile* a_slots = reinterpret_cast<a_tile*>(smem + A_OFFSET);
    b_tile* b_slots = reinterpret_cast<b_tile*>(smem + B_OFFSET);
    ring_t& ring = *reinterpret_cast<ring_t*>(smem + BAR_OFFSET);

    const int m_tiles = (m + BM - 1) / BM;
    const int n_tiles = (n + BN - 1) / BN;
    // A cluster walks groups of CLUSTER row tiles (the last may reach past M: zero-filled
    // loads, clipped stores).
    const int m_groups = (m_tiles + CLUSTER - 1) / CLUSTER;
    const int tiles = m_groups * n_tiles * batch;
    const int k_tiles = (k + BK - 1) / BK;
    // SPLIT_K: k_splits copies of the tile list, each over its own range of k-tiles.
    const int k_splits = SPLITS ? max(p.k_splits, 1) : 1;
    const int k_per = (k_tiles + k_splits - 1) / k_splits;
    const int work = tiles * k_splits;
    // The k-tiles [kt_begin, kt_end) and the tile of work item w, and which copy it is.
    struct work_item {
        int tile, split, kt_begin, kt_end;
    };
    auto item_at = [&](int w) {
        work_item it;
        it.split = SPLITS ? w / tiles : 0;
        it.tile = w - it.split * tiles;
        it.kt_begin = SPLITS ? it.split * k_per : 0;
        it.kt_end = SPLITS ? min(it.kt_begin + k_per, k_tiles) : k_tiles;
        return it;
    };
    const int group = max(group_m / CLUSTER, 1);
    const int first_work = blockIdx.x / CLUSTER;
    const int work_step = gridDim.x / CLUSTER;
    const int rank = CLUSTER > 1 ? static_cast<int>(calico::cluster::ctarank()) : 0;

    if (threadIdx.x == 0) {
        // A slot is freed by lane 0 of every consumer warp reading it, in every CTA of the cluster.
        ring.init(SLOT_READERS * calico::WARPGROUP_WARPS * CLUSTER);
        calico::fence_barrier_init();
    }
    __syncthreads();
    if constexpr (CLUSTER > 1) calico::cluster::sync();  // the peer's barriers exist before we touch them

    // Producer (one thread issues every copy; the rest of warpgroup 0 only gives back its
    // registers) and consumers, through the pipeline template's role split.
    calico::pipeline::split_roles<PRODUCER_REGS, CONSUMER_REGS>(
        [&] {
            calico::tma::prefetch(map_a);
            calico::tma::prefetch(map_b);
            const uint64_t policy_a = l2_policy(L2_HINT_A);
            const uint64_t policy_b = l2_policy(L2_HINT_B);
            cursor_t cur;
            for (int w = first_work; w < work; w += work_step) {
                const work_item item = item_at(w);
                const tile_coord tc = tile_at(item.tile, m_groups, n_tiles, group);
                const int tile_m = tc.m * CLUSTER + rank;
                const int a_batch = tc.batch * a_batch_step;
                const int b_batch = tc.batch * b_batch_step;
                for (int kt = item.kt_begin; kt < item.kt_end; ++kt, cur.advance()) {
                    // With a cluster, the peer's half of B lands here too and completes its
                    // bytes on this barrier: STAGE_BYTES in all.
                    calico::mbarrier& full = ring.acquire(cur, STAGE_BYTES);
                    const int slot = cur.slot();
                    load_operand<L2_HINT_A>(a_slots[slot], map_a, {a_batch, tile_m, kt}, full, policy_a);
                    if constexpr (CLUSTER == 1) {
                        // K-major: tile (n, kt) of B's N x K view; N-major: tile (kt, n) of K x N.
                        const calico::coord b_tc = B_KMAJOR ? calico::coord{b_batch, tc.n, kt} : calico::coord{b_batch, kt, tc.n};
                        load_operand<L2_HINT_B>(b_slots[slot], map_b, b_tc, full, policy_b);
                    } else {
                        constexpr unsigned short mask = (1u << CLUSTER) - 1;
                        if constexpr (B_KMAJOR) {
                            calico::cluster::load_3d_multicast(b_slots[slot].ptr(rank * (BN / CLUSTER), 0), map_b, kt * BK, tc.n * BN + rank * (BN / CLUSTER),
                                                               b_batch, full, mask);
                        } else {
                            constexpr int per_cta = BN / N_CHUNK / CLUSTER;
#pragma unroll
                            for (int i = 0; i < per_cta; ++i) {
                                const int chunk = rank * per_cta + i;
                                calico::cluster::load_3d_multicast(b_slots[slot].ptr(0, chunk * N_CHUNK), map_b, tc.n * BN + chunk * N_CHUNK, kt * BK,
                                                                   b_batch, full, mask);
                            }
                        }
                    }
                }
            }
        },
        [&](const int consumer) {
            const int warp = calico::warpgroup_warp();
            const int lane = threadIdx.x % 32;
            // This warpgroup's corner of the slot: its first A row, and its first B row (K-major)
            // or column (N-major).
            const int a_row0 = (SPLIT_N || PINGPONG) ? 0 : consumer * 64;
            const int b_mn0 = SPLIT_N ? consumer * WG_N : 0;
            const uint32_t a_base = calico::smem_addr(a_slots);
            const uint32_t b_base = calico::smem_addr(b_slots);
            store_box* staging = reinterpret_cast<store_box*>(smem + STAGING_OFFSET) + consumer * 2;
            const bool leader = warp == 0 && lane == 0;
            uint32_t stores = 0;
            if constexpr (TMA_STORE && !STAGED_STORE) {
                if (leader) calico::tma::prefetch(map_d);
            }

            epilogue_args e;
            e.m = m;
            e.n = n;
            e.bias = bias;
            e.d_row_stride = d_row_stride;
            e.c_row_stride = c_row_stride;
            e.alpha = alpha;
            e.beta = beta;
            e.d_pairs = pairs_aligned(d, d_row_stride, d_batch_stride);
            e.c_pairs = CALICO_GEMM_HAS_C ? pairs_aligned(c, c_row_stride, c_batch_stride) : false;

            // Each warp's 16 rows of the warpgroup's 64 x WG_N accumulator (per ping-pong
            // row block i), as register tiles that wgmma accumulates into.
            calico::wgmma::acc_tile<WG_N> acc[MI];
            // Ping-pong: this warpgroup takes local tiles consumer, consumer + 2, ...; the cursor
            // still counts every k-tile of the CTA (the partner's are skipped), as the producer does.
            const int tile_step = PINGPONG ? 2 : 1;
            int local = PINGPONG ? consumer : 0;
            cursor_t cur;
            if constexpr (PINGPONG) cur.skip(static_cast<uint32_t>(consumer) * k_tiles);
            for (int w = first_work + local * work_step; w < work; w += tile_step * work_step, local += tile_step) {
                const work_item item = item_at(w);
                const tile_coord tc = tile_at(item.tile, m_groups, n_tiles, group);
                const int tile_m = tc.m * CLUSTER + rank;
                if constexpr (PINGPONG) {
                    // Wait for the partner's main loop on the previous local tile to hand over.
                    if (local > 0) calico::named_barrier_sync(ORDER_BAR + consumer, ORDER_THREADS);
                }
#pragma unroll
                for (int i = 0; i < MI; ++i) calico::zero(acc[i]);
                cursor_t prev;  // the slot of the previous k-tile, once there is one
                bool has_prev = false;
                for (int kt = item.kt_begin; kt < item.kt_end; ++kt, cur.advance()) {
                    ring.wait_full(cur);
                    const uint32_t a_slot = a_base + cur.slot() * A_STAGE_BYTES;
                    const uint32_t b_slot = b_base + cur.slot() * B_STAGE_BYTES;
                    calico::wgmma::fence();
#pragma unroll
                    for (int kk = 0; kk < BK / 16; ++kk) {
#pragma unroll
                        for (int i = 0; i < MI; ++i) {
                            calico::wgmma::mma_k16<B_KMAJOR, WG_N, a_tile, b_tile>(acc[i], a_slot, a_row0 + i * 64, b_slot, b_mn0, kk * 16);
                        }
                    }
                    calico::wgmma::commit_group();
                    // Keep this k-tile's batch in flight; the previous one is done after this.
                    calico::wgmma::wait_group<1>();
                    if (has_prev && lane == 0) ring.release_cluster<CLUSTER>(prev);
                    prev = cur;
                    has_prev = true;
                }
                if constexpr (PINGPONG) {
                    // Every full[] wait of this tile has passed and its wgmma are issued: hand the
                    // tensor cores to the partner, if the CTA has a next tile (it is the partner's).
                    if (w < work - work_step) calico::named_barrier_arrive(ORDER_BAR + (1 - consumer), ORDER_THREADS);
                    cur.skip(k_tiles);  // the partner's tile
                }
                calico::wgmma::wait_group<0>();
                if (has_prev && lane == 0) ring.release_cluster<CLUSTER>(prev);
                if constexpr (SPLIT_FUSED) {
                    // Only the tile's last piece goes on, with the whole sum.
                    const int t = threadIdx.x - calico::WARPGROUP_THREADS;
                    constexpr int MERGE_THREADS = CONSUMERS * calico::WARPGROUP_THREADS;
                    if (!gemm_split_fused::merge(p.split_partials, p.split_counters, calico::wgmma::regs(acc[0]), item.tile, item.split, k_splits,
                                                 tiles, t, MERGE_THREADS, SPLIT_FUSED_BAR))
                        continue;
                }

                e.c = CALICO_GEMM_HAS_C ? c + tc.batch * c_batch_stride : nullptr;
#if CALICO_GEMM_STAGED_STORE
                e.d = d + tc.batch * d_batch_stride;
#endif
                const int col_base = tc.n * BN + (SPLIT_N ? consumer * WG_N : 0);
#pragma unroll
                for (int i = 0; i < MI; ++i) {
                    const int row_base = tile_m * BM + (PINGPONG ? i * 64 : (SPLIT_N ? 0 : consumer * 64));
                    if constexpr (TMA_STORE) {
                        store_tile_tma(e, calico::wgmma::regs(acc[i]), map_d, staging, stores, row_base, col_base, tc.batch, warp, lane, 1 + consumer, leader);
                    } else {
                        // SPLIT_K: partial `split` of batch b is matrix split * batch + b.
                        e.d = d + ((long long)(SPLIT_K ? item.split : 0) * batch + tc.batch) * d_batch_stride;
                        store_tile(e, calico::wgmma::regs(acc[i]), row_base + warp * 16 + lane / 4, col_base + (lane % 4) * 2);
                    }
                }
            }
            if constexpr (TMA_STORE && !STAGED_STORE) {
                // Shared memory must outlive the bulk stores reading it.
                if (leader) calico::tma::store_wait<0>();
            }
        });
    // No CTA of a cluster may exit while its peer can still arrive on its barriers.
    if constexpr (CLUSTER > 1) calico::cluster::sync();
}
