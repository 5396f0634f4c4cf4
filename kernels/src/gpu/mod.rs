//! Helpers for launching Calico's portable kernels on any GPU backend.

pub(crate) mod cdna_rows;
pub(crate) mod rows;

use calico_core::{HeaderSet, KernelSource, Result};

/// Assembles an op's source against a vendor's headers and the shared vocabulary.
pub(crate) fn assemble(
    vendor: HeaderSet,
    entry: &str,
    source: &str,
    defines: &[(&str, String)],
) -> Result<KernelSource> {
    let sets: [HeaderSet; 2] = [vendor, calico_core::device_headers()];
    KernelSource::assemble(entry, source, &sets, defines)
}

/// The largest vector width (elements, a power of two, at most 16 bytes per access) such that
/// every address and every stride is a multiple of it and `len` is too.
pub(crate) fn vector_width(
    elem_bytes: usize,
    addresses: &[u64],
    strides: &[usize],
    len: usize,
) -> usize {
    let mut width = (16 / elem_bytes).max(1);
    while width > 1 {
        let bytes = (width * elem_bytes) as u64;
        let ok = addresses.iter().all(|a| a % bytes == 0)
            && strides.iter().all(|s| s % width == 0)
            && len.is_multiple_of(width);
        if ok {
            break;
        }
        width /= 2;
    }
    width
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vector_width_respects_alignment_strides_and_length() {
        assert_eq!(vector_width(2, &[0x1000], &[4096], 4096), 8);
        assert_eq!(vector_width(2, &[0x1002], &[4096], 4096), 1);
        assert_eq!(vector_width(2, &[0x1000], &[4100], 4096), 4);
        assert_eq!(vector_width(2, &[0x1000], &[4096], 4097), 1);
        assert_eq!(vector_width(4, &[0x1000], &[12], 12), 4);
    }
}
