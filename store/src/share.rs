//! Publishing a version that shares the previous version's storage for the tensors that
//! did not change ([`Store::publish`], [`Store::publish_delta`]).
//!
//! Sharing is per bucket: a new version references a bucket of the version before when it
//! keeps at least half of that bucket's bytes, and copies the kept tensors into its own
//! new buckets otherwise. So memory holds at most about twice the live tensors, and the
//! copies this costs are, over many versions, at most the bytes that changed (a bucket is
//! copied only once half of it has been replaced, and it is copied once).

use std::collections::HashMap;
use std::sync::Arc;

use ferry_core::{Tensor, TensorMeta};
use serde_json::Value;

use crate::bucket::Bucket;
use crate::store::Placed;
use crate::{Entry, Owner, Store, StoreError, Version};

/// Where one tensor of a version being published comes from.
enum Source {
    /// Bytes already in a bucket (its offset there).
    InPlace(Bucket, usize),
    /// Bytes to copy into a new bucket.
    Copy,
}

impl Store {
    /// Publishes `tensors` as the next version of `name`. A tensor whose bytes already lie
    /// in a bucket (made by a builder, read from a file by [`crate::weights`], or opened
    /// from another version) is referenced where it is; so is one equal (same dtype, shape
    /// and bytes) to the tensor of the same name in the latest version: the new version
    /// shares that version's storage for every tensor that did not change, and publishing
    /// costs the changed tensors' bytes (plus a read of the unchanged ones, to compare;
    /// [`Store::publish_delta`] skips it where the publisher knows what changed). The others
    /// are copied once into new buckets.
    pub fn publish(
        self: &Arc<Self>,
        name: &str,
        tensors: Vec<(String, Tensor)>,
        metadata: Value,
        by: Owner,
    ) -> Result<Version, StoreError> {
        let prev = self.open(name, None).ok();
        let index: HashMap<&str, usize> =
            prev.iter().flat_map(|p| p.manifest().entries.iter().enumerate().map(|(i, e)| (e.0.as_str(), i))).collect();
        let mut sources = Vec::with_capacity(tensors.len());
        for (n, t) in &tensors {
            let bytes = host_bytes(n, t)?;
            let src = match Bucket::containing(bytes) {
                Some((b, off)) => Source::InPlace(b, off),
                None => match (&prev, index.get(n.as_str())) {
                    (Some(p), Some(&i)) => equal_in(p, i, t).map_or(Source::Copy, |(b, off)| Source::InPlace(b, off)),
                    _ => Source::Copy,
                },
            };
            sources.push(src);
        }
        self.publish_sources(name, tensors, sources, prev.as_ref(), metadata, by, None)
    }

    /// Publishes the next version of `name` as version `base` (which must still be the
    /// latest: else [`StoreError::Stale`]) with the tensors of `changed` replacing (or
    /// adding to) those of the same names, and those named in `removed` left out. Every
    /// other tensor is shared with `base` without being read: publishing costs the changed
    /// tensors' bytes. What [`Store::publish`] does by comparing, for a publisher that knows
    /// what changed.
    pub fn publish_delta(
        self: &Arc<Self>,
        name: &str,
        base: u64,
        changed: Vec<(String, Tensor)>,
        removed: &[String],
        metadata: Value,
        by: Owner,
    ) -> Result<Version, StoreError> {
        let prev = self.open(name, None).ok().filter(|v| v.manifest().version == base);
        let prev = prev.ok_or_else(|| StoreError::Stale {
            name: name.to_owned(),
            base,
            latest: self.open(name, None).ok().map(|v| v.manifest().version),
        })?;
        let mut changed: HashMap<String, Tensor> = changed.into_iter().collect();
        let mut tensors = Vec::new();
        let mut sources = Vec::new();
        for (i, e) in prev.manifest().entries.iter().enumerate() {
            if removed.contains(&e.0) {
                continue;
            }
            match changed.remove(&e.0) {
                Some(t) => {
                    host_bytes(&e.0, &t)?;
                    tensors.push((e.0.clone(), t));
                    sources.push(Source::Copy);
                }
                None => {
                    let (b, off) = prev.entry_place(i).ok_or_else(|| StoreError::NotFound(format!("{:?}", e.0)))?;
                    let t = prev.tensors_at(i).ok_or_else(|| StoreError::Invalid(format!("tensor {:?}", e.0)))?;
                    tensors.push((e.0.clone(), t));
                    sources.push(Source::InPlace(b, off));
                }
            }
        }
        // New names, in a stable order.
        let mut added: Vec<(String, Tensor)> = changed.into_iter().collect();
        added.sort_by(|a, b| a.0.cmp(&b.0));
        for (n, t) in added {
            host_bytes(&n, &t)?;
            tensors.push((n, t));
            sources.push(Source::Copy);
        }
        self.publish_sources(name, tensors, sources, Some(&prev), metadata, by, Some(base))
    }

