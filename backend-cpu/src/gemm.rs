//! Batched GEMM with alpha, beta, bias and an activation epilogue. Inputs are widened to f32
//! panels (row- or column-major, whichever their strides make cheap) and multiplied by the
//! `gemm` crate's f32 kernels; the epilogue runs in f32 per output row.

use crate::convert::{float_dtype, load, store};
use crate::gemm_few_rows as few_rows;
use crate::math;
use crate::rows::{carve_rows, rows_of};
use crate::views::with_views;
use crate::{gemm_amx, gemm_bf16_axpy, gemm_bf16_dot};
use calico_core::{DType, Epilogue, Error, Result, Tensor};
use rayon::prelude::*;

/// The epilogue's function of one element.
#[inline]
fn apply(epilogue: Epilogue, x: f32) -> f32 {
    match epilogue {
        Epilogue::None => x,
        Epilogue::Gelu => math::gelu(x),
        Epilogue::Silu => math::silu(x),
    }
}

/// A batch of few-rows problems whose A and output each fit this many floats runs one matrix
/// per rayon task (each task holds its own A, output and scratch).
const BATCH_TASK_F32S: usize = 1 << 20;

/// Below this many multiply-adds the `gemm` crate runs on the calling thread.
const PARALLEL_MACS: usize = 1 << 18;

/// One (possibly batched) matrix operand: `batch` matrices of `rows x cols`, element strides.
#[derive(Debug, Clone, Copy)]
struct Mat {
    batch: usize,
    rows: usize,
    cols: usize,
    batch_stride: usize,
    row_stride: usize,
    col_stride: usize,
    dtype: DType,
}

impl Mat {
    /// A rank-2 tensor is one matrix shared by every batch; rank 3 is `[batch, rows, cols]`.
    fn of(t: &Tensor, what: &str) -> Result<Mat> {
        let dtype = float_dtype(t)?;
        let (sh, st) = (t.shape(), t.strides());
        match sh.len() {
            2 => Ok(Mat {
                batch: 1,
                rows: sh[0],
                cols: sh[1],
                batch_stride: 0,
                row_stride: st[0],
                col_stride: st[1],
                dtype,
            }),
            3 => Ok(Mat {
                batch: sh[0],
                rows: sh[1],
                cols: sh[2],
                batch_stride: st[0],
                row_stride: st[1],
                col_stride: st[2],
                dtype,
            }),
            r => Err(Error::shape(format!(
                "gemm: {what} must have rank 2 or 3, got {r}"
            ))),
        }
    }

    /// Checks the shape against `[batch?, rows, cols]` and that the view fits `len` bytes.
    fn check(&self, batch: usize, rows: usize, cols: usize, len: usize, what: &str) -> Result<()> {
        if (self.batch != batch && self.batch != 1) || self.rows != rows || self.cols != cols {
            return Err(Error::shape(format!(
                "gemm: {what} is [{}, {}, {}]; expected [{batch}, {rows}, {cols}]",
                self.batch, self.rows, self.cols
            )));
        }
        if self.batch * rows * cols > 0 {
            let last = (self.batch - 1) * self.batch_stride
                + (rows - 1) * self.row_stride
                + (cols - 1) * self.col_stride;
            if (last + 1) * self.dtype.size_bytes() > len {
                return Err(Error::OutOfBounds(format!(
                    "gemm: {what} reaches past its bytes"
                )));
            }
        }
        Ok(())
    }

    /// Element offset of `[b, r, 0]` (a single shared matrix ignores `b`).
    fn row_start(&self, b: usize, r: usize) -> usize {
        let b = if self.batch == 1 { 0 } else { b };
        b * self.batch_stride + r * self.row_stride
    }

    /// Widens row `r` of matrix `b` into `dst` (`cols` elements).
    fn load_row(&self, bytes: &[u8], b: usize, r: usize, dst: &mut [f32]) {
        load_line(
            bytes,
            self.dtype,
            self.row_start(b, r),
            self.col_stride,
            dst,
        );
    }

