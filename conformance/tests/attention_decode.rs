//! Decode attention over paged and contiguous KV caches against the f64 reference: pages not
//! filled, empty and one-token sequences, page sizes 16..256, GQA ratios up to 8, 1 to 16
//! query tokens, causal / windowed / soft-capped, large logits, long sequences (split-KV).

use calico::ops::{self, AttentionOptions, KvCache};
use calico::{DType, Device, Tensor};
use calico_conformance::compare::{check_close, elementwise_tol};
use calico_conformance::reference::{self, DecodeMask};
use calico_conformance::rng::{Dist, Rng};
use calico_conformance::strategies::dist;
use calico_conformance::tensors::{round_all, untouched_outside, view, write, View};
use calico_conformance::{property, Ctx};
use proptest::prelude::*;
use proptest::sample::select;

/// Query-row x key x head_dim products per case: keeps a debug CPU run quick.
const WORK_BUDGET: usize = 6_000_000;

#[derive(Debug, Clone)]
struct Case {
    dtype: DType,
    hkv: usize,
    group: usize,
    nq: usize,
    dim: usize,
    /// Tokens per page; None: a contiguous cache.
    page_size: Option<usize>,
    lens: Vec<usize>,
    /// Spare capacity per sequence (pages or tokens past the longest length).
    spare: usize,
    causal: bool,
    window: Option<(usize, usize)>,
    softcap: Option<f32>,
    scale: Option<f32>,
    /// Q and O stored [B, Nq, Hq, D] (passed transposed) rather than [B, Hq, Nq, D].
    tokens_outer: bool,
    /// K/V (contiguous cache) stored [B, Nmax, Hkv, D] rather than [B, Hkv, Nmax, D].
    kv_tokens_outer: bool,
    /// Extra elements (a multiple of 8) after each head row of Q and K/V.
    pad: usize,
    dist: Dist,
    seed: u64,
}

fn length() -> impl Strategy<Value = usize> {
    prop_oneof![
        3 => select(vec![0usize, 1, 2, 15, 16, 17, 31, 63, 64, 65, 255, 256, 257]),
        3 => 0usize..=200,
        1 => 300usize..=1500,
    ]
}

fn case() -> impl Strategy<Value = Case> {
    (
        (
            select(vec![DType::BF16, DType::F16]),
            1usize..=3,
            select(vec![1usize, 2, 3, 4, 5, 6, 7, 8]),
            prop_oneof![3 => Just(1usize), 2 => 2usize..=4, 1 => 5usize..=16],
            // 40 and 96 run the 64- and 128-wide kernels on zero-filled columns.
            prop_oneof![4 => select(vec![64usize, 128, 256]), 1 => select(vec![40usize, 96])],
            prop_oneof![
                1 => Just(None),
                2 => select(vec![16usize, 32, 48, 64, 128, 256]).prop_map(Some),
            ],
            prop::collection::vec(length(), 1..=3),
            0usize..=2,
        ),
        (
            any::<bool>(),
            prop_oneof![
                2 => Just(None),
                1 => (0usize..=40, 0usize..=40).prop_map(Some),
                1 => Just(Some((5000usize, 5000usize))),
            ],
            prop_oneof![3 => Just(None), 1 => (1.0f32..30.0).prop_map(Some)],
            prop_oneof![2 => Just(None), 1 => select(vec![0.01f32, 0.5, 2.0, 8.0]).prop_map(Some)],
            any::<bool>(),
            any::<bool>(),
            select(vec![0usize, 8, 24]),
            dist(),
            any::<u64>(),
        ),
    )
        .prop_map(
            |(
                (dtype, hkv, group, nq, dim, page_size, lens, spare),
                (causal, window, softcap, scale, tokens_outer, kv_tokens_outer, pad, dist, seed),
            )| {
                let mut c = Case {
                    dtype,
                    hkv,
                    group,
                    nq,
                    dim,
                    page_size,
                    lens,
                    spare,
                    causal,
                    window,
                    softcap,
                    scale,
                    tokens_outer,
                    kv_tokens_outer,
                    pad,
                    dist,
                    seed,
                };
                c.fit_budget();
                c
            },
        )
}

