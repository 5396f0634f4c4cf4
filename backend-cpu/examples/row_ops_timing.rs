//! Times the CPU row ops outside `calico bench`, for tuning on a shared machine:
//!
//! ```sh
//! cargo run --release -p calico-cpu --example row_ops_timing -- [threads] [filter] [hot|copy]
//! ```
//!
//! - default: [4096, 4096] bf16 rows (rope [1, 512, 32, 128]), 15 runs each, interleaved with
//!   the backend's copy of 256 MiB (`copy_bytes`, on the same threads) so that load from other
//!   processes hits both alike; min and median GB/s (bytes read + written) and their % of the
//!   copy.
//! - `hot`: 32 rows (rope 8 positions), which stay in the L2, 2000 runs: the compute cost in ns
//!   per 4 bytes moved (per element of a bf16 op with one input and one output), without
//!   memory stalls. The 256 MiB copy moves 4 bytes in about 0.11 ns on the 2-vCPU EPYC.
//! - `copy`: the copy itself, by `memcpy` and by plain vector stores, on 1 and `threads`
//!   threads, and by the backend's `copy_bytes`.

mod common;

use calico_core::{Backend, DType, Storage, Tensor};
use calico_cpu::CpuDevice;
use common::{filled, seconds};
use rayon::prelude::*;
use std::hint::black_box;

/// The backend's own copy between two storages: the yardstick `calico bench` uses.
struct BackendCopy {
    dev: CpuDevice,
    src: std::sync::Arc<dyn Storage>,
    dst: std::sync::Arc<dyn Storage>,
    bytes: usize,
}

impl BackendCopy {
    fn new(dev: &CpuDevice, bytes: usize) -> Self {
        let src = dev.alloc(bytes).expect("a source buffer");
        src.write_bytes(0, &vec![1u8; bytes]).expect("filled");
        BackendCopy {
            dev: dev.clone(),
            src,
            dst: dev.alloc(bytes).expect("a destination buffer"),
            bytes,
        }
    }

    fn run(&self) {
        self.dev
            .copy_bytes(&*self.dst, 0, &*self.src, 0, self.bytes)
            .expect("copy_bytes");
    }
}

/// One op: its name, bytes moved per call, and the call.
type Case<'a> = (&'a str, f64, Box<dyn Fn() + Sync + 'a>);

