//! The tensor-core decode kernel (`kernels/device/attention/decode_mma.cu`, NVIDIA sm_80+):
//! its compiled forms, where it runs, and how many KV splits a call gets.

use calico_core::{
    Arch, AsyncCopy, DType, HeaderSet, KernelSource, KernelVariant, MmaKind, Result, Vendor,
};

/// Tokens per warp tile (split lengths are multiples of it; pages must be too).
pub(crate) const TILE_TOKENS: usize = 16;
/// Query rows per block: one MMA row tile.
pub(crate) const BLOCK_ROWS: usize = 16;
/// Most blocks of this kernel one SM holds (registers allow about this many).
const MAX_BLOCKS_PER_SM: usize = 4;
/// Tokens a block is worth beyond its split's length (pipeline fill, the merge), in the
/// choice of the split count.
const BLOCK_OVERHEAD_TOKENS: usize = 32;

const SOURCE: &str = include_str!("../../../device/attention/decode_mma.cu");

/// One compiled form of the tensor-core decode kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct DecodeMmaVariant {
    pub dtype: DType,
    /// The kernel's width: 64, 128 or 256.
    pub head_dim: usize,
    /// The problem's head dim, at most `head_dim` (HEAD_DIM_USED: the pieces past it are
    /// zero-filled, only its columns of O written).
    pub used_dim: usize,
    pub paged: bool,
    pub warps: usize,
    /// Tiles in each warp's cp.async ring.
    pub stages: usize,
    /// The last block of each split group merges the splits (no combine launch).
    pub fused: bool,
    /// The first copies go out sooner (key ranges by warp reductions; paged: each warp's first
    /// pages loaded beside the sequence length).
    pub early: bool,
    /// Tiles past the copied one that each warp asks L2 for (0: none).
    pub l2_ahead: usize,
    /// Each warp's first tiles are copied before the sequence length is known (needs
    /// `early`).
    pub spec: bool,
    /// Splits the fused merge loads at once (0: the merge's default, 16 at head_dim 128).
    pub merge_batch: usize,
    /// Each block stamps its milestones (a diagnostic: `decode_trace`).
    pub trace: bool,
    /// The fused merge's fences by one thread after a barrier (a grid barrier's pattern)
    /// instead of by every thread.
    pub lean_count: bool,
    /// The fused merge reads each row's LSEs once and requests the next batch of partials
    /// before summing the current one (`decode_merge_row_early`).
    pub merge_early: bool,
}

impl DecodeMmaVariant {
    /// Dynamic shared memory: Q (16 rows), each warp's K and V rings, 1 KB to align them.
    pub(crate) fn smem_bytes(&self) -> usize {
        let tile = TILE_TOKENS * self.head_dim * 2;
        1024 + BLOCK_ROWS * self.head_dim * 2 + self.warps * self.stages * 2 * tile
    }

    /// Static shared memory: the warps' max and sum per row (and EARLY's per-row tables).
    fn static_smem(&self) -> usize {
        if self.early {
            1536
        } else {
            512
        }
    }

    pub(crate) fn threads(&self) -> usize {
        self.warps * 32
    }

    /// Blocks one SM holds: shared memory (the opt-in per-block limit plus the 1 KB the
    /// hardware reserves per block is the SM's pool on sm_80 and sm_90) and registers.
    pub(crate) fn blocks_per_sm(&self, arch: &Arch) -> usize {
        let pool = arch.shared_mem_per_block + 1024;
        (pool / (self.smem_bytes() + 1024 + self.static_smem())).clamp(1, MAX_BLOCKS_PER_SM)
    }

    /// Blocks the whole GPU holds at once: one wave.
    pub(crate) fn slots(&self, arch: &Arch) -> usize {
        arch.compute_units.max(1) as usize * self.blocks_per_sm(arch)
    }

    /// The variant for `head_dim` with at most `stages` ring slots, fewer if shared memory is
    /// short; None when not even two fit.
    pub(crate) fn fitting(
        arch: &Arch,
        dtype: DType,
        head_dim: usize,
        paged: bool,
        warps: usize,
        stages: usize,
    ) -> Option<DecodeMmaVariant> {
        (2..=stages.max(2)).rev().find_map(|stages| {
            let v = DecodeMmaVariant {
                dtype,
                head_dim,
                used_dim: head_dim,
                paged,
                warps,
                stages,
                fused: false,
                early: false,
                l2_ahead: 0,
                spec: false,
                merge_batch: 0,
                trace: false,
                lean_count: false,
                merge_early: false,
            };
            // With EARLY's tables, so that the choice holds for either form.
            let v_early = DecodeMmaVariant { early: true, ..v };
            (v.smem_bytes() + v_early.static_smem() <= arch.shared_mem_per_block).then_some(v)
        })
    }
}

