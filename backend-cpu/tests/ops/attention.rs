//! Attention on the CPU gives the same bits whatever the thread count (its task size follows
//! the number of rayon threads). Its values are checked against the f64 reference in the
//! conformance suite.

use crate::common::*;
use calico_core::DType;
use calico_cpu::AttentionParams;

#[test]
fn attention_is_the_same_at_every_thread_count() {
    let dims = (4, 2, 150, 200, 64);
    let masks = [
        (None, None),
        (None, Some(0)),
        (Some(37), Some(0)),
        (Some(70), Some(9)),
    ];
    for dtype in [DType::F32, DType::BF16] {
        for (left, right) in masks {
            let mut rng = Rng::new(7);
            let (inputs, shape) = one_sequence_attention(&mut rng, dtype, dims);
            let params = AttentionParams {
                scale: 0.125,
                softcap: None,
                left,
                right,
            };
            let in_pool = |threads: usize| {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                pool.install(|| {
                    attention_forward_backward(&shape, &params, &inputs).map(|t| read(&t))
                })
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
