//! Lease accounting, both sides. Pure: no driver, no IO.
//!
//! - [`Grants`] (producer): the leases this side granted, each pinning its memory until the
//!   peer releases it or the pipe closes (then every lease is reclaimed at once).
//! - [`Held`] (consumer): the leases this side holds, so that a lease id granted twice is
//!   refused.
//! - [`Pending`] (consumer): releases and retirements waiting to be sent, grouped per device
//!   so that each release message carries one event.

use std::collections::{BTreeMap, HashMap, HashSet};

/// Leases granted to the peer: id -> what the lease pins.
#[derive(Debug)]
pub(crate) struct Grants<T> {
    next: u64,
    live: HashMap<u64, T>,
}

impl<T> Default for Grants<T> {
    fn default() -> Self {
        Grants { next: 1, live: HashMap::new() }
    }
}

impl<T> Grants<T> {
    /// Grants a new lease on `item`; ids start at 1 and are never reused.
    pub(crate) fn grant(&mut self, item: T) -> u64 {
        let id = self.next;
        self.next += 1;
        self.live.insert(id, item);
        id
    }

    /// The lease `id`, if granted and not released.
    pub(crate) fn get(&self, id: u64) -> Option<&T> {
        self.live.get(&id)
    }

    /// Ends the leases `ids`, all or none: an id that is not granted (never, or already
    /// released, or twice in `ids`) refuses the whole release and is returned.
    pub(crate) fn release(&mut self, ids: &[u64]) -> Result<Vec<T>, u64> {
        self.check(ids)?;
        Ok(ids.iter().filter_map(|id| self.live.remove(id)).collect())
    }

    /// Whether [`Grants::release`] of `ids` would succeed; the first bad id otherwise.
    pub(crate) fn check(&self, ids: &[u64]) -> Result<(), u64> {
        let mut seen = HashSet::with_capacity(ids.len());
        match ids.iter().find(|id| !self.live.contains_key(id) || !seen.insert(**id)) {
            Some(&bad) => Err(bad),
            None => Ok(()),
        }
    }

    /// Ends every lease (the peer is gone).
    pub(crate) fn reclaim(&mut self) -> Vec<T> {
        self.live.drain().map(|(_, v)| v).collect()
    }

    /// Leases outstanding.
    pub(crate) fn len(&self) -> usize {
        self.live.len()
    }
}

/// Leases this side holds from the peer.
#[derive(Debug, Default)]
pub(crate) struct Held {
    live: HashSet<u64>,
}

impl Held {
    /// Records a received lease; `false` if it is already held (the peer granted it twice).
    pub(crate) fn insert(&mut self, lease: u64) -> bool {
        self.live.insert(lease)
    }

    /// Forgets a lease (its tensor was dropped); `false` if it was not held.
    pub(crate) fn remove(&mut self, lease: u64) -> bool {
        self.live.remove(&lease)
    }

    /// Forgets every lease (the peer is gone).
    pub(crate) fn clear(&mut self) {
        self.live.clear();
    }

    /// Leases held.
    pub(crate) fn len(&self) -> usize {
        self.live.len()
    }
}

/// What waits to be sent to the peer.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    releases: Vec<(u32, u64)>,
    retires: Vec<u64>,
}

impl Pending {
    /// Queues the release of `lease`, held on local device `dev`.
    pub(crate) fn release(&mut self, dev: u32, lease: u64) {
        self.releases.push((dev, lease));
    }

    /// Queues the news that allocation `alloc_id` was freed.
    pub(crate) fn retire(&mut self, alloc_id: u64) {
        self.retires.push(alloc_id);
    }

    /// Takes everything queued: releases per device (in queue order), then retirements.
    pub(crate) fn take(&mut self) -> (BTreeMap<u32, Vec<u64>>, Vec<u64>) {
        let mut per_dev: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for (dev, lease) in self.releases.drain(..) {
            per_dev.entry(dev).or_default().push(lease);
        }
        (per_dev, std::mem::take(&mut self.retires))
    }

    /// True when nothing is queued.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.releases.is_empty() && self.retires.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_release_and_reclaim() {
        let mut g = Grants::default();
        let a = g.grant("a");
        let b = g.grant("b");
        let c = g.grant("c");
        assert_eq!((a, b, c), (1, 2, 3));
        assert_eq!(g.get(b), Some(&"b"));
        assert_eq!(g.release(&[a, c]).unwrap(), ["a", "c"]);
        assert_eq!(g.len(), 1);
        // Unknown, already released, or repeated: refused, and nothing is released.
        assert_eq!(g.release(&[b, 99]), Err(99));
        assert_eq!(g.release(&[a]), Err(a));
        assert_eq!(g.release(&[b, b]), Err(b));
        assert_eq!((g.check(&[b]), g.check(&[b, 9])), (Ok(()), Err(9)));
        assert_eq!(g.len(), 1);
        assert_eq!(g.grant("d"), 4, "ids are never reused");
        let mut all = g.reclaim();
        all.sort();
        assert_eq!(all, ["b", "d"]);
        assert_eq!(g.len(), 0);
        assert_eq!(g.release(&[b]), Err(b));
    }

    #[test]
    fn held_refuses_duplicates() {
        let mut h = Held::default();
        assert!(h.insert(5));
        assert!(!h.insert(5));
        assert_eq!(h.len(), 1);
        assert!(h.remove(5));
        assert!(!h.remove(5));
        assert!(h.insert(6));
        h.clear();
        assert_eq!(h.len(), 0);
    }

    #[test]
    fn pending_groups_by_device() {
        let mut p = Pending::default();
        assert!(p.is_empty());
        p.release(1, 10);
        p.release(0, 11);
        p.release(1, 12);
        p.retire(7);
        let (rel, ret) = p.take();
        assert_eq!(rel.into_iter().collect::<Vec<_>>(), [(0, vec![11]), (1, vec![10, 12])]);
        assert_eq!(ret, [7]);
        assert!(p.is_empty());
    }
}