    /// Widens matrix `b` into `panel` and returns its (row stride, column stride) there.
    fn widen(&self, bytes: &[u8], b: usize, panel: &mut Vec<f32>) -> (isize, isize) {
        let (rows, cols) = (self.rows, self.cols);
        panel.resize(rows * cols, 0.0);
        if self.col_stride == 1 || cols == 1 || self.row_stride != 1 {
            // Row-major panel; rows are contiguous in storage unless the strides are general.
            panel
                .par_chunks_mut(cols)
                .enumerate()
                .with_min_len(min_lines(cols))
                .for_each(|(r, row)| {
                    self.load_row(bytes, b, r, row);
                });
            (cols as isize, 1)
        } else {
            // Column-major panel: a transposed operand keeps reading contiguous memory.
            let base = self.row_start(b, 0);
            panel
                .par_chunks_mut(rows)
                .enumerate()
                .with_min_len(min_lines(rows))
                .for_each(|(c, col)| {
                    load_line(bytes, self.dtype, base + c * self.col_stride, 1, col);
                });
            (1, rows as isize)
        }
    }
}

/// The few-rows path's form for B, when it takes the problem (M small, K or N of B
/// contiguous; see gemm_few_rows.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FewRows {
    /// B's columns (W's rows) are contiguous.
    Dot,
    /// B's rows are contiguous.
    Axpy,
}

/// Whether both few-rows forms of A and B in these dtypes multiply bf16 pairs directly
/// (gemm_bf16_dot.rs, gemm_bf16_axpy.rs), which they do at any M.
fn pairs_take(a: DType, b: DType) -> bool {
    a == DType::BF16 && b == DType::BF16 && crate::bf16_pairs::available()
}

impl FewRows {
    fn of(a: &Mat, b: &Mat, m: usize, k: usize) -> Option<FewRows> {
        let dot = b.row_stride == 1 || k == 1;
        let rows = b.col_stride == 1 || b.cols == 1;
        if m > few_rows::MAX_M && !((dot || rows) && pairs_take(a.dtype, b.dtype)) {
            None
        } else if dot {
            Some(FewRows::Dot)
        } else if rows {
            Some(FewRows::Axpy)
        } else {
            None
        }
    }

    /// `acc = alpha * a @ b` (`scratch`: a panel the form may use; `a_dtype`: the dtype `a`
    /// was widened from), on bf16 pairs where [`pairs_take`].
    #[allow(clippy::too_many_arguments)]
    fn run(
        self,
        a: &[f32],
        a_dtype: DType,
        mnk: (usize, usize, usize),
        b: few_rows::Lines,
        alpha: f32,
        acc: &mut [f32],
        scratch: &mut Vec<f32>,
    ) {
        match (self, pairs_take(a_dtype, b.dtype)) {
            (FewRows::Dot, false) => few_rows::dot(a, mnk, b, alpha, acc, scratch),
            (FewRows::Axpy, false) => few_rows::axpy(a, mnk, b, alpha, acc, scratch),
            (FewRows::Dot, true) => gemm_bf16_dot::dot(a, mnk, b, alpha, acc, scratch),
            (FewRows::Axpy, true) => gemm_bf16_axpy::axpy(a, mnk, b, alpha, acc, scratch),
        }
    }
}

impl FewRows {
    /// `acc = alpha * a @ b` on AMX tiles (gemm_amx.rs), A's rows read as stored.
    fn run_amx(
        self,
        a: few_rows::Lines,
        mnk: (usize, usize, usize),
        b: few_rows::Lines,
        alpha: f32,
        acc: &mut [f32],
        scratch: &mut Vec<f32>,
    ) {
        match self {
            FewRows::Dot => gemm_amx::dot(a, mnk, b, alpha, acc, scratch),
            FewRows::Axpy => gemm_amx::axpy(a, mnk, b, alpha, acc, scratch),
        }
    }
}

impl Mat {
    /// Matrix `b`'s rows for the AMX tiles, where they take this product (`gemm_amx::takes`,
    /// `other` the dtype of B): bf16 rows, each contiguous and 2-byte aligned, which the
    /// tiles' packing reads as they are (no f32 copy of A).
    fn amx_rows<'a>(&self, bytes: &'a [u8], b: usize, other: DType) -> Option<few_rows::Lines<'a>> {
        let fits = self.dtype == DType::BF16
            && other == DType::BF16
            && (self.col_stride == 1 || self.cols == 1)
            && bytes.as_ptr().align_offset(2) == 0
            && gemm_amx::takes(self.rows);
        fits.then(|| few_rows::Lines {
            bytes,
            dtype: self.dtype,
            start: self.row_start(b, 0),
            stride: self.row_stride,
        })
    }

    /// Matrix `b`'s lines for a few-rows form: its columns (K elements each) for `Dot`, its
    /// rows (N elements each) for `Axpy`.
    fn lines<'a>(&self, bytes: &'a [u8], b: usize, form: FewRows) -> few_rows::Lines<'a> {
        few_rows::Lines {
            bytes,
            dtype: self.dtype,
            start: self.row_start(b, 0),
            stride: match form {
                FewRows::Dot => self.col_stride,
                FewRows::Axpy => self.row_stride,
            },
        }
    }
}

