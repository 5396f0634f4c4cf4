// A kernel written only against the shared tile vocabulary (calico/tiles.h): no vendor names,
// no lane arithmetic. It compiles for sm_80, sm_90a, gfx90a and gfx942 (kernels/tests/
// compile_all.rs). One warp/wavefront per block computes, for a 16 x 64 tile of Q and a 64 x 64
// tile of K (both bf16), softmax(Q K^T * scale) V with V = K, through every family of
// operations: global and shared moves, mma_ABt / mma_AB, row and column reductions, broadcasts,
// maps, exp2 and conversions.
#include "calico/tiles.h"

using namespace calico;

CALICO_KERNEL CALICO_MAX_THREADS(CALICO_LANES) void vocabulary_attention_tile(gl<bf16> q, gl<bf16> k, gl<bf16> out, gl<float> col_sums,
                                                                              float scale_log2) {
    __shared__ st_bf<64, 64> k_smem;
    const coord tile = {static_cast<int>(block_z()), static_cast<int>(block_x()), 0};

    rt_bf<16, 64> q_reg;
    load(q_reg, q, tile);
    rt_bf<64, 64> k_reg;
    load(k_reg, k, coord{tile.batch, 0, 0});
    store(k_smem, k_reg);
    sync_threads();

    // S = Q K^T, scaled into the exp2 domain.
    rt_fl<16, 64> s;
    zero(s);
    mma_ABt(s, q_reg, k_reg, s);
    mul(s, s, scale_log2);

    // Row softmax: subtract the row max, exponentiate, divide by the row sum.
    row_vec<rt_fl<16, 64>> m, l;
    row_max(m, s);
    sub_row(s, s, m);
    exp2(s, s);
    row_sum(l, s);
    div_row(s, s, l);

    // Column sums of the probabilities (a per_col vector), broadcast back with add_col.
    col_vec<rt_fl<16, 64>> c;
    col_sum(c, s);
    rt_fl<16, 64> shifted;
    add_col(shifted, s, c);
    store(col_sums, shifted, tile);

    // O = P V with V = K read back from shared memory as a B operand.
    rt_bf<16, 64> p;
    copy(p, s);
    rt_bf<64, 64, col_l> v;
    load(v, k_smem);
    rt_fl<16, 64> o;
    zero(o);
    mma_AB(o, p, v, o);
    store(out, o, tile);
}
