// Decode GEMV (sm_80+): D[M, N] = act(alpha * A[M, K] @ W[N, K]^T + beta * C + bias) for M <= 16,
// with B given as a K-major weight W (torch Linear's layout: row-major N x K, K contiguous).
//
// The work is reading W once (N * K * 2 bytes); the FLOPs are nothing, so the kernel is built
// around keeping enough 16-byte loads in flight and nothing else:
//
//   * No shared-memory staging of W. A warp owns NB groups of 8 weight rows and loads them
//     straight into registers: lane (g = lane / 4, t = lane % 4) reads 8 consecutive K elements
//     (16 bytes) of row g of each group, so 4 lanes cover 32 K per row and a warp covers
//     UNROLL such 32-wide chunks per step: NB * UNROLL 16-byte loads in flight per lane,
//     all issued before any is used.
//   * Those 16 bytes are already two mma.sync m16n8k16 B fragments under a permutation of K:
//     logical k (2t, 2t+1, 2t+8, 2t+9) of the first mma are physical k (8t .. 8t+3) and those
//     of the second mma physical (8t+4 .. 8t+7). A dot product does not care about the order
//     of K, and A's fragments are read with the same permutation: lane (g, t) loads 16 bytes of
//     A rows g and g + 8 at the same 8 K, so A needs no ldmatrix and no shared memory either
//     (A is tiny and stays in L1/L2). Rows of A at or past M are zeros (the m16 tile's unused
//     rows cost tensor-core slots, which are free here, not bytes).
//   * K is split over the WARPS warps of a CTA (32 * UNROLL wide steps, dealt round-robin),
//     so a CTA of 8 * NB weight rows has enough warps to keep its SM busy; the partial m16 x
//     8NB tiles meet in shared memory and are summed in warp order (deterministic), then the
//     shared epilogue (gemm/epilogue.cuh) writes D with any strides.
//   * Edges: rows of W at or past N read nothing; the last, partial step of K reads element by
//     element with bounds; CALICO_GEMV_VEC = 0 (A or W rows not 16-byte aligned) reads every
//     chunk element by element.
//
// Defines:
//   CALICO_GEMM_IN       bf16 | f16
//   CALICO_GEMM_OUT      bf16 | f16 | float
//   CALICO_GEMV_NB       groups of 8 weight rows per CTA (and per warp): 1, 2 or 4
//   CALICO_GEMV_WARPS    warps per CTA splitting K: 1..16
//   CALICO_GEMV_UNROLL   32-wide K chunks per warp step: 1, 2, 4 or 8
//   CALICO_GEMV_VEC      1: A and W rows are 16-byte aligned (vector loads), 0: scalar loads
//   CALICO_GEMV_M16      1 when M > 8 (A rows 8..15 are read)
//   CALICO_GEMV_PREFETCH 1: weight loads ask L2 for the whole 256-byte block (longer DRAM bursts)
//   CALICO_GEMV_ROTATE   1: CTA b starts its K walk at step b (mod the whole steps)
//   CALICO_GEMV_EVICT_FIRST 1: weight loads marked evict-first in L2 (read once: A, re-read by
//                        every CTA, and other data stay)
//   and the epilogue defines of gemm/epilogue.cuh.
#include "calico/calico.h"
#include "calico/mma_sync.cuh"
#include "gemm/epilogue.cuh"

#ifndef CALICO_GEMM_IN
#define CALICO_GEMM_IN bf16
#endif
#ifndef CALICO_GEMM_OUT
#define CALICO_GEMM_OUT bf16
#endif
#ifndef CALICO_GEMV_NB
#define CALICO_GEMV_NB 2
#endif
#ifndef CALICO_GEMV_WARPS
#define CALICO_GEMV_WARPS 8
#endif
#ifndef CALICO_GEMV_UNROLL
#define CALICO_GEMV_UNROLL 4
#endif
#ifndef CALICO_GEMV_VEC
#define CALICO_GEMV_VEC 1
#endif
#ifndef CALICO_GEMV_M16
#define CALICO_GEMV_M16 1
#endif
#ifndef CALICO_GEMV_PREFETCH
#define CALICO_GEMV_PREFETCH 0
#endif
#ifndef CALICO_GEMV_ROTATE
#define CALICO_GEMV_ROTATE 0
#endif
#ifndef CALICO_GEMV_EVICT_FIRST
#define CALICO_GEMV_EVICT_FIRST 0
#endif

