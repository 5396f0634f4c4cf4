// Decode attention on tensor cores (NVIDIA sm_80 and later): the same work and the same outputs
// as decode.cu (one block per KV split, KV head, row group and sequence; partial O and base-2
// LSE per split, merged by decode_combine.cu), with the scores and the P V product computed by
// mma.sync instead of lane-by-lane dot products.
//
// A row group is up to 16 query rows of one KV head (GQA: the query heads sharing it times the
// Nq new tokens), padded to the 16 rows of an m16n8k16 MMA. Each warp streams its own tiles of
// BN = 16 tokens: K and V rows go global -> shared with 16-byte cp.async into a ring of STAGES
// tiles private to the warp (zero-filled past the end), so the bytes in flight cost no
// registers and the warp never waits at a block barrier. Per tile:
//   S = Q K^T       mma_ABt on a 16 x 16 tile (K read with ldmatrix as the column operand),
//   online softmax  in base 2 on the accumulator fragments (4 lanes share a row: two shuffles
//                   for the row max; the row sums stay per lane until the end),
//   O += P V        mma_AB with V read by ldmatrix.trans; O is rescaled only when a row's max
//                   grew somewhere in the warp.
// Warps take the tiles of the split in turn (tile w, w + WARPS, ...); at the end the warps'
// states meet in shared memory (the ring is reused) and the block writes O and LSE (one split)
// or its normalised partial (several splits), exactly as decode.cu does.
//
// Paged caches must have pages of a multiple of 16 tokens, so that a tile lies in one page
// (its page is looked up a tile ahead); the op runs decode.cu otherwise. Page indices are
// clamped into the pool.
//
// FUSE = 1 folds the merge into the kernel: each block counts itself in on its group's
// counter (`counters`: zeros between calls, GpuBackend::with_counters) and the last one merges
// the group's splits (decode_merge_row, the combiner's code); FUSE = 0 leaves it to
// decode_combine.cu and ignores `counters`.
//
// EARLY = 1: the first copies go out sooner: the block's key ranges by warp reductions (one
// row per lane) instead of a serial loop over the rows, and (paged) each warp loads the pages
// of its first 32 tiles (one per lane) beside the sequence length, the next 32 tiles' pages
// 32 tiles ahead (a shuffle per lookup instead of a load a tile ahead); the merge of the warps
// computes its per-row factors once per row. L2_AHEAD = n > 0: each warp asks L2 for the tile n
// tiles past the one it copies (prefetch.global.L2), so more of the cache is requested early.
//
// SPEC = 1 (with EARLY): each warp issues the copies of its first STAGES - 1 tiles of the split
// before the sequence length and the key ranges are known (the rows up to the split's end and
// the cache's capacity: memory the cache owns; paged: after the one table round trip). The
// key ranges take ~530 dependent instructions after the length arrives (integer divisions,
// shuffles), all of which then overlap the first copies. Once the ranges are known, a block
// whose tiles do not start at the split's start (windows) drains those copies and refills the
// ring as without SPEC; otherwise the V rows past the sequence's end in its last tile are
// zeroed in shared memory after they land (P is 0 there, but 0 * NaN is NaN: the cache past
// the end may hold anything); K rows there only feed scores the mask replaces. Costs up to
// STAGES - 1 tiles per warp of reads for splits past the sequence's end.
//
// TRACE = 1 (a diagnostic, CALICO_DECODE_TUNE=trace=1): thread 0 of each block writes
// %globaltimer (ns) at the block's milestones to `trace` (TRACE_SLOTS per block, see below);
// the host prints where a call's time goes.
//
// Defines: ELEM (bf16 | f16), HEAD_DIM (64 | 128 | 256; HEAD_DIM_USED the problem's head dim
// below it, a multiple of 8: the pieces past it zero-filled, O written up to it), PAGED (0 | 1), WARPS (warps per
// block), STAGES (tiles in each warp's ring, >= 2), FUSE (0 | 1), EARLY (0 | 1),
// L2_AHEAD (0..8), SPEC (0 | 1; needs EARLY), MERGE_BATCH (splits the fused merge loads at
// once: 0 = decode_merge_row's default, else 8 | 16 | 32), TRACE (0 | 1), LEAN_COUNT (0 | 1:
// FUSE's fences by one thread instead of every thread), MERGE_EARLY (0 | 1: the fused merge by
// decode_merge_row_early, a row's LSEs read once beside its first batch; its own batch size:
// MERGE_BATCH = 32 beside it spilled).
#include "calico/calico.h"
#include "calico/tile_ops.cuh"
#include "attention/decode_common.h"

