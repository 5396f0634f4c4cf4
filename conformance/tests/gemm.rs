//! gemm and matmul against the f64 reference: any M, N, K, batches, row- and column-major
//! operands, alpha/beta/C (also in place), bias and epilogues, every dtype pairing.
//! An `Err` (including `Unsupported`) from a backend fails the test on that backend.

use calico::gemm::{gemm_kernel, GemmKernel};
use calico::ops::{self, GemmOptions};
use calico::{DType, Device, Epilogue};
use calico_conformance::compare::{check_close, check_normwise, elementwise_tol, gemm_tol};
use calico_conformance::reference::Gemm;
use calico_conformance::rng::{Dist, Rng};
use calico_conformance::tensors::{
    intact, matrix, round_all, untouched_outside, MatrixMemory, View,
};
use calico_conformance::{backends, gpu_backends, property, report_skipped, shape_stride, Ctx};
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

/// A dense bf16 -> bf16 `m x n x k` case: every operand row-major, D = A @ B with no C, bias
/// or activation.
fn plain_case(m: usize, n: usize, k: usize, seed: u64) -> GemmCase {
    let row = MatrixMemory::default();
    GemmCase {
        in_dtype: DType::BF16,
        out_dtype: DType::BF16,
        batch: None,
        m,
        n,
        k,
        a_mem: row,
        b_mem: row,
        c_mem: row,
        d_mem: row,
        alpha: 1.0,
        beta: 0.0,
        c_mode: CMode::None,
        bias: false,
        epilogue: Epilogue::None,
        seed,
    }
}

/// Column-major storage (a K x N operand stored as an N x K weight).
fn col_major() -> MatrixMemory {
    MatrixMemory {
        col_major: true,
        ..MatrixMemory::default()
    }
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
    let (_, o, got) = execute_routed(dev, g, via_matmul)?;
    Ok((o, got))
}

/// As [`execute`], also naming the kernel that ran the case (None on the CPU).
fn execute_routed(
    dev: &Device,
    g: &GemmCase,
    via_matmul: bool,
) -> Result<(Option<GemmKernel>, Operands, Vec<f64>), String> {
    let mut o = operands(dev, g)?;
    let what = format!(
        "gemm {}x{}x{} {}->{}",
        g.m, g.n, g.k, g.in_dtype, g.out_dtype
    );
    let c_view = o.cv.as_ref().map(|c| c.view.clone());
    let opts = if via_matmul {
        GemmOptions::default()
    } else {
        GemmOptions {
            alpha: g.alpha,
            beta: g.beta,
            c: c_view.as_ref(),
            bias: o.bias_t.as_ref(),
            epilogue: g.epilogue,
        }
    };
    let kernel = gemm_kernel(dev, &o.av.view, &o.bv.view, &o.dv.view, &opts).ctx(&what)?;
    if via_matmul {
        ops::matmul(dev, &o.av.view, &o.bv.view, &mut o.dv.view).ctx(&what)?;
    } else {
        ops::gemm(dev, &o.av.view, &o.bv.view, &mut o.dv.view, &opts).ctx(&what)?;
    }
    let got = o.dv.view.to_f64_vec().ctx("reading d")?;
    Ok((kernel, o, got))
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
    let gpus = gpu_backends("gemm_large_on_gpu", "the large GEMM checks");
    if gpus.is_empty() {
        return;
    }
    let col = col_major();
    let base = plain_case(1024, 1024, 1024, 1);
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
        check_sampled(&dev, &cases);
    }
}

/// Few tiles and a long K: on the H100 the Hopper kernel cuts K into pieces computed side by
/// side (f32 partials in the workspace) and a second kernel sums them in order and applies the
/// epilogue. Every element against the f64 reference: K-major and N-major B, K not a multiple
/// of the 64-element k-tile, pieces that do not divide K evenly, batches, M and N tails, C
/// (separate and in place), bias, GELU / SiLU, every output dtype; then the same call twice
/// gives bit-identical D (the sum's order does not depend on timing).
#[test]
fn gemm_split_k_on_gpu() {
    let col = col_major();
    let base = plain_case(129, 304, 4104, 31);
    let cases = [
        base.clone(),
        GemmCase {
            b_mem: col,
            seed: 32,
            ..base.clone()
        },
        GemmCase {
            in_dtype: DType::F16,
            out_dtype: DType::F32,
            m: 80,
            n: 1000,
            k: 8192,
            b_mem: col,
            alpha: 0.5,
            beta: 1.0,
            c_mode: CMode::Separate,
            bias: true,
            epilogue: Epilogue::Gelu,
            seed: 33,
            ..base.clone()
        },
        GemmCase {
            batch: Some(3),
            m: 100,
            n: 256,
            k: 8192,
            beta: -0.5,
            c_mode: CMode::InPlace,
            bias: true,
            epilogue: Epilogue::Silu,
            seed: 34,
            ..base.clone()
        },
        GemmCase {
            in_dtype: DType::F16,
            out_dtype: DType::F16,
            m: 17,
            n: 136,
            k: 16384,
            seed: 35,
            ..base.clone()
        },
    ];
    // These shapes split on the H100 (the router's plan for sm_90a, which is for one batch);
    // other GPUs check the same results on whatever kernel they route to.
    for (g, plan) in h100_plans(&cases) {
        assert!(plan.k_splits >= 2, "{g:?} is meant to split K on sm_90a");
    }
    let gpus = gpu_backends("gemm_split_k_on_gpu", "the split-K GEMM checks");
    for dev in gpus {
        for g in &cases {
            if let Err(e) = run_gemm(&dev, g, false) {
                panic!("backend {}: {g:?}: {e}", dev.kind());
            }
        }
        assert_repeats_bit_identical(&dev, &cases[2], "split-K");
    }
}

