//! `store.delta`: what a reader holding version N of a bundle needs to make version M
//! (PROTOCOL.md §23), computed on the store's side; [`crate::replica`] applies it.
//!
//! Per tensor of M: nothing (`same`: its digest is the one the reader holds), the elements
//! that changed (`sparse`: their indices, u32 or u64, and their values), or the whole
//! tensor (`dense`), whichever is smaller. Elements are compared by their bit patterns, so
//! a NaN payload or a -0.0 is kept exactly. Sparse deltas need N's bytes on the store's
//! side: a version a reader still holds, or one kept by [`crate::StoreOptions::delta_bases`];
//! when only N's manifest is remembered ([`crate::StoreOptions::delta_history`]) the changed
//! tensors go whole.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use ferry_core::{DType, Tensor, TensorMeta};
use ferry_rpc::RpcTensor;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::manifest::tree_digest;
use crate::{Manifest, Store, StoreError, Version};

/// Params of `store.delta`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeltaParams {
    /// The bundle's name.
    pub name: String,
    /// The version the reader holds (N); absent or null: none (every tensor comes whole).
    #[serde(default)]
    pub from: Option<u64>,
    /// N's tree digest as the reader holds it: a store whose version N differs (a store
    /// restarted, a name republished) sends every tensor whole (`base` null).
    #[serde(default)]
    pub from_tree: Option<String>,
    /// The version wanted (M); absent or null: the latest.
    #[serde(default)]
    pub to: Option<u64>,
    /// Allow sparse tensors (default true); false: only `same` and `dense`.
    #[serde(default = "yes")]
    pub sparse: bool,
    /// Milliseconds to wait, when `to` is absent, for a latest version other than `from`
    /// (a long poll: the answer comes as the next version is published); absent or 0:
    /// answer at once. When the time runs out the answer is the latest version then
    /// (possibly `from` itself: every tensor `same`); NOT_FOUND if the bundle still has
    /// none. At most [`crate::rpc::MAX_DELTA_WAIT_MS`] (one minute); more is cut to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
}

fn yes() -> bool {
    true
}

/// How one tensor of M is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    /// Unchanged from N: nothing is sent.
    Same,
    /// The elements that changed: `index` (u32, or u64 where the tensor has more than 2^32
    /// elements; ascending, into the flattened tensor) and `values` (the dtype, one per
    /// index).
    Sparse,
    /// The whole tensor: `data`.
    Dense,
}

/// One tensor of version M in a delta.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct TensorDelta {
    /// Its name.
    pub name: String,
    /// Its dtype in M.
    pub dtype: DType,
    /// Its shape in M.
    pub shape: Vec<u64>,
    /// BLAKE3 of its bytes in M (`blake3:HEX`).
    pub digest: String,
    /// How it is sent.
    pub change: Change,
    /// `dense`: the tensor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<RpcTensor>,
    /// `sparse`: the indices of the changed elements.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<RpcTensor>,
    /// `sparse`: their values in M.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values: Option<RpcTensor>,
}

/// What `store.delta` answers: version M as a change from N.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Delta {
    /// The bundle's name.
    pub name: String,
    /// M.
    pub version: u64,
    /// N, when the delta is from it; null: from nothing (every tensor `dense`).
    pub base: Option<u64>,
    /// N's tree digest when `base` is set.
    pub base_tree: Option<String>,
    /// M's tree digest ([`crate::tree_digest`]): what the reader checks M against.
    pub tree: String,
    /// M's bundle digest (PROTOCOL.md §20), when computed.
    pub digest: Option<String>,
    /// M's metadata.
    pub metadata: Value,
    /// When M was published (milliseconds since the Unix epoch).
    pub published_ms: u64,
    /// Every tensor of M, in the order published (a tensor of N not listed is not in M).
    pub tensors: Vec<TensorDelta>,
    /// Bytes of M's tensors.
    pub full_bytes: u64,
    /// Bytes of tensor data in this delta (dense data, sparse indices and values).
    pub sent_bytes: u64,
}

/// `blake3:HEX` of a 32-byte digest.
pub(crate) fn hex(d: &[u8; 32]) -> String {
    format!("blake3:{}", blake3::Hash::from_bytes(*d).to_hex())
}

/// The 32 bytes of `blake3:HEX`.
pub(crate) fn unhex(s: &str) -> Option<[u8; 32]> {
    blake3::Hash::from_hex(s.strip_prefix("blake3:")?).ok().map(|h| *h.as_bytes())
}

/// N as the store still knows it.
enum Base {
    /// Its storage (sparse deltas possible).
    Whole(Version, Arc<Vec<[u8; 32]>>),
    /// Its manifest and tensor digests only.
    Digests(Arc<Manifest>, Arc<Vec<[u8; 32]>>),
}

