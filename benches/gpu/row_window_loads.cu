// Probe: how fast can a GEMM producer warpgroup read the operand rows of a 128 x 256 tile with
// vector loads when the rows start off 16-byte boundaries (K = 4095), with no shared memory and
// no consumers? The question behind it (docs/perf-log.md, session 13): a Hopper GEMM whose
// producer warpgroup loads, shifts and stores such rows itself ran 7-12x slower than the same
// kernel on padded copies, and its producer waited on long-scoreboard results although every
// load was issued a whole k-tile ahead.
//
// The pattern is the producer's: persistent CTAs of 4 warps walk the 4096 x 4096 output's
// 128 x 256 tiles (16 row tiles sweeping all column tiles together, as the GEMM orders them);
// per k-tile of 64 columns every warp reads 32 rows of each 128-row part of the A tile (128
// rows) and the B tile (256 rows): lane (g, j) the aligned 16-byte chunk j of rows 4 i + g
// (i = 0..7) of its rows' 16-byte aligned superset, and lane l the ninth chunk of row l. The
// loaded words are folded into one value per thread so that no load is dead.
//
// Lines: odd rows (ld = K = 4095 elements) with .nc loads not kept in L1, the same with plain
// (L1-cached) loads, aligned rows (ld = 4096) for comparison, odd rows with two CTAs per SM, and
// the same bytes read as runs of 512, 256 or 128 bytes of a row per lane group (1, 2 or 4 rows
// per warp instruction, whole k-tiles in order along each row, 8 instructions in flight), and
// 128-byte visits of one row per instruction (8 lanes active).
// Each gives the median of 20 timed launches and the tiles' operand bytes read per second.
//
// H100 (session 13): 128-byte visits (the producer's) ~1.0 TB/s, 2 CTAs per SM ~2.1; 256-byte
// runs ~1.8 TB/s; 512-byte runs ~7.5-8.0 TB/s, ~10.7 with 2 CTAs per SM; 128-byte visits one row
// per instruction ~0.58 TB/s; the GEMM needs ~9.1.
//
// Build and run on the GPU machine:
//   nvcc -O2 -arch=sm_90a -o /tmp/rows benches/gpu/row_window_loads.cu && /tmp/rows
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#define CHECK(x)                                                                      \
    do {                                                                              \
        cudaError_t e_ = (x);                                                         \
        if (e_ != cudaSuccess) {                                                      \
            std::printf("%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
            return 1;                                                                 \
        }                                                                             \
    } while (0)

constexpr int BM = 128, BN = 256, GROUP_M = 16;

template <int MODE>
__device__ __forceinline__ uint4 load16(const unsigned char* p) {
    uint4 v;
    if (MODE == 1) {
        asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    } else {
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p));
    }
    return v;
}

__device__ __forceinline__ const unsigned char* align16(const unsigned char* p) {
    return reinterpret_cast<const unsigned char*>(reinterpret_cast<unsigned long long>(p) & ~15ull);
}

// 32 rows from `row0` of an operand with `row_bytes` per row, k-tile kt: 8 chunks + the ninth.
template <int MODE>
__device__ __forceinline__ unsigned group(const unsigned char* base, long long row_bytes, int row0, int kt, int lane) {
    const int g = lane >> 3, j = lane & 7;
    const long long k = static_cast<long long>(kt) * 128;
    unsigned acc = 0;
    uint4 v[9];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = load16<MODE>(align16(base + (row0 + 4 * i + g) * row_bytes) + k + 16 * j);
    v[8] = load16<MODE>(align16(base + (row0 + lane) * row_bytes) + k + 128);
#pragma unroll
    for (int i = 0; i < 9; ++i) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
    return acc;
}

