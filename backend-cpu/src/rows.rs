//! Row access over the byte slices `views::with_views` hands out, and the split of output
//! rows into blocks for rayon (a task per block of rows, not per row).

use crate::lanes::{splat, Lanes};
use calico_core::{DType, Error, Result, Rows, Tensor};
use std::cell::RefCell;

/// Elements per rayon task: big enough to amortise scheduling (64-256 KiB of input and
/// output per task), small enough to balance.
const ELEMENTS_PER_TASK: usize = 1 << 15;

/// The rows of `t`, checked to lie within `len_bytes` bytes of its view slice.
pub(crate) fn rows_of(t: &Tensor, len_bytes: usize) -> Result<Rows> {
    let rows = t.layout().as_rows()?;
    if rows.rows > 0 && rows.cols > 0 {
        let end = (rows.rows - 1)
            .checked_mul(rows.row_stride)
            .and_then(|e| e.checked_add(rows.cols))
            .and_then(|e| e.checked_mul(t.dtype().size_bytes()));
        if end.is_none_or(|end| end > len_bytes) {
            return Err(Error::OutOfBounds(format!(
                "rows {rows:?} reach past the tensor's {len_bytes} bytes"
            )));
        }
    }
    Ok(rows)
}

/// Read access to the rows of one input.
#[derive(Clone, Copy)]
pub(crate) struct RowReader<'a> {
    bytes: &'a [u8],
    stride_bytes: usize,
    len_bytes: usize,
    pub dtype: DType,
}

impl<'a> RowReader<'a> {
    /// `bytes` is the tensor's view slice; `rows` comes from [`rows_of`] on the same slice.
    pub(crate) fn new(bytes: &'a [u8], rows: &Rows, dtype: DType) -> Self {
        let esz = dtype.size_bytes();
        RowReader {
            bytes,
            stride_bytes: rows.row_stride * esz,
            len_bytes: rows.cols * esz,
            dtype,
        }
    }

    /// The bytes of row `r`.
    #[inline(always)]
    pub(crate) fn row(&self, r: usize) -> &'a [u8] {
        let start = r * self.stride_bytes;
        &self.bytes[start..start + self.len_bytes]
    }

    /// Row `r` widened into `dst` (row length elements).
    #[inline(always)]
    pub(crate) fn load(&self, r: usize, dst: &mut [f32]) {
        crate::convert::load(self.dtype, self.row(r), dst);
    }
}

/// Scratch kept per thread up to this many f32s (1 MiB); longer rows allocate per task.
const KEPT_SCRATCH_F32S: usize = 1 << 18;

thread_local! {
    static SCRATCH: RefCell<Vec<Lanes>> = const { RefCell::new(Vec::new()) };
}

/// Calls `f` with `chunks` chunks of this thread's scratch (contents unspecified). The buffer
/// is kept between calls, so a row op allocates once per rayon thread rather than per task.
pub(crate) fn with_scratch<R>(chunks: usize, f: impl FnOnce(&mut [Lanes]) -> R) -> R {
    if chunks * crate::lanes::W > KEPT_SCRATCH_F32S {
        return f(&mut vec![splat(0.0); chunks]);
    }
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            if buf.len() < chunks {
                buf.resize(chunks, splat(0.0));
            }
            f(&mut buf[..chunks])
        }
        // Only if `f` itself asks for scratch.
        Err(_) => f(&mut vec![splat(0.0); chunks]),
    })
}

/// How many rows one task handles.
pub(crate) fn block_rows(rows: usize, cols: usize) -> usize {
    let by_size = (ELEMENTS_PER_TASK / cols.max(1)).max(1);
    // Keep a few blocks per thread so rayon can balance uneven progress.
    let by_count = rows.div_ceil(4 * rayon::current_num_threads()).max(1);
    by_size.min(by_count)
}

/// Splits an output's view slice into blocks of `block` rows each. Within a block, row `i`
/// starts at byte `i * rows.row_stride * size`. Output rows that overlap each other (a row
/// stride shorter than the row) are an `Aliasing` error.
pub(crate) fn output_blocks<'a>(
    bytes: &'a mut [u8],
    rows: &Rows,
    dtype: DType,
    block: usize,
) -> Result<Vec<&'a mut [u8]>> {
    if rows.rows == 0 || rows.cols == 0 {
        return Ok(Vec::new());
    }
    if rows.rows > 1 && rows.row_stride < rows.cols {
        return Err(Error::Aliasing(format!(
            "output rows of {} elements with row stride {} overlap each other",
            rows.cols, rows.row_stride
        )));
    }
    let esz = dtype.size_bytes();
    let extent = ((rows.rows - 1) * rows.row_stride + rows.cols) * esz;
    let bytes = bytes.get_mut(..extent).ok_or_else(|| {
        Error::OutOfBounds(format!("rows {rows:?} reach past the output's bytes"))
    })?;
    if rows.rows == 1 {
        return Ok(vec![bytes]);
    }
    Ok(bytes
        .chunks_mut(block.max(1) * rows.row_stride * esz)
        .collect())
}

/// Row `i` of a block from [`output_blocks`].
#[inline(always)]
pub(crate) fn block_row<'b>(
    block: &'b mut [u8],
    i: usize,
    rows: &Rows,
    dtype: DType,
) -> &'b mut [u8] {
    let esz = dtype.size_bytes();
    let start = i * rows.row_stride * esz;
    &mut block[start..start + rows.cols * esz]
}

/// Cuts `bytes` into rows of `len` bytes starting at `starts` (any order), returned in the
/// order of `starts`. Rows that overlap are an `Aliasing` error.
pub(crate) fn carve_rows<'a>(
    bytes: &'a mut [u8],
    starts: &[usize],
    len: usize,
) -> Result<Vec<&'a mut [u8]>> {
    let mut order: Vec<usize> = (0..starts.len()).collect();
    if !starts.is_sorted() {
        order.sort_by_key(|&i| starts[i]);
    }
    let mut rows: Vec<Option<&'a mut [u8]>> = starts.iter().map(|_| None).collect();
    let mut rest = bytes;
    let mut pos = 0;
    for i in order {
        let start = starts[i];
        if start < pos {
            return Err(Error::Aliasing("output rows overlap each other".into()));
        }
        if (start - pos)
            .checked_add(len)
            .is_none_or(|end| end > rest.len())
        {
            return Err(Error::OutOfBounds(
                "an output row reaches past the output's bytes".into(),
            ));
        }
        let (_, tail) = rest.split_at_mut(start - pos);
        let (row, tail) = tail.split_at_mut(len);
        rows[i] = Some(row);
        rest = tail;
        pos = start + len;
    }
    Ok(rows.into_iter().map(|r| r.unwrap_or_default()).collect())
}
