//! rope, interleaved and half-split, against the f64 reference.

use calico::ops::{self, RopeMode};
use calico::{DType, Device};
use calico_conformance::compare::{check_close, elementwise_tol};
use calico_conformance::reference;
use calico_conformance::rng::{Dist, Rng};
use calico_conformance::strategies::{dist, dtype};
use calico_conformance::tensors::{intact, round_all, untouched_outside, view, write, View};
use calico_conformance::{property, Ctx};
use proptest::prelude::*;
use proptest::sample::select;

/// Where a [B, S, H, D] tensor sits: padding after each head and each token, heads stored
/// outside tokens ([B, H, S, D] memory, as after a transpose), and an element offset.
#[derive(Debug, Clone, Copy)]
struct Memory {
    head_pad: usize,
    token_pad: usize,
    heads_outer: bool,
    offset: usize,
}

fn memory() -> impl Strategy<Value = Memory> {
    prop_oneof![
        Just(Memory {
            head_pad: 0,
            token_pad: 0,
            heads_outer: false,
            offset: 0
        }),
        (0usize..=9, 0usize..=9, any::<bool>(), 0usize..=3).prop_map(
            |(head_pad, token_pad, heads_outer, offset)| {
                Memory {
                    head_pad,
                    token_pad,
                    heads_outer,
                    offset,
                }
            }
        ),
    ]
}

#[derive(Debug, Clone)]
struct RopeCase {
    dtype: DType,
    /// None: a rank-3 [S, H, D] tensor.
    batch: Option<usize>,
    seq: usize,
    heads: usize,
    dim: usize,
    mode: RopeMode,
    pos_offset: usize,
    extra_positions: usize,
    /// Element offset of cos/sin in their buffers (1 leaves them 4-byte aligned only).
    table_offset: usize,
    x_at: Memory,
    y_at: Memory,
    dist: Dist,
    seed: u64,
}

fn rope_case() -> impl Strategy<Value = RopeCase> {
    let mode = select(vec![RopeMode::Interleaved, RopeMode::HalfSplit]);
    let dim = select(vec![2usize, 4, 6, 8, 10, 16, 30, 64, 66, 96, 128, 130, 256]);
    (
        (
            dtype(),
            prop::option::of(1usize..=3),
            1usize..=40,
            1usize..=8,
            dim,
            mode,
        ),
        (
            0usize..=50,
            0usize..=4,
            0usize..=1,
            memory(),
            memory(),
            dist(),
            any::<u64>(),
        ),
    )
        .prop_map(
            |(
                (dtype, batch, seq, heads, dim, mode),
                (pos_offset, extra_positions, table_offset, x_at, y_at, dist, seed),
            )| {
                RopeCase {
                    dtype,
                    batch,
                    seq,
                    heads,
                    dim,
                    mode,
                    pos_offset,
                    extra_positions,
                    table_offset,
                    x_at,
                    y_at,
                    dist,
                    seed,
                }
            },
        )
}

impl RopeCase {
    fn shape(&self) -> Vec<usize> {
        let mut s = vec![self.seq, self.heads, self.dim];
        if let Some(b) = self.batch {
            s.insert(0, b);
        }
        s
    }

    /// Strides of `shape()` laid out as `m` says.
    fn strides(&self, m: Memory) -> Vec<usize> {
        let (s, h, d) = (self.seq, self.heads, self.dim);
        let (token, head, batch) = if m.heads_outer {
            let token = d + m.token_pad;
            let head = s * token + m.head_pad;
            (token, head, h * head)
        } else {
            let head = d + m.head_pad;
            let token = h * head + m.token_pad;
            (token, head, s * token)
        };
        match self.batch {
            Some(_) => vec![batch, token, head, 1],
            None => vec![token, head, 1],
        }
    }
}

/// cos/sin tables of real rotary angles, f32, [P, D/2] at an element offset in their buffer.
fn table(
    dev: &Device,
    values: &[f64],
    rows: usize,
    half: usize,
    offset: usize,
) -> Result<View, String> {
    let t =
        view(dev, DType::F32, &[rows, half], &[half, 1], offset, None).ctx("allocating a table")?;
    write(&t.view, values).ctx("writing a table")?;
    Ok(t)
}

