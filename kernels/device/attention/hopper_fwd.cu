// Hopper (sm_90a) attention forward: O = softmax(scale * Q K^T, masked) V and the row
// log-sum-exp, bf16/f16 in, f32 softmax and accumulation.
//
// DESIGN
//  * Warp-specialised and persistent (calico/pipeline.cuh): CONSUMERS + 1 warpgroups.
//    Warpgroup 0 is the producer (setmaxnreg.dec): one thread (warp 1's lane 0) loads each
//    work unit's BM-row Q tile once (a ring of QBUF slots: with two, the next unit's Q loads
//    during this one) and another (thread 0) the unit's K and V tiles of BN keys into two rings of STAGES slots (K and
//    V have their own barriers, so S = Q K^T starts before V lands). Consumer warpgroups 1.. (setmaxnreg.inc) own 64 query rows each: two consumers
//    (BM = 128, 384 threads) by default, three (BM = 192, 512 threads) at d = 64 on request,
//    so that two consumers' softmax can run under the third's MMAs.
//  * Work units are (batch, head, BM-row block). The order walks a chunk of heads whose K/V
//    fit in L2 (heads_per_chunk, from the host) from the last row block to the first: under a
//    causal mask the last blocks see the most keys, so the longest units start first.
//  * Per key block: S[64 x BN] = Q K^T with wgmma m64nBNk16, both operands from shared memory
//    (K-major, 128B swizzle). Softmax in base 2: x = v * sc with v = s (sc = scale * log2(e))
//    or, with a soft-cap, v = tanh(s * scale / cap) (sc = cap * log2(e)); sc > 0, so the row
//    max is taken on v and the scale folds into exp2's argument, one FMA per score. Masked
//    keys -inf, running row max m and sum l, the O accumulator rescaled by exp2(m_old - m_new).
//    P is rounded to 16 bits in registers and O += P V with wgmma taking A from registers (the
//    accumulator layout of S is the A fragment layout of the next product) and V from shared
//    memory (MN-major, transposed). Key blocks run from the last to the first, so the blocks
//    that need masking (the diagonal and the end of the keys) come first and set a finite row
//    max early; only those blocks pay for the mask.
//  * Schedule (CALICO_ATTN_SCHED). 0: serial, each block's S, softmax, P V in turn. 1:
//    overlapped inside a warpgroup: S of block n is issued (async, its own commit group)
//    before P V of block n + 1, then wait_group<1> waits for S only, so the softmax of block
//    n runs while P V of block n + 1 is on the tensor cores. 2: 1 plus ping-pong: the
//    consumers take turns issuing their GEMMs in a fixed round (named barriers 1..CONSUMERS),
//    so one consumer's softmax runs under the others' MMAs instead of all competing at once.
//  * Epilogue (CALICO_ATTN_TMA_O, where O is a TMA view and the Q ring has two slots): each
//    consumer writes O / l into its own 64 rows of the unit's Q slot (its last S has read
//    them), and one thread per consumer stores them with TMA (the copy engine clips rows >= Nq
//    and columns past the head dim), so the warpgroup goes on to its next unit at once. That
//    thread hands the Q slot back once the store has read it (release_staged_o: after the next
//    unit's first S, at the start of a next unit that computes none, or before exiting), not
//    with the unit's last K release. Otherwise from registers: O / l stored as 2-element vectors
//    (scalars when O's strides or base are odd), rows >= Nq skipped. LSE = (m + log2 l) * ln 2
//    by one lane per row either way.
// EDGES
//  * Nq, Nkv not multiples of the tiles: TMA zero-fills rows past the end (the copies still
//    complete full boxes), keys >= Nkv are masked, rows >= Nq are not stored.
//  * A row that sees no key ends with l = 0: O = 0 and LSE = -inf. A unit whose rows see no
//    key at all loads nothing and only writes those. A consumer whose 64 rows see none of a
//    unit's top key blocks (a 192-row causal unit reaches a block past its first rows; rows
//    past Nq) passes their turns and slots on without computing them (TUNE_SKIP_UNSEEN).
//  * Mask (bottom-right aligned): row i sees key j iff lo(i) <= j < hi(i), with
//    c = i + Nkv - Nq, lo = c - left (or 0), hi = c + right + 1 (or Nkv), clamped to [0, Nkv].
//  * Head dims below D (multiples of 8: 80, 96, 192, ..., CALICO_ATTN_PADDED): the maps span
//    the real head dim, so TMA fills the columns past it with zeros (whole boxes past it too);
//    they add nothing to S = Q K^T, give O zeros there, and the epilogue stores only the
//    real columns. The MMAs run at D: d = 96 costs what d = 128 does.
//  * Packed sequences (varlen): one batch of all the rows; row i of sequence b sees the keys of
//    that sequence only, the mask aligned per sequence (packed_row_keys). Where the host sized
//    shared memory for them (offsets_staged), the offsets and each sequence's row-block counts
//    are staged there and the units are (head, sequence, row block of that sequence), ordered
//    and folded per sequence as fixed-length heads are (seq_unit_at): a unit's rows past its
//    sequence's end are computed on its keys but not stored. Otherwise units are BM-row blocks
//    of the packed rows and may span sequences: such a unit walks the key blocks from its
//    first row's lower bound to its last row's upper bound, and the per-row mask drops the
//    other sequences' keys. Key rows past a sequence's end are the next sequence's (or TMA's
//    zeros at the end), always masked.
//
// DEFINES (kernels/src/ops/attention/hopper.rs): CALICO_ATTN_T bf16|f16, CALICO_ATTN_D
// 64|128|256, CALICO_ATTN_BN 64|80|128|160|176|192 (wider blocks at d = 128 and 256: fewer
// per-block handshakes and reductions per MMA), CALICO_ATTN_STAGES 2.., CALICO_ATTN_SOFTCAP 0|1,
// CALICO_ATTN_SCHED 0|1|2, CALICO_ATTN_CONSUMERS 2|3 (3 only at d = 64, no soft-cap),
// CALICO_ATTN_ILP 0|1, CALICO_ATTN_LAZY 0|1, CALICO_ATTN_STALE 0|1 (the softmax's forms, see
// softmax_ilp, lazy_max, softmax_stale),
// CALICO_ATTN_QBUF 1|2, CALICO_ATTN_VARLEN 0|1 (packed sequences), CALICO_ATTN_PADDED 0|1 (a
// head dim below D, `head_dim`: see EDGES), CALICO_ATTN_TMA_O 0|1 (the epilogue's O through
// the Q slot and TMA stores; needs QBUF 2 and no VARLEN), CALICO_ATTN_TRACE 0|1 (a
// diagnostic, CALICO_ATTN_HOPPER_TRACE=1: one
// thread per consumer warpgroup stamps %globaltimer at each unit's milestones into `trace`,
// TRACE_SLOTS per (CTA, unit of the CTA, consumer); the producer adds when it issued the
// unit's Q and first K/V. kernels/src/ops/attention/hopper_trace.rs reads them).
#include "calico/calico.h"
#include "calico/mbarrier.cuh"
#include "calico/pipeline.cuh"
#include "calico/tma.cuh"
#include "calico/warpgroup.cuh"
#include "calico/wgmma.cuh"
#include "attention/hopper_packed.cuh"

