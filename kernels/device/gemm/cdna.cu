// CDNA GEMM (gfx90a, gfx94x): D = act(alpha * A @ B + beta * C + bias) on the matrix cores,
// written on the tile vocabulary (rt, st, load, mma_ABt / mma_AB) plus the CDNA extras
// (buffer loads, s_setprio).
//
// Block: 8 waves (512 threads), a 256 x 256 output tile, k-tiles of 16. Waves form a 2 (M) x 4
// (N) grid; each owns a 128 x 64 f32 accumulator: 128 of the 256 registers a wave has when two
// waves share a SIMD (gfx90a/gfx94x split one 512-entry file between VGPRs and AGPRs). That
// register budget, not LDS, bounds the tile: with k-tiles of 32 (two stages of 32 KiB, all
// 64 KiB of LDS) the fragments and prefetch take 32 more registers and the kernel spills, so
// the stages hold 256 x 16 of A and of B (32 KiB; 34 KiB with the epilogue's slices, which
// reuse them). About 200 VGPRs (no AGPRs, no spills; see `calico compile --disasm`) give two
// waves per SIMD: one workgroup per CU, one wave of each half on every SIMD.
//
// 8-wave ping-pong: the two 4-wave halves run the same loop one phase apart. Each k-tile t is
// a memory phase M(t) (write the registers prefetched from global into LDS stage t+1, issue the
// buffer loads of k-tile t+2, read tile t's fragments from LDS stage t) and a compute phase C(t)
// (MFMAs at raised priority), each ended by a barrier. Half 1 passes one extra barrier first and
// half 0 one extra last, so while one half is in C(t) the other is in M: one wave of each half
// sits on every SIMD (waves of a workgroup are dealt to the 4 SIMDs in turn), and the matrix
// core and the memory pipes stay busy alternately.
// Race-freedom with two stages: stage t % 2 is written in M(t - 1) by both halves, which end
// at least one barrier before any wave's M(t) reads it; and it is rewritten in M(t + 1), which
// starts at least one barrier after every wave's M(t) read (see the barrier count above).
//
// Edges: rows and k-chunks past the matrix get an out-of-range buffer offset (the hardware
// returns zeros); a chunk that straddles K is masked element by element; stores are bounds-
// checked. Requirements (checked on the host): A's k stride is 1, and B's k stride (B given
// as N x K rows, e.g. a weight used as x @ W^T) or its n stride (K x N rows) is 1; the other
// strides and the batch strides are multiples of 8 elements, base pointers 16-byte aligned,
// and each operand under 2 GiB. K x N rows are transposed on their way into LDS (eight 2-byte
// LDS writes per 16-byte chunk), so both forms feed the same N x K stage and fragments.
//
// Defines: CALICO_GEMM_IN (bf16 | f16), CALICO_GEMM_OUT (bf16 | f16 | float),
// CALICO_GEMM_B_K_MAJOR (1: B's k stride is 1; 0: its n stride is), and the epilogue defines
// of gemm/epilogue.cuh.
#include "calico/tiles.h"
#include "calico/hip_buffer.h"
#include "gemm/epilogue.cuh"

#ifndef CALICO_GEMM_IN
#define CALICO_GEMM_IN bf16
#endif
#ifndef CALICO_GEMM_OUT
#define CALICO_GEMM_OUT bf16
#endif
#ifndef CALICO_GEMM_B_K_MAJOR
#define CALICO_GEMM_B_K_MAJOR 1
#endif

namespace calico {
namespace gemm_cdna {

using In = CALICO_GEMM_IN;
using Out = CALICO_GEMM_OUT;
typedef long long i64;

constexpr int BM = 256, BN = 256, BK = 16;
constexpr int WAVES = 8, THREADS = WAVES * 64;
constexpr int WM = BM / 2, WN = BN / 4;  // one wave's output tile
constexpr int ELEMS = 16 / (int)sizeof(In);  // elements per 16-byte chunk
// An offset no operand reaches (operands are under 2 GiB): the buffer load returns zeros.
constexpr unsigned OUT_OF_RANGE = 0x80000000u;
constexpr bool B_K_MAJOR = CALICO_GEMM_B_K_MAJOR != 0;

typedef st<In, BM, BK> a_stage;
typedef st<In, BN, BK> b_stage;

// The epilogue's per-wave slice of 16 accumulator rows; the padding puts the 8 rows of one
// ds_write_b128 phase on 8 different bank groups.
constexpr int OUT_PAD = 4;

union Shared {
    struct {
        a_stage a[2];
        b_stage b[2];
    };
    float out[WAVES][16][WN + OUT_PAD];
};

// One operand's share of a k-tile: CHUNKS 16-byte pieces per thread, prefetched into registers.
// `rows` of the operand run along the tile's ROWS dimension; each row is contiguous along
// COLS elements (k, or n for K x N rows of B).
template <int ROWS, int COLS>
struct Loader {
    static constexpr int PER_ROW = COLS / ELEMS;
    static constexpr int CHUNKS = ROWS * PER_ROW / THREADS;
    static_assert(CHUNKS * THREADS == ROWS * PER_ROW, "chunks divide among the threads");
    hip::i32x4 regs[CHUNKS];