using namespace calico;

typedef ELEM T;

namespace decode_mma {

constexpr int D = HEAD_DIM;
#ifndef HEAD_DIM_USED
#define HEAD_DIM_USED HEAD_DIM
#endif
// The problem's head dim (a multiple of 8, at most D): Q, K and V pieces past it are not read
// (cp.async zero-fills them, no score changes) and only its columns of O are written.
constexpr int DIM = HEAD_DIM_USED;
static_assert(DIM % 8 == 0 && DIM <= D, "a real head dim of whole 16-byte pieces, at most D");
constexpr int BN = 16;                // tokens per warp tile
constexpr int ROWS = 16;              // query rows per block (one MMA row tile)
constexpr int DC = 64;                // head-dimension chunk of the register tiles
constexpr int CHUNKS = D / DC;
constexpr int PIECES_PER_ROW = D / 8;                    // 16-byte pieces in a K or V row
constexpr int ROW_STEP = 32 / PIECES_PER_ROW;            // rows between one lane's pieces
constexpr int PIECES = BN * PIECES_PER_ROW / 32;         // pieces per lane per operand
constexpr int ACC_STRIDE = D + 8;                        // floats per row of the merge buffer
static_assert(D % DC == 0 && PIECES_PER_ROW <= 32, "head_dim must be 64, 128 or 256");
static_assert(STAGES >= 2, "the ring needs two tiles");
static_assert(!SPEC || EARLY, "SPEC issues its copies from EARLY's page batches");
// TRACE slots per block: entry, first copies issued, key ranges known, first tile landed, loop
// done, partial written, counted in, exit (ns), then SM id | merged << 16 (0: not reached).
constexpr int TRACE_SLOTS = 9;

typedef st<T, BN, D> kv_tile;
typedef st<T, ROWS, D> q_tile;
static_assert(WARPS * ROWS * ACC_STRIDE * 4 <= WARPS * STAGES * 2 * (int)sizeof(kv_tile), "the merge buffer fits the ring");

// 2^x in one MUFU.EX2, subnormal results flushed to 0 (softmax arguments are <= 0; exp2f
// spends three more instructions per call on the subnormal range).
CALICO_DEVICE float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Scores of a tile in base 2: scale, soft-cap, -inf outside each row's keys [lo, hi].
CALICO_DEVICE void mask_tile(rt_fl<16, BN>& s, int lane, int tile, const int (&lo)[2], const int (&hi)[2], float qk_scale,
                             float softcap, float inv_softcap) {
    const float NEG_INF = decode_neg_inf();
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int x = k & 1;  // row g (k even) or g + 8 (k odd)
        const int j = tile + 2 * (lane % 4) + 8 * (k >> 1);
        float2 v = s.data[0][0][k];
        v.x *= qk_scale;
        v.y *= qk_scale;
        if (softcap > 0.0f) {
            v.x = softcap * tanhf(v.x * inv_softcap) * DECODE_LOG2E;
            v.y = softcap * tanhf(v.y * inv_softcap) * DECODE_LOG2E;
        }
        v.x = j >= lo[x] && j <= hi[x] ? v.x : NEG_INF;
        v.y = j + 1 >= lo[x] && j + 1 <= hi[x] ? v.y : NEG_INF;
        s.data[0][0][k] = v;
    }
}

}  // namespace decode_mma