namespace attn_hopper {

using calico::uint32_t;
using calico::uint64_t;
using in_t = CALICO_ATTN_T;

constexpr int D = CALICO_ATTN_D;
constexpr int CONSUMERS = CALICO_ATTN_CONSUMERS;
constexpr int BM = 64 * CONSUMERS;
constexpr int BN = CALICO_ATTN_BN;
constexpr int STAGES = CALICO_ATTN_STAGES;
// Q slots: with 2 the producer loads the next unit's Q while this unit runs, instead of after
// its last S = Q K^T.
constexpr int QBUF = CALICO_ATTN_QBUF;
constexpr bool SOFTCAP = CALICO_ATTN_SOFTCAP != 0;
constexpr int SCHED = CALICO_ATTN_SCHED;  // 0 serial, 1 overlapped, 2 overlapped + ping-pong
constexpr bool PINGPONG = SCHED == 2;
constexpr bool ILP = CALICO_ATTN_ILP != 0;    // the softmax's reductions as trees (softmax_ilp)
constexpr bool LAZY = CALICO_ATTN_LAZY != 0;  // the running max moves only by more than LAZY_SLACK
constexpr float LAZY_SLACK = 8.0f;            // base-2 units: exponentials up to 256
// CALICO_ATTN_STALE: after a unit's first block, the exponentials are taken against the running
// max without the block's row max (softmax_stale); the sums tell when that was wrong.
#ifndef CALICO_ATTN_STALE
#define CALICO_ATTN_STALE 0
#endif
constexpr bool STALE = CALICO_ATTN_STALE != 0;
static_assert(!STALE || (LAZY && ILP && !SOFTCAP), "the stale-max softmax extends the lazy, tree-form softmax without a soft-cap");
constexpr int TURN_BARRIER = 1;  // named barriers 1..CONSUMERS: the consumers' turns (0 is __syncthreads)
#ifndef CALICO_ATTN_TMA_O
#define CALICO_ATTN_TMA_O 0
#endif
// The epilogue stages O in the unit's Q slot and stores it with TMA (see DESIGN).
constexpr bool TMA_O = CALICO_ATTN_TMA_O != 0;
// Named barriers CONSUMERS + 1 .. 2 * CONSUMERS: each consumer's O staging, before its TMA store.
constexpr int STAGING_BARRIER = TURN_BARRIER + CONSUMERS;
static_assert(STAGING_BARRIER + CONSUMERS <= 16, "sixteen named barriers");
constexpr int CHUNK = 64;  // 16-bit elements per 128-byte swizzled row
constexpr int CHUNKS = D / CHUNK;
constexpr int Q_BYTES = BM * D * 2;
constexpr int KV_BYTES = BN * D * 2;
constexpr int S_REGS = BN / 2;
constexpr int O_REGS = D / 2;
constexpr int P_STEPS = BN / 16;
constexpr int THREADS = (CONSUMERS + 1) * calico::WARPGROUP_THREADS;
constexpr int RELEASES = CONSUMERS * calico::WARPGROUP_WARPS;  // lane 0 of each consumer warp
// Registers per thread after setmaxnreg; the CTA's 64K are all handed out: 128 * (40 + 2 * 232)
// = 64512 with two consumers, 128 * (32 + 3 * 160) = 65536 with three.
constexpr int PRODUCER_REGS = CONSUMERS == 2 ? 40 : 32;
constexpr int CONSUMER_REGS = CONSUMERS == 2 ? 232 : 160;
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

static_assert(sizeof(in_t) == 2, "16-bit inputs");
static_assert(D == 64 || D == 128 || D == 256, "head dim 64, 128 or 256");
static_assert(BN == 64 || BN == 80 || BN == 128 || BN == 160 || BN == 176 || BN == 192, "key blocks of 64, 80, 128, 160, 176 or 192");
static_assert(STAGES >= 2, "at least two stages");
static_assert(SCHED >= 0 && SCHED <= 2, "schedule 0, 1 or 2");
static_assert(CONSUMERS == 2 || (CONSUMERS == 3 && D == 64), "two consumers, or three at d = 64 (registers)");
static_assert(BM <= 256, "a TMA box has at most 256 rows");
static_assert(QBUF == 1 || QBUF == 2, "one or two Q slots");
static_assert(!TMA_O || QBUF == 2, "O staged in a Q slot: the next unit's Q needs the other one");
#ifndef CALICO_ATTN_TRACE
#define CALICO_ATTN_TRACE 0
#endif
constexpr bool TRACE = CALICO_ATTN_TRACE != 0;
#ifndef CALICO_ATTN_VARLEN
#define CALICO_ATTN_VARLEN 0
#endif
static_assert(!TMA_O || CALICO_ATTN_VARLEN == 0, "packed units may end inside a TMA box (the next sequence's rows)");
// Packed sequences (packed_row_keys): a variant of its own, so that the fixed-length kernel
// carries none of the offset lookups.
constexpr bool VARLEN = CALICO_ATTN_VARLEN != 0;
#ifndef CALICO_ATTN_PADDED
#define CALICO_ATTN_PADDED 0
#endif
// A head dim below D (a multiple of 8): TMA fills Q, K and V's columns past it with zeros,
// which add nothing to S and give O zeros there, and the epilogue stores only its columns.
constexpr bool PADDED = CALICO_ATTN_PADDED != 0;
// Trace slots per (CTA, unit, consumer): consume entry, Q landed, first turn taken, first S
// done, last P V done, epilogue done; then (consumer 0's record only) the producer's Q issue
// and first K/V issue of the unit; then the SM's cycle counter (clock64, exact where the
// 256 ns global timer is not) at the last P V done, after O's rows are written (registers to
// shared or global memory, and the LSE), after the staging barrier, and at the epilogue's end.
constexpr int TRACE_SLOTS = 12;
constexpr int TRACE_CLOCK_LOOP_DONE = 8;

CALICO_DEVICE unsigned long long global_ns() {
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    return ns;
}

// Byte offsets in dynamic shared memory after rounding its base up to 1024.
constexpr int Q_OFFSET = 0;
constexpr int K_OFFSET = Q_OFFSET + QBUF * Q_BYTES;
constexpr int V_OFFSET = K_OFFSET + STAGES * KV_BYTES;
constexpr int BAR_OFFSET = V_OFFSET + STAGES * KV_BYTES;
// Barriers: the K ring, the V ring, the Q ring. The host allocates
// SMEM_BYTES = 1024 + BAR_OFFSET + (4 * STAGES + 2 * QBUF) * 8, plus 24 * (n_seqs + 1) for
// packed sequences whose offsets it has the kernel stage at OFFSETS_OFFSET.

struct barriers {
    calico::pipeline::ring<STAGES> k;
    calico::pipeline::ring<STAGES> v;
    calico::pipeline::ring<QBUF> q;
};
static_assert(sizeof(barriers) == (4 * STAGES + 2 * QBUF) * 8, "the host's shared-memory size");
constexpr int OFFSETS_OFFSET = BAR_OFFSET + (int)sizeof(barriers);

struct params {
    int batch, q_heads, group, q_len, k_len, m_blocks, heads_per_chunk;
    int has_left, has_right;
    long long left, right;
    int work, ctas;  // units in all; CTAs (each takes units blockIdx.x + k * ctas)
    int tune;        // TUNE_* bits
    // Packed sequences (VARLEN): n_seqs sequences, query rows cu_q[b]..cu_q[b + 1] and key rows
    // cu_k[b]..cu_k[b + 1] of one packed batch (batch = 1, q_len / k_len the totals).
    calico::attention::packed_side cu_q;
    calico::attention::packed_side cu_k;
    int n_seqs;
    // Units per sequence (VARLEN with staged offsets, seq_unit_at): the staged arrays in
    // shared memory (staged_at: the callers pass their base, derived from the kernel's shared
    // memory, so the compiler reads them as shared memory with 32-bit addresses and the
    // consumers' unit decode keeps few registers); per head: blocks_per_head row blocks,
    // pairs_per_head folded pairs and odd_per_head unpaired middle blocks.
    bool seq_units;
    int blocks_per_head, pairs_per_head, odd_per_head;
};

// Tuning bits (the host sets all by default; CALICO_ATTN_HOPPER_TUNE clears them for A/B runs).
constexpr int TUNE_KV_FIRST = 1;  // the producer loads a unit's first K/V block before its Q
constexpr int TUNE_FOLD = 2;      // pair long and short row blocks on one CTA (masks that grow with the row)
constexpr int TUNE_FOLD_ODD = 4;  // fold odd row-block counts too: the unpaired middle blocks come last
constexpr int TUNE_Q_THREAD = 8;  // Q loaded by a thread of its own (producer warp 1), as soon as its slot is free
constexpr int TUNE_DECODE_AHEAD = 16;  // consumers decode their next unit during this one's first turns
constexpr int TUNE_FAST_EPILOGUE = 32;  // 1 / l and ln l by MUFU approximations in the epilogue
constexpr int TUNE_SKIP_UNSEEN = 64;    // a consumer passes over the unit's key blocks none of its rows sees
constexpr int TUNE_SEQ_LONGEST = 128;   // per-sequence units: longest sequences first, rounds in alternating directions

struct unit {
    int b, h, m0;
    int m_end;       // rows from m_end on are not stored (Nq, or the end of the unit's sequence)
    int seq;         // per-sequence units: the sequence (else 0)
    int n_lo, n_hi;  // key blocks [n_lo, n_hi); empty when n_hi <= n_lo
};

#define ATTN_NEG_INF __int_as_float(0xff800000u)

CALICO_DEVICE long long clamp_ll(long long v, long long lo, long long hi) { return v < lo ? lo : (v > hi ? hi : v); }

// The keys [lo, hi) that a query row sees in a sequence of lq rows and lk keys whose keys
// start at k0 (the mask bottom-right aligned: local row r sits at key r + lk - lq).
CALICO_DEVICE void seq_row_keys(const params& p, long long r, long long lq, long long lk, int k0, int& lo, int& hi) {
    const long long c = r + lk - lq;
    lo = k0 + (int)(p.has_left ? clamp_ll(c - p.left, 0, lk) : 0);
    hi = k0 + (int)(p.has_right ? clamp_ll(c + p.right + 1, 0, lk) : lk);
}

// The sequence a packed row was last found in: its query rows [q0, q1) and keys [k0, k1).
struct seq_cache {
    int q0, q1, k0, k1;
    bool valid;
};

// Packed row i: the sequence b with cu_q[b] <= i < cu_q[b + 1] (a binary search over the
// offsets, skipped when i lies in the cached sequence: a unit's rows mostly share one) gives
// its keys inside cu_k[b]..cu_k[b + 1]. Rows before the first offset see none at key 0 and rows
// past the last none at the end of the keys, so the bounds still grow with the row, as the
// unit's key-block range and the mask tests need.
CALICO_DEVICE void packed_row_keys(const params& p, long long i, int& lo, int& hi, seq_cache& c) {
    if (p.seq_units) {
        // `c` holds the unit's sequence (seeded, no search); its rows past the sequence's end
        // see no key (bounds at the sequence's last key, still growing with the row).
        if (i >= c.q1) {
            lo = hi = c.k1;
            return;
        }
        seq_row_keys(p, i - c.q0, c.q1 - c.q0, c.k1 - c.k0, c.k0, lo, hi);
        return;
    }
    if (!(c.valid && i >= c.q0 && i < c.q1)) {
        if (i < p.cu_q.at(0)) {
            lo = hi = 0;
            return;
        }
        if (i >= p.cu_q.at(p.n_seqs)) {
            lo = hi = p.cu_k.at(p.n_seqs);
            return;
        }
        const int a = p.cu_q.sequence(p.n_seqs, i);
        c.q0 = p.cu_q.at(a);
        c.q1 = max(c.q0, p.cu_q.at(a + 1));
        c.k0 = p.cu_k.at(a);
        c.k1 = max(c.k0, p.cu_k.at(a + 1));
        c.valid = true;
    }
    seq_row_keys(p, i - c.q0, c.q1 - c.q0, c.k1 - c.k0, c.k0, lo, hi);
}

// Keys row i sees: [lo, hi), clamped to [0, k_len] (hi <= lo: none). `c` carries the packed
// sequence found for an earlier row of the same unit.
CALICO_DEVICE void row_keys(const params& p, long long i, int& lo, int& hi, seq_cache& c) {
    if constexpr (VARLEN) {
        packed_row_keys(p, i, lo, hi, c);
    } else {
        (void)c;
        seq_row_keys(p, i, p.q_len, p.k_len, 0, lo, hi);
    }
}

// Whether row i of unit u has its O and LSE written: rows from u.m_end on are not (past Nq,
// or past the sequence of a per-sequence unit), nor packed rows outside every sequence (left
// as they are).
CALICO_DEVICE bool row_stored(const params& p, const unit& u, long long i) {
    if (i >= u.m_end) return false;
    return !VARLEN || p.seq_units || (i >= p.cu_q.at(0) && i < p.cu_q.at(p.n_seqs));
}

// The staged arrays of per-sequence units (n_seqs + 1 ints each, from the staged cu_q on):
// the query offsets, the key offsets, each sequence's row blocks, the order the sequences go
// out in (position -> sequence: longest first with TUNE_SEQ_LONGEST, see order_sequences),
// and over that order the prefix sums of row blocks and of odd block counts.
enum staged_array { STAGED_CU_Q, STAGED_CU_K, STAGED_COUNTS, STAGED_ORDER, STAGED_BLOCKS, STAGED_ODD, STAGED_ARRAYS };
// The host sizes the staged arrays (kernels/src/ops/attention/hopper.rs, STAGED_ARRAYS there).
static_assert(STAGED_ARRAYS == 6, "hopper.rs sizes shared memory for 6 staged arrays");
// The first element of array a of the staged arrays at `staged`, for n sequences.
CALICO_DEVICE int* staged_begin(int* staged, int n, staged_array a) { return staged + a * (n + 1); }
CALICO_DEVICE const int* staged_begin(const int* staged, int n, staged_array a) { return staged + a * (n + 1); }
CALICO_DEVICE int staged_at(const params& p, const int* staged, staged_array a, int i) { return staged_begin(staged, p.n_seqs, a)[i]; }

// The sequence cache for unit u's rows: per-sequence units seed it with their sequence (no
// search); otherwise it fills on the first lookup.
CALICO_DEVICE seq_cache unit_seq_cache(const params& p, const int* staged, const unit& u) {
    if (VARLEN && p.seq_units) {
        const int q0 = staged_at(p, staged, STAGED_CU_Q, u.seq);
        const int k0 = staged_at(p, staged, STAGED_CU_K, u.seq);
        const int q1 = max(q0, staged_at(p, staged, STAGED_CU_Q, u.seq + 1));
        return seq_cache{q0, q1, k0, max(k0, staged_at(p, staged, STAGED_CU_K, u.seq + 1)), true};
    }
    return seq_cache{0, 0, 0, 0, false};
}

// Head bh and pair j (of per_head pairs in each head) of the pair-th pair, walking a chunk
// of heads_per_chunk heads (whose K/V fit in L2) before the next.
CALICO_DEVICE void pair_at(const params& p, int pair, int per_head, int& bh, int& j) {
    const int heads = p.batch * p.q_heads;
    const int per_chunk = p.heads_per_chunk * per_head;
    const int chunk = pair / per_chunk;
    const int r = pair - chunk * per_chunk;
    const int here = min(p.heads_per_chunk, heads - chunk * p.heads_per_chunk);
    j = r / here;
    bh = chunk * p.heads_per_chunk + r % here;
}

// The folded order: when a row block's key count grows with the row (causal, windows), the
// blocks j and m - 1 - j of a head (or of a packed sequence) of m blocks together cost the
// same for every j. Rounds 2k and 2k + 1 give each CTA both halves of one pair (its slots are
// w and w + ctas); the last, partial pairs go whole to the CTAs with two slots left and as
// halves to those with one. Slot w of `pairs` pairs in all: which pair, and which half.
CALICO_DEVICE void fold_slot(const params& p, int w, int pairs, int& pair, bool& long_half) {
    const int G = p.ctas;
    const int full = pairs / G * G;  // pairs dealt in whole double rounds
    if (w < 2 * full) {
        const int round = w / G;
        pair = round / 2 * G + (w - round * G);
        long_half = (round & 1) == 0;
    } else {
        const int t = w - 2 * full;
        const int rest = pairs - full;
        const int two = max(0, 2 * rest - G);  // CTAs with two slots in the tail
        if (t >= G) {
            pair = full + t - G;
            long_half = false;
        } else if (t < two) {
            pair = full + t;
            long_half = true;
        } else {
            const int i = t - two;
            const int left = rest - two;
            long_half = i < left;
            pair = full + two + (long_half ? i : i - left);
        }
    }
}

// Head bh and row block m of slot w in the folded order of fixed-length heads (or packed rows).
CALICO_DEVICE void folded_at(const params& p, int w, int& bh, int& m_block) {
    const int per_head = p.m_blocks / 2;
    int pair, j;
    bool long_half;
    fold_slot(p, w, p.batch * p.q_heads * per_head, pair, long_half);
    pair_at(p, pair, per_head, bh, j);
    m_block = long_half ? p.m_blocks - 1 - j : j;
}

CALICO_DEVICE bool folded(const params& p) {
    const bool odd = (VARLEN && p.seq_units) ? p.odd_per_head > 0 : p.m_blocks % 2 != 0;
    return (p.tune & TUNE_FOLD) && (p.has_left || p.has_right) && (!odd || (p.tune & TUNE_FOLD_ODD));
}

// The key blocks of unit u (its rows from u.m0 to u.m_end): from the first row's lower bound
// to the last stored row's upper bound, both growing with the row. `c` may hold the rows'
// sequence.
CALICO_DEVICE void unit_keys(const params& p, unit& u, seq_cache& c) {
    int lo, hi, lo_last, hi_last;
    row_keys(p, u.m0, lo, hi, c);
    row_keys(p, min(u.m0 + BM, u.m_end) - 1, lo_last, hi_last, c);
    u.n_lo = lo / BN;
    u.n_hi = hi_last > lo ? (hi_last + BN - 1) / BN : u.n_lo;
}

// Slot w of `count` slots dealt round-robin to G CTAs (CTA w mod G), with every odd round
// reversed: when slots go out longest first, no CTA takes the longest slot of every round.
// A bijection on [0, count): a last, partial round keeps its order.
CALICO_DEVICE int snake(const params& p, int w, int count) {
    const int G = p.ctas;
    const int round = w / G;
    if (!(p.tune & TUNE_SEQ_LONGEST) || (round & 1) == 0 || (round + 1) * G > count) return w;
    return round * G + (G - 1 - (w - round * G));
}

// Slot w of the per-sequence units (VARLEN with staged offsets): (head, sequence, row block l
// of it), in the fixed-length orders with each sequence's blocks in place of a head's, the
// sequences in the staged order (STAGED_ORDER: longest first by default). Folded: the pairs
// (l, m - 1 - l) of every sequence, then the odd sequences' middle blocks, heads interleaved;
// otherwise each chunk of heads sequence by sequence, each from its last block to its first.
CALICO_DEVICE unit seq_unit_at(const params& p, const int* staged, int w) {
    using calico::attention::packed_sequence_by;
    const int heads = p.q_heads;  // one batch of all the rows
    const int n = p.n_seqs;
    int bh, k, l;  // k: the sequence's position in the order
    auto blocks_before = [&](int i) { return staged_at(p, staged, STAGED_BLOCKS, i); };
    auto odd_before = [&](int i) { return staged_at(p, staged, STAGED_ODD, i); };
    auto blocks_at = [&](int i) { return blocks_before(i + 1) - blocks_before(i); };
    if (folded(p)) {
        const int pairs = heads * p.pairs_per_head;
        if (w < 2 * pairs) {
            int pair, j;
            bool long_half;
            fold_slot(p, w, pairs, pair, long_half);
            pair = snake(p, pair, pairs / p.ctas * p.ctas);
            pair_at(p, pair, p.pairs_per_head, bh, j);
            // Pairs before position i: half the even block counts there.
            auto pairs_before = [&](int i) { return (blocks_before(i) - odd_before(i)) / 2; };
            k = packed_sequence_by(pairs_before, n, j);
            const int lj = j - pairs_before(k);
            l = long_half ? blocks_at(k) - 1 - lj : lj;
        } else {
            const int mid = w - 2 * pairs;
            bh = mid % heads;
            k = packed_sequence_by(odd_before, n, mid / heads);
            l = blocks_at(k) / 2;
        }
    } else {
        const int v = snake(p, w, p.work);
        const int per_chunk = p.heads_per_chunk * p.blocks_per_head;
        const int chunk = v / per_chunk;
        const int r = v - chunk * per_chunk;
        const int here = min(p.heads_per_chunk, heads - chunk * p.heads_per_chunk);
        const int g = r / here;
        bh = chunk * p.heads_per_chunk + r % here;
        k = packed_sequence_by(blocks_before, n, g);
        l = blocks_at(k) - 1 - (g - blocks_before(k));
    }
    unit u;
    u.b = 0;
    u.h = bh;
    u.seq = staged_at(p, staged, STAGED_ORDER, k);
    seq_cache c = unit_seq_cache(p, staged, u);
    u.m0 = c.q0 + l * BM;
    u.m_end = min(u.m0 + BM, c.q1);
    unit_keys(p, u, c);
    return u;
}

// `staged`: the per-sequence units' arrays (staged_at), unused otherwise.
CALICO_DEVICE unit unit_at(const params& p, const int* staged, int w) {
    if constexpr (VARLEN) {
        if (p.seq_units) return seq_unit_at(p, staged, w);
    }
    int bh, m_block;
    const int paired = 2 * p.batch * p.q_heads * (p.m_blocks / 2);  // units in folded pairs
    if (folded(p) && w < paired) {
        folded_at(p, w, bh, m_block);
    } else if (folded(p)) {
        // Odd m_blocks: each head's middle block, half a pair's cost, after all pairs.
        bh = w - paired;
        m_block = p.m_blocks / 2;
    } else {
        const int heads = p.batch * p.q_heads;
        const int per_chunk = p.heads_per_chunk * p.m_blocks;
        const int chunk = w / per_chunk;
        const int r = w - chunk * per_chunk;
        const int here = min(p.heads_per_chunk, heads - chunk * p.heads_per_chunk);
        m_block = p.m_blocks - 1 - r / here;
        bh = chunk * p.heads_per_chunk + r % here;
    }
    unit u;
    u.b = bh / p.q_heads;
    u.h = bh - u.b * p.q_heads;
    u.m0 = m_block * BM;
    u.m_end = p.q_len;
    u.seq = 0;
    seq_cache c{0, 0, 0, 0, false};
    unit_keys(p, u, c);
    return u;
}

// The running max (base-2 units) after a block whose max is m_blk, with CALICO_ATTN_LAZY:
// kept unless the block exceeds it by more than LAZY_SLACK, so most blocks need no O rescale.
// Exact either way: the sum and O share the stale max, and the exponentials it lets through
// stay below 2^LAZY_SLACK (f32 sums, 16-bit P: no overflow, the same relative rounding).
// m_run = -inf takes any finite m_blk (-inf + slack is -inf).
CALICO_DEVICE float lazy_max(float m_run, float m_blk) { return m_blk > m_run + LAZY_SLACK ? m_blk : m_run; }

// The max of v[0 .. N) as a tree: each level folds the top half onto the bottom half (an odd
// count keeps its middle element for the next level), so N = 22 (176-key blocks) takes 5
// levels like 16 does. A template so that every level is a constant-size loop that unrolls,
// keeping v in registers (a plain loop was once vectorised into local memory). Overwrites v.
template <int N, int M>
CALICO_DEVICE float tree_max(float (&v)[M]) {
    static_assert(N >= 1 && N <= M, "the tree covers v");
    if constexpr (N == 1) {
        return v[0];
    } else {
        constexpr int PAIRS = N / 2;
#pragma unroll
        for (int i = 0; i < PAIRS; ++i) v[i] = fmaxf(v[i], v[i + (N - PAIRS)]);
        return tree_max<N - PAIRS>(v);
    }
}

// 2^x, flushing subnormal results to 0 (one MUFU.EX2; exp2f adds range handling). -inf gives 0.
CALICO_DEVICE float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Keeps registers that an asynchronous wgmma reads (its A operand) live and unchanged up to
// this point.
template <int N>
CALICO_DEVICE void fence_words(uint32_t (&a)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
#pragma unroll
        for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(a[i][r])::"memory");
    }
}