namespace calico {
namespace gemv {

using In = CALICO_GEMM_IN;
using Out = CALICO_GEMM_OUT;
typedef long long i64;

constexpr int NB = CALICO_GEMV_NB;
constexpr int WARPS = CALICO_GEMV_WARPS;
constexpr int UNROLL = CALICO_GEMV_UNROLL;
constexpr int THREADS = WARPS * 32;
constexpr int COLS = NB * 8;          // weight rows (columns of D) per CTA
constexpr int STEP = 32 * UNROLL;     // K per warp step
constexpr int PITCH = COLS + 1;       // partial tile row pitch in floats (odd: fewer conflicts)

static_assert(NB == 1 || NB == 2 || NB == 4, "CALICO_GEMV_NB must be 1, 2 or 4");
static_assert(WARPS >= 1 && WARPS <= 16, "CALICO_GEMV_WARPS must be 1..16");
static_assert(UNROLL == 1 || UNROLL == 2 || UNROLL == 4 || UNROLL == 8, "CALICO_GEMV_UNROLL must be 1, 2, 4 or 8");
static_assert(sizeof(In) == 2, "16-bit inputs only");
static_assert(WARPS * 16 * PITCH * 4 <= 48 * 1024, "the partial tiles must fit in static shared memory");

struct u32x4 {
    unsigned x, y, z, w;
};

CALICO_DEVICE u32x4 zero4() { return u32x4{0u, 0u, 0u, 0u}; }

// 16 bytes of the weight, read once: no L1 allocation.
CALICO_DEVICE u32x4 load_stream(const In* p) {
    u32x4 r;
#if CALICO_GEMV_PREFETCH
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
#elif CALICO_GEMV_EVICT_FIRST
    unsigned long long policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));  // not volatile: computed once
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p), "l"(policy));
#else
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
#endif
    return r;
}

