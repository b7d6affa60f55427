//! [`SharedPool`]: shared segments filled again once everyone let go, instead of new ones.
//!
//! A new segment costs its pages' first touch (the kernel allocates and zeroes each page as
//! it is written: about 17 ms for 25 MB on a small VM), which is most of what lending a
//! tensor costs when it must be copied in. A pool keeps the segments its owner made, once
//! they went (their [`SharedSegment`] dropped), and hands them out again, pages already
//! there.
//!
//! Contract (the shm session's part is tested in `tests/recycle.rs`):
//!
//! 1. A segment comes back only when its last [`SharedSegment`] handle is dropped: no tensor
//!    of this process refers to it, and every lease a pipe granted on it was released by the
//!    peer (a release comes after the peer dropped its tensor and its private copies of
//!    written pages, [`crate::discard_private_pages`]).
//! 2. A segment a peer may still read without a lease saying so is *withheld*, never filled
//!    again: a pipe that closed (or whose session went) while the peer held leases on it.
//!    Its peer's mapping is private (copy-on-write), so refilling the memfd would change
//!    bytes that peer never wrote under its tensors. The memory goes when both let go, as
//!    for any segment.
//! 3. A segment that comes back gets a new id when frozen again: every pipe it was
//!    announced on is told to `forget` the old one (the peer unmaps it), and the next send
//!    announces it again.
//! 4. Kept segments are given back (unmapped and closed) once idle for
//!    [`SharedPoolOptions::idle_release`] ([`SharedPool::give_back_idle`]), and at once past
//!    [`SharedPoolOptions::keep_bytes`] (the oldest first). Closing or dropping the pool
//!    gives back what it keeps; segments still out then are not kept when they come back.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::shared::SharedSegmentMut;
use crate::sys::OwnSegment;

#[cfg(doc)]
use crate::shared::SharedSegment;

/// The default of [`SharedPoolOptions::keep_bytes`]: 1 GiB.
pub const DEFAULT_KEEP_BYTES: u64 = 1 << 30;

/// The default of [`SharedPoolOptions::idle_release`]: 5 s.
pub const DEFAULT_IDLE_RELEASE: Duration = Duration::from_secs(5);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Options of a [`SharedPool`].
#[derive(Debug, Clone)]
pub struct SharedPoolOptions {
    /// Most bytes of idle segments kept (default 1 GiB); a segment coming back past it makes
    /// the oldest kept ones go at once.
    pub keep_bytes: u64,
    /// A kept segment idle this long is given back by [`SharedPool::give_back_idle`]
    /// (default 5 s).
    pub idle_release: Duration,
}

impl Default for SharedPoolOptions {
    fn default() -> Self {
        SharedPoolOptions { keep_bytes: DEFAULT_KEEP_BYTES, idle_release: DEFAULT_IDLE_RELEASE }
    }
}

/// What a [`SharedPool`] did and keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SharedPoolStats {
    /// Segments kept now, idle.
    pub kept_segments: usize,
    /// Their bytes.
    pub kept_bytes: u64,
    /// Segments made new.
    pub created: u64,
    /// Segments handed out again.
    pub reused: u64,
    /// Segments that came back but were withheld: a peer may still read them (contract 2).
    pub withheld: u64,
    /// Kept segments given back (idle, or past `keep_bytes`).
    pub given_back: u64,
}

/// Shared segments of one owner, filled again once every handle and every peer's lease on
/// them let go (see the module docs for the contract).
#[derive(Clone)]
pub struct SharedPool {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SharedPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedPool").field("stats", &self.stats()).finish()
    }
}

pub(crate) struct Inner {
    opts: SharedPoolOptions,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Kept segments by length, each with when it came back (the newest last).
    kept: BTreeMap<usize, Vec<(Instant, Arc<OwnSegment>)>>,
    stats: SharedPoolStats,
    /// [`SharedPool::close`]d: nothing is kept any more.
    closed: bool,
}

impl State {
    /// Takes out the oldest kept segment.
    fn pop_oldest(&mut self) -> Option<Arc<OwnSegment>> {
        let (&len, _) = self.kept.iter().min_by_key(|(_, v)| v.first().map(|(t, _)| *t))?;
        let v = self.kept.get_mut(&len)?;
        let (_, seg) = v.remove(0);
        if v.is_empty() {
            self.kept.remove(&len);
        }
        self.stats.kept_segments -= 1;
        self.stats.kept_bytes -= len as u64;
        self.stats.given_back += 1;
        Some(seg)
    }
}

impl SharedPool {
    /// An empty pool.
    pub fn new(opts: SharedPoolOptions) -> Self {
        SharedPool { inner: Arc::new(Inner { opts, state: Mutex::default() }) }
    }

