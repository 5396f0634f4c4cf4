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
//    bytes, completed by TMA) and empty[s] (8 arrivals: lane 0 of each consumer warp after its
//    wgmma reading the slot retired). A running counter `it` over all tiles gives slot
//    it % STAGES and parity (it / STAGES) & 1; the producer waits on empty with the opposite
//    parity, so its first pass over fresh barriers does not block.
//  * Consumers keep one wgmma batch in flight: issue k-tile kt, commit, wait_group<1> (so
//    k-tile kt-1 is done), release slot of kt-1.
//  * Persistent grid (grid = min(tiles, SMs)); CTA i takes tiles i, i + grid, ... in a grouped
//    order: GROUP_M row-tiles sweep all column tiles before moving on, so concurrently running
//    CTAs share A rows and B columns in L2. Batches follow one another.
//  * Epilogue in registers straight from the wgmma layout: alpha, beta*C, bias[n], GELU (erf)
//    or SiLU, converted to the output type, stored as 2-element vectors when D (and C) are
//    aligned for it, scalars otherwise. While consumers run it, the producer already fills
//    the ring for their next tile.
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
//  CALICO_GEMM_STAGES 2..8, CALICO_GEMM_B_KMAJOR 0|1, CALICO_GEMM_EPILOGUE 0 none|1 gelu|2 silu,
//  CALICO_GEMM_HAS_BIAS 0|1, CALICO_GEMM_HAS_C 0|1.
#include "calico/calico.h"
#include "calico/mbarrier.cuh"
#include "calico/tma.cuh"
#include "calico/warpgroup.cuh"
#include "calico/wgmma.cuh"

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
constexpr int CONSUMERS = 2;
constexpr int THREADS = (CONSUMERS + 1) * calico::WARPGROUP_THREADS;
constexpr bool SPLIT_N = BM == 64;
constexpr int WG_N = SPLIT_N ? BN / 2 : BN;
constexpr int ACC = WG_N / 2;
constexpr int A_STAGE_BYTES = BM * BK * 2;
constexpr int B_STAGE_BYTES = BN * BK * 2;
constexpr int STAGE_BYTES = A_STAGE_BYTES + B_STAGE_BYTES;
constexpr int N_CHUNK = 64;                   // columns per N-major TMA box (128 bytes)
constexpr int N_CHUNK_BYTES = N_CHUNK * BK * 2;  // one N-major box: 64 K rows of 128 bytes
constexpr int PRODUCER_REGS = 40;
constexpr int CONSUMER_REGS = 232;

static_assert(sizeof(in_t) == 2, "inputs are 16-bit");
static_assert(BM == 64 || BM == 128, "BM is 64 or 128");
static_assert(WG_N % 16 == 0 && WG_N >= 16 && WG_N <= 256 && (WG_N & (WG_N - 1)) == 0, "wgmma N per warpgroup is 16..256, a power of two");
static_assert(B_KMAJOR || WG_N % N_CHUNK == 0, "N-major B needs 64-column chunks per warpgroup");
static_assert(STAGES >= 2 && STAGES <= 8, "2..8 stages");
static_assert(A_STAGE_BYTES % 1024 == 0 && B_STAGE_BYTES % 1024 == 0, "slots stay 1024-aligned");

// Byte offsets in dynamic shared memory after rounding its base up to 1024.
constexpr int A_OFFSET = 0;
constexpr int B_OFFSET = STAGES * A_STAGE_BYTES;
constexpr int BAR_OFFSET = B_OFFSET + STAGES * B_STAGE_BYTES;
// The host allocates SMEM_BYTES = 1024 (alignment slack) + BAR_OFFSET + 2 * STAGES * 8.

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

CALICO_DEVICE float activate(float x) {
#if CALICO_GEMM_EPILOGUE == 1
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
#elif CALICO_GEMM_EPILOGUE == 2
    return x / (1.0f + expf(-x));
#else
    return x;
#endif
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

// Applies the epilogue to one warp's 16 x WG_N accumulator slice and stores it.
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
            float v0 = e.alpha * acc[4 * j + 2 * h];
            float v1 = e.alpha * acc[4 * j + 2 * h + 1];
#if CALICO_GEMM_HAS_C
            const out_t* cp = e.c + (long long)row * e.c_row_stride + col;
            if (has_second && e.c_pairs) {
                const calico::vec<out_t, 2> cv = *reinterpret_cast<const calico::vec<out_t, 2>*>(cp);
                v0 += e.beta * calico::to_float(cv.v[0]);
                v1 += e.beta * calico::to_float(cv.v[1]);
            } else {
                v0 += e.beta * load_out(cp);
                if (has_second) v1 += e.beta * load_out(cp + 1);
            }
#endif
            v0 = activate(v0 + bias0);
            v1 = activate(v1 + bias1);
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

}  // namespace gemm_hopper

