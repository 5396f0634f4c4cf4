//! `CALICO_GEMM_ROUTE_AS`: GEMMs routed as another target would route them, on the GPU at
//! hand. This binary routes as sm_100a (Blackwell: TMA and mma.sync, no wgmma) unless the
//! variable names another target: it sets the variable for itself before any GEMM reads it
//! (the router reads it once per process), so on an H100 every GPU run takes Blackwell's path
//! (the TMA + mma.sync kernel for operands TMA can read, the GEMV for decode shapes) and checks
//! each result against an f64 reference. Without a CUDA device, or routed as a target other
//! than sm_100 / sm_100a, it reports itself skipped.

use calico::gemm::{gemm_kernel, gemm_with_kernel, matmul, GemmKernel, GemmOptions};
use calico::{AsyncCopy, BackendKind, DType, Device, Epilogue, Tensor};
use calico_conformance::compare::{check_close, check_normwise, gemm_tol};
use calico_conformance::reference::Gemm;
use calico_conformance::rng::{Dist, Rng};
use calico_conformance::tensors::{
    intact, matrix, round_all, untouched_outside, upload, MatrixMemory,
};
use half::bf16;
use std::sync::OnceLock;

/// The target this binary routes GEMMs as: `CALICO_GEMM_ROUTE_AS` when set, else sm_100a,
/// which it then sets. Every test calls this first, so the variable is written (once, while
/// the other tests wait here) before anything reads it.
fn routed_target() -> String {
    static TARGET: OnceLock<String> = OnceLock::new();
    TARGET
        .get_or_init(|| match std::env::var("CALICO_GEMM_ROUTE_AS") {
            Ok(t) => t.trim().to_string(),
            Err(_) => {
                std::env::set_var("CALICO_GEMM_ROUTE_AS", "sm_100a");
                "sm_100a".to_string()
            }
        })
        .clone()
}

/// The CUDA device, when this binary routes as sm_100 / sm_100a and one opens; otherwise
/// says why the test is skipped.
fn blackwell_routed_device(test: &str) -> Option<(Device, String)> {
    let target = routed_target();
    if !matches!(target.as_str(), "sm_100" | "sm_100a") {
        println!("[{test}] skipped: CALICO_GEMM_ROUTE_AS={target}, not sm_100 / sm_100a");
        return None;
    }
    match Device::open(BackendKind::Cuda, 0) {
        Ok(dev) => Some((dev, target)),
        Err(e) => {
            println!("[{test}] skipped: cuda backend unavailable: {e}");
            None
        }
    }
}

fn random_bf16(len: usize, seed: &mut u64) -> Vec<bf16> {
    (0..len)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            bf16::from_f32((*seed % 2001) as f32 / 1000.0 - 1.0)
        })
        .collect()
}

#[test]
fn gemm_routed_as_sm100_takes_the_mma_sync_kernels_and_matches_the_reference() {
    let Some((dev, target)) = blackwell_routed_device("route_as sm100") else {
        return;
    };
    // The TMA + mma.sync kernel where the device has TMA (an H100), else the cp.async one.
    let tma = if dev.arch().has_async_copy(AsyncCopy::Tma) {
        GemmKernel::Sm80Tma
    } else {
        GemmKernel::Sm80
    };
    let mut seed = 0x1234_5678_9abc_def1u64;
    // (m, n, k, B as an N x K weight, the kernel an sm_100 device takes)
    let cases = [
        (8, 1000, 520, true, GemmKernel::Gemv),
        (64, 4096, 1024, true, tma),
        (300, 1000, 520, true, tma),
        (300, 1000, 520, false, tma),
        (1024, 1024, 1024, false, tma),
        // K = 77: rows 154 bytes apart, which neither TMA nor 16-byte copies can read.
        (257, 129, 77, true, GemmKernel::Tile),
    ];
    for (m, n, k, weight, want) in cases {
        let a_host = random_bf16(m * k, &mut seed);
        let b_host = random_bf16(k * n, &mut seed);
        let a = dev.tensor(&a_host, &[m, k]).unwrap();
        // b_host is the weight W[n][k] (weight) or B[k][n] (rows).
        let (b, b_at): (Tensor, Box<dyn Fn(usize, usize) -> f64>) = if weight {
            let w = dev.tensor(&b_host, &[n, k]).unwrap();
            let bh = b_host.clone();
            (
                w.transpose(0, 1).unwrap(),
                Box::new(move |kk, j| f64::from(bh[j * k + kk].to_f32())),
            )
        } else {
            let bh = b_host.clone();
            (
                dev.tensor(&b_host, &[k, n]).unwrap(),
                Box::new(move |kk, j| f64::from(bh[kk * n + j].to_f32())),
            )
        };
        let mut d = dev.zeros(&[m, n], DType::F32).unwrap();
        let kernel = gemm_kernel(&dev, &a, &b, &d, &GemmOptions::default()).unwrap();
        let case = format!("{m}x{n}x{k} weight={weight}");
        assert_eq!(kernel, Some(want), "{case}: routed as {target}");
        matmul(&dev, &a, &b, &mut d).unwrap();
        let got: Vec<f32> = d.to_vec().unwrap();
        let mut worst = 0.0f64;
        for i in 0..m {
            for j in 0..n {
                let (mut dot, mut mag) = (0.0f64, 0.0f64);
                for kk in 0..k {
                    let p = f64::from(a_host[i * k + kk].to_f32()) * b_at(kk, j);
                    dot += p;
                    mag += p.abs();
                }
                let err = (f64::from(got[i * n + j]) - dot).abs();
                assert!(
                    err <= 1e-5 * mag + 1e-6,
                    "{case}: d[{i}][{j}] = {} but the reference is {dot}",
                    got[i * n + j]
                );
                worst = worst.max(err);
            }
        }
        println!("{case}: {kernel:?}, max abs error {worst:.2e}");
    }
}

