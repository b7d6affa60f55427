//! The sender's pool: sealed memfd segments carved into slots (first fit, coalescing free
//! lists), a byte limit, and a registry that finds the slot a tensor's bytes live in.
//!
//! A slot's life: [`Pool::alloc`] -> [`PoolSlotMut`] (writable, inside a `TensorMut`) ->
//! frozen into [`SlotCore`] (an `Arc`, the owner of the tensor's `Bytes`) -> shared with
//! leases the peer holds -> back to the free list when the last reference drops.
//!
//! A segment's life: made when no segment has room for a claim, numbered 0, 1, 2, … (an id
//! is never used twice on a pipe), announced to the peer with the first lease on it, and
//! given back (unmapped and closed, the peer told to forget it) once no slot of it is in use:
//! after [`ShmOptions::idle_release`] beyond the [`ShmOptions::keep_idle_bytes`] kept
//! ([`Pool::give_back_idle`]), or at once when a new segment would not fit under the limit.
//! A segment with a slot in use is never given back, and the mapping itself lives until the
//! last `Arc<OwnSegment>` (every claim holds one) is gone: nothing can point into unmapped
//! memory.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use bytes::Bytes;
use ferry_core::{ChannelError, ControlWaker, LimitError, WritableStorage};
use tokio::sync::Notify;

use crate::ShmOptions;
use crate::span::AddrSpan;
use crate::sys::{ExclusiveRange, OwnSegment, SharedRange};

/// Segments grow in multiples of this.
const SEGMENT_GRANULE: usize = 2 << 20;

struct SegEntry {
    seg: Arc<OwnSegment>,
    /// Free ranges: offset -> length.
    free: BTreeMap<usize, usize>,
    /// Whether the peer has been sent this segment's descriptor.
    announced: bool,
    /// Since when no slot of it is in use; `None` while one is.
    empty_since: Option<Instant>,
}

impl SegEntry {
    fn len(&self) -> usize {
        self.seg.len()
    }

    fn is_empty(&self) -> bool {
        self.free.get(&0) == Some(&self.seg.len())
    }
}

#[derive(Default)]
struct PoolState {
    segs: BTreeMap<u32, SegEntry>,
    /// The id of the next segment made (ids are never reused on a pipe).
    next_id: u32,
    reserved: u64,
    /// Bytes of the segments no slot of which is in use.
    empty_bytes: u64,
    /// Frozen slots by address of their first byte.
    live: BTreeMap<usize, Weak<SlotCore>>,
    /// Segments made and given back so far.
    created: u64,
    given_back: u64,
    /// Announced segments given back, for the peer to forget ([`Pool::take_forgets`]).
    forget: Vec<u64>,
}

/// Where a full pool's bytes are ([`Pool::alloc`]'s error).
pub(crate) struct Holders {
    /// Leases the peer holds on this pool, and the bytes they cover.
    pub(crate) leases: usize,
    pub(crate) leased_bytes: u64,
}

/// One pipe's pool.
pub(crate) struct Pool {
    state: Mutex<PoolState>,
    freed: Notify,
    opts: ShmOptions,
    /// Covers every slot ever registered (`find`'s first look).
    span: AddrSpan,
    /// Whether the peer unmaps a segment when told (`shm_forget`): only then may a segment
    /// it was sent be given back.
    peer_forgets: bool,
    /// Asks the pipe's writer to poll the session: an idle segment may become due.
    waker: ControlWaker,
    /// Set when empty segments pass [`ShmOptions::keep_idle_bytes`], cleared when none is
    /// left to give back: the writer's poll before each message looks at it alone.
    idle_due: AtomicBool,
}

fn align_for(len: usize) -> usize {
    if len >= 4096 { 4096 } else { 64 }
}

impl PoolState {
    /// Whether segment `e` may be given back now (empty, and the peer can be told).
    fn can_give_back(e: &SegEntry, peer_forgets: bool) -> bool {
        e.empty_since.is_some() && (peer_forgets || !e.announced)
    }

    /// Takes segment `id` out of the pool (its mapping goes when `gone` is dropped, after
    /// the lock).
    fn remove(&mut self, id: u32, gone: &mut Vec<SegEntry>) {
        if let Some(e) = self.segs.remove(&id) {
            self.reserved -= e.len() as u64;
            if e.empty_since.is_some() {
                self.empty_bytes -= e.len() as u64;
            }
            self.given_back += 1;
            if e.announced {
                self.forget.push(u64::from(id));
            }
            tracing::debug!(segment = id, size = e.len(), reserved = self.reserved, "shm pool gave a segment back");
            gone.push(e);
        }
    }