impl Base {
    fn manifest(&self) -> &Manifest {
        match self {
            Base::Whole(v, _) => v.manifest(),
            Base::Digests(m, _) => m,
        }
    }
    fn digests(&self) -> &[[u8; 32]] {
        match self {
            Base::Whole(_, d) | Base::Digests(_, d) => d,
        }
    }
}

/// What computing a delta took ([`Store::delta_timed`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DeltaTimes {
    /// Milliseconds to get both versions' tensor digests (computed here unless the digest
    /// thread had already, or inherited from the version before: [`crate::Manifest::digested_bytes`]).
    pub digests_ms: f64,
    /// Milliseconds to compare the changed tensors element by element and gather the changes.
    pub diff_ms: f64,
}

/// How one tensor of M goes, before its bytes are looked at.
enum Plan {
    Same,
    /// Diffed against the base's tensor `j` (sparse when smaller).
    Diff(usize),
    Dense,
}

impl Store {
    /// Version `p.to` (default the latest) of `p.name` as a delta from version `p.from`,
    /// per tensor the smallest of nothing, its changed elements and the whole tensor. Reads
    /// every changed tensor of both versions, several tensors at a time (call it off an async
    /// runtime's threads).
    pub fn delta(&self, p: &DeltaParams) -> Result<Delta, StoreError> {
        self.delta_timed(p).map(|(d, _)| d)
    }

    /// [`Store::delta`], and what its parts took.
    pub fn delta_timed(&self, p: &DeltaParams) -> Result<(Delta, DeltaTimes), StoreError> {
        let t0 = Instant::now();
        let m = self.open(&p.name, p.to)?;
        let md = m.tensor_digests()?;
        let man = m.manifest();
        let tree = tree_digest(&man.entries, &md);
        let base = match p.from {
            None => None,
            Some(n) => self.base(&p.name, n)?.filter(|b| {
                let t = tree_digest(&b.manifest().entries, b.digests());
                p.from_tree.as_deref().is_none_or(|want| want == t)
            }),
        };
        let t1 = Instant::now();
        let index: HashMap<&str, usize> =
            base.iter().flat_map(|b| b.manifest().entries.iter().enumerate().map(|(i, e)| (e.0.as_str(), i))).collect();
        let mut plans = Vec::with_capacity(man.entries.len());
        for (i, e) in man.entries.iter().enumerate() {
            let old = base.as_ref().zip(index.get(e.0.as_str())).filter(|(b, j)| {
                let o = &b.manifest().entries[**j];
                o.1 == e.1 && o.2 == e.2
            });
            plans.push(match old {
                Some((b, &j)) if b.digests()[j] == md[i] => Plan::Same,
                Some((Base::Whole(..), &j)) if p.sparse => Plan::Diff(j),
                _ => Plan::Dense,
            });
        }
        // The changed tensors, compared several at a time.
        let diffs = crate::digests::parallel_map(plans.len(), |i| match (&plans[i], &base) {
            (Plan::Diff(j), Some(Base::Whole(v, _))) => {
                let (a, z) = (v.entry_bytes(*j)?, m.entry_bytes(i)?);
                sparse(&a, &z, man.entries[i].1)
            }
            _ => None,
        });
        let (mut full, mut sent) = (0u64, 0u64);
        let mut tensors = Vec::with_capacity(man.entries.len());
        for ((i, e), diff) in man.entries.iter().enumerate().zip(diffs) {
            let len = e.byte_len().ok_or_else(|| StoreError::Invalid(format!("tensor {:?} overflows", e.0)))?;
            full += len;
            let mut td = TensorDelta {
                name: e.0.clone(),
                dtype: e.1,
                shape: e.2.clone(),
                digest: hex(&md[i]),
                change: Change::Dense,
                data: None,
                index: None,
                values: None,
            };
            if matches!(plans[i], Plan::Same) {
                td.change = Change::Same;
            } else if let Some((idx, vals)) = diff {
                sent += (idx.nbytes() + vals.nbytes()) as u64;
                (td.change, td.index, td.values) = (Change::Sparse, Some(RpcTensor(idx)), Some(RpcTensor(vals)));
            } else {
                let t = m
                    .tensors_at(i)
                    .ok_or_else(|| StoreError::Invalid(format!("tensor {:?} is not on the host", e.0)))?;
                sent += len;
                td.data = Some(RpcTensor(t));
            }
            tensors.push(td);
        }
        let times = DeltaTimes { digests_ms: (t1 - t0).as_secs_f64() * 1e3, diff_ms: t1.elapsed().as_secs_f64() * 1e3 };
        let d = Delta {
            name: man.name.clone(),
            version: man.version,
            base: base.as_ref().map(|b| b.manifest().version),
            base_tree: base.as_ref().map(|b| tree_digest(&b.manifest().entries, b.digests())),
            tree,
            digest: man.digest(),
            metadata: man.metadata.clone(),
            published_ms: man.published_ms,
            tensors,
            full_bytes: full,
            sent_bytes: sent,
        };
        Ok((d, times))
    }

