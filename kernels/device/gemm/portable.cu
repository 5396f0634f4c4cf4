// Portable tiled GEMM: D = act(alpha * A @ B + beta * C + bias), f32 accumulation in registers.
// Written only against the vendor contract (calico/calico.h): it compiles for CUDA and HIP and
// does not depend on the lane count. Any M, N, K (edges are bounds-checked), any element
// strides for A, B, C and D, batches over grid z. It runs only what the vendor-neutral tile
// GEMM (tile.cu, on the matrix cores) cannot take: operands with no unit stride at all,
// column-major C or D, sizes past 32-bit indices, GPUs without 16-bit matrix instructions.
//
// Defines:
//   CALICO_GEMM_IN        bf16 | f16           element type of A and B
//   CALICO_GEMM_OUT       bf16 | f16 | float   element type of C, bias and D
//   CALICO_GEMM_BM, CALICO_GEMM_BN   block tile, 64 or 128 each (default 128); the block has
//                         (BM / 8) * (BN / 8) threads, each owning an 8x8 micro-tile
//   CALICO_GEMM_A_K_FAST  1 when A's k stride is 1 (threads then read A along k), else 0
//   CALICO_GEMM_B_K_FAST  1 when B's k stride is 1 and its n stride is not, else 0
//   and the epilogue defines of gemm/epilogue.cuh.
// The read modes only choose which dimension consecutive threads read; any strides are
// correct under either.
#include "calico/calico.h"
#include "gemm/epilogue.cuh"

#ifndef CALICO_GEMM_IN
#define CALICO_GEMM_IN bf16
#endif
#ifndef CALICO_GEMM_OUT
#define CALICO_GEMM_OUT bf16
#endif
#ifndef CALICO_GEMM_BM
#define CALICO_GEMM_BM 128
#endif
#ifndef CALICO_GEMM_BN
#define CALICO_GEMM_BN 128
#endif
#ifndef CALICO_GEMM_A_K_FAST
#define CALICO_GEMM_A_K_FAST 1
#endif
#ifndef CALICO_GEMM_B_K_FAST
#define CALICO_GEMM_B_K_FAST 0
#endif

namespace calico {
namespace gemm_portable {

using In = CALICO_GEMM_IN;
using Out = CALICO_GEMM_OUT;
typedef long long i64;

constexpr int BM = CALICO_GEMM_BM;
constexpr int BN = CALICO_GEMM_BN;
constexpr int BK = 16;
// Each thread owns 2x2 groups of 4x4 outputs, the groups half a tile apart, so that the
// 16-byte shared reads of neighbouring threads are contiguous (no bank conflicts).
constexpr int TM = 8;
constexpr int TN = 8;
constexpr int THREADS_N = BN / TN;
constexpr int THREADS = (BM / TM) * THREADS_N;
// Row padding of the shared tiles: keeps rows 16-byte aligned and spreads the transposing
// stores over banks.
constexpr int PAD = 4;
static_assert(BM == 64 || BM == 128, "CALICO_GEMM_BM must be 64 or 128");
static_assert(BN == 64 || BN == 128, "CALICO_GEMM_BN must be 64 or 128");

// A BK x W slab of a matrix, staged through registers: element (kk, w) of the slab is
// p[(w0 + w) * ws + (k0 + kk) * ks]; the slab is A^T (w = m) or B (w = n). Consecutive threads
// take consecutive elements along k when K_FAST, along w otherwise. THREADS is a multiple of
// BK and of W, so each thread keeps one coordinate and steps the other by a constant: one
// running pointer and one stride, not an address per element.
template <int W, bool K_FAST>
struct Slab {
    static constexpr int PER_THREAD = W * BK / THREADS;
    static constexpr int DKK = K_FAST ? 0 : THREADS / W;  // k step per element
    static constexpr int DW = K_FAST ? THREADS / BK : 0;  // w step per element
    static_assert(THREADS % BK == 0 && THREADS % W == 0, "thread count must tile the slab");
    In v[PER_THREAD];
    const In* p;  // this thread's element 0 in the next slab to load
    i64 step;     // distance from element i to i + 1
    i64 k_step;   // distance from one slab to the next (BK along k)
    int kk;       // this thread's first k within the slab
    int w;        // this thread's first w within the slab

