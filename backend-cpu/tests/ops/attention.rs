//! Attention on the CPU gives the same bits whatever the thread count (its task size follows
//! the number of rayon threads). Its values are checked against the f64 reference in the
//! conformance suite.

use crate::common::*;
use calico_core::{DType, Tensor};
use calico_cpu::{attention_backward, attention_forward, AttentionParams, AttentionShape, SeqSpan};

/// Forward and backward outputs of one call, as stored.
fn run(
    shape: &AttentionShape,
    params: &AttentionParams,
    inputs: &[Tensor; 4],
    dims: [usize; 3],
) -> Vec<Vec<f64>> {
    let [q, k, v, d_o] = inputs;
    let [b, hq, nq] = dims;
    let zeros = |s: &[usize], dtype| Tensor::zeros(&dev(), s, dtype).unwrap();
    let o = zeros(q.shape(), q.dtype());
    let lse = zeros(&[b, hq, nq], DType::F32);
    attention_forward(shape, params, q, k, v, &o, &lse).unwrap();
    let (dq, dk, dv) = (
        zeros(q.shape(), q.dtype()),
        zeros(k.shape(), k.dtype()),
        zeros(v.shape(), v.dtype()),
    );
    attention_backward(shape, params, q, k, v, &o, &lse, d_o, &dq, &dk, &dv).unwrap();
    [&o, &lse, &dq, &dk, &dv].iter().map(|t| read(t)).collect()
}

#[test]
fn attention_is_the_same_at_every_thread_count() {
    let (b, hq, hkv, nq, nk, d) = (1, 4, 2, 150, 200, 64);
    let masks = [
        (None, None),
        (None, Some(0)),
        (Some(37), Some(0)),
        (Some(70), Some(9)),
    ];
    for dtype in [DType::F32, DType::BF16] {
        for (left, right) in masks {
            let mut rng = Rng::new(7);
            let (q, _) = random(&mut rng, dtype, &[b, hq, nq, d], -2.0, 2.0);
            let (k, _) = random(&mut rng, dtype, &[b, hkv, nk, d], -2.0, 2.0);
            let (v, _) = random(&mut rng, dtype, &[b, hkv, nk, d], -2.0, 2.0);
            let (d_o, _) = random(&mut rng, dtype, &[b, hq, nq, d], -1.0, 1.0);
            let shape = AttentionShape {
                seqs: vec![SeqSpan {
                    batch: 0,
                    q_start: 0,
                    q_len: nq,
                    k_start: 0,
                    k_len: nk,
                }],
                q_heads: hq,
                kv_heads: hkv,
                head_dim: d,
            };
            let params = AttentionParams {
                scale: 0.125,
                softcap: None,
                left,
                right,
            };
            let inputs = [q, k, v, d_o];
            let in_pool = |threads: usize| {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                pool.install(|| run(&shape, &params, &inputs, [b, hq, nq]))
            };
            let one = in_pool(1);
            for threads in [2, 3, 8] {
                let many = in_pool(threads);
                for (name, (a, m)) in ["o", "lse", "dq", "dk", "dv"]
                    .iter()
                    .zip(one.iter().zip(&many))
                {
                    let same = a.iter().zip(m).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(
                        same,
                        "{dtype} window ({left:?}, {right:?}): `{name}` differs between 1 and {threads} threads"
                    );
                }
            }
        }
    }
}