impl KernelVariant for DecodeMmaVariant {
    fn source(&self, vendor: HeaderSet) -> Result<KernelSource> {
        let defines = [
            ("ELEM", self.dtype.device_type().to_string()),
            ("HEAD_DIM", self.head_dim.to_string()),
            ("HEAD_DIM_USED", self.used_dim.to_string()),
            ("PAGED", u8::from(self.paged).to_string()),
            ("WARPS", self.warps.to_string()),
            ("STAGES", self.stages.to_string()),
            ("FUSE", u8::from(self.fused).to_string()),
            ("EARLY", u8::from(self.early).to_string()),
            ("L2_AHEAD", self.l2_ahead.to_string()),
            ("SPEC", u8::from(self.spec && self.early).to_string()),
            ("MERGE_BATCH", self.merge_batch.to_string()),
            ("TRACE", u8::from(self.trace).to_string()),
            ("LEAN_COUNT", u8::from(self.lean_count).to_string()),
            ("MERGE_EARLY", u8::from(self.merge_early).to_string()),
        ];
        let sets = [
            vendor,
            calico_core::device_headers(),
            super::decode::DECODE_HEADERS,
        ];
        KernelSource::assemble("calico_attention_decode_mma", SOURCE, &sets, &defines)
    }
}

/// The kernel runs here: NVIDIA with mma.sync and cp.async, and (paged) pages that hold whole
/// tiles.
pub(crate) fn runs_here(arch: &Arch, dtype: DType, page_size: Option<usize>) -> bool {
    arch.vendor == Vendor::Nvidia
        && arch.has_mma(MmaKind::MmaSync, dtype)
        && arch.has_async_copy(AsyncCopy::CpAsync)
        && page_size.is_none_or(|p| p % TILE_TOKENS == 0)
}

/// KV splits for `blocks` blocks per split (sequences x KV heads x row groups) over caches of
/// `capacity` tokens, when `slots` blocks run at once: the count whose waves of blocks finish
/// first, each block costing its split's tokens plus a fixed overhead. Candidates fill 1 to 4
/// whole waves (batch 1, long contexts: about one block per slot; large batches: no split);
/// no split is shorter than `min_split` tokens. Returns (splits, tokens per split).
pub(crate) fn choose_splits(
    blocks: usize,
    slots: usize,
    capacity: usize,
    min_split: usize,
    max_splits: usize,
) -> (usize, usize) {
    let (blocks, slots) = (blocks.max(1), slots.max(1));
    let longest = capacity
        .div_ceil(min_split.max(TILE_TOKENS))
        .clamp(1, max_splits);
    // Saturating: a comparison of costs, whose sizes only views that repeat elements (a
    // broadcast cache) take near usize.
    let cost = |splits: usize| -> usize {
        let tokens = split_tokens(capacity, splits);
        blocks
            .saturating_mul(splits)
            .div_ceil(slots)
            .saturating_mul(tokens.saturating_add(BLOCK_OVERHEAD_TOKENS))
    };
    let mut best = 1;
    for waves in 1..=4 {
        let splits = (waves * slots / blocks).clamp(1, longest);
        if cost(splits) < cost(best) {
            best = splits;
        }
    }
    let tokens = split_tokens(capacity, best);
    (capacity.div_ceil(tokens).max(1), tokens)
}

/// Tokens per split (a multiple of the tile) for about `splits` splits.
pub(crate) fn split_tokens(capacity: usize, splits: usize) -> usize {
    (capacity.div_ceil(splits.max(1)).div_ceil(TILE_TOKENS)).max(1) * TILE_TOKENS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_fill_the_gpu_at_batch_1_and_vanish_at_large_batches() {
        // H100 at head_dim 128, 3 stages: 2 blocks per SM, 264 slots; 8 KV heads.
        let h100 = Arch::for_target("sm_90a").unwrap();
        let v = DecodeMmaVariant::fitting(&h100, DType::BF16, 128, true, 4, 3).unwrap();
        assert_eq!(v.blocks_per_sm(&h100), 2);
        let slots = 132 * 2;
        // 256-token splits: 32 x 8 blocks in the 264 slots.
        assert_eq!(choose_splits(8, slots, 8192, 128, 1024), (32, 256));
        assert_eq!(choose_splits(8, slots, 131072, 128, 1024), (33, 3984));
        assert_eq!(choose_splits(16 * 8, slots, 8192, 128, 1024), (2, 4096));
        assert_eq!(choose_splits(64 * 8, slots, 8192, 128, 1024), (1, 8192));
        // Short caches: no split below min_split tokens.
        assert_eq!(choose_splits(8, slots, 1024, 128, 1024), (8, 128));
        assert_eq!(choose_splits(8, slots, 1, 128, 1024), (1, 16));
        assert_eq!(choose_splits(8, slots, 0, 128, 1024).0, 1);
    }

    #[test]
    fn shared_memory_limits_the_stages() {
        let a100 = Arch::for_target("sm_80").unwrap();
        let v = DecodeMmaVariant::fitting(&a100, DType::F16, 256, false, 4, 4).unwrap();
        assert!(v.stages >= 2 && v.smem_bytes() + 512 <= a100.shared_mem_per_block);
        let small = Arch::for_target("sm_75").unwrap();
        assert!(!runs_here(&small, DType::BF16, None));
        let h100 = Arch::for_target("sm_90a").unwrap();
        assert!(runs_here(&h100, DType::BF16, Some(48)));
        assert!(!runs_here(&h100, DType::BF16, Some(40)));
    }
}