fn run_rope(dev: &Device, c: &RopeCase) -> Result<(), String> {
    let (dt, half) = (c.dtype, c.dim / 2);
    let shape = c.shape();
    let n: usize = shape.iter().product();
    let mut rng = Rng::new(c.seed);
    let x = round_all(dt, &c.dist.sample(&mut rng, n));
    let positions = c.pos_offset + c.seq + c.extra_positions;
    let angle = |p: usize, i: usize| p as f64 * 10000f64.powf(-2.0 * i as f64 / c.dim as f64);
    let cos: Vec<f64> = (0..positions * half)
        .map(|j| (angle(j / half, j % half).cos() as f32) as f64)
        .collect();
    let sin: Vec<f64> = (0..positions * half)
        .map(|j| (angle(j / half, j % half).sin() as f32) as f64)
        .collect();

    let xv = view(dev, dt, &shape, &c.strides(c.x_at), c.x_at.offset, None).ctx("allocating x")?;
    write(&xv.view, &x).ctx("writing x")?;
    let mut y = view(
        dev,
        dt,
        &shape,
        &c.strides(c.y_at),
        c.y_at.offset,
        Some(f64::NAN),
    )
    .ctx("allocating y")?;
    let cv = table(dev, &cos, positions, half, c.table_offset)?;
    let sv = table(dev, &sin, positions, half, c.table_offset)?;
    ops::rope(
        dev,
        &xv.view,
        &cv.view,
        &sv.view,
        c.pos_offset,
        c.mode,
        &mut y.view,
    )
    .ctx("rope")?;

    let bshd = [c.batch.unwrap_or(1), c.seq, c.heads, c.dim];
    let want = reference::rope(&x, bshd, &cos, &sin, c.pos_offset, c.mode);
    let got = y.view.to_f64_vec().ctx("reading y")?;
    check_close("y", &got, &want, elementwise_tol(dt))?;
    untouched_outside(&y, "y")?;
    intact(&xv, &x, "x")
}

#[test]
fn rope_matches_reference() {
    property("rope", 32, rope_case(), run_rope);
}

/// Every head dimension of the strategy in both modes and all dtypes, dense, with a
/// position offset: the sizes a random draw might miss.
#[test]
fn rope_at_every_head_dim() {
    calico_conformance::report_skipped("rope_at_every_head_dim");
    let dense = Memory {
        head_pad: 0,
        token_pad: 0,
        heads_outer: false,
        offset: 0,
    };
    let odd = Memory {
        head_pad: 1,
        token_pad: 3,
        heads_outer: true,
        offset: 1,
    };
    for dev in calico_conformance::backends().0 {
        for dim in [2, 4, 6, 8, 10, 16, 30, 64, 66, 96, 128, 130, 256] {
            for dtype in [DType::BF16, DType::F16, DType::F32] {
                for (k, mode) in [RopeMode::Interleaved, RopeMode::HalfSplit]
                    .into_iter()
                    .enumerate()
                {
                    let c = RopeCase {
                        dtype,
                        batch: Some(2),
                        seq: 5,
                        heads: 3,
                        dim,
                        mode,
                        pos_offset: 7,
                        extra_positions: 0,
                        table_offset: 0,
                        x_at: if k == 0 { dense } else { odd },
                        y_at: if k == 0 { odd } else { dense },
                        dist: Dist::Normal { scale: 1.0 },
                        seed: dim as u64,
                    };
                    if let Err(e) = run_rope(&dev, &c) {
                        panic!("backend {}: rope {mode:?} {dtype} D={dim}: {e}", dev.kind());
                    }
                }
            }
        }
    }
}

/// x, y and the cos/sin tables ending exactly at the end of their allocation: dense (the
/// allocation is exactly the tensor), or heads padded to 16-byte pieces at the tail of a
/// larger allocation, for small and vector-sized head dims, so a vector access past the last
/// element leaves the allocation (compute-sanitizer memcheck reports it:
/// benches/gpu/sanitize.sh).
#[test]
fn rope_tensors_end_at_the_allocation() {
    calico_conformance::report_skipped("rope_tensors_end_at_the_allocation");
    for dev in calico_conformance::backends().0 {
        for dim in [2usize, 4, 6, 8, 10, 16, 18, 32, 64, 128] {
            for dtype in [DType::BF16, DType::F16, DType::F32] {
                let per_16_bytes = 16 / dtype.size_bytes();
                let dense = Memory {
                    head_pad: 0,
                    token_pad: 0,
                    heads_outer: false,
                    offset: 0,
                };
                let tail = Memory {
                    head_pad: (per_16_bytes - dim % per_16_bytes) % per_16_bytes,
                    token_pad: 0,
                    heads_outer: false,
                    offset: per_16_bytes,
                };
                for mode in [RopeMode::Interleaved, RopeMode::HalfSplit] {
                    for (x_at, y_at, table_offset) in [(dense, dense, 0), (tail, tail, 4)] {
                        let c = RopeCase {
                            dtype,
                            batch: None,
                            seq: 3,
                            heads: 2,
                            dim,
                            mode,
                            pos_offset: 1,
                            extra_positions: 0,
                            table_offset,
                            x_at,
                            y_at,
                            dist: Dist::Normal { scale: 1.0 },
                            seed: dim as u64,
                        };
                        if let Err(e) = run_rope(&dev, &c) {
                            panic!(
                                "backend {}: rope {mode:?} {dtype} D={dim} {x_at:?}: {e}",
                                dev.kind()
                            );
                        }
                    }
                }
            }
        }
    }
}