// Parameters (in order; the host builds them in kernels/src/gemm/hopper.rs):
//  map_a: 3-D tensor map over A {K, M, batch}, box {64, BM, 1}, 128B swizzle.
//  map_b: B K-major: {K, N, batch}, box {64, BN, 1}; N-major: {N, K, batch}, box {64, 64, 1}.
//  d, c, bias: output, optional C (may equal d), optional bias[N]; element strides for d/c rows
//  and batches; a/b_batch_step: 1, or 0 to broadcast an operand over batches.
CALICO_KERNEL void __launch_bounds__(gemm_hopper::THREADS, 1)
    calico_gemm_hopper(const __grid_constant__ calico::tensor_map map_a, const __grid_constant__ calico::tensor_map map_b,
                       gemm_hopper::out_t* d, const gemm_hopper::out_t* c, const gemm_hopper::out_t* __restrict__ bias, int m, int n,
                       int k, int batch, long long d_row_stride, long long d_batch_stride, long long c_row_stride,
                       long long c_batch_stride, int a_batch_step, int b_batch_step, int group_m, float alpha, float beta) {
    using namespace gemm_hopper;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    // Dynamic shared memory is only guaranteed 16-byte alignment; 128B swizzle needs 1024.
    unsigned char* smem = smem_raw + ((1024 - (calico::smem_addr(smem_raw) & 1023)) & 1023);
    calico::mbarrier* full = reinterpret_cast<calico::mbarrier*>(smem + BAR_OFFSET);
    calico::mbarrier* empty = full + STAGES;

    const int m_tiles = (m + BM - 1) / BM;
    const int n_tiles = (n + BN - 1) / BN;
    const int tiles = m_tiles * n_tiles * batch;
    const int k_tiles = (k + BK - 1) / BK;

    if (threadIdx.x == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            calico::init(full[s], 1);
            calico::init(empty[s], CONSUMERS * calico::WARPGROUP_WARPS);
        }
        calico::fence_barrier_init();
    }
    __syncthreads();

    if (calico::warpgroup_id() == 0) {
        // Producer: one thread issues every copy; the rest of the warpgroup only gives back
        // its registers.
        calico::setmaxnreg_dec<PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            calico::tma::prefetch(map_a);
            calico::tma::prefetch(map_b);
            uint32_t it = 0;
            for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
                const tile_coord tc = tile_at(t, m_tiles, n_tiles, group_m);
                const int a_batch = tc.batch * a_batch_step;
                const int b_batch = tc.batch * b_batch_step;
                for (int kt = 0; kt < k_tiles; ++kt, ++it) {
                    const int slot = it % STAGES;
                    const uint32_t parity = (it / STAGES) & 1;
                    calico::wait(empty[slot], parity ^ 1);
                    calico::arrive_expect_tx(full[slot], STAGE_BYTES);
                    unsigned char* a_dst = smem + A_OFFSET + slot * A_STAGE_BYTES;
                    unsigned char* b_dst = smem + B_OFFSET + slot * B_STAGE_BYTES;
                    calico::tma::load_3d(a_dst, map_a, kt * BK, tc.m * BM, a_batch, full[slot]);
                    if constexpr (B_KMAJOR) {
                        calico::tma::load_3d(b_dst, map_b, kt * BK, tc.n * BN, b_batch, full[slot]);
                    } else {
#pragma unroll
                        for (int chunk = 0; chunk < BN / N_CHUNK; ++chunk) {
                            calico::tma::load_3d(b_dst + chunk * N_CHUNK_BYTES, map_b, tc.n * BN + chunk * N_CHUNK, kt * BK, b_batch,
                                                 full[slot]);
                        }
                    }
                }
            }
        }
    } else {
        calico::setmaxnreg_inc<CONSUMER_REGS>();
        const int consumer = calico::warpgroup_id() - 1;
        const int warp = calico::warpgroup_warp();
        const int lane = threadIdx.x % 32;
        // This warpgroup's corner of the slot, in bytes.
        const uint32_t a_part = SPLIT_N ? 0 : consumer * 64 * BK * 2;
        const uint32_t b_part = !SPLIT_N ? 0 : (B_KMAJOR ? consumer * WG_N * BK * 2 : consumer * (WG_N / N_CHUNK) * N_CHUNK_BYTES);
        const uint32_t a_base = calico::smem_addr(smem + A_OFFSET) + a_part;
        const uint32_t b_base = calico::smem_addr(smem + B_OFFSET) + b_part;

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

        float acc[ACC];
        uint32_t it = 0;
        for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
            const tile_coord tc = tile_at(t, m_tiles, n_tiles, group_m);
#pragma unroll
            for (int i = 0; i < ACC; ++i) acc[i] = 0.0f;
            int prev_slot = -1;
            for (int kt = 0; kt < k_tiles; ++kt, ++it) {
                const int slot = it % STAGES;
                const uint32_t parity = (it / STAGES) & 1;
                calico::wait(full[slot], parity);
                const uint32_t a_slot = a_base + slot * A_STAGE_BYTES;
                const uint32_t b_slot = b_base + slot * B_STAGE_BYTES;
                calico::wgmma::fence();
#pragma unroll
                for (int kk = 0; kk < BK / 16; ++kk) {
                    const uint64_t desc_a = calico::wgmma::desc_kmajor_128b(a_slot + kk * 32);
                    const uint64_t desc_b = B_KMAJOR ? calico::wgmma::desc_kmajor_128b(b_slot + kk * 32)
                                                     : calico::wgmma::desc_mnmajor_128b(b_slot + kk * 16 * 128, BK);
                    calico::wgmma::mma<in_t, WG_N>::template ss<B_KMAJOR ? 0 : 1>(acc, desc_a, desc_b, 1);
                }
                calico::wgmma::commit_group();
                // Keep this k-tile's batch in flight; the previous one is done after this.
                calico::wgmma::wait_group<1>();
                if (prev_slot >= 0 && lane == 0) calico::arrive(empty[prev_slot]);
                prev_slot = slot;
            }
            calico::wgmma::wait_group<0>();
            if (prev_slot >= 0 && lane == 0) calico::arrive(empty[prev_slot]);

            e.d = d + tc.batch * d_batch_stride;
            e.c = CALICO_GEMM_HAS_C ? c + tc.batch * c_batch_stride : nullptr;
            const int row0 = tc.m * BM + (SPLIT_N ? 0 : consumer * 64) + warp * 16 + lane / 4;
            const int col0 = tc.n * BN + (SPLIT_N ? consumer * WG_N : 0) + (lane % 4) * 2;
            store_tile(e, acc, row0, col0);
        }
    }
}
