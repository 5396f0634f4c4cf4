//! Times the CPU GEMM outside `calico bench`, for tuning on a shared machine:
//!
//! ```sh
//! cargo run --release -p calico-cpu --example gemm_timing -- [filter] [runs] [kn]
//! ```
//!
//! bf16 A [M, K] times a bf16 weight W [N, K] transposed (torch Linear), or with `kn` a bf16
//! B [K, N] as it is, bf16 out; the whole call timed on the host. Prints the best and the median of `runs` calls (default 5), the
//! best's GFLOP/s and the weight bytes read per second (what bounds decode shapes).

mod common;

use calico_core::{DType, Epilogue, Tensor};
use calico_cpu::{gemm, CpuDevice};
use common::{best_and_median, filled};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let filter = args.first().cloned().unwrap_or_default();
    let runs = args.get(1).and_then(|r| r.parse().ok()).unwrap_or(5);
    let rows_of_b = args.get(2).is_some_and(|l| l == "kn");
    let dev = CpuDevice::new();
    let shapes: &[(usize, usize, usize)] = &[
        (1, 4096, 4096),
        (4, 4096, 4096),
        (8, 4096, 4096),
        (16, 4096, 4096),
        (64, 4096, 4096),
        (256, 4096, 4096),
        (1, 14336, 4096),
        (16, 14336, 4096),
        (16, 4096, 14336),
        (16, 4096, 4095),
        (256, 256, 256),
        (512, 512, 512),
        (1000, 999, 1000),
        (1024, 1024, 1024),
    ];
    for &(m, n, k) in shapes {
        let name = format!("gemm {m}x{n}x{k}");
        if !name.contains(&filter) {
            continue;
        }
        let a = filled(&dev, &[m, k]);
        let wt = if rows_of_b {
            filled(&dev, &[k, n])
        } else {
            filled(&dev, &[n, k]).transpose(0, 1).unwrap()
        };
        let d = Tensor::zeros(&dev, &[m, n], DType::BF16).unwrap();
        let call = || gemm(&a, &wt, None, &d, 1.0, 0.0, Epilogue::None, None).unwrap();
        call();
        let (best, median) = best_and_median(runs, call);
        println!(
            "{name:<24} best {:>9.3} ms  median {:>9.3} ms  {:>7.1} GFLOP/s  {:>6.1} GB/s of W",
            best * 1e3,
            median * 1e3,
            2.0 * (m * n * k) as f64 / best / 1e9,
            2.0 * (n * k) as f64 / best / 1e9
        );
    }
}
