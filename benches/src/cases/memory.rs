//! Memory-bound ops: norms (plain and with a fused residual), softmax and rope, in GB/s.

use crate::accounting::{mem_bytes, MemOp};
use crate::cases::MemSpec;
use crate::report::{MemCase, Timed};
use crate::rng::{random_tensor, XorShift};
use crate::timing::{rotation_copies, time_runs, Pad, Plan};
use calico::ops::{self, RopeMode};
use calico::{DType, Device, Result, Tensor};

const EPS: f32 = 1e-6;

/// One input/output set; runs rotate among several.
struct Set {
    ins: Vec<Tensor>,
    outs: Vec<Tensor>,
}

/// Times one case (unless `skip`); errors become a "not available" or "failed" entry.
/// Odd row lengths: at least torch's speed (issue 8).
pub const ODD_TARGET_VS_TORCH: f64 = 1.0;

pub fn run_case(
    dev: &Device,
    spec: &MemSpec,
    plan: &Plan,
    pad: Option<&Pad>,
    rng: &mut XorShift,
    skip: bool,
) -> MemCase {
    let bytes = mem_bytes(spec.op, &spec.shape, 2);
    let copies = rotation_copies(bytes, dev.arch().l2_bytes);
    let copies = if *plan == Plan::TINY { 2 } else { copies };
    let calico = if skip {
        Timed::not_available("skipped")
    } else {
        match time_case(dev, spec, plan, pad, rng, copies) {
            Ok(stats) => Timed::ok(stats),
            Err(e) => Timed::from_error(&e),
        }
    };
    MemCase {
        name: spec.name(),
        op: spec.op,
        dtype: "bf16".into(),
        shape: spec.shape.clone(),
        bytes,
        rotation_copies: copies,
        calico,
        gbps: None,
        pct_of_copy: None,
        target_pct: 100.0 * spec.op.target_fraction_of_copy_on(dev.as_gpu().is_some()),
        target_vs_torch: spec.odd.then_some(ODD_TARGET_VS_TORCH),
        torch_ms: None,
        torch_gbps: None,
        speedup_vs_torch: None,
    }
}

fn time_case(
    dev: &Device,
    spec: &MemSpec,
    plan: &Plan,
    pad: Option<&Pad>,
    rng: &mut XorShift,
    copies: usize,
) -> Result<crate::stats::Stats> {
    let mut sets = Vec::with_capacity(copies);
    for _ in 0..copies {
        sets.push(make_set(dev, spec, rng)?);
    }
    let op = spec.op;
    time_runs(dev, plan, pad, &mut |i| {
        let n = sets.len();
        let set = &mut sets[i % n];
        call(dev, op, &set.ins, &mut set.outs)
    })
}

fn make_set(dev: &Device, spec: &MemSpec, rng: &mut XorShift) -> Result<Set> {
    let shape = &spec.shape;
    let cols = shape.last().copied().unwrap_or(0);
    let bf = DType::BF16;
    let mut rand = |shape: &[usize], dtype, lo, hi| random_tensor(dev, rng, shape, dtype, lo, hi);
    let (ins, n_outs) = match spec.op {
        MemOp::RmsNorm => (
            vec![rand(shape, bf, -2.0, 2.0)?, rand(&[cols], bf, 0.5, 1.5)?],
            1,
        ),
        MemOp::LayerNorm => (
            vec![
                rand(shape, bf, -2.0, 2.0)?,
                rand(&[cols], bf, 0.5, 1.5)?,
                rand(&[cols], bf, -0.5, 0.5)?,
            ],
            1,
        ),
        MemOp::AddRmsNorm => (
            vec![
                rand(shape, bf, -2.0, 2.0)?,
                rand(shape, bf, -2.0, 2.0)?,
                rand(&[cols], bf, 0.5, 1.5)?,
            ],
            2,
        ),
        MemOp::AddLayerNorm => (
            vec![
                rand(shape, bf, -2.0, 2.0)?,
                rand(shape, bf, -2.0, 2.0)?,
                rand(&[cols], bf, 0.5, 1.5)?,
                rand(&[cols], bf, -0.5, 0.5)?,
            ],
            2,
        ),
        MemOp::Softmax => (vec![rand(shape, bf, -4.0, 4.0)?], 1),
        MemOp::Rope => {
            let s = shape.get(1).copied().unwrap_or(1);
            let table = [s, cols / 2];
            (
                vec![
                    rand(shape, bf, -2.0, 2.0)?,
                    rand(&table, DType::F32, -1.0, 1.0)?,
                    rand(&table, DType::F32, -1.0, 1.0)?,
                ],
                1,
            )
        }
    };
    let outs = (0..n_outs)
        .map(|_| dev.zeros(shape, bf))
        .collect::<Result<Vec<_>>>()?;
    Ok(Set { ins, outs })
}

/// One call of `op` on one set.
fn call(dev: &Device, op: MemOp, ins: &[Tensor], outs: &mut [Tensor]) -> Result<()> {
    let (y, rest) = outs
        .split_first_mut()
        .ok_or_else(|| calico::Error::shape("no output tensor"))?;
    let sum = rest.first_mut();
    let missing = || calico::Error::shape("missing tensor in benchmark set");
    match (op, sum) {
        (MemOp::RmsNorm, _) => ops::rms_norm(dev, &ins[0], &ins[1], EPS, y),
        (MemOp::LayerNorm, _) => {
            ops::layer_norm(dev, &ins[0], Some(&ins[1]), Some(&ins[2]), EPS, y)
        }
        (MemOp::AddRmsNorm, Some(sum)) => {
            ops::add_rms_norm(dev, &ins[0], &ins[1], &ins[2], EPS, y, sum)
        }
        (MemOp::AddLayerNorm, Some(sum)) => ops::add_layer_norm(
            dev,
            &ins[0],
            &ins[1],
            Some(&ins[2]),
            Some(&ins[3]),
            EPS,
            y,
            sum,
        ),
        (MemOp::Softmax, _) => ops::softmax(dev, &ins[0], y),
        (MemOp::Rope, _) => ops::rope(dev, &ins[0], &ins[1], &ins[2], 0, RopeMode::HalfSplit, y),
        (MemOp::AddRmsNorm | MemOp::AddLayerNorm, None) => Err(missing()),
    }
}