/// The sm_90a plans of the unbatched `cases` (the router plans one batch).
fn h100_plans(cases: &[GemmCase]) -> Vec<(&GemmCase, calico::gemm::GemmPlan)> {
    cases
        .iter()
        .filter(|g| g.batch.is_none())
        .map(|g| {
            let shape = (g.m, g.n, g.k);
            let kmajor = g.b_mem.col_major;
            let plan = calico::gemm::plan_dense("sm_90a", shape, g.in_dtype, g.out_dtype, kmajor)
                .expect("planning for sm_90a");
            (g, plan)
        })
        .collect()
}

/// Every case on `dev` through the sampled check (large problems).
fn check_sampled(dev: &Device, cases: &[GemmCase]) {
    for g in cases {
        if let Err(e) = run_gemm_sampled(dev, g) {
            panic!("backend {}: {g:?}: {e}", dev.kind());
        }
    }
}

/// The same call twice on `dev` gives bit-identical D (`what` names the path in the message).
fn assert_repeats_bit_identical(dev: &Device, g: &GemmCase, what: &str) {
    let first = execute(dev, g, false).map(|(_, d)| d);
    let second = execute(dev, g, false).map(|(_, d)| d);
    match (first, second) {
        (Ok(a), Ok(b)) => assert!(
            a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "backend {}: {what} results differ between two identical calls",
            dev.kind()
        ),
        (a, b) => panic!("backend {}: {:?} / {:?}", dev.kind(), a.err(), b.err()),
    }
}

/// Problems whose last round of 128 x 256 tiles leaves most of the H100's SMs idle: the
/// Hopper launch is cut at a wave boundary into a head of whole rounds and a tail launched
/// after it (along M or N, the tail split along K or not), so D's rows or columns, A's rows
/// or B's columns, C and the bias are all offset views. Every element is written (D starts
/// as NaN) and the first and last rows and columns (across the cut) and random elements
/// match the reference.
#[test]
fn gemm_wave_cut_on_gpu() {
    let col = col_major();
    let down_proj = GemmCase {
        b_mem: col,
        ..plain_case(1500, 3072, 14336, 41)
    };
    let cases = [
        // Cut along N, the tail split along K.
        down_proj.clone(),
        // Cut along M at row 1024, the tail on its own tile, with C, a bias and GELU.
        GemmCase {
            m: 1100,
            n: 3840,
            k: 4096,
            alpha: 0.75,
            beta: 0.5,
            c_mode: CMode::Separate,
            bias: true,
            epilogue: Epilogue::Gelu,
            seed: 42,
            ..down_proj.clone()
        },
        // Cut along N at column 3328 with C in place, a bias and SiLU: the bias moves too.
        GemmCase {
            in_dtype: DType::F16,
            out_dtype: DType::F16,
            m: 1200,
            n: 4096,
            k: 4096,
            beta: -1.0,
            c_mode: CMode::InPlace,
            bias: true,
            epilogue: Epilogue::Silu,
            seed: 43,
            ..down_proj.clone()
        },
        // Cut along M with an N-major B, the tail split along K.
        GemmCase {
            m: 3000,
            n: 1536,
            k: 8192,
            b_mem: MatrixMemory::default(),
            seed: 44,
            ..down_proj.clone()
        },
        // Batched: whatever the router makes of it, the same results.
        GemmCase {
            batch: Some(2),
            m: 700,
            n: 3072,
            k: 4096,
            seed: 45,
            ..down_proj.clone()
        },
    ];
    for (g, plan) in h100_plans(&cases) {
        assert!(
            plan.wave_cut.is_some(),
            "{g:?} is meant to be cut on sm_90a"
        );
    }
    for dev in gpu_backends("gemm_wave_cut_on_gpu", "the wave-cut GEMM checks") {
        check_sampled(&dev, &cases);
    }
}

