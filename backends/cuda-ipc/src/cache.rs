//! The consumer's caches of one peer's IPC objects. Pure: generic over what a mapping or an
//! opened event is, so the tests need no driver.
//!
//! - [`AllocCache`]: the peer's allocations this side has opened, by the peer's allocation
//!   id. An entry is only used again when the descriptor carries the **same handle bytes**:
//!   a peer that freed an allocation and got the same address (or id) for a new one sends a
//!   new handle, and the stale mapping is evicted instead of being read. Entries hold an
//!   `Arc` of the mapping; tensors hold more, so evicting or retiring never unmaps memory a
//!   tensor still uses (the mapping closes when its last user drops it).
//! - [`EventCache`]: the peer's events this side has opened, by device and handle bytes,
//!   bounded (the oldest is dropped first).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::driver::IpcHandle;

/// Why a cache refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CacheError {
    /// The descriptor contradicts what the same allocation was before.
    Inconsistent(String),
    /// Opening it would go over a limit.
    Limit {
        /// The option to raise.
        limit: &'static str,
        /// The value it would reach.
        value: u64,
        /// The limit.
        max: u64,
    },
}

struct Entry<M> {
    handle: IpcHandle,
    size: u64,
    dev: u32,
    mapping: Arc<M>,
}

/// One peer's allocations this side has mapped.
pub(crate) struct AllocCache<M> {
    entries: HashMap<u64, Entry<M>>,
    mapped: u64,
    max_bytes: u64,
    max_allocs: usize,
    stale_evictions: u64,
}

impl<M> AllocCache<M> {
    /// An empty cache that maps at most `max_bytes` in at most `max_allocs` allocations.
    pub(crate) fn new(max_bytes: u64, max_allocs: usize) -> Self {
        AllocCache { entries: HashMap::new(), mapped: 0, max_bytes, max_allocs, stale_evictions: 0 }
    }

    /// The mapping of allocation `alloc_id` if it is cached with the same handle bytes.
    /// An entry with other handle bytes is stale and is evicted (`Ok(None)`); one with the
    /// same handle but another size or device is a lie (`Err`).
    pub(crate) fn lookup(
        &mut self,
        alloc_id: u64,
        handle: &IpcHandle,
        size: u64,
        dev: u32,
    ) -> Result<Option<Arc<M>>, CacheError> {
        let Some(e) = self.entries.get(&alloc_id) else { return Ok(None) };
        if &e.handle != handle {
            self.evict(alloc_id);
            self.stale_evictions += 1;
            return Ok(None);
        }
        if e.size != size || e.dev != dev {
            return Err(CacheError::Inconsistent(format!(
                "allocation {alloc_id} was {} bytes on local device {}, now claims {size} bytes on device {dev}",
                e.size, e.dev
            )));
        }
        Ok(Some(e.mapping.clone()))
    }

    /// Whether an allocation of `size` bytes may be mapped in addition to what is cached.
    pub(crate) fn check_room(&self, size: u64) -> Result<(), CacheError> {
        if self.entries.len() >= self.max_allocs {
            return Err(CacheError::Limit {
                limit: "max_peer_allocs",
                value: self.entries.len() as u64 + 1,
                max: self.max_allocs as u64,
            });
        }
        let value = self.mapped.saturating_add(size);
        if value > self.max_bytes {
            return Err(CacheError::Limit { limit: "max_peer_bytes", value, max: self.max_bytes });
        }
        Ok(())
    }

    /// Caches a new mapping (after [`AllocCache::lookup`] missed and
    /// [`AllocCache::check_room`] agreed).
    pub(crate) fn insert(&mut self, alloc_id: u64, handle: IpcHandle, size: u64, dev: u32, mapping: Arc<M>) {
        self.evict(alloc_id);
        self.mapped += size;
        self.entries.insert(alloc_id, Entry { handle, size, dev, mapping });
    }

    /// Forgets allocation `alloc_id` (the peer freed it); `None` when it is not cached.
    pub(crate) fn retire(&mut self, alloc_id: u64) -> Option<Arc<M>> {
        self.evict(alloc_id)
    }

    fn evict(&mut self, alloc_id: u64) -> Option<Arc<M>> {
        let e = self.entries.remove(&alloc_id)?;
        self.mapped -= e.size;
        Some(e.mapping)
    }

    /// Forgets everything (the peer is gone); returns the mappings.
    pub(crate) fn clear(&mut self) -> Vec<Arc<M>> {
        self.mapped = 0;
        self.entries.drain().map(|(_, e)| e.mapping).collect()
    }

    /// Allocations cached.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Bytes of the peer's allocations cached.
    pub(crate) fn mapped_bytes(&self) -> u64 {
        self.mapped
    }

    /// Entries evicted because their handle bytes changed.
    pub(crate) fn stale_evictions(&self) -> u64 {
        self.stale_evictions
    }
}

/// One peer's events this side has opened, by device and handle bytes.
pub(crate) struct EventCache<E> {
    map: HashMap<(u32, IpcHandle), Arc<E>>,
    order: VecDeque<(u32, IpcHandle)>,
    cap: usize,
}

