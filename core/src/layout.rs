//! Shapes, strides and offsets, in elements.

use crate::{Error, Result};

/// Where a tensor's elements live inside its storage: shape, strides and offset, in elements.
/// Strides are non-negative; a stride may be any value, so views can skip rows or transpose.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    shape: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
}

/// A 2-D view of a tensor as rows of contiguous elements: `rows` rows of `cols` elements,
/// row `r` starting at `offset + r * row_stride`. Most row-wise ops (norms, softmax) take this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rows {
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
    pub offset: usize,
}

/// The number of elements of `shape`, or `None` when it passes `usize` (a shape with a 0 has
/// none, whatever its other dimensions).
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

/// [`checked_numel`], as a `Shape` error for a count that passes `usize`.
pub fn checked_numel_or_err(shape: &[usize]) -> Result<usize> {
    checked_numel(shape).ok_or_else(|| {
        Error::shape(format!(
            "shape {shape:?} has more elements than a usize counts"
        ))
    })
}

/// The bytes `shape` spans at `elem_bytes` an element, as a `Shape` error past `isize::MAX`
/// (Rust's own bound on an allocation). Every tensor, views that repeat elements included,
/// keeps its logical size under it, so byte counts of its dimensions, and of padded copies of
/// them, cannot wrap.
pub fn checked_bytes(shape: &[usize], elem_bytes: usize) -> Result<usize> {
    checked_numel_or_err(shape)?
        .checked_mul(elem_bytes)
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| {
            Error::shape(format!(
                "shape {shape:?} of {elem_bytes}-byte elements spans more than isize::MAX bytes"
            ))
        })
}

/// Whether each `(stride, size)` dimension, in the order given, steps past every offset the
/// ones before it reach (dimensions of size 1 have no say). In increasing stride order that
/// is exactly "no two indices name one element" for the strides [`Layout::overlaps_itself`]
/// accepts.
fn each_steps_past(dims: impl Iterator<Item = (usize, usize)>) -> bool {
    // One past the largest offset the dimensions so far reach; past usize, no larger stride
    // can follow without overlapping.
    let mut reach = 1usize;
    for (stride, size) in dims.filter(|&(_, size)| size > 1) {
        if stride < reach {
            return false;
        }
        reach = stride
            .checked_mul(size - 1)
            .and_then(|r| r.checked_add(reach))
            .unwrap_or(usize::MAX);
    }
    true
}

impl Layout {
    /// A dense row-major layout of `shape`.
    pub fn contiguous(shape: &[usize]) -> Self {
        let mut strides = vec![0; shape.len()];
        let mut acc = 1usize;
        for (i, &d) in shape.iter().enumerate().rev() {
            strides[i] = acc;
            acc = acc.saturating_mul(d.max(1));
        }
        Layout {
            shape: shape.to_vec(),
            strides,
            offset: 0,
        }
    }

    /// A layout with explicit strides and offset (elements). Use [`Layout::max_element`] to
    /// check it fits a buffer.
    pub fn strided(shape: &[usize], strides: &[usize], offset: usize) -> Result<Self> {
        checked_numel_or_err(shape)?;
        if shape.len() != strides.len() {
            return Err(Error::shape(format!(
                "shape {shape:?} has rank {} but strides {strides:?} have rank {}",
                shape.len(),
                strides.len()
            )));
        }
        Ok(Layout {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            offset,
        })
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }
    pub fn offset(&self) -> usize {
        self.offset
    }
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    /// Number of elements (`usize::MAX` for a shape whose count passes `usize`, which
    /// [`Layout::strided`] and `Tensor` reject).
    pub fn numel(&self) -> usize {
        checked_numel(&self.shape).unwrap_or(usize::MAX)
    }