/// Problems whose widest tiles fill between 60% and all of the H100's SMs once: K is cut
/// into pieces that run in rounds and the pieces' f32 sums meet inside the Hopper kernel (the
/// last piece of a tile adds every piece's slot in order and runs the epilogue). Every
/// element is written, edges and random elements match the reference (K-major and N-major B,
/// K, M and N not multiples of the tile, C separate and in place, bias, activations, f16 and
/// f32 outputs, batches), and a repeat is bit-identical.
#[test]
fn gemm_split_fused_on_gpu() {
    let col = col_major();
    let base = GemmCase {
        b_mem: col,
        ..plain_case(777, 3072, 14336, 61)
    };
    let cases = [
        base.clone(),
        GemmCase {
            m: 600,
            n: 4096,
            k: 14336,
            b_mem: MatrixMemory::default(),
            seed: 62,
            ..base.clone()
        },
        GemmCase {
            in_dtype: DType::F16,
            out_dtype: DType::F16,
            m: 700,
            n: 3584,
            k: 14280,
            alpha: 0.5,
            beta: 1.0,
            c_mode: CMode::Separate,
            bias: true,
            epilogue: Epilogue::Gelu,
            seed: 63,
            ..base.clone()
        },
        GemmCase {
            out_dtype: DType::F32,
            m: 1000,
            n: 2800,
            k: 16384,
            beta: -0.5,
            c_mode: CMode::InPlace,
            epilogue: Epilogue::Silu,
            seed: 64,
            ..base.clone()
        },
        GemmCase {
            batch: Some(2),
            m: 400,
            n: 3072,
            k: 6144,
            seed: 65,
            ..base.clone()
        },
    ];
    for (g, plan) in h100_plans(&cases) {
        assert!(
            plan.split_fused && plan.k_splits >= 2,
            "{g:?} is meant to sum split-K pieces in the kernel on sm_90a"
        );
    }
    for dev in gpu_backends("gemm_split_fused_on_gpu", "the fused split-K GEMM checks") {
        check_sampled(&dev, &cases);
        assert_repeats_bit_identical(&dev, &cases[0], "fused split-K");
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

/// Sizes past the tiny ones: either side of the tuned kernels' tile edges.
const BEYOND: [usize; 12] = [15, 16, 17, 31, 33, 63, 64, 65, 127, 129, 255, 257];

/// Operands that end exactly where their allocation ends, in the layouts that send a GEMM to
/// each kernel. `tail`: rows (stored lines) padded to whole 16-byte pieces, the view 8 elements
/// into its allocation and its last line's padding cut off, so a 16-byte copy of the last
/// line's tail would run past the allocation; otherwise dense, the allocation exactly the
/// matrix. On an H100 the four layouts take the skinny (M <= 16), Hopper (N-major B), sm_80
/// (column-major D) and tile (dense, unaligned strides) kernels.
fn tail_layouts(m: usize, n: usize, k: usize) -> [(&'static str, [MatrixMemory; 3]); 4] {
    let tail = |line: usize, col_major: bool| MatrixMemory {
        col_major,
        pad: (8 - line % 8) % 8,
        offset: 8,
    };
    let dense = MatrixMemory::default();
    let row_a = tail(k, false);
    [
        // B as an N x K weight (K contiguous).
        ("weight", [row_a, tail(k, true), dense]),
        // B as K x N row-major (N contiguous).
        ("n-major b", [row_a, tail(n, false), dense]),
        ("column-major d", [row_a, tail(n, false), tail(m, true)]),
        (
            "dense",
            [
                dense,
                MatrixMemory {
                    col_major: true,
                    ..dense
                },
                dense,
            ],
        ),
    ]
}

/// (M, N, K): every size 1..=9 in every dimension, then each dimension past the tile edges
/// with the others small.
fn tiny_and_edge_shapes() -> Vec<(usize, usize, usize)> {
    let mut shapes = Vec::new();
    for m in 1..=9 {
        for n in 1..=9 {
            for k in 1..=9 {
                shapes.push((m, n, k));
            }
        }
    }
    for &x in &BEYOND {
        for (s, t) in [(1, 8), (3, 9), (7, 2)] {
            shapes.extend([(x, s, t), (s, x, t), (s, t, x)]);
        }
    }
    shapes
}

fn tail_case(m: usize, n: usize, k: usize, mems: [MatrixMemory; 3], seed: u64) -> GemmCase {
    GemmCase {
        a_mem: mems[0],
        b_mem: mems[1],
        d_mem: mems[2],
        ..plain_case(m, n, k, seed)
    }
}

/// Every M, N, K in 1..=9 and past the tile edges, with every operand ending exactly at the end
/// of its allocation (dense, or a view at the tail of a larger one), in each kernel's layout:
/// a kernel that reads a vector past an operand's last element shows up under
/// compute-sanitizer memcheck (benches/gpu/sanitize.sh), and as wrong values or a fault when
/// the allocation is the last of its page.
#[test]
fn gemm_tiny_shapes_end_at_the_allocation() {
    report_skipped("gemm_tiny_shapes_end_at_the_allocation");
    for dev in backends().0 {
        let shapes = tiny_and_edge_shapes();
        for (i, &(m, n, k)) in shapes.iter().enumerate().step_by(shape_stride()) {
            for (name, mems) in tail_layouts(m, n, k) {
                let g = tail_case(m, n, k, mems, i as u64);
                if let Err(e) = run_gemm(&dev, &g, false) {
                    panic!("backend {}: {name} layout: {g:?}: {e}", dev.kind());
                }
            }
        }
    }
}

/// The same layouts with C, bias and each epilogue and the other dtypes, on a smaller set of
/// tiny shapes (each combination is a kernel variant of its own).
#[test]
fn gemm_tiny_shapes_with_epilogues_end_at_the_allocation() {
    report_skipped("gemm_tiny_shapes_with_epilogues_end_at_the_allocation");
    let sizes = [1usize, 2, 7, 8, 9];
    let flavours = [
        (DType::F16, DType::F32, Epilogue::Gelu),
        (DType::BF16, DType::F16, Epilogue::Silu),
    ];
    for dev in backends().0 {
        let mut seed = 0u64;
        let mut shape = 0usize;
        for &m in &sizes {
            for &n in &sizes {
                for &k in &sizes {
                    shape += 1;
                    if !(shape - 1).is_multiple_of(shape_stride()) {
                        continue;
                    }
                    for (name, mems) in tail_layouts(m, n, k) {
                        seed += 1;
                        let (in_dtype, out_dtype, epilogue) = flavours[seed as usize % 2];
                        let g = GemmCase {
                            in_dtype,
                            out_dtype,
                            alpha: 0.5,
                            beta: 1.0,
                            c_mode: CMode::Separate,
                            c_mem: MatrixMemory {
                                pad: 1,
                                offset: 3,
                                ..Default::default()
                            },
                            bias: true,
                            epilogue,
                            ..tail_case(m, n, k, mems, seed)
                        };
                        if let Err(e) = run_gemm(&dev, &g, false) {
                            panic!("backend {}: {name} layout: {g:?}: {e}", dev.kind());
                        }
                    }
                }
            }
        }
    }
}

/// Whether `var` (CALICO_SKINNY, CALICO_GEMV) turns its kernel off (the routers read the
/// same values).
fn env_off(var: &str) -> bool {
    let v = std::env::var(var).unwrap_or_default();
    matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "off" | "0" | "false" | "no"
    )
}

/// One GEMM with alpha, beta * C, bias and each epilogue through every GPU kernel. Its five
/// layouts send it, on an H100, to the GEMV kernel (K-major weight; the skinny kernel under
/// CALICO_GEMV=off, the Hopper kernel with CALICO_SKINNY=off too), the Hopper kernel (N-major
/// B), the padded Hopper path (A at an odd address), the sm_80 kernel (column-major D) and the
/// portable kernel (A at an odd address and column-major D), which the test checks there. Every result must
/// match the f64 reference, and the others to within f32 accumulation-order noise: the kernels
/// share one epilogue (kernels/device/gemm/epilogue.cuh), so a call gives the same numbers
/// whichever kernel or GPU runs it.
#[test]
fn gemm_epilogue_agrees_across_kernels() {
    report_skipped("gemm_epilogue_agrees_across_kernels");
    // M <= 16 (skinny), K and N past whole tiles, pre-activations spanning about -8..8.
    let (m, n, k) = (16, 200, 136);
    let row = MatrixMemory::default();
    let col = col_major();
    let odd = MatrixMemory { offset: 1, ..row };
    let layouts = [
        (
            "k-major weight",
            [row, col, row],
            match (env_off("CALICO_GEMV"), env_off("CALICO_SKINNY")) {
                (false, _) => GemmKernel::Gemv,
                (true, false) => GemmKernel::Skinny,
                (true, true) => GemmKernel::Hopper,
            },
        ),
        ("n-major b", [row, row, row], GemmKernel::Hopper),
        ("misaligned a", [odd, row, row], GemmKernel::Padded),
        ("column-major d", [row, row, col], GemmKernel::Sm80),
        (
            "misaligned a, column-major d",
            [odd, row, col],
            GemmKernel::Portable,
        ),
    ];
    for dev in backends().0 {
        let hopper = dev.arch().target.ends_with("90a");
        for out_dtype in [DType::F32, DType::BF16] {
            for epilogue in [Epilogue::Gelu, Epilogue::Silu, Epilogue::None] {
                let mut first: Option<(&str, Vec<f64>)> = None;
                for (name, mems, expected) in layouts {
                    let g = GemmCase {
                        out_dtype,
                        alpha: 1.5,
                        beta: 0.5,
                        c_mode: CMode::Separate,
                        bias: true,
                        epilogue,
                        ..tail_case(m, n, k, mems, 42)
                    };
                    let fail = |e: String| -> ! {
                        panic!(
                            "backend {}: {name} layout, {out_dtype} {epilogue:?}: {e}",
                            dev.kind()
                        )
                    };
                    let (kernel, o, got) =
                        execute_routed(&dev, &g, false).unwrap_or_else(|e| fail(e));
                    if hopper && kernel != Some(expected) {
                        fail(format!("ran on {kernel:?}, expected {expected:?}"));
                    }
                    let want = reference(&g, &o).all();
                    let (normwise, elementwise) = gemm_tol(out_dtype);
                    check_normwise("d", &got, &want, normwise).unwrap_or_else(|e| fail(e));
                    check_close("d", &got, &want, elementwise).unwrap_or_else(|e| fail(e));
                    match &first {
                        None => first = Some((name, got)),
                        Some((first_name, first_got)) => {
                            // f32: summation order only; 16-bit: a rounding step or two.
                            let tol = match out_dtype {
                                DType::F32 => 1e-5,
                                _ => elementwise_tol(out_dtype) / 2.0,
                            };
                            check_close(
                                &format!("d against the {first_name} layout's"),
                                &got,
                                first_got,
                                tol,
                            )
                            .unwrap_or_else(|e| fail(e));
                        }
                    }
                }
            }
        }
    }
}

/// Decode GEMV shapes (M <= 16 against a K-major weight, torch Linear's layout): every M tile
/// edge, K tails around the 32- and 128-wide steps, N tails, and padded or offset rows (the
/// scalar-load variant), with every epilogue, on every backend.
#[test]
fn gemv_shapes() {
    report_skipped("gemv_shapes");
    let weight = |pad, offset| MatrixMemory {
        col_major: true,
        pad,
        offset,
    };
    let row = |pad, offset| MatrixMemory {
        col_major: false,
        pad,
        offset,
    };
    let shapes = [
        (1, 1, 1),
        (1, 9, 7),
        (2, 8, 8),
        (3, 17, 33),
        (4, 64, 127),
        (5, 33, 128),
        (7, 100, 129),
        (8, 31, 255),
        (9, 129, 256),
        (15, 40, 1000),
        (16, 257, 513),
        (16, 8, 4097),
    ];
    for dev in backends().0 {
        for (i, &(m, n, k)) in shapes.iter().enumerate() {
            let (pad, offset) = [(0, 0), (0, 1), (3, 0), (8, 0), (1, 2)][i % 5];
            let g = GemmCase {
                in_dtype: [DType::BF16, DType::F16][i % 2],
                out_dtype: [DType::BF16, DType::F32, DType::F16][i % 3],
                batch: None,
                m,
                n,
                k,
                a_mem: row(pad, offset),
                b_mem: weight(pad, offset),
                c_mem: MatrixMemory::default(),
                d_mem: MatrixMemory {
                    pad: i % 2,
                    ..Default::default()
                },
                alpha: [1.0, 0.5, -1.25][i % 3],
                beta: if i % 4 == 1 { 1.0 } else { 0.0 },
                c_mode: match i % 4 {
                    1 => CMode::Separate,
                    _ => CMode::None,
                },
                bias: i % 3 == 2,
                epilogue: [Epilogue::None, Epilogue::Gelu, Epilogue::Silu][i % 3],
                seed: 100 + i as u64,
            };
            if let Err(e) = run_gemm(&dev, &g, false) {
                panic!("backend {}: {g:?}: {e}", dev.kind());
            }
        }
        // Aligned rows, where A fits in shared memory (the GPU's streaming form): fewer K
        // steps than warps, a partial last step, two steps per warp, several groups per CTA
        // and fewer groups than SMs, M on both sides of 8, C in place and a bias.
        let aligned = [
            (1, 24, 8),
            (3, 1100, 1000),
            (8, 300, 6144),
            (9, 2000, 768),
            (16, 1057, 4104),
            (16, 40, 256),
        ];
        for (i, &(m, n, k)) in aligned.iter().enumerate() {
            let dense = MatrixMemory::default();
            let g = GemmCase {
                in_dtype: [DType::BF16, DType::F16][i % 2],
                out_dtype: [DType::BF16, DType::F32, DType::F16][i % 3],
                alpha: [1.0, -0.75][i % 2],
                beta: if i % 3 == 1 { 0.5 } else { 0.0 },
                c_mode: if i % 3 == 1 {
                    CMode::InPlace
                } else {
                    CMode::None
                },
                bias: i % 2 == 0,
                epilogue: [Epilogue::None, Epilogue::Gelu, Epilogue::Silu][i % 3],
                ..tail_case(m, n, k, [row(0, 0), weight(0, 0), dense], 150 + i as u64)
            };
            if let Err(e) = run_gemm(&dev, &g, false) {
                panic!("backend {}: {g:?}: {e}", dev.kind());
            }
        }
    }
}

/// GPU-only problems of the decode GEMV (the bench's weights, M = 1, 4, 16 and odd M/K) and of
/// the odd-shape path (K, N or a row stride not a multiple of 8: padded into an aligned
/// workspace for the Hopper kernel), checked on sampled elements.
#[test]
fn gemv_and_odd_shapes_on_gpu() {
    let gpus = gpu_backends(
        "gemv_and_odd_shapes_on_gpu",
        "the GEMV and odd-shape checks",
    );
    if gpus.is_empty() {
        return;
    }
    let row = MatrixMemory::default();
    let weight = col_major();
    let base = GemmCase {
        b_mem: weight,
        ..plain_case(1, 4096, 4096, 200)
    };
    let mut cases = Vec::new();
    for (i, &(m, n, k)) in [
        (1, 4096, 4096),
        (4, 14336, 4096),
        (16, 4096, 14336),
        (11, 14336, 4096),
        (16, 4095, 4097),
    ]
    .iter()
    .enumerate()
    {
        cases.push(GemmCase {
            m,
            n,
            k,
            bias: i % 2 == 1,
            epilogue: [Epilogue::None, Epilogue::Silu, Epilogue::Gelu][i % 3],
            seed: 200 + i as u64,
            ..base.clone()
        });
    }
    // Odd shapes: the bench's (weight layout) and torch.matmul's (row-major B).
    for (i, &(m, n, k, b_mem)) in [
        (4097, 4097, 4097, weight),
        (4096, 4096, 4095, weight),
        (1000, 999, 1000, weight),
        (1000, 999, 1000, row),
        (2049, 4097, 1001, row),
        (300, 513, 4097, weight),
    ]
    .iter()
    .enumerate()
    {
        cases.push(GemmCase {
            m,
            n,
            k,
            b_mem,
            out_dtype: [DType::BF16, DType::F32][i % 2],
            beta: if i % 3 == 2 { 1.0 } else { 0.0 },
            c_mode: if i % 3 == 2 {
                CMode::Separate
            } else {
                CMode::None
            },
            bias: i % 2 == 0,
            epilogue: [Epilogue::None, Epilogue::Gelu, Epilogue::Silu][i % 3],
            seed: 300 + i as u64,
            ..base.clone()
        });
    }
    // A few rows and columns past whole 128x256 tiles (the slivers CALICO_GEMM_ODD=split
    // hands to the GEMV): bias (which keeps the column sliver untransposed), C, f32 out.
    for (i, &(m, n, k)) in [(4100, 2050, 1001), (4097, 2049, 4097), (2053, 4097, 1003)]
        .iter()
        .enumerate()
    {
        cases.push(GemmCase {
            m,
            n,
            k,
            b_mem: weight,
            out_dtype: [DType::BF16, DType::F32, DType::BF16][i],
            beta: [0.0, 1.0, 0.5][i],
            c_mode: [CMode::None, CMode::Separate, CMode::InPlace][i],
            bias: i != 1,
            epilogue: [Epilogue::None, Epilogue::Gelu, Epilogue::Silu][i],
            seed: 400 + i as u64,
            ..base.clone()
        });
    }
    for dev in gpus {
        check_sampled(&dev, &cases);
    }
}

/// One case on a kernel chosen by hand (`gemm::gemm_with_kernel`), checked like [`run_gemm`]:
/// every element against the f64 reference, nothing written outside D, A and B intact.
/// Returns the kernel the router itself would have taken, and D.
fn run_gemm_on(
    dev: &Device,
    g: &GemmCase,
    kernel: GemmKernel,
) -> Result<(Option<GemmKernel>, Vec<f64>), String> {
    let mut o = operands(dev, g)?;
    let what = format!(
        "gemm {}x{}x{} {}->{} on {kernel:?}",
        g.m, g.n, g.k, g.in_dtype, g.out_dtype
    );
    let c_view = o.cv.as_ref().map(|c| c.view.clone());
    let opts = GemmOptions {
        alpha: g.alpha,
        beta: g.beta,
        c: c_view.as_ref(),
        bias: o.bias_t.as_ref(),
        epilogue: g.epilogue,
    };
    let routed = gemm_kernel(dev, &o.av.view, &o.bv.view, &o.dv.view, &opts).ctx(&what)?;
    calico::gemm::gemm_with_kernel(dev, kernel, &o.av.view, &o.bv.view, &mut o.dv.view, &opts)
        .ctx(&what)?;
    let got = o.dv.view.to_f64_vec().ctx("reading d")?;
    let want = reference(g, &o).all();
    let (normwise, elementwise) = gemm_tol(g.out_dtype);
    check_normwise("d", &got, &want, normwise)?;
    check_close("d", &got, &want, elementwise)?;
    untouched_outside(&o.dv, "d")?;
    intact(&o.av, &o.a, "a")?;
    intact(&o.bv, &o.b, "b")?;
    Ok((routed, got))
}

/// The tile GEMM's four operand layouts, one per vocabulary product, every operand ending
/// exactly at the end of its allocation (lines padded to 16 bytes and the view at the tail of
/// a larger allocation, as in [`tail_layouts`], or dense): A row-major (unit stride along K)
/// or column-major (along M), B K x N row-major (along N) or an N x K weight (along K).
fn tile_layouts(m: usize, n: usize, k: usize) -> [(&'static str, [MatrixMemory; 3]); 4] {
    let tail = |line: usize, col_major: bool| MatrixMemory {
        col_major,
        pad: (8 - line % 8) % 8,
        offset: 8,
    };
    let dense = MatrixMemory::default();
    let dense_col = MatrixMemory {
        col_major: true,
        ..dense
    };
    [
        ("mma_AB", [tail(k, false), tail(n, false), dense]),
        ("mma_ABt", [dense, dense_col, tail(n, false)]),
        ("mma_AtB", [tail(m, true), dense, dense]),
        ("mma_AtBt", [dense_col, tail(k, true), tail(n, false)]),
    ]
}

/// (block tile, (M, N)) for each block tile the tile GEMM has: sizes that its chooser
/// (kernels/src/gemm/tile.rs: the first of 256x128, 128x128, 128x64, 64x128 and 64x64 blocks
/// that gives every one of `units` compute units a block) sends to that tile, the smallest on
/// a grid of odd sizes, so that each variant runs on this GPU.
fn sizes_per_block_tile(units: usize) -> Vec<((usize, usize), (usize, usize))> {
    const TILES: [(usize, usize); 5] = [(256, 128), (128, 128), (128, 64), (64, 128), (64, 64)];
    let pick = |m: usize, n: usize| {
        TILES
            .into_iter()
            .find(|&(bm, bn)| m.div_ceil(bm) * n.div_ceil(bn) >= units)
            .unwrap_or((64, 64))
    };
    let mut found: Vec<((usize, usize), (usize, usize))> = Vec::new();
    for m in (100..4000).step_by(37) {
        for n in (100..4000).step_by(37) {
            let tile = pick(m, n);
            match found.iter_mut().find(|(t, _)| *t == tile) {
                Some((_, best)) if best.0 * best.1 <= m * n => {}
                Some((_, best)) => *best = (m, n),
                None => found.push((tile, (m, n))),
            }
        }
    }
    found
}

/// The size search finds every block tile on GPUs from 104 to 304 compute units (H100 PCIe and
/// SXM, MI250X's GCD, MI300X).
#[test]
fn tile_gemm_sizes_reach_every_block_tile() {
    for units in [104, 114, 132, 110, 228, 304] {
        let found = sizes_per_block_tile(units);
        assert_eq!(found.len(), 5, "{units} units: {found:?}");
    }
    let on_h100 = sizes_per_block_tile(132);
    assert!(on_h100.contains(&((128, 128), (655, 2690))), "{on_h100:?}");
    assert!(on_h100.contains(&((256, 128), (1025, 3356))), "{on_h100:?}");
}

/// The vendor-neutral tile GEMM (kernels/device/gemm/tile.cu, written only against the shared
/// tile vocabulary), run by hand on every GPU backend (CUDA and HIP through this same code)
/// against the f64 reference: the four layout products; M, N and K in 1..=9, around its
/// 64/128-row and 32-deep tile edges (17, 129) and at 1000 (K tails of every length mod 32);
/// bf16 and f16 in, bf16, f16 and f32 out; alpha, beta with C (separate and in place), bias
/// and each epilogue; batches; every block tile (sizes chosen for this GPU's compute units).
/// With f32 output it must also agree with the scalar portable
/// kernel to f32 summation noise (one shared epilogue). For a K = 77 weight `gemm_kernel`
/// must agree with the router's plan for the device's target (the tile kernel on CDNA, sm_80
/// and sm_100; the padded Hopper path on an H100).
#[test]
fn tile_gemm_matches_reference() {
    let gpus = gpu_backends("tile_gemm_matches_reference", "the tile GEMM (GPU-only)");
    if gpus.is_empty() {
        return;
    }
    // (in, out, epilogue, C, bias, alpha, beta)
    let flavours = [
        (
            DType::BF16,
            DType::BF16,
            Epilogue::None,
            CMode::None,
            false,
            1.0,
            0.0,
        ),
        (
            DType::F16,
            DType::F32,
            Epilogue::Gelu,
            CMode::Separate,
            true,
            1.5,
            0.5,
        ),
        (
            DType::BF16,
            DType::F16,
            Epilogue::Silu,
            CMode::InPlace,
            true,
            -0.75,
            1.0,
        ),
        (
            DType::F16,
            DType::BF16,
            Epilogue::None,
            CMode::Separate,
            false,
            1.0,
            -2.0,
        ),
    ];
    let mut shapes: Vec<(usize, usize, usize)> = Vec::new();
    for m in 1..=9 {
        for n in 1..=9 {
            for k in 1..=9 {
                shapes.push((m, n, k));
            }
        }
    }
    for x in [17, 129, 1000] {
        for (s, t) in [(1, 9), (9, 17), (7, 3)] {
            shapes.extend([(x, s, t), (s, x, t), (s, t, x)]);
        }
    }
    shapes.extend([
        (129, 129, 129),
        (1000, 999, 47),
        (200, 130, 1000),
        (65, 1000, 33),
    ]);
    let mut routed_here = 0;
    for dev in &gpus {
        let fail = |g: &GemmCase, name: &str, e: String| -> ! {
            panic!("backend {}: {name} layout: {g:?}: {e}", dev.kind())
        };
        for (i, &(m, n, k)) in shapes.iter().enumerate() {
            // The 1..=9 cube takes one layout and flavour per shape in turn; the larger shapes
            // every combination.
            let cube = m <= 9 && n <= 9 && k <= 9;
            for (li, (name, mems)) in tile_layouts(m, n, k).into_iter().enumerate() {
                for (fi, &(in_dtype, out_dtype, epilogue, c_mode, bias, alpha, beta)) in
                    flavours.iter().enumerate()
                {
                    if cube && (li != i % 4 || fi != (i / 4) % 4) {
                        continue;
                    }
                    let g = GemmCase {
                        in_dtype,
                        out_dtype,
                        alpha,
                        beta,
                        c_mode,
                        bias,
                        epilogue,
                        ..tail_case(m, n, k, mems, i as u64 * 16 + fi as u64)
                    };
                    let (_, tile) = run_gemm_on(dev, &g, GemmKernel::Tile)
                        .unwrap_or_else(|e| fail(&g, name, e));
                    // The same epilogue as every GEMM: the scalar portable kernel gives the
                    // same f32 numbers up to the order of the K sums.
                    if !cube && out_dtype == DType::F32 {
                        let (_, portable) = run_gemm_on(dev, &g, GemmKernel::Portable)
                            .unwrap_or_else(|e| fail(&g, name, e));
                        check_close("d against the portable kernel's", &tile, &portable, 1e-5)
                            .unwrap_or_else(|e| fail(&g, name, e));
                    }
                }
            }
        }
        // Every block tile (the sizes above all take 64x64 blocks on a large GPU), K = 40 (a
        // tail of 8 past the 32-deep steps), every layout, two flavours.
        let units = dev.arch().compute_units as usize;
        for (bi, ((bm, bn), (m, n))) in sizes_per_block_tile(units).into_iter().enumerate() {
            let k = 40;
            for (name, mems) in tile_layouts(m, n, k) {
                for &(in_dtype, out_dtype, epilogue, c_mode, bias, alpha, beta) in &flavours[..2] {
                    let g = GemmCase {
                        in_dtype,
                        out_dtype,
                        alpha,
                        beta,
                        c_mode,
                        bias,
                        epilogue,
                        ..tail_case(m, n, k, mems, 9000 + bi as u64)
                    };
                    run_gemm_on(dev, &g, GemmKernel::Tile).unwrap_or_else(|e| {
                        fail(&g, name, format!("{bm}x{bn} blocks on {units} units: {e}"))
                    });
                }
            }
        }
        // Batches (strided A, B and D per entry, bias shared), every layout.
        for (bi, &(m, n, k)) in [(9, 17, 33), (130, 70, 129)].iter().enumerate() {
            for (name, mems) in tile_layouts(m, n, k) {
                let g = GemmCase {
                    batch: Some(3),
                    out_dtype: DType::F32,
                    c_mode: CMode::Separate,
                    beta: 0.5,
                    bias: true,
                    epilogue: Epilogue::Gelu,
                    ..tail_case(m, n, k, mems, 7000 + bi as u64)
                };
                run_gemm_on(dev, &g, GemmKernel::Tile).unwrap_or_else(|e| fail(&g, name, e));
            }
        }
        // The two staging paths on one shape: rows padded to 16 bytes at a 16-byte offset
        // (16-byte chunks, zeros past the M/N/K edges), then the same rows from a base one
        // element off the 16-byte grid (element loads), every layout.
        for (oi, offset) in [8, 1].into_iter().enumerate() {
            let (m, n, k) = (203, 150, 91);
            for (name, mut mems) in tile_layouts(m, n, k) {
                for (mem, (row_line, col_line)) in mems.iter_mut().zip([(k, m), (n, k), (n, m)]) {
                    let line = if mem.col_major { col_line } else { row_line };
                    mem.pad = (8 - line % 8) % 8;
                    mem.offset = offset;
                }
                let g = GemmCase {
                    out_dtype: DType::F32,
                    ..tail_case(m, n, k, mems, 8000 + oi as u64)
                };
                run_gemm_on(dev, &g, GemmKernel::Tile)
                    .unwrap_or_else(|e| fail(&g, name, format!("base offset {offset}: {e}")));
            }
        }
        // K = 77: rows 154 bytes apart, which the tuned kernels' 16-byte copies cannot read.
        // Where no other kernel takes it (gfx90a/gfx942, sm_80, sm_100; an H100 pads it for
        // the Hopper kernel instead), the router must pick the tile kernel by itself: the
        // router's dry-run plan for this device's target says which.
        let dense = MatrixMemory::default();
        let weight = MatrixMemory {
            col_major: true,
            ..dense
        };
        let (m, n, k) = (257, 129, 77);
        let g = tail_case(m, n, k, [dense, weight, dense], 77);
        let (routed, _) =
            run_gemm_on(dev, &g, GemmKernel::Tile).unwrap_or_else(|e| fail(&g, "k = 77", e));
        let target = dev.arch().target.clone();
        let forced = std::env::var_os("CALICO_GEMM_ROUTE_AS").is_some()
            || std::env::var_os("CALICO_GEMM_KERNEL").is_some();
        match calico::gemm::plan_dense(&target, (m, n, k), DType::BF16, DType::BF16, true) {
            Ok(plan) if !forced => assert_eq!(
                routed,
                Some(plan.kernel),
                "backend {}: the router and its plan for {target} disagree",
                dev.kind()
            ),
            Ok(_) => {}
            Err(e) => eprintln!("[tile_gemm_matches_reference] no plan for {target}: {e}"),
        }
        if routed == Some(GemmKernel::Tile) {
            routed_here += 1;
        } else {
            eprintln!(
                "[tile_gemm_matches_reference] {target} routes {m}x{n}x{k} to {routed:?}; the tile kernel ran by hand"
            );
        }
    }
    eprintln!(
        "[tile_gemm_matches_reference] the router itself took the tile kernel on {routed_here} of {} GPUs",
        gpus.len()
    );
}