    // Row r, element column c of the chunk this thread moves as its i-th.
    static CALICO_DEVICE void place(int i, int& r, int& c) {
        const int id = static_cast<int>(thread_x()) + i * THREADS;
        r = id / PER_ROW;
        c = (id % PER_ROW) * ELEMS;
    }

    // Loads the chunks of the tile whose first row is `row0` and first column `col0` from a
    // row-major operand of `rows` x `cols` with row stride `stride` (elements).
    CALICO_DEVICE void fetch(const hip::buffer& buf, i64 row0, i64 col0, i64 rows, i64 cols, i64 stride) {
#pragma unroll
        for (int i = 0; i < CHUNKS; ++i) {
            int r, c;
            place(i, r, c);
            const i64 gr = row0 + r, gc = col0 + c;
            const bool inside = gr < rows && gc < cols;
            const unsigned off = inside ? static_cast<unsigned>((gr * stride + gc) * (i64)sizeof(In)) : OUT_OF_RANGE;
            regs[i] = hip::load_16b(buf, off);
            // A chunk straddling the last column: zero what lies past it (it may be the next
            // row's data, or anything).
            if (inside && gc + ELEMS > cols) {
                const int keep = static_cast<int>(cols - gc);
                typedef short s8 __attribute__((ext_vector_type(8)));
                s8 v = __builtin_bit_cast(s8, regs[i]);
#pragma unroll
                for (int e = 0; e < ELEMS; ++e)
                    if (e >= keep) v[e] = 0;
                regs[i] = __builtin_bit_cast(hip::i32x4, v);
            }
        }
    }

    // Writes the chunks into an LDS tile as two 8-byte halves (the swizzle permutes 8-byte units).
    template <class TILE>
    CALICO_DEVICE void commit(TILE& t) const {
#pragma unroll
        for (int i = 0; i < CHUNKS; ++i) {
            int r, c;
            place(i, r, c);
            typedef int i2 __attribute__((ext_vector_type(2)));
            *reinterpret_cast<i2*>(t.ptr(r, c)) = i2{regs[i].x, regs[i].y};
            *reinterpret_cast<i2*>(t.ptr(r, c + ELEMS / 2)) = i2{regs[i].z, regs[i].w};
        }
    }

