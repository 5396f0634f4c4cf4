// The parameter structs of the CUDA GEMM kernels, each passed by value as one kernel argument
// and mirrored by a #[repr(C)] struct in kernels/src/gemm/params.rs.
//
// Each struct is declared from one field list (CALICO_*_FIELDS: type and name in order), and
// CALICO_CHECK_PARAMS holds that list against the layout the host emits into the variant's
// source: PREFIX_BYTES (its size), PREFIX_OFFSETS (every field's offset, in order) and
// PREFIX_NAMES (the field names, in order). The offsets are recomputed here from each field's
// size and alignment (NVRTC has no constant-expression offsetof), so a field added, moved,
// renamed or retyped on one side only fails to compile instead of reading the wrong bytes.
// Pointers are 8 bytes, like the host's u64.
#pragma once

namespace calico {
namespace gemm {
namespace layout {

// True when fields of these sizes and alignments, laid out in order as a C struct, sit at
// the host's offsets.
template <int N>
constexpr bool offsets_match(const unsigned long long (&size)[N], const unsigned long long (&align)[N],
                             const unsigned long long (&host)[N]) {
    unsigned long long end = 0;
    for (int i = 0; i < N; ++i) {
        const unsigned long long at = (end + align[i] - 1) / align[i] * align[i];
        if (at != host[i]) return false;
        end = at + size[i];
    }
    return true;
}

constexpr bool same_text(const char* a, const char* b) {
    while (*a != 0 && *a == *b) {
        ++a;
        ++b;
    }
    return *a == *b;
}

}  // namespace layout
}  // namespace gemm
}  // namespace calico

#define CALICO_PARAM_DECLARE(T, NAME) T NAME;
#define CALICO_PARAM_SIZE(T, NAME) sizeof(T),
#define CALICO_PARAM_ALIGN(T, NAME) alignof(T),
#define CALICO_PARAM_NAME(T, NAME) #NAME ","

// At namespace scope, once per kernel: FIELDS (with element types IN, OUT) against the host's
// PREFIX_* defines, and S (the struct declared from FIELDS) against PREFIX_BYTES.
#define CALICO_CHECK_PARAMS(FIELDS, IN, OUT, PREFIX, S)                                                                     \
    constexpr unsigned long long PREFIX##_host_offsets[] = {PREFIX##_OFFSETS};                                              \
    constexpr unsigned long long PREFIX##_device_sizes[] = {FIELDS(CALICO_PARAM_SIZE, IN, OUT)};                            \
    constexpr unsigned long long PREFIX##_device_aligns[] = {FIELDS(CALICO_PARAM_ALIGN, IN, OUT)};                          \
    static_assert(sizeof(S) == PREFIX##_BYTES, #S ": size differs from the host struct");                                 \
    static_assert(sizeof(PREFIX##_host_offsets) == sizeof(PREFIX##_device_sizes), #S ": field count differs from the host"); \
    static_assert(calico::gemm::layout::same_text(FIELDS(CALICO_PARAM_NAME, IN, OUT), PREFIX##_NAMES),                      \
                  #S ": field names or order differ from the host struct");                                                 \
    static_assert(calico::gemm::layout::offsets_match(PREFIX##_device_sizes, PREFIX##_device_aligns, PREFIX##_host_offsets), \
                  #S ": field offsets differ from the host struct")

// calico_gemm_hopper, after its tensor maps (HopperParams).
#define CALICO_HOPPER_FIELDS(F, In, Out)                                                               \
    F(Out*, d) F(const Out*, c) F(const Out*, bias) F(long long, d_row_stride) F(long long, d_batch_stride) \
    F(long long, c_row_stride) F(long long, c_batch_stride) F(int, m) F(int, n) F(int, k) F(int, batch)  \
    F(int, a_batch_step) F(int, b_batch_step) F(int, group_m) F(float, alpha) F(float, beta) F(int, k_splits) \
    F(float*, split_partials) F(unsigned*, split_counters)

// calico_gemm_sm80 (Sm80Params): each operand's pointer and row / column / batch strides.
#define CALICO_SM80_FIELDS(F, In, Out)                                                                                \
    F(const In*, a) F(long long, a_rs) F(long long, a_cs) F(long long, a_bs) F(const In*, b) F(long long, b_rs)     \
    F(long long, b_cs) F(long long, b_bs) F(const Out*, c) F(long long, c_rs) F(long long, c_cs) F(long long, c_bs) \
    F(Out*, d) F(long long, d_rs) F(long long, d_cs) F(long long, d_bs) F(const Out*, bias) F(long long, m)         \
    F(long long, n) F(long long, k) F(long long, batch) F(long long, grid_z) F(float, alpha) F(float, beta)

// calico_gemm_skinny (WeightParams; calico_gemv takes the same values positionally, see gemv.cu): A (M x K) against the K-major weight W.
#define CALICO_WEIGHT_FIELDS(F, In, Out)                                                                        \
    F(const In*, a) F(long long, a_rs) F(const In*, w) F(long long, w_rs) F(const Out*, c) F(long long, c_rs) \
    F(long long, c_cs) F(Out*, d) F(long long, d_rs) F(long long, d_cs) F(const Out*, bias) F(long long, m)   \
    F(long long, n) F(long long, k) F(float, alpha) F(float, beta)

namespace calico {
namespace gemm {

template <class Out>
struct hopper_params {
    CALICO_HOPPER_FIELDS(CALICO_PARAM_DECLARE, void, Out)
};

template <class In, class Out>
struct sm80_params {
    CALICO_SM80_FIELDS(CALICO_PARAM_DECLARE, In, Out)
};

template <class In, class Out>
struct weight_params {
    CALICO_WEIGHT_FIELDS(CALICO_PARAM_DECLARE, In, Out)
};

}  // namespace gemm
}  // namespace calico