impl Case {
    fn batch(&self) -> usize {
        self.lens.len()
    }
    fn hq(&self) -> usize {
        self.hkv * self.group
    }
    fn work(&self) -> usize {
        self.hq() * self.nq * self.dim * self.lens.iter().sum::<usize>().max(1)
    }
    /// Shortens the sequences (then the query count) until the case fits [`WORK_BUDGET`].
    fn fit_budget(&mut self) {
        while self.work() > WORK_BUDGET && self.lens.iter().any(|&l| l > 1) {
            for l in &mut self.lens {
                *l /= 2;
            }
        }
        while self.work() > WORK_BUDGET && self.nq > 1 {
            self.nq -= 1;
        }
    }
    fn max_len(&self) -> usize {
        self.lens.iter().copied().max().unwrap_or(0)
    }
    fn mask(&self) -> DecodeMask {
        DecodeMask {
            scale: self
                .scale
                .map_or(1.0 / (self.dim as f64).sqrt(), |s| s as f64),
            causal: self.causal,
            window: self.window,
            softcap: self.softcap.map(|c| c as f64),
        }
    }
    fn options(&self) -> AttentionOptions {
        AttentionOptions {
            scale: self.scale,
            causal: self.causal,
            window: self.window,
            softcap: self.softcap,
            deterministic: false,
        }
    }
}

/// A [B, H, N, D] view stored [B, H, N, D] or (tokens_outer) [B, N, H, D], with `pad` extra
/// elements after each row of D, filled with `values` (row-major over [B, H, N, D]).
fn bhnd(
    dev: &Device,
    dtype: DType,
    [b, h, n, d]: [usize; 4],
    tokens_outer: bool,
    pad: usize,
    values: Option<&[f64]>,
) -> Result<View, String> {
    let row = d + pad;
    let strides = if tokens_outer {
        [n * h * row, row, h * row, 1]
    } else {
        [h * n * row, n * row, row, 1]
    };
    let v = view(
        dev,
        dtype,
        &[b, h, n, d],
        &strides,
        0,
        values.is_none().then_some(f64::NAN),
    )
    .ctx("allocating a [B, H, N, D] view")?;
    if let Some(values) = values {
        write(&v.view, values).ctx("writing a [B, H, N, D] view")?;
    }
    Ok(v)
}

/// The cache tensors of a case and, per sequence, its K and V gathered as [Hkv, L, D].
struct Cache {
    k: View,
    v: View,
    block_table: Option<Tensor>,
    seq_lens: Tensor,
    gathered: Vec<(Vec<f64>, Vec<f64>)>,
}

