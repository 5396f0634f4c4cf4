//! `calico check`: each op once on the device found, on random inputs (including sizes that
//! are not multiples of any tile), compared with the CPU backend.

use calico::ops::{self, RopeMode};
use calico::{DType, Device, Error, Result, Tensor};
use calico_benches::rng::{random_f32, XorShift};
use half::bf16;

/// Largest |device - cpu| over the largest |cpu|, per output; bf16 outputs round at 2^-8.
const TOLERANCE: f64 = 1e-2;

/// A check's inputs as host data, so both devices get the same values.
struct Input {
    data: Vec<f32>,
    shape: Vec<usize>,
    dtype: DType,
}

impl Input {
    fn new(rng: &mut XorShift, shape: &[usize], dtype: DType, lo: f32, hi: f32) -> Input {
        let n = shape.iter().product();
        Input {
            data: random_f32(rng, n, lo, hi),
            shape: shape.to_vec(),
            dtype,
        }
    }

    fn on(&self, dev: &Device) -> Result<Tensor> {
        match self.dtype {
            DType::BF16 => {
                let v: Vec<bf16> = self.data.iter().map(|&x| bf16::from_f32(x)).collect();
                dev.tensor(&v, &self.shape)
            }
            _ => dev.tensor(&self.data, &self.shape),
        }
    }
}

/// One op on one device: the inputs, the output shapes, and the call.
type OpFn = fn(&Device, &[Tensor], &mut [Tensor]) -> Result<()>;

struct Case {
    name: String,
    inputs: Vec<Input>,
    /// Output shapes (all bf16).
    outputs: Vec<Vec<usize>>,
    op: OpFn,
}

/// Runs `case` on `dev`; outputs start as NaN so an unwritten element cannot pass.
fn run_on(dev: &Device, case: &Case) -> Result<Vec<Vec<f64>>> {
    let ins = case
        .inputs
        .iter()
        .map(|i| i.on(dev))
        .collect::<Result<Vec<_>>>()?;
    let mut outs = case
        .outputs
        .iter()
        .map(|s| dev.tensor(&vec![bf16::NAN; s.iter().product()], s))
        .collect::<Result<Vec<_>>>()?;
    // Views such as W^T are made inside the op closure from the inputs.
    (case.op)(dev, &ins, &mut outs)?;
    dev.synchronize()?;
    outs.iter().map(Tensor::to_f64_vec).collect()
}

/// max |got - want| / max |want|; infinite when anything is not finite.
pub fn max_rel_error(got: &[f64], want: &[f64]) -> f64 {
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    let mut diff = 0.0f64;
    let mut scale = 0.0f64;
    for (g, w) in got.iter().zip(want) {
        if !g.is_finite() || !w.is_finite() {
            return f64::INFINITY;
        }
        diff = diff.max((g - w).abs());
        scale = scale.max(w.abs());
    }
    if scale == 0.0 {
        diff
    } else {
        diff / scale
    }
}

