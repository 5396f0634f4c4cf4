//! Large copies: split across the threads and written past the caches.
//!
//! A plain store to a line that is not cached first reads the line from memory (to own it),
//! so a copy whose destination misses the caches moves three bytes for every two it must.
//! Streaming (non-temporal) stores skip that read: on the 2-core Xeon development machine a
//! 256 MiB copy moved 27-37 GB/s (read + written) with streaming stores on two threads, where
//! `memcpy` moved 20-25 on one thread or two (docs/perf-log.md, session 32).
//!
//! Streaming stores bypass the caches, so whoever reads the destination next reads it from
//! memory: they pay only where it could not have stayed cached anyway, which [`streams`]
//! decides from the size of the last-level cache. (The row ops were tried through a staged
//! row streamed out, and gained nothing: on that machine they are bound by their arithmetic.)

use std::sync::OnceLock;

/// Copies of at least this many bytes are streamed: half the last-level cache (source and
/// destination together then exceed it), or 16 MiB where the size is unknown.
fn threshold_bytes() -> usize {
    static THRESHOLD: OnceLock<usize> = OnceLock::new();
    *THRESHOLD.get_or_init(|| {
        crate::device::last_level_cache_bytes()
            .filter(|&b| b > 0)
            .map_or(16 << 20, |b| b / 2)
    })
}

/// Whether a copy of `output_bytes` should stream them.
pub(crate) fn streams(output_bytes: usize) -> bool {
    cfg!(target_arch = "x86_64") && output_bytes >= threshold_bytes()
}

/// Copies `src` into `dst` (same length) with streaming stores where the CPU has them (x86-64:
/// SSE2's 16-byte `movntdq`, part of the base architecture), a plain copy elsewhere. The
/// stores are fenced before it returns, so they are ordered before whatever the caller does
/// next (a rayon join that hands the bytes to another thread, say).
fn copy(dst: &mut [u8], src: &[u8]) {
    debug_assert_eq!(dst.len(), src.len(), "stream::copy of unequal lengths");
    let n = dst.len().min(src.len());
    let (dst, src) = (&mut dst[..n], &src[..n]);
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        // Plain copies up to the first 16-byte boundary of `dst` and after the last one.
        let head = dst.as_ptr().align_offset(16).min(dst.len());
        let body = (dst.len() - head) / 16 * 16;
        let (d_head, rest) = dst.split_at_mut(head);
        let (d_body, d_tail) = rest.split_at_mut(body);
        let (s_head, rest) = src.split_at(head);
        let (s_body, s_tail) = rest.split_at(body);
        d_head.copy_from_slice(s_head);
        d_tail.copy_from_slice(s_tail);
        for (d, s) in d_body.chunks_exact_mut(16).zip(s_body.chunks_exact(16)) {
            // SAFETY: `s` and `d` are 16 bytes each, within their slices; `d` starts on a
            // 16-byte boundary (the head moved it there), as `_mm_stream_si128` requires, and
            // the unaligned load has no alignment requirement. Both are SSE2, which every
            // x86-64 CPU has.
            unsafe {
                let v = _mm_loadu_si128(s.as_ptr().cast::<__m128i>());
                _mm_stream_si128(d.as_mut_ptr().cast::<__m128i>(), v);
            }
        }
        // SAFETY: SSE's store fence has no preconditions; it orders the streaming stores above
        // before any later store or release by this thread.
        unsafe { _mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

/// Copies of at least this many bytes are split across the rayon threads.
const PARALLEL_COPY_BYTES: usize = 1 << 20;

/// `dst.copy_from_slice(src)` for any size: split across the rayon threads from 1 MiB, and
/// through streaming stores where [`streams`] says so.
pub(crate) fn copy_large(dst: &mut [u8], src: &[u8]) {
    use rayon::prelude::*;
    let stream = streams(dst.len());
    if dst.len() < PARALLEL_COPY_BYTES {
        dst.copy_from_slice(src);
        return;
    }
    dst.par_chunks_mut(PARALLEL_COPY_BYTES)
        .zip(src.par_chunks(PARALLEL_COPY_BYTES))
        .for_each(|(d, s)| {
            if stream {
                copy(d, s);
            } else {
                d.copy_from_slice(s);
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_at_every_alignment_and_length() {
        let src: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
        for offset in 0..17 {
            for len in [0usize, 1, 15, 16, 17, 31, 32, 33, 100, 283 - offset] {
                let mut buf = vec![0u8; 300];
                copy(&mut buf[offset..offset + len], &src[..len]);
                assert_eq!(&buf[offset..offset + len], &src[..len], "{offset} {len}");
                assert!(
                    buf[..offset].iter().all(|&b| b == 0),
                    "before {offset} {len}"
                );
                assert!(
                    buf[offset + len..].iter().all(|&b| b == 0),
                    "after {offset} {len}"
                );
            }
        }
    }

    #[test]
    fn large_copies_split_across_threads_arrive_whole() {
        // Past both thresholds (parallel and streaming), with an odd length and offset.
        let len = (threshold_bytes() + 3 * PARALLEL_COPY_BYTES / 2) | 1;
        let src: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mut dst = vec![0u8; len + 3];
        copy_large(&mut dst[3..], &src);
        assert!(dst[..3].iter().all(|&b| b == 0));
        assert!(dst[3..] == src[..], "the copy differs");
        let mut small = vec![0u8; 1000];
        copy_large(&mut small, &src[..1000]);
        assert_eq!(small, src[..1000]);
    }

    #[test]
    fn only_outputs_past_the_cache_stream() {
        assert!(!streams(64 << 10));
        assert_eq!(streams(usize::MAX), cfg!(target_arch = "x86_64"));
    }
}
