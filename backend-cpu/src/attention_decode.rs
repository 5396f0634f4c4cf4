//! Decode attention over a paged or contiguous KV cache, scores and softmax in f32. Work items
//! are (sequence, KV head, split of 2048 keys): the item's query rows (every query head of the
//! GQA group, every query token) share each K and V row, widened once per item, and keep an
//! online softmax over blocks of 64 keys; the splits are merged through their LSEs in order,
//! so results do not depend on the thread count.

use crate::convert::{expect_dtype, float_dtype, load, store};
use crate::key_blocks::{self, KeyRows, Logit, Partial};
use crate::lanes::prefetch;
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
    // Views start at each tensor's first element: offsets below are from there.
    let (qs, os) = (q.strides(), o.strides());

    with_views(&[q, k, v], &[o, lse], |ins, outs| {
        let (qb, kb, vb) = match *ins {
            [a, b, c] => (a, b, c),
            _ => return Err(Error::unsupported("internal: missing view")),
        };
        let read = Reader { dtype, dim };
        // One item per (sequence, KV head, key split): the group's query rows share each K and
        // V row, which is widened once for all of them.
        let splits: Vec<usize> = lens
            .iter()
            .map(|&l| (l as usize).div_ceil(SPLIT_KEYS).max(1))
            .collect();
        let items: Vec<(usize, usize, usize)> = (0..batch)
            .flat_map(|b| {
                let n = splits[b];
                (0..hkv).flat_map(move |h| (0..n).map(move |s| (b, h, s)))
            })
            .collect();
        let group_rows = group * nq;
        let partials: Vec<Partial> = items
            .par_iter()
            .map(|&(b, kv_head, split)| -> Result<Partial> {
                let mut part = Partial::empty(group_rows, dim);
                let mut qv = vec![0.0f32; group_rows * dim];
                let mut ranges = Vec::with_capacity(group_rows);
                let len = lens[b] as usize;
                let (k0, k1) = (split * SPLIT_KEYS, ((split + 1) * SPLIT_KEYS).min(len));
                for g in 0..group {
                    let head = kv_head * group + g;
                    for qi in 0..nq {
                        let r = g * nq + qi;
                        let at = b * qs[0] + head * qs[1] + qi * qs[2];
                        read.row(qb, at, &mut qv[r * dim..(r + 1) * dim])?;
                        let (lo, hi) = visible(mask, qi, nq, len);
                        ranges.push((lo.max(k0), hi.min(k1)));
                    }
                }
                let logit = Logit {
                    scale: mask.scale,
                    softcap: mask.softcap,
                };
                let keys = CachedKeys {
                    read,
                    bytes: (kb, vb),
                    map: &map,
                    seq: b,
                    head: kv_head,
                };
                key_blocks::attend(&qv, dim, &ranges, &keys, logit, &mut part)?;
                Ok(part)
            })
            .collect::<Result<_>>()?;
        // Partials merged in split order, per query row.
        let mut outs = outs.into_iter();
        let (ob, lb) = match (outs.next(), outs.next()) {
            (Some(a), Some(b)) => (a, b),
            _ => return Err(Error::unsupported("internal: missing output view")),
        };
        let mut out = vec![0.0f32; dim];
        let mut first_item = 0;
        for (b, &n) in splits.iter().enumerate() {
            for kv_head in 0..hkv {
                let parts = &partials[first_item..first_item + n];
                first_item += n;
                for g in 0..group {
                    let head = kv_head * group + g;
                    for qi in 0..nq {
                        let l = key_blocks::merge(parts, g * nq + qi, &mut out);
                        let start = (b * os[0] + head * os[1] + qi * os[2]) * esz;
                        let dst = ob.get_mut(start..start + dim * esz).ok_or_else(|| {
                            Error::OutOfBounds("attention_decode: o row past its tensor".into())
                        })?;
                        store(dtype, &out, dst);
                        let r = (b * hq + head) * nq + qi;
                        lb[4 * r..4 * r + 4].copy_from_slice(&l.to_ne_bytes());
                    }
                }
            }
        }
        Ok(())
    })
}

/// Keys per work item: long caches are split and the splits merged through their LSEs.
const SPLIT_KEYS: usize = 2048;

/// Widens rows of `dim` elements of one dtype.
#[derive(Clone, Copy)]
struct Reader {
    dtype: DType,
    dim: usize,
}

impl Reader {
    /// Widens the row at element `at` of `bytes` (its view) into `dst`.
    fn row(&self, bytes: &[u8], at: usize, dst: &mut [f32]) -> Result<()> {
        load(self.dtype, self.stored(bytes, at)?, dst);
        Ok(())
    }

    /// The stored bytes of the row at element `at` of `bytes` (its view).
    fn stored<'b>(&self, bytes: &'b [u8], at: usize) -> Result<&'b [u8]> {
        let esz = self.dtype.size_bytes();
        bytes.get(at * esz..(at + self.dim) * esz).ok_or_else(|| {
            Error::OutOfBounds("attention_decode: a row lies past its tensor".into())
        })
    }
}

/// One sequence's keys of one KV head in the cache, for key_blocks::attend.
struct CachedKeys<'a> {
    read: Reader,
    /// The K and V views' bytes.
    bytes: (&'a [u8], &'a [u8]),
    map: &'a TokenMap,
    seq: usize,
    head: usize,
}

impl KeyRows for CachedKeys<'_> {
    fn k(&self, j: usize, dst: &mut [f32]) -> Result<()> {
        let at = self.map.at(self.seq, self.head, j).0;
        self.read.row(self.bytes.0, at, dst)
    }

    fn v(&self, j: usize, dst: &mut [f32]) -> Result<()> {
        let at = self.map.at(self.seq, self.head, j).1;
        self.read.row(self.bytes.1, at, dst)
    }

    /// A decode item's few query rows (a GQA group's) would pay a K block's transpose
    /// alone: pair dot products at every head dim.
    fn pair_scores(&self) -> bool {
        self.read.dtype == DType::BF16
    }

    fn k_bytes(&self, j: usize) -> Result<&[u8]> {
        let at = self.map.at(self.seq, self.head, j).0;
        self.read.stored(self.bytes.0, at)
    }

    /// The cache streams from memory once per item: its lines are asked for a block ahead
    /// (each K and V row is `dim` elements, a few cache lines).
    fn prefetch(&self, j: usize) {
        let (k, v) = self.map.at(self.seq, self.head, j);
        let (esz, row) = (self.read.dtype.size_bytes(), self.read.dim);
        for (bytes, at) in [(self.bytes.0, k), (self.bytes.1, v)] {
            let (first, last) = (at * esz, (at + row) * esz - 1);
            for byte in (first..last).step_by(64).chain([last]) {
                prefetch(bytes, byte);
            }
        }
    }
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

fn shape4(t: &Tensor) -> Result<[usize; 4]> {
    match *t.shape() {
        [a, b, c, d] => Ok([a, b, c, d]),
        _ => Err(Error::shape("attention_decode: K and V must have rank 4")),
    }
}
