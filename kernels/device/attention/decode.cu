// Decode attention: a few query tokens per sequence against a long KV cache, split along the
// KV length (flash-decoding). One block handles one (KV split, KV head, row group, sequence):
// the ROWS query rows of one KV head (GQA: the query heads that share it times the Nq new
// tokens) read every key and value of the split once.
//
// Layout of the work: a row of K or V (HEAD_DIM elements) is read by LPR lanes, 16 bytes each,
// so a warp covers TPP tokens per access and UNROLL accesses (2 * UNROLL 16-byte loads per
// lane, all issued before any math) per tile. Each lane keeps the online-softmax state (max,
// sum, output) of the tokens it reads; states meet at the end, first across the lanes of a
// warp, then across warps through shared memory. Scores are kept in base 2 (log2(e) folded
// into the scale), math in f32.
//
// Paged caches (PAGED=1): token j of sequence b lies in page block_table[b][j / page_size] at
// slot j % page_size; `kv_page_stride` steps pages. Contiguous caches (PAGED=0): the "page" is
// the sequence and the slot is j. Page indices are clamped into the pool so that a bad table
// entry can give wrong values but never a read outside it.
//
// With one split the block writes O (dtype ELEM, any strides) and LSE (f32, natural log);
// with several, each block writes its normalised partial output and base-2 LSE into the
// workspace and decode_combine.cu merges them in split order (deterministic).
//
// Token indices are 32-bit (the op caps a cache at 2^31 - 1 tokens per sequence).
//
// Head dims below HEAD_DIM (HEAD_DIM_USED, a multiple of 8: 80, 96, ...) run the kernel of the
// next width: the lanes past the real columns load nothing (zeros), which changes no score,
// and only the real columns of O are written (the partials keep the full width, zeros past it).
//
// Defines: ELEM (element type), HEAD_DIM (64, 128, 256), ROWS (query rows per block, 1..8),
// UNROLL (accesses per lane per tile), PAGED (0 or 1), PIPE (1: the loads of the next tile are
// issued before the math of the current one, two register buffers), MIN_BLOCKS (blocks per SM
// the register budget must allow on NVIDIA; 0: no bound), HEAD_DIM_USED (default HEAD_DIM).
#include "calico/calico.h"
#include "attention/decode_common.h"

using namespace calico;

typedef ELEM T;

constexpr int VEC = 8;                   // elements per 16-byte access
constexpr int LPR = HEAD_DIM / VEC;      // lanes per key/value row
constexpr int TPP = CALICO_LANES / LPR;  // tokens per warp access
constexpr int TILE = TPP * UNROLL;       // tokens per warp tile
constexpr int WARPS = 4;
static_assert(HEAD_DIM % VEC == 0 && LPR <= CALICO_LANES, "head_dim must be 8..8*lanes");
#ifndef HEAD_DIM_USED
#define HEAD_DIM_USED HEAD_DIM
#endif
constexpr int DIM = HEAD_DIM_USED;  // the real head dim
static_assert(DIM % VEC == 0 && DIM <= HEAD_DIM, "a real head dim of whole 16-byte chunks, at most HEAD_DIM");

#if defined(__CUDACC__) && MIN_BLOCKS > 0
#define DECODE_BOUNDS __launch_bounds__(WARPS * CALICO_LANES, MIN_BLOCKS)
#else
#define DECODE_BOUNDS CALICO_MAX_THREADS(WARPS * CALICO_LANES)
#endif

// The page holding token j (clamped into the pool), or the sequence itself for contiguous
// caches; 0 for tokens past `end`, which are not loaded.
CALICO_DEVICE int decode_page(const int* table, int j, int end, int page_size, int page_shift, int num_pages, int b) {
#if PAGED
    if (j >= end) return 0;
    const int page = page_shift >= 0 ? table[j >> page_shift] : table[j / page_size];
    return page < 0 ? 0 : (page >= num_pages ? num_pages - 1 : page);
#else
    return b;
#endif
}

// K and V of one tile: UNROLL accesses of 16 bytes per lane each.
struct kv_tile {
    vec<T, VEC> k[UNROLL], v[UNROLL];
};

