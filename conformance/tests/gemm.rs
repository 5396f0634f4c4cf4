//! gemm and matmul against the f64 reference: any M, N, K, batches, row- and column-major
//! operands, alpha/beta/C (also in place), bias and epilogues, every dtype pairing.
//! An `Err` (including `Unsupported`) from a backend fails the test on that backend.

use calico::ops::{self, GemmOptions};
use calico::{DType, Device, Epilogue};
use calico_conformance::compare::{check_close, check_normwise, gemm_tol};
use calico_conformance::reference::Gemm;
use calico_conformance::rng::{Dist, Rng};
use calico_conformance::tensors::{
    intact, matrix, round_all, untouched_outside, MatrixMemory, View,
};
use calico_conformance::{backends, property, report_skipped, Ctx};
use proptest::prelude::*;
use proptest::sample::select;

/// Sizes either side of the common tile edges (16, 32, 64, 128, 256).
const EDGES: [usize; 19] = [
    1, 2, 3, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 300,
];

/// Multiply-adds per property case: keeps a debug build of the CPU backend fast.
const MAC_BUDGET: usize = 3_000_000;

/// Where C comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CMode {
    None,
    /// Its own tensor; with beta == 0 it is filled with NaN, which must not be read.
    Separate,
    /// D itself (an in-place update), pre-filled with C's values.
    InPlace,
}

#[derive(Debug, Clone)]
struct GemmCase {
    in_dtype: DType,
    out_dtype: DType,
    /// None: rank-2 operands.
    batch: Option<usize>,
    m: usize,
    n: usize,
    k: usize,
    a_mem: MatrixMemory,
    b_mem: MatrixMemory,
    c_mem: MatrixMemory,
    d_mem: MatrixMemory,
    alpha: f32,
    beta: f32,
    c_mode: CMode,
    bias: bool,
    epilogue: Epilogue,
    seed: u64,
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![1usize..=300, select(EDGES.to_vec())]
}

/// Mostly dense row-major; column-major, padded or offset views otherwise.
fn memory(col_major_weight: u32) -> impl Strategy<Value = MatrixMemory> {
    (
        prop::bool::weighted(col_major_weight as f64 / 100.0),
        prop_oneof![2 => Just(0usize), 1 => 1usize..=9],
        prop_oneof![3 => Just(0usize), 1 => 1usize..=3],
    )
        .prop_map(|(col_major, pad, offset)| MatrixMemory {
            col_major,
            pad,
            offset,
        })
}

fn gemm_case() -> impl Strategy<Value = GemmCase> {
    let dtypes = (
        select(vec![DType::BF16, DType::F16]),
        select(vec![DType::BF16, DType::F16, DType::F32]),
    );
    let shape = (prop::option::of(1usize..=3), size(), size(), size());
    let mems = (memory(50), memory(50), memory(20), memory(15));
    let scalars = (
        select(vec![1.0f32, 0.5, -1.25, 2.0]),
        select(vec![0.0f32, 0.0, 1.0, -0.5]),
        select(vec![CMode::None, CMode::Separate, CMode::InPlace]),
        any::<bool>(),
        select(vec![Epilogue::None, Epilogue::Gelu, Epilogue::Silu]),
    );
    (dtypes, shape, mems, scalars, any::<u64>()).prop_map(
        |(
            (in_dtype, out_dtype),
            (batch, m, n, k),
            (a_mem, b_mem, c_mem, d_mem),
            (alpha, beta, c_mode, bias, epilogue),
            seed,
        )| {
            let (mut m, mut n, mut k) = (m, n, k);
            // Halve the largest dimension until the case fits the budget.
            while batch.unwrap_or(1) * m * n * k > MAC_BUDGET {
                let largest = m.max(n).max(k);
                if m == largest {
                    m = m.div_ceil(2)
                } else if n == largest {
                    n = n.div_ceil(2)
                } else {
                    k = k.div_ceil(2)
                }
            }
            let c_mode = match (c_mode, beta != 0.0) {
                (CMode::None, true) => CMode::Separate,
                (CMode::InPlace, false) => CMode::Separate,
                (mode, _) => mode,
            };
            GemmCase {
                in_dtype,
                out_dtype,
                batch,
                m,
                n,
                k,
                a_mem,
                b_mem,
                c_mem,
                d_mem,
                alpha,
                beta,
                c_mode,
                bias,
                epilogue,
                seed,
            }
        },
    )
}

/// Host values and device operands of one case.
struct Operands {
    a: Vec<f64>,
    b: Vec<f64>,
    c: Vec<f64>,
    bias: Vec<f64>,
    av: View,
    bv: View,
    cv: Option<View>,
    dv: View,
    bias_t: Option<calico::Tensor>,
}