    /// Version `n` of `name` as the store still knows it, if at all.
    fn base(&self, name: &str, n: u64) -> Result<Option<Base>, StoreError> {
        if let Ok(v) = self.open(name, Some(n)) {
            let d = v.tensor_digests()?;
            return Ok(Some(Base::Whole(v, d)));
        }
        Ok(self.remembered(name, n).and_then(|m| m.tensor_digests().map(|d| (m, d))).map(|(m, d)| Base::Digests(m, d)))
    }
}

/// The changed elements of `new` against `old` (same dtype and shape) as index and value
/// tensors, if they are smaller than the tensor itself.
pub(crate) fn sparse(old: &[u8], new: &[u8], dtype: DType) -> Option<(Tensor, Tensor)> {
    let size = dtype.itemsize();
    let numel = (new.len() / size.max(1)) as u64;
    let wide = numel > 1 << 32;
    let isz = if wide { 8 } else { 4 };
    // Sparse only while strictly smaller than the whole tensor.
    let max = (new.len().saturating_sub(1)) / (isz + size);
    let idx = changed_elements(old, new, size, max)?;
    let vals = match size {
        1 => gather::<1>(new, &idx),
        2 => gather::<2>(new, &idx),
        4 => gather::<4>(new, &idx),
        8 => gather::<8>(new, &idx),
        _ => idx.iter().flat_map(|&i| &new[i as usize * size..(i as usize + 1) * size]).copied().collect(),
    };
    let k = idx.len() as u64;
    let index = if wide {
        Tensor::from_slice(vec![k], &idx).ok()?
    } else {
        let v: Vec<u32> = idx.iter().map(|&i| i as u32).collect();
        Tensor::from_slice(vec![k], &v).ok()?
    };
    let values = Tensor::new(TensorMeta::new(dtype, vec![k]), Bytes::from(vals)).ok()?;
    Some((index, values))
}

/// The `S`-byte elements of `new` at `idx` (in range: found by [`changed_elements`]).
fn gather<const S: usize>(new: &[u8], idx: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(idx.len() * S);
    for &i in idx {
        let at = i as usize * S;
        out.extend_from_slice(&new[at..at + S]);
    }
    out
}

/// The indices of the elements (`size` bytes each) whose bits differ between `old` and
/// `new` (equal lengths), or `None` past `max` of them. Compares eight bytes at a time.
pub(crate) fn changed_elements(old: &[u8], new: &[u8], size: usize, max: usize) -> Option<Vec<u64>> {
    if old.len() != new.len() || size == 0 {
        return None;
    }
    let mut out = Vec::new();
    let push = |i: usize, out: &mut Vec<u64>| -> bool {
        out.push(i as u64);
        out.len() <= max
    };
    let mut start = 0;
    if 8 % size == 0 {
        let per = 8 / size;
        let words = old.len() / 8;
        // One element's bits in a little-endian word (element j at bits 8*size*j..).
        let mask = if size == 8 { u64::MAX } else { (1u64 << (size * 8)) - 1 };
        for (w, (a, b)) in old.chunks_exact(8).zip(new.chunks_exact(8)).enumerate() {
            let (x, y) = (u64::from_le_bytes(a.try_into().ok()?), u64::from_le_bytes(b.try_into().ok()?));
            let d = x ^ y;
            if d != 0 {
                for j in 0..per {
                    if (d >> (j * size * 8)) & mask != 0 && !push(w * per + j, &mut out) {
                        return None;
                    }
                }
            }
        }
        start = words * 8;
    }
    for (k, (a, b)) in old[start..].chunks_exact(size).zip(new[start..].chunks_exact(size)).enumerate() {
        if a != b && !push(start / size + k, &mut out) {
            return None;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changed_elements_by_bits_and_bounded() {
        let a: Vec<u8> = (0..40).collect();
        let mut b = a.clone();
        b[3] ^= 1; // element 1 of 2-byte elements
        b[38] ^= 0x80; // element 19 (the tail past the last whole word is 32..40: still words)
        assert_eq!(changed_elements(&a, &b, 2, 10), Some(vec![1, 19]));
        assert_eq!(changed_elements(&a, &b, 4, 10), Some(vec![0, 9]));
        assert_eq!(changed_elements(&a, &b, 1, 1), None, "two changes past a bound of one");
        assert_eq!(changed_elements(&a, &a, 16, 0), Some(vec![]));
        let (c, mut d) = (vec![0u8; 48], vec![0u8; 48]);
        d[47] = 1;
        assert_eq!(changed_elements(&c, &d, 16, 5), Some(vec![2]), "16-byte elements");
    }
}
