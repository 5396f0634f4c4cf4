//! Random calls of every op, most of them invalid in one way (a dimension, a stride, a dtype,
//! an offset, a parameter, the data of an offsets or page table), on the CPU backend: each call
//! either succeeds or returns an input error (shape, stride, dtype, alignment, aliasing,
//! unsupported, out of bounds), never panics, and a call that fails leaves every output buffer
//! exactly as it was. The checks before dispatch are the same code on every backend; the
//! GPU-only rules (TMA alignment, device mismatch) are in errors.rs, which runs on every backend.
//! The planners (`calico bench --dry-run`) route random sizes, small to past usize, for every
//! GPU target through the routers that GPU calls use, with no GPU: each gives a plan or an
//! input error, never a panic (in a debug build, as CI runs it, no arithmetic may overflow).

use calico::ops::{
    self, AttentionCase, AttentionOptions, DecodeCase, GemmOptions, KvCache, RopeMode, RowOp,
};
use calico::{DType, Device, Epilogue, Error, Tensor};
use calico_conformance::gpu_backends;
use calico_conformance::rng::Rng;
use calico_conformance::tensors::write;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// What every element of a fresh buffer holds: exact in every dtype, and not what any op
/// writes for the zero-filled inputs here.
const SENTINEL: f64 = 7.0;

const CASES: usize = 4000;
/// On a GPU: enough for every op to reach both outcomes.
const GPU_CASES: usize = 600;

/// The op families, each of which must see both outcomes.
const OPS: [&str; 11] = [
    "rms_norm",
    "add_layer_norm",
    "softmax",
    "rope",
    "gemm",
    "attention",
    "attention_backward",
    "attention_decode contiguous",
    "attention_decode paged",
    "attention_varlen",
    "attention_varlen_backward",
];

/// One case's tensors: the buffers the outputs live in, checked after a failed call.
struct Case<'a> {
    dev: &'a Device,
    rng: &'a mut Rng,
    outputs: Vec<Tensor>,
    /// One perturbation of a tensor's layout in this many tensors.
    rate: usize,
}