    /// Starts the next version of `name`: `tensors` in order, each `(name, meta, keep)`;
    /// with `keep`, the tensor of that name in version `base` (which must have it with that
    /// dtype and shape, and must still be the latest at the commit: else
    /// [`StoreError::Stale`]) is kept without being read or copied; the others are filled by
    /// the caller ([`FromBuilder::tensor_mut`]). What [`Store::publish`] and
    /// [`Store::publish_delta`] do, for a producer that writes the changed tensors into the
    /// store's memory itself (one copy, from wherever they are).
    pub fn builder_from(
        self: &Arc<Self>,
        name: &str,
        base: Option<u64>,
        tensors: Vec<(String, TensorMeta, bool)>,
        by: Owner,
    ) -> Result<FromBuilder, StoreError> {
        let prev = match base {
            None => None,
            Some(b) => Some(self.open(name, None).ok().filter(|v| v.manifest().version == b).ok_or_else(|| {
                StoreError::Stale {
                    name: name.to_owned(),
                    base: b,
                    latest: self.open(name, None).ok().map(|v| v.manifest().version),
                }
            })?),
        };
        let index: HashMap<&str, usize> =
            prev.iter().flat_map(|p| p.manifest().entries.iter().enumerate().map(|(i, e)| (e.0.as_str(), i))).collect();
        let mut sources = Vec::with_capacity(tensors.len());
        let mut from = Vec::with_capacity(tensors.len());
        let mut lens = Vec::with_capacity(tensors.len());
        for (n, m, keep) in &tensors {
            lens.push(m.byte_span().map_err(|e| StoreError::Invalid(format!("tensor {n:?}: {e}")))?);
            if !keep {
                sources.push(Source::Copy);
                from.push(None);
                continue;
            }
            let (p, j) = prev.as_ref().zip(index.get(n.as_str())).ok_or_else(|| {
                StoreError::Invalid(format!("tensor {n:?} is kept but version {base:?} does not have it"))
            })?;
            let e = &p.manifest().entries[*j];
            if e.1 != m.dtype || e.2 != m.shape {
                return Err(StoreError::Invalid(format!(
                    "tensor {n:?} is kept but its dtype or shape differs from version {base:?}'s"
                )));
            }
            let (b, off) = p.entry_place(*j).ok_or_else(|| StoreError::NotFound(format!("{n:?}")))?;
            sources.push(Source::InPlace(b, off));
            from.push(Some(*j));
        }
        if let Some(p) = &prev {
            unshare_sparse_buckets(p, &lens, &mut sources);
        }
        let mut slots = Vec::with_capacity(tensors.len());
        let mut specs = Vec::new();
        let mut refill = Vec::new();
        for (i, ((n, m, _), s)) in tensors.iter().zip(&sources).enumerate() {
            if matches!(s, Source::Copy) {
                if let Some(j) = from[i] {
                    refill.push((i, j));
                }
                slots.push(Some(specs.len()));
                specs.push((n.clone(), m.clone()));
            } else {
                slots.push(None);
            }
        }
        let builder = self.builder(name, specs, by)?;
        let tensors = tensors.into_iter().zip(sources).map(|((n, m, _), s)| (n, m, s)).collect();
        Ok(FromBuilder { base, prev, tensors, slots, refill, builder })
    }

    /// Publishes `tensors`, each from its source; buckets of `prev` kept at less than half
    /// are not shared (their tensors are copied).
    #[allow(clippy::too_many_arguments)]
    fn publish_sources(
        self: &Arc<Self>,
        name: &str,
        tensors: Vec<(String, Tensor)>,
        mut sources: Vec<Source>,
        prev: Option<&Version>,
        metadata: Value,
        by: Owner,
        base: Option<u64>,
    ) -> Result<Version, StoreError> {
        if let Some(prev) = prev {
            let lens: Vec<u64> = tensors.iter().map(|(_, t)| t.nbytes() as u64).collect();
            unshare_sparse_buckets(prev, &lens, &mut sources);
        }
        let copy = tensors
            .iter()
            .zip(&sources)
            .filter(|(_, s)| matches!(s, Source::Copy))
            .map(|((n, t), _)| (n.clone(), t.meta().clone()))
            .collect();
        let mut builder = self.builder(name, copy, by)?;
        let mut in_place: Vec<Bucket> = Vec::new();
        let mut entries = Vec::with_capacity(tensors.len());
        let mut copied = 0usize;
        for ((n, t), src) in tensors.iter().zip(sources) {
            match src {
                Source::InPlace(bucket, off) => {
                    let i = match in_place.iter().position(|b| b.same(&bucket)) {
                        Some(i) => i,
                        None => {
                            in_place.push(bucket);
                            in_place.len() - 1
                        }
                    };
                    let e = Entry(n.clone(), t.dtype(), t.shape().to_vec(), i as u32, off as u64);
                    entries.push(Placed::InPlace(e));
                }
                Source::Copy => {
                    let dst = builder.tensor_mut_at(copied).expect("one builder slot per copied tensor");
                    dst.copy_from_slice(t.as_bytes());
                    entries.push(Placed::Copied(copied));
                    copied += 1;
                }
            }
        }
        builder.commit_with(metadata, in_place, entries, base)
    }
}