/// The f32 panels of a call (A and B widened, the product), kept by the calling thread for its
/// next call: a fresh allocation of a 4096 x 4096 panel costs ~16k page faults, which took
/// longer than the product itself at decode shapes. Panels over [`Panels::KEPT_F32S`] are
/// freed after the call, which bounds what a thread holds.
struct Panels;

impl Panels {
    /// 16 Mi floats (64 MiB): a 4096 x 4096 weight.
    const KEPT_F32S: usize = 16 << 20;

    fn take() -> [Vec<f32>; 3] {
        PANELS.with(|p| std::mem::take(&mut *p.borrow_mut()))
    }

    fn keep(mut panels: [Vec<f32>; 3]) {
        for p in &mut panels {
            if p.capacity() > Self::KEPT_F32S {
                *p = Vec::new();
            }
        }
        PANELS.with(|p| *p.borrow_mut() = panels);
    }
}

thread_local! {
    static PANELS: std::cell::RefCell<[Vec<f32>; 3]> =
        const { std::cell::RefCell::new([Vec::new(), Vec::new(), Vec::new()]) };
}

/// Lines per rayon task when widening lines of `len` elements.
fn min_lines(len: usize) -> usize {
    (8192 / len.max(1)).max(1)
}

/// Widens `dst.len()` elements starting at element `start` with element stride `step`.
#[inline(always)]
pub(crate) fn load_line(bytes: &[u8], dtype: DType, start: usize, step: usize, dst: &mut [f32]) {
    let esz = dtype.size_bytes();
    if step == 1 || dst.len() <= 1 {
        load(dtype, &bytes[start * esz..(start + dst.len()) * esz], dst);
    } else {
        for (i, v) in dst.iter_mut().enumerate() {
            let at = (start + i * step) * esz;
            load(dtype, &bytes[at..at + esz], std::slice::from_mut(v));
        }
    }
}

