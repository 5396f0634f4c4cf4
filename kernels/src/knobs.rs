//! Tuning knobs read from environment variables for A/B runs (`CALICO_HOPPER_TUNE`,
//! `CALICO_GEMV_TUNE`, `CALICO_ROWS_TUNE`, `CALICO_DECODE_TUNE`, the attention kernels'):
//! read once per process, most of them lists of `key=value` items.

/// The `key=value` items of a knob's text, split on commas, spaces or semicolons, each key and
/// value trimmed; items without `=` are skipped (each knob ignores keys it does not know).
pub(crate) fn pairs(text: &str) -> impl Iterator<Item = (&str, &str)> {
    text.split([',', ' ', ';']).filter_map(|item| {
        let (key, value) = item.split_once('=')?;
        Some((key.trim(), value.trim()))
    })
}

/// The knob `var` as `parse` reads it (an unset variable reads as empty text), parsed once per
/// process into `cell`: the variant choices that consult it stay fixed while the program runs.
pub(crate) fn read<T: Copy>(
    cell: &'static std::sync::OnceLock<T>,
    var: &str,
    parse: impl FnOnce(&str) -> T,
) -> T {
    *cell.get_or_init(|| parse(&std::env::var(var).unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn items_split_on_any_separator_and_skip_bare_words() {
        let got: Vec<_> = super::pairs("bm=128, bn=256;stages=4 mode pingpong=x").collect();
        assert_eq!(
            got,
            [
                ("bm", "128"),
                ("bn", "256"),
                ("stages", "4"),
                ("pingpong", "x")
            ]
        );
        assert_eq!(super::pairs("").count(), 0);
    }
}