fn build_cache(dev: &Device, c: &Case, rng: &mut Rng) -> Result<Cache, String> {
    let (batch, hkv, dim) = (c.batch(), c.hkv, c.dim);
    let lens_i32: Vec<i32> = c.lens.iter().map(|&l| l as i32).collect();
    let seq_lens = dev.tensor(&lens_i32, &[batch]).ctx("uploading seq_lens")?;
    match c.page_size {
        Some(ps) => {
            let max_pages = c.max_len().div_ceil(ps) + c.spare;
            let used: Vec<usize> = c.lens.iter().map(|l| l.div_ceil(ps)).collect();
            let num_pages = used.iter().sum::<usize>() + 1 + c.spare;
            // Pages handed out in a shuffled order; unused table entries hold -1 (never read).
            let mut order: Vec<usize> = (0..num_pages).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i + 1));
            }
            let mut table = vec![-1i32; batch * max_pages];
            let mut next = 0;
            for (b, &u) in used.iter().enumerate() {
                for p in 0..u {
                    table[b * max_pages + p] = order[next] as i32;
                    next += 1;
                }
            }
            let shape = [num_pages, ps, hkv, dim];
            let mut values = round_all(c.dtype, &c.dist.sample(rng, shape.iter().product()));
            let mut v_values = round_all(c.dtype, &c.dist.sample(rng, shape.iter().product()));
            // A pool's slots that no sequence holds may contain anything: NaN here, so a
            // kernel that lets them into a sum (0 * NaN) fails.
            let mut live = vec![false; num_pages * ps];
            for (b, &len) in c.lens.iter().enumerate() {
                for j in 0..len {
                    live[table[b * max_pages + j / ps] as usize * ps + j % ps] = true;
                }
            }
            for (slot, _) in live.iter().enumerate().filter(|(_, &l)| !l) {
                let at = slot * hkv * dim;
                values[at..at + hkv * dim].fill(f64::NAN);
                v_values[at..at + hkv * dim].fill(f64::NAN);
            }
            let row = dim + c.pad;
            let strides = [ps * hkv * row, hkv * row, row, 1];
            let k = view(dev, c.dtype, &shape, &strides, 0, None).ctx("allocating k_pages")?;
            let v = view(dev, c.dtype, &shape, &strides, 0, None).ctx("allocating v_pages")?;
            write(&k.view, &values).ctx("writing k_pages")?;
            write(&v.view, &v_values).ctx("writing v_pages")?;
            let gathered = (0..batch)
                .map(|b| {
                    let len = c.lens[b];
                    let mut gk = Vec::with_capacity(hkv * len * dim);
                    let mut gv = Vec::with_capacity(hkv * len * dim);
                    for h in 0..hkv {
                        for j in 0..len {
                            let page = table[b * max_pages + j / ps] as usize;
                            let at = ((page * ps + j % ps) * hkv + h) * dim;
                            gk.extend_from_slice(&values[at..at + dim]);
                            gv.extend_from_slice(&v_values[at..at + dim]);
                        }
                    }
                    (gk, gv)
                })
                .collect();
            let block_table = dev
                .tensor(&table, &[batch, max_pages])
                .ctx("uploading the block table")?;
            Ok(Cache {
                k,
                v,
                block_table: Some(block_table),
                seq_lens,
                gathered,
            })
        }
        None => {
            let nmax = c.max_len() + c.spare * 7;
            let shape = [batch, hkv, nmax, dim];
            let n = shape.iter().product();
            let mut kvals = round_all(c.dtype, &c.dist.sample(rng, n));
            let mut vvals = round_all(c.dtype, &c.dist.sample(rng, n));
            // Tokens past each sequence's end may hold anything: NaN (see the paged case).
            for (b, &len) in c.lens.iter().enumerate() {
                for h in 0..hkv {
                    let row = (b * hkv + h) * nmax;
                    kvals[(row + len) * dim..(row + nmax) * dim].fill(f64::NAN);
                    vvals[(row + len) * dim..(row + nmax) * dim].fill(f64::NAN);
                }
            }
            let k = bhnd(dev, c.dtype, shape, c.kv_tokens_outer, c.pad, Some(&kvals))?;
            let v = bhnd(dev, c.dtype, shape, c.kv_tokens_outer, c.pad, Some(&vvals))?;
            let gathered = (0..batch)
                .map(|b| {
                    let len = c.lens[b];
                    let pick = |vals: &[f64]| -> Vec<f64> {
                        (0..hkv)
                            .flat_map(|h| {
                                let at = (b * hkv + h) * nmax * dim;
                                vals[at..at + len * dim].to_vec()
                            })
                            .collect()
                    };
                    (pick(&kvals), pick(&vvals))
                })
                .collect();
            Ok(Cache {
                k,
                v,
                block_table: None,
                seq_lens,
                gathered,
            })
        }
    }
}

/// Runs the op on a case; returns (O, LSE) as read back, and checks nothing outside O moved.
fn run(dev: &Device, c: &Case, q: &View, cache: &Cache) -> Result<(Vec<f64>, Vec<f64>), String> {
    let (batch, hq, nq, dim) = (c.batch(), c.hq(), c.nq, c.dim);
    let mut o = bhnd(
        dev,
        c.dtype,
        [batch, hq, nq, dim],
        c.tokens_outer,
        c.pad,
        None,
    )?;
    let lse_view = view(
        dev,
        DType::F32,
        &[batch, hq, nq],
        &[hq * nq, nq, 1],
        0,
        Some(f64::NAN),
    )
    .ctx("allocating lse")?;
    let mut lse = lse_view.view.clone();
    let kv = match &cache.block_table {
        Some(table) => KvCache::Paged {
            k_pages: &cache.k.view,
            v_pages: &cache.v.view,
            block_table: table,
            seq_lens: &cache.seq_lens,
        },
        None => KvCache::Contiguous {
            k: &cache.k.view,
            v: &cache.v.view,
            seq_lens: &cache.seq_lens,
        },
    };
    ops::attention_decode(dev, &q.view, &kv, &c.options(), &mut o.view, &mut lse)
        .ctx("attention_decode")?;
    untouched_outside(&o, "o")?;
    let out = o.view.to_f64_vec().ctx("reading o")?;
    let lse = lse.to_f64_vec().ctx("reading lse")?;
    Ok((out, lse))
}