/// `d = epilogue(alpha * a @ b + beta * c + bias)`, accumulated in f32. `a` is
/// `[batch?, M, K]`, `b` `[batch?, K, N]`, `c` and `d` `[batch?, M, N]`, `bias` `[N]`; any
/// strides (transposes come as strides); a rank-2 input is shared by every batch of `d`.
/// With `beta == 0`, `c` is not read (as in BLAS).
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    a: &Tensor,
    b: &Tensor,
    c: Option<&Tensor>,
    d: &Tensor,
    alpha: f32,
    beta: f32,
    epilogue: Epilogue,
    bias: Option<&Tensor>,
) -> Result<()> {
    let (am, bm, dm) = (Mat::of(a, "a")?, Mat::of(b, "b")?, Mat::of(d, "d")?);
    let cm = c
        .filter(|_| beta != 0.0)
        .map(|t| Mat::of(t, "c"))
        .transpose()?;
    let bias = bias.map(|t| float_dtype(t).map(|_| t)).transpose()?;
    let (batch, m, n, k) = (dm.batch, dm.rows, dm.cols, am.cols);

    let mut inputs = vec![a, b];
    inputs.extend(c.filter(|_| cm.is_some()));
    inputs.extend(bias);
    with_views(&inputs, &[d], |ins, outs| {
        let (a_bytes, b_bytes) = (ins[0], ins[1]);
        let c_bytes = if cm.is_some() {
            ins.get(2).copied()
        } else {
            None
        };
        let d_bytes = outs
            .into_iter()
            .next()
            .ok_or_else(|| Error::unsupported("internal: missing view"))?;
        am.check(batch, m, k, a_bytes.len(), "a")?;
        bm.check(batch, k, n, b_bytes.len(), "b")?;
        dm.check(batch, m, n, d_bytes.len(), "d")?;
        if let (Some(cm), Some(bytes)) = (&cm, c_bytes) {
            cm.check(batch, m, n, bytes.len(), "c")?;
        }
        let bias = match bias {
            Some(t) => {
                let bytes = ins.last().copied().unwrap_or_default();
                let r = rows_of(t, bytes.len())?;
                if r.rows != 1 || r.cols != n {
                    return Err(Error::shape(format!(
                        "gemm: bias is {:?}; expected [{n}]",
                        t.shape()
                    )));
                }
                let mut v = vec![0.0; n];
                load(t.dtype(), bytes, &mut v);
                Some(v)
            }
            None => None,
        };
        if batch * m * n == 0 {
            return Ok(());
        }

        let finish = Finish {
            c: cm.zip(c_bytes),
            beta,
            bias: bias.as_deref(),
            epilogue,
        };
        let mut out = Output::new(d_bytes, &dm)?;
        let [mut lhs, mut rhs, mut acc] = Panels::take();
        let few_rows = FewRows::of(&am, &bm, m, k);
        if let (Some(form), Output::Rows { rows, dtype }) = (few_rows, &mut out) {
            if batch > 1 && k > 0 && m * n.max(k) <= BATCH_TASK_F32S {
                // Matrices of a batch one task each: splitting each small matrix over the
                // threads in turn cost more in rayon than the products (512 x 64x64x100).
                let dtype = *dtype;
                rows.par_chunks_mut(m).enumerate().for_each_init(
                    || {
                        (
                            vec![0.0f32; m * k],
                            vec![0.0f32; m * n],
                            Vec::new(),
                            vec![0.0f32; n],
                        )
                    },
                    |(a, acc, scratch, c_row), (bi, out_rows)| {
                        let b_lines = bm.lines(b_bytes, bi, form);
                        if let Some(a_rows) = am.amx_rows(a_bytes, bi, bm.dtype) {
                            form.run_amx(a_rows, (m, n, k), b_lines, alpha, acc, scratch);
                        } else {
                            for (r, row) in a.chunks_exact_mut(k).enumerate() {
                                am.load_row(a_bytes, bi, r, row);
                            }
                            form.run(a, am.dtype, (m, n, k), b_lines, alpha, acc, scratch);
                        }
                        for (r, (row, out)) in acc.chunks_exact_mut(n).zip(out_rows).enumerate() {
                            finish.row(bi, r, row, c_row);
                            store(dtype, row, out);
                        }
                    },
                );
                Panels::keep([lhs, rhs, acc]);
                return Ok(());
            }
        }
        acc.clear();
        acc.resize(m * n, 0.0);
        for bi in 0..batch {
            if k == 0 {
                acc.fill(0.0);
            } else if let (Some(form), Some(a_rows)) =
                (few_rows, am.amx_rows(a_bytes, bi, bm.dtype))
            {
                let b_lines = bm.lines(b_bytes, bi, form);
                form.run_amx(a_rows, (m, n, k), b_lines, alpha, &mut acc, &mut rhs);
            } else if let Some(form) = few_rows {
                lhs.resize(m * k, 0.0);
                lhs.par_chunks_mut(k)
                    .enumerate()
                    .with_min_len(min_lines(k))
                    .for_each(|(r, row)| am.load_row(a_bytes, bi, r, row));
                form.run(
                    &lhs,
                    am.dtype,
                    (m, n, k),
                    bm.lines(b_bytes, bi, form),
                    alpha,
                    &mut acc,
                    &mut rhs,
                );
            } else {
                let (lrs, lcs) = am.widen(a_bytes, bi, &mut lhs);
                let (rrs, rcs) = bm.widen(b_bytes, bi, &mut rhs);
                let par = if m * n * k >= PARALLEL_MACS {
                    ::gemm::Parallelism::Rayon(rayon::current_num_threads())
                } else {
                    ::gemm::Parallelism::None
                };
                // SAFETY: `acc`, `lhs` and `rhs` are distinct live buffers of m*n, m*k and k*n
                // f32 (`widen` resized the panels), and the strides passed are the row-major
                // or column-major strides of exactly those extents, so every access is in
                // bounds; `acc` is only written (`read_dst` is false); f32 is a type the
                // `gemm` crate supports, so it does not panic on the type.
                unsafe {
                    ::gemm::gemm(
                        m,
                        n,
                        k,
                        acc.as_mut_ptr(),
                        1,
                        n as isize,
                        false,
                        lhs.as_ptr(),
                        lcs,
                        lrs,
                        rhs.as_ptr(),
                        rcs,
                        rrs,
                        0.0,
                        alpha,
                        false,
                        false,
                        false,
                        par,
                    );
                }
            }
            out.write_batch(bi, &mut acc, &finish)?;
        }
        Panels::keep([lhs, rhs, acc]);
        Ok(())
    })
}