CALICO_KERNEL DECODE_BOUNDS void calico_attention_decode(
    const T* q, long long q_sb, long long q_sh, long long q_sn,
    const T* k, long long k_sp, long long k_st, long long k_sh,
    const T* v, long long v_sp, long long v_st, long long v_sh,
    const int* block_table, long long bt_sb, long long page_size_ll, int page_shift, long long num_pages_ll,
    const int* seq_lens, long long capacity,
    T* o, long long o_sb, long long o_sh, long long o_sn, float* lse,
    float* part_o, float* part_lse,
    int hq, int hkv, int nq, int row_groups, int splits, long long split_tokens_ll,
    float qk_scale, float softcap, int causal, long long win_left, long long win_right) {
    const int split = block_x();
    const int h = block_y() / row_groups;
    const int rg = block_y() % row_groups;
    const int b = block_z();
    const int lane = lane_id();
    const int warp = warp_id();
    const int chunk = lane % LPR;  // which 16 bytes of a row this lane reads
    const int slot = lane / LPR;   // which token of an access this lane reads
    const bool in_dim = DIM == HEAD_DIM || chunk * VEC < DIM;  // its chunk lies in the real head dim
    const int group = hq / hkv;
    const int page_size = (int)page_size_ll;
    const int num_pages = (int)num_pages_ll;
    const float NEG_INF = decode_neg_inf();

    int len = seq_lens[b];
    len = len < 0 ? 0 : (len > capacity ? (int)capacity : len);

    // The rows of this block, their query vectors (scaled) and the keys each may see.
    float qv[ROWS][VEC];
    int lo[ROWS], hi[ROWS];  // visible keys: lo <= j <= hi
    int block_lo = len, block_hi = -1;
    int common_lo = 0, common_hi = len - 1;  // keys every row sees
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const int rr = rg * ROWS + r;
        lo[r] = 0;
        hi[r] = -1;
#pragma unroll
        for (int e = 0; e < VEC; ++e) qv[r][e] = 0.0f;
        if (rr < group * nq) {
            const int head = h * group + rr / nq;
            const int qi = rr % nq;
            if (in_dim) load_vec<VEC>(qv[r], q + b * q_sb + head * q_sh + qi * q_sn + chunk * VEC);
#pragma unroll
            for (int e = 0; e < VEC; ++e) qv[r][e] *= qk_scale;
            const long long diag = (long long)qi + len - nq;  // the key aligned with this query
            long long top = causal ? diag : len - 1;
            if (win_right >= 0 && diag + win_right < top) top = diag + win_right;
            const long long bottom = win_left >= 0 ? diag - win_left : 0;
            lo[r] = bottom < 0 ? 0 : (int)(bottom > len ? len : bottom);
            hi[r] = top > len - 1 ? len - 1 : (int)(top < -1 ? -1 : top);
            if (lo[r] <= hi[r]) {
                block_lo = lo[r] < block_lo ? lo[r] : block_lo;
                block_hi = hi[r] > block_hi ? hi[r] : block_hi;
            }
        }
        // Rows past the query rows see nothing; they do not narrow the common range.
        if (rr < group * nq) {
            common_lo = lo[r] > common_lo ? lo[r] : common_lo;
            common_hi = hi[r] < common_hi ? hi[r] : common_hi;
        }
    }
    const long long split_start = (long long)split * split_tokens_ll;
    const int start = split_start > block_lo ? (split_start > len ? len : (int)split_start) : block_lo;
    const long long split_end = split_start + split_tokens_ll;
    const int end = split_end < block_hi + 1 ? (int)split_end : block_hi + 1;

    float m[ROWS], l[ROWS], acc[ROWS][VEC];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        m[r] = NEG_INF;
        l[r] = 0.0f;
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[r][e] = 0.0f;
    }

    const T* kh = k + h * k_sh + chunk * VEC;
    const T* vh = v + h * v_sh + chunk * VEC;
    const int* table = block_table + b * bt_sb;
    constexpr int STEP = WARPS * TILE;  // tokens between a warp's tiles
    // Pages of this lane's tokens in the next tile to load, looked up one tile ahead so that
    // the block-table read is not on the path of the K/V loads.
    int pages[UNROLL];
    auto lookup = [&](int tile) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) pages[u] = decode_page(table, tile + u * TPP + slot, end, page_size, page_shift, num_pages, b);
    };
    // Issues every load of the tile at `tile` (zeros past `end`), then looks up the next pages.
    auto load = [&](kv_tile& t, int tile) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int j = tile + u * TPP + slot;
            if (j < end && in_dim) {
#if PAGED
                const int at = page_shift >= 0 ? (j & (page_size - 1)) : j % page_size;
#else
                const int at = j;
#endif
                t.k[u] = *reinterpret_cast<const vec<T, VEC>*>(kh + pages[u] * k_sp + at * k_st);
                t.v[u] = *reinterpret_cast<const vec<T, VEC>*>(vh + pages[u] * v_sp + at * v_st);
            } else {
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    t.k[u].v[e] = from_float<T>(0.0f);
                    t.v[u].v[e] = from_float<T>(0.0f);
                }
            }
        }
        lookup(tile + STEP);
    };
    // Scores and the online-softmax update for the tile at `tile`.
    auto consume = [&](const kv_tile& t, int tile) {
        // Each lane's partial dot products, summed over the LPR lanes of the row.
        float s[UNROLL][ROWS];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            float kf[VEC];
#pragma unroll
            for (int e = 0; e < VEC; ++e) kf[e] = to_float(t.k[u].v[e]);
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < VEC; ++e) d = fmaf(qv[r][e], kf[e], d);
#pragma unroll
                for (int mask = LPR / 2; mask > 0; mask >>= 1) d += shfl_xor(d, mask);
                s[u][r] = d;
            }
        }
        // A tile inside every row's range and the split needs no per-token mask (warp-uniform).
        const bool full = tile >= common_lo && tile + TILE - 1 <= common_hi && tile + TILE <= end;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            float mx = m[r];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                float x = s[u][r];
                if (softcap > 0.0f) x = softcap * tanhf(x / softcap) * DECODE_LOG2E;
                if (!full) {
                    const int j = tile + u * TPP + slot;
                    x = (j >= lo[r] && j <= hi[r] && j < end) ? x : NEG_INF;
                }
                s[u][r] = x;
                mx = fmaxf(mx, x);
            }
            const float base = mx == NEG_INF ? 0.0f : mx;  // all masked so far: p = 0
            const float alpha = exp2_approx(m[r] - base);
            m[r] = mx;
            float sum = 0.0f;
            float p[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                p[u] = exp2_approx(s[u][r] - base);
                sum += p[u];
            }
            l[r] = l[r] * alpha + sum;
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                float a = acc[r][e] * alpha;
#pragma unroll
                for (int u = 0; u < UNROLL; ++u) a = fmaf(p[u], to_float(t.v[u].v[e]), a);
                acc[r][e] = a;
            }
        }
    };

    const int first = start + warp * TILE;
    lookup(first);
