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
    sync_threads();
    if (lane_id() == 0) scratch[warp_id()] = v;
    sync_threads();
    float r = lane_id() < warps_per_block() ? scratch[lane_id()] : identity;
    return warp_reduce<Op>(r);
}

CALICO_DEVICE float block_sum(float v, float* scratch) { return block_reduce<op_sum>(v, scratch, 0.0f); }
CALICO_DEVICE float block_max(float v, float* scratch) { return block_reduce<op_max>(v, scratch, -3.402823466e38f); }

}  // namespace calico