// 16 bytes of A: re-read by every CTA, so through L1.
CALICO_DEVICE u32x4 load_cached(const In* p) {
    u32x4 r;
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

// The first `left` (clamped to 0..8) elements at p, element by element, zeros after.
CALICO_DEVICE u32x4 load_scalar(const In* p, i64 left) {
    const unsigned short* q = reinterpret_cast<const unsigned short*>(p);
    unsigned h[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) h[j] = j < left ? unsigned(q[j]) : 0u;
    return u32x4{h[0] | (h[1] << 16), h[2] | (h[3] << 16), h[4] | (h[5] << 16), h[6] | (h[7] << 16)};
}

// 8 elements at p (K offset with `left` elements to the end of the row): a vector load when
// the chunk is whole and aligned, else element by element.
template <bool GUARD, bool STREAM>
CALICO_DEVICE u32x4 load8(const In* p, i64 left) {
#if CALICO_GEMV_VEC
    if (!GUARD || left >= 8) return STREAM ? load_stream(p) : load_cached(p);
    return load_scalar(p, left);
#else
    return load_scalar(p, GUARD ? left : 8);
#endif
}

// One warp step: UNROLL chunks of 32 K starting at k0 (this lane's 8 at k0 + 32 u + 8 t),
// for NB groups of weight rows, accumulated into acc[NB] (m16n8 f32 fragments).
template <bool GUARD>
CALICO_DEVICE void step(float (&acc)[NB][4], const In* const (&wrow)[NB], const bool (&w_in)[NB],
                        const In* a_lo, const In* a_hi, bool lo_in, bool hi_in, i64 k0, int t, i64 k) {
    u32x4 wv[NB][UNROLL];
    u32x4 alo[UNROLL];
    u32x4 ahi[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const i64 kc = k0 + 32 * u + 8 * t;
        const i64 left = k - kc;
#pragma unroll
        for (int j = 0; j < NB; ++j)
            wv[j][u] = (w_in[j] && (!GUARD || left > 0)) ? load8<GUARD, true>(wrow[j] + kc, left) : zero4();
        alo[u] = (lo_in && (!GUARD || left > 0)) ? load8<GUARD, false>(a_lo + kc, left) : zero4();
#if CALICO_GEMV_M16
        ahi[u] = (hi_in && (!GUARD || left > 0)) ? load8<GUARD, false>(a_hi + kc, left) : zero4();
#else
        (void)a_hi;
        (void)hi_in;
        ahi[u] = zero4();
#endif
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const unsigned f0[4] = {alo[u].x, ahi[u].x, alo[u].y, ahi[u].y};
        const unsigned f1[4] = {alo[u].z, ahi[u].z, alo[u].w, ahi[u].w};
#pragma unroll
        for (int j = 0; j < NB; ++j) {
            mma_16816<In>(acc[j], f0, wv[j][u].x, wv[j][u].y);
            mma_16816<In>(acc[j], f1, wv[j][u].z, wv[j][u].w);
        }
    }
}

CALICO_DEVICE void run(const In* __restrict__ a, i64 a_rs, const In* __restrict__ w, i64 w_rs, const Out* c,
                       i64 c_rs, i64 c_cs, Out* d, i64 d_rs, i64 d_cs, const Out* __restrict__ bias, i64 m, i64 n,
                       i64 k, float alpha, float beta) {
    __shared__ float part[WARPS][16][PITCH];
    const int tid = int(thread_x());
    const int lane = tid % 32;
    const int warp = tid / 32;
    const int g = lane / 4;
    const int t = lane % 4;
    const i64 n0 = i64(block_x()) * COLS;

    const In* wrow[NB];
    bool w_in[NB];
#pragma unroll
    for (int j = 0; j < NB; ++j) {
        const i64 row = n0 + j * 8 + g;
        w_in[j] = row < n;
        wrow[j] = w + (w_in[j] ? row * w_rs : 0);
    }
    const bool lo_in = g < m;
    const bool hi_in = g + 8 < m;
    const In* a_lo = a + (lo_in ? i64(g) * a_rs : 0);
    const In* a_hi = a + (hi_in ? i64(g + 8) * a_rs : 0);

    float acc[NB][4];
#pragma unroll
    for (int j = 0; j < NB; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;

    const i64 whole = k / STEP;  // steps that need no bounds
    // CALICO_GEMV_ROTATE: CTA b walks the whole steps from step b (mod whole), so CTAs that
    // run at the same time read different parts of A (every CTA reads all of A; in step with
    // each other they would all hit the same L2 lines of it at once).
    const i64 first = CALICO_GEMV_ROTATE && whole > 0 ? i64(block_x()) % whole : 0;
    i64 s = warp;
    for (; s < whole; s += WARPS) {
        i64 at = s + first;
        if (at >= whole) at -= whole;
        step<false>(acc, wrow, w_in, a_lo, a_hi, lo_in, hi_in, at * STEP, t, k);
    }
    if (s == whole && s * STEP < k) step<true>(acc, wrow, w_in, a_lo, a_hi, lo_in, hi_in, s * STEP, t, k);

    // Park the warp's m16 x COLS partial: fragment e0, e1 at row g, columns 2t, 2t + 1 of its
    // group; e2, e3 at row g + 8.
#pragma unroll
    for (int j = 0; j < NB; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[warp][g + (e >> 1) * 8][j * 8 + 2 * t + (e & 1)] = acc[j][e];
    sync_threads();

    const int rows = m < 16 ? int(m) : 16;
    for (int o = tid; o < rows * COLS; o += THREADS) {
        const int r = o / COLS;
        const int cl = o % COLS;
        const i64 col = n0 + cl;
        if (col >= n) continue;
        float sum = 0.0f;
#pragma unroll
        for (int wi = 0; wi < WARPS; ++wi) sum += part[wi][r][cl];
        const Out* c_at = CALICO_GEMM_HAS_C ? c + r * c_rs + col * c_cs : nullptr;
        const Out* bias_at = CALICO_GEMM_HAS_BIAS ? bias + col : nullptr;
        d[r * d_rs + col * d_cs] = gemm::finish<Out>(sum, alpha, beta, c_at, bias_at);
    }
}

}  // namespace gemv
}  // namespace calico

// Positional parameters, strides in elements (not gemm/params.cuh's struct: passed by value,
// the struct's pointers lose the kernel-boundary __restrict__ and ptxas schedules the K loop
// differently, 3% slower at M = 16, N = K = 4096 on the H100; positional, the SASS is the same
// instruction for instruction as before the vocabulary change). A is M x K with K contiguous
// (a_rs: its row stride); W is the N x K weight with K contiguous (w_rs: its row stride, i.e.
// B's column stride); C and D take any strides. Grid ceil(N / (8 NB)), block 32 * WARPS.
// The host side is gemm::weight_args, the same values as the skinny kernel's WeightParams.
CALICO_KERNEL void __launch_bounds__(CALICO_GEMV_WARPS * 32) calico_gemv(
    const CALICO_GEMM_IN* __restrict__ a, long long a_rs, const CALICO_GEMM_IN* __restrict__ w, long long w_rs,
    const CALICO_GEMM_OUT* c, long long c_rs, long long c_cs, CALICO_GEMM_OUT* d, long long d_rs, long long d_cs,
    const CALICO_GEMM_OUT* __restrict__ bias, long long m, long long n, long long k, float alpha, float beta) {
    calico::gemv::run(a, a_rs, w, w_rs, c, c_rs, c_cs, d, d_rs, d_cs, bias, m, n, k, alpha, beta);
}
