// The vendor-neutral tile GEMM: D = act(alpha * A @ B + beta * C + bias), f32 accumulation on
// the matrix cores. Written only against the shared tile vocabulary (calico/tiles.h) and the
// shared epilogue, so the same source compiles to mma.sync on NVIDIA (sm_80, sm_90a) and to
// MFMA on CDNA (gfx90a, gfx942).
//
// A block is four warps/wavefronts over a BM x BN output tile (eight for 256 x 128), each
// owning a BM/2 x BN/2 quarter (a 64 x 64 eighth). Every BK step the A and B slabs move from
// global memory into registers, then into shared tiles, and the warps read back the fragments
// the product needs; the next slab's global loads are in flight during the current product
// (two shared buffers, one barrier per step). An operand whose rows start on 16-byte
// boundaries (CALICO_GEMM_*_VEC, set by the host) moves through `gt`: the whole block loads
// 16-byte chunks (LDG.128 / global_load_dwordx4) and stores each with one 16-byte shared store
// (STS.128 / ds_write_b128), chunks across an edge element by element. Any other operand (odd
// K, odd strides or base) keeps `load(rt, gl, coord)`: element loads with zeros outside the
// matrix, so any M, N, K and any row stride work. Element loads for every operand made the
// first version LSU-bound on an H100 (42.8 TFLOP/s at 4096^3, 10.3 at 1000x999x1000).
//
// Operands: A is row-major (unit stride along K) or column-major (unit stride along M: read
// as A^T, K x M row-major); B is K x N row-major (unit stride along N) or N x K row-major
// (unit stride along K: torch Linear's weight). The product op follows at compile time:
// mma_AB, mma_ABt, mma_AtB or mma_AtBt. C and D are row-major (unit column stride).
//
// Defines:
//   CALICO_GEMM_IN        bf16 | f16           element type of A and B
//   CALICO_GEMM_OUT       bf16 | f16 | float   element type of C, bias and D
//   CALICO_GEMM_BM, CALICO_GEMM_BN   block tile: 64 or 128 each, or 256 x 128 (eight warps)
//   CALICO_GEMM_A_KMAJOR  1: A's K stride is 1 (row-major); 0: A's M stride is 1
//   CALICO_GEMM_B_KMAJOR  1: B's K stride is 1 (N x K weight); 0: B's N stride is 1
//   CALICO_GEMM_A_VEC, CALICO_GEMM_B_VEC   1 when the operand's base, row stride (the non-unit
//                         one) and batch stride are multiples of 16 bytes: its slabs then move
//                         in 16-byte chunks (gt) instead of element by element
//   and the epilogue defines of gemm/epilogue.cuh.
#include "calico/tiles.h"
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
#ifndef CALICO_GEMM_A_KMAJOR
#define CALICO_GEMM_A_KMAJOR 1
#endif
#ifndef CALICO_GEMM_B_KMAJOR
#define CALICO_GEMM_B_KMAJOR 1
#endif
#ifndef CALICO_GEMM_A_VEC
#define CALICO_GEMM_A_VEC 0
#endif
#ifndef CALICO_GEMM_B_VEC
#define CALICO_GEMM_B_VEC 0
#endif

namespace calico {
namespace gemm_tile {

using In = CALICO_GEMM_IN;
using Out = CALICO_GEMM_OUT;
typedef long long i64;

constexpr int BM = CALICO_GEMM_BM;
constexpr int BN = CALICO_GEMM_BN;
constexpr int BK = 32;
// Warps along M (two, or four for 256-row blocks) by two along N; each owns WM x WN outputs.
constexpr int WARPS_M = BM == 256 ? 4 : 2;
constexpr int WARPS = WARPS_M * 2;
constexpr int WM = BM / WARPS_M;
constexpr int WN = BN / 2;
constexpr bool A_KMAJOR = CALICO_GEMM_A_KMAJOR != 0;
constexpr bool B_KMAJOR = CALICO_GEMM_B_KMAJOR != 0;
static_assert((BM == 64 || BM == 128 || (BM == 256 && BN == 128)) && (BN == 64 || BN == 128),
              "block tiles: 64 or 128 each, or 256 x 128");

// X when C is true, else Y.
template <bool C, class X, class Y>
struct pick {
    typedef X type;
};
template <class X, class Y>
struct pick<false, X, Y> {
    typedef Y type;
};

// One operand's BK-deep slab of a block: MN rows of the output side (BM of A, BN of B) by BK.
// Stored as it lies in memory: MN x BK when the operand is K-major, BK x MN otherwise; either
// way the matrix `g` is read row-major. VEC (rows 16-byte aligned): the whole block moves the
// slab in 16-byte chunks (gt); otherwise each warp moves an equal share of the MN side as a
// register tile, element by element.
template <int MN, bool KMAJOR, bool VEC>
struct Slab {
    static constexpr int Q = MN / WARPS;  // the share one warp moves
    static_assert(Q % 16 == 0, "each warp moves whole 16-row base tiles");
    static constexpr int SR = KMAJOR ? MN : BK, SC = KMAJOR ? BK : MN;
    typedef st<In, SR, SC> shared;
    typedef typename pick<VEC, gt<In, SR, SC, WARPS * CALICO_LANES>, rt<In, KMAJOR ? Q : BK, KMAJOR ? BK : Q, row_l>>::type part;
    // A product operand: W rows/columns of the MN side by BK, as MMA takes it (row_l when the
    // slab is MN x BK, the transpose col_l when it is BK x MN).
    template <int W>
    using fragment_t = rt<In, KMAJOR ? W : BK, KMAJOR ? BK : W, typename pick<KMAJOR, row_l, col_l>::type>;