// Makes values computed before this point count as used here (no instructions).
CALICO_DEVICE void fence_values(float (&v)[2]) { asm volatile("" : "+f"(v[0]), "+f"(v[1])::"memory"); }

// Sequences that longest-first ordering sorts (a rank count per sequence: n^2 / block
// threads compares); more keep their order.
constexpr int SORTED_SEQUENCES = 128;

// Per-sequence units (seq_unit_at), step 1: counts[s] = the BM-row blocks of sequence s, and
// order[k] = the sequence that goes k-th: by block count, most first (ties by index), with
// TUNE_SEQ_LONGEST and at most SORTED_SEQUENCES sequences, else in index order. The block's
// threads share the work; the caller synchronises between the two passes and after.
CALICO_DEVICE void count_sequence_blocks(const int* staged_cu_q, int n, int* counts) {
    for (int s = threadIdx.x; s < n; s += blockDim.x) counts[s] = (max(0, staged_cu_q[s + 1] - staged_cu_q[s]) + BM - 1) / BM;
}
CALICO_DEVICE void order_sequences(const int* counts, int n, bool longest_first, int* order) {
    const bool sort = longest_first && n <= SORTED_SEQUENCES;
    for (int s = threadIdx.x; s < n; s += blockDim.x) {
        int rank = s;
        if (sort) {
            rank = 0;
            const int c = counts[s];
            for (int t = 0; t < n; ++t) rank += counts[t] > c || (counts[t] == c && t < s);
        }
        order[rank] = s;
    }
}