    CALICO_DEVICE void init(const In* base, i64 ws, i64 ks, i64 w0, unsigned tid) {
        kk = K_FAST ? int(tid) % BK : int(tid) / W;
        w = K_FAST ? int(tid) / BK : int(tid) % W;
        step = i64(DW) * ws + i64(DKK) * ks;
        k_step = i64(BK) * ks;
        p = base + (w0 + w) * ws + i64(kk) * ks;
    }

    // Loads the next slab (zeros outside the matrix): `w_left` and `k_left` count the rows
    // and depth left from the slab's origin.
    CALICO_DEVICE void load(i64 w_left, i64 k_left) {
#pragma unroll
        for (int i = 0; i < PER_THREAD; ++i) {
            const bool inside = w + i * DW < w_left && kk + i * DKK < k_left;
            v[i] = inside ? p[i * step] : from_float<In>(0.0f);
        }
        p += k_step;
    }

    CALICO_DEVICE void store(float (*s)[W + PAD]) const {
#pragma unroll
        for (int i = 0; i < PER_THREAD; ++i) s[kk + i * DKK][w + i * DW] = to_float(v[i]);
    }
};

// The main loop's double-buffered slabs; the epilogue reuses the bytes to stage half of the
// output tile at a time.
union Shared {
    struct {
        float a[2][BK][BM + PAD];  // A^T: [k][m]
        float b[2][BK][BN + PAD];  // B:   [k][n]
    } slabs;
    float out[BM / 2][BN + PAD];
};

CALICO_DEVICE void tile(const In* __restrict__ a, i64 a_rs, i64 a_cs, const In* __restrict__ b,
                        i64 b_rs, i64 b_cs, const Out* __restrict__ c, i64 c_rs, i64 c_cs,
                        Out* __restrict__ d, i64 d_rs, i64 d_cs, const Out* __restrict__ bias,
                        i64 m, i64 n, i64 k, float alpha, float beta, Shared& sh) {
    const unsigned tid = thread_x();
    const int tx = int(tid) % THREADS_N;
    const int ty = int(tid) / THREADS_N;
    const i64 m0 = i64(block_y()) * BM;
    const i64 n0 = i64(block_x()) * BN;

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

    Slab<BM, CALICO_GEMM_A_K_FAST != 0> ra;
    Slab<BN, CALICO_GEMM_B_K_FAST != 0> rb;
    ra.init(a, a_rs, a_cs, m0, tid);
    rb.init(b, b_cs, b_rs, n0, tid);
    const i64 m_left = m - m0;
    const i64 n_left = n - n0;
    const i64 k_tiles = (k + BK - 1) / BK;
    ra.load(m_left, k);
    rb.load(n_left, k);
    ra.store(sh.slabs.a[0]);
    rb.store(sh.slabs.b[0]);
    sync_threads();

    for (i64 t = 0; t < k_tiles; ++t) {
        const int cur = int(t & 1);
        const bool more = t + 1 < k_tiles;
        // The next slab's global loads are in flight while this one is multiplied.
        if (more) {
            ra.load(m_left, k - (t + 1) * BK);
            rb.load(n_left, k - (t + 1) * BK);
        }
        const float(*sa)[BM + PAD] = sh.slabs.a[cur];
        const float(*sb)[BN + PAD] = sh.slabs.b[cur];
// Unrolled by 4, not 16: a full unroll lets the AMDGPU scheduler hoist every shared read
        // of the slab and spill.
#pragma unroll 4
        for (int kk = 0; kk < BK; ++kk) {
            float av[TM];
            float bv[TN];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const vec<float, 4> a4 = *reinterpret_cast<const vec<float, 4>*>(&sa[kk][h * (BM / 2) + ty * 4]);
                const vec<float, 4> b4 = *reinterpret_cast<const vec<float, 4>*>(&sb[kk][h * (BN / 2) + tx * 4]);
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    av[h * 4 + i] = a4.v[i];
                    bv[h * 4 + i] = b4.v[i];
                }
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] += av[i] * bv[j];
        }
        // The buffer written here was last read in the previous iteration, before its barrier.
        if (more) {
            ra.store(sh.slabs.a[cur ^ 1]);
            rb.store(sh.slabs.b[cur ^ 1]);
        }
        sync_threads();
    }