fn check(dev: &Device, c: &Case) -> Result<(), String> {
    let mut rng = Rng::new(c.seed);
    let (batch, hq, nq, dim) = (c.batch(), c.hq(), c.nq, c.dim);
    let qvals = round_all(c.dtype, &c.dist.sample(&mut rng, batch * hq * nq * dim));
    let q = bhnd(
        dev,
        c.dtype,
        [batch, hq, nq, dim],
        c.tokens_outer,
        c.pad,
        Some(&qvals),
    )?;
    let cache = build_cache(dev, c, &mut rng)?;
    let (out, lse) = run(dev, c, &q, &cache)?;

    let per_seq = hq * nq * dim;
    let mut want_o = Vec::with_capacity(out.len());
    let mut want_lse = Vec::with_capacity(lse.len());
    for b in 0..batch {
        let (gk, gv) = &cache.gathered[b];
        let (o, l) = reference::decode_attention(
            &qvals[b * per_seq..(b + 1) * per_seq],
            gk,
            gv,
            (hq, c.hkv, nq, dim, c.lens[b]),
            c.mask(),
        );
        want_o.extend(o);
        want_lse.extend(l);
    }
    // Rows that see no key: exactly zero output and -inf LSE.
    for (r, &l) in want_lse.iter().enumerate() {
        let row = &out[r * dim..(r + 1) * dim];
        if l == f64::NEG_INFINITY {
            if lse[r] != f64::NEG_INFINITY || row.iter().any(|&x| x != 0.0) {
                return Err(format!(
                    "row {r} sees no key: expected O = 0 and LSE = -inf, got LSE {} and O[0] {}",
                    lse[r], row[0]
                ));
            }
        } else {
            let tol = 1e-3 * (1.0 + 0.01 * l.abs());
            let close = (lse[r] - l).abs() <= tol; // false for NaN
            if !close {
                return Err(format!(
                    "lse[{r}] = {}, expected {l} (tolerance {tol:.1e})",
                    lse[r]
                ));
            }
        }
    }
    check_close("o", &out, &want_o, elementwise_tol(c.dtype))
}

#[test]
fn decode_matches_reference() {
    property("attention_decode", 40, case(), check);
}

/// A paged bf16 cache of a long sequence, a one-token and an empty one, GQA 4 over 2 KV heads,
/// one query token, no mask: the split-KV cases start from it.
fn long_paged_case() -> Case {
    Case {
        dtype: DType::BF16,
        hkv: 2,
        group: 4,
        nq: 1,
        dim: 128,
        page_size: Some(16),
        lens: vec![5000, 1, 0],
        spare: 1,
        causal: false,
        window: None,
        softcap: None,
        scale: None,
        tokens_outer: false,
        kv_tokens_outer: false,
        pad: 0,
        dist: Dist::Normal { scale: 1.0 },
        seed: 7,
    }
}

/// Long caches on every backend: many splits merged through the LSE, and bit-identical
/// results from two runs (the merge order is fixed).
#[test]
fn long_caches_split_and_repeat_exactly() {
    let long = long_paged_case();
    property("attention_decode long", 1, Just(()), |dev, _| {
        for c in [
            long.clone(),
            Case {
                page_size: None,
                nq: 3,
                causal: true,
                lens: vec![3001],
                ..long.clone()
            },
        ] {
            check(dev, &c)?;
            let mut rng = Rng::new(c.seed);
            let qvals = round_all(
                c.dtype,
                &c.dist.sample(&mut rng, c.batch() * c.hq() * c.nq * c.dim),
            );
            let q = bhnd(
                dev,
                c.dtype,
                [c.batch(), c.hq(), c.nq, c.dim],
                false,
                0,
                Some(&qvals),
            )?;
            let cache = build_cache(dev, &c, &mut rng)?;
            let first = run(dev, &c, &q, &cache)?;
            let second = run(dev, &c, &q, &cache)?;
            let same =
                |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            if !same(&first.0, &second.0) || !same(&first.1, &second.1) {
                return Err("two runs of the same decode differ".into());
            }
        }
        Ok(())
    });
}

/// Head dims between the kernel widths (40 on 64, 96 on 128, 192 on 256): long caches with
/// splits (the combiner or the fused merge), one split, paged and contiguous, GQA, O rows
/// padded past the head dim (checked untouched).
#[test]
fn padded_head_dims_decode() {
    let base = Case {
        dim: 96,
        lens: vec![3000, 1, 0],
        pad: 8,
        seed: 11,
        ..long_paged_case()
    };
    property(
        "attention_decode padded head dims",
        1,
        Just(()),
        |dev, _| {
            for c in [
                base.clone(),
                Case {
                    page_size: None,
                    nq: 3,
                    causal: true,
                    lens: vec![40, 700],
                    dtype: DType::F16,
                    ..base.clone()
                },
                Case {
                    dim: 40,
                    group: 1,
                    page_size: Some(64),
                    lens: vec![2000],
                    ..base.clone()
                },
                Case {
                    dim: 192,
                    group: 8,
                    nq: 2,
                    page_size: None,
                    kv_tokens_outer: true,
                    lens: vec![300, 5],
                    window: Some((100, 0)),
                    ..base.clone()
                },
            ] {
                check(dev, &c).map_err(|e| format!("d{} {:?}: {e}", c.dim, c.page_size))?;
            }
            Ok(())
        },
    );
}

