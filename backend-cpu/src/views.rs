//! Locking the storages of one op and handing out byte slices per tensor.
//!
//! Every op locks all the storages it touches at once, in address order and deduplicated, so
//! two ops never deadlock. A storage that holds an output is write-locked once; inputs in it
//! read from the parts no output covers, and an input whose bytes an output may overwrite is
//! copied first. Each tensor gets the slice of its byte span (`Tensor::byte_span`), so element
//! `e` of the layout is at byte `(e - offset) * size` of its slice.

use crate::storage::{AlignedBytes, CpuStorage};
use calico_core::{Error, Result, Tensor};
use std::sync::{RwLockReadGuard, RwLockWriteGuard};

enum Guard<'a> {
    Read(RwLockReadGuard<'a, AlignedBytes>),
    Write(RwLockWriteGuard<'a, AlignedBytes>),
}

/// Which locked storage a tensor lives in, and the bytes it spans.
#[derive(Clone, Copy)]
struct Place {
    storage: usize,
    start: usize,
    end: usize,
}

impl Place {
    fn is_empty(&self) -> bool {
        self.start >= self.end
    }
    fn overlaps(&self, other: &Place) -> bool {
        self.storage == other.storage
            && !self.is_empty()
            && !other.is_empty()
            && self.start < other.end
            && other.start < self.end
    }
}

/// Locks the storages of `inputs` and `outputs` and calls `f` with the byte span of each input
/// (shared) and each output (exclusive), in the order given. Outputs that overlap each other
/// are an `Aliasing` error; a storage that is not a CPU buffer is a `DeviceMismatch`.
pub(crate) fn with_views<R>(
    inputs: &[&Tensor],
    outputs: &[&Tensor],
    f: impl FnOnce(&[&[u8]], Vec<&mut [u8]>) -> Result<R>,
) -> Result<R> {
    // Unique storages in address order; written when any output lives there.
    let mut stores: Vec<(&CpuStorage, bool)> = Vec::with_capacity(inputs.len() + outputs.len());
    for (t, write) in inputs
        .iter()
        .map(|t| (t, false))
        .chain(outputs.iter().map(|t| (t, true)))
    {
        stores.push((CpuStorage::downcast(t.storage().as_ref())?, write));
    }
    stores.sort_by_key(|(s, write)| (s.lock_order_key(), !write));
    // After the sort a written entry comes first among equal keys, so dedup keeps it.
    stores.dedup_by_key(|(s, _)| s.lock_order_key());

    let place = |t: &Tensor| -> Result<Place> {
        let key = CpuStorage::downcast(t.storage().as_ref())?.lock_order_key();
        let storage = stores
            .binary_search_by_key(&key, |(s, _)| s.lock_order_key())
            .map_err(|_| Error::unsupported("internal: a tensor's storage was not locked"))?;
        let (start, end) = t.byte_span();
        Ok(Place {
            storage,
            start,
            end,
        })
    };
    let in_places = inputs
        .iter()
        .map(|t| place(t))
        .collect::<Result<Vec<_>>>()?;
    let out_places = outputs
        .iter()
        .map(|t| place(t))
        .collect::<Result<Vec<_>>>()?;
    for (i, a) in out_places.iter().enumerate() {
        if out_places[i + 1..].iter().any(|b| a.overlaps(b)) {
            return Err(Error::Aliasing("two outputs of one op overlap".into()));
        }
    }

    let mut guards: Vec<Guard<'_>> = stores
        .iter()
        .map(|&(s, write)| {
            if write {
                Guard::Write(s.write())
            } else {
                Guard::Read(s.read())
            }
        })
        .collect();

    // Inputs that an output may overwrite are read from a copy taken before the op starts.
    let mut snapshots: Vec<Option<AlignedBytes>> = Vec::with_capacity(inputs.len());
    for p in &in_places {
        let copy = if out_places.iter().any(|o| o.overlaps(p)) {
            match &guards[p.storage] {
                Guard::Write(g) => Some(AlignedBytes::copy_of(&g.as_slice()[p.start..p.end])?),
                Guard::Read(_) => None,
            }
        } else {
            None
        };
        snapshots.push(copy);
    }

    let mut in_slices: Vec<&[u8]> = vec![&[]; inputs.len()];
    let mut out_slices: Vec<Option<&mut [u8]>> = outputs.iter().map(|_| None).collect();
    for (i, snap) in snapshots.iter().enumerate() {
        if let Some(s) = snap {
            in_slices[i] = s.as_slice();
        }
    }
    for (g, guard) in guards.iter_mut().enumerate() {
        let needs_input = |i: usize| {
            in_places[i].storage == g && snapshots[i].is_none() && !in_places[i].is_empty()
        };
        match guard {
            Guard::Read(bytes) => {
                let bytes: &[u8] = bytes.as_slice();
                for (i, p) in in_places
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| needs_input(i))
                {
                    in_slices[i] = &bytes[p.start..p.end];
                }
            }
            Guard::Write(bytes) => {
                // Cut the buffer into gaps and outputs, in address order.
                let mut outs: Vec<(usize, Place)> = out_places
                    .iter()
                    .copied()
                    .enumerate()
                    .filter(|(_, p)| p.storage == g && !p.is_empty())
                    .collect();
                outs.sort_by_key(|(_, p)| p.start);
                let mut gaps: Vec<(usize, &[u8])> = Vec::with_capacity(outs.len() + 1);
                let mut rest: &mut [u8] = bytes.as_mut_slice();
                let mut pos = 0;
                for (idx, p) in outs {
                    let (gap, tail) = std::mem::take(&mut rest).split_at_mut(p.start - pos);
                    let (out, tail) = tail.split_at_mut(p.end - p.start);
                    gaps.push((pos, &*gap));
                    out_slices[idx] = Some(out);
                    rest = tail;
                    pos = p.end;
                }
                gaps.push((pos, &*rest));
                for (i, p) in in_places
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| needs_input(i))
                {
                    let (at, gap) = gaps
                        .iter()
                        .find(|(at, gap)| *at <= p.start && p.end <= at + gap.len())
                        .ok_or_else(|| {
                            Error::unsupported("internal: an input straddles an output")
                        })?;
                    in_slices[i] = &gap[p.start - at..p.end - at];
                }
            }
        }
    }
    let outs = out_slices
        .into_iter()
        .map(|o| o.unwrap_or(&mut []))
        .collect();
    f(&in_slices, outs)
}
