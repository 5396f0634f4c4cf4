//! Host <-> device helpers: rounding to a dtype, strided views on poisoned parents, and the
//! check that an op wrote nothing outside its output view.

use calico::{DType, Device, Result, Tensor};
use half::{bf16, f16};

/// Fills the storage around a view: a finite value, so it must survive bit-exactly.
pub const SENTINEL: f64 = 12345.0;

/// `v` rounded to `dtype` (round-to-nearest-even) and back.
pub fn round(dtype: DType, v: f64) -> f64 {
    // Through f32, as the devices do: they compute in f32 and round that to 16 bits (and
    // half's from_f64 decides ties from the upper 32 bits only, misrounding just above them).
    match dtype {
        DType::BF16 => bf16::from_f32(v as f32).to_f64(),
        DType::F16 => f16::from_f32(v as f32).to_f64(),
        DType::F32 => v as f32 as f64,
        other => panic!("round: {other} is not a standard float"),
    }
}

pub fn round_all(dtype: DType, v: &[f64]) -> Vec<f64> {
    v.iter().map(|&x| round(dtype, x)).collect()
}

/// Writes `values` (row-major over the view) into `t`, converting to its dtype.
pub fn write(t: &Tensor, values: &[f64]) -> Result<()> {
    match t.dtype() {
        DType::BF16 => t.copy_from_slice(
            &values
                .iter()
                .map(|&v| bf16::from_f32(v as f32))
                .collect::<Vec<_>>(),
        ),
        DType::F16 => t.copy_from_slice(
            &values
                .iter()
                .map(|&v| f16::from_f32(v as f32))
                .collect::<Vec<_>>(),
        ),
        DType::F32 => t.copy_from_slice(&values.iter().map(|&v| v as f32).collect::<Vec<_>>()),
        other => Err(calico::Error::unsupported(format!("write: {other}"))),
    }
}

/// A contiguous tensor of `dtype` holding `values`.
pub fn upload(dev: &Device, dtype: DType, shape: &[usize], values: &[f64]) -> Result<Tensor> {
    let t = dev.zeros(shape, dtype)?;
    write(&t, values)?;
    Ok(t)
}

/// A view and the flat buffer it lives in (so writes outside the view can be detected).
#[derive(Debug, Clone)]
pub struct View {
    pub parent: Tensor,
    pub view: Tensor,
}

/// Where a view sits in its parent: `pad` extra elements per innermost row and an element
/// `offset` (an odd one breaks 16-byte alignment, pushing GPU kernels to their scalar path).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Placement {
    pub pad: usize,
    pub offset: usize,
}

impl Placement {
    pub fn is_dense(self) -> bool {
        self.pad == 0 && self.offset == 0
    }
}

/// A placement whose rows start on 16-byte boundaries (each row padded to whole 16-byte
/// pieces) with the view 16 bytes into its allocation: the layout in which GPU kernels take
/// their widest vector accesses. Like every view here it ends exactly at the end of its
/// allocation (the last row's padding is not allocated), so a vector read past the last
/// element leaves the allocation.
pub fn aligned_tail(dtype: DType, cols: usize) -> Placement {
    let per_16_bytes = (16 / dtype.size_bytes()).max(1);
    Placement {
        pad: (per_16_bytes - cols % per_16_bytes) % per_16_bytes,
        offset: per_16_bytes,
    }
}

/// Row lengths for the end-of-allocation checks: every length 1..=9, then either side of the
/// vector, warp and block sizes.
pub const TAIL_COLS: [usize; 22] = [
    1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 129, 1023, 1024, 4096, 4097,
];

/// Row-major strides for `shape` whose innermost rows are `pad` elements longer.
pub fn padded_strides(shape: &[usize], pad: usize) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    let mut step = shape.last().map_or(1, |&c| c + pad);
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = step;
        step *= shape[i].max(1);
    }
    strides
}

/// A view of `shape` with `strides` at `offset` in a parent filled with [`SENTINEL`]; the
/// view's own elements are set to `fill` if given (NaN poisons an output: unwritten elements
/// fail).
pub fn view(
    dev: &Device,
    dtype: DType,
    shape: &[usize],
    strides: &[usize],
    offset: usize,
    fill: Option<f64>,
) -> Result<View> {
    let numel: usize = shape.iter().product();
    let end = if numel == 0 {
        offset
    } else {
        offset
            + 1
            + shape
                .iter()
                .zip(strides)
                .map(|(d, s)| (d - 1) * s)
                .sum::<usize>()
    };
    let parent = upload(dev, dtype, &[end.max(1)], &vec![SENTINEL; end.max(1)])?;
    let view = parent.as_strided(shape, strides, offset)?;
    if let Some(fill) = fill {
        write(&view, &vec![fill; numel])?;
    }
    Ok(View { parent, view })
}

