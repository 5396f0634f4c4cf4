// CDNA buffer-resource loads and stores: 16-byte vector accesses with hardware bounds checks.
// A buffer resource describes [base, base + bytes); loads past the end return zeros and stores
// past it are dropped, so tile edges need no branches. The LLVM intrinsics are reached through
// asm labels, which hipRTC and clang-19 both accept without HIP headers.
#pragma once
#include "calico/calico.h"

#if !defined(__GFX9__) && defined(__HIP_DEVICE_COMPILE__)
#error "calico/hip_buffer.h: buffer resource word 3 is only defined here for gfx9 (CDNA) targets"
#endif

namespace calico {
namespace hip {

typedef int i32x4 __attribute__((ext_vector_type(4)));
typedef int i32x2 __attribute__((ext_vector_type(2)));

// gfx9 word 3: DATA_FORMAT = 32 bits (bits 15..18 = 4), so raw loads are range-checked
// against num_records; all other fields zero (untyped access, no swizzle, no index stride).
constexpr int kBufferWord3 = 0x00020000;

}  // namespace hip
}  // namespace calico

// Raw (offset-addressed) buffer intrinsics: (rsrc, byte offset, scalar byte offset, cache bits).
__attribute__((device)) calico::hip::i32x4 calico_raw_buffer_load_v4i32(calico::hip::i32x4 rsrc, int voffset, int soffset,
                                                                         int aux) __asm("llvm.amdgcn.raw.buffer.load.v4i32");
__attribute__((device)) calico::hip::i32x2 calico_raw_buffer_load_v2i32(calico::hip::i32x4 rsrc, int voffset, int soffset,
                                                                         int aux) __asm("llvm.amdgcn.raw.buffer.load.v2i32");
__attribute__((device)) int calico_raw_buffer_load_i32(calico::hip::i32x4 rsrc, int voffset, int soffset,
                                                        int aux) __asm("llvm.amdgcn.raw.buffer.load.i32");
// (rsrc, LDS base (M0), bytes per lane, byte offset, scalar byte offset, immediate offset, cache bits)
__attribute__((device)) void calico_raw_buffer_load_lds(calico::hip::i32x4 rsrc, __attribute__((address_space(3))) void* lds,
                                                         int size, int voffset, int soffset, int offset,
                                                         int aux) __asm("llvm.amdgcn.raw.buffer.load.lds");
__attribute__((device)) void calico_raw_buffer_store_v4i32(calico::hip::i32x4 data, calico::hip::i32x4 rsrc, int voffset,
                                                            int soffset, int aux) __asm("llvm.amdgcn.raw.buffer.store.v4i32");
__attribute__((device)) void calico_raw_buffer_store_v2i32(calico::hip::i32x2 data, calico::hip::i32x4 rsrc, int voffset,
                                                            int soffset, int aux) __asm("llvm.amdgcn.raw.buffer.store.v2i32");
__attribute__((device)) void calico_raw_buffer_store_i32(int data, calico::hip::i32x4 rsrc, int voffset, int soffset,
                                                          int aux) __asm("llvm.amdgcn.raw.buffer.store.i32");