impl Case<'_> {
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.rng.below(xs.len())]
    }

    fn one_in(&mut self, n: usize) -> bool {
        self.rng.below(n) == 0
    }

    /// A buffer of `len` elements of `dtype`, every one SENTINEL.
    fn buffer(&mut self, len: usize, dtype: DType) -> Tensor {
        let len = len.max(1);
        if dtype == DType::I32 {
            return self
                .dev
                .tensor(&vec![SENTINEL as i32; len], &[len])
                .unwrap();
        }
        let t = self.dev.zeros(&[len], dtype).unwrap();
        write(&t, &vec![SENTINEL; len]).unwrap();
        t
    }

    /// Usually `dtype`, once in a while another one.
    fn dtype_or_other(&mut self, dtype: DType) -> DType {
        if self.one_in(3 * self.rate) {
            self.pick(&[DType::BF16, DType::F16, DType::F32, DType::I32])
        } else {
            dtype
        }
    }

    /// A `[rows, cols]` view over a fresh buffer: rows padded or not, the storage transposed
    /// or not, an element offset or not, and now and then a zero stride (rows that overlap).
    fn matrix(&mut self, rows: usize, cols: usize, dtype: DType) -> Tensor {
        let transposed = self.one_in(self.rate);
        let (outer, inner) = if transposed {
            (cols, rows)
        } else {
            (rows, cols)
        };
        let ld = inner + self.pick(&[0, 0, 0, 1, 3, 8]);
        let offset = self.pick(&[0, 0, 0, 1, 2, 8]);
        let dtype = self.dtype_or_other(dtype);
        let buffer = self.buffer(outer.saturating_sub(1) * ld + inner + offset, dtype);
        let mut strides = if transposed { [1, ld] } else { [ld, 1] };
        if self.one_in(3 * self.rate) {
            strides[self.rng.below(2)] = 0;
        }
        buffer.as_strided(&[rows, cols], &strides, offset).unwrap()
    }

    /// `matrix` for an output: its buffer is checked after a failed call.
    fn output_matrix(&mut self, rows: usize, cols: usize, dtype: DType) -> Tensor {
        let t = self.matrix(rows, cols, dtype);
        self.outputs.push(t.clone());
        t
    }

    /// A view of `shape` over a fresh buffer: rows (the second-to-last dimension) padded or
    /// not, a rank-4 tensor laid out as [B, N, H, D] and viewed as [B, H, N, D] or not, an
    /// element offset or not; one time in `rate`, a dimension's stride that the ops reject (a
    /// strided last dimension) or that makes elements overlap (0), and now and then another
    /// dtype.
    fn tensor(&mut self, shape: &[usize], dtype: DType, output: bool) -> Tensor {
        let rank = shape.len();
        let swap = rank == 4 && self.one_in(4);
        let mut stored = shape.to_vec();
        if swap {
            stored.swap(1, 2);
        }
        let mut strides = vec![1usize; rank];
        for d in (0..rank.saturating_sub(1)).rev() {
            let pad = if d + 2 == rank {
                self.pick(&[0, 0, 0, 8])
            } else {
                0
            };
            strides[d] = strides[d + 1] * stored[d + 1] + pad;
        }
        if swap {
            strides.swap(1, 2);
        }
        if self.one_in(self.rate) {
            let d = self.rng.below(rank);
            strides[d] = self.pick(&[0, 2]);
        }
        let offset = self.pick(&[0, 0, 0, 1, 8]);
        let span = shape
            .iter()
            .zip(&strides)
            .map(|(&n, &s)| n.saturating_sub(1) * s)
            .sum::<usize>();
        let dtype = if self.one_in(3 * self.rate) {
            self.dtype_or_other(dtype)
        } else {
            dtype
        };
        let buffer = self.buffer(span + 1 + offset, dtype);
        let t = buffer.as_strided(shape, &strides, offset).unwrap();
        if output {
            self.outputs.push(t.clone());
        }
        t
    }

    fn vector(&mut self, len: usize, dtype: DType) -> Tensor {
        self.tensor(&[len], dtype, false)
    }

    fn i32s(&mut self, values: &[i32], shape: &[usize]) -> Tensor {
        self.dev.tensor(values, shape).unwrap()
    }

    /// A dimension that is usually `n` and sometimes off by one.
    fn near(&mut self, n: usize) -> usize {
        match self.rng.below(12) {
            0 => n + 1,
            1 => n.saturating_sub(1),
            _ => n,
        }
    }

    fn attention_options(&mut self) -> AttentionOptions {
        AttentionOptions {
            scale: self.pick(&[
                None,
                None,
                None,
                Some(0.5),
                Some(0.0),
                Some(1e30),
                Some(f32::NAN),
            ]),
            causal: self.one_in(2),
            window: self.pick(&[
                None,
                None,
                Some((0, 0)),
                Some((3, 1)),
                Some((usize::MAX, usize::MAX)),
            ]),
            softcap: self.pick(&[
                None,
                None,
                None,
                None,
                Some(30.0),
                Some(30.0),
                Some(0.0),
                Some(-1.0),
                Some(f32::NAN),
            ]),
            deterministic: self.one_in(2),
        }
    }

    /// Each output buffer still holds only SENTINEL.
    fn outputs_untouched(&self) -> Result<(), String> {
        for (i, t) in self.outputs.iter().enumerate() {
            let (start, end) = t.byte_span();
            let whole = t
                .as_strided(&[(end - start) / t.dtype().size_bytes()], &[1], 0)
                .map_err(|e| format!("output {i}: {e}"))?;
            let values = if t.dtype() == DType::I32 {
                whole
                    .to_vec::<i32>()
                    .map(|v| v.into_iter().map(f64::from).collect())
            } else {
                whole.to_f64_vec()
            }
            .map_err(|e| format!("output {i}: {e}"))?;
            if let Some(at) = values.iter().position(|&v| v != SENTINEL) {
                return Err(format!(
                    "output {i} written at element {at}: {}",
                    values[at]
                ));
            }
        }
        Ok(())
    }
}