// Step 2: warp 0 writes blocks[k] = the row blocks of the sequences at positions 0..k-1 of
// `order` and odd[k] = how many of them have an odd count, k = 0..n, 32 positions a step
// (shuffle scans with a running carry). The caller synchronises the block after it.
CALICO_DEVICE void scan_sequence_blocks(const int* counts, const int* order, int n, int* blocks, int* odd) {
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    int carry_blocks = 0, carry_odd = 0;
    for (int base = 0; base < n; base += 32) {
        const int k = base + lane;
        int b = k < n ? counts[order[k]] : 0;
        int o = b & 1;
#pragma unroll
        for (int d = 1; d < 32; d *= 2) {
            const int up_b = __shfl_up_sync(0xffffffffu, b, d);
            const int up_o = __shfl_up_sync(0xffffffffu, o, d);
            if (lane >= d) {
                b += up_b;
                o += up_o;
            }
        }
        if (k < n) {
            blocks[k + 1] = carry_blocks + b;
            odd[k + 1] = carry_odd + o;
        }
        carry_blocks += __shfl_sync(0xffffffffu, b, 31);
        carry_odd += __shfl_sync(0xffffffffu, o, 31);
    }
    if (lane == 0) {
        blocks[0] = 0;
        odd[0] = 0;
    }
}

}  // namespace attn_hopper

