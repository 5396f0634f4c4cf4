// Every CDNA primitive of calico/mfma.h, calico/hip_buffer.h and calico/hip_tile.h once, for
// the offline ISA checks in offline_compile.rs.
#include "calico/hip_buffer.h"
#include "calico/mfma.h"
#include "calico/tiles.h"

using namespace calico;

CALICO_KERNEL CALICO_MAX_THREADS(64) void mfma_shapes(const bf16* a, const f16* h, float* out, unsigned bytes) {
    const hip::buffer ba = hip::make_buffer(a, bytes), bh = hip::make_buffer(h, bytes);
    const unsigned lane = hw_lane();
    const hip::bf16x4_t a4 = __builtin_bit_cast(hip::bf16x4_t, hip::load_8b(ba, lane * 8));
    const hip::f16x4_t h4 = __builtin_bit_cast(hip::f16x4_t, hip::load_8b(bh, lane * 8));
    hip::f32x4_t acc4 = {0, 0, 0, 0};
    hip::f32x16_t acc16 = {};
    hip::set_priority<1>();
    acc4 = hip::mfma_16x16x16<bf16>(a4, a4, acc4);
    acc4 = hip::mfma_16x16x16<f16>(h4, h4, acc4);
    acc16 = hip::mfma_32x32x8<bf16>(a4, a4, acc16);
    acc16 = hip::mfma_32x32x8<f16>(h4, h4, acc16);
#ifdef CALICO_HAS_FP8_FNUZ_MFMA
    const long f8 = __builtin_bit_cast(long, hip::load_8b(ba, 512 + lane * 8));
    acc4 = hip::mfma_16x16x32_fp8(f8, f8, acc4);
    acc4 = hip::mfma_16x16x32_bf8(f8, f8, acc4);
#endif
    hip::set_priority<0>();
    hip::sched_barrier();
    float s = 0.0f;
    for (int i = 0; i < 16; ++i) s += acc16[i];
    for (int i = 0; i < 4; ++i) s += acc4[i];
    out[lane] = warp_sum(s);
}

// Global -> LDS with no register round trip, then an MFMA tile read from the swizzled LDS tile.
CALICO_KERNEL CALICO_MAX_THREADS(256) void lds_direct(const bf16* a, float* out, unsigned bytes) {
    __shared__ st_bf<64, 64> tile;  // 8 KiB: 32 dwords per lane of the 4 waves
    const hip::buffer b = hip::make_buffer(a, bytes);
    const unsigned wave = thread_x() / 64, lane = hw_lane();
    for (int i = 0; i < 8; ++i) {
        const unsigned chunk = 256u * (wave * 8 + i);  // this wave's 256 bytes of LDS
        // Global offset of the logical byte that the LDS dword `chunk + 4 * lane` holds.
        const unsigned phys = chunk + 4 * lane, row = phys / st_bf<64, 64>::row_bytes;
        const unsigned logical = lds_swizzle<st_bf<64, 64>::row_bytes, 8>(row, phys % st_bf<64, 64>::row_bytes);
        hip::load_lds_4b(b, logical, tile.raw + chunk);
    }
    hip::wait_vmem<0>();
    sync_threads();
    rt_bf<16, 64> r;
    load(r, tile, 16 * static_cast<int>(wave), 0);
    rt_fl<16, 16> d;
    zero(d);
    mma_ABt(d, r, r, d);  // rows 16w.. of A A^T against themselves: 16 x 16 per wave
    store(gl<float>{out, 64, 16, 16, 0}, d, coord{0, static_cast<int>(wave), 0});
}
