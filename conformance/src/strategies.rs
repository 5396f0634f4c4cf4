//! Proptest strategies shared by the test files.

use crate::rng::Dist;
use crate::tensors::Placement;
use calico::DType;
use proptest::prelude::*;
use proptest::sample::select;

/// Row lengths around every tile, vector and block boundary, and past the GPU streaming
/// threshold (~64K bf16 columns).
pub const EDGE_COLS: [usize; 10] = [1, 2, 3, 7, 17, 127, 1000, 4097, 16384, 70_000];

/// Elements per row-op case: keeps a debug build of the CPU backend fast.
pub const ROW_BUDGET: usize = 150_000;

pub fn dtype() -> impl Strategy<Value = DType> {
    select(vec![DType::BF16, DType::F16, DType::F32])
}

pub fn cols() -> impl Strategy<Value = usize> {
    prop_oneof![3 => select(EDGE_COLS.to_vec()), 2 => 1usize..=5000]
}

/// Dense, or inside a wider parent (row padding) at an element offset; odd offsets and
/// paddings break 16-byte alignment.
pub fn placement() -> impl Strategy<Value = Placement> {
    prop_oneof![
        1 => Just(Placement::default()),
        1 => (0usize..=33, 0usize..=5).prop_map(|(pad, offset)| Placement { pad, offset }),
    ]
}

pub fn dist() -> impl Strategy<Value = Dist> {
    prop_oneof![
        (0.1f64..4.0).prop_map(|scale| Dist::Uniform { scale }),
        (0.1f64..4.0).prop_map(|scale| Dist::Normal { scale }),
        (-4.0f64..4.0).prop_map(|shift| Dist::Shifted { shift }),
    ]
}

/// One row-op problem: shape `[lead.., cols]`, where the input and outputs sit, and values.
#[derive(Debug, Clone)]
pub struct RowCase {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub x_at: Placement,
    pub out_at: Placement,
    pub dist: Dist,
    pub seed: u64,
}

impl RowCase {
    pub fn cols(&self) -> usize {
        *self.shape.last().expect("rank >= 1")
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Leading dims: a row count in 1..=300 (cut to the element budget), as one dim, two dims
/// (which must collapse to one row stride), or none at all (a single 1-D row).
pub fn row_case() -> impl Strategy<Value = RowCase> {
    (
        dtype(),
        cols(),
        1usize..=300,
        0u8..3,
        placement(),
        placement(),
        dist(),
        any::<u64>(),
    )
        .prop_map(|(dtype, cols, rows, form, x_at, out_at, dist, seed)| {
            let rows = rows.min((ROW_BUDGET / cols).max(1));
            let shape = match form {
                0 if rows == 1 => vec![cols],
                1 if rows % 2 == 0 => vec![2, rows / 2, cols],
                _ => vec![rows, cols],
            };
            RowCase {
                dtype,
                shape,
                x_at,
                out_at,
                dist,
                seed,
            }
        })
}