// Parameters (kernels/src/ops/attention/hopper.rs builds them):
//  map_q: 4-D map over Q {head_dim, Nq, Hq, B} (real strides), box {64, BM, 1, 1}, 128B swizzle.
//  map_k, map_v: {head_dim, Nkv, Hkv, B}, box {64, BN, 1, 1}, 128B swizzle.
//  map_o: with CALICO_ATTN_TMA_O, O's map {head_dim, Nq, Hq, B}, box {64, 64, 1, 1}, 128B
//  swizzle; otherwise unused (any map).
//  o: O's first element, element strides o_sb, o_sh, o_sn (head dim contiguous); o_store:
//  calico::ROW_STORE_* (what the base's and strides' alignment allows). lse: f32 [B, Hq, Nq] contiguous.
//  score_scale: scale * log2(e), or scale / cap with a soft-cap; cap_log2: cap * log2(e).
//  left/right: the window sides (flags say whether each is bounded; causal is right = 0).
//  tune: TUNE_* bits. trace: with CALICO_ATTN_TRACE, the stamps (see TRACE_SLOTS); else unused.
//  cu_q, cu_k, n_seqs: packed sequences (CALICO_ATTN_VARLEN; batch 1, q_len / k_len the packed
//  totals, O and LSE [Hq, total_q] as one batch); unused (null, 0) by the fixed-length kernel.
//  head_dim: the real head dim (the maps' inner extent); below D only with CALICO_ATTN_PADDED.
//  offsets_staged: VARLEN only, nonzero when the host sized shared memory for the staged
//  offsets and block counts (6 * (n_seqs + 1) ints at OFFSETS_OFFSET): then the units are
//  per sequence (seq_unit_at); else the offsets are read from global memory and the units
//  are blocks of the packed rows.
CALICO_KERNEL void __launch_bounds__(attn_hopper::THREADS, 1)
    calico_attention_hopper_fwd(const __grid_constant__ calico::tensor_map map_q, const __grid_constant__ calico::tensor_map map_k,
                                const __grid_constant__ calico::tensor_map map_v, const __grid_constant__ calico::tensor_map map_o,
                                attn_hopper::in_t* o, float* lse, int batch,
                                int q_heads, int group, int q_len, int k_len, int heads_per_chunk, long long o_sb, long long o_sh,
                                long long o_sn, int o_store, float score_scale, float cap_log2, int has_left, long long left,
                                int has_right, long long right, int tune, unsigned long long* trace, const int* cu_q,
                                const int* cu_k, int n_seqs, int head_dim, int offsets_staged) {
    using namespace attn_hopper;
    namespace pl = calico::pipeline;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = smem_raw + ((1024 - (calico::smem_addr(smem_raw) & 1023)) & 1023);
    barriers& bars = *reinterpret_cast<barriers*>(smem + BAR_OFFSET);

    params p;
    p.batch = batch;
    p.q_heads = q_heads;
    p.group = group;
    p.q_len = q_len;
    p.k_len = k_len;
    p.m_blocks = (q_len + BM - 1) / BM;
    p.heads_per_chunk = heads_per_chunk;
    p.has_left = has_left;
    p.has_right = has_right;
    p.left = left;
    p.right = right;
    p.ctas = gridDim.x;
    p.tune = tune;
    p.cu_q = {cu_q, q_len};
    p.cu_k = {cu_k, k_len};
    p.n_seqs = n_seqs;
    p.seq_units = VARLEN && offsets_staged;
    p.blocks_per_head = p.pairs_per_head = p.odd_per_head = 0;
    const float sc = SOFTCAP ? cap_log2 : score_scale;  // > 0: base-2 units per score unit
    // The host's bound on the units (per-sequence units add at most one partial block per
    // sequence), which also sizes the trace.
    const int work_bound = batch * q_heads * (p.m_blocks + (p.seq_units ? n_seqs : 0));
    // The trace record of unit w for `consumer`: this CTA's units are w = blockIdx.x + j * gridDim.x.
    auto stamp = [&](int w, int consumer, int slot) {
        if constexpr (TRACE) {
            const int per_cta = (work_bound + (int)gridDim.x - 1) / (int)gridDim.x;
            const int j = (w - (int)blockIdx.x) / (int)gridDim.x;
            const unsigned long long now = slot >= TRACE_CLOCK_LOOP_DONE ? clock64() : global_ns();
            trace[(((long long)blockIdx.x * per_cta + j) * CONSUMERS + consumer) * TRACE_SLOTS + slot] = now;
        } else {
            (void)w;
            (void)consumer;
            (void)slot;
            (void)trace;
        }
    };

    if (threadIdx.x == 0) {
        bars.k.init(RELEASES);
        bars.v.init(RELEASES);
        bars.q.init(RELEASES);
        calico::fence_barrier_init();
    }
    // Packed sequences, where the host made room past the barriers (offsets_staged): the
    // offsets, clamped, and then each sequence's row-block counts as prefix sums, so that
    // units follow sequences (seq_unit_at) and every sequence search reads shared memory.
    // The STAGED_ARRAYS arrays of n_seqs + 1 ints (staged_array, staged_begin).
    int* staged = reinterpret_cast<int*>(smem + OFFSETS_OFFSET);
    if (p.seq_units) {
        calico::attention::stage_packed_offsets(p.cu_q, n_seqs, staged_begin(staged, n_seqs, STAGED_CU_Q));
        calico::attention::stage_packed_offsets(p.cu_k, n_seqs, staged_begin(staged, n_seqs, STAGED_CU_K));
    }
    __syncthreads();
    if (p.seq_units) {
        int* counts = staged_begin(staged, n_seqs, STAGED_COUNTS);
        int* order = staged_begin(staged, n_seqs, STAGED_ORDER);
        int* blocks = staged_begin(staged, n_seqs, STAGED_BLOCKS);
        int* odd = staged_begin(staged, n_seqs, STAGED_ODD);
        count_sequence_blocks(staged_begin(staged, n_seqs, STAGED_CU_Q), n_seqs, counts);
        __syncthreads();
        order_sequences(counts, n_seqs, (tune & TUNE_SEQ_LONGEST) != 0, order);
        __syncthreads();
        scan_sequence_blocks(counts, order, n_seqs, blocks, odd);
        __syncthreads();
        p.blocks_per_head = blocks[n_seqs];
        p.odd_per_head = odd[n_seqs];
        p.pairs_per_head = (p.blocks_per_head - p.odd_per_head) / 2;
    }
    const int work = p.seq_units ? q_heads * p.blocks_per_head : batch * q_heads * p.m_blocks;
    p.work = work;

    // Each thread keeps only its role's copies of these.
    pl::cursor<STAGES> kc, vc;
    pl::cursor<QBUF> qc;

    // Q of unit u into the next Q slot, once the unit that last used the slot has released it.
    auto load_q = [&](const unit& u, int w) {
        calico::mbarrier& qb = bars.q.acquire(qc, Q_BYTES);
        unsigned char* qd = smem + Q_OFFSET + qc.slot() * Q_BYTES;
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) calico::tma::load_4d(qd + c * BM * 128, map_q, c * CHUNK, u.m0, u.h, u.b, qb);
        qc.advance();
        stamp(w, 0, 6);
    };
    const bool q_thread = (p.tune & TUNE_Q_THREAD) != 0;

    // The K/V producer (and, without TUNE_Q_THREAD, Q too).
    auto produce = [&](int w) {
        const unit u = unit_at(p, staged, w);
        if (u.n_hi <= u.n_lo) return;
        if (kc.count == 0) {
            calico::tma::prefetch(map_k);
            calico::tma::prefetch(map_v);
            if (!q_thread) calico::tma::prefetch(map_q);
        }
        const int hk = u.h / p.group;
        auto load_kv = [&](int n) {
            calico::mbarrier& kb = bars.k.acquire(kc, KV_BYTES);
            unsigned char* kd = smem + K_OFFSET + kc.slot() * KV_BYTES;
#pragma unroll
            for (int c = 0; c < CHUNKS; ++c) calico::tma::load_4d(kd + c * BN * 128, map_k, c * CHUNK, n * BN, hk, u.b, kb);
            kc.advance();
            calico::mbarrier& vb = bars.v.acquire(vc, KV_BYTES);
            unsigned char* vd = smem + V_OFFSET + vc.slot() * KV_BYTES;
#pragma unroll
            for (int c = 0; c < CHUNKS; ++c) calico::tma::load_4d(vd + c * BN * 128, map_v, c * CHUNK, n * BN, hk, u.b, vb);
            vc.advance();
        };
        // Without the Q thread: the Q slot frees only when the previous unit's last S is done;
        // the first K/V block need not wait for that (TUNE_KV_FIRST).
        int n = u.n_hi - 1;
        if (q_thread || (p.tune & TUNE_KV_FIRST)) {
            load_kv(n--);
            stamp(w, 0, 7);
        }
        if (!q_thread) {
            load_q(u, w);
            if (!(p.tune & TUNE_KV_FIRST)) {
                load_kv(n--);
                stamp(w, 0, 7);
            }
        }
        for (; n >= u.n_lo; --n) load_kv(n);
    };

    // TUNE_Q_THREAD: lane 0 of the producer warpgroup's warp 1 loads every unit's Q, each as
    // soon as its slot is free. With two Q slots that is while the previous unit runs, a whole
    // unit ahead; from the K/V thread it went out only after the unit's first K/V copy, about
    // a block ahead, and landed late (the trace: 0.8 us of Q wait per unit, the copies of
    // every CTA's Q reaching HBM at once).
    auto produce_q = [&](int w) {
        if (!q_thread || threadIdx.x % 32 != 0) return;
        const unit u = unit_at(p, staged, w);
        if (u.n_hi <= u.n_lo) return;
        if (qc.count == 0) calico::tma::prefetch(map_q);
        load_q(u, w);
    };

    // Ping-pong (SCHED 2): the consumers take turns issuing their GEMMs in the round 0, 1,
    // .., CONSUMERS - 1, 0, ..; each turn ends with an arrival on the next consumer's named
    // barrier, so one's softmax runs under the others' MMAs. Every consumer of a unit takes
    // the same number of turns, so the round never skips anyone. The last consumer opens with
    // an arrival that lets consumer 0 take the first turn; consumer 0 ends with one wait that
    // takes the last consumer's last arrival.
    auto take_turn = [&](int consumer) {
        if constexpr (PINGPONG) calico::named_barrier_sync(TURN_BARRIER + consumer, 2 * calico::WARPGROUP_THREADS);
    };
    auto pass_turn = [&](int consumer) {
        const int next = consumer + 1 == CONSUMERS ? 0 : consumer + 1;
        if constexpr (PINGPONG) calico::named_barrier_arrive(TURN_BARRIER + next, 2 * calico::WARPGROUP_THREADS);
    };

    // TUNE_DECODE_AHEAD: the consumer's next unit, decoded (unit_at: six integer divisions,
    // ~400 instructions) while it waits for a turn in this one, not between the two units where
    // the tensor cores wait for it (the trace: ~0.8 us from a unit's entry to its first S).
    unit ahead;
    int ahead_w = -1;
    // TMA_O: the Q slot whose O this thread (thread 0 of a consumer warpgroup) stored with TMA
    // and has not handed back yet, or -1.
    int o_staged_slot = -1;
    // Hands that slot back (the consumer's WARPGROUP_WARPS arrivals at once) once the store
    // has read it.
    auto release_staged_o = [&]() {
        if constexpr (TMA_O) {
            if (o_staged_slot >= 0) {
                calico::tma::store_wait_read<0>();
                bars.q.release_slot(o_staged_slot, calico::WARPGROUP_WARPS);
                o_staged_slot = -1;
            }
        }
    };
    auto consume = [&](int consumer, int w) {
        const bool tracer = TRACE && threadIdx.x % calico::WARPGROUP_THREADS == 0;
        if (tracer) stamp(w, consumer, 0);
        const unit u = ahead_w == w ? ahead : unit_at(p, staged, w);
        const int warp = calico::warpgroup_warp();
        const int lane = threadIdx.x % 32;
        const int g = lane / 4;
        const int t = lane % 4;
        const int wg_row0 = u.m0 + consumer * 64;
        // This thread's two rows and the keys each sees.
        long long rows[2];
        rows[0] = wg_row0 + 16 * warp + g;
        rows[1] = rows[0] + 8;
        // The row of this thread's row h (rows[h]) inside the unit's BM-row tiles (Q, O staging).
        auto tile_row = [&](int h) { return consumer * 64 + 16 * warp + g + 8 * h; };
        int lo[2], hi[2];
        seq_cache seq = unit_seq_cache(p, staged, u);  // packed sequences: found once for most units
        int wg_lo_max, wg_hi_min, unused;
        row_keys(p, wg_row0, unused, wg_hi_min, seq);
        row_keys(p, rows[0], lo[0], hi[0], seq);
        row_keys(p, rows[1], lo[1], hi[1], seq);
        // A key block needs no mask when every row of the warpgroup sees all of it.
        row_keys(p, wg_row0 + 63, wg_lo_max, unused, seq);
        // The unit's key blocks from c_hi up are ones no row of this warpgroup sees: under a
        // causal mask a 192-row unit reaches up to a block further than its first 64 or 128
        // rows see, and a unit's last rows may lie past Nq (then c_hi = n_lo: none seen). They
        // would be computed for nothing (every score masked), so with TUNE_SKIP_UNSEEN the
        // warpgroup takes their turns and hands their slots back without an MMA. Key bounds
        // grow with the row, so the last stored row's upper bound gives c_hi. (Blocks below
        // the first row's lower bound, under a left window, are still computed: a second
        // bound kept across the key loop costs the 192-row form a spilled register there.)
        int c_hi = u.n_hi;
        if (p.tune & TUNE_SKIP_UNSEEN) {
            int last_hi = 0;
            if (wg_row0 < u.m_end) row_keys(p, min(wg_row0 + 63, u.m_end - 1), unused, last_hi, seq);
            c_hi = max(u.n_lo, min(u.n_hi, (last_hi + BN - 1) / BN));
        }

        // TMA_O: the previous unit's O store hands its Q slot back after this unit's first S
        // (below); where this unit takes no such step, here. Either way before the key loop,
        // so that no register carries the slot through it.
        if (!(SCHED != 0 && u.n_hi > u.n_lo && c_hi > u.n_lo)) release_staged_o();

        float acc[O_REGS];
#pragma unroll
        for (int i = 0; i < O_REGS; ++i) acc[i] = 0.0f;
        float m_run[2] = {ATTN_NEG_INF, ATTN_NEG_INF};
        float l_run[2] = {0.0f, 0.0f};

        const uint32_t q_base = calico::smem_addr(smem + Q_OFFSET + qc.slot() * Q_BYTES) + consumer * 64 * 128;
        const uint32_t k_base = calico::smem_addr(smem + K_OFFSET);
        const uint32_t v_base = calico::smem_addr(smem + V_OFFSET);

        // S = Q K^T on the next K slot, issued and committed, not waited for.
        auto issue_s = [&](float (&s)[S_REGS]) {
            bars.k.wait_full(kc);
            const uint32_t k_slot = k_base + kc.slot() * KV_BYTES;
            calico::wgmma::fence();
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                const uint64_t dq = calico::wgmma::desc_advance(calico::wgmma::desc_kmajor_128b(q_base), (kk / 4) * BM * 128 + (kk % 4) * 32);
                const uint64_t dk = calico::wgmma::desc_advance(calico::wgmma::desc_kmajor_128b(k_slot), (kk / 4) * BN * 128 + (kk % 4) * 32);
                calico::wgmma::mma<in_t, BN>::template ss<0>(s, dq, dk, kk > 0 ? 1 : 0);
            }
            calico::wgmma::commit_group();
        };
        // After S of block n is complete: hand its K slot (and after the unit's last block,
        // Q, unless the epilogue stages O there) back.
        auto release_k = [&](int n) {
            if (lane == 0) {
                bars.k.release(kc);
                if (!TMA_O && n == u.n_lo) bars.q.release(qc);
            }
            kc.advance();
        };
        // O += P V on the next V slot, issued and committed, not waited for.
        auto issue_pv = [&](const uint32_t (&pa)[P_STEPS][4]) {
            bars.v.wait_full(vc);
            const uint32_t v_slot = v_base + vc.slot() * KV_BYTES;
            calico::wgmma::fence_operands(acc);
            calico::wgmma::fence();
#pragma unroll
            for (int kk = 0; kk < P_STEPS; ++kk) {
                const uint64_t dv = calico::wgmma::desc_advance(calico::wgmma::desc_mnmajor_128b(v_slot, BN), kk * 16 * 128);
                calico::wgmma::mma<in_t, D>::template rs<1>(acc, pa[kk], dv, 1);
            }
            calico::wgmma::commit_group();
        };
        auto release_v = [&]() {
            if (lane == 0) bars.v.release(vc);
            vc.advance();
        };
        // A block from c_hi up: its turn passes on at once, and its slots go back once
        // filled (a release before the fill would count toward the slot's previous use).
        auto pass_block = [&](int n) {
            take_turn(consumer);
            pass_turn(consumer);
            bars.k.wait_full(kc);
            release_k(n);
            bars.v.wait_full(vc);
            release_v();
        };
        // The softmax's arithmetic after masking, written for instruction-level parallelism
        // (CALICO_ATTN_ILP): each row's max as a tree of depth log2(BN / 4) + 1 rather than a
        // chain of BN / 4, both rows' trees and shuffles side by side, the sums in four
        // partial accumulators per row. Same instructions, shorter dependency chains: the
        // consumers stall on fixed-latency dependencies, not on a saturated pipe.
        // mx[h] = the max of row h's values in v (this thread's and its quad's), both rows' trees
        // and shuffles side by side.
        auto row_max_tree = [&](const float (&v)[S_REGS], float (&mx)[2]) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float pairs[BN / 8];
