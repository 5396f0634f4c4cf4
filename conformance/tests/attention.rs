//! Attention forward and backward against the f64 reference: shapes around every tile edge
//! (N = 1, odd N, Nq != Nkv), GQA ratios up to 8, both memory layouts with padding and odd
//! offsets, causal, windowed and soft-capped scores, large logits, fully masked rows.

use calico::ops::{self, AttentionOptions};
use calico::{DType, Device, Tensor};
use calico_conformance::compare::{check_close, check_normwise, elementwise_tol};
use calico_conformance::reference::{self, AttentionDims};
use calico_conformance::rng::{Dist, Rng};
use calico_conformance::tensors::{intact, round_all, untouched_outside, view, write, View};
use calico_conformance::{gpu_backends, property, report_skipped, Ctx};
use proptest::prelude::*;
use proptest::sample::select;

/// Sequence lengths around the GPU tiles (64 and 128 rows) and tiny ones.
const EDGE_LENS: [usize; 12] = [1, 2, 3, 17, 63, 64, 65, 127, 128, 129, 191, 257];
/// Multiply-adds per case (B * Hq * Nq * Nkv * D): keeps the debug CPU build and the f64
/// reference quick.
const BUDGET: usize = 3_000_000;

/// Options with a causal mask (bottom-right aligned).
fn causal_mask() -> AttentionOptions {
    AttentionOptions {
        causal: true,
        ..Default::default()
    }
}

/// A causal mask with Grok-1's logit soft-cap (30).
fn softcapped_causal() -> AttentionOptions {
    AttentionOptions {
        causal: true,
        softcap: Some(30.0),
        ..Default::default()
    }
}

/// `c` with O (and dO) stored like Q: the aligned output views.
fn aligned_out(mut c: Case) -> Case {
    c.o_mem = c.q_mem;
    c
}

/// Options with a sliding window of `left` keys before and `right` after the diagonal.
fn window_mask(left: usize, right: usize) -> AttentionOptions {
    AttentionOptions {
        window: Some((left, right)),
        ..Default::default()
    }
}

/// How a `[B, H, N, D]` operand sits in memory.
#[derive(Debug, Clone, Copy)]
struct Memory {
    /// Stored as `[B, N, H, D]` and passed as its `transpose(1, 2)` view.
    seq_major: bool,
    /// Extra elements after each head_dim row.
    pad: usize,
    /// Element offset of the view (an odd one breaks 16-byte alignment).
    offset: usize,
}

fn memory() -> impl Strategy<Value = Memory> {
    (
        any::<bool>(),
        select(vec![0usize, 0, 8, 3]),
        select(vec![0usize, 0, 8, 1]),
    )
        .prop_map(|(seq_major, pad, offset)| Memory {
            seq_major,
            pad,
            offset,
        })
}

#[derive(Debug, Clone)]
struct Case {
    dtype: DType,
    dims: AttentionDims,
    opts: AttentionOptions,
    q_mem: Memory,
    kv_mem: Memory,
    o_mem: Memory,
    /// Scale of the input values: 4 gives logits in the hundreds.
    spread: f64,
    seed: u64,
}

fn case(head_dims: Vec<usize>) -> impl Strategy<Value = Case> {
    let lens = prop_oneof![3 => select(EDGE_LENS.to_vec()), 1 => 1usize..=300];
    (
        (
            select(vec![DType::BF16, DType::F16]),
            1usize..=2,
            1usize..=2,
            select(vec![1usize, 2, 3, 4, 8]),
            lens.clone(),
            lens,
            select(head_dims),
        ),
        (
            any::<bool>(),
            prop::option::of((0usize..80, 0usize..80)),
            prop::option::weighted(0.25, select(vec![5.0f32, 30.0])),
            prop::option::weighted(0.25, select(vec![0.05f32, 0.3])),
        ),
        (memory(), memory(), memory()),
        select(vec![0.5, 1.0, 4.0]),
        any::<u64>(),
    )
        .prop_map(
            |((dtype, batch, kv_heads, group, q_len, k_len, head_dim), opt, mem, spread, seed)| {
                let (causal, window, softcap, scale) = opt;
                let mut dims = AttentionDims {
                    batch,
                    q_heads: kv_heads * group,
                    kv_heads,
                    q_len,
                    k_len,
                    head_dim,
                };
                shrink_to_budget(&mut dims);
                Case {
                    dtype,
                    dims,
                    opts: AttentionOptions {
                        scale,
                        causal,
                        window,
                        softcap,
                        deterministic: false,
                    },
                    q_mem: mem.0,
                    kv_mem: mem.1,
                    o_mem: mem.2,
                    spread,
                    seed,
                }
            },
        )
}

fn work(d: &AttentionDims) -> usize {
    d.batch * d.q_heads * d.q_len * d.k_len * d.head_dim
}

fn shrink_to_budget(d: &mut AttentionDims) {
    while work(d) > BUDGET && d.batch > 1 {
        d.batch -= 1;
    }
    while work(d) > BUDGET && (d.q_len > 1 || d.k_len > 1) {
        if d.q_len >= d.k_len {
            d.q_len = d.q_len.div_ceil(2);
        } else {
            d.k_len = d.k_len.div_ceil(2);
        }
    }
}

/// A `[b, h, n, d]` view stored as `mem` says, filled with `values` (or NaN when `None`).
fn operand(
    dev: &Device,
    dtype: DType,
    shape: [usize; 4],
    mem: Memory,
    values: Option<&[f64]>,
) -> calico::Result<View> {
    let [_, h, n, d] = shape;
    let row = d + mem.pad;
    let strides = if mem.seq_major {
        [n * h * row, row, h * row, 1]
    } else {
        [h * n * row, n * row, row, 1]
    };
    let v = view(dev, dtype, &shape, &strides, mem.offset, Some(f64::NAN))?;
    if let Some(values) = values {
        write(&v.view, values)?;
    }
    Ok(v)
}

fn sample(dtype: DType, rng: &mut Rng, n: usize, spread: f64) -> Vec<f64> {
    let v: Vec<f64> = Dist::Normal { scale: spread }.sample(rng, n);
    round_all(dtype, &v)
}

/// An f32 `[B, Hq, Nq]` LSE tensor, poisoned with NaN.
fn lse_tensor(dev: &Device, dims: &AttentionDims) -> calico::Result<Tensor> {
    let n = dims.batch * dims.q_heads * dims.q_len;
    let t = dev.zeros(&[dims.batch, dims.q_heads, dims.q_len], DType::F32)?;
    t.copy_from_slice(&vec![f32::NAN; n])?;
    Ok(t)
}

/// The LSE matches where the reference is finite and is exactly -inf where it is -inf; rows
/// with -inf LSE have an all-zero output.
fn check_lse_and_masked_rows(
    got_lse: &[f64],
    ref_lse: &[f64],
    got_o: &[f64],
    d: usize,
) -> Result<(), String> {
    let mut finite_got = Vec::new();
    let mut finite_ref = Vec::new();
    for (r, (&g, &e)) in got_lse.iter().zip(ref_lse).enumerate() {
        if e == f64::NEG_INFINITY {
            if g != f64::NEG_INFINITY {
                return Err(format!("lse[{r}] = {g}, expected -inf (row sees no key)"));
            }
            if let Some(c) = (0..d).find(|&c| got_o[r * d + c] != 0.0) {
                return Err(format!(
                    "fully masked row {r}: o[{c}] = {}, expected 0",
                    got_o[r * d + c]
                ));
            }
        } else {
            finite_got.push(g);
            finite_ref.push(e);
        }
    }
    // A log-sum-exp is computed in f32 from exact inputs: its error is absolute, a few f32
    // roundings of the largest score (or of 1 when the scores are small).
    let scale = finite_ref.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    let tol = 2e-4 * scale;
    let off = |i: usize| (finite_got[i] - finite_ref[i]).abs() > tol || finite_got[i].is_nan();
    match (0..finite_ref.len()).find(|&i| off(i)) {
        Some(i) => Err(format!(
            "lse: got {}, expected {} (tolerance {tol:.2e})",
            finite_got[i], finite_ref[i]
        )),
        None => Ok(()),
    }
}

struct Inputs {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    qv: View,
    kv: View,
    vv: View,
}