/// One GEMM through the TMA + mma.sync kernel.
struct TmaCase {
    in_dtype: DType,
    out_dtype: DType,
    batch: Option<usize>,
    /// One B for every batch (batch stride 0; needs `batch`).
    broadcast_b: bool,
    m: usize,
    n: usize,
    k: usize,
    /// B as an N x K weight (K contiguous), else K x N rows.
    weight: bool,
    /// alpha = 1.5, beta = 0.5 with C, bias, GELU; else alpha = 1 alone.
    full_epilogue: bool,
    epilogue: Epilogue,
}

/// Pads a stored line of `len` elements to a multiple of 8 (16 bytes): what TMA reads.
fn pad16(len: usize) -> usize {
    len.next_multiple_of(8) - len
}

fn run_tma_case(dev: &Device, g: &TmaCase, seed: u64) -> Result<(), String> {
    let (bt, m, n, k) = (g.batch.unwrap_or(1), g.m, g.n, g.k);
    let what = format!(
        "{m}x{n}x{k} batch={bt}{} {}->{} weight={} {:?}{}",
        if g.broadcast_b { " (one B)" } else { "" },
        g.in_dtype,
        g.out_dtype,
        g.weight,
        g.epilogue,
        if g.full_epilogue {
            " alpha beta C bias"
        } else {
            ""
        }
    );
    let err = |e: calico::Error| format!("{what}: {e}");
    let mut rng = Rng::new(seed);
    let unit = Dist::Uniform { scale: 1.0 };
    let a = round_all(g.in_dtype, &unit.sample(&mut rng, bt * m * k));
    // A broadcast B is one matrix, repeated for the reference.
    let b_batches = if g.broadcast_b { 1 } else { bt };
    let b = round_all(g.in_dtype, &unit.sample(&mut rng, b_batches * k * n));
    let b_all: Vec<f64> = b.iter().copied().cycle().take(bt * k * n).collect();
    let c = round_all(g.out_dtype, &unit.sample(&mut rng, bt * m * n));
    let bias = round_all(g.out_dtype, &unit.sample(&mut rng, n));
    let row = |cols: usize| MatrixMemory {
        pad: pad16(cols),
        ..MatrixMemory::default()
    };
    let b_mem = if g.weight {
        MatrixMemory {
            col_major: true,
            pad: pad16(k),
            offset: 0,
        }
    } else {
        row(n)
    };
    let av = matrix(dev, g.in_dtype, g.batch, m, k, row(k), Some(&a)).map_err(err)?;
    let b_batch = if g.broadcast_b { None } else { g.batch };
    let bv = matrix(dev, g.in_dtype, b_batch, k, n, b_mem, Some(&b)).map_err(err)?;
    let b_op = if g.broadcast_b {
        let s = bv.view.strides();
        let offset = bv.view.layout().offset();
        bv.view
            .as_strided(&[bt, k, n], &[0, s[0], s[1]], offset)
            .map_err(err)?
    } else {
        bv.view.clone()
    };
    // C and D with any strides: D dense, C padded by one (not TMA-readable, read by the epilogue).
    let c_mem = MatrixMemory {
        pad: 1,
        ..MatrixMemory::default()
    };
    let cv = matrix(dev, g.out_dtype, g.batch, m, n, c_mem, Some(&c)).map_err(err)?;
    let mut dv = matrix(
        dev,
        g.out_dtype,
        g.batch,
        m,
        n,
        MatrixMemory::default(),
        None,
    )
    .map_err(err)?;
    let bias_t = upload(dev, g.out_dtype, &[n], &bias).map_err(err)?;
    let (alpha, beta) = if g.full_epilogue {
        (1.5, 0.5)
    } else {
        (1.0, 0.0)
    };
    let opts = GemmOptions {
        alpha,
        beta,
        c: g.full_epilogue.then_some(&cv.view),
        bias: g.full_epilogue.then_some(&bias_t),
        epilogue: g.epilogue,
    };
    // The router sends decode shapes (M <= 16 against a K-major weight) to the GEMV; every
    // other case must be routed here. The kernel itself runs every case (chosen by hand).
    let kernel = gemm_kernel(dev, &av.view, &b_op, &dv.view, &opts).map_err(err)?;
    let expected = if m <= 16 && kernel == Some(GemmKernel::Gemv) {
        GemmKernel::Gemv
    } else {
        GemmKernel::Sm80Tma
    };
    if kernel != Some(expected) {
        return Err(format!(
            "{what}: routed to {kernel:?}, not the TMA + mma.sync kernel"
        ));
    }
    gemm_with_kernel(
        dev,
        GemmKernel::Sm80Tma,
        &av.view,
        &b_op,
        &mut dv.view,
        &opts,
    )
    .map_err(err)?;
    let got = dv.view.to_f64_vec().map_err(err)?;
    let want = Gemm {
        batch: bt,
        m,
        n,
        k,
        a: &a,
        b: &b_all,
        c: g.full_epilogue.then_some(&c[..]),
        bias: g.full_epilogue.then_some(&bias[..]),
        alpha: f64::from(alpha),
        beta: f64::from(beta),
        epilogue: g.epilogue,
    }
    .all();
    let (normwise, elementwise) = gemm_tol(g.out_dtype);
    let with_what = |e: String| format!("{what}: {e}");
    check_normwise("d", &got, &want, normwise).map_err(with_what)?;
    check_close("d", &got, &want, elementwise).map_err(with_what)?;
    untouched_outside(&dv, "d").map_err(with_what)?;
    intact(&av, &a, "a").map_err(with_what)?;
    intact(&bv, &b, "b").map_err(with_what)
}

