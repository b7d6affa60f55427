//! Shared segments: sealed memfds a process fills once and then lends, read-only, to any
//! number of peers over any number of pipes (a tensor store's buckets).
//!
//! Unlike a pipe's pool, a shared segment belongs to no pipe: a tensor whose bytes lie in
//! one (made with [`SharedSegment::bytes`]) is sent by every shm session without a copy,
//! as a lease on the segment, announced once per pipe. The segment lives while its owner
//! or any lease keeps it; when it goes, every pipe it was announced on tells its peer to
//! `forget` it (PROTOCOL.md §11.5), so the peer unmaps it and its memory is freed.
//! Sessions share them only with peers that agreed to [`ferry_core::wire::FEATURE_SHM_FORGET`];
//! other peers get a copy in the pool.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;

use crate::recycle::PoolRef;
use crate::span::AddrSpan;
use crate::sys::{ExclusiveRange, OwnSegment, SharedRange};

/// Wire segment ids of shared segments start here; a pool's ids are below (u32).
pub(crate) const SHARED_ID_BASE: u64 = 1 << 32;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A session's shared segments: those announced to its peer, those it must tell its peer to
/// forget, and how to wake its pipe's writer.
pub(crate) struct Forgets {
    pub(crate) announced: Mutex<std::collections::HashSet<u64>>,
    ids: Mutex<Vec<u64>>,
    waker: ferry_core::ControlWaker,
}

impl Forgets {
    pub(crate) fn new(waker: ferry_core::ControlWaker) -> Self {
        Forgets { announced: Mutex::default(), ids: Mutex::default(), waker }
    }

    /// The segments to tell the peer to forget now (no longer announced from here on).
    pub(crate) fn take(&self) -> Vec<u64> {
        let ids = std::mem::take(&mut *lock(&self.ids));
        if !ids.is_empty() {
            let mut announced = lock(&self.announced);
            for id in &ids {
                announced.remove(id);
            }
        }
        ids
    }
}

/// A shared segment being filled: writable by its owner alone, not yet lendable.
#[derive(Debug)]
pub struct SharedSegmentMut {
    range: ExclusiveRange,
    /// The pool it goes back to once it went ([`crate::SharedPool`]).
    pool: Option<PoolRef>,
}

impl SharedSegmentMut {
    /// A new zeroed segment of `len > 0` bytes (a sealed memfd named `ferry-shm`, mapped
    /// read-write; pages take memory only once written).
    pub fn create(len: usize) -> io::Result<Self> {
        let seg = OwnSegment::create(len)?;
        let range = seg.claim(0, len).ok_or_else(|| io::Error::other("a new segment could not be claimed"))?;
        Ok(SharedSegmentMut { range, pool: None })
    }

    /// A segment of `pool`'s.
    pub(crate) fn from_pool(range: ExclusiveRange, pool: PoolRef) -> Self {
        SharedSegmentMut { range, pool: Some(pool) }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.range.len()
    }

    /// True when empty (never: creation refuses zero).
    pub fn is_empty(&self) -> bool {
        self.range.len() == 0
    }

    /// The bytes, to fill.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.range.as_mut_slice()
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        self.range.as_slice()
    }

    /// Ends writing: the segment becomes read-only and lendable.
    pub fn freeze(self) -> Arc<SharedSegment> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let seg = Arc::new(SharedSegment {
            id: SHARED_ID_BASE + NEXT.fetch_add(1, Ordering::Relaxed),
            range: self.range.freeze(),
            announced: Mutex::new(Vec::new()),
            pool: self.pool,
            withheld: AtomicBool::new(false),
        });
        SPAN.add(seg.addr(), seg.len());
        registry().insert(seg.addr(), Arc::downgrade(&seg));
        seg
    }
}

/// A filled, read-only shared segment. Tensors over its bytes ([`SharedSegment::bytes`])
/// are sent to peers without a copy.
pub struct SharedSegment {
    id: u64,
    range: SharedRange,
    /// The sessions it was announced on.
    announced: Mutex<Vec<Weak<Forgets>>>,
    /// The pool it goes back to once it went.
    pool: Option<PoolRef>,
    /// A peer may still read it without a lease saying so: never filled again
    /// ([`crate::SharedPool`], contract 2).
    withheld: AtomicBool,
}

