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
const MAC_BUDGET: usize = 8_000_000;

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

/// Runs the case; returns the operands and D as read back.
fn execute(dev: &Device, g: &GemmCase, via_matmul: bool) -> Result<(Operands, Vec<f64>), String> {
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
    let got = o.dv.view.to_f64_vec().ctx("reading d")?;
    Ok((o, got))
}

fn reference<'a>(g: &GemmCase, o: &'a Operands) -> Gemm<'a> {
    Gemm {
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
    }
}

/// Every element of D against the reference, and nothing written outside D.
fn run_gemm(dev: &Device, g: &GemmCase, via_matmul: bool) -> Result<(), String> {
    let (o, got) = execute(dev, g, via_matmul)?;
    let want = reference(g, &o).all();
    let (normwise, elementwise) = gemm_tol(g.out_dtype);
    check_normwise("d", &got, &want, normwise)?;
    check_close("d", &got, &want, elementwise)?;
    untouched_outside(&o.dv, "d")?;
    intact(&o.av, &o.a, "a")?;
    intact(&o.bv, &o.b, "b")
}

/// Large problems: every element must be written (D starts as NaN), and the first and last
/// rows and columns of every batch plus random elements must match the reference (a full
/// f64 reference would cost ~10^10 multiply-adds).
fn run_gemm_sampled(dev: &Device, g: &GemmCase) -> Result<(), String> {
    let (o, got) = execute(dev, g, false)?;
    if let Some(i) = got.iter().position(|v| !v.is_finite()) {
        return Err(format!("d[{i}] is {} (never written?)", got[i]));
    }
    let r = reference(g, &o);
    let (bt, m, n) = (g.batch.unwrap_or(1), g.m, g.n);
    let mut at: Vec<(usize, usize, usize)> = Vec::new();
    for q in 0..bt {
        at.extend((0..n).flat_map(|j| [(q, 0, j), (q, m - 1, j)]));
        at.extend((0..m).flat_map(|i| [(q, i, 0), (q, i, n - 1)]));
    }
    let mut rng = Rng::new(g.seed ^ 0x5a5a);
    at.extend((0..4096).map(|_| (rng.below(bt), rng.below(m), rng.below(n))));
    let want: Vec<f64> = at.iter().map(|&(q, i, j)| r.at(q, i, j)).collect();
    let got: Vec<f64> = at
        .iter()
        .map(|&(q, i, j)| got[(q * m + i) * n + j])
        .collect();
    let (normwise, elementwise) = gemm_tol(g.out_dtype);
    check_normwise("d (sampled)", &got, &want, normwise)?;
    check_close("d (sampled)", &got, &want, elementwise)
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

/// GPU-sized problems (up to 2048 per dimension), on GPU backends only: the CPU is covered by
/// the properties above and would take minutes in a debug build.
#[test]
fn gemm_large_on_gpu() {
    report_skipped("gemm_large_on_gpu");
    let gpus: Vec<Device> = backends()
        .0
        .into_iter()
        .filter(|d| d.kind() != calico::BackendKind::Cpu)
        .collect();
    if gpus.is_empty() {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "[gemm_large_on_gpu] no GPU backend present: large GEMM checks not run"
        );
        return;
    }
    let row = MatrixMemory::default();
    let col = MatrixMemory {
        col_major: true,
        ..row
    };
    let base = GemmCase {
        in_dtype: DType::BF16,
        out_dtype: DType::BF16,
        batch: None,
        m: 1024,
        n: 1024,
        k: 1024,
        a_mem: row,
        b_mem: row,
        c_mem: row,
        d_mem: row,
        alpha: 1.0,
        beta: 0.0,
        c_mode: CMode::None,
        bias: false,
        epilogue: Epilogue::None,
        seed: 1,
    };
    let cases = [
        base.clone(),
        GemmCase {
            in_dtype: DType::F16,
            out_dtype: DType::F32,
            m: 2048,
            n: 1024,
            k: 512,
            alpha: 0.5,
            beta: 1.0,
            c_mode: CMode::Separate,
            bias: true,
            epilogue: Epilogue::Gelu,
            seed: 2,
            ..base.clone()
        },
        GemmCase {
            out_dtype: DType::F32,
            batch: Some(2),
            m: 768,
            n: 1536,
            k: 1024,
            b_mem: col,
            seed: 3,
            ..base.clone()
        },
        GemmCase {
            in_dtype: DType::F16,
            out_dtype: DType::F16,
            m: 1000,
            n: 1000,
            k: 1000,
            a_mem: col,
            bias: true,
            seed: 4,
            ..base.clone()
        },
        GemmCase {
            m: 2048,
            n: 2048,
            k: 2048,
            beta: -0.5,
            c_mode: CMode::InPlace,
            epilogue: Epilogue::Silu,
            seed: 5,
            ..base.clone()
        },
        // Small M with a long K and narrow N: routed to the skinny split-K kernel (47 k-tiles
        // do not divide evenly); a batched N-major case and M = 128 take the Hopper kernel with
        // its 16-stage ring for small tiles.
        GemmCase {
            m: 64,
            n: 1000,
            k: 3000,
            beta: 1.0,
            c_mode: CMode::InPlace,
            bias: true,
            epilogue: Epilogue::Gelu,
            seed: 6,
            ..base.clone()
        },
        GemmCase {
            in_dtype: DType::F16,
            out_dtype: DType::F32,
            batch: Some(2),
            m: 48,
            n: 512,
            k: 4096,
            b_mem: col,
            alpha: 0.5,
            seed: 7,
            ..base.clone()
        },
        GemmCase {
            in_dtype: DType::F16,
            out_dtype: DType::F16,
            m: 128,
            n: 1024,
            k: 2048,
            bias: true,
            epilogue: Epilogue::Silu,
            seed: 8,
            ..base.clone()
        },
        // Several tiles per CTA with the TMA-store epilogue (one k-tile per tile in the first
        // case): staging boxes reused across tiles.
        GemmCase {
            m: 4096,
            n: 2048,
            k: 64,
            seed: 9,
            ..base.clone()
        },
        GemmCase {
            in_dtype: DType::F16,
            out_dtype: DType::F16,
            m: 3000,
            n: 4096,
            k: 200,
            bias: true,
            beta: 1.0,
            c_mode: CMode::Separate,
            seed: 10,
            ..base.clone()
        },
    ];
    for dev in gpus {
        for g in &cases {
            if let Err(e) = run_gemm_sampled(&dev, g) {
                panic!("backend {}: {g:?}: {e}", dev.kind());
            }
        }
    }
}

/// The sampled check of `gemm_large_on_gpu`, on a problem small enough for every backend (so
/// it is exercised even where no GPU is present).
#[test]
fn sampled_check_agrees_on_moderate_problem() {
    report_skipped("sampled_check_agrees_on_moderate_problem");
    let g = GemmCase {
        in_dtype: DType::BF16,
        out_dtype: DType::F32,
        batch: Some(2),
        m: 200,
        n: 130,
        k: 70,
        a_mem: MatrixMemory::default(),
        b_mem: MatrixMemory {
            col_major: true,
            ..Default::default()
        },
        c_mem: MatrixMemory::default(),
        d_mem: MatrixMemory::default(),
        alpha: 1.0,
        beta: 1.0,
        c_mode: CMode::Separate,
        bias: true,
        epilogue: Epilogue::Gelu,
        seed: 9,
    };
    for dev in backends().0 {
        if let Err(e) = run_gemm_sampled(&dev, &g) {
            panic!("backend {}: {e}", dev.kind());
        }
    }
}