/// Whether `e` names something wrong with the call's inputs (not a runtime or compile failure).
fn is_input_error(e: &Error) -> bool {
    matches!(
        e,
        Error::Shape(_)
            | Error::Stride(_)
            | Error::DType { .. }
            | Error::Alignment(_)
            | Error::Aliasing(_)
            | Error::Unsupported(_)
            | Error::OutOfBounds(_)
    )
}

/// Draws one call, runs it, and returns its op's index, a description and the result.
fn one_call(c: &mut Case<'_>) -> (usize, String, calico::Result<()>) {
    let op = c.rng.below(OPS.len());
    // Attention calls take five or more tensors: perturb each less often.
    c.rate = if op >= 5 { 30 } else { 5 };
    let float = [DType::BF16, DType::F16, DType::F32];
    let half = [DType::BF16, DType::F16];
    match op {
        0..=2 => {
            let rows = c.pick(&[0, 1, 2, 3, 7, 64]);
            let cols = c.pick(&[1, 2, 3, 7, 8, 9, 64, 1000, 4097]);
            let dtype = c.pick(&float);
            let x = c.matrix(rows, cols, dtype);
            let (wr, wc) = (c.near(1), c.near(cols));
            let w = c.matrix(wr, wc, dtype);
            let w = w.reshape(&[wc]).unwrap_or(w);
            let eps = c.pick(&[1e-6, 1e-6, 0.0, f32::NAN, -1.0, f32::INFINITY]);
            let y_rows = c.near(rows);
            let mut y = c.output_matrix(y_rows, cols, dtype);
            let what = format!(
                "x {:?}/{:?} {}, w {:?}, eps {eps}",
                x.shape(),
                x.strides(),
                x.dtype(),
                w.shape()
            );
            let result = match op {
                0 => ops::rms_norm(c.dev, &x, &w, eps, &mut y),
                1 => {
                    let residual = c.matrix(rows, cols, dtype);
                    let sum_cols = c.near(cols);
                    let mut sum = c.output_matrix(rows, sum_cols, dtype);
                    ops::add_layer_norm(
                        c.dev,
                        &x,
                        &residual,
                        Some(&w),
                        Some(&w),
                        eps,
                        &mut y,
                        &mut sum,
                    )
                }
                _ => ops::softmax(c.dev, &x, &mut y),
            };
            (op, what, result)
        }
        3 => {
            let (seq, heads) = (c.pick(&[0, 1, 5, 16]), c.pick(&[1, 2, 3]));
            let dim = c.pick(&[2, 4, 8, 64, 128, 3]);
            let dtype = c.pick(&float);
            let x = c.tensor(&[seq, heads, dim], dtype, false);
            let positions = c.pick(&[0, 1, 16, 40]);
            let half_dim = c.near(dim / 2);
            let cos = c.matrix(positions, half_dim, DType::F32);
            let sin = c.matrix(positions, half_dim, DType::F32);
            let offset = c.pick(&[0, 1, 20, usize::MAX, usize::MAX / 2]);
            let mode = c.pick(&[RopeMode::Interleaved, RopeMode::HalfSplit]);
            let mut y = c.tensor(&[seq, heads, dim], dtype, true);
            let what = format!(
                "x {:?}/{:?}, cos {:?}/{:?}, offset {offset}",
                x.shape(),
                x.strides(),
                cos.shape(),
                cos.strides()
            );
            (
                op,
                what,
                ops::rope(c.dev, &x, &cos, &sin, offset, mode, &mut y),
            )
        }
        4 => {
            let sizes = [0, 1, 2, 3, 7, 8, 9, 16, 17, 100];
            let (m, n, k) = (c.pick(&sizes), c.pick(&sizes), c.pick(&sizes));
            let dtype = c.pick(&half);
            let out = c.pick(&[dtype, dtype, DType::F32]);
            let a = c.matrix(m, k, dtype);
            let b_rows = c.near(k);
            let b = c.matrix(b_rows, n, dtype);
            let bias_len = c.near(n);
            let bias = c.one_in(3).then(|| c.vector(bias_len, out));
            let with_c = c.one_in(3).then(|| c.matrix(m, n, out));
            let mut d = c.output_matrix(m, n, out);
            let opts = GemmOptions {
                alpha: c.pick(&[1.0, 1.0, 0.0, f32::NAN]),
                beta: if with_c.is_some() {
                    c.pick(&[1.0, 0.5, f32::INFINITY])
                } else {
                    c.pick(&[0.0, 0.0, 1.0])
                },
                c: with_c.as_ref(),
                bias: bias.as_ref(),
                epilogue: c.pick(&[Epilogue::None, Epilogue::Gelu, Epilogue::Silu]),
            };
            let what = format!(
                "a {:?}/{:?}, b {:?}/{:?}, d {:?}/{:?} {}",
                a.shape(),
                a.strides(),
                b.shape(),
                b.strides(),
                d.shape(),
                d.strides(),
                d.dtype()
            );
            (op, what, ops::gemm(c.dev, &a, &b, &mut d, &opts))
        }
        5 | 6 => {
            let batch = c.pick(&[0, 1, 2]);
            let (hq, hkv) = (c.pick(&[1, 2, 4, 3]), c.pick(&[1, 2]));
            let (nq, nkv) = (c.pick(&[0, 1, 5, 17]), c.pick(&[0, 1, 5, 17]));
            let dim = c.pick(&[8, 64, 72, 128, 256, 264, 0]);
            let dtype = c.pick(&[DType::BF16, DType::F16, DType::BF16, DType::F32]);
            let q = c.tensor(&[batch, hq, nq, dim], dtype, false);
            let k_len = c.near(nkv);
            let k = c.tensor(&[batch, hkv, k_len, dim], dtype, false);
            let v = c.tensor(&[batch, hkv, nkv, dim], dtype, false);
            let opts = c.attention_options();
            let what = format!(
                "q {:?}/{:?}, k {:?}, v {:?}, {opts:?}",
                q.shape(),
                q.strides(),
                k.shape(),
                v.shape()
            );
            if op == 5 {
                let mut o = c.tensor(&[batch, hq, nq, dim], dtype, true);
                let lse_len = c.near(nq);
                let mut lse = c.tensor(&[batch, hq, lse_len], DType::F32, true);
                return (
                    op,
                    what,
                    ops::attention(c.dev, &q, &k, &v, &opts, &mut o, &mut lse),
                );
            }
            let o = c.tensor(&[batch, hq, nq, dim], dtype, false);
            let lse = c.tensor(&[batch, hq, nq], DType::F32, false);
            let d_o_len = c.near(nq);
            let d_o = c.tensor(&[batch, hq, d_o_len, dim], dtype, false);
            let mut dq = c.tensor(&[batch, hq, nq, dim], dtype, true);
            let mut dk = c.tensor(&[batch, hkv, nkv, dim], dtype, true);
            let mut dv = c.tensor(&[batch, hkv, nkv, dim], dtype, true);
            let result = ops::attention_backward(
                c.dev, &q, &k, &v, &o, &lse, &d_o, &opts, &mut dq, &mut dk, &mut dv,
            );
            (op, what, result)
        }
        7 | 8 => {
            let batch = c.pick(&[0, 1, 2]);
            let (hq, hkv) = (c.pick(&[1, 2, 4, 8]), c.pick(&[1, 2, 3]));
            let nq = c.pick(&[0, 1, 4, 16, 17]);
            let dim = c.pick(&[64, 128, 256, 8, 72]);
            let dtype = c.pick(&[DType::BF16, DType::F16, DType::BF16, DType::F32]);
            let q = c.tensor(&[batch, hq, nq, dim], dtype, false);
            let lens: Vec<i32> = (0..batch)
                .map(|_| c.pick(&[0, 1, 7, 16, 33, -5, i32::MAX]))
                .collect();
            let seq_lens = c.i32s(&lens, &[batch]);
            let opts = AttentionOptions {
                causal: c.one_in(2),
                ..AttentionOptions::default()
            };
            let mut o = c.tensor(&[batch, hq, nq, dim], dtype, true);
            let mut lse = c.tensor(&[batch, hq, nq], DType::F32, true);
            if op == 7 {
                let capacity = c.pick(&[0, 1, 16, 33]);
                let k = c.tensor(&[batch, hkv, capacity, dim], dtype, false);
                let v_len = c.near(capacity);
                let v = c.tensor(&[batch, hkv, v_len, dim], dtype, false);
                let what = format!(
                    "q {:?}, k {:?}, v {:?}, lens {lens:?}",
                    q.shape(),
                    k.shape(),
                    v.shape()
                );
                let cache = KvCache::Contiguous {
                    k: &k,
                    v: &v,
                    seq_lens: &seq_lens,
                };
                return (
                    op,
                    what,
                    ops::attention_decode(c.dev, &q, &cache, &opts, &mut o, &mut lse),
                );
            }
            let (pages, page_size, max_pages) = (
                c.pick(&[0, 1, 3]),
                c.pick(&[1, 16, 17, 256]),
                c.pick(&[0, 1, 3]),
            );
            let k = c.tensor(&[pages, page_size, hkv, dim], dtype, false);
            let v = c.tensor(&[pages, page_size, hkv, dim], dtype, false);
            let table: Vec<i32> = (0..batch * max_pages)
                .map(|_| c.pick(&[0, 1, 2, -1, 99]))
                .collect();
            let block_table = c.i32s(&table, &[batch, max_pages]);
            let what = format!(
                "q {:?}, pages {:?}, lens {lens:?}, table {table:?}",
                q.shape(),
                k.shape()
            );
            let cache = KvCache::Paged {
                k_pages: &k,
                v_pages: &v,
                block_table: &block_table,
                seq_lens: &seq_lens,
            };
            (
                op,
                what,
                ops::attention_decode(c.dev, &q, &cache, &opts, &mut o, &mut lse),
            )
        }
        _ => {
            let (hq, hkv, dim) = (c.pick(&[1, 2, 4]), c.pick(&[1, 2]), c.pick(&[8, 64, 128]));
            let sequences = c.pick(&[0, 1, 2, 3]);
            let offsets = |c: &mut Case<'_>| -> Vec<i32> {
                let mut at = 0;
                let mut cu: Vec<i32> = (0..=sequences)
                    .map(|i| {
                        at += if i == 0 { 0 } else { c.pick(&[0, 1, 3, 5]) };
                        at
                    })
                    .collect();
                if c.one_in(4) {
                    let i = c.rng.below(cu.len());
                    cu[i] = c.pick(&[-1, 100, 2]);
                }
                cu
            };
            let (cq, ck) = (offsets(c), offsets(c));
            let total = |cu: &[i32]| cu.last().map_or(0, |&t| t.max(0) as usize);
            let (tq, tk) = (c.near(total(&cq)), c.near(total(&ck)));
            let q = c.tensor(&[tq, hq, dim], DType::BF16, false);
            let k = c.tensor(&[tk, hkv, dim], DType::BF16, false);
            let v = c.tensor(&[tk, hkv, dim], DType::BF16, false);
            let (cu_q, cu_k) = (c.i32s(&cq, &[cq.len()]), c.i32s(&ck, &[ck.len()]));
            let opts = c.attention_options();
            let what = format!(
                "q {:?}, k {:?}, cu_q {cq:?}, cu_k {ck:?}, {opts:?}",
                q.shape(),
                k.shape()
            );
            if op == 9 {
                let mut o = c.tensor(&[tq, hq, dim], DType::BF16, true);
                let mut lse = c.tensor(&[hq, tq], DType::F32, true);
                return (
                    op,
                    what,
                    ops::attention_varlen(c.dev, &q, &k, &v, &cu_q, &cu_k, &opts, &mut o, &mut lse),
                );
            }
            let o = c.tensor(&[tq, hq, dim], DType::BF16, false);
            let lse = c.tensor(&[hq, tq], DType::F32, false);
            let d_o = c.tensor(&[tq, hq, dim], DType::BF16, false);
            let mut dq = c.tensor(&[tq, hq, dim], DType::BF16, true);
            let mut dk = c.tensor(&[tk, hkv, dim], DType::BF16, true);
            let mut dv = c.tensor(&[tk, hkv, dim], DType::BF16, true);
            let result = ops::attention_varlen_backward(
                c.dev, &q, &k, &v, &o, &lse, &d_o, &cu_q, &cu_k, &opts, &mut dq, &mut dk, &mut dv,
            );
            (op, what, result)
        }
    }
}