    /// A segment of `len` bytes rounded up to whole pages (its [`SharedSegmentMut::len`]):
    /// a kept one of that length when there is one (its bytes are what was written there
    /// last, not zeros), else a new one (zeroed). Frozen and dropped, it comes back here.
    pub fn alloc(&self, len: usize) -> io::Result<SharedSegmentMut> {
        let len = len.max(1).next_multiple_of(rustix::param::page_size());
        let mut busy = Vec::new();
        let got = {
            let mut st = lock(&self.inner.state);
            let mut got = None;
            if let Some(v) = st.kept.get_mut(&len) {
                while let Some((t, seg)) = v.pop() {
                    // Claimed still only in the instant between a segment's coming back and
                    // its last claim's end (another thread): left for the next time.
                    match seg.claim(0, len) {
                        Some(range) => {
                            got = Some(range);
                            break;
                        }
                        None => busy.push((t, seg)),
                    }
                }
                v.append(&mut busy);
                if v.is_empty() {
                    st.kept.remove(&len);
                }
            }
            if got.is_some() {
                st.stats.kept_segments -= 1;
                st.stats.kept_bytes -= len as u64;
                st.stats.reused += 1;
            }
            got
        };
        let range = match got {
            Some(r) => r,
            None => {
                let seg = OwnSegment::create(len)?;
                let r = seg.claim(0, len).ok_or_else(|| io::Error::other("a new segment could not be claimed"))?;
                lock(&self.inner.state).stats.created += 1;
                r
            }
        };
        Ok(SharedSegmentMut::from_pool(range, Arc::downgrade(&self.inner)))
    }

    /// Gives back the segments kept idle for [`SharedPoolOptions::idle_release`] at `now`;
    /// returns when the next one will be due (`None`: none kept).
    pub fn give_back_idle(&self, now: Instant) -> Option<Instant> {
        let mut gone = Vec::new();
        let next = {
            let mut st = lock(&self.inner.state);
            let idle = self.inner.opts.idle_release;
            let mut next: Option<Instant> = None;
            let mut emptied = Vec::new();
            let mut given = (0usize, 0u64);
            for (&len, v) in st.kept.iter_mut() {
                v.retain(|(t, seg)| {
                    let due = *t + idle;
                    if due <= now {
                        gone.push(seg.clone());
                        given.0 += 1;
                        given.1 += len as u64;
                        false
                    } else {
                        next = Some(next.map_or(due, |n| n.min(due)));
                        true
                    }
                });
                if v.is_empty() {
                    emptied.push(len);
                }
            }
            for len in emptied {
                st.kept.remove(&len);
            }
            st.stats.kept_segments -= given.0;
            st.stats.kept_bytes -= given.1;
            st.stats.given_back += given.0 as u64;
            next
        };
        drop(gone); // unmapped outside the lock
        next
    }

    /// Gives back every kept segment now, and from now on every segment that comes back.
    pub fn close(&self) {
        let gone: Vec<_> = {
            let mut st = lock(&self.inner.state);
            st.closed = true;
            let mut gone = Vec::new();
            while let Some(seg) = st.pop_oldest() {
                gone.push(seg);
            }
            gone
        };
        drop(gone);
    }

    /// What it did and keeps.
    pub fn stats(&self) -> SharedPoolStats {
        lock(&self.inner.state).stats.clone()
    }

    /// Its options.
    pub fn options(&self) -> &SharedPoolOptions {
        &self.inner.opts
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Kept segments go with the pool (their mappings are unmapped here).
        self.state.get_mut().unwrap_or_else(|e| e.into_inner()).kept.clear();
    }
}

impl Inner {
    /// A segment of this pool came back (its last handle went): kept for the next `alloc`,
    /// unless `withheld` (contract 2).
    pub(crate) fn came_back(&self, seg: Arc<OwnSegment>, withheld: bool) {
        let mut gone = Vec::new();
        {
            let mut st = lock(&self.state);
            if withheld {
                st.stats.withheld += 1;
                return;
            }
            if st.closed {
                return;
            }
            let len = seg.len();
            st.kept.entry(len).or_default().push((Instant::now(), seg));
            st.stats.kept_segments += 1;
            st.stats.kept_bytes += len as u64;
            while st.stats.kept_bytes > self.opts.keep_bytes {
                match st.pop_oldest() {
                    Some(s) => gone.push(s),
                    None => break,
                }
            }
        }
        drop(gone); // unmapped outside the lock
    }
}

/// Where a pooled segment goes back.
pub(crate) type PoolRef = Weak<Inner>;