/// Turns back into copies the tensors that would keep a bucket of `prev` at less than half
/// its bytes (`lens`: each tensor's bytes).
fn unshare_sparse_buckets(prev: &Version, lens: &[u64], sources: &mut [Source]) {
    let mut kept: HashMap<usize, u64> = HashMap::new();
    for (len, s) in lens.iter().zip(sources.iter()) {
        if let Source::InPlace(b, _) = s {
            *kept.entry(b.key()).or_default() += len;
        }
    }
    let sparse: Vec<usize> = prev
        .buckets()
        .iter()
        .filter(|b| kept.get(&b.key()).is_some_and(|&k| k.saturating_mul(2) < b.len() as u64))
        .map(Bucket::key)
        .collect();
    for s in sources.iter_mut() {
        if matches!(s, Source::InPlace(b, _) if sparse.contains(&b.key())) {
            *s = Source::Copy;
        }
    }
}

/// A version of a bundle being made from its latest version ([`Store::builder_from`]): the
/// tensors kept from it are referenced where they lie, the others are filled by the caller
/// ([`FromBuilder::tensor_mut`]) in new buckets, then [`FromBuilder::commit`] publishes it.
/// Dropped without a commit, it publishes nothing.
pub struct FromBuilder {
    base: Option<u64>,
    prev: Option<Version>,
    /// Each tensor: name, meta, and where it comes from (the builder's slot for a copy).
    tensors: Vec<(String, TensorMeta, Source)>,
    /// For each tensor, its slot in `builder` (copies only).
    slots: Vec<Option<usize>>,
    /// Kept tensors that are copied after all (their bucket of `base` would stay less than
    /// half used): (tensor, index in `prev`).
    refill: Vec<(usize, usize)>,
    builder: crate::BundleBuilder,
}

impl std::fmt::Debug for FromBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FromBuilder").field("base", &self.base).field("tensors", &self.tensors.len()).finish()
    }
}

impl FromBuilder {
    /// The bytes of tensor `i` (of the list given to [`Store::builder_from`]), to fill;
    /// `None` for a tensor kept from the base.
    pub fn tensor_mut(&mut self, i: usize) -> Option<&mut [u8]> {
        let slot = (*self.slots.get(i)?)?;
        if self.refill.iter().any(|&(t, _)| t == i) {
            return None;
        }
        self.builder.tensor_mut_at(slot)
    }

    /// Publishes the version, with `metadata`; [`StoreError::Stale`] if the base is no
    /// longer the latest version.
    pub fn commit(mut self, metadata: Value) -> Result<Version, StoreError> {
        if let Some(prev) = &self.prev {
            for &(i, j) in &self.refill {
                let src =
                    prev.entry_bytes(j).ok_or_else(|| StoreError::NotFound(format!("{:?}", self.tensors[i].0)))?;
                let slot = self.slots[i].expect("a refilled tensor has a slot");
                self.builder.tensor_mut_at(slot).expect("one builder slot per copied tensor").copy_from_slice(&src);
            }
        }
        let mut in_place: Vec<Bucket> = Vec::new();
        let mut entries = Vec::with_capacity(self.tensors.len());
        for ((n, m, src), slot) in self.tensors.into_iter().zip(&self.slots) {
            match src {
                Source::InPlace(bucket, off) => {
                    let i = match in_place.iter().position(|b| b.same(&bucket)) {
                        Some(i) => i,
                        None => {
                            in_place.push(bucket);
                            in_place.len() - 1
                        }
                    };
                    entries.push(Placed::InPlace(Entry(n, m.dtype, m.shape, i as u32, off as u64)));
                }
                Source::Copy => entries.push(Placed::Copied(slot.expect("a copied tensor has a slot"))),
            }
        }
        self.builder.commit_with(metadata, in_place, entries, self.base)
    }
}

/// `t`'s host bytes, or why it cannot be stored.
fn host_bytes<'a>(n: &str, t: &'a Tensor) -> Result<&'a [u8], StoreError> {
    let bytes = t.host_bytes().ok_or_else(|| StoreError::Invalid(format!("tensor {n:?} is not in host memory")))?;
    if t.meta().strides.is_some() {
        return Err(StoreError::Invalid(format!("tensor {n:?} is strided; send it contiguous")));
    }
    Ok(bytes)
}

/// Where the `i`-th tensor of `prev` lies, if it equals `t` (dtype, shape and bytes).
fn equal_in(prev: &Version, i: usize, t: &Tensor) -> Option<(Bucket, usize)> {
    let e = &prev.manifest().entries[i];
    if e.1 != t.dtype() || e.2 != t.shape() {
        return None;
    }
    let old = prev.entry_bytes(i)?;
    (old.as_ref() == t.host_bytes()?).then(|| prev.entry_place(i)).flatten()
}
