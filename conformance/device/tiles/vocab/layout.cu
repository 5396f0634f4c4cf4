// Which lane holds which element of a register tile, on the hardware, written only against the
// shared tile vocabulary (calico/tiles.h): one warp/wavefront loads a 16 x 16 base tile whose
// element (r, c) holds 16 r + c, and `map` visits every value the lane holds, writing the lane's
// index to owner[16 r + c]. The host compares the owners with the lane maps of
// calico_core::lanes (mma.sync m16n8k16 on NVIDIA, MFMA 16x16x16 on CDNA). Which register of
// the lane a value sits in is not visible through the shared names, and portable code never
// relies on it. Grid: 1; block: CALICO_LANES threads.
#include "calico/tiles.h"

namespace vocab_layout {

template <class T, class L>
CALICO_DEVICE void run(const T* x, float* owner) {
    const calico::gl<T> gx{const_cast<T*>(x), 16, 16, 16, 0};
    calico::rt<T, 16, 16, L> t;
    calico::load(t, gx, calico::coord{0, 0, 0});
    const float lane = static_cast<float>(calico::thread_x());
    calico::map(t, t, [owner, lane](float v) {
        const int element = static_cast<int>(v);
        if (element >= 0 && element < 256) owner[element] = lane;
        return v;
    });
}

}  // namespace vocab_layout

#define CALICO_VOCAB_LAYOUT(NAME, T, L)                                                                    \
    CALICO_KERNEL CALICO_MAX_THREADS(CALICO_LANES) void NAME(const T* x, float* owner) {                   \
        vocab_layout::run<T, calico::L>(x, owner);                                                         \
    }

// Entries: tiles_vocab_layout_<dtype>_<layout>_16x16.
CALICO_VOCAB_LAYOUT(tiles_vocab_layout_f32_row_16x16, float, row_l)
CALICO_VOCAB_LAYOUT(tiles_vocab_layout_f32_col_16x16, float, col_l)
CALICO_VOCAB_LAYOUT(tiles_vocab_layout_bf16_row_16x16, bf16, row_l)
CALICO_VOCAB_LAYOUT(tiles_vocab_layout_bf16_col_16x16, bf16, col_l)
CALICO_VOCAB_LAYOUT(tiles_vocab_layout_f16_row_16x16, f16, row_l)
CALICO_VOCAB_LAYOUT(tiles_vocab_layout_f16_col_16x16, f16, col_l)