    // The operand from K step `kt` on, as a matrix of its own: the pointer advanced to the
    // step's first element and the K extent cut to what is left. The tile coordinates (and
    // with them each lane's element offsets) then stay the same from step to step, so the
    // compiler computes the offsets once instead of per step.
    static CALICO_DEVICE gl<In> from_step(const gl<In>& g, int kt) {
        gl<In> s = g;
        if constexpr (KMAJOR) {
            s.ptr += static_cast<long long>(kt) * BK;
            s.cols -= kt * BK;
        } else {
            s.ptr += static_cast<long long>(kt) * BK * g.row_stride;
            s.rows -= kt * BK;
        }
        return s;
    }
    // Global -> registers: slab `kt` of the block at MN tile `block` (VEC: this thread's
    // chunks of it; else this warp's share).
    static CALICO_DEVICE void fetch(part& r, const gl<In>& g, int batch, int block, int kt, int warp) {
        if constexpr (VEC) {
            load(r, from_step(g, kt), KMAJOR ? coord{batch, block, 0} : coord{batch, 0, block}, static_cast<int>(thread_x()));
        } else {
            const int q = block * WARPS + warp;
            load(r, from_step(g, kt), KMAJOR ? coord{batch, q, 0} : coord{batch, 0, q});
        }
    }
    // Registers -> shared.
    static CALICO_DEVICE void put(shared& s, const part& r, int warp) {
        if constexpr (VEC)
            store(s, r, static_cast<int>(thread_x()));
        else if constexpr (KMAJOR)
            store(s, r, warp * Q, 0);
        else
            store(s, r, 0, warp * Q);
    }
    // Shared -> registers: a fragment of the whole BK depth starting at `mn0` on the MN side.
    template <class F>
    static CALICO_DEVICE void fragment(F& f, const shared& s, int mn0) {
        if constexpr (KMAJOR)
            load(f, s, mn0, 0);
        else
            load(f, s, 0, mn0);
    }
};

typedef Slab<BM, A_KMAJOR, CALICO_GEMM_A_VEC != 0> SlabA;
typedef Slab<BN, B_KMAJOR, CALICO_GEMM_B_VEC != 0> SlabB;

// This warp's B fragment for one BK step: BK x WN (col_l) or WN x BK (row_l, the weight's rows).
typedef SlabB::fragment_t<WN> FragB;
// One 16-row strip of this warp's A: 16 x BK (row_l) or BK x 16 (col_l, read from A^T).
typedef SlabA::fragment_t<16> FragA;
// One 16-row strip of this warp's accumulators.
typedef rt_fl<16, WN> Acc;

// (A template, so that only the product the layouts name is instantiated.)
template <bool AK, bool BK_, class FA, class FB>
CALICO_DEVICE void product(Acc& acc, const FA& a, const FB& b) {
    if constexpr (AK && BK_)
        mma_ABt(acc, a, b, acc);
    else if constexpr (AK)
        mma_AB(acc, a, b, acc);
    else if constexpr (BK_)
        mma_AtBt(acc, a, b, acc);
    else
        mma_AtB(acc, a, b, acc);
}

struct Shared {
    typename SlabA::shared a[2];
    typename SlabB::shared b[2];
};

// The operands of one batch entry as the vocabulary's row-major global layouts.
struct Operands {
    gl<In> a, b;
    gl<Out> c, d, bias;
};

CALICO_DEVICE void tile(const Operands& g, int batch, int k, float alpha, float beta, Shared& sh) {
    const int warp = static_cast<int>(thread_x()) / CALICO_LANES;
    const int wm = warp / 2, wn = warp % 2;
    const int bm = static_cast<int>(block_y()), bn = static_cast<int>(block_x());

    Acc acc[WM / 16];
#pragma unroll
    for (int i = 0; i < WM / 16; ++i) zero(acc[i]);

    typename SlabA::part ra;
    typename SlabB::part rb;
    const int k_tiles = (k + BK - 1) / BK;
    SlabA::fetch(ra, g.a, batch, bm, 0, warp);
    SlabB::fetch(rb, g.b, batch, bn, 0, warp);
    SlabA::put(sh.a[0], ra, warp);
    SlabB::put(sh.b[0], rb, warp);
    sync_threads();

    for (int kt = 0; kt < k_tiles; ++kt) {
        const int cur = kt & 1;
        const bool more = kt + 1 < k_tiles;
        // The next slab's global loads are in flight while this one is multiplied.
        if (more) {
            SlabA::fetch(ra, g.a, batch, bm, kt + 1, warp);
            SlabB::fetch(rb, g.b, batch, bn, kt + 1, warp);
        }
        FragB b;
        SlabB::fragment(b, sh.b[cur], wn * WN);
#pragma unroll
        for (int i = 0; i < WM / 16; ++i) {
            FragA a;
            SlabA::fragment(a, sh.a[cur], wm * WM + 16 * i);
            product<A_KMAJOR, B_KMAJOR>(acc[i], a, b);
        }
        // The buffer written here was last read in the previous step, before its barrier.
        if (more) {
            SlabA::put(sh.a[cur ^ 1], ra, warp);
            SlabB::put(sh.b[cur ^ 1], rb, warp);
        }
        sync_threads();
    }

    // Epilogue, one 16-row strip at a time, in the order of gemm::finish: alpha * acc, plus
    // beta * C, plus the bias (a matrix whose rows all alias the bias vector), the activation,
    // then the rounding store (which drops what lies outside D).
#pragma unroll
    for (int i = 0; i < WM / 16; ++i) {
        const coord at = {batch, (bm * BM + wm * WM) / 16 + i, bn * 2 + wn};
        mul(acc[i], acc[i], alpha);
#if CALICO_GEMM_HAS_C
        {
            Acc c;
            load(c, g.c, at);
            map2(acc[i], acc[i], c, [beta](float v, float x) { return v + beta * x; });
        }
#endif
#if CALICO_GEMM_HAS_BIAS
        {
            Acc bias;
            load(bias, g.bias, at);
            add(acc[i], acc[i], bias);
        }
#endif
        map(acc[i], acc[i], [](float v) { return gemm::activation(v); });
        store(g.d, acc[i], at);
    }
    (void)beta;
}

template <class T>
CALICO_DEVICE gl<T> matrix(const T* p, int rows, int cols, i64 row_stride, i64 batch_stride) {
    return gl<T>{const_cast<T*>(p), rows, cols, row_stride, batch_stride};
}

}  // namespace gemm_tile
}  // namespace calico