CALICO_KERNEL CALICO_MAX_THREADS(WARPS * 32) void calico_attention_decode_mma(
    const T* q, long long q_sb, long long q_sh, long long q_sn,
    const T* k, long long k_sp, long long k_st, long long k_sh,
    const T* v, long long v_sp, long long v_st, long long v_sh,
    const int* block_table, long long bt_sb, long long page_size_ll, int page_shift, long long num_pages_ll,
    const int* seq_lens, long long capacity,
    T* o, long long o_sb, long long o_sh, long long o_sn, float* lse,
    float* part_o, float* part_lse,
    int hq, int hkv, int nq, int row_groups, int splits, long long split_tokens_ll,
    float qk_scale, float softcap, int causal, long long win_left, long long win_right, unsigned* counters,
    unsigned long long* trace) {
    using namespace decode_mma;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
    q_tile& qs = *reinterpret_cast<q_tile*>(smem);
    kv_tile* ring = reinterpret_cast<kv_tile*>(smem + sizeof(q_tile));
    __shared__ float sh_m[WARPS][ROWS], sh_l[WARPS][ROWS];
#if EARLY
    __shared__ int sh_head[ROWS], sh_qi[ROWS];    // query head and token of block row r (head -1: none)
    __shared__ float sh_c[WARPS][ROWS], sh_lt[ROWS], sh_mt[ROWS];  // the merge's per-row factors
#endif

    const int split = block_x();
    const int h = block_y() / row_groups;
    const int rg = block_y() % row_groups;
    const int b = block_z();
    const int warp = thread_x() / 32, lane = thread_x() % 32;
#if TRACE
    unsigned long long* my_trace = trace + ((long long)(block_z() * gridDim.y + block_y()) * gridDim.x + block_x()) * TRACE_SLOTS;
    auto stamp = [&](int slot) {
        if (thread_x() == 0) {
            unsigned long long ns;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
            my_trace[slot] = ns;
        }
    };
    stamp(0);
#else
    auto stamp = [](int) {};
#endif
    const int group = hq / hkv;
    const int total_rows = group * nq;
    const int group_rows = (total_rows + row_groups - 1) / row_groups;
    const int page_size = (int)page_size_ll;
    const int num_pages = (int)num_pages_ll;
    const float NEG_INF = decode_neg_inf();
    const float inv_softcap = softcap > 0.0f ? 1.0f / softcap : 0.0f;
    const long long split_start = (long long)split * split_tokens_ll;
    const long long split_end = split_start + split_tokens_ll;
    const int* table = block_table + b * bt_sb;
    const int len_raw = seq_lens[b];
    // A table entry clamped into the pool.
    auto clamp_page = [&](int page) -> int { return page < 0 ? 0 : (page >= num_pages ? num_pages - 1 : page); };
    // The table entry of the tile at token t (t inside the table's row), unclamped.
    auto table_entry = [&](long long t) -> int { return page_shift >= 0 ? table[t >> page_shift] : table[t / page_size]; };
#if PAGED && EARLY
    // Lane j: the table entry of this warp's tile base + j (unclamped: nothing waits for the
    // load until a lookup), for a split whose tiles start at its first token (every block
    // without a window). The first batches are loaded beside the sequence length, so the first
    // copies wait for one round trip instead of two (seq_lens, then the table).
    auto load_pages = [&](int base) -> int {
        const long long t = split_start + (long long)(warp + (base + lane) * WARPS) * BN;
        return t < capacity && t < split_end ? table_entry(t) : 0;
    };
    int pages_base = 0;
    int pages_cur = load_pages(0);
    int pages_next = load_pages(32);
#endif

    kv_tile* ks = ring + warp * 2 * STAGES;  // this warp's K ring, then its V ring
    kv_tile* vs = ks + STAGES;
    const int col = (lane % PIECES_PER_ROW) * 8;
    const int row0 = lane / PIECES_PER_ROW;
    // A piece past the real head dim reads nothing (zero-filled) from column 0 of its row.
    const bool in_dim = DIM == D || col < DIM;
    const T* kh = k + h * k_sh + (in_dim ? col : 0);
    const T* vh = v + h * v_sh + (in_dim ? col : 0);
    const long long k_step = ROW_STEP * k_st, v_step = ROW_STEP * v_st;
    // Issues the copies of the tile at token t (in page `page`) into ring slot `stage`: row
    // pointers advance by adds; only the last tile of a range tests rows against `lim` (the
    // range's end).
    auto slot_of = [&](int t) -> int {
#if PAGED
        return page_shift >= 0 ? (t & (page_size - 1)) : t % page_size;
#else
        return t;
#endif
    };
    auto issue = [&](int t, int page, int stage, int lim) {
        const int slot = slot_of(t);
        const T* kt = kh + page * k_sp + slot * k_st;  // row 0 of the tile: always inside
        const T* vt = vh + page * v_sp + slot * v_st;
        const T* kp = kt + row0 * k_st;
        const T* vp = vt + row0 * v_st;
        if (t + BN <= lim) {
#pragma unroll
            for (int i = 0; i < PIECES; ++i, kp += k_step, vp += v_step) {
                const int r = row0 + i * ROW_STEP;
                cp_async_16(ks[stage].ptr(r, col), kp, in_dim);
                cp_async_16(vs[stage].ptr(r, col), vp, in_dim);
            }
        } else {
#pragma unroll
            for (int i = 0; i < PIECES; ++i, kp += k_step, vp += v_step) {
                const int r = row0 + i * ROW_STEP;
                const bool valid = t + r < lim && in_dim;  // rows past the end read nothing, get zeros
                cp_async_16(ks[stage].ptr(r, col), valid ? kp : kt, valid);
                cp_async_16(vs[stage].ptr(r, col), valid ? vp : vt, valid);
            }
        }
    };
    // Row r of the block is query row rg * group_rows + r of this KV head, if it exists.
    auto row_of = [&](int r, int& head, int& qi) -> bool {
        const int rr = rg * group_rows + r;
        head = h * group + rr / nq;
        qi = rr % nq;
        return r < group_rows && rr < total_rows;
    };
    // Q rows (zeros for padding rows), 16 bytes per thread and step: loaded before the first
    // K/V copies are issued (SPEC: before the copies, or Q waits behind them in the DRAM
    // queue), stored to shared memory after them, so that the latencies overlap.
    constexpr int Q_STEPS = (ROWS * PIECES_PER_ROW + WARPS * 32 - 1) / (WARPS * 32);
    uint4 qv[Q_STEPS];
    auto load_q = [&]() {
#pragma unroll
        for (int n = 0; n < Q_STEPS; ++n) {
            const int idx = thread_x() + n * WARPS * 32;
            const int r = idx / PIECES_PER_ROW, c = (idx % PIECES_PER_ROW) * 8;
            int head, qi;
            qv[n] = make_uint4(0, 0, 0, 0);
            if (idx < ROWS * PIECES_PER_ROW && (DIM == D || c < DIM) && row_of(r, head, qi))
                qv[n] = *reinterpret_cast<const uint4*>(q + b * q_sb + head * q_sh + qi * q_sn + c);
        }
    };
#if SPEC
    // The first tiles of the split, before the length (see SPEC above): tile i of this warp in
    // ring slot i, one commit group each as the prologue below. Q goes first: behind ~16 MB
    // of copies (b1 8k) it arrived ~2 us later (trace=1: first tile 5.1 -> 7.2 us).
    load_q();
    {
        const long long spec_end = split_end < capacity ? split_end : capacity;
#pragma unroll
        for (int i = 0; i < STAGES - 1; ++i) {
            const long long t = split_start + (long long)(warp + i * WARPS) * BN;
#if PAGED
            const int page = clamp_page(__shfl_sync(0xffffffffu, pages_cur, i));
#else
            const int page = b;
#endif
            if (t < spec_end) issue((int)t, page, i, (int)spec_end);
            cp_async_commit();
        }
        stamp(1);
    }
#endif

    const int len = len_raw < 0 ? 0 : (len_raw > capacity ? (int)capacity : len_raw);

    // The keys row r sees: lo <= j <= hi (empty for rows that do not exist).
    auto bounds = [&](int r, int& lo, int& hi) {
        int head, qi;
        lo = 0;
        hi = -1;
        if (!row_of(r, head, qi)) return;
        const long long diag = (long long)qi + len - nq;
        long long top = causal ? diag : len - 1;
        if (win_right >= 0 && diag + win_right < top) top = diag + win_right;
        const long long bottom = win_left >= 0 ? diag - win_left : 0;
        lo = bottom < 0 ? 0 : (int)(bottom > len ? len : bottom);
        hi = top > len - 1 ? len - 1 : (int)(top < -1 ? -1 : top);
    };

#if !SPEC
    load_q();
#endif

    // This lane's rows (g and g + 8), and the keys any / every row of the block sees.
    int lo[2], hi[2];
    int block_lo = len, block_hi = -1, common_lo = 0, common_hi = len - 1;
#if EARLY
    // Lanes r and r + 16 take row r (one division each, in parallel) and warp reductions
    // combine the rows: a loop over the 16 rows was ~1100 dependent instructions (a division
    // and 64-bit compares per row) between the sequence length and the first copy.
    {
        int a, z, head, qi;
        bounds(lane % ROWS, a, z);
        const bool exists = row_of(lane % ROWS, head, qi);
        if (exists) {
            common_lo = a;
            common_hi = z;
            if (a <= z) {
                block_lo = a;
                block_hi = z;
            }
        }
#pragma unroll
        for (int o = ROWS / 2; o >= 1; o /= 2) {
            common_lo = max(common_lo, __shfl_xor_sync(0xffffffffu, common_lo, o));
            common_hi = min(common_hi, __shfl_xor_sync(0xffffffffu, common_hi, o));
            block_lo = min(block_lo, __shfl_xor_sync(0xffffffffu, block_lo, o));
            block_hi = max(block_hi, __shfl_xor_sync(0xffffffffu, block_hi, o));
        }
        lo[0] = __shfl_sync(0xffffffffu, a, lane / 4);
        hi[0] = __shfl_sync(0xffffffffu, z, lane / 4);
        lo[1] = __shfl_sync(0xffffffffu, a, lane / 4 + 8);
        hi[1] = __shfl_sync(0xffffffffu, z, lane / 4 + 8);
        if (warp == 0 && lane < ROWS) {
            sh_head[lane] = exists ? head : -1;
            sh_qi[lane] = qi;
        }
    }
#else
    bounds(lane / 4, lo[0], hi[0]);
    bounds(lane / 4 + 8, lo[1], hi[1]);
    for (int r = 0; r < ROWS; ++r) {
        int head, qi, a, z;
        if (!row_of(r, head, qi)) continue;
        bounds(r, a, z);
        common_lo = a > common_lo ? a : common_lo;
        common_hi = z < common_hi ? z : common_hi;
        if (a <= z) {
            block_lo = a < block_lo ? a : block_lo;
            block_hi = z > block_hi ? z : block_hi;
        }
    }
#endif
    const int start = split_start > block_lo ? (split_start > len ? len : (int)split_start) : block_lo;
    const int end = split_end < block_hi + 1 ? (int)split_end : block_hi + 1;
    // Tiles start at multiples of BN (split starts are), so a tile never crosses a split.
    const int first = start & ~(BN - 1);
    const int tiles = end > start ? (end - first + BN - 1) / BN : 0;
    const int mine = tiles > warp ? (tiles - warp + WARPS - 1) / WARPS : 0;
    auto tile_at = [&](int i) { return first + (warp + i * WARPS) * BN; };
    stamp(2);

    // The page of the tile at token t (the sequence for contiguous caches).
    auto page_of = [&](int t) -> int {
#if PAGED
        return t < end ? clamp_page(table_entry(t)) : 0;
#else
        return b;
#endif
    };
#if PAGED && EARLY
    // Whether the early batches hold this block's tiles (block-uniform).
    const bool early_ok = first == split_start;
#endif
    // The page of this warp's i-th tile (warp-uniform i): from the early batches where they
    // cover it (a shuffle), else from the table.
    auto page_at = [&](int i) -> int {
#if PAGED && EARLY
        if (early_ok && i >= pages_base && i < pages_base + 64) {
            const int j = i - pages_base;
            const int from_cur = __shfl_sync(0xffffffffu, pages_cur, j & 31);
            const int from_next = __shfl_sync(0xffffffffu, pages_next, j & 31);
            return clamp_page(j < 32 ? from_cur : from_next);
        }
#endif
        return page_of(tile_at(i));
    };

#if L2_AHEAD > 0
    // Asks L2 for the 128-byte lines of the tile at token t (page `page`), L2_AHEAD tiles
    // before its copy: DRAM keeps streaming while the ring is full, at no cost in registers
    // or shared memory.
    constexpr int LINES_PER_ROW = (DIM * (int)sizeof(T) + 127) / 128;
    auto prefetch_l2 = [&](int t, int page) {
        const int slot = slot_of(t);
        const T* kt = k + h * k_sh + page * k_sp + slot * k_st;
        const T* vt = v + h * v_sh + page * v_sp + slot * v_st;
#pragma unroll
        for (int idx = lane; idx < BN * LINES_PER_ROW; idx += 32) {
            const int r = idx / LINES_PER_ROW, c = (idx % LINES_PER_ROW) * (128 / (int)sizeof(T));
            if (t + r < end) {
                asm volatile("prefetch.global.L2 [%0];" ::"l"(kt + r * k_st + c));
                asm volatile("prefetch.global.L2 [%0];" ::"l"(vt + r * v_st + c));
            }
        }
    };
#endif

    rt_fl<16, DC> acc[CHUNKS];
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) zero(acc[c]);
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};  // l: this lane's share of the row sum

    // Prologue: STAGES - 1 tiles in flight, the page of the next one looked up.