impl std::fmt::Debug for SharedSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedSegment").field("id", &self.id).field("len", &self.len()).finish()
    }
}

impl SharedSegment {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.range.len()
    }

    /// True when empty (never).
    pub fn is_empty(&self) -> bool {
        self.range.len() == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        self.range.as_slice()
    }

    /// `len` bytes at `offset` as [`Bytes`] that keep the segment alive (the storage of a
    /// tensor the shm channel sends without a copy); `None` when outside the segment.
    pub fn bytes(self: &Arc<Self>, offset: usize, len: usize) -> Option<Bytes> {
        let end = offset.checked_add(len)?;
        (end <= self.len()).then(|| Bytes::from_owner(SharedSlice { seg: self.clone(), offset, len }))
    }

    /// The live shared segment that holds all of `bytes`, and the offset of their first
    /// byte in it (a tensor made over [`SharedSegment::bytes`] is found again this way).
    pub fn containing(bytes: &[u8]) -> Option<(Arc<SharedSegment>, usize)> {
        find(bytes.as_ptr() as usize, bytes.len())
    }

    /// The wire segment id (the same on every pipe).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    pub(crate) fn addr(&self) -> usize {
        self.as_slice().as_ptr() as usize
    }

    /// A descriptor to announce it.
    pub(crate) fn dup_fd(&self) -> io::Result<std::os::fd::OwnedFd> {
        self.range.segment().dup_fd()
    }

    /// A peer may still read it though no lease of its says so (a pipe closed while the
    /// peer held leases on it): its pool must not fill it again.
    pub(crate) fn withhold(&self) {
        self.withheld.store(true, Ordering::Release);
    }

    /// Remembers that a session announced it: that session's peer is told to forget it
    /// when it goes.
    pub(crate) fn announced_to(&self, forgets: &Arc<Forgets>) {
        let mut a = lock(&self.announced);
        a.retain(|w| w.strong_count() > 0);
        a.push(Arc::downgrade(forgets));
    }
}

impl Drop for SharedSegment {
    fn drop(&mut self) {
        let addr = self.addr();
        {
            let mut reg = registry();
            if reg.get(&addr).is_some_and(|w| w.strong_count() == 0) {
                reg.remove(&addr);
            }
        }
        for w in lock(&self.announced).drain(..) {
            if let Some(f) = w.upgrade() {
                lock(&f.ids).push(self.id);
                f.waker.wake();
            }
        }
        // Last: its peers were told to forget this id; filled again, it gets a new one.
        if let Some(pool) = self.pool.as_ref().and_then(Weak::upgrade) {
            pool.came_back(self.range.segment().clone(), self.withheld.load(Ordering::Acquire));
        }
    }
}

struct SharedSlice {
    seg: Arc<SharedSegment>,
    offset: usize,
    len: usize,
}

impl AsRef<[u8]> for SharedSlice {
    fn as_ref(&self) -> &[u8] {
        &self.seg.as_slice()[self.offset..self.offset + self.len]
    }
}

/// Covers every shared segment this process ever made (`find`'s first look).
static SPAN: AddrSpan = AddrSpan::new();

/// Live shared segments of this process by address.
fn registry() -> std::sync::MutexGuard<'static, BTreeMap<usize, Weak<SharedSegment>>> {
    static REG: Mutex<BTreeMap<usize, Weak<SharedSegment>>> = Mutex::new(BTreeMap::new());
    lock(&REG)
}

/// The live shared segment holding `[ptr, ptr + len)`, and the offset of `ptr` in it.
pub(crate) fn find(ptr: usize, len: usize) -> Option<(Arc<SharedSegment>, usize)> {
    if !SPAN.may_hold(ptr, len) {
        return None;
    }
    // The registry's lock is let go before `seg` can be dropped (its `Drop` takes it).
    let (base, seg) = {
        let reg = registry();
        let (&base, w) = reg.range(..=ptr).next_back()?;
        (base, w.upgrade()?)
    };
    let off = ptr - base;
    (off.checked_add(len)? <= seg.len()).then_some((seg, off))
}