    // Writes the chunks transposed: chunk (r, c..c+7) lands at rows c..c+7 of column r.
    template <class TILE>
    CALICO_DEVICE void commit_transposed(TILE& t) const {
        typedef short s8 __attribute__((ext_vector_type(8)));
#pragma unroll
        for (int i = 0; i < CHUNKS; ++i) {
            int r, c;
            place(i, r, c);
            const s8 v = __builtin_bit_cast(s8, regs[i]);
#pragma unroll
            for (int e = 0; e < ELEMS; ++e) *reinterpret_cast<short*>(t.ptr(c + e, r)) = v[e];
        }
    }
};

CALICO_DEVICE void tile(const In* a, i64 a_rs, const In* b, i64 b_rs, const Out* c, i64 c_rs, i64 c_cs, Out* d, i64 d_rs,
                        i64 d_cs, const Out* bias, i64 m, i64 n, i64 k, i64 a_bytes, i64 b_bytes, float alpha, float beta,
                        Shared& sh) {
    // Wave-uniform by construction; readfirstlane tells the compiler, which keeps everything
    // derived from it (wave position, LDS fragment bases, output rows) in scalar registers.
    const int wave = __builtin_amdgcn_readfirstlane(static_cast<int>(thread_x()) / 64);
    const int wm = wave / 4, wn = wave % 4;
    const int half = wave / 4;  // the ping-pong halves: waves 0-3 and 4-7
    const i64 m0 = static_cast<i64>(block_y()) * BM, n0 = static_cast<i64>(block_x()) * BN;
    const hip::buffer abuf = hip::make_buffer(a, static_cast<unsigned>(a_bytes));
    const hip::buffer bbuf = hip::make_buffer(b, static_cast<unsigned>(b_bytes));

    Loader<BM, BK> la;
    Loader<B_K_MAJOR ? BN : BK, B_K_MAJOR ? BK : BN> lb;
    // k-tile t of A is rows m0.., columns 16t..; of B, rows n0.. and columns 16t.. of N x K
    // rows, or rows 16t.. and columns n0.. of K x N rows.
    auto fetch = [&](i64 t) {
        la.fetch(abuf, m0, t * BK, m, k, a_rs);
        if constexpr (B_K_MAJOR)
            lb.fetch(bbuf, n0, t * BK, n, k, b_rs);
        else
            lb.fetch(bbuf, t * BK, n0, k, n, b_rs);
    };
    auto commit = [&](int stage) {
        la.commit(sh.a[stage]);
        if constexpr (B_K_MAJOR)
            lb.commit(sh.b[stage]);
        else
            lb.commit_transposed(sh.b[stage]);
    };

    rt_fl<WM, WN> acc;
    zero(acc);
    const i64 tiles = (k + BK - 1) / BK;

    fetch(0);
    commit(0);
    if (tiles > 1) fetch(1);
    sync_threads();
    if (half == 1) sync_threads();  // half 1 runs one phase behind

    for (i64 t = 0; t < tiles; ++t) {
        const int s = static_cast<int>(t & 1);
        // ---- M(t): stage t + 1 from the prefetch registers, prefetch t + 2, fragments of t.
        if (t + 1 < tiles) commit(s ^ 1);
        if (t + 2 < tiles) fetch(t + 2);
        rt<In, WM, BK> af;
        load(af, sh.a[s], wm * WM, 0);
        rt<In, WN, BK> bf;
        load(bf, sh.b[s], wn * WN, 0);
        sync_threads();
        // ---- C(t): the matrix core, at raised priority while the other half loads.
        hip::set_priority<1>();
        mma_ABt(acc, af, bf, acc);
        hip::set_priority<0>();
        sync_threads();
    }
    if (half == 0) sync_threads();  // the barrier half 1 spent at the start

    // Epilogue through LDS, one 16-row slice of the wave's tile at a time: the slice goes out
    // of the accumulators as 16-byte writes, comes back one column per lane, and each lane
    // finishes its elements (C, bias, activation) with loads and stores that are contiguous
    // across the wave. Only 16 values are in flight beside the accumulators.
    sync_threads();  // every wave is past its last fragment read: the stages are free
    float(*slice)[WN + OUT_PAD] = sh.out[wave];
    const int lane = static_cast<int>(hw_lane());
    // Each lane owns one output column for the whole epilogue.
    const i64 col = n0 + wn * WN + lane;
    const bool col_inside = col < n;
    Out* d_col = d + col * d_cs;
    const Out* c_col = CALICO_GEMM_HAS_C ? c + col * c_cs : nullptr;
    const Out* bias_col = CALICO_GEMM_HAS_BIAS ? bias + col : nullptr;
#pragma unroll
    for (int i = 0; i < WM / 16; ++i) {
#pragma unroll
        for (int j = 0; j < WN / 16; ++j)
            *reinterpret_cast<hip::f32x4_t*>(&slice[lane % 16][16 * j + 4 * (lane / 16)]) = acc.data[i][j];
#pragma unroll 4
        for (int r = 0; r < 16; ++r) {
            const i64 row = m0 + wm * WM + 16 * i + r;  // wave-uniform
            if (row < m && col_inside) {
                const Out* ce = CALICO_GEMM_HAS_C ? c_col + row * c_rs : nullptr;
                d_col[row * d_rs] = gemm::finish<Out>(slice[r][lane], alpha, beta, ce, bias_col);
            }
        }
    }
}

}  // namespace gemm_cdna
}  // namespace calico

// The argument list of the portable kernel (kernels/src/gemm/portable.rs `args`); A's k stride
// is 1 and B's k or n stride is 1, as CALICO_GEMM_B_K_MAJOR says (checked on the host).
CALICO_KERNEL CALICO_MAX_THREADS(512) void calico_gemm_cdna(
    const CALICO_GEMM_IN* __restrict__ a, long long a_rs, long long a_cs, long long a_bs,
    const CALICO_GEMM_IN* __restrict__ b, long long b_rs, long long b_cs, long long b_bs,
    const CALICO_GEMM_OUT* __restrict__ c, long long c_rs, long long c_cs, long long c_bs,
    CALICO_GEMM_OUT* __restrict__ d, long long d_rs, long long d_cs, long long d_bs,
    const CALICO_GEMM_OUT* __restrict__ bias, long long m, long long n, long long k,
    long long batch, long long grid_z, float alpha, float beta) {
    using namespace calico;
    using namespace calico::gemm_cdna;
    __shared__ Shared sh;
    (void)a_cs;
    // The stride between the rows the B loader walks: n for N x K rows, k for K x N rows.
    const long long b_stride = B_K_MAJOR ? b_cs : b_rs;
    // Bytes each operand spans (one batch), for the buffer descriptors' range checks.
    const long long a_bytes = ((m - 1) * a_rs + k) * (long long)sizeof(In);
    const long long b_bytes = B_K_MAJOR ? ((n - 1) * b_cs + k) * (long long)sizeof(In) : ((k - 1) * b_rs + n) * (long long)sizeof(In);
    for (long long z = block_z(); z < batch; z += grid_z) {
        const CALICO_GEMM_OUT* cz = CALICO_GEMM_HAS_C ? c + z * c_bs : nullptr;
        tile(a + z * a_bs, a_rs, b + z * b_bs, b_stride, cz, c_rs, c_cs, d + z * d_bs, d_rs, d_cs, bias, m, n, k, a_bytes, b_bytes,
             alpha, beta, sh);
        // The next batch's prologue overwrites the epilogue's slices, which slow waves may
        // still read.
        sync_threads();
    }
}