fn cases(rng: &mut XorShift) -> Vec<Case> {
    let bf = DType::BF16;
    let mut out = Vec::new();
    for shape in [[64usize, 4096], [37, 1027]] {
        let [rows, cols] = shape;
        let tag = format!("[{rows}, {cols}]");
        let x = |rng: &mut XorShift| Input::new(rng, &shape, bf, -2.0, 2.0);
        let w = |rng: &mut XorShift| Input::new(rng, &[cols], bf, 0.5, 1.5);
        let b = |rng: &mut XorShift| Input::new(rng, &[cols], bf, -0.5, 0.5);
        out.push(Case {
            name: format!("rms_norm {tag}"),
            inputs: vec![x(rng), w(rng)],
            outputs: vec![shape.to_vec()],
            op: |d, i, o| ops::rms_norm(d, &i[0], &i[1], 1e-6, &mut o[0]),
        });
        out.push(Case {
            name: format!("layer_norm {tag}"),
            inputs: vec![x(rng), w(rng), b(rng)],
            outputs: vec![shape.to_vec()],
            op: |d, i, o| ops::layer_norm(d, &i[0], Some(&i[1]), Some(&i[2]), 1e-5, &mut o[0]),
        });
        out.push(Case {
            name: format!("add_rms_norm {tag}"),
            inputs: vec![x(rng), x(rng), w(rng)],
            outputs: vec![shape.to_vec(), shape.to_vec()],
            op: |d, i, o| {
                let (y, sum) = o.split_at_mut(1);
                ops::add_rms_norm(d, &i[0], &i[1], &i[2], 1e-6, &mut y[0], &mut sum[0])
            },
        });
        out.push(Case {
            name: format!("add_layer_norm {tag}"),
            inputs: vec![x(rng), x(rng), w(rng), b(rng)],
            outputs: vec![shape.to_vec(), shape.to_vec()],
            op: |d, i, o| {
                let (y, sum) = o.split_at_mut(1);
                ops::add_layer_norm(
                    d,
                    &i[0],
                    &i[1],
                    Some(&i[2]),
                    Some(&i[3]),
                    1e-5,
                    &mut y[0],
                    &mut sum[0],
                )
            },
        });
        out.push(Case {
            name: format!("softmax {tag}"),
            inputs: vec![Input::new(rng, &shape, bf, -4.0, 4.0)],
            outputs: vec![shape.to_vec()],
            op: |d, i, o| ops::softmax(d, &i[0], &mut o[0]),
        });
    }
    for (shape, mode) in [
        ([2usize, 17, 3, 64], RopeMode::HalfSplit),
        ([1, 33, 5, 96], RopeMode::Interleaved),
    ] {
        let table = [shape[1], shape[3] / 2];
        out.push(Case {
            name: format!("rope {mode:?} {shape:?}"),
            inputs: vec![
                Input::new(rng, &shape, bf, -2.0, 2.0),
                Input::new(rng, &table, DType::F32, -1.0, 1.0),
                Input::new(rng, &table, DType::F32, -1.0, 1.0),
            ],
            outputs: vec![shape.to_vec()],
            op: if mode == RopeMode::HalfSplit {
                |d, i, o| ops::rope(d, &i[0], &i[1], &i[2], 0, RopeMode::HalfSplit, &mut o[0])
            } else {
                |d, i, o| ops::rope(d, &i[0], &i[1], &i[2], 0, RopeMode::Interleaved, &mut o[0])
            },
        });
    }
    for (m, n, k) in [(133usize, 91usize, 77usize), (256, 512, 384)] {
        out.push(Case {
            name: format!("matmul A[{m},{k}] W[{n},{k}]^T"),
            inputs: vec![
                Input::new(rng, &[m, k], bf, -1.0, 1.0),
                Input::new(rng, &[n, k], bf, -1.0, 1.0),
            ],
            outputs: vec![vec![m, n]],
            op: |d, i, o| ops::matmul(d, &i[0], &i[1].transpose(0, 1)?, &mut o[0]),
        });
    }
    out
}

pub fn run() -> Result<bool> {
    let dev = Device::auto()?;
    let cpu = Device::cpu();
    println!(
        "Checking {} ({}) against the CPU backend",
        dev.name(),
        dev.device_id()
    );
    if dev.as_gpu().is_none() {
        println!("(no GPU found: this compares the CPU backend with itself)");
    }
    let mut rng = XorShift::new(0x0c4e_c4ed);
    let mut failed = 0;
    let all = cases(&mut rng);
    let width = all.iter().map(|c| c.name.len()).max().unwrap_or(10);
    for case in &all {
        let verdict = match (run_on(&dev, case), run_on(&cpu, case)) {
            (Err(Error::Unsupported(msg)), _) => {
                format!("SKIP (not available: {})", first_line(&msg))
            }
            (Err(e), _) => {
                failed += 1;
                format!("FAIL (device error: {})", first_line(&e.to_string()))
            }
            (_, Err(e)) => {
                failed += 1;
                format!("FAIL (CPU error: {})", first_line(&e.to_string()))
            }
            (Ok(got), Ok(want)) => {
                let err = got
                    .iter()
                    .zip(&want)
                    .map(|(g, w)| max_rel_error(g, w))
                    .fold(0.0f64, f64::max);
                let pass = err <= TOLERANCE;
                if !pass {
                    failed += 1;
                }
                format!(
                    "max rel err {err:.2e}  {}",
                    if pass { "PASS" } else { "FAIL" }
                )
            }
        };
        println!("  {:<width$}  {verdict}", case.name);
    }
    if failed > 0 {
        println!("{failed} FAILED (tolerance {TOLERANCE:.0e} of the largest reference value)");
    } else {
        println!("all passed (tolerance {TOLERANCE:.0e} of the largest reference value)");
    }
    Ok(failed == 0)
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_error() {
        assert_eq!(max_rel_error(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!((max_rel_error(&[1.1, 2.0], &[1.0, 2.0]) - 0.05).abs() < 1e-12);
        assert_eq!(max_rel_error(&[f64::NAN], &[1.0]), f64::INFINITY);
        assert_eq!(max_rel_error(&[1.0], &[1.0, 2.0]), f64::INFINITY);
    }

    #[test]
    fn cpu_against_itself_passes() {
        let cpu = Device::cpu();
        let mut rng = XorShift::new(1);
        for case in cases(&mut rng)
            .iter()
            .filter(|c| c.name.contains("37") || c.name.contains("133"))
        {
            let a = run_on(&cpu, case).expect("runs");
            assert!(
                a.iter().flatten().all(|v| v.is_finite()),
                "{} left NaN",
                case.name
            );
        }
    }
}