/// Counts `result` in `outcome` (`[succeeded, failed]`) and returns its error when that is not
/// an input error.
fn tally<'r>(outcome: &mut [usize; 2], result: &'r calico::Result<()>) -> Option<&'r Error> {
    outcome[usize::from(result.is_err())] += 1;
    result.as_ref().err().filter(|e| !is_input_error(e))
}

/// The message a panic carried.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// Fails with every failure, and with each name whose calls did not reach both outcomes
/// (`[succeeded, failed]`): the generator must cover the valid path and the errors.
fn finish(names: &[&str], outcomes: &[[usize; 2]], mut failures: Vec<String>) {
    for (name, [ok, err]) in names.iter().zip(outcomes) {
        if *ok == 0 || *err == 0 {
            failures.push(format!(
                "{name}: {ok} succeeded and {err} failed; the generator must reach both"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures[..failures.len().min(30)].join("\n")
    );
}

#[test]
fn random_calls_succeed_or_fail_cleanly() {
    random_calls(&Device::cpu(), CASES);
}

/// The same calls on each GPU backend, fewer of them (each new kernel variant compiles on
/// its first call): the checks before dispatch are shared, but the GPU routers add their own
/// (TMA alignment, 32-bit limits) and the valid calls reach the kernels with unusual strides,
/// offsets and views. After the calls the device must synchronise cleanly: no valid call may
/// fault on the device.
#[test]
fn random_calls_on_gpus_succeed_or_fail_cleanly() {
    let gpus = gpu_backends(
        "random_calls_on_gpus_succeed_or_fail_cleanly",
        "random op calls on a GPU",
    );
    for dev in gpus {
        random_calls(&dev, GPU_CASES);
        if let Err(e) = dev.synchronize() {
            panic!(
                "{}: the device failed after the random calls: {e}",
                dev.name()
            );
        }
    }
}

/// `cases` random calls on `dev` (a fixed seed: the same calls on every backend), checked as the
/// module says.
fn random_calls(dev: &Device, cases: usize) {
    let mut rng = Rng::new(0xca11_c0de);
    let mut outcomes = [[0usize; 2]; OPS.len()];
    let mut failures = Vec::new();
    for case in 0..cases {
        let mut c = Case {
            dev,
            rng: &mut rng,
            outputs: Vec::new(),
            rate: 5,
        };
        let called = catch_unwind(AssertUnwindSafe(|| one_call(&mut c)));
        let (op, what, result) = match called {
            Ok(r) => r,
            Err(p) => {
                failures.push(format!(
                    "{} case {case}: panicked: {}",
                    dev.name(),
                    panic_text(&*p)
                ));
                continue;
            }
        };
        if let Some(e) = tally(&mut outcomes[op], &result) {
            failures.push(format!(
                "{} case {case} {}: {what}: not an input error: {e}",
                dev.name(),
                OPS[op]
            ));
        }
        if let Err(e) = result {
            if let Err(written) = c.outputs_untouched() {
                failures.push(format!(
                    "{} case {case} {}: {what}: failed with `{e}` but {written}",
                    dev.name(),
                    OPS[op]
                ));
            }
        }
    }
    eprintln!(
        "{}: succeeded / failed calls per op: {:?}",
        dev.name(),
        OPS.iter().zip(outcomes).collect::<Vec<_>>()
    );
    finish(&OPS, &outcomes, failures);
}

/// Sizes from the empty to past usize, with the tile edges and the 32-bit limits between.
const PLAN_SIZES: [usize; 16] = [
    0,
    1,
    3,
    7,
    8,
    9,
    64,
    4095,
    4097,
    1 << 20,
    (1 << 31) - 1,
    1 << 31,
    1 << 32,
    1 << 40,
    usize::MAX / 2,
    usize::MAX,
];

#[test]
fn random_plans_route_or_fail_cleanly() {
    let targets = [
        "sm_90a",
        "sm_80",
        "sm_100a",
        "gfx942",
        "gfx90a",
        "x86_64",
        "no_such_gpu",
    ];
    let planners = [
        "plan_dense",
        "plan_row_op",
        "plan_attention",
        "plan_attention_decode",
    ];
    let row_ops = [
        RowOp::RmsNorm,
        RowOp::AddRmsNorm,
        RowOp::LayerNorm,
        RowOp::AddLayerNorm,
        RowOp::Softmax,
        RowOp::Rope,
    ];
    let dtypes = [DType::BF16, DType::F16, DType::F32];
    let mut rng = Rng::new(0x91a7);
    let mut outcomes = [[0usize; 2]; 4];
    let mut failures = Vec::new();
    for case in 0..20_000 {
        let target = targets[rng.below(targets.len())];
        let which = rng.below(planners.len());
        let [a, b, c, d] = std::array::from_fn(|_| PLAN_SIZES[rng.below(PLAN_SIZES.len())]);
        let pick = rng.below(60);
        let called = catch_unwind(AssertUnwindSafe(|| match which {
            0 => {
                let what = format!("{target} {a}x{b}x{c}");
                let result = calico::gemm::plan_dense(
                    target,
                    (a, b, c),
                    DType::BF16,
                    dtypes[pick % 3],
                    pick.is_multiple_of(2),
                )
                .map(drop);
                (what, result)
            }
            1 => {
                let op = row_ops[pick % row_ops.len()];
                let shape = if op == RowOp::Rope {
                    vec![b, c, d, 128]
                } else {
                    vec![b, c]
                };
                let what = format!("{target} {op:?} {shape:?}");
                let result = ops::plan_row_op(target, op, &shape, dtypes[pick % 3]).map(drop);
                (what, result)
            }
            2 => {
                let case = AttentionCase {
                    dtype: DType::BF16,
                    batch: a,
                    q_heads: b,
                    kv_heads: [1, 2, 8, b][pick % 4],
                    seq: c,
                    head_dim: [64, 128, 256, 72, d][pick % 5],
                    causal: pick.is_multiple_of(2),
                    backward: pick.is_multiple_of(3),
                    varlen: pick.is_multiple_of(5),
                    softcap: None,
                };
                let what = format!("{target} {case:?}");
                let result = ops::plan_attention(target, &case).map(drop);
                (what, result)
            }
            _ => {
                let case = DecodeCase {
                    dtype: DType::BF16,
                    batch: a,
                    q_heads: b,
                    kv_heads: [1, 2, 8, b][pick % 4],
                    head_dim: [64, 128, 256, d][pick % 4],
                    context: c,
                    page_size: [None, Some(16), Some(d)][pick % 3],
                };
                let what = format!("{target} {case:?}");
                let result = ops::plan_attention_decode(target, &case).map(drop);
                (what, result)
            }
        }));
        match called {
            Ok((what, result)) => {
                if let Some(e) = tally(&mut outcomes[which], &result) {
                    failures.push(format!(
                        "case {case} {} {what}: not an input error: {e}",
                        planners[which]
                    ));
                }
            }
            Err(p) => failures.push(format!(
                "case {case} {}: panicked: {}",
                planners[which],
                panic_text(&*p)
            )),
        }
    }
    finish(&planners, &outcomes, failures);
}
