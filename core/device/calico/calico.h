// Calico's device vocabulary, the part both vendors share. A vendor backend provides
// "calico/vendor.h" with the primitives listed in VENDOR CONTRACT below; everything here is
// written against those and against CALICO_LANES (32 on NVIDIA, 64 on CDNA).
//
// VENDOR CONTRACT (calico/vendor.h must define, inside namespace calico unless noted):
//   CALICO_LANES                      lanes per warp/wavefront (macro)
//   CALICO_DEVICE                     inline device function qualifier (macro)
//   CALICO_KERNEL                     extern "C" __global__ (macro)
//   CALICO_MAX_THREADS(n)             the block size a kernel is launched with, at most (macro)
//   types bf16, f16                   16-bit floats usable in device code (global namespace)
//   float to_float(bf16|f16|float)    widen to f32
//   template<class T> T from_float(float)   round-to-nearest-even narrowing
//   unsigned thread_x(), block_x(), block_y(), block_z(), block_dim_x(), grid_dim_x()
//   float shfl_xor(float v, int lane_mask)  butterfly exchange within a warp/wavefront
//   float shfl(float v, int src_lane)       broadcast from a lane
//   void sync_threads()               block-wide barrier
//   float exp2_approx(float), rsqrt_approx(float)   fast special functions
#pragma once
#include "calico/vendor.h"
#include "calico/types.h"
#include "calico/memory.h"
#include "calico/reduce.h"