#pragma unroll
                for (int j = 0; j < BN / 8; ++j) pairs[j] = fmaxf(v[4 * j + 2 * h], v[4 * j + 2 * h + 1]);
                mx[h] = tree_max<BN / 8>(pairs);
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) mx[h] = fmaxf(mx[h], calico::shfl_xor(mx[h], 1));
#pragma unroll
            for (int h = 0; h < 2; ++h) mx[h] = fmaxf(mx[h], calico::shfl_xor(mx[h], 2));
        };
        // s <- 2^(s * sc - m_use[row]) in place; sum[h] = this thread's sum of row h, kept in four
        // partial sums per row (shorter chains).
        auto exponentials = [&](float (&s)[S_REGS], const float (&m_use)[2], float (&sum)[2]) {
            float part[2][4];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
#pragma unroll
                for (int k = 0; k < 4; ++k) part[h][k] = 0.0f;
            }
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float pv = ex2(fmaf(s[4 * j + 2 * h + e], sc, -m_use[h]));
                        s[4 * j + 2 * h + e] = pv;
                        part[h][(2 * j + e) % 4] += pv;
                    }
                }
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) sum[h] = (part[h][0] + part[h][1]) + (part[h][2] + part[h][3]);
        };
        auto softmax_ilp = [&](float (&s)[S_REGS], float (&scale_o)[2]) {
            float mx[2];
            row_max_tree(s, mx);
            float m_use[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float m_new = LAZY ? lazy_max(m_run[h], mx[h] * sc) : fmaxf(m_run[h], mx[h] * sc);
                // A row with no key so far keeps m = -inf; subtract 0 so exp2 gives 0, not NaN.
                m_use[h] = m_new == ATTN_NEG_INF ? 0.0f : m_new;
                // An unmoved max gives exactly 1 (rescale_o's skip test relies on it).
                scale_o[h] = LAZY && m_new == m_run[h] ? 1.0f : ex2(m_run[h] - m_use[h]);
                m_run[h] = m_new;
            }
            float sum[2];
            exponentials(s, m_use, sum);
#pragma unroll
            for (int h = 0; h < 2; ++h) l_run[h] = l_run[h] * scale_o[h] + sum[h];
        };
        // Scores of key block n that this thread's rows do not see to -inf (a branch over
        // the whole block when every row of the warpgroup sees all of it).
        auto mask_block = [&](float (&s)[S_REGS], int n) {
            const int n0 = n * BN;
            const bool need_mask = n0 + BN > p.k_len || n0 < wg_lo_max || n0 + BN > wg_hi_min;
            if (need_mask) {
#pragma unroll
                for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const int col = n0 + 8 * j + 2 * t + e;
                            if (col < lo[h] || col >= hi[h]) s[4 * j + 2 * h + e] = ATTN_NEG_INF;
                        }
                    }
                }
            }
        };
        // Scores of key block n (in s) to probabilities, in base 2: x = v * sc with v = s (or
        // tanh(s * score_scale) under a soft-cap) and sc > 0 (the host guarantees it), so the
        // row max is taken on v and the scale folds into the exponent's FMA. Updates the
        // running max and sum; scale_o is the factor the O accumulator needs.
        auto softmax = [&](float (&s)[S_REGS], int n, float (&scale_o)[2]) {
            if constexpr (SOFTCAP) {
#pragma unroll
                for (int i = 0; i < S_REGS; ++i) s[i] = tanhf(s[i] * score_scale);
            }
            mask_block(s, n);
            if constexpr (ILP) {
                softmax_ilp(s, scale_o);
                return;
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float mx = ATTN_NEG_INF;
#pragma unroll
                for (int j = 0; j < BN / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
                mx = fmaxf(mx, calico::shfl_xor(mx, 1));
                mx = fmaxf(mx, calico::shfl_xor(mx, 2));
                const float m_new = LAZY ? lazy_max(m_run[h], mx * sc) : fmaxf(m_run[h], mx * sc);
                // A row with no key so far keeps m = -inf; subtract 0 so exp2 gives 0, not NaN.
                const float m_use = m_new == ATTN_NEG_INF ? 0.0f : m_new;
                scale_o[h] = LAZY && m_new == m_run[h] ? 1.0f : ex2(m_run[h] - m_use);
                m_run[h] = m_new;
                float sum = 0.0f;
#pragma unroll
                for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float pv = ex2(fmaf(s[4 * j + 2 * h + e], sc, -m_use));
                        s[4 * j + 2 * h + e] = pv;
                        sum += pv;
                    }
                }
                l_run[h] = l_run[h] * scale_o[h] + sum;
            }
        };
        // Scores of the current key block recomputed from the Q and K slots in shared memory:
        // this thread's 2 x BN / 4 by scalar dot products, two dims at a time. The stale-max
        // softmax's way back when its exponentials overflowed (a block's scores 128 or more
        // base-2 units above the running max: the tensor cores' S is gone by then). Slow, and
        // only for such inputs; the key loop keeps to the K and Q slots it already holds.
        auto recompute_scores = [&](float (&s)[S_REGS]) {
            using q_tile = calico::st<in_t, BM, D>;
            using k_tile = calico::st<in_t, BN, D>;
            using pair_t = typename calico::packed<in_t>::type;
            const unsigned char* qs = smem + Q_OFFSET + qc.slot() * Q_BYTES;
            const unsigned char* ks = smem + K_OFFSET + kc.slot() * KV_BYTES;
#pragma unroll
            for (int i = 0; i < S_REGS; ++i) s[i] = 0.0f;
#pragma unroll 1
            for (int d = 0; d < D; d += 2) {
                float2 q[2];
#pragma unroll
                for (int h = 0; h < 2; ++h) q[h] = calico::unpack(*reinterpret_cast<const pair_t*>(qs + q_tile::offset(tile_row(h), d)));
#pragma unroll
                for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float2 k = calico::unpack(*reinterpret_cast<const pair_t*>(ks + k_tile::offset(8 * j + 2 * t + e, d)));
#pragma unroll
                        for (int h = 0; h < 2; ++h) s[4 * j + 2 * h + e] = fmaf(q[h].y, k.y, fmaf(q[h].x, k.x, s[4 * j + 2 * h + e]));
                    }
                }
            }
        };
        // The stale-max softmax (CALICO_ATTN_STALE) for a key block after the unit's first:
        // lazy maxima leave the running max in place on almost every block, so the block's
        // exponentials are taken against it at once, with no row max (a tree of BN / 4 - 1
        // FMNMX and two shuffles per row, a fifth of the softmax's instructions). Where a
        // thread's sum of a row's probabilities stays at or below 2^LAZY_SLACK, none of them
        // passed it, so the lazy form would have kept that max too: the same probabilities,
        // sums and O. Otherwise (rare: a block's scores rising past the running max by more
        // than LAZY_SLACK) the block's max is read off the probabilities and they are scaled
        // down to it, or, where they overflowed, the scores are recomputed and the lazy form
        // runs on them. A warp with a row that has no max yet takes the lazy form.
        auto softmax_stale = [&](float (&s)[S_REGS], int n, float (&scale_o)[2]) {
            if (!__any_sync(0xffffffffu, m_run[0] == ATTN_NEG_INF || m_run[1] == ATTN_NEG_INF)) {
                mask_block(s, n);
                const float m_use[2] = {m_run[0], m_run[1]};  // finite here
                float sum[2];
                exponentials(s, m_use, sum);
                constexpr float SUM_BOUND = 256.0f;  // 2^LAZY_SLACK
                static_assert(LAZY_SLACK == 8.0f, "SUM_BOUND is 2^LAZY_SLACK");
                // !(x <= bound) also catches an overflowed (inf) or NaN sum.
                if (!__any_sync(0xffffffffu, !(sum[0] <= SUM_BOUND) || !(sum[1] <= SUM_BOUND))) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        scale_o[h] = 1.0f;
                        l_run[h] += sum[h];
                    }
                    return;
                }
                // The block's row maxima, from the probabilities (2^(x - m_use), monotonic).
                float mp[2];
                row_max_tree(s, mp);
                const float pos_inf = -ATTN_NEG_INF;
                if (!__any_sync(0xffffffffu, !(mp[0] < pos_inf) || !(mp[1] < pos_inf))) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        // The block's max in base-2 units (-inf where the row sees none of it).
                        const float m_blk = mp[h] > 0.0f ? m_use[h] + __log2f(mp[h]) : ATTN_NEG_INF;
                        const float m_new = lazy_max(m_run[h], m_blk);
                        const float down = m_new == m_run[h] ? 1.0f : ex2(m_use[h] - m_new);
