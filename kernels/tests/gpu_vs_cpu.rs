//! Every op on each GPU backend present, against the CPU backend on the same random inputs.
//! (The f64-reference property suite lives in calico-conformance; this is the quick
//! cross-backend check, and it names the GPU backends it had to skip.)

use calico::ops::{self, RopeMode};
use calico::{BackendKind, DType, Device, Tensor};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }
}

fn gpus() -> Vec<Device> {
    let mut out = Vec::new();
    for kind in [BackendKind::Cuda, BackendKind::Hip] {
        match Device::open(kind, 0) {
            Ok(d) => out.push(d),
            Err(e) => println!("skipped backend {kind}: {e}"),
        }
    }
    out
}

/// The same random values as a tensor on `dev` (rounded to `dtype`).
fn random(dev: &Device, shape: &[usize], dtype: DType, seed: u64) -> Tensor {
    let mut rng = Rng(seed | 1);
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|_| rng.next() * 3.0).collect();
    match dtype {
        DType::BF16 => dev.tensor(
            &v.iter()
                .map(|&x| half::bf16::from_f64(x))
                .collect::<Vec<_>>(),
            shape,
        ),
        DType::F16 => dev.tensor(
            &v.iter()
                .map(|&x| half::f16::from_f64(x))
                .collect::<Vec<_>>(),
            shape,
        ),
        _ => dev.tensor(&v.iter().map(|&x| x as f32).collect::<Vec<_>>(), shape),
    }
    .unwrap()
}

fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 2e-2,
        DType::F16 => 3e-3,
        _ => 2e-5,
    }
}

fn assert_close(what: &str, got: &Tensor, want: &Tensor, dtype: DType) {
    let (g, w) = (got.to_f64_vec().unwrap(), want.to_f64_vec().unwrap());
    let scale = w.iter().fold(1e-30f64, |m, x| m.max(x.abs()));
    let err = g
        .iter()
        .zip(&w)
        .map(|(a, b)| (a - b).abs())
        .fold(
            0.0f64,
            |m, e| if e.is_nan() { f64::INFINITY } else { m.max(e) },
        )
        / scale;
    assert!(
        err <= tolerance(dtype),
        "{what}: max error {err:e} relative to max |ref| (tolerance {:e})",
        tolerance(dtype)
    );
}

#[test]
fn row_ops_match_the_cpu_backend() {
    let cpu = Device::cpu();
    for gpu in gpus() {
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            for &(rows, cols) in &[
                (1usize, 1usize),
                (3, 7),
                (64, 4096),
                (5, 1000),
                (2, 70000),
                (33, 4097),
            ] {
                let what = format!("{} {dtype} {rows}x{cols}", gpu.kind());
                let seed = (rows * 1000 + cols) as u64;
                let on = |d: &Device| {
                    let x = random(d, &[rows, cols], dtype, seed);
                    let r = random(d, &[rows, cols], dtype, seed + 1);
                    let w = random(d, &[cols], dtype, seed + 2);
                    let b = random(d, &[cols], dtype, seed + 3);
                    let mut outs: Vec<Tensor> = (0..6)
                        .map(|_| d.zeros(&[rows, cols], dtype).unwrap())
                        .collect();
                    let [y1, y2, y3, s3, y4, s4] = &mut outs[..] else {
                        unreachable!()
                    };
                    ops::rms_norm(d, &x, &w, 1e-5, y1).unwrap();
                    ops::layer_norm(d, &x, Some(&w), Some(&b), 1e-5, y2).unwrap();
                    ops::add_rms_norm(d, &x, &r, &w, 1e-5, y3, s3).unwrap();
                    ops::add_layer_norm(d, &x, &r, Some(&w), None, 1e-5, y4, s4).unwrap();
                    let mut sm = d.zeros(&[rows, cols], dtype).unwrap();
                    ops::softmax(d, &x, &mut sm).unwrap();
                    outs.push(sm);
                    outs
                };
                let (g, c) = (on(&gpu), on(&cpu));
                for (i, name) in [
                    "rms_norm",
                    "layer_norm",
                    "add_rms_norm",
                    "sum",
                    "add_layer_norm",
                    "sum",
                    "softmax",
                ]
                .iter()
                .enumerate()
                {
                    assert_close(&format!("{what} {name}"), &g[i], &c[i], dtype);
                }
            }
        }
    }
}

#[test]
fn strided_rows_match_the_cpu_backend() {
    let cpu = Device::cpu();
    for gpu in gpus() {
        // Rows of 300 inside a parent of width 301, starting at column 1: nothing is 16-byte aligned.
        let on = |d: &Device| {
            let parent = random(d, &[40, 301], DType::BF16, 99);
            let x = parent.narrow(1, 1, 300).unwrap();
            let w = random(d, &[300], DType::BF16, 98);
            let out_parent = d.zeros(&[40, 301], DType::BF16).unwrap();
            let mut y = out_parent.narrow(1, 0, 300).unwrap();
            ops::rms_norm(d, &x, &w, 1e-6, &mut y).unwrap();
            y
        };
        assert_close("strided rms_norm", &on(&gpu), &on(&cpu), DType::BF16);
    }
}

#[test]
fn rope_matches_the_cpu_backend() {
    let cpu = Device::cpu();
    for gpu in gpus() {
        for dtype in [DType::BF16, DType::F32] {
            for mode in [RopeMode::HalfSplit, RopeMode::Interleaved] {
                for &(b, s, h, dim) in &[
                    (2usize, 5usize, 3usize, 128usize),
                    (1, 7, 2, 6),
                    (1, 3, 1, 2),
                ] {
                    let on = |d: &Device| {
                        let x = random(d, &[b, s, h, dim], dtype, 7);
                        let cos = random(d, &[s + 4, dim / 2], DType::F32, 8);
                        let sin = random(d, &[s + 4, dim / 2], DType::F32, 9);
                        let mut y = d.zeros(&[b, s, h, dim], dtype).unwrap();
                        ops::rope(d, &x, &cos, &sin, 3, mode, &mut y).unwrap();
                        y
                    };
                    assert_close(
                        &format!("rope {dtype} {mode:?} {b}x{s}x{h}x{dim}"),
                        &on(&gpu),
                        &on(&cpu),
                        dtype,
                    );
                }
            }
        }
    }
}

#[test]
fn gemm_matches_the_cpu_backend() {
    let cpu = Device::cpu();
    for gpu in gpus() {
        for &(m, n, k) in &[
            (1usize, 1usize, 1usize),
            (7, 33, 65),
            (128, 256, 64),
            (300, 129, 257),
            (1024, 1024, 1024),
        ] {
            for weight_layout in [false, true] {
                let on = |d: &Device| {
                    let a = random(d, &[m, k], DType::BF16, 11);
                    let b = if weight_layout {
                        random(d, &[n, k], DType::BF16, 12).transpose(0, 1).unwrap()
                    } else {
                        random(d, &[k, n], DType::BF16, 12)
                    };
                    let mut out = d.zeros(&[m, n], DType::BF16).unwrap();
                    ops::matmul(d, &a, &b, &mut out).unwrap();
                    out
                };
                assert_close(
                    &format!("gemm {m}x{n}x{k} weight_layout={weight_layout}"),
                    &on(&gpu),
                    &on(&cpu),
                    DType::BF16,
                );
            }
        }
    }
}
