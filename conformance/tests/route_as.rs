//! `CALICO_GEMM_ROUTE_AS`: GEMMs routed as another target would route them, on the GPU at
//! hand. Run with `CALICO_GEMM_ROUTE_AS=sm_100a` on an H100, this takes Blackwell's path (no
//! wgmma there: the sm_80 mma.sync kernel, and the GEMV for decode shapes) and checks each
//! result against an f64 reference. Without the variable, or without a CUDA device, it reports
//! itself skipped.

use calico::gemm::{gemm_kernel, matmul, GemmKernel, GemmOptions};
use calico::{BackendKind, DType, Device, Tensor};
use half::bf16;

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
    let target = std::env::var("CALICO_GEMM_ROUTE_AS").unwrap_or_default();
    if !matches!(target.trim(), "sm_100" | "sm_100a") {
        println!("skipped: CALICO_GEMM_ROUTE_AS is not sm_100 / sm_100a");
        return;
    }
    let dev = match Device::open(BackendKind::Cuda, 0) {
        Ok(dev) => dev,
        Err(e) => {
            println!("skipped: cuda backend unavailable: {e}");
            return;
        }
    };
    let mut seed = 0x1234_5678_9abc_def1u64;
    // (m, n, k, B as an N x K weight, the kernel an sm_100 device takes)
    let cases = [
        (8, 1000, 520, true, GemmKernel::Gemv),
        (64, 4096, 1024, true, GemmKernel::Sm80),
        (300, 1000, 520, true, GemmKernel::Sm80),
        (300, 1000, 520, false, GemmKernel::Sm80),
        (1024, 1024, 1024, false, GemmKernel::Sm80),
        // K = 77: rows 154 bytes apart, which the 16-byte copies cannot take (on sm_100 too).
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