fn inputs(dev: &Device, c: &Case) -> Result<Inputs, String> {
    let d = &c.dims;
    let mut rng = Rng::new(c.seed);
    let q = sample(
        c.dtype,
        &mut rng,
        d.batch * d.q_heads * d.q_len * d.head_dim,
        c.spread,
    );
    let k = sample(
        c.dtype,
        &mut rng,
        d.batch * d.kv_heads * d.k_len * d.head_dim,
        c.spread,
    );
    let v = sample(
        c.dtype,
        &mut rng,
        d.batch * d.kv_heads * d.k_len * d.head_dim,
        1.0,
    );
    let qshape = [d.batch, d.q_heads, d.q_len, d.head_dim];
    let kshape = [d.batch, d.kv_heads, d.k_len, d.head_dim];
    let qv = operand(dev, c.dtype, qshape, c.q_mem, Some(&q)).ctx("allocating q")?;
    let kv = operand(dev, c.dtype, kshape, c.kv_mem, Some(&k)).ctx("allocating k")?;
    let vv = operand(dev, c.dtype, kshape, c.kv_mem, Some(&v)).ctx("allocating v")?;
    Ok(Inputs {
        q,
        k,
        v,
        qv,
        kv,
        vv,
    })
}

fn forward_case(dev: &Device, c: &Case) -> Result<(), String> {
    let d = &c.dims;
    let x = inputs(dev, c)?;
    let qshape = [d.batch, d.q_heads, d.q_len, d.head_dim];
    let mut o = operand(dev, c.dtype, qshape, c.o_mem, None).ctx("allocating o")?;
    let mut lse = lse_tensor(dev, d).ctx("allocating lse")?;
    ops::attention(
        dev,
        &x.qv.view,
        &x.kv.view,
        &x.vv.view,
        &c.opts,
        &mut o.view,
        &mut lse,
    )
    .ctx("attention")?;
    let got_o = o.view.to_f64_vec().ctx("reading o")?;
    let got_lse = lse.to_f64_vec().ctx("reading lse")?;
    let (ref_o, ref_lse) = reference::attention_reference(&x.q, &x.k, &x.v, d, &c.opts);
    check_close("o", &got_o, &ref_o, elementwise_tol(c.dtype))?;
    check_lse_and_masked_rows(&got_lse, &ref_lse, &got_o, d.head_dim)?;
    untouched_outside(&o, "o")?;
    intact(&x.qv, &x.q, "q")?;
    intact(&x.kv, &x.k, "k")?;
    intact(&x.vv, &x.v, "v")
}

/// Gradient tolerances (normwise, elementwise against the largest value): the kernels round
/// P and dS to the input dtype before their matrix products, as FlashAttention does.
fn grad_tol(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::BF16 => (3e-2, 6e-2),
        _ => (5e-3, 1e-2),
    }
}

fn check_grad(what: &str, dtype: DType, got: &[f64], expected: &[f64]) -> Result<(), String> {
    let (norm, elem) = grad_tol(dtype);
    let scale = expected.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    if scale < GRAD_FLOOR {
        // Gradients that vanish in exact arithmetic (a row that sees one key, a one-hot
        // softmax) are sums of rounding errors: compare absolutely, at the inputs' scale.
        let tol = elem * GRAD_FLOOR;
        return match (0..got.len())
            .find(|&i| (got[i] - expected[i]).abs() > tol || !got[i].is_finite())
        {
            Some(i) => Err(format!(
                "`{what}`: element {i} is {}, expected {} (absolute tolerance {tol:.1e})",
                got[i], expected[i]
            )),
            None => Ok(()),
        };
    }
    check_normwise(what, got, expected, norm)?;
    check_close(what, got, expected, elem)
}

/// Below this largest |gradient| a gradient is compared absolutely (inputs are O(1)).
const GRAD_FLOOR: f64 = 0.05;

/// What the backward reads besides Q, K and V: the output gradient, and the forward's O
/// (rounded to the dtype, as a forward stores it) and LSE from the f64 reference.
struct BackwardFeed {
    d_o: Vec<f64>,
    o: Vec<f64>,
    lse: Vec<f64>,
}

fn backward_feed(c: &Case, x: &Inputs) -> BackwardFeed {
    let mut rng = Rng::new(c.seed ^ 0x5eed);
    let d_o = sample(c.dtype, &mut rng, x.q.len(), 1.0);
    let (o, lse) = reference::attention_reference(&x.q, &x.k, &x.v, &c.dims, &c.opts);
    BackwardFeed {
        d_o,
        o: round_all(c.dtype, &o),
        lse,
    }
}

/// Runs the backward on `c` and returns (dq, dk, dv) as read back.
fn run_backward(
    dev: &Device,
    c: &Case,
    x: &Inputs,
    feed: &BackwardFeed,
) -> Result<[Vec<f64>; 3], String> {
    let d = &c.dims;
    let qshape = [d.batch, d.q_heads, d.q_len, d.head_dim];
    let kshape = [d.batch, d.kv_heads, d.k_len, d.head_dim];
    let o = operand(dev, c.dtype, qshape, c.o_mem, Some(&feed.o)).ctx("allocating o")?;
    let lse = dev
        .tensor(
            &feed.lse.iter().map(|&v| v as f32).collect::<Vec<_>>(),
            &[d.batch, d.q_heads, d.q_len],
        )
        .ctx("allocating lse")?;
    let gv = operand(dev, c.dtype, qshape, c.q_mem, Some(&feed.d_o)).ctx("allocating d_o")?;
    let mut dq = operand(dev, c.dtype, qshape, c.o_mem, None).ctx("allocating dq")?;
    let mut dk = operand(dev, c.dtype, kshape, c.o_mem, None).ctx("allocating dk")?;
    let mut dv = operand(dev, c.dtype, kshape, c.o_mem, None).ctx("allocating dv")?;
    ops::attention_backward(
        dev,
        &x.qv.view,
        &x.kv.view,
        &x.vv.view,
        &o.view,
        &lse,
        &gv.view,
        &c.opts,
        &mut dq.view,
        &mut dk.view,
        &mut dv.view,
    )
    .ctx("attention_backward")?;
    untouched_outside(&dq, "dq")?;
    untouched_outside(&dk, "dk")?;
    untouched_outside(&dv, "dv")?;
    Ok([
        dq.view.to_f64_vec().ctx("reading dq")?,
        dk.view.to_f64_vec().ctx("reading dk")?,
        dv.view.to_f64_vec().ctx("reading dv")?,
    ])
}

fn backward_case(dev: &Device, c: &Case) -> Result<(), String> {
    checked_backward(dev, c).map(|_| ())
}