#pragma unroll
                        for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
                            for (int e = 0; e < 2; ++e) s[4 * j + 2 * h + e] *= down;
                        }
                        scale_o[h] = m_new == m_run[h] ? 1.0f : ex2(m_run[h] - m_new);
                        l_run[h] = l_run[h] * scale_o[h] + sum[h] * down;
                        m_run[h] = m_new;
                    }
                    return;
                }
                recompute_scores(s);
            }
            softmax(s, n, scale_o);
        };
        // The softmax of a key block after the unit's first.
        auto softmax_next = [&](float (&s)[S_REGS], int n, float (&scale_o)[2]) {
            if constexpr (STALE) {
                softmax_stale(s, n, scale_o);
            } else {
                softmax(s, n, scale_o);
            }
        };
        auto rescale_o = [&](const float (&scale_o)[2]) {
            // Lazy maxima leave every row's factor at exactly 1 on most blocks: skip the
            // multiplies when no row of the warp moved (a warp-uniform branch).
            if (LAZY && !__any_sync(0xffffffffu, scale_o[0] != 1.0f || scale_o[1] != 1.0f)) return;
#pragma unroll
            for (int j = 0; j < D / 8; ++j) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    acc[4 * j + 2 * h] *= scale_o[h];
                    acc[4 * j + 2 * h + 1] *= scale_o[h];
                }
            }
        };
        // P as the A fragments of O += P V: k-step kk covers keys 16kk..16kk+15.
        auto pack_p = [&](const float (&s)[S_REGS], uint32_t (&pa)[P_STEPS][4]) {
#pragma unroll
            for (int kk = 0; kk < P_STEPS; ++kk) {
#pragma unroll
                for (int r = 0; r < 4; ++r) pa[kk][r] = calico::pack_word<in_t>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
            }
        };

        if (u.n_hi > u.n_lo) {
            bars.q.wait_full(qc);
            if (tracer) stamp(w, consumer, 1);
            float s[S_REGS];
            float scale_o[2];
            uint32_t pa[P_STEPS][4];
            if constexpr (SCHED == 0) {
                // Serial: each block's S, softmax and P V in turn (the tensor pipe idles
                // during this warpgroup's softmax unless the other warpgroup fills it).
                for (int n = u.n_hi - 1; n >= u.n_lo; --n) {
                    if (n >= c_hi) {
                        pass_block(n);
                        continue;
                    }
                    issue_s(s);
                    calico::wgmma::wait_group<0>();
                    calico::wgmma::fence_operands(s);
                    release_k(n);
                    softmax(s, n, scale_o);
                    rescale_o(scale_o);
                    pack_p(s, pa);
                    issue_pv(pa);
                    calico::wgmma::wait_group<0>();
                    calico::wgmma::fence_operands(acc);
                    release_v();
                }
            } else {
                // Overlapped: S of block n is issued before P V of block n + 1, and the
                // softmax of block n runs while that P V is on the tensor cores.
                int n = u.n_hi - 1;
                for (; n >= c_hi; --n) pass_block(n);
                if (c_hi > u.n_lo) {
                    take_turn(consumer);
                    if (tracer) stamp(w, consumer, 2);
                    issue_s(s);
                    pass_turn(consumer);
                    calico::wgmma::wait_group<0>();
                    calico::wgmma::fence_operands(s);
                    if (tracer) stamp(w, consumer, 3);
                    release_k(n);
                    softmax(s, n, scale_o);
                    pack_p(s, pa);
                    // No wgmma is in flight here (ptxas serialises them across branches otherwise),
                    // and the next step waits for the partner's turn anyway.
                    release_staged_o();  // the previous unit's O store has long read its slot
                    if (p.tune & TUNE_DECODE_AHEAD) {
                        const int next = w + (int)gridDim.x;
                        if (next < work) {
                            ahead = unit_at(p, staged, next);
                            ahead_w = next;
                        }
                    }
                    for (--n; n >= u.n_lo; --n) {
                        take_turn(consumer);
                        issue_s(s);
                        rescale_o(scale_o);
                        issue_pv(pa);
                        pass_turn(consumer);
                        calico::wgmma::wait_group<1>();
                        calico::wgmma::fence_operands(s);
                        softmax_next(s, n, scale_o);
                        // Pins the softmax before the wait: the compiler would otherwise sink it
                        // next to its first use, after the P V it is meant to hide under.
                        calico::wgmma::fence_operands(s);
                        fence_values(l_run);
                        fence_values(scale_o);
                        release_k(n);
                        calico::wgmma::wait_group<0>();
                        calico::wgmma::fence_operands(acc);
                        fence_words(pa);  // the P V just finished read pa until here
                        release_v();
                        pack_p(s, pa);
                    }
                    rescale_o(scale_o);
                    issue_pv(pa);
                    calico::wgmma::wait_group<0>();
                    calico::wgmma::fence_operands(acc);
                    fence_words(pa);
                    release_v();
                }
            }
            if (tracer) stamp(w, consumer, 4);
            if (tracer) stamp(w, consumer, TRACE_CLOCK_LOOP_DONE);
            qc.advance();  // the slot went back with the last K release
        }

        // Epilogue: O = acc / l, LSE = m ln2 + ln l; rows that saw nothing get 0 and -inf.
        // Every lane runs the shuffles; rows >= Nq only skip their stores. With TMA_O (and a
        // unit that loaded Q) O goes through this consumer's rows of the Q slot, the one before
        // the cursor's (it moved on after the unit's last S).
        const bool staged_o = TMA_O && u.n_hi > u.n_lo;
        const int staged_slot = (qc.slot() + QBUF - 1) % QBUF;
        unsigned char* o_stage = smem + Q_OFFSET + staged_slot * Q_BYTES;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float l = l_run[h];
            l += calico::shfl_xor(l, 1);
            l += calico::shfl_xor(l, 2);
            const long long row = rows[h];
            const bool stored = row_stored(p, u, row);
            const bool seen = l > 0.0f;
            const bool fast = (p.tune & TUNE_FAST_EPILOGUE) != 0;
            // l lies in [1, Nkv * 2^LAZY_SLACK]: far from where the approximations lose range.
            const float inv = seen ? (fast ? __fdividef(1.0f, l) : 1.0f / l) : 0.0f;
            float2 v[D / 8];  // this row's columns 8j + 2t, +1
