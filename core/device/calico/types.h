// Small fixed-size vectors and conversions shared by both vendors.
#pragma once

namespace calico {

CALICO_DEVICE float to_float(float v) { return v; }
template <> CALICO_DEVICE float from_float<float>(float v) { return v; }

// N elements of T packed for wide memory accesses (at most 16 bytes per access, so the
// alignment is capped at 16).
template <class T, int N>
struct alignas((sizeof(T) * N) > 16 ? 16 : sizeof(T) * N) vec {
    T v[N];
};

// Elements of T per 16-byte access.
template <class T>
struct elems_per_16b {
    static constexpr int value = 16 / sizeof(T);
};

}  // namespace calico