fn copy_rates(
    pool: &rayon::ThreadPool,
    threads: usize,
    src: &[u8],
    dst: &mut [u8],
    backend_copy: &BackendCopy,
) {
    // A copy through plain vector stores (a loop LLVM cannot turn into memcpy).
    let plain = |d: &mut [u8], s: &[u8]| {
        for (d, s) in d.iter_mut().zip(s) {
            *d = *s ^ 1;
        }
    };
    let gb = 2.0 * src.len() as f64 / 1e9;
    for _ in 0..5 {
        let memcpy1 = seconds(|| dst.copy_from_slice(black_box(src)));
        let memcpy_n = pool.install(|| {
            seconds(|| {
                dst.par_chunks_mut(1 << 20)
                    .zip(src.par_chunks(1 << 20))
                    .for_each(|(d, s)| d.copy_from_slice(s))
            })
        });
        let plain1 = seconds(|| plain(dst, black_box(src)));
        let plain_n = pool.install(|| {
            seconds(|| {
                dst.par_chunks_mut(1 << 17)
                    .zip(src.par_chunks(1 << 17))
                    .for_each(|(d, s)| plain(d, s))
            })
        });
        black_box(&mut *dst);
        let backend = pool.install(|| seconds(|| backend_copy.run()));
        println!(
            "memcpy: 1 thread {:5.1} GB/s, {threads} threads {:5.1}; plain stores: 1 thread {:5.1}, {threads} threads {:5.1}; copy_bytes {:5.1}",
            gb / memcpy1,
            gb / memcpy_n,
            gb / plain1,
            gb / plain_n,
            gb / backend,
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(2);
    let filter = args.get(2).cloned().unwrap_or_default();
    let mode = args.get(3).map(String::as_str).unwrap_or("");
    let hot = mode == "hot";
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool");
    let dev = CpuDevice::new();
    let backend_copy = BackendCopy::new(&dev, 256 << 20);
    if mode == "copy" {
        let src = vec![1u8; 256 << 20];
        let mut dst = vec![0u8; 256 << 20];
        copy_rates(&pool, threads, &src, &mut dst, &backend_copy);
        return;
    }

    // COLS=1024 for the shorter rows of the bench.
    let cols: usize = std::env::var("COLS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(4096);
    let (rows, cols) = (if hot { 32 * 4096 / cols } else { 4096 }, cols);
    let (x, r) = (filled(&dev, &[rows, cols]), filled(&dev, &[rows, cols]));
    let (y, s) = (filled(&dev, &[rows, cols]), filled(&dev, &[rows, cols]));
    let (w, b) = (filled(&dev, &[cols]), filled(&dev, &[cols]));
    let (seq, heads, dim) = (if hot { 8 } else { 512 }, 32, 128);
    let (rx, ry) = (
        filled(&dev, &[1, seq, heads, dim]),
        filled(&dev, &[1, seq, heads, dim]),
    );
    let table = Tensor::zeros(&dev, &[seq, dim / 2], DType::F32).unwrap();
    let bytes = |t: &Tensor| t.shape().iter().product::<usize>() as f64 * 2.0;
    let (row_op, rope_op) = (2.0 * bytes(&x), 2.0 * bytes(&rx));
    let eps = 1e-5;
    let cases: Vec<Case> = vec![
        (
            "rms_norm",
            row_op,
            Box::new(|| calico_cpu::rms_norm(&x, None, &w, eps, &y, None).unwrap()),
        ),
        (
            "layer_norm",
            row_op,
            Box::new(|| {
                calico_cpu::layer_norm(&x, None, Some(&w), Some(&b), eps, &y, None).unwrap()
            }),
        ),
        (
            "add_rms_norm",
            2.0 * row_op,
            Box::new(|| calico_cpu::rms_norm(&x, Some(&r), &w, eps, &y, Some(&s)).unwrap()),
        ),
        (
            "add_layer_norm",
            2.0 * row_op,
            Box::new(|| {
                calico_cpu::layer_norm(&x, Some(&r), Some(&w), Some(&b), eps, &y, Some(&s)).unwrap()
            }),
        ),
        (
            "softmax",
            row_op,
            Box::new(|| calico_cpu::softmax(&x, &y).unwrap()),
        ),
        (
            "rope",
            rope_op,
            Box::new(|| calico_cpu::rope(&rx, &table, &table, 0, false, &ry).unwrap()),
        ),
        (
            "rope interleaved",
            rope_op,
            Box::new(|| calico_cpu::rope(&rx, &table, &table, 0, true, &ry).unwrap()),
        ),
    ];
    for (name, bytes, op) in cases.iter().filter(|c| c.0.contains(filter.as_str())) {
        let (mut op_s, mut copy_s) = (Vec::new(), Vec::new());
        pool.install(op);
        for _ in 0..if hot { 2000 } else { 15 } {
            op_s.push(pool.install(|| seconds(op)));
            if !hot {
                copy_s.push(pool.install(|| seconds(|| backend_copy.run())));
            }
        }
        op_s.sort_by(f64::total_cmp);
        if hot {
            println!(
                "{name:18} hot: min {:.3} ns per 4 bytes",
                op_s[0] / bytes * 4e9
            );
            continue;
        }
        copy_s.sort_by(f64::total_cmp);
        let gbs = |t: f64| bytes / t / 1e9;
        let copy_gbs = |t: f64| 2.0 * backend_copy.bytes as f64 / t / 1e9;
        let mid = op_s.len() / 2;
        println!(
            "{name:18} min {:6.3} ms {:5.1} GB/s ({:3.0}% of the fastest copy, {:5.1} GB/s); median {:6.3} ms {:5.1} GB/s ({:3.0}% of the median copy, {:5.1} GB/s)",
            op_s[0] * 1e3,
            gbs(op_s[0]),
            100.0 * gbs(op_s[0]) / copy_gbs(copy_s[0]),
            copy_gbs(copy_s[0]),
            op_s[mid] * 1e3,
            gbs(op_s[mid]),
            100.0 * gbs(op_s[mid]) / copy_gbs(copy_s[mid]),
            copy_gbs(copy_s[mid]),
        );
    }
}