// The same rows, read as runs of RUN bytes (128, 256 or 512): each warp instruction covers
// 512 / RUN rows, RUN / 128 k-tiles of each (lane l the 16 bytes at 16 (l % (RUN / 16)) of row
// l / (RUN / 16)); 8 instructions in flight at a time.
template <int RUN>
__device__ __forceinline__ unsigned runs(const unsigned char* base, long long row_bytes, int row0, int step, int lane) {
    constexpr int LANES_PER_ROW = RUN / 16, ROWS = 32 / LANES_PER_ROW;
    unsigned acc = 0;
    for (int r = 0; r < 32; r += 8 * ROWS) {
        uint4 v[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int row = row0 + r + ROWS * i + lane / LANES_PER_ROW;
            v[i] = load16<0>(align16(base + row * row_bytes) + static_cast<long long>(step) * RUN + 16 * (lane % LANES_PER_ROW));
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
    }
    return acc;
}

// 128-byte visits one row per instruction: lanes 0..7 read a row's k-tile, lanes 8..31 idle
// (four times the instructions of the 4-row form for the same bytes).
__device__ __forceinline__ unsigned one_row_visits(const unsigned char* base, long long row_bytes, int row0, int kt, int lane) {
    unsigned acc = 0;
    for (int r = 0; r < 32; r += 8) {
        uint4 v[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            v[i] = make_uint4(0, 0, 0, 0);
            if (lane < 8) v[i] = load16<0>(align16(base + (row0 + r + i) * row_bytes) + kt * 128ll + 16 * lane);
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
    }
    return acc;
}

template <int MODE>
__global__ void __launch_bounds__(128) walk(const unsigned char* a, const unsigned char* b, long long row_bytes, int m, int n, int k_tiles,
                                            unsigned* sink) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int m_tiles = m / BM, n_tiles = n / BN;
    unsigned acc = 0;
    for (int t = blockIdx.x; t < m_tiles * n_tiles; t += gridDim.x) {
        const int per_group = GROUP_M * n_tiles;
        const int first_m = (t / per_group) * GROUP_M;
        const int in_group = t % per_group;
        const int tm = first_m + in_group % GROUP_M, tn = in_group / GROUP_M;
        if constexpr (MODE == 7) {
            for (int kt = 0; kt < k_tiles; ++kt) {
                acc ^= one_row_visits(a, row_bytes, tm * BM + 32 * warp, kt, lane);
                acc ^= one_row_visits(b, row_bytes, tn * BN + 32 * warp, kt, lane);
                acc ^= one_row_visits(b, row_bytes, tn * BN + 128 + 32 * warp, kt, lane);
            }
        } else if constexpr (MODE >= 4) {
            constexpr int RUN = MODE == 4 ? 512 : MODE == 5 ? 256 : 128;
            for (int step = 0; step < k_tiles * 128 / RUN; ++step) {
                acc ^= runs<RUN>(a, row_bytes, tm * BM + 32 * warp, step, lane);
                acc ^= runs<RUN>(b, row_bytes, tn * BN + 32 * warp, step, lane);
                acc ^= runs<RUN>(b, row_bytes, tn * BN + 128 + 32 * warp, step, lane);
            }
        } else {
        for (int kt = 0; kt < k_tiles; ++kt) {
            acc ^= group<MODE>(a, row_bytes, tm * BM + 32 * warp, kt, lane);
            acc ^= group<MODE>(b, row_bytes, tn * BN + 32 * warp, kt, lane);
            acc ^= group<MODE>(b, row_bytes, tn * BN + 128 + 32 * warp, kt, lane);
        }
        }
    }
    sink[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

template <int MODE>
int run(const char* what, int ld, int sms) {
    const int m = 4096, n = 4096, kdim = 4095;
    const long long row_bytes = 2ll * ld;
    // Room for the ninth chunk of the last row.
    const size_t bytes = static_cast<size_t>(row_bytes) * m + 256;
    unsigned char *a, *b;
    unsigned* sink;
    CHECK(cudaMalloc(&a, bytes));
    CHECK(cudaMalloc(&b, bytes));
    CHECK(cudaMalloc(&sink, sms * 128 * sizeof(unsigned)));
    CHECK(cudaMemset(a, 1, bytes));
    CHECK(cudaMemset(b, 2, bytes));
    const int k_tiles = (kdim + 63) / 64;
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int r = 0; r < 23; ++r) {
        CHECK(cudaEventRecord(e0));
        walk<MODE><<<sms, 128>>>(a, b, row_bytes, m, n, k_tiles, sink);
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        float t = 0;
        CHECK(cudaEventElapsedTime(&t, e0, e1));
        if (r >= 3) ms.push_back(t);
    }
    CHECK(cudaGetLastError());
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    // Bytes the GEMM's tiles read: every tile reads its A rows and B rows over all k-tiles.
    const double tile_bytes = (double)(m / BM) * (n / BN) * (BM + BN) * 2.0 * kdim;
    std::printf("%-44s %8.3f ms  %7.0f GB/s of tile operand bytes\n", what, med, tile_bytes / (med * 1e-3) / 1e9);
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    CHECK(cudaFree(sink));
    return 0;
}

int main() {
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    std::printf("persistent grid: %d CTAs of 4 warps; the aligned GEMM reads these bytes in ~0.176 ms\n", sms);
    int rc = 0;
    rc |= run<0>("odd rows (ld 4095), .nc no L1", 4095, sms);
    rc |= run<1>("odd rows (ld 4095), plain loads", 4095, sms);
    rc |= run<0>("aligned rows (ld 4096), .nc no L1", 4096, sms);
    rc |= run<0>("odd rows, 2 CTAs per SM", 4095, 2 * sms);
    rc |= run<4>("odd rows as 512-byte runs (1 row / instr)", 4095, sms);
    rc |= run<4>("the same, 2 CTAs per SM", 4095, 2 * sms);
    rc |= run<5>("odd rows as 256-byte runs (2 rows / instr)", 4095, sms);
    rc |= run<6>("odd rows as 128-byte runs (4 rows / instr)", 4095, sms);
    rc |= run<7>("128-byte visits, 1 row / instr (8 lanes)", 4095, sms);
    return rc;
}