    /// True when the elements are dense and row-major (offset may be non-zero).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1usize;
        for (&d, &s) in self.shape.iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected *= d;
        }
        true
    }

    /// Whether two different indices may name one element: a stride of 0 on a dimension
    /// longer than 1, or strides that interleave. The dimensions are taken in stride order, and
    /// each must step past everything the smaller-stride ones reach; a layout that passes is
    /// one-to-one (a few exotic one-to-one layouts do not pass; no kernel takes them). An empty
    /// layout overlaps nothing.
    pub fn overlaps_itself(&self) -> bool {
        if self.numel() == 0 {
            return false;
        }
        // Most views keep their strides in row-major order (the last dimension the finest):
        // one pass from the last dimension out, no sort.
        let row_major = self.shape.iter().zip(&self.strides).rev();
        if each_steps_past(row_major.map(|(&size, &stride)| (stride, size))) {
            return false;
        }
        // (stride, size) of the dimensions longer than 1, sorted by stride; no allocation up
        // to rank 8 (every op's tensors).
        let mut fixed = [(0usize, 0usize); 8];
        let mut spilled = Vec::new();
        let dims: &mut [(usize, usize)] = if self.rank() <= fixed.len() {
            let mut n = 0;
            for (&d, &s) in self.shape.iter().zip(&self.strides) {
                if d > 1 {
                    fixed[n] = (s, d);
                    n += 1;
                }
            }
            &mut fixed[..n]
        } else {
            spilled.extend(
                self.strides
                    .iter()
                    .zip(&self.shape)
                    .filter(|(_, &d)| d > 1)
                    .map(|(&s, &d)| (s, d)),
            );
            &mut spilled
        };
        dims.sort_unstable();
        !each_steps_past(dims.iter().copied())
    }

    /// The largest element index touched plus one, or `offset` for an empty tensor; `None` on overflow.
    pub fn end_element(&self) -> Option<usize> {
        if self.numel() == 0 {
            return Some(self.offset);
        }
        let mut last = self.offset;
        for (&d, &s) in self.shape.iter().zip(&self.strides) {
            last = last.checked_add((d - 1).checked_mul(s)?)?;
        }
        last.checked_add(1)
    }

    /// The half-open element range `[start, end)` that contains every element.
    pub fn element_span(&self) -> Option<(usize, usize)> {
        Some((self.offset, self.end_element()?))
    }

    /// A sub-view: dimension `dim` restricted to `start..start + len`.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Self> {
        let d = *self.shape.get(dim).ok_or_else(|| {
            Error::shape(format!(
                "narrow: dim {dim} out of range for rank {}",
                self.rank()
            ))
        })?;
        if start.checked_add(len).is_none_or(|end| end > d) {
            return Err(Error::OutOfBounds(format!(
                "narrow: {start}..{start}+{len} exceeds dim {dim} of size {d}"
            )));
        }
        let mut out = self.clone();
        out.shape[dim] = len;
        out.offset += start * self.strides[dim];
        Ok(out)
    }

    /// Swaps two dimensions (no data moves).
    pub fn transpose(&self, a: usize, b: usize) -> Result<Self> {
        if a >= self.rank() || b >= self.rank() {
            return Err(Error::shape(format!(
                "transpose({a}, {b}) on rank {}",
                self.rank()
            )));
        }
        let mut out = self.clone();
        out.shape.swap(a, b);
        out.strides.swap(a, b);
        Ok(out)
    }

    /// Views the layout as rows of contiguous elements over the last dimension. The last
    /// dimension must have stride 1 (or size 1) and the leading dimensions must collapse to a
    /// single row stride.
    pub fn as_rows(&self) -> Result<Rows> {
        let rank = self.rank();
        if rank == 0 {
            return Err(Error::shape("a row-wise op needs at least one dimension"));
        }
        let cols = self.shape[rank - 1];
        if cols > 1 && self.strides[rank - 1] != 1 {
            return Err(Error::stride(format!(
                "the last dimension must be contiguous (stride 1), got stride {}",
                self.strides[rank - 1]
            )));
        }
        // Collapse the leading dimensions from the inside out.
        let mut rows = 1usize;
        let mut row_stride: Option<usize> = None;
        for i in (0..rank - 1).rev() {
            let (d, s) = (self.shape[i], self.strides[i]);
            if d == 1 {
                continue;
            }
            match row_stride {
                None => row_stride = Some(s),
                Some(inner) if s == inner * rows => {}
                Some(_) => {
                    return Err(Error::stride(format!(
                        "leading dimensions of shape {:?} with strides {:?} do not collapse into rows with one stride",
                        self.shape, self.strides
                    )))
                }
            }
            rows *= d;
        }
        Ok(Rows {
            rows,
            cols,
            row_stride: row_stride.unwrap_or(cols),
            offset: self.offset,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_counts_past_usize_are_caught() {
        assert_eq!(checked_numel(&[2, 3, 4]), Some(24));
        assert_eq!(checked_numel(&[]), Some(1));
        assert_eq!(checked_numel(&[usize::MAX, usize::MAX, 0]), Some(0));
        assert_eq!(checked_numel(&[usize::MAX, 1]), Some(usize::MAX));
        assert_eq!(checked_numel(&[1 << 32, 1 << 32]), None);
        assert!(Layout::strided(&[1 << 32, 1 << 32], &[0, 0], 0).is_err());
        assert_eq!(Layout::contiguous(&[1 << 32, 1 << 32]).numel(), usize::MAX);
        assert_eq!(checked_bytes(&[1 << 20, 8], 2).ok(), Some(1 << 24));
        assert!(checked_bytes(&[1 << 62], 2).is_err());
        assert!(checked_bytes(&[usize::MAX, 1], 1).is_err());
    }

    #[test]
    fn self_overlap_follows_the_strides() {
        let overlaps = |shape: &[usize], strides: &[usize]| {
            Layout::strided(shape, strides, 0)
                .unwrap()
                .overlaps_itself()
        };
        // Dense, padded, transposed and [B, N, H, D] seen as [B, H, N, D]: one-to-one.
        assert!(!overlaps(&[2, 3, 4], &[12, 4, 1]));
        assert!(!overlaps(&[3, 4], &[9, 1]));
        assert!(!overlaps(&[4, 3], &[1, 4]));
        assert!(!overlaps(&[2, 8, 5, 64], &[2560, 64, 512, 1]));
        // Size-1 and empty dimensions have no say.
        assert!(!overlaps(&[1, 4], &[0, 1]));
        assert!(!overlaps(&[0, 4], &[0, 0]));
        // Broadcast rows, rows shorter than their stride apart, and interleaved strides.
        assert!(overlaps(&[3, 4], &[0, 1]));
        assert!(overlaps(&[3, 4], &[3, 1]));
        assert!(overlaps(&[2, 3], &[1, 1]));
        assert!(overlaps(&[4, 4], &[2, 3]));
        // Every two distinct indices of small layouts, against the rule.
        for shape in [[2usize, 3], [3, 2], [2, 2], [4, 3]] {
            for s0 in 0..7 {
                for s1 in 0..7 {
                    let strides = [s0, s1];
                    let mut seen = std::collections::HashSet::new();
                    let mut one_to_one = true;
                    for i in 0..shape[0] {
                        for j in 0..shape[1] {
                            one_to_one &= seen.insert(i * s0 + j * s1);
                        }
                    }
                    // The rule may reject a one-to-one layout, never accept an overlapping one.
                    if overlaps(&shape, &strides) {
                        continue;
                    }
                    assert!(one_to_one, "{shape:?} {strides:?} passed but overlaps");
                }
            }
        }
        // Rank past 8 takes the allocating path.
        let shape = [2usize; 10];
        let dense: Vec<usize> = (0..10).rev().map(|i| 1 << i).collect();
        assert!(!overlaps(&shape, &dense));
        let mut broadcast = dense.clone();
        broadcast[3] = 0;
        assert!(overlaps(&shape, &broadcast));
    }

    #[test]
    fn contiguous_strides() {
        let l = Layout::contiguous(&[2, 3, 4]);
        assert_eq!(l.strides(), &[12, 4, 1]);
        assert!(l.is_contiguous());
        assert_eq!(l.end_element(), Some(24));
    }

    #[test]
    fn rows_of_a_narrowed_matrix_keep_the_parent_stride() {
        let l = Layout::contiguous(&[8, 10]).narrow(1, 2, 5).unwrap();
        let r = l.as_rows().unwrap();
        assert_eq!(
            r,
            Rows {
                rows: 8,
                cols: 5,
                row_stride: 10,
                offset: 2
            }
        );
        assert!(!l.is_contiguous());
    }

    #[test]
    fn rows_collapse_leading_dims() {
        let l = Layout::contiguous(&[2, 3, 4]);
        assert_eq!(
            l.as_rows().unwrap(),
            Rows {
                rows: 6,
                cols: 4,
                row_stride: 4,
                offset: 0
            }
        );
        // A narrowed middle dimension cannot collapse.
        let n = l.narrow(1, 0, 2).unwrap();
        assert!(matches!(n.as_rows(), Err(Error::Stride(_))));
    }

    #[test]
    fn transposed_last_dim_is_rejected_for_rows() {
        let l = Layout::contiguous(&[4, 6]).transpose(0, 1).unwrap();
        assert!(matches!(l.as_rows(), Err(Error::Stride(_))));
    }

    #[test]
    fn narrow_out_of_range_is_an_error() {
        let l = Layout::contiguous(&[4]);
        assert!(l.narrow(0, 3, 2).is_err());
        assert!(l.narrow(1, 0, 1).is_err());
    }
}