#if SPEC
    // The copies already issued are this warp's first tiles when its tiles start at the
    // split's start (block-uniform); else they are drained and the ring filled again.
    const bool spec_ok = first == split_start;
    if (!spec_ok) {
        if (mine > 0) cp_async_wait<0>();
#else
    {
#endif
#pragma unroll
        for (int i = 0; i < STAGES - 1; ++i) {
            if (i < mine) issue(tile_at(i), page_at(i), i, end);
            cp_async_commit();
        }
#if !SPEC
        stamp(1);
#endif
    }
    int next_page = page_at(STAGES - 1);
#if L2_AHEAD > 0
    for (int i = STAGES - 1; i < STAGES - 1 + L2_AHEAD; ++i)
        if (i < mine) prefetch_l2(tile_at(i), page_at(i));
#endif

#pragma unroll
    for (int n = 0; n < Q_STEPS; ++n) {
        const int idx = thread_x() + n * WARPS * 32;
        if (idx < ROWS * PIECES_PER_ROW) *reinterpret_cast<uint4*>(qs.ptr(idx / PIECES_PER_ROW, (idx % PIECES_PER_ROW) * 8)) = qv[n];
    }
    sync_threads();  // Q is in shared memory
#if HEAD_DIM <= 128
    rt<T, 16, DC> qr[CHUNKS];
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) load(qr[c], qs, 0, c * DC);
#endif

    for (int i = 0; i < mine; ++i) {
        // Refill the slot consumed last iteration, then wait for tile i.
        __syncwarp();
        const int ahead = i + STAGES - 1;
        if (ahead < mine) {
            issue(tile_at(ahead), next_page, ahead % STAGES, end);
            next_page = page_at(ahead + 1);
#if L2_AHEAD > 0
            if (ahead + L2_AHEAD < mine) prefetch_l2(tile_at(ahead + L2_AHEAD), page_at(ahead + L2_AHEAD));
#endif
        }
#if PAGED && EARLY
        // Every later lookup is past the first batch: the next one moves up and the batch
        // after it is loaded, about 32 tiles before it is needed.
        if (i == pages_base + 32) {
            pages_base += 32;
            pages_cur = pages_next;
            pages_next = load_pages(pages_base + 32);
        }
#endif
        cp_async_commit();
        cp_async_wait<STAGES - 1>();
        const int stage = i % STAGES;
        const int t = tile_at(i);
#if SPEC
        // A speculative tile read whole rows past the end: V there must be finite (zero).
        if (spec_ok && i < STAGES - 1 && t + BN > end) {
#pragma unroll
            for (int n = 0; n < PIECES; ++n) {
                const int r = row0 + n * ROW_STEP;
                if (t + r >= end) *reinterpret_cast<uint4*>(vs[stage].ptr(r, col)) = make_uint4(0, 0, 0, 0);
            }
        }
#endif
        __syncwarp();
        if (i == 0) stamp(3);

        // S = Q K^T, 64 head-dimension columns at a time.
        rt_fl<16, BN> s;
        zero(s);
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            rt<T, BN, DC> kf;
            load(kf, ks[stage], 0, c * DC);
#if HEAD_DIM <= 128
            mma_ABt(s, qr[c], kf, s);
#else
            rt<T, 16, DC> qf;
            load(qf, qs, 0, c * DC);
            mma_ABt(s, qf, kf, s);
#endif
        }
        // Tiles every row sees in full need one multiply, no mask (block-uniform).
        if (t >= common_lo && t + BN - 1 <= common_hi && softcap <= 0.0f)
            mul(s, s, qk_scale);
        else
            mask_tile(s, lane, t, lo, hi, qk_scale, softcap, inv_softcap);

        // Online softmax in base 2 on the fragments: rows g (x = 0) and g + 8 (x = 1).
        rv<16, per_row> tile_max;
        row_max(tile_max, s);
        float alpha[2];
        bool grew = false;  // a row that holds something has a larger max: O needs rescaling
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            const float mn = fmaxf(m[x], tile_max.data[0][x]);
            const float base = mn == NEG_INF ? 0.0f : mn;  // nothing seen yet: p = 0, not NaN
            alpha[x] = fast_exp2(m[x] - base);
            grew = grew || (m[x] != mn && m[x] != NEG_INF);
            m[x] = mn;
            tile_max.data[0][x] = base;
        }
        row_map(s, s, tile_max, [](float e, float mx) { return fast_exp2(e - mx); });
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            const float2 a = s.data[0][0][x], c = s.data[0][0][x + 2];
            l[x] = l[x] * alpha[x] + ((a.x + a.y) + (c.x + c.y));
        }
        if (__any_sync(0xffffffffu, grew)) {  // rows with m = -inf hold zeros: no rescale
            rv<16, per_row> scale;
            scale.data[0][0] = alpha[0];
            scale.data[0][1] = alpha[1];
#pragma unroll
            for (int c = 0; c < CHUNKS; ++c) mul_row(acc[c], acc[c], scale);
        }

        // O += P V.
        rt<T, 16, BN> p;
        copy(p, s);
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            rt<T, BN, DC, col_l> vf;
            load(vf, vs[stage], 0, c * DC);
            mma_AB(acc[c], p, vf, acc[c]);
        }
    }
    cp_async_wait<0>();
    stamp(4);

    // The four lanes of a row hold parts of its sum.
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        l[x] += shfl_xor(l[x], 1);
        l[x] += shfl_xor(l[x], 2);
    }
    sync_threads();  // every warp is done with the ring: it becomes the merge buffer
    float* mine_acc = reinterpret_cast<float*>(ring) + warp * ROWS * ACC_STRIDE;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c)
