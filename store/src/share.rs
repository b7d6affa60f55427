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

use ferry_core::Tensor;
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
            let mut kept: HashMap<usize, u64> = HashMap::new();
            for ((_, t), s) in tensors.iter().zip(&sources) {
                if let Source::InPlace(b, _) = s {
                    *kept.entry(b.key()).or_default() += t.nbytes() as u64;
                }
            }
            let sparse: Vec<usize> = prev
                .buckets()
                .iter()
                .filter(|b| kept.get(&b.key()).is_some_and(|&k| k.saturating_mul(2) < b.len() as u64))
                .map(Bucket::key)
                .collect();
            for s in &mut sources {
                if matches!(s, Source::InPlace(b, _) if sparse.contains(&b.key())) {
                    *s = Source::Copy;
                }
            }
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