/// The TMA + mma.sync kernel (`GemmKernel::Sm80Tma`, Blackwell's GEMM) on random inputs
/// against the f64 reference: M, N and K at 1, 7, 129, 1000 and K tails past the 64-wide
/// stage, both B layouts, bf16 and f16 in, every output dtype, batches (also one B for all),
/// and with and without alpha, beta * C, bias and each epilogue. Each case asserts that this kernel ran it. Needs
/// TMA on the device (an H100); else skipped.
#[test]
fn tma_mma_sync_gemm_matches_the_reference() {
    let Some((dev, _)) = blackwell_routed_device("route_as tma gemm") else {
        return;
    };
    if !dev.arch().has_async_copy(AsyncCopy::Tma) {
        println!(
            "[route_as tma gemm] skipped: the device ({}) has no TMA",
            dev.arch().target
        );
        return;
    }
    // (m, n, k, batch)
    let shapes = [
        (1, 1, 1, None),
        (1, 7, 129, None),
        (7, 129, 1000, None),
        (129, 1000, 7, None),
        (1000, 7, 129, None),
        (129, 129, 65, None),
        (256, 384, 1000, None),
        (1000, 1000, 72, None),
        (129, 200, 136, Some(3)),
    ];
    let dtypes = [
        (DType::BF16, DType::BF16),
        (DType::F16, DType::F16),
        (DType::BF16, DType::F32),
        (DType::F16, DType::BF16),
    ];
    let epilogues = [Epilogue::None, Epilogue::Gelu, Epilogue::Silu];
    let mut failures = Vec::new();
    let mut ran = 0;
    for (i, &(m, n, k, batch)) in shapes.iter().enumerate() {
        for weight in [true, false] {
            for full_epilogue in [false, true] {
                let (in_dtype, out_dtype) = dtypes[(i + usize::from(weight)) % dtypes.len()];
                let g = TmaCase {
                    in_dtype,
                    out_dtype,
                    batch,
                    broadcast_b: false,
                    m,
                    n,
                    k,
                    weight,
                    full_epilogue,
                    epilogue: if full_epilogue {
                        epilogues[i % epilogues.len()]
                    } else {
                        Epilogue::None
                    },
                };
                let seed =
                    0x7a3a_0000 + (i as u64) * 4 + u64::from(weight) * 2 + u64::from(full_epilogue);
                if let Err(e) = run_tma_case(&dev, &g, seed) {
                    failures.push(e);
                }
                ran += 1;
            }
        }
    }
    // One B (a shared weight) for a batch of A: the B map's batch extent is 1.
    for weight in [true, false] {
        let g = TmaCase {
            in_dtype: DType::BF16,
            out_dtype: DType::F32,
            batch: Some(3),
            broadcast_b: true,
            m: 100,
            n: 136,
            k: 200,
            weight,
            full_epilogue: true,
            epilogue: Epilogue::Silu,
        };
        if let Err(e) = run_tma_case(&dev, &g, 0x7a3a_1000 + u64::from(weight)) {
            failures.push(e);
        }
        ran += 1;
    }
    println!(
        "[route_as tma gemm] {ran} cases on {}, {} failed",
        dev.arch().target,
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