#pragma unroll
        for (int j = 0; j < DC / 16; ++j)
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                int r, cc;
                base_coord<row_l>(lane, kk, r, cc);
                *reinterpret_cast<float2*>(mine_acc + r * ACC_STRIDE + c * DC + 16 * j + cc) = acc[c].data[0][j][kk];
            }
    if (lane % 4 == 0) {
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            sh_m[warp][lane / 4 + 8 * x] = m[x];
            sh_l[warp][lane / 4 + 8 * x] = l[x];
        }
    }
    sync_threads();

    const float* all_acc = reinterpret_cast<const float*>(ring);
#if EARLY
    // The per-row factors once per row (not once per element: 4 exponentials and a division
    // by nq per element were most of the merge).
    if (thread_x() < ROWS) {
        const int r = thread_x();
        float mt = NEG_INF;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) mt = fmaxf(mt, sh_m[w][r]);
        float lt = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            const float c = decode_rescale(sh_m[w][r], mt);
            sh_c[w][r] = c;
            lt += sh_l[w][r] * c;
        }
        sh_mt[r] = mt;
        sh_lt[r] = lt;
    }
    sync_threads();
#endif
    for (int idx = thread_x(); idx < ROWS * D; idx += WARPS * 32) {
        const int r = idx / D, d = idx % D;
#if EARLY
        const int head = sh_head[r], qi = sh_qi[r];
        if (head < 0) continue;
        const float mt = sh_mt[r], lt = sh_lt[r];
        float ot = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) ot += all_acc[(w * ROWS + r) * ACC_STRIDE + d] * sh_c[w][r];