/// Bad inputs are errors, never panics.
#[test]
fn bad_inputs_are_errors() {
    property("attention_decode errors", 1, Just(()), |dev, _| {
        let z = |shape: &[usize], dtype: DType| dev.zeros(shape, dtype).ctx("zeros");
        let q = z(&[1, 4, 1, 128], DType::BF16)?;
        let k = z(&[1, 2, 32, 128], DType::BF16)?;
        let lens = dev.tensor(&[5i32], &[1]).ctx("lens")?;
        let mut o = z(&[1, 4, 1, 128], DType::BF16)?;
        let mut lse = z(&[1, 4, 1], DType::F32)?;
        let opts = AttentionOptions::default();
        let ok = KvCache::Contiguous {
            k: &k,
            v: &k,
            seq_lens: &lens,
        };
        ops::attention_decode(dev, &q, &ok, &opts, &mut o, &mut lse).ctx("a valid call")?;
        let expect_err = |what: &str, r: calico::Result<()>| -> Result<(), String> {
            match r {
                Err(_) => Ok(()),
                Ok(()) => Err(format!("{what} was accepted")),
            }
        };
        let lens_f32 = z(&[1], DType::F32)?;
        let bad = KvCache::Contiguous {
            k: &k,
            v: &k,
            seq_lens: &lens_f32,
        };
        expect_err(
            "f32 seq_lens",
            ops::attention_decode(dev, &q, &bad, &opts, &mut o, &mut lse),
        )?;
        let q17 = z(&[1, 4, 17, 128], DType::BF16)?;
        let mut o17 = z(&[1, 4, 17, 128], DType::BF16)?;
        let mut lse17 = z(&[1, 4, 17], DType::F32)?;
        expect_err(
            "17 queries",
            ops::attention_decode(dev, &q17, &ok, &opts, &mut o17, &mut lse17),
        )?;
        let q3 = z(&[1, 3, 1, 128], DType::BF16)?;
        let mut o3 = z(&[1, 3, 1, 128], DType::BF16)?;
        let mut lse3 = z(&[1, 3, 1], DType::F32)?;
        expect_err(
            "3 query heads over 2",
            ops::attention_decode(dev, &q3, &ok, &opts, &mut o3, &mut lse3),
        )?;
        // Head dims run at 64, 128 or 256: multiples of 8 up to 256, no others.
        for bad_dim in [100, 264] {
            let kd = z(&[1, 2, 32, bad_dim], DType::BF16)?;
            let qd = z(&[1, 4, 1, bad_dim], DType::BF16)?;
            let mut od = z(&[1, 4, 1, bad_dim], DType::BF16)?;
            let cd = KvCache::Contiguous {
                k: &kd,
                v: &kd,
                seq_lens: &lens,
            };
            expect_err(
                &format!("head_dim {bad_dim}"),
                ops::attention_decode(dev, &qd, &cd, &opts, &mut od, &mut lse),
            )?;
        }
        let pages = z(&[4, 16, 2, 128], DType::BF16)?;
        let table = dev.tensor(&[0i32, 1, 2], &[3]).ctx("table")?;
        let paged = KvCache::Paged {
            k_pages: &pages,
            v_pages: &pages,
            block_table: &table,
            seq_lens: &lens,
        };
        expect_err(
            "a rank-1 block table",
            ops::attention_decode(dev, &q, &paged, &opts, &mut o, &mut lse),
        )?;
        let capped = AttentionOptions {
            softcap: Some(-1.0),
            ..opts
        };
        expect_err(
            "a negative soft-cap",
            ops::attention_decode(dev, &q, &ok, &capped, &mut o, &mut lse),
        )?;
        let mut lse_bf16 = z(&[1, 4, 1], DType::BF16)?;
        expect_err(
            "a bf16 lse",
            ops::attention_decode(dev, &q, &ok, &opts, &mut o, &mut lse_bf16),
        )?;
        Ok(())
    });
}
