//! Decode attention over a paged or contiguous KV cache: each (sequence, query head, query
//! token) row in parallel, scores and softmax in f32.

use crate::convert::{expect_dtype, float_dtype, load, store};
use crate::views::with_views;
use calico_core::{DType, Error, Result, Tensor};
use rayon::prelude::*;

/// Scale and masks of a decode call (validated by the `calico` crate).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeMask {
    pub scale: f32,
    /// Bottom-right aligned: query `i` of `nq` sees key `j` of `len` iff `j <= i + len - nq`.
    pub causal: bool,
    /// (left, right) tokens around the aligned diagonal.
    pub window: Option<(usize, usize)>,
    pub softcap: Option<f32>,
}

/// The KV cache: paged (`[num_pages, page_size, Hkv, D]` pages, I32 `[B, max_pages]` block
/// table) or contiguous (`[B, Hkv, Nmax, D]`), with I32 `[B]` sequence lengths.
#[derive(Debug, Clone, Copy)]
pub enum DecodeCache<'a> {
    Paged {
        k_pages: &'a Tensor,
        v_pages: &'a Tensor,
        block_table: &'a Tensor,
        seq_lens: &'a Tensor,
    },
    Contiguous {
        k: &'a Tensor,
        v: &'a Tensor,
        seq_lens: &'a Tensor,
    },
}

/// Where token `j` of sequence `b` lives: element offsets of its K and V rows for head 0.
struct TokenMap {
    paged: bool,
    page_size: usize,
    max_pages: usize,
    table: Vec<i32>,
    k_strides: [usize; 3],
    v_strides: [usize; 3],
}

impl TokenMap {
    /// Offsets (in elements, from the tensor's first element) of K and V for (b, head, j).
    fn at(&self, b: usize, head: usize, j: usize) -> (usize, usize) {
        let (page, slot) = if self.paged {
            let p = self.table[b * self.max_pages + j / self.page_size] as usize;
            (p, j % self.page_size)
        } else {
            (b, j)
        };
        let off = |s: &[usize; 3]| page * s[0] + slot * s[1] + head * s[2];
        (off(&self.k_strides), off(&self.v_strides))
    }
}