#else
        int head, qi;
        if (!row_of(r, head, qi)) continue;
        float mt = NEG_INF;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) mt = fmaxf(mt, sh_m[w][r]);
        float lt = 0.0f, ot = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            const float c = decode_rescale(sh_m[w][r], mt);
            lt += sh_l[w][r] * c;
            ot += all_acc[(w * ROWS + r) * ACC_STRIDE + d] * c;
        }
#endif
        const float out = lt > 0.0f ? ot / lt : 0.0f;
        const float lse2 = lt > 0.0f ? mt + decode_log2(lt) : NEG_INF;
        const long long row = ((long long)b * hq + head) * nq + qi;
        if (splits == 1) {
            if (DIM == D || d < DIM) o[b * o_sb + head * o_sh + qi * o_sn + d] = from_float<T>(out);
            if (d == 0) lse[row] = lse2 == NEG_INF ? NEG_INF : lse2 * DECODE_LN2;
        } else {
            part_o[(row * splits + split) * D + d] = out;
            if (d == 0) part_lse[row * splits + split] = lse2;
        }
    }
    stamp(5);
    bool merged = false;  // this block merged its group's splits
#if FUSE
    // The last block of the group (sequence, KV head, row group) to finish merges the splits,
    // instead of a second launch. atomicInc wraps the group's counter back to 0 as it counts
    // the last split in, so the counters are zero again for the next call (or graph replay).
    if (splits > 1) {
        __shared__ int merge_here;
        const long long group = (long long)b * hkv * row_groups + block_y();
#if LEAN_COUNT
        // A grid barrier's pattern: the block's stores meet at the barrier, one thread fences
        // (cumulative over what the barrier ordered before it) and counts, and the merger's
        // thread fences again before the barrier that lets its warps read: 2 fences, not 256.
        // fence.acq_rel (MEMBAR.ALL.GPU) around the relaxed atomic is a release and an acquire
        // pattern; __threadfence is the sequentially consistent fence (MEMBAR.SC.GPU) plus an
        // L1 invalidation the merge's L2 loads (ld.global.cg) do not need.
        sync_threads();
        if (thread_x() == 0) {
            asm volatile("fence.acq_rel.gpu;" ::: "memory");
            merge_here = atomicInc(counters + group, (unsigned)splits - 1) == (unsigned)splits - 1;
            if (merge_here) asm volatile("fence.acq_rel.gpu;" ::: "memory");
        }
        sync_threads();
#else
        __threadfence();  // this block's partials are visible before it is counted
        sync_threads();
        if (thread_x() == 0)
            merge_here = atomicInc(counters + group, (unsigned)splits - 1) == (unsigned)splits - 1;
        sync_threads();
        if (merge_here) __threadfence();  // every split's partials are read after the count that saw them
#endif
        stamp(6);
        merged = merge_here;
        if (merge_here) {
            for (int r = warp; r < ROWS; r += WARPS) {
                int head, qi;
                if (!row_of(r, head, qi)) continue;
                const long long row = ((long long)b * hq + head) * nq + qi;
                T* orow = o + b * o_sb + head * o_sh + qi * o_sn;
#if MERGE_EARLY
                decode_merge_row_early<T, D, 0, 4, DIM>(part_o, part_lse, row, splits, orow, lse + row, lane);
#else
                decode_merge_row<T, D, MERGE_BATCH, DIM>(part_o, part_lse, row, splits, orow, lse + row, lane);
#endif
            }
        }
    }
#endif
#if TRACE
    stamp(7);
    if (thread_x() == 0) {
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        my_trace[8] = smid | (merged ? 1ull << 16 : 0ull) | 1ull << 32;
    }
#else
    (void)merged;
#endif
}