/// Everything after the product: `+ beta * c + bias`, then the activation.
struct Finish<'a> {
    c: Option<(Mat, &'a [u8])>,
    beta: f32,
    bias: Option<&'a [f32]>,
    epilogue: Epilogue,
}

impl Finish<'_> {
    /// Finishes row `r` of batch `b` in place; `scratch` holds one row of `c`.
    fn row(&self, b: usize, r: usize, row: &mut [f32], scratch: &mut [f32]) {
        if let Some((cm, bytes)) = &self.c {
            cm.load_row(bytes, b, r, scratch);
            row.iter_mut()
                .zip(scratch.iter())
                .for_each(|(v, c)| *v += self.beta * c);
        }
        if let Some(bias) = self.bias {
            row.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
        }
        if self.epilogue != Epilogue::None {
            row.iter_mut().for_each(|v| *v = apply(self.epilogue, *v));
        }
    }
}

/// Where finished rows go: one byte slice per output row when rows are contiguous, else the
/// whole view, written element by element.
enum Output<'a> {
    Rows {
        rows: Vec<&'a mut [u8]>,
        dtype: DType,
    },
    Strided {
        bytes: &'a mut [u8],
        mat: Mat,
    },
}

impl<'a> Output<'a> {
    fn new(bytes: &'a mut [u8], dm: &Mat) -> Result<Self> {
        let esz = dm.dtype.size_bytes();
        if dm.col_stride == 1 || dm.cols == 1 {
            let starts: Vec<usize> = (0..dm.batch * dm.rows)
                .map(|i| dm.row_start(i / dm.rows, i % dm.rows) * esz)
                .collect();
            let rows = carve_rows(bytes, &starts, dm.cols * esz)?;
            return Ok(Output::Rows {
                rows,
                dtype: dm.dtype,
            });
        }
        let dims = [
            (dm.batch, dm.batch_stride),
            (dm.rows, dm.row_stride),
            (dm.cols, dm.col_stride),
        ];
        if dims.iter().any(|&(len, stride)| len > 1 && stride == 0) {
            return Err(Error::Aliasing(
                "gemm: d has a stride of 0 on a dimension longer than 1".into(),
            ));
        }
        Ok(Output::Strided { bytes, mat: *dm })
    }

    fn write_batch(&mut self, b: usize, acc: &mut [f32], finish: &Finish<'_>) -> Result<()> {
        match self {
            Output::Rows { rows, dtype } => {
                let dtype = *dtype;
                let cols = rows.first().map_or(0, |r| r.len() / dtype.size_bytes());
                let m = acc.len() / cols.max(1);
                let batch_rows = rows
                    .get_mut(b * m..(b + 1) * m)
                    .ok_or_else(|| Error::unsupported("internal: rows"))?;
                acc.par_chunks_mut(cols.max(1))
                    .zip(batch_rows.par_iter_mut())
                    .enumerate()
                    .with_min_len(min_lines(cols))
                    .for_each_init(
                        || vec![0.0f32; cols],
                        |scratch, (r, (row, out))| {
                            finish.row(b, r, row, scratch);
                            store(dtype, row, out);
                        },
                    );
            }
            Output::Strided { bytes, mat } => {
                let cols = mat.cols;
                acc.par_chunks_mut(cols)
                    .enumerate()
                    .with_min_len(min_lines(cols))
                    .for_each_init(
                        || vec![0.0f32; cols],
                        |scratch, (r, row)| finish.row(b, r, row, scratch),
                    );
                let esz = mat.dtype.size_bytes();
                for (r, row) in acc.chunks(cols).enumerate() {
                    let start = mat.row_start(b, r);
                    for (j, &v) in row.iter().enumerate() {
                        let at = (start + j * mat.col_stride) * esz;
                        store(mat.dtype, &[v], &mut bytes[at..at + esz]);
                    }
                }
            }
        }
        Ok(())
    }
}