/// [`backward_case`], returning the inputs, the feed and the gradients it checked.
/// The same values bit for bit (and the same length): gradients of two runs that sum in a
/// fixed order.
fn same_bits(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// A second backward run of `c` on the first run's inputs, whose dK and dV must match the
/// first run's `dk` and `dv` bit for bit.
fn repeat_dk_dv(
    dev: &Device,
    c: &Case,
    x: &Inputs,
    feed: &BackwardFeed,
    dk: &[f64],
    dv: &[f64],
) -> Result<(), String> {
    let [_, dk1, dv1] = run_backward(dev, c, x, feed)?;
    if same_bits(dk, &dk1) && same_bits(dv, &dv1) {
        Ok(())
    } else {
        Err("dK or dV differ between two runs".to_string())
    }
}

fn checked_backward(
    dev: &Device,
    c: &Case,
) -> Result<(Inputs, BackwardFeed, [Vec<f64>; 3]), String> {
    let x = inputs(dev, c)?;
    let feed = backward_feed(c, &x);
    let [dq, dk, dv] = run_backward(dev, c, &x, &feed)?;
    let (rq, rk, rv) = reference::attention_backward_reference(
        &x.q, &x.k, &x.v, &feed.o, &feed.d_o, &c.dims, &c.opts,
    );
    check_grad("dq", c.dtype, &dq, &rq)?;
    check_grad("dk", c.dtype, &dk, &rk)?;
    check_grad("dv", c.dtype, &dv, &rv)?;
    Ok((x, feed, [dq, dk, dv]))
}

#[test]
fn attention_forward_matches_reference() {
    property(
        "attention forward",
        24,
        case(vec![64, 128, 256]),
        forward_case,
    );
}

/// Gradient cases use moderate logits: with spread 4 the softmax is one-hot and every
/// gradient is ~0 relative to rounding.
#[test]
fn attention_backward_matches_reference() {
    let strategy = case(vec![64, 128, 256]).prop_map(|mut c| {
        c.spread = c.spread.min(1.0);
        c
    });
    property("attention backward", 12, strategy, backward_case);
}

fn fixed(
    dtype: DType,
    (batch, kv_heads, group): (usize, usize, usize),
    (q_len, k_len, head_dim): (usize, usize, usize),
    opts: AttentionOptions,
    spread: f64,
) -> Case {
    let mem = Memory {
        seq_major: false,
        pad: 0,
        offset: 0,
    };
    Case {
        dtype,
        dims: AttentionDims {
            batch,
            q_heads: kv_heads * group,
            kv_heads,
            q_len,
            k_len,
            head_dim,
        },
        opts,
        q_mem: mem,
        kv_mem: Memory {
            seq_major: true,
            ..mem
        },
        o_mem: Memory {
            pad: 3,
            offset: 1,
            ..mem
        },
        spread,
        seed: (q_len * 1000 + k_len) as u64,
    }
}

/// `c` with O's rows padded by `pad` elements and the view offset by `offset`.
fn with_o(mut c: Case, pad: usize, offset: usize) -> Case {
    c.o_mem = Memory {
        seq_major: false,
        pad,
        offset,
    };
    c
}

/// The edges named in the spec, each on every backend.
fn edge_cases() -> Vec<Case> {
    let causal = causal_mask();
    let plain = AttentionOptions::default();
    vec![
        // N = 1 both ways.
        fixed(DType::BF16, (1, 1, 1), (1, 1, 64), plain, 1.0),
        fixed(DType::F16, (1, 2, 1), (1, 77, 128), causal, 1.0),
        // More queries than keys, causal: the first Nq - Nkv rows see nothing.
        fixed(DType::BF16, (2, 1, 2), (70, 5, 64), causal, 1.0),
        // Keys left of the window only: rows see nothing.
        fixed(
            DType::F16,
            (1, 1, 1),
            (9, 40, 64),
            AttentionOptions {
                window: Some((0, 0)),
                ..Default::default()
            },
            1.0,
        ),
        // A window wider than the sequence is no window.
        fixed(
            DType::BF16,
            (1, 1, 4),
            (33, 65, 128),
            AttentionOptions {
                window: Some((1000, 5000)),
                ..Default::default()
            },
            1.0,
        ),
        // MQA with 8 query heads per KV head, large logits, a soft-cap.
        fixed(
            DType::BF16,
            (1, 1, 8),
            (65, 129, 64),
            softcapped_causal(),
            4.0,
        ),
        // Large logits without a cap: the online softmax must rescale, not overflow.
        fixed(DType::F16, (1, 2, 3), (129, 191, 128), plain, 4.0),
        fixed(DType::BF16, (1, 1, 1), (17, 17, 256), causal, 4.0),
        // Logits hundreds of base-2 units apart from one key block to the next: a block's
        // exponentials taken against an earlier block's max would overflow (the Hopper
        // forward's stale-max softmax must notice and start that block over).
        fixed(DType::BF16, (1, 2, 2), (130, 400, 128), plain, 16.0),
        fixed(DType::F16, (1, 1, 2), (200, 300, 64), causal, 16.0),
    ]
}

#[test]
fn attention_edges_forward() {
    report_skipped("attention_edges_forward");
    for dev in calico_conformance::backends().0 {
        for c in edge_cases() {
            if let Err(e) = forward_case(&dev, &c) {
                panic!("backend {}: {c:?}: {e}", dev.kind());
            }
        }
    }
}

#[test]
fn attention_edges_backward() {
    report_skipped("attention_edges_backward");
    for dev in calico_conformance::backends().0 {
        for mut c in edge_cases() {
            c.spread = c.spread.min(1.0);
            if let Err(e) = backward_case(&dev, &c) {
                panic!("backend {}: {c:?}: {e}", dev.kind());
            }
        }
    }
}

/// The deterministic mode gives the same bits on every run (GQA, so dK/dV sum over heads).
#[test]
fn attention_backward_is_deterministic() {
    report_skipped("attention_backward_is_deterministic");
    for dev in calico_conformance::backends().0 {
        // Head dim 64 (the tile kernels on sm_90a) and 256 (the Hopper main and dQ kernels:
        // every sum in a fixed order), 300 keys in several blocks.
        for (len, head_dim) in [((70, 100), 64), ((70, 300), 256)] {
            let mut c = fixed(
                DType::BF16,
                (1, 2, 4),
                (len.0, len.1, head_dim),
                AttentionOptions {
                    causal: true,
                    deterministic: true,
                    ..Default::default()
                },
                1.0,
            );
            c.seed = 7;
            let (x, feed, first) = checked_backward(&dev, &c)
                .unwrap_or_else(|e| panic!("backend {}: d{head_dim}: {e}", dev.kind()));
            for _ in 0..3 {
                let again = run_backward(&dev, &c, &x, &feed).unwrap_or_else(|e| panic!("{e}"));
                for (a, b) in first.iter().zip(&again) {
                    assert!(
                        same_bits(a, b),
                        "backend {}: d{head_dim}: deterministic backward differs between runs",
                        dev.kind()
                    );
                }
            }
        }
    }
}

/// Bad input is an `Err`, never a panic.
#[test]
fn attention_rejects_bad_input() {
    report_skipped("attention_rejects_bad_input");
    for dev in calico_conformance::backends().0 {
        let t = |shape: &[usize], dtype: DType| dev.zeros(shape, dtype).expect("alloc");
        let q = t(&[1, 4, 8, 64], DType::BF16);
        let k = t(&[1, 2, 8, 64], DType::BF16);
        let v = t(&[1, 2, 8, 64], DType::BF16);
        let mut o = t(&[1, 4, 8, 64], DType::BF16);
        let mut lse = t(&[1, 4, 8], DType::F32);
        let opts = AttentionOptions::default();
        assert!(ops::attention(&dev, &q, &k, &v, &opts, &mut o, &mut lse).is_ok());
        let bad_heads = t(&[1, 3, 8, 64], DType::BF16);
        let wrong_dtype = t(&[1, 2, 8, 64], DType::F16);
        let f32_q = t(&[1, 4, 8, 64], DType::F32);
        let rank3 = t(&[4, 8, 64], DType::BF16);
        let mut bad_lse = t(&[1, 4, 9], DType::F32);
        let mut alias_o = q.clone();
        let strided = t(&[1, 2, 8, 128], DType::BF16)
            .as_strided(&[1, 2, 8, 64], &[2048, 1024, 128, 2], 0)
            .expect("view");
        let cases: Vec<(&str, calico::Result<()>)> = vec![
            (
                "GQA heads that do not divide",
                ops::attention(&dev, &q, &bad_heads, &bad_heads, &opts, &mut o, &mut lse),
            ),
            (
                "k of another dtype",
                ops::attention(
                    &dev,
                    &q,
                    &wrong_dtype,
                    &wrong_dtype,
                    &opts,
                    &mut o,
                    &mut lse,
                ),
            ),
            (
                "f32 inputs",
                ops::attention(&dev, &f32_q, &k, &v, &opts, &mut o, &mut lse),
            ),
            (
                "rank-3 q",
                ops::attention(&dev, &rank3, &k, &v, &opts, &mut o, &mut lse),
            ),
            (
                "lse of the wrong shape",
                ops::attention(&dev, &q, &k, &v, &opts, &mut o, &mut bad_lse),
            ),
            (
                "o aliasing q",
                ops::attention(&dev, &q, &k, &v, &opts, &mut alias_o, &mut lse),
            ),
            (
                "a strided head dimension",
                ops::attention(&dev, &q, &strided, &v, &opts, &mut o, &mut lse),
            ),
            (
                "a negative softcap",
                ops::attention(
                    &dev,
                    &q,
                    &k,
                    &v,
                    &AttentionOptions {
                        softcap: Some(-1.0),
                        ..opts
                    },
                    &mut o,
                    &mut lse,
                ),
            ),
        ];
        for (what, r) in cases {
            assert!(r.is_err(), "backend {}: {what} was accepted", dev.kind());
        }
    }
}

/// How [`varlen_case`] lays out and checks a packed batch.
#[derive(Debug, Clone, Copy)]
struct VarlenForm {
    head_dim: usize,
    /// Rows padded to 16 bytes from an aligned base (the Hopper forward takes those as TMA
    /// views on sm_90a); else one element off (the tile kernels).
    aligned: bool,
    /// Check the backward too.
    backward: bool,
}

/// Packed sequences (empty and single-token ones included) against the reference run on
/// each sequence alone; the forward, and the backward where `form` asks.
fn varlen_case(
    dev: &Device,
    dtype: DType,
    lens: &[(usize, usize)],
    opts: AttentionOptions,
    seed: u64,
    form: VarlenForm,
) -> Result<(), String> {
    let VarlenForm {
        head_dim,
        aligned,
        backward,
    } = form;
    let (kv_heads, group) = (2, 2);
    let q_heads = kv_heads * group;
    let (tq, tk): (usize, usize) = (
        lens.iter().map(|l| l.0).sum(),
        lens.iter().map(|l| l.1).sum(),
    );
    let mut rng = Rng::new(seed);
    let q = sample(dtype, &mut rng, tq * q_heads * head_dim, 1.0);
    let k = sample(dtype, &mut rng, tk * kv_heads * head_dim, 1.0);
    let v = sample(dtype, &mut rng, tk * kv_heads * head_dim, 1.0);
    let g = sample(dtype, &mut rng, tq * q_heads * head_dim, 1.0);
    let mut cu_q = vec![0i32];
    let mut cu_k = vec![0i32];
    for &(a, b) in lens {
        cu_q.push(cu_q.last().copied().unwrap_or(0) + a as i32);
        cu_k.push(cu_k.last().copied().unwrap_or(0) + b as i32);
    }
    // Per-sequence reference, scattered back into the packed layouts.
    let mut ref_o = vec![0.0; q.len()];
    let mut ref_lse = vec![0.0; q_heads * tq];
    let (mut ref_dq, mut ref_dk, mut ref_dv) =
        (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    for (b, &(nq, nk)) in lens.iter().enumerate() {
        let (q0, k0) = (cu_q[b] as usize, cu_k[b] as usize);
        let gather = |src: &[f64], start: usize, n: usize, heads: usize| {
            let mut out = Vec::with_capacity(n * heads * head_dim);
            for h in 0..heads {
                for i in 0..n {
                    let at = ((start + i) * heads + h) * head_dim;
                    out.extend_from_slice(&src[at..at + head_dim]);
                }
            }
            out
        };
        let scatter = |dst: &mut [f64], src: &[f64], start: usize, n: usize, heads: usize| {
            for h in 0..heads {
                for i in 0..n {
                    let at = ((start + i) * heads + h) * head_dim;
                    let from = (h * n + i) * head_dim;
                    dst[at..at + head_dim].copy_from_slice(&src[from..from + head_dim]);
                }
            }
        };
        let dims = AttentionDims {
            batch: 1,
            q_heads,
            kv_heads,
            q_len: nq,
            k_len: nk,
            head_dim,
        };
        let (sq, sk, sv, sg) = (
            gather(&q, q0, nq, q_heads),
            gather(&k, k0, nk, kv_heads),
            gather(&v, k0, nk, kv_heads),
            gather(&g, q0, nq, q_heads),
        );
        let (o, lse) = reference::attention_reference(&sq, &sk, &sv, &dims, &opts);
        scatter(&mut ref_o, &o, q0, nq, q_heads);
        for h in 0..q_heads {
            for i in 0..nq {
                ref_lse[h * tq + q0 + i] = lse[h * nq + i];
            }
        }
        // The backward reads O as the forward stores it (rounded to the dtype).
        if backward {
            let fed_o = round_all(dtype, &o);
            let (dq, dk, dv) =
                reference::attention_backward_reference(&sq, &sk, &sv, &fed_o, &sg, &dims, &opts);
            scatter(&mut ref_dq, &dq, q0, nq, q_heads);
            scatter(&mut ref_dk, &dk, k0, nk, kv_heads);
            scatter(&mut ref_dv, &dv, k0, nk, kv_heads);
        }
    }
    let up = |vals: &[f64], shape: &[usize]| -> Result<View, String> {
        let v = view(
            dev,
            dtype,
            shape,
            &calico_conformance::tensors::padded_strides(shape, 8),
            usize::from(!aligned),
            Some(f64::NAN),
        )
        .ctx("alloc")?;
        write(&v.view, vals).ctx("write")?;
        Ok(v)
    };
    let (qs, ks) = ([tq, q_heads, head_dim], [tk, kv_heads, head_dim]);
    let (qv, kv, vv, gv) = (up(&q, &qs)?, up(&k, &ks)?, up(&v, &ks)?, up(&g, &qs)?);
    let cq = dev.tensor(&cu_q, &[cu_q.len()]).ctx("cu_q")?;
    let ck = dev.tensor(&cu_k, &[cu_k.len()]).ctx("cu_k")?;
    let mut o = up(&vec![f64::NAN; q.len()], &qs)?;
    let mut lse = dev.zeros(&[q_heads, tq], DType::F32).ctx("lse")?;
    ops::attention_varlen(
        dev,
        &qv.view,
        &kv.view,
        &vv.view,
        &cq,
        &ck,
        &opts,
        &mut o.view,
        &mut lse,
    )
    .ctx("attention_varlen")?;
    let got_o = o.view.to_f64_vec().ctx("reading o")?;
    check_close("o", &got_o, &ref_o, elementwise_tol(dtype))?;
    // LSE rows in [Hq, Tq] order, o rows in [Tq, Hq] order: compare masked rows per (t, h).
    let got_lse = lse.to_f64_vec().ctx("reading lse")?;
    let mut lse_rows = vec![0.0; tq * q_heads];
    let mut ref_rows = vec![0.0; tq * q_heads];
    for h in 0..q_heads {
        for t in 0..tq {
            lse_rows[t * q_heads + h] = got_lse[h * tq + t];
            ref_rows[t * q_heads + h] = ref_lse[h * tq + t];
        }
    }
    check_lse_and_masked_rows(&lse_rows, &ref_rows, &got_o, head_dim)?;
    untouched_outside(&o, "o")?;
    if !backward {
        return Ok(());
    }

    let ov = up(&round_all(dtype, &ref_o), &qs)?;
    let lse_in = dev
        .tensor(
            &ref_lse.iter().map(|&v| v as f32).collect::<Vec<_>>(),
            &[q_heads, tq],
        )
        .ctx("lse")?;
    let mut dq = up(&vec![f64::NAN; q.len()], &qs)?;
    let mut dk = up(&vec![f64::NAN; k.len()], &ks)?;
    let mut dv = up(&vec![f64::NAN; v.len()], &ks)?;
    ops::attention_varlen_backward(
        dev,
        &qv.view,
        &kv.view,
        &vv.view,
        &ov.view,
        &lse_in,
        &gv.view,
        &cq,
        &ck,
        &opts,
        &mut dq.view,
        &mut dk.view,
        &mut dv.view,
    )
    .ctx("attention_varlen_backward")?;
    check_grad("dq", dtype, &dq.view.to_f64_vec().ctx("dq")?, &ref_dq)?;
    check_grad("dk", dtype, &dk.view.to_f64_vec().ctx("dk")?, &ref_dk)?;
    check_grad("dv", dtype, &dv.view.to_f64_vec().ctx("dv")?, &ref_dv)?;
    untouched_outside(&dq, "dq")?;
    untouched_outside(&dk, "dk")
}

#[test]
fn attention_varlen_matches_reference() {
    let lens = prop::collection::vec(
        (
            select(vec![0usize, 1, 2, 17, 64, 65, 130]),
            select(vec![0usize, 1, 3, 63, 64, 129]),
        ),
        1..=4,
    );
    let opts = (any::<bool>(), prop::option::of((0usize..40, 0usize..40)));
    property(
        "attention varlen",
        10,
        (
            select(vec![DType::BF16, DType::F16]),
            lens,
            opts,
            (any::<u64>(), select(vec![64usize, 128]), any::<bool>()),
        ),
        |dev, (dtype, lens, (causal, window), (seed, head_dim, aligned))| {
            let opts = AttentionOptions {
                causal: *causal,
                window: *window,
                ..Default::default()
            };
            varlen_case(
                dev,
                *dtype,
                lens,
                opts,
                *seed,
                VarlenForm {
                    head_dim: *head_dim,
                    aligned: *aligned,
                    backward: true,
                },
            )
        },
    );
}

/// Packed sequences the Hopper kernels take on sm_90a (aligned rows): forward units of 128 and
/// 192 rows that hold several short sequences or the end of one and the start of the next,
/// backward key blocks of 128 that span sequences, several blocks per sequence
/// (80-key forward blocks at d = 256 where the mean sequence is long enough), empty sequences
/// on either side, causal and windowed. The backward is checked
/// where its f64 reference stays quick (head dims 64 and 128 here; packed backward calls at
/// 192 and 256 are in attention_hopper_wide_backward).
#[test]
fn attention_hopper_varlen() {
    report_skipped("attention_hopper_varlen");
    let causal = causal_mask();
    let window = AttentionOptions {
        window: Some((300, 20)),
        ..Default::default()
    };
    // More sequences than row blocks: 30 short ones and a long one in the same first block.
    let mut short_then_long = vec![(5, 9); 30];
    short_then_long.push((300, 280));
    // More offsets than fit beside d = 256's 80-key stages (the 3000 keys choose them): the
    // forward reads them from global memory, where it otherwise stages them in shared memory.
    let unstaged: Vec<(usize, usize)> = (0..150).map(|i| (1 + i % 5, 14 + i % 13)).collect();
    // More sequences than the forward sorts longest first (128): per-sequence units in index
    // order; and fewer, of many lengths, which it sorts.
    let unsorted: Vec<(usize, usize)> = (0..140).map(|i| (1 + i * 37 % 200, 3 + i % 11)).collect();
    let sorted: Vec<(usize, usize)> = (0..12)
        .map(|i| (1 + i * 97 % 400, 1 + i * 97 % 400))
        .collect();
    type Packed<'a> = (DType, &'a [(usize, usize)], AttentionOptions, usize, bool);
    let cases: [Packed; 10] = [
        (
            DType::BF16,
            &[(300, 700), (1, 5), (0, 10), (513, 513)],
            causal,
            64,
            true,
        ),
        (
            DType::F16,
            &[(129, 0), (200, 333), (7, 7)],
            AttentionOptions::default(),
            128,
            true,
        ),
        (
            DType::BF16,
            &[(150, 400), (260, 130), (0, 0), (90, 300)],
            window,
            128,
            true,
        ),
        (DType::BF16, &[(200, 8300), (10, 8200)], causal, 128, false),
        (DType::BF16, &[(64, 2100), (200, 2100)], window, 256, false),
        (DType::F16, &[(3, 3); 40], causal, 128, true),
        (DType::BF16, &short_then_long, causal, 64, true),
        (DType::BF16, &unstaged, causal, 256, false),
        (
            DType::BF16,
            &unsorted,
            AttentionOptions::default(),
            64,
            false,
        ),
        (DType::F16, &sorted, causal, 128, false),
    ];
    for dev in calico_conformance::backends().0 {
        for (i, (dtype, lens, opts, head_dim, backward)) in cases.iter().enumerate() {
            let form = VarlenForm {
                head_dim: *head_dim,
                aligned: true,
                backward: *backward,
            };
            if let Err(e) = varlen_case(&dev, *dtype, lens, *opts, 17 + i as u64, form) {
                panic!("backend {}: case {i} {lens:?}: {e}", dev.kind());
            }
        }
    }
}

#[test]
fn attention_varlen_rejects_bad_offsets_on_the_cpu() {
    let dev = Device::cpu();
    let q = dev.zeros(&[5, 2, 64], DType::BF16).expect("q");
    let k = dev.zeros(&[5, 1, 64], DType::BF16).expect("k");
    let mut o = dev.zeros(&[5, 2, 64], DType::BF16).expect("o");
    let mut lse = dev.zeros(&[2, 5], DType::F32).expect("lse");
    let good = dev.tensor(&[0i32, 2, 5], &[3]).expect("cu");
    let opts = AttentionOptions::default();
    assert!(ops::attention_varlen(&dev, &q, &k, &k, &good, &good, &opts, &mut o, &mut lse).is_ok());
    for bad in [[0i32, 3, 2], [0, 2, 6], [1, 2, 5], [0, 2, 4]] {
        let cu = dev.tensor(&bad, &[3]).expect("cu");
        assert!(
            ops::attention_varlen(&dev, &q, &k, &k, &cu, &good, &opts, &mut o, &mut lse).is_err(),
            "offsets {bad:?} accepted"
        );
    }
    let f32_cu = dev.zeros(&[3], DType::F32).expect("cu");
    assert!(
        ops::attention_varlen(&dev, &q, &k, &k, &f32_cu, &good, &opts, &mut o, &mut lse).is_err()
    );
}

/// Shapes the Hopper (sm_90a) forward takes (head dim 64/128/256, 16-byte aligned Q/K/V),
/// around its 128-row and 128-key tiles: N = 1, odd N, Nq != Nkv both ways, GQA, causal,
/// windows, soft-cap, large logits, rows that see no key, several key blocks per row, each O
/// store width, and d = 64 around 192-row units. The Hopper kernel takes them on sm_90a
/// (CALICO_ATTN_HOPPER=0 sends them to the tile kernels; CALICO_ATTN_HOPPER_CONSUMERS=3 gives
/// d = 64 three consumer warpgroups).
#[test]
fn attention_hopper_shapes_forward() {
    report_skipped("attention_hopper_shapes_forward");
    let causal = causal_mask();
    let plain = AttentionOptions::default();
    let window = window_mask;
    let cases = vec![
        fixed(DType::BF16, (1, 2, 2), (300, 300, 128), causal, 1.0),
        fixed(DType::F16, (2, 1, 4), (1, 1, 64), plain, 1.0),
        fixed(DType::BF16, (1, 2, 1), (129, 257, 64), window(40, 7), 1.0),
        fixed(
            DType::F16,
            (1, 1, 8),
            (257, 129, 128),
            softcapped_causal(),
            4.0,
        ),
        fixed(DType::BF16, (1, 1, 1), (191, 65, 128), causal, 1.0),
        fixed(DType::BF16, (1, 1, 2), (130, 200, 256), plain, 4.0),
        fixed(DType::BF16, (1, 1, 1), (9, 40, 64), window(0, 0), 1.0),
        fixed(DType::F16, (1, 1, 1), (520, 600, 128), causal, 1.0),
        fixed(DType::BF16, (1, 1, 2), (517, 517, 64), plain, 4.0),
        // O rows 16-byte aligned (pad and offset 8: the 16-byte store epilogue) or only 4-byte
        // aligned (2: pairs). Causal over more units than an H100 has SMs, in long/short
        // row-block pairs (the folded unit order): 136 heads fill whole double rounds and a
        // tail of CTAs with one unit, 72 heads a tail of CTAs with one and two; Nkv = 20
        // leaves the first 110 rows without keys.
        with_o(
            fixed(DType::BF16, (1, 17, 8), (130, 20, 64), causal, 1.0),
            8,
            8,
        ),
        with_o(
            fixed(DType::F16, (1, 9, 8), (130, 20, 128), causal, 1.0),
            8,
            8,
        ),
        with_o(
            fixed(DType::F16, (1, 2, 2), (600, 700, 128), window(90, 30), 1.0),
            2,
            2,
        ),
        // d = 64 around 192-row units (CALICO_ATTN_HOPPER_CONSUMERS=3), causal over 136
        // heads: three row blocks, the last partial (folded pairs, then the middle blocks);
        // two row blocks (folded pairs with a tail), Nkv < Nq.
        fixed(DType::F16, (2, 17, 4), (400, 400, 64), causal, 1.0),
        with_o(
            fixed(DType::BF16, (1, 17, 8), (384, 300, 64), causal, 1.0),
            8,
            8,
        ),
        // d = 128 with 8192 keys or more, the last key block partial (8200 = 64 x 128 + 8; with
        // CALICO_ATTN_HOPPER_BN=176, 46 x 176 + 104), under a causal mask and a window that
        // skips whole blocks.
        fixed(DType::BF16, (1, 1, 1), (16, 8200, 128), causal, 1.0),
        fixed(DType::F16, (1, 1, 1), (9, 8193, 128), window(3000, 5), 1.0),
        // d = 256 with 2048 keys or more: 80-key blocks by default (the last one partial,
        // 2100 = 26 x 80 + 20), causal with Nq < Nkv, and a window over GQA heads.
        fixed(DType::BF16, (1, 1, 2), (150, 2100, 256), causal, 1.0),
        fixed(DType::F16, (1, 2, 4), (70, 2050, 256), window(500, 40), 4.0),
    ];
    for dev in calico_conformance::backends().0 {
        for c in &cases {
            if let Err(e) = forward_case(&dev, c) {
                panic!("backend {}: {c:?}: {e}", dev.kind());
            }
        }
    }
}

/// Shapes the Hopper (sm_90a) backward takes (head dim 64/128, 16-byte aligned Q/K/V/dO, not
/// deterministic, not varlen), around its 128-key blocks and 64/128-row query blocks: N = 1,
/// odd N, Nq != Nkv both ways, GQA 1 to 8, causal, windows (key blocks no row sees), soft-cap,
/// rows that see no key, several blocks each way, dQ/dK/dV stored with odd offsets (element
/// stores) and aligned (pairs). On sm_90a the Hopper kernels take them (CALICO_ATTN_HOPPER_BWD=0
/// sends them to the tile kernels); elsewhere the tile kernels.
#[test]
fn attention_hopper_shapes_backward() {
    report_skipped("attention_hopper_shapes_backward");
    let causal = causal_mask();
    let plain = AttentionOptions::default();
    let window = window_mask;
    let cases = vec![
        fixed(DType::BF16, (1, 2, 2), (300, 300, 128), causal, 1.0),
        fixed(DType::F16, (2, 1, 4), (1, 1, 64), plain, 1.0),
        fixed(DType::BF16, (1, 2, 1), (129, 257, 64), window(40, 7), 1.0),
        fixed(
            DType::F16,
            (1, 1, 8),
            (257, 129, 128),
            softcapped_causal(),
            1.0,
        ),
        fixed(DType::BF16, (1, 1, 1), (191, 65, 128), causal, 1.0),
        fixed(DType::BF16, (1, 1, 1), (9, 40, 64), window(0, 0), 1.0),
        fixed(DType::F16, (1, 1, 1), (520, 600, 128), causal, 1.0),
        aligned_out(fixed(DType::BF16, (1, 1, 2), (517, 517, 64), plain, 1.0)),
        fixed(DType::BF16, (1, 1, 3), (200, 700, 64), window(100, 0), 1.0),
        aligned_out(fixed(DType::F16, (2, 2, 1), (64, 128, 128), plain, 1.0)),
        aligned_out(fixed(DType::BF16, (1, 1, 5), (70, 300, 128), causal, 1.0)),
        // O and the gradients with rows padded and offset by 2 elements (the prepare kernel's
        // element path, the finish kernel's 4-byte pairs) and by 8 (16-byte rows and chunks).
        with_o(
            fixed(DType::BF16, (1, 2, 2), (200, 333, 128), causal, 1.0),
            2,
            2,
        ),
        with_o(
            fixed(DType::F16, (2, 1, 3), (130, 130, 64), plain, 1.0),
            8,
            8,
        ),
    ];
    for dev in calico_conformance::backends().0 {
        for c in &cases {
            if let Err(e) = backward_case(&dev, c) {
                panic!("backend {}: {c:?}: {e}", dev.kind());
            }
        }
    }
}

/// Whether the router sends `c`'s backward on `dev` to the Hopper kernels with the unit's
/// query heads split over CTAs (`Some(true)`), to them unsplit (`Some(false)`), or elsewhere
/// (`None`: not sm_90a, or CALICO_ATTN_HOPPER_BWD=0). The split depends on the key blocks
/// only, so the plan's one length is Nkv.
fn hopper_head_split(dev: &Device, c: &Case) -> Result<Option<bool>, String> {
    Ok(hopper_backward_label(dev, c)?.map(|label| label.contains(" headsplit")))
}

/// The label of the Hopper main kernel the router picks for `c`'s backward on `dev`, or `None`
/// where the Hopper backward does not take it (not sm_90a, CALICO_ATTN_HOPPER_BWD=0, a head
/// dim it declines). The plan's one length is Nkv (the key blocks and units count it).
fn hopper_backward_label(dev: &Device, c: &Case) -> Result<Option<String>, String> {
    if dev.arch().target != "sm_90a" {
        return Ok(None);
    }
    let case = ops::AttentionCase {
        dtype: c.dtype,
        batch: c.dims.batch,
        q_heads: c.dims.q_heads,
        kv_heads: c.dims.kv_heads,
        seq: c.dims.k_len,
        head_dim: c.dims.head_dim,
        causal: c.opts.causal,
        backward: true,
        varlen: false,
        softcap: c.opts.softcap,
    };
    let plan = ops::plan_attention(&dev.arch().target, &case).ctx("plan_attention")?;
    Ok(plan
        .kernels
        .first()
        .filter(|k| k.label.starts_with("hopper bwd"))
        .map(|k| k.label.clone()))
}

/// GQA and MQA backward problems with few (key block, KV head, batch) units, which the Hopper
/// backward runs with each unit's query heads split over several CTAs (HEAD_SPLIT in
/// kernels/device/attention/hopper_bwd.cu: f32 partials of dK and dV summed in a fixed order
/// by a combine kernel): B = 1 with Hq / Hkv = 8 / 1 and 16 / 2, odd N (333, 1000), Nq != Nkv,
/// causal or not, windows, a soft-cap, d = 64 and 128, padded head dims (96, 40), groups of 3
/// and 4, parts of one, two and four heads (4096 keys causal and 2100 keys unmasked: 64 and 34
/// units, 4 and 2 parts of the group of 8), element, pair and 16-byte stores of dK and dV, and
/// batch 2; then a GQA problem
/// with more units than an H100 has SMs (not split). On sm_90a the router's choice is checked
/// too (unless CALICO_ATTN_HOPPER_BWD_TUNE is set), and dK and dV must come out bit for bit
/// the same on a second run (dQ is summed by atomics, dK and dV are not).
#[test]
fn attention_hopper_head_split_backward() {
    const TEST: &str = "attention_hopper_head_split_backward";
    let causal = causal_mask();
    let plain = AttentionOptions::default();
    let window = window_mask;
    let capped = softcapped_causal();
    let split = vec![
        fixed(DType::BF16, (1, 1, 8), (333, 333, 64), causal, 1.0),
        aligned_out(fixed(DType::F16, (1, 1, 8), (1000, 1000, 64), plain, 1.0)),
        aligned_out(fixed(DType::BF16, (1, 2, 8), (333, 333, 128), causal, 1.0)),
        with_o(
            fixed(DType::F16, (1, 2, 8), (1000, 333, 64), plain, 1.0),
            2,
            2,
        ),
        fixed(DType::BF16, (1, 1, 8), (333, 1000, 128), causal, 1.0),
        fixed(DType::F16, (1, 1, 8), (1000, 333, 128), causal, 1.0),
        fixed(DType::BF16, (1, 2, 4), (300, 700, 64), capped, 1.0),
        fixed(DType::BF16, (2, 1, 3), (130, 700, 64), window(100, 0), 1.0),
        aligned_out(fixed(DType::F16, (2, 2, 4), (333, 333, 128), plain, 1.0)),
        with_o(
            fixed(DType::BF16, (1, 2, 8), (333, 333, 96), causal, 1.0),
            8,
            8,
        ),
        with_o(
            fixed(DType::F16, (1, 1, 8), (200, 333, 40), window(50, 10), 1.0),
            2,
            2,
        ),
        aligned_out(fixed(DType::BF16, (1, 2, 8), (70, 4096, 64), causal, 1.0)),
        fixed(DType::F16, (2, 1, 8), (100, 2100, 128), plain, 1.0),
    ];
    let unsplit = [fixed(DType::BF16, (1, 33, 2), (100, 600, 64), causal, 1.0)];
    let check_route = std::env::var_os("CALICO_ATTN_HOPPER_BWD_TUNE").is_none();
    for dev in gpu_backends(TEST, "the head-split Hopper backward") {
        for (c, want) in split
            .iter()
            .map(|c| (c, true))
            .chain(unsplit.iter().map(|c| (c, false)))
        {
            let fail = |e: String| -> ! { panic!("backend {}: {c:?}: {e}", dev.kind()) };
            let route = hopper_head_split(&dev, c).unwrap_or_else(|e| fail(e));
            if check_route && route.is_some() && route != Some(want) {
                fail(format!("routed with head split {route:?}, expected {want}"));
            }
            // backward_case, and a second run whose dK and dV (register sums, or partials
            // summed in a fixed order) must match the first bit for bit.
            let (x, feed, [_, dk, dv]) = checked_backward(&dev, c).unwrap_or_else(|e| fail(e));
            repeat_dk_dv(&dev, c, &x, &feed, &dk, &dv).unwrap_or_else(|e| fail(e));
        }
    }
}

/// The Hopper backward at head dim 256 (the main kernel's wide mode: 64-key CTAs, each
/// consumer warpgroup computing S^T and dP^T for half of a step's 64 query rows and dV and dK
/// for half the head dim, two stages; dQ by the dQ kernel, or with `nodqkernel` in
/// CALICO_ATTN_HOPPER_BWD_TUNE from the main kernel by bulk reductions or, with `nobulk`,
/// red.global.add):
/// MHA, GQA 2 / 4 / 8 and MQA, N = 1, odd N (65, 129, 130, 200), Nq != Nkv both ways (rows that
/// see no key, key blocks no row sees), causal, windows (one wider than the sequence), soft-caps,
/// f16 and bf16, larger logits (scale 0.3: scores of standard deviation ~5), 1100 keys (18
/// key blocks, the last partial) under a causal mask, element / pair stores of the gradients
/// (O rows offset by one element, or padded by 8), head-split GQA / MQA with few units (split
/// checked on sm_90a, dK and dV then bit-identical on a second run), packed sequences
/// whose 64-key blocks span sequences, and head dims 136, 192 and 248 at width 256 (padded;
/// run_backward checks the gradients' row padding is untouched). On sm_90a the router's
/// choice is checked too (the d = 256 main kernel with the dQ kernel, or under `nodqkernel`
/// bulk dQ unless `nobulk`); other GPUs run their own backward (the portable kernels above 128).
#[test]
fn attention_hopper_wide_backward() {
    const TEST: &str = "attention_hopper_wide_backward";
    let causal = causal_mask();
    let plain = AttentionOptions::default();
    let window = window_mask;
    let capped = softcapped_causal();
    let hot = AttentionOptions {
        scale: Some(0.3),
        ..plain
    };
    let hot_capped = AttentionOptions {
        scale: Some(0.3),
        softcap: Some(5.0),
        causal: true,
        ..plain
    };
    let cases = vec![
        // MHA, two batches; GQA 2 causal (pairs: O and the gradients 16-byte aligned, padded).
        fixed(DType::BF16, (2, 2, 1), (130, 130, 256), plain, 1.0),
        with_o(
            fixed(DType::F16, (1, 2, 2), (200, 200, 256), causal, 1.0),
            8,
            0,
        ),
        // N = 1; Nq > Nkv causal (the first 64 rows see no key), MQA with 8 query heads,
        // soft-capped.
        fixed(DType::BF16, (2, 1, 2), (1, 1, 256), plain, 1.0),
        fixed(DType::F16, (1, 1, 8), (129, 65, 256), capped, 1.0),
        // Nq < Nkv under a window: the first three key blocks no row sees; a window wider than
        // the sequence.
        fixed(DType::BF16, (1, 1, 4), (65, 300, 256), window(40, 7), 1.0),
        aligned_out(fixed(
            DType::F16,
            (1, 2, 1),
            (65, 200, 256),
            window(1000, 5000),
            1.0,
        )),
        // Larger logits, plain and soft-capped (the cap saturates).
        fixed(DType::BF16, (1, 2, 2), (100, 150, 256), hot, 1.0),
        fixed(DType::F16, (1, 1, 4), (100, 100, 256), hot_capped, 1.0),
        // 1100 keys under a causal mask: 18 key blocks per unit, the last partial.
        fixed(DType::BF16, (1, 1, 2), (70, 1100, 256), causal, 1.0),
    ];
    // Few units (key blocks x KV heads): the query heads split over CTAs on sm_90a.
    let split = [
        fixed(DType::BF16, (1, 1, 8), (100, 200, 256), plain, 1.0),
        with_o(
            fixed(DType::F16, (1, 2, 4), (150, 150, 256), causal, 1.0),
            2,
            2,
        ),
        with_o(
            fixed(DType::BF16, (1, 1, 8), (100, 200, 192), plain, 1.0),
            8,
            8,
        ),
    ];
    // Head dims between 128 and 256 at width 256: only their columns are read and written.
    let padded = [
        fixed(DType::BF16, (1, 2, 2), (130, 200, 136), causal, 1.0),
        with_o(
            fixed(DType::F16, (1, 1, 4), (65, 129, 192), window(50, 10), 1.0),
            8,
            8,
        ),
        with_o(
            fixed(DType::BF16, (1, 1, 2), (200, 70, 248), capped, 1.0),
            2,
            2,
        ),
    ];
    let check_split = std::env::var_os("CALICO_ATTN_HOPPER_BWD_TUNE").is_none();
    // Bulk dQ by default; `nobulk` in the tune for the per-thread reductions.
    let tune = std::env::var("CALICO_ATTN_HOPPER_BWD_TUNE").unwrap_or_default();
    let (nobulk, nodqkernel) = (tune.contains("nobulk"), tune.contains("nodqkernel"));
    let hopper_on = ["CALICO_ATTN_HOPPER", "CALICO_ATTN_HOPPER_BWD"]
        .iter()
        .all(|v| std::env::var(v).as_deref() != Ok("0"));
    for dev in gpu_backends(TEST, "the head-dim-256 backward") {
        let all = cases
            .iter()
            .map(|c| (c, false))
            .chain(split.iter().map(|c| (c, true)))
            .chain(padded.iter().map(|c| (c, false)));
        for (c, want_split) in all {
            let fail = |e: String| -> ! { panic!("backend {}: {c:?}: {e}", dev.kind()) };
            let label = hopper_backward_label(&dev, c).unwrap_or_else(|e| fail(e));
            if dev.arch().target == "sm_90a" && hopper_on {
                let Some(label) = &label else {
                    fail("not routed to the Hopper backward".to_string());
                };
                let form_ok = if nodqkernel {
                    label.contains(" bulk") != nobulk
                } else {
                    label.contains(" dqkernel")
                };
                if !label.contains(" d=256 ") || !form_ok {
                    fail(format!("routed to {label}"));
                }
                if label.contains(" padded") != (c.dims.head_dim != 256) {
                    fail(format!("routed to {label}"));
                }
                if check_split && want_split && !label.contains(" headsplit") {
                    fail(format!("not split: {label}"));
                }
            }
            let (x, feed, [_, dk, dv]) = checked_backward(&dev, c).unwrap_or_else(|e| fail(e));
            if want_split {
                // dK and dV from the partials, summed in part order: the same bits again.
                repeat_dk_dv(&dev, c, &x, &feed, &dk, &dv).unwrap_or_else(|e| fail(e));
            }
        }
        // Packed sequences: 64-key blocks that span sequences (empty and one-token ones among
        // them), causal at d = 256, windowed at 192.
        let packed = [
            (
                DType::BF16,
                vec![(130, 200), (1, 5), (0, 10), (70, 64)],
                causal,
                256,
            ),
            (
                DType::F16,
                vec![(65, 100), (100, 70), (3, 3)],
                window(30, 10),
                192,
            ),
        ];
        for (i, (dtype, lens, opts, head_dim)) in packed.iter().enumerate() {
            let form = VarlenForm {
                head_dim: *head_dim,
                aligned: true,
                backward: true,
            };
            if let Err(e) = varlen_case(&dev, *dtype, lens, *opts, 256 + i as u64, form) {
                panic!("backend {}: packed {lens:?} d{head_dim}: {e}", dev.kind());
            }
        }
    }
}

/// Head dims that are multiples of 8 but not 64, 128 or 256 (Phi's 80 and 96, 32, 40, 120,
/// 192): on sm_90a the Hopper kernels run them at the next kernel width (64 / 128 / 256) on
/// zero-filled columns and store only the real ones (the backward's 136 to 248 are checked in
/// attention_hopper_wide_backward). O and the
/// gradients are checked against the f64 reference and, through their padded rows (pad 3 or
/// 8), for writes past the head dim; chunk (16-byte), pair and element stores; GQA, causal,
/// windows, a soft-cap, Nq != Nkv, packed sequences; and the sm_80 tile kernels the same way.
#[test]
fn attention_hopper_padded_head_dims() {
    report_skipped("attention_hopper_padded_head_dims");
    let causal = causal_mask();
    let plain = AttentionOptions::default();
    let window = window_mask;
    let capped = softcapped_causal();
    let forward = vec![
        fixed(DType::BF16, (1, 2, 2), (300, 300, 96), causal, 1.0),
        with_o(
            fixed(DType::F16, (1, 1, 4), (129, 257, 80), plain, 4.0),
            8,
            8,
        ),
        fixed(DType::BF16, (2, 1, 1), (65, 65, 32), window(20, 3), 1.0),
        with_o(
            fixed(DType::BF16, (1, 1, 2), (200, 130, 40), causal, 1.0),
            2,
            2,
        ),
        fixed(DType::F16, (1, 1, 1), (257, 300, 120), capped, 4.0),
        with_o(
            fixed(DType::BF16, (1, 1, 2), (70, 2100, 192), causal, 1.0),
            8,
            8,
        ),
        fixed(DType::BF16, (1, 1, 1), (70, 90, 136), plain, 1.0),
    ];
    let backward = vec![
        fixed(DType::BF16, (1, 2, 2), (300, 300, 96), causal, 1.0),
        aligned_out(fixed(DType::F16, (1, 1, 3), (129, 257, 80), plain, 1.0)),
        with_o(
            fixed(DType::BF16, (2, 1, 1), (130, 70, 32), window(40, 0), 1.0),
            8,
            8,
        ),
        with_o(
            fixed(DType::F16, (1, 1, 2), (200, 200, 120), capped, 1.0),
            2,
            2,
        ),
        aligned_out(fixed(DType::BF16, (1, 1, 1), (64, 190, 40), causal, 1.0)),
    ];
    // The sm_80 tile kernels at a head dim below their width (64 or 128), which sm_90a runs
    // where TMA declines a view or the backward must be deterministic: K and V rows off their
    // 16-byte boundaries (element loads) or Q's only (K and V by cp.async), 40 and 120 (not
    // multiples of 16, so not the vendor-neutral forward's), and deterministic gradients.
    let off = |mut c: Case, kv: bool| {
        let m = if kv { &mut c.kv_mem } else { &mut c.q_mem };
        m.offset = 1;
        c
    };
    let deterministic = |mut c: Case| {
        c.opts.deterministic = true;
        c
    };
    let forward = [
        forward,
        vec![
            off(
                fixed(DType::BF16, (1, 1, 2), (130, 200, 40), causal, 1.0),
                true,
            ),
            off(
                fixed(DType::F16, (1, 2, 1), (70, 65, 120), window(30, 10), 4.0),
                false,
            ),
        ],
    ]
    .concat();
    let backward = [
        backward,
        vec![
            deterministic(fixed(DType::BF16, (1, 1, 2), (130, 200, 96), causal, 1.0)),
            deterministic(off(
                fixed(DType::F16, (1, 2, 1), (70, 65, 40), plain, 1.0),
                true,
            )),
        ],
    ]
    .concat();
    for dev in calico_conformance::backends().0 {
        for c in &forward {
            if let Err(e) = forward_case(&dev, c) {
                panic!("backend {}: forward {c:?}: {e}", dev.kind());
            }
        }
        for c in &backward {
            if let Err(e) = backward_case(&dev, c) {
                panic!("backend {}: backward {c:?}: {e}", dev.kind());
            }
        }
        let lens = [(130, 300), (1, 5), (0, 10), (200, 200)];
        let form = VarlenForm {
            head_dim: 96,
            aligned: true,
            backward: true,
        };
        if let Err(e) = varlen_case(&dev, DType::BF16, &lens, causal, 91, form) {
            panic!("backend {}: packed d96: {e}", dev.kind());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The vendor-neutral tile forward (kernels/device/attention/tiles.cu)

/// The router sends the forward of `c` on `dev` to the tile kernel (called inside
/// `with_tile_forward`, which the launch sees as the plan does).
fn routed_to_tiles(dev: &Device, c: &Case) -> Result<(), String> {
    let case = ops::AttentionCase {
        dtype: c.dtype,
        batch: c.dims.batch,
        q_heads: c.dims.q_heads,
        kv_heads: c.dims.kv_heads,
        seq: c.dims.q_len,
        head_dim: c.dims.head_dim,
        causal: c.opts.causal,
        backward: false,
        varlen: false,
        softcap: c.opts.softcap,
    };
    let plan = ops::plan_attention(&dev.arch().target, &case).ctx("plan_attention")?;
    match plan.kernels.first() {
        Some(k) if k.label.starts_with("tiles fwd") => Ok(()),
        other => Err(format!(
            "the forward was routed to {:?}, not the tile kernel",
            other.map(|k| &k.label)
        )),
    }
}

/// `c`'s forward on `dev` through the tile kernel, checked against the f64 reference.
fn tiles_forward_case(dev: &Device, c: &Case) -> Result<(), String> {
    ops::attention::with_tile_forward(|| {
        routed_to_tiles(dev, c)?;
        forward_case(dev, c)
    })
}

/// Random problems at head dims that are multiples of 16 (those no vendor kernel takes
/// included), every option, both layouts with padding and odd offsets, forced onto the tile
/// kernel on every GPU backend present (CUDA: mma.sync; HIP: MFMA, same source).
#[test]
fn attention_tiles_forward_matches_reference() {
    const TEST: &str = "attention_tiles_forward_matches_reference";
    let strategy = case(vec![16, 32, 48, 64, 80, 96, 128, 160, 192, 256]);
    for dev in gpu_backends(TEST, "the tile forward") {
        let mut runner =
            proptest::test_runner::TestRunner::new(calico_conformance::runner::config(32));
        if let Err(e) = runner.run(&strategy, |c| {
            tiles_forward_case(&dev, &c).map_err(TestCaseError::fail)
        }) {
            panic!("{TEST} on backend {}: {e}", dev.kind());
        }
    }
}

/// The spec's edges through the tile kernel: N = 1, Nq != Nkv, rows that see no key (0 output,
/// -inf LSE), windows wider than the sequence, MQA, soft-cap, large logits, several key blocks,
/// and head dims no vendor kernel takes.
#[test]
fn attention_tiles_forward_edges() {
    const TEST: &str = "attention_tiles_forward_edges";
    let causal = causal_mask();
    let plain = AttentionOptions::default();
    let window = window_mask;
    let mut cases = edge_cases();
    cases.extend([
        fixed(DType::BF16, (1, 1, 1), (1, 1, 16), plain, 1.0),
        fixed(DType::F16, (2, 2, 3), (1, 300, 96), causal, 4.0),
        fixed(DType::BF16, (1, 2, 4), (300, 1, 48), causal, 1.0),
        fixed(DType::F16, (1, 1, 2), (129, 257, 80), window(40, 7), 1.0),
        fixed(DType::BF16, (1, 1, 1), (9, 40, 160), window(0, 0), 1.0),
        fixed(DType::BF16, (1, 2, 8), (257, 129, 192), causal, 4.0),
        with_o(
            fixed(DType::F16, (1, 1, 1), (520, 600, 256), causal, 1.0),
            8,
            8,
        ),
        fixed(
            DType::BF16,
            (1, 1, 2),
            (200, 333, 112),
            AttentionOptions {
                causal: true,
                softcap: Some(5.0),
                scale: Some(0.3),
                ..Default::default()
            },
            4.0,
        ),
    ]);
    for dev in gpu_backends(TEST, "the tile forward") {
        for c in &cases {
            if let Err(e) = tiles_forward_case(&dev, c) {
                panic!("{TEST} on backend {}: {c:?}: {e}", dev.kind());
            }
        }
    }
}

/// Packed sequences (empty and single-token ones, Nq != Nkv, causal and windowed) with the
/// forward on the tile kernel (the backward as routed), against the per-sequence reference.
#[test]
fn attention_tiles_varlen_matches_reference() {
    const TEST: &str = "attention_tiles_varlen_matches_reference";
    let causal = causal_mask();
    let window = AttentionOptions {
        window: Some((20, 3)),
        ..Default::default()
    };
    let lens: [&[(usize, usize)]; 4] = [
        &[(0, 5), (1, 1), (17, 0), (130, 129)],
        &[(1, 64), (65, 3), (0, 0)],
        &[(64, 64), (2, 17), (129, 1)],
        &[(3, 63), (0, 1), (1, 0)],
    ];
    for dev in gpu_backends(TEST, "the tile forward") {
        for (i, l) in lens.iter().enumerate() {
            for (dtype, opts) in [
                (DType::BF16, AttentionOptions::default()),
                (DType::F16, causal),
                (DType::BF16, window),
            ] {
                let r = ops::attention::with_tile_forward(|| {
                    // varlen_case's heads and head dim, as the router sees them.
                    let c = fixed(dtype, (1, 2, 2), (64, 64, 64), opts, 1.0);
                    routed_to_tiles(&dev, &c)?;
                    varlen_case(
                        &dev,
                        dtype,
                        l,
                        opts,
                        7 + i as u64,
                        VarlenForm {
                            head_dim: 64,
                            aligned: false,
                            backward: true,
                        },
                    )
                });
                if let Err(e) = r {
                    panic!(
                        "{TEST} on backend {}: {l:?} {dtype} {opts:?}: {e}",
                        dev.kind()
                    );
                }
            }
        }
    }
}
