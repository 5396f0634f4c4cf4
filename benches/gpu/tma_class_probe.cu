// Probe: can TMA load rows that start off 16-byte boundaries (a 16-bit matrix whose row stride is
// not a multiple of 8 elements, e.g. K = 4095), and how fast?
//
// TMA needs a 16-byte aligned tensor base and row strides in 16-byte multiples. Rows 8q + c of
// such a matrix (one residue class c of the row index) are 8 * ld elements = 16 * ld bytes
// apart, a valid stride; their base, aligned down to 16 bytes, sits sigma_c elements before the
// class's first row. One tensor map per class, with the box's innermost coordinate moved
// sigma_c elements in, lands each row in shared memory as if it were aligned. A 128 x 64 tile is
// then 16 boxes of 8 rows (class c of row block h at shared rows 64h + 8c ..), its rows permuted
// within each block of 64.
//
// Modes (one CTA per SM, one thread issuing copies, 4 tiles of 16 KB in flight):
//   0  aligned matrix (ld = K + 1), one {64, 128} box per tile (what the GEMM does today)
//   1  the same matrix through 8 class maps, 16 boxes of {64, 8} per tile
//   2  the odd matrix (ld = K) through 8 class maps, 16 boxes per tile
// and a check that mode 2 lands every element where the permuted layout says (128B swizzle).
//
// Build and run on the GPU machine: nvcc -O2 -arch=sm_90a -o /tmp/probe benches/gpu/tma_class_probe.cu -lcuda && /tmp/probe
#include <cuda.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                       \
    do {                                                                               \
        cudaError_t e_ = (x);                                                          \
        if (e_ != cudaSuccess) {                                                       \
            std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
            std::exit(1);                                                              \
        }                                                                              \
    } while (0)

struct Maps {
    CUtensorMap m[8];
    int sigma[8];
};

__device__ __forceinline__ uint32_t saddr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void bar_init(uint64_t* b, int n) {
    asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(saddr(b)), "r"(n));
}
__device__ __forceinline__ void bar_expect(uint64_t* b, int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(saddr(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bar_wait(uint64_t* b, int parity) {
    asm volatile(
        "{ .reg .pred p; W: mbarrier.try_wait.parity.shared.b64 p, [%0], %1; @!p bra W; }" ::"r"(saddr(b)), "r"(parity)
        : "memory");
}
__device__ __forceinline__ void tma2d(void* dst, const CUtensorMap* m, int x, int y, uint64_t* b) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
            saddr(dst)),
        "l"(m), "r"(x), "r"(y), "r"(saddr(b))
        : "memory");
}

constexpr int STAGES = 4;
constexpr int TILE_BYTES = 128 * 64 * 2;

// Tile (mb, kt) into dst: mode 0 one box of map 0, else 16 class boxes.
__device__ __forceinline__ void load_tile(unsigned char* dst, const Maps& maps, int mode, int mb, int kt, uint64_t* b) {
    if (mode == 0) {
        tma2d(dst, &maps.m[0], kt * 64, mb * 128, b);
        return;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int c = 0; c < 8; ++c) tma2d(dst + (64 * h + 8 * c) * 128, &maps.m[c], kt * 64 + maps.sigma[c], (mb * 128 + 64 * h) / 8, b);
    }
}

__global__ void __launch_bounds__(128, 1) stream_tiles(const __grid_constant__ Maps maps, int mode, int m_blocks, int k_tiles, int reps) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024 - (saddr(smem_raw) & 1023)) & 1023);
    uint64_t* bars = reinterpret_cast<uint64_t*>(smem + STAGES * TILE_BYTES);
    if (threadIdx.x != 0) return;
    for (int s = 0; s < STAGES; ++s) bar_init(&bars[s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    const int tiles = m_blocks * k_tiles;
    int i = 0;
    for (int r = 0; r < reps; ++r) {
        for (int t = blockIdx.x; t < tiles; t += gridDim.x, ++i) {
            const int s = i % STAGES;
            if (i >= STAGES) bar_wait(&bars[s], ((i / STAGES) - 1) & 1);
            bar_expect(&bars[s], TILE_BYTES);
            load_tile(smem + s * TILE_BYTES, maps, mode, t / k_tiles, t % k_tiles, &bars[s]);
        }
    }
    for (int j = i - STAGES < 0 ? 0 : i - STAGES; j < i; ++j) bar_wait(&bars[j % STAGES], (j / STAGES) & 1);
}

// Loads tile (mb, kt) in `mode` and compares every landed element with the expected one.
__global__ void check_tile(const __grid_constant__ Maps maps, int mode, int mb, int kt, const uint16_t* a, int m, int k, int ld,
                           unsigned* errors) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024 - (saddr(smem_raw) & 1023)) & 1023);
    uint64_t* bar = reinterpret_cast<uint64_t*>(smem + TILE_BYTES);
    if (threadIdx.x == 0) {
        bar_init(bar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        bar_expect(bar, TILE_BYTES);
        load_tile(smem, maps, mode, mb, kt, bar);
    }
    __syncthreads();
    bar_wait(bar, 0);
    for (int idx = threadIdx.x; idx < 128 * 64; idx += blockDim.x) {
        const int p = idx / 64, j = idx % 64;
        const int row = mode == 0 ? mb * 128 + p : mb * 128 + 64 * (p / 64) + 8 * (p % 8) + (p % 64) / 8;
        const int col = kt * 64 + j;
        const uint16_t want = (row < m && col < k) ? a[(long long)row * ld + col] : 0;
        const uint16_t got = *reinterpret_cast<const uint16_t*>(smem + p * 128 + (((j / 8) ^ (p % 8)) * 16) + (j % 8) * 2);
        if (got != want) atomicAdd(errors, 1u);
    }
}