impl<E> EventCache<E> {
    /// An empty cache of at most `cap` events.
    pub(crate) fn new(cap: usize) -> Self {
        EventCache { map: HashMap::new(), order: VecDeque::new(), cap: cap.max(1) }
    }

    /// The cached event, if any.
    pub(crate) fn get(&self, dev: u32, handle: &IpcHandle) -> Option<Arc<E>> {
        self.map.get(&(dev, *handle)).cloned()
    }

    /// Caches an opened event, dropping the oldest beyond the capacity.
    pub(crate) fn insert(&mut self, dev: u32, handle: IpcHandle, ev: Arc<E>) {
        if self.map.insert((dev, handle), ev).is_none() {
            self.order.push_back((dev, handle));
        }
        while self.order.len() > self.cap {
            if let Some(k) = self.order.pop_front() {
                self.map.remove(&k);
            }
        }
    }

    /// Events cached.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Forgets everything.
    pub(crate) fn clear(&mut self) {
        self.map.clear();
        self.order.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(b: u8) -> IpcHandle {
        IpcHandle([b; 64])
    }

    #[test]
    fn hits_only_with_the_same_handle_bytes() {
        let mut c: AllocCache<&str> = AllocCache::new(1 << 30, 16);
        assert_eq!(c.lookup(1, &h(1), 100, 0), Ok(None));
        c.check_room(100).unwrap();
        c.insert(1, h(1), 100, 0, Arc::new("first"));
        assert_eq!(*c.lookup(1, &h(1), 100, 0).unwrap().unwrap(), "first");
        assert_eq!(c.mapped_bytes(), 100);
        // The peer reused the id (or the address behind it) for a new allocation: new handle
        // bytes. The old mapping must not be used; it is evicted.
        assert_eq!(c.lookup(1, &h(2), 100, 0), Ok(None));
        assert_eq!(c.stale_evictions(), 1);
        assert_eq!((c.len(), c.mapped_bytes()), (0, 0));
        c.insert(1, h(2), 200, 0, Arc::new("second"));
        assert_eq!(*c.lookup(1, &h(2), 200, 0).unwrap().unwrap(), "second");
    }

    #[test]
    fn a_changed_size_or_device_is_a_lie() {
        let mut c: AllocCache<()> = AllocCache::new(1 << 30, 16);
        c.insert(4, h(1), 100, 0, Arc::new(()));
        assert!(matches!(c.lookup(4, &h(1), 200, 0), Err(CacheError::Inconsistent(_))));
        assert!(matches!(c.lookup(4, &h(1), 100, 1), Err(CacheError::Inconsistent(_))));
        assert_eq!(c.len(), 1, "a lie does not evict the good entry");
    }

    #[test]
    fn evicted_mappings_live_on_in_their_users() {
        let mut c: AllocCache<String> = AllocCache::new(1 << 30, 16);
        let m = Arc::new("mapping".to_string());
        c.insert(1, h(1), 10, 0, m.clone());
        let user = c.lookup(1, &h(1), 10, 0).unwrap().unwrap();
        assert_eq!(Arc::strong_count(&m), 3);
        assert!(c.retire(1).is_some());
        assert!(c.retire(1).is_none());
        assert_eq!(Arc::strong_count(&m), 2, "the cache let go; the user still holds it");
        drop(user);
        c.insert(2, h(2), 10, 0, Arc::new("b".into()));
        c.insert(3, h(3), 10, 0, Arc::new("c".into()));
        assert_eq!(c.clear().len(), 2);
        assert_eq!((c.len(), c.mapped_bytes()), (0, 0));
    }

    #[test]
    fn limits() {
        let mut c: AllocCache<()> = AllocCache::new(1000, 2);
        assert_eq!(c.check_room(1001), Err(CacheError::Limit { limit: "max_peer_bytes", value: 1001, max: 1000 }));
        c.insert(1, h(1), 600, 0, Arc::new(()));
        assert!(matches!(c.check_room(500), Err(CacheError::Limit { limit: "max_peer_bytes", .. })));
        c.check_room(400).unwrap();
        c.insert(2, h(2), 400, 0, Arc::new(()));
        assert!(matches!(c.check_room(0), Err(CacheError::Limit { limit: "max_peer_allocs", .. })));
        assert!(c.check_room(u64::MAX).is_err(), "no overflow");
    }

    #[test]
    fn event_cache_is_bounded() {
        let mut c: EventCache<u8> = EventCache::new(2);
        c.insert(0, h(1), Arc::new(1));
        c.insert(0, h(2), Arc::new(2));
        c.insert(1, h(2), Arc::new(3));
        assert_eq!(c.len(), 2);
        assert!(c.get(0, &h(1)).is_none(), "the oldest went first");
        assert_eq!(c.get(1, &h(2)).as_deref(), Some(&3));
        c.insert(1, h(2), Arc::new(4));
        assert_eq!(c.len(), 2);
        c.clear();
        assert_eq!(c.len(), 0);
    }
}