#if PIPE
    // Two buffers: the loads of one tile are in flight while the other is consumed.
    kv_tile a, c;
    if (first < end) load(a, first);
    for (int tile = first; tile < end; tile += 2 * STEP) {
        const int next = tile + STEP;
        if (next < end) load(c, next);
        consume(a, tile);
        if (next >= end) break;
        if (next + STEP < end) load(a, next + STEP);
        consume(c, next);
    }
#else
    for (int tile = first; tile < end; tile += STEP) {
        kv_tile a;
        load(a, tile);
        consume(a, tile);
    }
#endif

    // Merge the token slots of the warp (lanes chunk, chunk + LPR, ...).
#pragma unroll
    for (int step = LPR; step < CALICO_LANES; step <<= 1) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const float mo = shfl_xor(m[r], step);
            const float lo_other = shfl_xor(l[r], step);
            const float mn = fmaxf(m[r], mo);
            const float a = decode_rescale(m[r], mn), c = decode_rescale(mo, mn);
            m[r] = mn;
            l[r] = l[r] * a + lo_other * c;
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[r][e] = acc[r][e] * a + shfl_xor(acc[r][e], step) * c;
        }
    }

    // Merge the warps through shared memory, then write.
    __shared__ float sh_acc[WARPS][ROWS][HEAD_DIM];
    __shared__ float sh_m[WARPS][ROWS], sh_l[WARPS][ROWS];
    if (slot == 0) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
#pragma unroll
            for (int e = 0; e < VEC; ++e) sh_acc[warp][r][chunk * VEC + e] = acc[r][e];
            if (chunk == 0) {
                sh_m[warp][r] = m[r];
                sh_l[warp][r] = l[r];
            }
        }
    }
    sync_threads();
    for (int idx = thread_x(); idx < ROWS * HEAD_DIM; idx += block_dim_x()) {
        const int r = idx / HEAD_DIM, d = idx % HEAD_DIM;
        const int rr = rg * ROWS + r;
        if (rr >= group * nq) continue;
        float mt = NEG_INF;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) mt = fmaxf(mt, sh_m[w][r]);
        float lt = 0.0f, ot = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            const float c = decode_rescale(sh_m[w][r], mt);
            lt += sh_l[w][r] * c;
            ot += sh_acc[w][r][d] * c;
        }
        const float out = lt > 0.0f ? ot / lt : 0.0f;
        const float lse2 = lt > 0.0f ? mt + decode_log2(lt) : NEG_INF;
        const int head = h * group + rr / nq;
        const int qi = rr % nq;
        const long long row = ((long long)b * hq + head) * nq + qi;
        if (splits == 1) {
            if (d < DIM) o[b * o_sb + head * o_sh + qi * o_sn + d] = from_float<T>(out);
            if (d == 0) lse[row] = lse2 == NEG_INF ? NEG_INF : lse2 * DECODE_LN2;
        } else {
            part_o[(row * splits + split) * HEAD_DIM + d] = out;
            if (d == 0) part_lse[row * splits + split] = lse2;
        }
    }
}