static CUtensorMap make_map(const void* base, uint64_t inner, uint64_t rows, uint64_t row_bytes, uint32_t box_rows) {
    CUtensorMap map;
    cuuint64_t dims[2] = {inner, rows};
    cuuint64_t strides[1] = {row_bytes};
    cuuint32_t box[2] = {64, box_rows};
    cuuint32_t estr[2] = {1, 1};
    CUresult r = cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box, estr,
                                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        std::fprintf(stderr, "cuTensorMapEncodeTiled failed (%d)\n", (int)r);
        std::exit(1);
    }
    return map;
}

// Class maps over an m x k matrix of row stride ld at a.
static Maps class_maps(const uint16_t* a, int m, int k, int ld) {
    Maps maps{};
    for (int c = 0; c < 8; ++c) {
        const uintptr_t first = reinterpret_cast<uintptr_t>(a + (long long)c * ld);
        const uintptr_t base = first & ~uintptr_t(15);
        maps.sigma[c] = (int)((first - base) / 2);
        maps.m[c] = make_map(reinterpret_cast<const void*>(base), (uint64_t)k + maps.sigma[c], (uint64_t)((m - c + 7) / 8), 16ull * ld, 8);
    }
    return maps;
}

int main() {
    CHECK(cudaFree(0));
    const int k = 4095;
    const int smem = STAGES * TILE_BYTES + 1024 + 64;
    CHECK(cudaFuncSetAttribute(stream_tiles, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CHECK(cudaFuncSetAttribute(check_tile, cudaFuncAttributeMaxDynamicSharedMemorySize, TILE_BYTES + 1024 + 64));
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    unsigned* errors;
    CHECK(cudaMalloc(&errors, sizeof(unsigned)));
    for (int m : {4096, 16384, 4097}) {
        // The odd matrix (ld = k) at an offset of one element, and an aligned one (ld = k + 1).
        const int ld_odd = k, ld_al = k + 1;
        std::vector<uint16_t> host((size_t)m * ld_al + 8);
        for (size_t i = 0; i < host.size(); ++i) host[i] = (uint16_t)(0x3f80 + (i * 2654435761u >> 20) % 97);
        uint16_t *odd_alloc, *al;
        CHECK(cudaMalloc(&odd_alloc, host.size() * 2));
        CHECK(cudaMalloc(&al, host.size() * 2));
        CHECK(cudaMemcpy(odd_alloc, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(al, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
        const uint16_t* odd = odd_alloc + 1;
        Maps m0{};
        m0.m[0] = make_map(al, k, m, 2ull * ld_al, 128);
        Maps m1 = class_maps(al, m, k, ld_al);
        Maps m2 = class_maps(odd, m, k, ld_odd);
        const int m_blocks = (m + 127) / 128, k_tiles = (k + 63) / 64;
        // Correctness of the odd class loads: first, last and a middle tile.
        unsigned total = 0;
        const int probes[3][2] = {{0, 0}, {m_blocks - 1, k_tiles - 1}, {m_blocks / 2, k_tiles / 3}};
        for (auto& pr : probes) {
            CHECK(cudaMemset(errors, 0, sizeof(unsigned)));
            check_tile<<<1, 256, TILE_BYTES + 1024 + 64>>>(m2, 2, pr[0], pr[1], odd, m, k, ld_odd, errors);
            CHECK(cudaGetLastError());
            unsigned e = 0;
            CHECK(cudaMemcpy(&e, errors, sizeof(unsigned), cudaMemcpyDeviceToHost));
            total += e;
        }
        std::printf("M=%d K=%d ld=%d: class-map loads, %u mismatches over 3 tiles (sigma:", m, k, ld_odd, total);
        for (int c = 0; c < 8; ++c) std::printf(" %d", m2.sigma[c]);
        std::printf(")\n");
        const Maps* all[3] = {&m0, &m1, &m2};
        const char* names[3] = {"aligned, one box", "aligned, 16 class boxes", "odd rows, 16 class boxes"};
        const int reps = m >= 16384 ? 2 : 8;
        cudaEvent_t e0, e1;
        CHECK(cudaEventCreate(&e0));
        CHECK(cudaEventCreate(&e1));
        for (int pass = 0; pass < 2; ++pass) {
            for (int mode = 0; mode < 3; ++mode) {
                stream_tiles<<<sms, 128, smem>>>(*all[mode], mode, m_blocks, k_tiles, 1);  // warm
                std::vector<float> ms;
                for (int t = 0; t < 5; ++t) {
                    CHECK(cudaEventRecord(e0));
                    stream_tiles<<<sms, 128, smem>>>(*all[mode], mode, m_blocks, k_tiles, reps);
                    CHECK(cudaEventRecord(e1));
                    CHECK(cudaEventSynchronize(e1));
                    float x;
                    CHECK(cudaEventElapsedTime(&x, e0, e1));
                    ms.push_back(x);
                }
                std::sort(ms.begin(), ms.end());
                const double bytes = (double)m_blocks * k_tiles * TILE_BYTES * reps;
                std::printf("  pass %d mode %d (%s): %.3f ms median, %.0f GB/s into shared memory\n", pass, mode, names[mode], ms[2],
                            bytes / (ms[2] * 1e6));
            }
        }
        CHECK(cudaFree(odd_alloc));
        CHECK(cudaFree(al));
    }
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    return 0;
}