#pragma unroll
            for (int j = 0; j < D / 8; ++j) v[j] = make_float2(acc[4 * j + 2 * h] * inv, acc[4 * j + 2 * h + 1] * inv);
            in_t* o_row = o + u.b * o_sb + u.h * o_sh + row * o_sn;
            if (staged_o) {
                using o_tile = calico::st<in_t, BM, D>;
#pragma unroll
                for (int j = 0; j < D / 8; ++j) {
                    *reinterpret_cast<uint32_t*>(o_stage + o_tile::offset(tile_row(h), 8 * j + 2 * t)) =
                        calico::pack_word<in_t>(v[j].x, v[j].y);
                }
            } else if constexpr (PADDED) {
                calico::store_row_upto(o_row, v, t, o_store, stored, head_dim);
            } else {
                calico::store_row(o_row, v, t, o_store, stored);
            }
            if (t == 0 && stored) {
                lse[((long long)u.b * p.q_heads + u.h) * p.q_len + row] = seen ? m_run[h] * LN2 + (fast ? __logf(l) : logf(l)) : ATTN_NEG_INF;
            }
        }
        if (tracer) stamp(w, consumer, TRACE_CLOCK_LOOP_DONE + 1);
        if (staged_o) {
            calico::fence_proxy_async();
            calico::named_barrier_sync(STAGING_BARRIER + consumer, calico::WARPGROUP_THREADS);
            if (threadIdx.x % calico::WARPGROUP_THREADS == 0) {
                // Boxes wholly past Nq or the head dim are not issued (nothing to store).
                if (wg_row0 < p.q_len) {
#pragma unroll
                    for (int c = 0; c < CHUNKS; ++c) {
                        if (c * CHUNK < head_dim) {
                            calico::tma::store_4d(map_o, o_stage + c * BM * 128 + consumer * 64 * 128, c * CHUNK, wg_row0, u.h, u.b);
                        }
                    }
                }
                calico::tma::store_commit();
                o_staged_slot = staged_slot;
            }
        }
        if (tracer) stamp(w, consumer, TRACE_CLOCK_LOOP_DONE + 2);
        if (tracer) stamp(w, consumer, 5);
        if (tracer) stamp(w, consumer, TRACE_CLOCK_LOOP_DONE + 3);
    };

    auto consume_all = [&](int consumer, int w) {
        if (PINGPONG && consumer == CONSUMERS - 1 && w == (int)blockIdx.x) pass_turn(consumer);
        consume(consumer, w);
        // The last unit's O store must have read shared memory before the CTA exits.
        if (w + (int)gridDim.x >= work) release_staged_o();
        if (PINGPONG && consumer == 0 && w + (int)gridDim.x >= work) take_turn(consumer);
    };

    pl::warp_specialised<PRODUCER_REGS, CONSUMER_REGS>(work, produce, consume_all, produce_q);
}