namespace calico {
namespace hip {

// A buffer resource (V#) over `bytes` bytes at `base` (at most 4 GiB - 1).
struct buffer {
    i32x4 rsrc;
};

CALICO_DEVICE buffer make_buffer(const void* base, unsigned bytes) {
    unsigned long long a = reinterpret_cast<unsigned long long>(base);
    buffer b;
    b.rsrc.x = static_cast<int>(a & 0xffffffffu);
    b.rsrc.y = static_cast<int>((a >> 32) & 0xffffu);  // stride 0: a raw byte-addressed buffer
    b.rsrc.z = static_cast<int>(bytes);                // num_records, in bytes when stride is 0
    b.rsrc.w = kBufferWord3;
    // The descriptor is wave-uniform: keep it in scalar registers.
    b.rsrc.x = __builtin_amdgcn_readfirstlane(b.rsrc.x);
    b.rsrc.y = __builtin_amdgcn_readfirstlane(b.rsrc.y);
    b.rsrc.z = __builtin_amdgcn_readfirstlane(b.rsrc.z);
    return b;
}

// 16 bytes at `byte_offset`; out-of-range dwords read as zero.
CALICO_DEVICE i32x4 load_16b(const buffer& b, unsigned byte_offset) {
    return calico_raw_buffer_load_v4i32(b.rsrc, static_cast<int>(byte_offset), 0, 0);
}
CALICO_DEVICE i32x2 load_8b(const buffer& b, unsigned byte_offset) {
    return calico_raw_buffer_load_v2i32(b.rsrc, static_cast<int>(byte_offset), 0, 0);
}
CALICO_DEVICE int load_4b(const buffer& b, unsigned byte_offset) {
    return calico_raw_buffer_load_i32(b.rsrc, static_cast<int>(byte_offset), 0, 0);
}
CALICO_DEVICE void store_16b(const buffer& b, unsigned byte_offset, i32x4 v) {
    calico_raw_buffer_store_v4i32(v, b.rsrc, static_cast<int>(byte_offset), 0, 0);
}
CALICO_DEVICE void store_8b(const buffer& b, unsigned byte_offset, i32x2 v) {
    calico_raw_buffer_store_v2i32(v, b.rsrc, static_cast<int>(byte_offset), 0, 0);
}
CALICO_DEVICE void store_4b(const buffer& b, unsigned byte_offset, int v) {
    calico_raw_buffer_store_i32(v, b.rsrc, static_cast<int>(byte_offset), 0, 0);
}

// NBYTES (4, 8 or 16) bytes at `byte_offset` as one buffer access, and back. The range check
// is per dword: a dword wholly past the buffer's end reads 0 / is not written, so a buffer
// whose size is a whole number of dwords needs no tail branches.
template <int NBYTES>
struct dwords {
    static_assert(NBYTES == 4 || NBYTES == 8 || NBYTES == 16, "buffer accesses of 4, 8 or 16 bytes");
    int v[NBYTES / 4];
};
template <int NBYTES>
CALICO_DEVICE dwords<NBYTES> load_bytes(const buffer& b, unsigned byte_offset) {
    dwords<NBYTES> d;
    if constexpr (NBYTES == 16) {
        const i32x4 r = load_16b(b, byte_offset);
        d.v[0] = r.x, d.v[1] = r.y, d.v[2] = r.z, d.v[3] = r.w;
    } else if constexpr (NBYTES == 8) {
        const i32x2 r = load_8b(b, byte_offset);
        d.v[0] = r.x, d.v[1] = r.y;
    } else {
        d.v[0] = load_4b(b, byte_offset);
    }
    return d;
}
template <int NBYTES>
CALICO_DEVICE void store_bytes(const buffer& b, unsigned byte_offset, const dwords<NBYTES>& d) {
    if constexpr (NBYTES == 16)
        store_16b(b, byte_offset, i32x4{d.v[0], d.v[1], d.v[2], d.v[3]});
    else if constexpr (NBYTES == 8)
        store_8b(b, byte_offset, i32x2{d.v[0], d.v[1]});
    else
        store_4b(b, byte_offset, d.v[0]);
}

// Straight into LDS, skipping registers (buffer_load_dword ... lds): lane l copies the 4 bytes
// at its `byte_offset` to `lds_wave_base + 4 * l`, so one call fills 256 contiguous bytes of
// LDS per wave and any swizzle is applied to the global offsets. `lds_wave_base` must be the
// same for every lane of the wave (it goes to M0). Dwords past the buffer's end arrive as zero.
// The data is in LDS once this wave's vmcnt drains (wait_vmem<0>() in calico/mfma.h), and
// visible to other waves after a barrier.
CALICO_DEVICE void load_lds_4b(const buffer& b, unsigned byte_offset, void* lds_wave_base) {
    const unsigned lds = static_cast<unsigned>(reinterpret_cast<unsigned long long>(
        (__attribute__((address_space(3))) void*)lds_wave_base));
    auto* base = (__attribute__((address_space(3))) void*)(unsigned long long)__builtin_amdgcn_readfirstlane(lds);
    calico_raw_buffer_load_lds(b.rsrc, base, 4, static_cast<int>(byte_offset), 0, 0, 0);
}

// 16 bytes of T starting at element `index`, widened to float; elements past the buffer's
// end read as 0.
template <class T>
CALICO_DEVICE void buffer_load_float(float (&dst)[16 / sizeof(T)], const buffer& b, unsigned index) {
    constexpr int N = 16 / sizeof(T);
    i32x4 raw = load_16b(b, index * static_cast<unsigned>(sizeof(T)));
    const vec<T, N> packed = __builtin_bit_cast(vec<T, N>, raw);
#pragma unroll
    for (int i = 0; i < N; ++i) dst[i] = to_float(packed.v[i]);
}

// Narrows 16 bytes' worth of floats to T and stores them at element `index`; stores past
// the end are dropped by the hardware.
template <class T>
CALICO_DEVICE void buffer_store_float(const buffer& b, unsigned index, const float (&src)[16 / sizeof(T)]) {
    constexpr int N = 16 / sizeof(T);
    vec<T, N> packed;
#pragma unroll
    for (int i = 0; i < N; ++i) packed.v[i] = from_float<T>(src[i]);
    store_16b(b, index * static_cast<unsigned>(sizeof(T)), __builtin_bit_cast(i32x4, packed));
}

// NBYTES / sizeof(T) elements of T starting at element `index`, widened to float (0 past the
// end), and the reverse (dropped past the end).
template <class T, int NBYTES>
CALICO_DEVICE void buffer_load_floats(float (&dst)[NBYTES / sizeof(T)], const buffer& b, unsigned index) {
    constexpr int N = NBYTES / sizeof(T);
    const vec<T, N> packed = __builtin_bit_cast(vec<T, N>, load_bytes<NBYTES>(b, index * static_cast<unsigned>(sizeof(T))));
#pragma unroll
    for (int i = 0; i < N; ++i) dst[i] = to_float(packed.v[i]);
}
template <class T, int NBYTES>
CALICO_DEVICE void buffer_store_floats(const buffer& b, unsigned index, const float (&src)[NBYTES / sizeof(T)]) {
    constexpr int N = NBYTES / sizeof(T);
    vec<T, N> packed;
#pragma unroll
    for (int i = 0; i < N; ++i) packed.v[i] = from_float<T>(src[i]);
    store_bytes<NBYTES>(b, index * static_cast<unsigned>(sizeof(T)), __builtin_bit_cast(dwords<NBYTES>, packed));
}

}  // namespace hip
}  // namespace calico
