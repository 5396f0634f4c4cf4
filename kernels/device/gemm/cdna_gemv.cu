// Decode GEMV for CDNA (gfx90a, gfx94x): D[M, N] = act(alpha * A[M, K] @ W[N, K]^T + beta * C + bias)
// for M <= 16, with B given as a K-major weight W (torch Linear's layout: N x K, K contiguous).
//
// The work is reading W once (N * K * 2 bytes); the matrix cores would idle on M <= 16, so the
// kernel is vector FMAs around keeping enough 16-byte loads in flight:
//
//   * A workgroup owns ROWS weight rows; its WAVES waves split K in steps of 64 lanes x 8
//     elements x UNROLL, dealt round-robin. Each weight row and each A row is its own buffer
//     resource of K * 2 bytes (wave-uniform, in scalar registers), so a lane's
//     buffer_load_dwordx4 past the row's end reads zeros: the K tail and rows past N or M need
//     no branches. That needs K even (no dword straddles the row's end; the host checks it).
//   * Per step a lane issues ROWS * UNROLL weight loads before using any (ROWS * UNROLL * 16
//     bytes in flight per lane), then reads A's rows at the same K (A is tiny: it stays in the
//     L1/L2 and is shared by every workgroup) and accumulates MT x ROWS f32 dot products.
//   * The lanes' partials are summed with the wave64 butterfly (calico/reduce.h), the waves'
//     partials in LDS in wave order (deterministic), and the shared epilogue
//     (gemm/epilogue.cuh) writes D with any strides.
//
// Defines:
//   CALICO_GEMM_IN         bf16 | f16
//   CALICO_GEMM_OUT        bf16 | f16 | float
//   CALICO_GEMV_MT         rows of A the kernel is compiled for (M <= MT): 1, 2, 4, 8 or 16
//   CALICO_GEMV_ROWS       weight rows per workgroup: 1, 2 or 4
//   CALICO_GEMV_WAVES      waves per workgroup splitting K: 1, 2 or 4
//   CALICO_GEMV_UNROLL     512-wide K chunks per wave step: 1 or 2
//   and the epilogue defines of gemm/epilogue.cuh.
#include "calico/calico.h"
#include "calico/hip_buffer.h"
#include "gemm/epilogue.cuh"

#ifndef CALICO_GEMM_IN
#define CALICO_GEMM_IN bf16
#endif
#ifndef CALICO_GEMM_OUT
#define CALICO_GEMM_OUT bf16
#endif
#ifndef CALICO_GEMV_MT
#define CALICO_GEMV_MT 1
#endif
#ifndef CALICO_GEMV_ROWS
#define CALICO_GEMV_ROWS 4
#endif
#ifndef CALICO_GEMV_WAVES
#define CALICO_GEMV_WAVES 4
#endif
#ifndef CALICO_GEMV_UNROLL
#define CALICO_GEMV_UNROLL 2
#endif

namespace calico {
namespace gemv_cdna {

using In = CALICO_GEMM_IN;
using Out = CALICO_GEMM_OUT;
typedef long long i64;

constexpr int MT = CALICO_GEMV_MT;
constexpr int ROWS = CALICO_GEMV_ROWS;
constexpr int WAVES = CALICO_GEMV_WAVES;
constexpr int UNROLL = CALICO_GEMV_UNROLL;
constexpr int LANES = 64;
constexpr int ELEMS = 8;                       // elements per 16-byte load
constexpr int STEP = LANES * ELEMS * UNROLL;   // K per wave step
constexpr int OUTS = MT * ROWS;                // partial sums per wave

static_assert(CALICO_LANES == 64, "the CDNA GEMV is written for wave64");
static_assert(MT == 1 || MT == 2 || MT == 4 || MT == 8 || MT == 16, "CALICO_GEMV_MT must be 1, 2, 4, 8 or 16");
static_assert(ROWS == 1 || ROWS == 2 || ROWS == 4, "CALICO_GEMV_ROWS must be 1, 2 or 4");
static_assert(WAVES == 1 || WAVES == 2 || WAVES == 4, "CALICO_GEMV_WAVES must be 1, 2 or 4");
static_assert(UNROLL == 1 || UNROLL == 2, "CALICO_GEMV_UNROLL must be 1 or 2");
static_assert(sizeof(In) == 2, "16-bit inputs only");

// Row `row` of a row-major matrix as a buffer of `k` elements; rows at or past `rows` are empty
// buffers (every load reads zeros).
CALICO_DEVICE hip::buffer row_buffer(const In* base, i64 row, i64 rows, i64 stride, i64 k) {
    const bool in = row < rows;
    return hip::make_buffer(base + (in ? row * stride : 0), in ? unsigned(k * 2) : 0u);
}

// The 8 elements of a 16-byte load, widened.
CALICO_DEVICE void widen(float (&dst)[ELEMS], hip::i32x4 raw) {
    const vec<In, ELEMS> packed = __builtin_bit_cast(vec<In, ELEMS>, raw);
#pragma unroll
    for (int e = 0; e < ELEMS; ++e) dst[e] = to_float(packed.v[e]);
}

CALICO_DEVICE void run(const In* __restrict__ a, i64 a_rs, const In* __restrict__ w, i64 w_rs, const Out* c,
                       i64 c_rs, i64 c_cs, Out* d, i64 d_rs, i64 d_cs, const Out* __restrict__ bias, i64 m, i64 n,
                       i64 k, float alpha, float beta) {
    __shared__ float part[WAVES][OUTS];
    const int tid = int(thread_x());
    const int lane = tid % LANES;
    const int wave = tid / LANES;
    const i64 n0 = i64(block_x()) * ROWS;

    hip::buffer wrow[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) wrow[r] = row_buffer(w, n0 + r, n, w_rs, k);
    hip::buffer arow[MT];
#pragma unroll
    for (int i = 0; i < MT; ++i) arow[i] = row_buffer(a, i, m, a_rs, k);

    float acc[MT][ROWS];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int r = 0; r < ROWS; ++r) acc[i][r] = 0.0f;