/// Decode attention of `q` ([B, Hq, Nq, D]) over `cache` into `o` (like `q`) and `lse` (f32
/// [B, Hq, Nq], contiguous). Lengths outside `[0, capacity]` and page indices outside the pool
/// are an `Err`.
pub fn attention_decode(
    q: &Tensor,
    cache: &DecodeCache<'_>,
    mask: &DecodeMask,
    o: &Tensor,
    lse: &Tensor,
) -> Result<()> {
    let dtype = float_dtype(q)?;
    let (k, v, seq_lens) = match *cache {
        DecodeCache::Paged {
            k_pages,
            v_pages,
            seq_lens,
            ..
        } => (k_pages, v_pages, seq_lens),
        DecodeCache::Contiguous { k, v, seq_lens } => (k, v, seq_lens),
    };
    for t in [k, v, o] {
        expect_dtype(t, dtype)?;
    }
    expect_dtype(lse, DType::F32)?;
    expect_dtype(seq_lens, DType::I32)?;
    let (batch, hq, nq, dim) = match *q.shape() {
        [b, h, n, d] => (b, h, n, d),
        _ => return Err(Error::shape("attention_decode: q must be [B, Hq, Nq, D]")),
    };
    if o.shape() != q.shape() || lse.shape() != [batch, hq, nq] || !lse.layout().is_contiguous() {
        return Err(Error::shape(
            "attention_decode: o must be shaped like q, lse contiguous [B, Hq, Nq]",
        ));
    }
    let lens = seq_lens.to_vec::<i32>()?;
    if lens.len() != batch {
        return Err(Error::shape("attention_decode: seq_lens must be [B]"));
    }
    let (map, hkv, capacity) = match *cache {
        DecodeCache::Paged {
            k_pages,
            block_table,
            ..
        } => {
            let [num_pages, page_size, hkv, _] = shape4(k_pages)?;
            let max_pages = block_table.shape().get(1).copied().unwrap_or(0);
            let table = block_table.to_vec::<i32>()?;
            for (b, &len) in lens.iter().enumerate() {
                let used = (len.max(0) as usize)
                    .div_ceil(page_size.max(1))
                    .min(max_pages);
                for &p in &table[b * max_pages..b * max_pages + used] {
                    if p < 0 || p as usize >= num_pages {
                        return Err(Error::OutOfBounds(format!(
                            "attention_decode: sequence {b} uses page {p}; the pool has {num_pages}"
                        )));
                    }
                }
            }
            let s = |t: &Tensor| [t.strides()[0], t.strides()[1], t.strides()[2]];
            let map = TokenMap {
                paged: true,
                page_size: page_size.max(1),
                max_pages,
                table,
                k_strides: s(k),
                v_strides: s(v),
            };
            (map, hkv, max_pages * page_size)
        }
        DecodeCache::Contiguous { k, .. } => {
            let [_, hkv, nmax, _] = shape4(k)?;
            let s = |t: &Tensor| [t.strides()[0], t.strides()[2], t.strides()[1]];
            let map = TokenMap {
                paged: false,
                page_size: 1,
                max_pages: 0,
                table: Vec::new(),
                k_strides: s(k),
                v_strides: s(v),
            };
            (map, hkv, nmax)
        }
    };
    if let Some((b, len)) = lens
        .iter()
        .enumerate()
        .find(|(_, &l)| l < 0 || l as usize > capacity)
    {
        return Err(Error::OutOfBounds(format!(
            "attention_decode: seq_lens[{b}] = {len} is outside 0..={capacity}"
        )));
    }
    if hkv == 0 || hq % hkv != 0 {
        return Err(Error::shape(
            "attention_decode: query heads must be a multiple of KV heads",
        ));
    }
    let group = hq / hkv;
    let rows = batch * hq * nq;
    if rows == 0 || dim == 0 {
        return Ok(());
    }
    let esz = dtype.size_bytes();
    let first = |t: &Tensor| t.byte_span().0 / esz;
    let (q_first, k_first, v_first) = (first(q), first(k), first(v));
    let (qs, os) = (q.strides(), o.strides());

    with_views(&[q, k, v], &[o, lse], |ins, outs| {
        let (qb, kb, vb) = match *ins {
            [a, b, c] => (a, b, c),
            _ => return Err(Error::unsupported("internal: missing view")),
        };
        let row = |bytes: &[u8], first_elem: usize, at: usize| -> Result<Vec<f32>> {
            let start = (at - first_elem) * esz;
            let src = bytes.get(start..start + dim * esz).ok_or_else(|| {
                Error::OutOfBounds("attention_decode: a row lies past its tensor".into())
            })?;
            let mut out = vec![0.0f32; dim];
            load(dtype, src, &mut out);
            Ok(out)
        };
        let results: Vec<(Vec<f32>, f32)> = (0..rows)
            .into_par_iter()
            .map(|r| -> Result<(Vec<f32>, f32)> {
                let (b, head, qi) = (r / (hq * nq), (r / nq) % hq, r % nq);
                let qv = row(qb, q_first, q_first + b * qs[0] + head * qs[1] + qi * qs[2])?;
                let len = lens[b] as usize;
                let (lo, hi) = visible(mask, qi, nq, len);
                let kv_head = head / group;
                let mut scores = Vec::with_capacity(hi.saturating_sub(lo));
                let mut values = Vec::with_capacity(hi.saturating_sub(lo));
                for j in lo..hi {
                    let (ko, vo) = map.at(b, kv_head, j);
                    let kr = row(kb, k_first, k_first + ko)?;
                    let mut s = qv.iter().zip(&kr).map(|(a, b)| a * b).sum::<f32>() * mask.scale;
                    if let Some(cap) = mask.softcap {
                        s = cap * (s / cap).tanh();
                    }
                    scores.push(s);
                    values.push(row(vb, v_first, v_first + vo)?);
                }
                Ok(softmax_rows(&scores, &values, dim))
            })
            .collect::<Result<_>>()?;
        let mut outs = outs.into_iter();
        let (ob, lb) = match (outs.next(), outs.next()) {
            (Some(a), Some(b)) => (a, b),
            _ => return Err(Error::unsupported("internal: missing output view")),
        };
        for (r, (out, l)) in results.iter().enumerate() {
            let (b, head, qi) = (r / (hq * nq), (r / nq) % hq, r % nq);
            let start = (b * os[0] + head * os[1] + qi * os[2]) * esz;
            let dst = ob.get_mut(start..start + dim * esz).ok_or_else(|| {
                Error::OutOfBounds("attention_decode: o row past its tensor".into())
            })?;
            store(dtype, out, dst);
            lb[4 * r..4 * r + 4].copy_from_slice(&l.to_ne_bytes());
        }
        Ok(())
    })
}

/// Keys `lo..hi` that query `qi` of `nq` may see in a sequence of `len` tokens.
fn visible(mask: &DecodeMask, qi: usize, nq: usize, len: usize) -> (usize, usize) {
    let diag = qi as i64 + len as i64 - nq as i64;
    let mut top = if mask.causal { diag } else { len as i64 - 1 };
    let mut bottom = 0i64;
    if let Some((left, right)) = mask.window {
        top = top.min(diag.saturating_add(right as i64));
        bottom = diag.saturating_sub(left as i64);
    }
    let lo = bottom.max(0);
    let hi = (top + 1).min(len as i64);
    if hi <= lo {
        (0, 0)
    } else {
        (lo as usize, hi as usize)
    }
}

/// softmax(scores) @ values and the natural-log LSE; no scores: zeros and -inf.
fn softmax_rows(scores: &[f32], values: &[Vec<f32>], dim: usize) -> (Vec<f32>, f32) {
    let mut out = vec![0.0f32; dim];
    let Some(max) = scores.iter().copied().reduce(f32::max) else {
        return (out, f32::NEG_INFINITY);
    };
    let mut sum = 0.0f32;
    for (s, v) in scores.iter().zip(values) {
        let p = (s - max).exp();
        sum += p;
        for (o, x) in out.iter_mut().zip(v) {
            *o += p * x;
        }
    }
    for o in &mut out {
        *o /= sum;
    }
    (out, max + sum.ln())
}

fn shape4(t: &Tensor) -> Result<[usize; 4]> {
    match *t.shape() {
        [a, b, c, d] => Ok([a, b, c, d]),
        _ => Err(Error::shape("attention_decode: K and V must have rank 4")),
    }
}
