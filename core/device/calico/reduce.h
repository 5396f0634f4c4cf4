// Warp/wavefront and block reductions, sized by CALICO_LANES so they are right on wave64.
#pragma once

namespace calico {

struct op_sum {
    CALICO_DEVICE static float apply(float a, float b) { return a + b; }
};
struct op_max {
    CALICO_DEVICE static float apply(float a, float b) { return a > b ? a : b; }
};

// Butterfly reduction: every lane ends with the reduction over all CALICO_LANES lanes.
template <class Op>
CALICO_DEVICE float warp_reduce(float v) {
#pragma unroll
    for (int mask = CALICO_LANES / 2; mask > 0; mask >>= 1) v = Op::apply(v, shfl_xor(v, mask));
    return v;
}

CALICO_DEVICE float warp_sum(float v) { return warp_reduce<op_sum>(v); }
CALICO_DEVICE float warp_max(float v) { return warp_reduce<op_max>(v); }

CALICO_DEVICE unsigned lane_id() { return thread_x() % CALICO_LANES; }
CALICO_DEVICE unsigned warp_id() { return thread_x() / CALICO_LANES; }
CALICO_DEVICE unsigned warps_per_block() { return (block_dim_x() + CALICO_LANES - 1) / CALICO_LANES; }

// Block-wide reduction; every thread gets the result. `scratch` holds one float per warp
// and is reused across calls (the leading barrier protects the previous call's readers).
template <class Op>
CALICO_DEVICE float block_reduce(float v, float* scratch, float identity) {
    v = warp_reduce<Op>(v);
    if (block_dim_x() <= CALICO_LANES) return v;  // one warp: no shared memory, no barrier
    sync_threads();
    if (lane_id() == 0) scratch[warp_id()] = v;
    sync_threads();
    float r = lane_id() < warps_per_block() ? scratch[lane_id()] : identity;
    return warp_reduce<Op>(r);
}

CALICO_DEVICE float block_sum(float v, float* scratch) { return block_reduce<op_sum>(v, scratch, 0.0f); }
CALICO_DEVICE float block_max(float v, float* scratch) { return block_reduce<op_max>(v, scratch, -3.402823466e38f); }

// Mean and sum of squared deviations of a block's values in one pass, robust to a large mean
// (Chan et al.'s pairwise combination of (count, mean, M2)). Each thread passes the statistics
// of its own elements; every thread gets the block's. `scratch` holds 3 floats per warp.
struct moments {
    float n, mean, m2;
};

CALICO_DEVICE moments combine(moments a, moments b) {
    const float n = a.n + b.n;
    if (n == 0.0f) return a;
    const float delta = b.mean - a.mean;
    const float wb = b.n / n;
    return {n, a.mean + delta * wb, a.m2 + b.m2 + delta * delta * a.n * wb};
}

CALICO_DEVICE moments warp_moments(moments v) {
#pragma unroll
    for (int mask = CALICO_LANES / 2; mask > 0; mask >>= 1)
        v = combine(v, {shfl_xor(v.n, mask), shfl_xor(v.mean, mask), shfl_xor(v.m2, mask)});
    return v;
}

CALICO_DEVICE moments block_moments(moments v, float* scratch) {
    v = warp_moments(v);
    if (block_dim_x() <= CALICO_LANES) return v;
    sync_threads();
    if (lane_id() == 0) {
        scratch[3 * warp_id()] = v.n;
        scratch[3 * warp_id() + 1] = v.mean;
        scratch[3 * warp_id() + 2] = v.m2;
    }
    sync_threads();
    moments w = {0.0f, 0.0f, 0.0f};
    if (lane_id() < warps_per_block()) w = {scratch[3 * lane_id()], scratch[3 * lane_id() + 1], scratch[3 * lane_id() + 2]};
    return warp_moments(w);
}

}  // namespace calico