    const i64 steps = (k + STEP - 1) / STEP;
    for (i64 s = wave; s < steps; s += WAVES) {
        const unsigned byte0 = unsigned(s * STEP + lane * ELEMS) * 2u;
        hip::i32x4 wv[UNROLL][ROWS];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
#pragma unroll
            for (int r = 0; r < ROWS; ++r) wv[u][r] = hip::load_16b(wrow[r], byte0 + u * LANES * ELEMS * 2);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            float wf[ROWS][ELEMS];
#pragma unroll
            for (int r = 0; r < ROWS; ++r) widen(wf[r], wv[u][r]);
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                float af[ELEMS];
                widen(af, hip::load_16b(arow[i], byte0 + u * LANES * ELEMS * 2));
#pragma unroll
                for (int r = 0; r < ROWS; ++r)
#pragma unroll
                    for (int e = 0; e < ELEMS; ++e) acc[i][r] = fmaf(af[e], wf[r][e], acc[i][r]);
            }
        }
    }

#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const float v = warp_sum(acc[i][r]);
            if (lane == 0) part[wave][i * ROWS + r] = v;
        }
    sync_threads();

    for (int o = tid; o < OUTS; o += WAVES * LANES) {
        const int i = o / ROWS;
        const i64 col = n0 + o % ROWS;
        if (i >= m || col >= n) continue;
        float sum = 0.0f;
#pragma unroll
        for (int wi = 0; wi < WAVES; ++wi) sum += part[wi][o];
        (void)c;
        (void)bias;
        const Out* c_at = CALICO_GEMM_HAS_C ? c + i * c_rs + col * c_cs : nullptr;
        const Out* bias_at = CALICO_GEMM_HAS_BIAS ? bias + col : nullptr;
        d[i * d_rs + col * d_cs] = gemm::finish<Out>(sum, alpha, beta, c_at, bias_at);
    }
}

}  // namespace gemv_cdna
}  // namespace calico

// Strides in elements. A is M x K with K contiguous (a_rs: its row stride); W is the N x K weight
// with K contiguous (w_rs: its row stride, i.e. B's column stride); C and D take any strides.
// K even, both base pointers and row strides 4-byte aligned, K * 2 < 2^31. Grid ceil(N / ROWS),
// block 64 * WAVES.
CALICO_KERNEL CALICO_MAX_THREADS(CALICO_GEMV_WAVES * 64) void calico_gemv_cdna(
    const CALICO_GEMM_IN* __restrict__ a, long long a_rs, const CALICO_GEMM_IN* __restrict__ w, long long w_rs,
    const CALICO_GEMM_OUT* c, long long c_rs, long long c_cs, CALICO_GEMM_OUT* d, long long d_rs, long long d_cs,
    const CALICO_GEMM_OUT* __restrict__ bias, long long m, long long n, long long k, float alpha, float beta) {
    calico::gemv_cdna::run(a, a_rs, w, w_rs, c, c_rs, c_cs, d, d_rs, d_cs, bias, m, n, k, alpha, beta);
}
