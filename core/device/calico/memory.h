// Global-memory access helpers: 16-byte vector loads and stores, with a scalar tail path.
#pragma once

namespace calico {

// Loads N consecutive T from p (which must be aligned to sizeof(T) * N) and widens to float.
template <class T, int N>
CALICO_DEVICE void load_float(float (&dst)[N], const T* __restrict__ p) {
    const vec<T, N> packed = *reinterpret_cast<const vec<T, N>*>(p);
#pragma unroll
    for (int i = 0; i < N; ++i) dst[i] = to_float(packed.v[i]);
}

// Narrows N floats to T and stores them to p (aligned to sizeof(T) * N).
template <class T, int N>
CALICO_DEVICE void store_float(T* __restrict__ p, const float (&src)[N]) {
    vec<T, N> packed;
#pragma unroll
    for (int i = 0; i < N; ++i) packed.v[i] = from_float<T>(src[i]);
    *reinterpret_cast<vec<T, N>*>(p) = packed;
}

// N consecutive elements as one access (N == 1: a scalar access, no alignment needed beyond
// the element's). T is deduced: load_vec<VEC>(v, ptr).
template <int N, class T>
CALICO_DEVICE void load_vec(float (&dst)[N], const T* p) {
    if constexpr (N == 1) dst[0] = to_float(*p);
    else load_float<T, N>(dst, p);
}

template <int N, class T>
CALICO_DEVICE void store_vec(T* p, const float (&src)[N]) {
    if constexpr (N == 1) *p = from_float<T>(src[0]);
    else store_float<T, N>(p, src);
}

// True when p is aligned to `bytes`.
CALICO_DEVICE bool is_aligned(const void* p, unsigned bytes) {
    return (reinterpret_cast<unsigned long long>(p) & (bytes - 1)) == 0;
}

}  // namespace calico