/// A row-major view of `shape` placed as `at` says, holding `values`.
pub fn rows_view(
    dev: &Device,
    dtype: DType,
    shape: &[usize],
    at: Placement,
    values: &[f64],
) -> Result<View> {
    let v = view(
        dev,
        dtype,
        shape,
        &padded_strides(shape, at.pad),
        at.offset,
        None,
    )?;
    write(&v.view, values)?;
    Ok(v)
}

/// A poisoned (NaN) output of `shape` placed as `at` says.
pub fn poisoned_rows(dev: &Device, dtype: DType, shape: &[usize], at: Placement) -> Result<View> {
    view(
        dev,
        dtype,
        shape,
        &padded_strides(shape, at.pad),
        at.offset,
        Some(f64::NAN),
    )
}

/// Storage elements of the view, in the parent's numbering.
fn view_elements(t: &Tensor) -> Vec<usize> {
    let (shape, strides) = (t.shape(), t.strides());
    let offset = t.layout().offset();
    let mut out = Vec::with_capacity(t.numel());
    let mut idx = vec![0usize; shape.len()];
    for _ in 0..t.numel() {
        out.push(offset + idx.iter().zip(strides).map(|(i, s)| i * s).sum::<usize>());
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

/// Every element of the parent outside the view still holds [`SENTINEL`].
pub fn untouched_outside(v: &View, what: &str) -> std::result::Result<(), String> {
    let all = v
        .parent
        .to_f64_vec()
        .map_err(|e| format!("reading `{what}`: {e}"))?;
    let mut inside = vec![false; all.len()];
    for e in view_elements(&v.view) {
        inside[e] = true;
    }
    let want = round(v.view.dtype(), SENTINEL);
    match (0..all.len()).find(|&i| !inside[i] && all[i].to_bits() != want.to_bits()) {
        Some(i) => Err(format!(
            "`{what}`: element {i} of the parent, outside the view, was overwritten with {} \
             (shape {:?}, strides {:?}, offset {})",
            all[i],
            v.view.shape(),
            v.view.strides(),
            v.view.layout().offset()
        )),
        None => Ok(()),
    }
}

/// An input view still holds `values` and its parent around it is untouched.
pub fn intact(v: &View, values: &[f64], what: &str) -> std::result::Result<(), String> {
    let now = v
        .view
        .to_f64_vec()
        .map_err(|e| format!("reading `{what}`: {e}"))?;
    if let Some(i) = (0..now.len()).find(|&i| now[i].to_bits() != values[i].to_bits()) {
        return Err(format!(
            "input `{what}` was modified: element {i} is {}, was {}",
            now[i], values[i]
        ));
    }
    untouched_outside(v, what)
}

/// How a matrix operand is stored: column-major (a transposed view of row-major memory),
/// `pad` extra elements per stored line, and an element offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MatrixMemory {
    pub col_major: bool,
    pub pad: usize,
    pub offset: usize,
}

/// Shape and strides of a `[batch?, rows, cols]` operand stored as `mem` says.
pub fn matrix_layout(
    batch: Option<usize>,
    rows: usize,
    cols: usize,
    mem: MatrixMemory,
) -> (Vec<usize>, Vec<usize>) {
    let (rs, cs, bs) = if mem.col_major {
        (1, rows + mem.pad, cols * (rows + mem.pad))
    } else {
        (cols + mem.pad, 1, rows * (cols + mem.pad))
    };
    match batch {
        Some(b) => (vec![b, rows, cols], vec![bs, rs, cs]),
        None => (vec![rows, cols], vec![rs, cs]),
    }
}

/// A `[batch?, rows, cols]` operand stored as `mem` says, holding `values` (row-major over
/// the logical shape), or poisoned with NaN when `values` is None.
pub fn matrix(
    dev: &Device,
    dtype: DType,
    batch: Option<usize>,
    rows: usize,
    cols: usize,
    mem: MatrixMemory,
    values: Option<&[f64]>,
) -> Result<View> {
    let (shape, strides) = matrix_layout(batch, rows, cols, mem);
    let v = view(dev, dtype, &shape, &strides, mem.offset, Some(f64::NAN))?;
    if let Some(values) = values {
        write(&v.view, values)?;
    }
    Ok(v)
}
