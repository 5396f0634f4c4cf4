// Eight 16-bit elements that start r elements into a 16-byte chunk (0 <= r < 8), taken from that
// chunk and the next: output word i holds elements r + 2i and r + 2i + 1 of the 16 in (lo, hi).
// For copies between rows with different 16-byte phases (odd row widths): the loads and the
// stores both stay whole aligned 16-byte chunks.
#pragma once

namespace calico {
namespace gemm {

struct words4 {
    unsigned x, y, z, w;
};

template <int R>
CALICO_DEVICE words4 shift_words(words4 lo, words4 hi) {
    const unsigned w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    unsigned o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        o[i] = (R % 2 == 0) ? w[R / 2 + i] : (w[R / 2 + i] >> 16) | (w[R / 2 + i + 1] << 16);
    }
    return words4{o[0], o[1], o[2], o[3]};
}

// The same with r known only at run time (a constant index per case: no indexed array).
CALICO_DEVICE words4 shift_words(int r, words4 lo, words4 hi) {
    switch (r) {
        case 0: return lo;
        case 1: return shift_words<1>(lo, hi);
        case 2: return shift_words<2>(lo, hi);
        case 3: return shift_words<3>(lo, hi);
        case 4: return shift_words<4>(lo, hi);
        case 5: return shift_words<5>(lo, hi);
        case 6: return shift_words<6>(lo, hi);
        default: return shift_words<7>(lo, hi);
    }
}

}  // namespace gemm
}  // namespace calico