    /// Gives back segments that may go, largest first, until `size` more bytes fit under
    /// `limit`; false (nothing given back) when they would not make room.
    fn make_room(&mut self, size: u64, limit: u64, peer_forgets: bool, gone: &mut Vec<SegEntry>) -> bool {
        let mut can: Vec<(usize, u32)> = self
            .segs
            .iter()
            .filter(|(_, e)| Self::can_give_back(e, peer_forgets))
            .map(|(&id, e)| (e.len(), id))
            .collect();
        let freeable: u64 = can.iter().map(|&(l, _)| l as u64).sum();
        if self.reserved - freeable + size > limit {
            return false;
        }
        can.sort_unstable_by(|a, b| b.cmp(a));
        for (_, id) in can {
            if self.reserved + size <= limit {
                break;
            }
            self.remove(id, gone);
        }
        true
    }
}

impl Pool {
    pub(crate) fn new(opts: ShmOptions, peer_forgets: bool, waker: ControlWaker) -> Arc<Pool> {
        Arc::new(Pool {
            state: Mutex::new(PoolState::default()),
            freed: Notify::new(),
            opts,
            span: AddrSpan::new(),
            peer_forgets,
            waker,
            idle_due: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counters: segments now, bytes of them, segments made and given back so far.
    pub(crate) fn counts(&self) -> (usize, u64, u64, u64) {
        let st = self.lock();
        (st.segs.len(), st.reserved, st.created, st.given_back)
    }

    /// Bytes of the segments' slots in use now (by tensors here or leases of the peer).
    pub(crate) fn used(&self) -> u64 {
        let st = self.lock();
        st.segs.values().map(|e| e.len() as u64 - e.free.values().map(|&l| l as u64).sum::<u64>()).sum()
    }

    /// Bytes of segments now.
    pub(crate) fn reserved(&self) -> u64 {
        self.lock().reserved
    }

    /// Tries once: a claim of `len` bytes, or `None` when the pool is at its limit.
    fn try_alloc(&self, len: usize) -> Result<Option<(u32, ExclusiveRange)>, ChannelError> {
        let mut gone = Vec::new();
        let r = self.try_alloc_locked(len, &mut gone);
        drop(gone); // unmapped outside the lock
        r
    }

    fn try_alloc_locked(
        &self,
        len: usize,
        gone: &mut Vec<SegEntry>,
    ) -> Result<Option<(u32, ExclusiveRange)>, ChannelError> {
        let align = align_for(len);
        let need = len.next_multiple_of(align);
        let mut guard = self.lock();
        let st = &mut *guard;
        // Where to look, so that empty segments stay empty (and can be given back): those in
        // use first, then empty ones, smallest first; an empty segment larger than
        // `segment_bytes` (made for one large tensor) takes a claim that a new segment of
        // the usual size could hold only when no such segment fits under the limit.
        let normal = self.opts.segment_bytes.next_multiple_of(SEGMENT_GRANULE);
        let mut order: Vec<(bool, usize, u32)> = st
            .segs
            .iter()
            .map(|(&id, e)| (e.empty_since.is_some(), if e.empty_since.is_some() { e.len() } else { 0 }, id))
            .collect();
        order.sort_unstable();
        let fresh_fits =
            st.reserved + need.max(normal).next_multiple_of(SEGMENT_GRANULE) as u64 <= self.opts.pool_limit;
        for (empty, len, id) in order {
            if empty && fresh_fits && need <= normal && len > normal {
                continue;
            }
            let Some(e) = st.segs.get_mut(&id) else { continue };
            let fit = e.free.iter().find_map(|(&off, &flen)| {
                let start = off.next_multiple_of(align);
                (start + need <= off + flen).then_some((off, flen, start))
            });
            if let Some((off, flen, start)) = fit {
                e.free.remove(&off);
                if start > off {
                    e.free.insert(off, start - off);
                }
                if off + flen > start + need {
                    e.free.insert(start + need, off + flen - start - need);
                }
                if e.empty_since.take().is_some() {
                    st.empty_bytes -= e.len() as u64;
                }
                let claim = e.seg.claim(start, need).ok_or_else(|| internal("free range was still claimed"))?;
                return Ok(Some((id, claim)));
            }
        }
        let limit = self.opts.pool_limit;
        let mut size = need.max(self.opts.segment_bytes).next_multiple_of(SEGMENT_GRANULE);
        if st.reserved + size as u64 > limit {
            // A full-size segment does not fit, a just-big-enough one may; else empty
            // segments make room for it.
            size = need.next_multiple_of(SEGMENT_GRANULE);
            if st.reserved + size as u64 > limit && !st.make_room(size as u64, limit, self.peer_forgets, gone) {
                return Ok(None);
            }
        }
        if st.next_id == u32::MAX {
            return Err(internal("segment ids used up on this pipe"));
        }
        let seg = OwnSegment::create(size).map_err(|e| ChannelError::Backend(Arc::new(e)))?;
        let claim = seg.claim(0, need).ok_or_else(|| internal("fresh segment refused a claim"))?;
        let mut free = BTreeMap::new();
        if size > need {
            free.insert(need, size - need);
        }
        let id = st.next_id;
        st.next_id += 1;
        st.reserved += size as u64;
        st.created += 1;
        st.segs.insert(id, SegEntry { seg, free, announced: false, empty_since: None });
        tracing::debug!(segment = id, size, reserved = st.reserved, "shm pool grew");
        Ok(Some((id, claim)))
    }

    /// A claim of `len` bytes; waits for space as the options say, and gives up when the
    /// pipe closes. `holders` says where the bytes are, for the error of a full pool.
    pub(crate) async fn alloc(
        self: &Arc<Self>,
        len: usize,
        closed: &mut tokio::sync::watch::Receiver<bool>,
        holders: impl Fn() -> Holders,
    ) -> Result<(u32, ExclusiveRange), ChannelError> {
        if len.next_multiple_of(align_for(len)).next_multiple_of(SEGMENT_GRANULE) as u64 > self.opts.pool_limit {
            return Err(self.full_error(len, "a tensor larger than the whole pool".into()));
        }
        let deadline = tokio::time::Instant::now() + self.opts.full_wait;
        loop {
            let notified = self.freed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(r) = self.try_alloc(len)? {
                return Ok(r);
            }
            if self.opts.full_wait.is_zero() {
                return Err(self.full_error(len, format!("pool full: {}", self.where_bytes_are(&holders()))));
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(deadline) => {
                    let wait = match &self.opts.names.full_wait {
                        Some(w) => format!(", or wait longer with {w}"),
                        None => String::new(),
                    };
                    return Err(ChannelError::Timeout(self.opts.full_wait, format!(
                        "shm pool full: no room for {len} bytes within {:?}; pool_limit = {} bytes, {}. Drop \
                         tensors sooner, raise {}{wait}",
                        self.opts.full_wait, self.opts.pool_limit, self.where_bytes_are(&holders()),
                        self.opts.names.pool_limit)));
                }
                _ = closed.wait_for(|c| *c) => return Err(ChannelError::Closed),
            }
        }
    }

    /// What holds a full pool's bytes, in words.
    fn where_bytes_are(&self, h: &Holders) -> String {
        let st = self.lock();
        let (mut used, mut gaps, mut kept) = (0u64, 0u64, 0u64);
        for e in st.segs.values() {
            let free: u64 = e.free.values().map(|&l| l as u64).sum();
            if e.is_empty() {
                kept += free;
            } else {
                used += e.len() as u64 - free;
                gaps += free;
            }
        }
        let mut s = format!(
            "{} reserved: {used} in use by tensors (the peer holds {} leases on {} bytes it has not dropped; \
             the rest are tensors not dropped here)",
            st.reserved, h.leases, h.leased_bytes
        );
        if gaps > 0 {
            s += &format!(", {gaps} free between them (too small a gap)");
        }
        if kept > 0 {
            s += &format!(
                ", {kept} in empty segments the peer was sent and cannot be told to unmap (it lacks shm_forget)"
            );
        }
        s
    }

    fn full_error(&self, len: usize, what: String) -> ChannelError {
        ChannelError::Limit(LimitError {
            limit: "pool_limit",
            what: "shm pool bytes needed",
            value: self.reserved() + len as u64,
            max: self.opts.pool_limit,
            hint: format!("{what}; raise {} on the sending side", self.opts.names.pool_limit).into(),
        })
    }

    fn give_back(&self, seg: u32, offset: usize, len: usize) {
        let mut st = self.lock();
        let mut wake = false;
        if let Some(e) = st.segs.get_mut(&seg) {
            let (mut off, mut l) = (offset, len);
            if let Some((&p, &pl)) = e.free.range(..off).next_back()
                && p + pl == off
            {
                e.free.remove(&p);
                off = p;
                l += pl;
            }
            if let Some(&nl) = e.free.get(&(off + l)) {
                e.free.remove(&(off + l));
                l += nl;
            }
            e.free.insert(off, l);
            if e.is_empty() && e.empty_since.is_none() {
                e.empty_since = Some(Instant::now());
                let size = e.len() as u64;
                st.empty_bytes += size;
                // Only then may a segment become due: a pool that keeps what is empty wakes
                // nobody (a steady stream of messages costs no wake).
                wake = st.empty_bytes > self.opts.keep_idle_bytes;
            }
        }
        drop(st);
        self.freed.notify_waiters();
        if wake {
            self.idle_due.store(true, Ordering::Release);
            self.waker.wake();
        }
    }

    /// Gives back the segments empty for [`ShmOptions::idle_release`] at `now`, beyond the
    /// [`ShmOptions::keep_idle_bytes`] kept (largest first); returns when to look again
    /// (`None`: only a segment that empties makes one due).
    pub(crate) fn give_back_idle(&self, now: Instant) -> Option<Instant> {
        if !self.idle_due.load(Ordering::Acquire) {
            return None;
        }
        let mut gone = Vec::new();
        let next = {
            let mut st = self.lock();
            if st.empty_bytes <= self.opts.keep_idle_bytes {
                self.idle_due.store(false, Ordering::Release);
                return None;
            }
            let mut empty: Vec<(usize, Instant, u32)> = st
                .segs
                .iter()
                .filter(|(_, e)| PoolState::can_give_back(e, self.peer_forgets))
                .filter_map(|(&id, e)| Some((e.len(), e.empty_since?, id)))
                .collect();
            empty.sort_unstable_by(|a, b| b.cmp(a));
            let mut next: Option<Instant> = None;
            for (_, since, id) in empty {
                if st.empty_bytes <= self.opts.keep_idle_bytes {
                    break;
                }
                let due = since + self.opts.idle_release;
                if due <= now {
                    st.remove(id, &mut gone);
                } else {
                    next = Some(next.map_or(due, |n| n.min(due)));
                }
            }
            if next.is_none() {
                self.idle_due.store(false, Ordering::Release);
            }
            next
        };
        drop(gone); // unmapped outside the lock
        next
    }

    /// Ids of the announced segments given back since the last call: the peer unmaps them.
    pub(crate) fn take_forgets(&self) -> Vec<u64> {
        std::mem::take(&mut self.lock().forget)
    }

    /// Segment `seg`'s memory.
    pub(crate) fn segment(&self, seg: u32) -> Option<Arc<OwnSegment>> {
        self.lock().segs.get(&seg).map(|e| e.seg.clone())
    }

    /// Sets whether segment `seg` has been announced; returns the previous value.
    pub(crate) fn mark_announced(&self, seg: u32, announced: bool) -> bool {
        let mut st = self.lock();
        match st.segs.get_mut(&seg) {
            Some(e) => std::mem::replace(&mut e.announced, announced),
            None => true,
        }
    }

    /// The frozen slot whose bytes contain `[ptr, ptr + len)`, if any.
    pub(crate) fn find(&self, ptr: usize, len: usize) -> Option<Arc<SlotCore>> {
        // The lock is let go before `core` can be dropped: when its last other holder let go
        // meanwhile, this is the last reference, and `SlotCore`'s drop takes the lock (held
        // here, that was a self-deadlock of the thread, a runtime worker).
        if !self.span.may_hold(ptr, len) {
            return None;
        }
        let core = {
            let st = self.lock();
            let (_, w) = st.live.range(..=ptr).next_back()?;
            w.upgrade()?
        };
        let start = core.addr();
        (ptr >= start && ptr + len <= start + core.len).then_some(core)
    }

    fn register(&self, core: &Arc<SlotCore>) {
        self.span.add(core.addr(), core.len);
        self.lock().live.insert(core.addr(), Arc::downgrade(core));
    }
}

fn internal(what: &str) -> ChannelError {
    ChannelError::Backend(Arc::new(std::io::Error::other(format!("shm pool invariant broken: {what}"))))
}

/// A frozen slot: the owner of a pool tensor's bytes and of every lease on it.
pub(crate) struct SlotCore {
    pool: Weak<Pool>,
    seg: u32,
    /// Bytes the tensor uses (the claim may be longer: alignment).
    len: usize,
    /// Always `Some` until drop (taken there to release the claim before the space).
    range: Option<SharedRange>,
    /// It was granted to the peer before ([`SlotCore::mark_sent`]).
    sent: AtomicBool,
}

impl SlotCore {
    /// Marks it as sent to the peer; whether it had been sent before.
    pub(crate) fn mark_sent(&self) -> bool {
        self.sent.swap(true, Ordering::Relaxed)
    }

    /// Segment id.
    pub(crate) fn segment(&self) -> u32 {
        self.seg
    }

    /// Offset of the slot in its segment.
    pub(crate) fn offset(&self) -> usize {
        self.range.as_ref().map(SharedRange::offset).unwrap_or(0)
    }

    /// The slot's bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        self.range.as_ref().map(|r| &r.as_slice()[..self.len]).unwrap_or(&[])
    }

    /// Address of the first byte.
    pub(crate) fn addr(&self) -> usize {
        self.bytes().as_ptr() as usize
    }
}

impl Drop for SlotCore {
    fn drop(&mut self) {
        let addr = self.addr();
        let Some(range) = self.range.take() else { return };
        let (off, len) = (range.offset(), range.len());
        // Release the claim first, then offer the space: a new claim of it must succeed.
        drop(range);
        if let Some(pool) = self.pool.upgrade() {
            {
                let mut st = pool.lock();
                if st.live.get(&addr).is_some_and(|w| w.strong_count() == 0) {
                    st.live.remove(&addr);
                }
            }
            pool.give_back(self.seg, off, len);
        }
    }
}

/// Owner of a pool tensor's `Bytes`.
pub(crate) struct PoolBytes(pub(crate) Arc<SlotCore>);

impl AsRef<[u8]> for PoolBytes {
    fn as_ref(&self) -> &[u8] {
        self.0.bytes()
    }
}

/// A writable slot inside a `TensorMut`.
pub(crate) struct PoolSlotMut {
    pool: Weak<Pool>,
    seg: u32,
    len: usize,
    range: Option<ExclusiveRange>,
}

impl PoolSlotMut {
    pub(crate) fn new(pool: &Arc<Pool>, seg: u32, len: usize, range: ExclusiveRange) -> Self {
        PoolSlotMut { pool: Arc::downgrade(pool), seg, len, range: Some(range) }
    }

    /// Freezes into a registered slot.
    pub(crate) fn into_core(mut self) -> Option<Arc<SlotCore>> {
        let range = self.range.take()?.freeze();
        let core = Arc::new(SlotCore {
            pool: self.pool.clone(),
            seg: self.seg,
            len: self.len,
            range: Some(range),
            sent: AtomicBool::new(false),
        });
        if let Some(p) = self.pool.upgrade() {
            p.register(&core);
        }
        Some(core)
    }
}

impl Drop for PoolSlotMut {
    fn drop(&mut self) {
        // Dropped unfrozen: release the claim, then the space.
        if let Some(r) = self.range.take() {
            let (off, len) = (r.offset(), r.len());
            drop(r);
            if let Some(p) = self.pool.upgrade() {
                p.give_back(self.seg, off, len);
            }
        }
    }
}

impl WritableStorage for PoolSlotMut {
    fn bytes(&self) -> &[u8] {
        self.range.as_ref().map(|r| &r.as_slice()[..self.len]).unwrap_or(&[])
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        self.range.as_mut().map(|r| &mut r.as_mut_slice()[..len]).unwrap_or(&mut [])
    }

    fn freeze(self: Box<Self>) -> Bytes {
        match (*self).into_core() {
            Some(core) => Bytes::from_owner(PoolBytes(core)),
            None => Bytes::new(),
        }
    }
}

#[cfg(test)]
mod tests;