    // Epilogue, half a tile (BM / 2 rows) per pass: the accumulators go to shared memory, then
    // consecutive threads finish consecutive columns, so C and D are accessed row by row.
    constexpr int PER_THREAD_OUT = (BM / 2) * BN / THREADS;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int g = 0; g < 2; ++g) {
                vec<float, 4> v4;
#pragma unroll
                for (int j = 0; j < 4; ++j) v4.v[j] = acc[h * 4 + i][g * 4 + j];
                *reinterpret_cast<vec<float, 4>*>(&sh.out[ty * 4 + i][g * (BN / 2) + tx * 4]) = v4;
            }
        sync_threads();
#pragma unroll 4
        for (int q = 0; q < PER_THREAD_OUT; ++q) {
            const int e = int(tid) + q * THREADS;
            const int r = e / BN;
            const int cl = e % BN;
            const i64 row = m0 + h * (BM / 2) + r;
            const i64 col = n0 + cl;
            if (row < m && col < n) {
                const Out* c_at = CALICO_GEMM_HAS_C ? c + row * c_rs + col * c_cs : nullptr;
                const Out* bias_at = CALICO_GEMM_HAS_BIAS ? bias + col : nullptr;
                d[row * d_rs + col * d_cs] = gemm::finish<Out>(sh.out[r][cl], alpha, beta, c_at, bias_at);
            }
        }
        // The next pass (or the next batch's first slab) overwrites what was just read.
        sync_threads();
    }
}

}  // namespace gemm_portable
}  // namespace calico

// Tells the compiler the block size, so it may plan registers for it rather than for the
// largest possible block (which halves the registers on CDNA and spills). Optional in the
// vendor contract.
#ifdef CALICO_MAX_THREADS
#define CALICO_GEMM_PORTABLE_BOUNDS CALICO_MAX_THREADS((CALICO_GEMM_BM / 8) * (CALICO_GEMM_BN / 8))
#else
#define CALICO_GEMM_PORTABLE_BOUNDS
#endif

// Strides are in elements. Block (x, y) computes D[y*BM.., x*BN..] of batches z, z + grid_z,
// ... (z = blockIdx.z), so any batch count fits the grid limit. c and bias may be null when
// their defines are 0.
CALICO_KERNEL void CALICO_GEMM_PORTABLE_BOUNDS calico_gemm_portable(
    const CALICO_GEMM_IN* __restrict__ a, long long a_rs, long long a_cs, long long a_bs,
    const CALICO_GEMM_IN* __restrict__ b, long long b_rs, long long b_cs, long long b_bs,
    const CALICO_GEMM_OUT* __restrict__ c, long long c_rs, long long c_cs, long long c_bs,
    CALICO_GEMM_OUT* __restrict__ d, long long d_rs, long long d_cs, long long d_bs,
    const CALICO_GEMM_OUT* __restrict__ bias, long long m, long long n, long long k,
    long long batch, long long grid_z, float alpha, float beta) {
    using namespace calico;
    using namespace calico::gemm_portable;
    __shared__ Shared sh;
    for (i64 z = block_z(); z < batch; z += grid_z) {
        const CALICO_GEMM_OUT* cz = CALICO_GEMM_HAS_C ? c + z * c_bs : nullptr;
        tile(a + z * a_bs, a_rs, a_cs, b + z * b_bs, b_rs, b_cs, cz, c_rs, c_cs, d + z * d_bs, d_rs,
             d_cs, bias, m, n, k, alpha, beta, sh);
    }
}