fn operands(dev: &Device, g: &GemmCase) -> Result<Operands, String> {
    let (bt, m, n, k) = (g.batch.unwrap_or(1), g.m, g.n, g.k);
    let mut rng = Rng::new(g.seed);
    let unit = Dist::Uniform { scale: 1.0 };
    let a = round_all(g.in_dtype, &unit.sample(&mut rng, bt * m * k));
    let b = round_all(g.in_dtype, &unit.sample(&mut rng, bt * k * n));
    let c = round_all(g.out_dtype, &unit.sample(&mut rng, bt * m * n));
    let bias = round_all(g.out_dtype, &unit.sample(&mut rng, n));
    let av = matrix(dev, g.in_dtype, g.batch, m, k, g.a_mem, Some(&a)).ctx("allocating a")?;
    let bv = matrix(dev, g.in_dtype, g.batch, k, n, g.b_mem, Some(&b)).ctx("allocating b")?;
    let (dv, cv) = match g.c_mode {
        CMode::None => (
            matrix(dev, g.out_dtype, g.batch, m, n, g.d_mem, None).ctx("allocating d")?,
            None,
        ),
        CMode::InPlace => {
            let d =
                matrix(dev, g.out_dtype, g.batch, m, n, g.d_mem, Some(&c)).ctx("allocating d")?;
            (d.clone(), Some(d))
        }
        CMode::Separate => {
            let c_values = (g.beta != 0.0).then_some(&c[..]);
            let cv =
                matrix(dev, g.out_dtype, g.batch, m, n, g.c_mem, c_values).ctx("allocating c")?;
            (
                matrix(dev, g.out_dtype, g.batch, m, n, g.d_mem, None).ctx("allocating d")?,
                Some(cv),
            )
        }
    };
    let bias_t = if g.bias {
        Some(
            calico_conformance::tensors::upload(dev, g.out_dtype, &[n], &bias)
                .ctx("allocating bias")?,
        )
    } else {
        None
    };
    Ok(Operands {
        a,
        b,
        c,
        bias,
        av,
        bv,
        cv,
        dv,
        bias_t,
    })
}

fn run_gemm(dev: &Device, g: &GemmCase, via_matmul: bool) -> Result<(), String> {
    let mut o = operands(dev, g)?;
    let what = format!(
        "gemm {}x{}x{} {}->{}",
        g.m, g.n, g.k, g.in_dtype, g.out_dtype
    );
    if via_matmul {
        ops::matmul(dev, &o.av.view, &o.bv.view, &mut o.dv.view).ctx(&what)?;
    } else {
        let c_view = o.cv.as_ref().map(|c| c.view.clone());
        let opts = GemmOptions {
            alpha: g.alpha,
            beta: g.beta,
            c: c_view.as_ref(),
            bias: o.bias_t.as_ref(),
            epilogue: g.epilogue,
        };
        ops::gemm(dev, &o.av.view, &o.bv.view, &mut o.dv.view, &opts).ctx(&what)?;
    }
    let reference = Gemm {
        batch: g.batch.unwrap_or(1),
        m: g.m,
        n: g.n,
        k: g.k,
        a: &o.a,
        b: &o.b,
        c: (g.beta != 0.0).then_some(&o.c[..]),
        bias: g.bias.then_some(&o.bias[..]),
        alpha: g.alpha as f64,
        beta: g.beta as f64,
        epilogue: g.epilogue,
    };
    let want = reference.all();
    let got = o.dv.view.to_f64_vec().ctx("reading d")?;
    let (normwise, elementwise) = gemm_tol(g.out_dtype);
    check_normwise("d", &got, &want, normwise)?;
    check_close("d", &got, &want, elementwise)?;
    untouched_outside(&o.dv, "d")?;
    intact(&o.av, &o.a, "a")?;
    intact(&o.bv, &o.b, "b")
}

#[test]
fn gemm_matches_reference() {
    property("gemm", 24, gemm_case(), |dev, g| run_gemm(dev, g, false));
}

#[test]
fn matmul_matches_reference() {
    let plain = gemm_case().prop_map(|g| GemmCase {
        alpha: 1.0,
        beta: 0.0,
        c_mode: CMode::None,
        bias: false,
        epilogue: Epilogue::None,
        ..g
    });
    property("matmul", 12, plain, |dev, g| run_gemm(dev, g, true));
}

/// Sizes that cross tile edges in every dimension, each dtype pairing, both operand orders.
#[test]
fn gemm_tile_crossing_sizes() {
    report_skipped("gemm_tile_crossing_sizes");
    let shapes = [
        (129, 257, 65),
        (257, 129, 33),
        (1, 257, 129),
        (127, 1, 17),
        (65, 63, 300),
        (128, 128, 128),
    ];
    for dev in backends().0 {
        for (i, &(m, n, k)) in shapes.iter().enumerate() {
            for in_dtype in [DType::BF16, DType::F16] {
                for out_dtype in [DType::BF16, DType::F16, DType::F32] {
                    let g = GemmCase {
                        in_dtype,
                        out_dtype,
                        batch: (i % 2 == 1).then_some(2),
                        m,
                        n,
                        k,
                        a_mem: MatrixMemory {
                            col_major: i % 3 == 1,
                            ..Default::default()
                        },
                        b_mem: MatrixMemory {
                            col_major: i % 3 != 0,
                            ..Default::default()
                        },
                        c_mem: MatrixMemory::default(),
                        d_mem: MatrixMemory::default(),
                        alpha: 1.0,
                        beta: if i % 2 == 0 { 1.0 } else { 0.0 },
                        c_mode: if i % 2 == 0 {
                            CMode::Separate
                        } else {
                            CMode::None
                        },
                        bias: i % 3 == 2,
                        epilogue: [Epilogue::None, Epilogue::Gelu, Epilogue::Silu][i % 3],
                        seed: i as u64,
                    };
                    if let Err(e) = run_gemm(&dev, &g, false) {
                        panic!("backend {}: {g:?}: {e}", dev.kind());
                    }
                }
            }
        }
    }
}
