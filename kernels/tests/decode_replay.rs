//! Decode attention over a long cache splits the KV length and merges the splits: by a second
//! launch, or (`CALICO_DECODE_TUNE=fuse=1`) in the last block of each split group, counted
//! through the device's counter buffer. Either way a call captured into a CUDA graph replays to
//! the eager result bit for bit, and threads that call it at once on one device each get their
//! own result bit for bit; both agree with the CPU backend.

use calico::ops::{self, AttentionOptions, KvCache};
use calico::{DType, Device, Tensor};

mod common;
use common::cuda;

const HQ: usize = 32;
const HKV: usize = 8;
const DIM: usize = 128;
const PAGE: usize = 16;

/// Values in [-1, 1) from a seed (xorshift64).
fn values(seed: u64, n: usize) -> Vec<half::bf16> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            half::bf16::from_f32((x >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
        })
        .collect()
}

/// One batch-1 call over a paged cache of `len` tokens (pages in a scrambled order).
struct Call {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    table: Tensor,
    lens: Tensor,
    o: Tensor,
    lse: Tensor,
}

impl Call {
    fn new(dev: &Device, seed: u64, len: usize) -> Call {
        let pages = len.div_ceil(PAGE);
        let order: Vec<i32> = (0..pages).map(|i| ((i * 7 + 3) % pages) as i32).collect();
        let kv = pages * PAGE * HKV * DIM;
        let shape = [pages, PAGE, HKV, DIM];
        Call {
            q: dev
                .tensor(&values(seed, HQ * DIM), &[1, HQ, 1, DIM])
                .unwrap(),
            k: dev.tensor(&values(seed + 1, kv), &shape).unwrap(),
            v: dev.tensor(&values(seed + 2, kv), &shape).unwrap(),
            table: dev.tensor(&order, &[1, pages]).unwrap(),
            lens: dev.tensor(&[len as i32], &[1]).unwrap(),
            o: dev.zeros(&[1, HQ, 1, DIM], DType::BF16).unwrap(),
            lse: dev.zeros(&[1, HQ, 1], DType::F32).unwrap(),
        }
    }

    /// The same call's inputs on another device.
    fn on(&self, dev: &Device) -> Call {
        let bf = |t: &Tensor| {
            dev.tensor(&t.to_vec::<half::bf16>().unwrap(), t.shape())
                .unwrap()
        };
        Call {
            q: bf(&self.q),
            k: bf(&self.k),
            v: bf(&self.v),
            table: dev
                .tensor(&self.table.to_vec::<i32>().unwrap(), self.table.shape())
                .unwrap(),
            lens: dev
                .tensor(&self.lens.to_vec::<i32>().unwrap(), &[1])
                .unwrap(),
            o: dev.zeros(self.o.shape(), DType::BF16).unwrap(),
            lse: dev.zeros(self.lse.shape(), DType::F32).unwrap(),
        }
    }

    fn run(&mut self, dev: &Device) -> calico::Result<()> {
        let cache = KvCache::Paged {
            k_pages: &self.k,
            v_pages: &self.v,
            block_table: &self.table,
            seq_lens: &self.lens,
        };
        let opts = AttentionOptions::default();
        ops::attention_decode(dev, &self.q, &cache, &opts, &mut self.o, &mut self.lse)
    }

    /// O and LSE as read back, as bit patterns.
    fn outputs(&self) -> Vec<u64> {
        let o = self.o.to_f64_vec().unwrap();
        let lse = self.lse.to_f64_vec().unwrap();
        o.iter().chain(&lse).map(|x| x.to_bits()).collect()
    }

    fn poison(&self) {
        self.o
            .copy_from_slice(&[half::bf16::NAN; HQ * DIM])
            .unwrap();
        self.lse.copy_from_slice(&[f32::NAN; HQ]).unwrap();
    }
}

/// The GPU's result matches the CPU backend's on the same inputs.
fn assert_matches_cpu(call: &Call, gpu_bits: &[u64]) {
    let cpu = Device::cpu();
    let mut c = call.on(&cpu);
    c.run(&cpu).unwrap();
    let want = c.outputs();
    assert_eq!(want.len(), gpu_bits.len());
    for (i, (&g, &w)) in gpu_bits.iter().zip(&want).enumerate() {
        let (g, w) = (f64::from_bits(g), f64::from_bits(w));
        assert!(
            (g - w).abs() <= 1e-2 + 1e-2 * w.abs(),
            "element {i}: GPU {g}, CPU {w}"
        );
    }
}

#[test]
fn a_captured_split_decode_replays_to_the_eager_result() {
    let Some(cuda) = cuda() else { return };
    let dev = Device::Cuda(cuda.clone());
    for len in [4000, 8192] {
        let mut call = Call::new(&dev, len as u64, len);
        call.run(&dev).unwrap(); // compiles, loads, sizes the scratch buffers
        let eager = call.outputs();
        assert_matches_cpu(&call, &eager);
        call.poison();
        let loaded = cuda.loaded_kernels();
        let graph = cuda.capture_graph(|| call.run(&dev)).unwrap();
        assert_eq!(cuda.loaded_kernels(), loaded, "capture compiled a kernel");
        for round in 0..3 {
            for _ in 0..10 {
                graph.launch().unwrap();
            }
            assert!(
                call.outputs() == eager,
                "len {len}: replay {round} differs from eager"
            );
        }
        // Eager calls after the replays still agree (the counters were left at zero).
        call.run(&dev).unwrap();
        assert!(
            call.outputs() == eager,
            "len {len}: eager after replay differs"
        );
    }
}

#[test]
fn threads_calling_split_decode_at_once_get_their_own_results() {
    let Some(cuda) = cuda() else { return };
    let dev = Device::Cuda(cuda);
    let mut calls: Vec<Call> = (0..4)
        .map(|t| Call::new(&dev, 100 + t, 3000 + 1000 * t as usize))
        .collect();
    let alone: Vec<Vec<u64>> = calls
        .iter_mut()
        .map(|c| {
            c.run(&dev).unwrap();
            c.outputs()
        })
        .collect();
    assert_matches_cpu(&calls[3], &alone[3]);
    std::thread::scope(|s| {
        for (t, (call, want)) in calls.iter_mut().zip(&alone).enumerate() {
            let dev = &dev;
            s.spawn(move || {
                for i in 0..20 {
                    call.run(dev).unwrap();
                    assert!(call.outputs() == *want, "thread {t}, call {i} differs");
                }
            });
        }
    });
}