// Strides in elements, as for calico_gemm_portable (the host passes the same argument list);
// the unit strides the defines promise are not read. Block (x, y) computes D[y*BM.., x*BN..]
// of batches z, z + grid_z, ... (z = blockIdx.z). c and bias may be null when their defines
// are 0.
CALICO_KERNEL void CALICO_MAX_THREADS((CALICO_GEMM_BM == 256 ? 8 : 4) * CALICO_LANES) calico_gemm_tile(
    const CALICO_GEMM_IN* __restrict__ a, long long a_rs, long long a_cs, long long a_bs,
    const CALICO_GEMM_IN* __restrict__ b, long long b_rs, long long b_cs, long long b_bs,
    const CALICO_GEMM_OUT* __restrict__ c, long long c_rs, long long c_cs, long long c_bs,
    CALICO_GEMM_OUT* __restrict__ d, long long d_rs, long long d_cs, long long d_bs,
    const CALICO_GEMM_OUT* __restrict__ bias, long long m, long long n, long long k,
    long long batch, long long grid_z, float alpha, float beta) {
    using namespace calico;
    using namespace calico::gemm_tile;
    __shared__ Shared sh;
    const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
    Operands g;
    g.a = A_KMAJOR ? matrix(a, mi, ki, a_rs, a_bs) : matrix(a, ki, mi, a_cs, a_bs);
    g.b = B_KMAJOR ? matrix(b, ni, ki, b_cs, b_bs) : matrix(b, ki, ni, b_rs, b_bs);
    g.c = matrix(c, mi, ni, c_rs, c_bs);
    g.d = matrix<CALICO_GEMM_OUT>(d, mi, ni, d_rs, d_bs);
    g.bias = matrix(bias, mi, ni, 0, 0);
    (void)c_cs;
    (void)d_cs;
    for (long long z = block_z(); z < batch; z += grid_z) tile(g, static_cast<int>(z), ki, alpha, beta, sh);
}
