//! Building a version in place: [`Store::builder`] allocates its buckets (spare ones
//! first) under the byte budget, the producer fills the tensors of the [`BundleBuilder`],
//! and [`BundleBuilder::commit`] publishes them as the next version.

use std::sync::Arc;

use ferry_core::TensorMeta;
use serde_json::Value;

use super::spares::make_spares;
use super::{Owner, Store, Version, check_owner, lock, plan};
use crate::StoreError;
use crate::bucket::{Bucket, BucketMut};
use crate::manifest::Entry;

impl Store {
    /// Starts a version of `name` built in place: the buckets are allocated for `specs`
    /// (name and metadata of each tensor, in order) and the producer fills them
    /// ([`BundleBuilder::tensor_mut`]) before [`BundleBuilder::commit`]. No byte is copied.
    pub fn builder(
        self: &Arc<Self>,
        name: &str,
        specs: Vec<(String, TensorMeta)>,
        by: Owner,
    ) -> Result<BundleBuilder, StoreError> {
        let mut lens = Vec::with_capacity(specs.len());
        for (n, m) in &specs {
            if m.device != ferry_core::Device::Cpu || m.strides.is_some() {
                return Err(StoreError::Invalid(format!("tensor {n:?}: only contiguous cpu tensors are stored")));
            }
            lens.push(m.byte_span().map_err(|e| StoreError::Invalid(format!("tensor {n:?}: {e}")))?);
        }
        let (places, bucket_lens) = plan(&lens, self.opts.bucket_bytes as u64);
        let total: u64 = bucket_lens.iter().sum();
        self.reserve(name, &by, total)?;
        let guard = Reservation { store: self.clone(), bytes: total };
        let mut buckets = Vec::with_capacity(bucket_lens.len());
        for len in &bucket_lens {
            let len = usize::try_from(*len).map_err(|_| StoreError::Invalid("bucket too large".into()))?;
            let spare = {
                let mut st = lock(&self.state);
                let i = st.spares.iter().position(|b| b.as_slice().len() == len);
                i.map(|i| st.spares.swap_remove(i))
            };
            buckets.push(match spare {
                Some(b) => b,
                None => BucketMut::create(len).map_err(StoreError::Io)?,
            });
        }
        let entries =
            specs.into_iter().zip(&places).map(|((n, m), &(b, off))| Entry(n, m.dtype, m.shape, b, off)).collect();
        Ok(BundleBuilder { name: name.to_owned(), by, entries, lens, buckets, reservation: guard })
    }

    /// Holds `bytes` of the budget for a version of `name` being made outside a builder
    /// (a checkpoint read into a bucket), until the returned guard drops.
    pub(crate) fn reservation(self: &Arc<Self>, name: &str, by: &Owner, bytes: u64) -> Result<Reservation, StoreError> {
        self.reserve(name, by, bytes)?;
        Ok(Reservation { store: self.clone(), bytes })
    }

    fn reserve(&self, name: &str, by: &Owner, bytes: u64) -> Result<(), StoreError> {
        let mut st = lock(&self.state);
        if let Some(slot) = st.bundles.get(name) {
            check_owner(name, slot, by)?;
        }
        st.prune(self.opts.delta_history);
        let mut used = st.used();
        if used.saturating_add(bytes) > self.opts.budget_bytes && !st.spares.is_empty() {
            // Spare buckets go first, then the versions kept only for deltas.
            let spares = std::mem::take(&mut st.spares);
            drop(st);
            drop(spares);
            st = lock(&self.state);
            used = st.used();
        }
        if used.saturating_add(bytes) > self.opts.budget_bytes && st.bundles.values().any(|s| !s.bases.is_empty()) {
            // The versions kept only for deltas go first (readers keep what they hold).
            let bases: Vec<Version> = st.bundles.values_mut().flat_map(|s| s.bases.drain(..)).collect();
            drop(st);
            drop(bases);
            st = lock(&self.state);
            st.prune(self.opts.delta_history);
            used = st.used();
        }
        if used.saturating_add(bytes) > self.opts.budget_bytes {
            return Err(StoreError::Budget { needed: bytes, used, budget: self.opts.budget_bytes });
        }
        st.building += bytes;
        Ok(())
    }
}

/// Budget held by a builder until it commits or is dropped.
pub(crate) struct Reservation {
    store: Arc<Store>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut st = lock(&self.store.state);
        st.building = st.building.saturating_sub(self.bytes);
    }
}

pub(crate) enum Placed {
    InPlace(Entry),
    Copied(usize),
}

/// A version being built in place ([`Store::builder`]): fill each tensor, then commit.
/// Dropped without a commit, it publishes nothing and frees its buckets.
pub struct BundleBuilder {
    name: String,
    by: Owner,
    entries: Vec<Entry>,
    lens: Vec<u64>,
    buckets: Vec<BucketMut>,
    reservation: Reservation,
}

impl BundleBuilder {
    /// The tensors to fill, in order (name, dtype, shape, bucket, offset).
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The bytes of tensor `name`, to fill.
    pub fn tensor_mut(&mut self, name: &str) -> Option<&mut [u8]> {
        let i = self.entries.iter().position(|e| e.0 == name)?;
        self.tensor_mut_at(i)
    }

    /// The bytes of the `i`-th tensor, to fill.
    pub fn tensor_mut_at(&mut self, i: usize) -> Option<&mut [u8]> {
        let e = self.entries.get(i)?;
        let (off, len) = (usize::try_from(e.4).ok()?, usize::try_from(self.lens[i]).ok()?);
        self.buckets.get_mut(e.3 as usize)?.as_mut_slice().get_mut(off..off + len)
    }

    /// Publishes the filled tensors as the next version, with `metadata`.
    pub fn commit(self, metadata: Value) -> Result<Version, StoreError> {
        let n = self.entries.len();
        self.commit_with(metadata, Vec::new(), (0..n).map(Placed::Copied).collect(), None)
    }

    /// Commits with some tensors referenced in `in_place` buckets (first) and the rest from
    /// this builder's buckets; with `base`, only if `base` is still the latest version.
    pub(crate) fn commit_with(
        self,
        metadata: Value,
        in_place: Vec<Bucket>,
        placed: Vec<Placed>,
        base: Option<u64>,
    ) -> Result<Version, StoreError> {
        let BundleBuilder { name, by, entries, buckets, reservation, .. } = self;
        let shift = in_place.len() as u32;
        let mut all = in_place;
        all.extend(buckets.into_iter().map(|b| Bucket::from(b.freeze())));
        let entries = placed
            .into_iter()
            .map(|p| match p {
                Placed::InPlace(e) => e,
                Placed::Copied(i) => {
                    let e = &entries[i];
                    Entry(e.0.clone(), e.1, e.2.clone(), e.3 + shift, e.4)
                }
            })
            .collect();
        let store = reservation.store.clone();
        let lens: Vec<usize> =
            all[shift as usize..].iter().filter(|b| matches!(b, Bucket::Host(_))).map(Bucket::len).collect();
        // The committed version is counted from here on; the reservation ends as it is.
        let v = store.commit(&name, &by, entries, all, metadata, None, base);
        drop(reservation);
        if v.is_ok() && store.opts.spare_buckets && !lens.is_empty() {
            make_spares(store, lens);
        }
        v
    }
}
