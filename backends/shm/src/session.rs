//! One pipe's shm session: encodes tensors as pool descriptors (granting leases), decodes
//! the peer's descriptors into lease-backed tensors, and batches releases.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use ferry_core::inline::decode_inline;
use ferry_core::wire::{Location, SegmentAnnounce, ShmControl, ShmRef, ShmReturnRef};
use ferry_core::{
    ChannelError, ChannelSession, ControlOut, Device, Incoming, LimitError, Outgoing, SendTicket, SessionCtx, Storage,
    Tensor, TensorMeta, TensorMut,
};
use smallvec::SmallVec;

use crate::ShmOptions;
use crate::batch::Batcher;
use crate::pool::{Holders, Pool, PoolSlotMut, SlotCore};
use crate::shared::{self, Forgets, SharedSegment};
use crate::span::AddrSpan;
use crate::sys::{PeerSegment, PeerSegmentError};

const NAME: &str = "shm";

fn bad(reason: impl Into<String>) -> ChannelError {
    ChannelError::BadDescriptor { channel: NAME, reason: reason.into() }
}

/// Memory this side lends: a slot of the pipe's pool, or a shared segment.
#[derive(Clone)]
enum Source {
    Slot(Arc<SlotCore>),
    Shared(Arc<SharedSegment>),
}

impl Source {
    fn bytes(&self) -> &[u8] {
        match self {
            Source::Slot(core) => core.bytes(),
            Source::Shared(seg) => seg.as_slice(),
        }
    }
}

/// A lease this side granted: the peer may read these bytes until it releases.
struct Granted {
    core: Source,
    /// Offset of the leased range inside the slot.
    start: usize,
    len: usize,
    /// The peer released it, or never got it (its message was not sent). Dropped unsettled
    /// (the pipe closed while the peer held it), a shared segment's lease withholds the
    /// segment from its pool: the peer may still read it ([`crate::SharedPool`]).
    settled: bool,
}

impl Drop for Granted {
    fn drop(&mut self) {
        if !self.settled
            && let Source::Shared(seg) = &self.core
        {
            seg.withhold();
        }
    }
}

/// What this side knows of the peer's memory.
#[derive(Default)]
struct PeerState {
    segs: HashMap<u64, Arc<PeerSegment>>,
    /// Segment id by mapping address.
    by_addr: BTreeMap<usize, u64>,
    /// Leases held: (segment, start, lease) -> (len, granted with `lazy_release`).
    held: BTreeMap<(u64, usize, u64), (usize, bool)>,
    /// The ids of `held`.
    held_ids: HashSet<u64>,
    mapped: u64,
    /// Leases named (`shm_return`) by messages whose place on the wire is not fixed yet, and
    /// by how many: a release of one must wait, or it could overtake the message.
    named: HashMap<u64, u32>,
    /// Leases dropped while named: (lease, len), released once no message names them.
    deferred: HashMap<u64, usize>,
}

/// One pipe's session.
pub(crate) struct ShmSession {
    ctx: SessionCtx,
    opts: ShmOptions,
    pool: Arc<Pool>,
    granted: Arc<Mutex<HashMap<u64, Granted>>>,
    next_lease: AtomicU64,
    peer: Arc<Mutex<PeerState>>,
    /// Covers every peer segment ever mapped (`name_held`'s first look).
    peer_span: AddrSpan,
    batcher: Arc<Batcher>,
    /// Whether the peer takes `forget` (and so may be lent shared segments).
    forget_ok: bool,
    /// Shared segments announced to the peer, and those gone, for the peer to forget.
    forgets: Arc<Forgets>,
    /// This session, for its tickets and leases: one weak reference each (one atomic
    /// write to take and one to let go), not one per part they use.
    me: Weak<ShmSession>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ShmSession {
    pub(crate) fn new(ctx: SessionCtx, opts: ShmOptions) -> Arc<Self> {
        let ctx_forget_ok = ctx.has_feature(ferry_core::wire::FEATURE_SHM_FORGET);
        Arc::new_cyclic(|me| ShmSession {
            me: me.clone(),
            pool: Pool::new(opts.clone(), ctx_forget_ok, ctx.control.clone()),
            peer_span: AddrSpan::new(),
            batcher: Arc::new(Batcher::new(&opts, ctx.control.clone())),
            forgets: Arc::new(Forgets::new(ctx.control.clone())),
            ctx,
            opts,
            granted: Arc::default(),
            next_lease: AtomicU64::new(1),
            peer: Arc::default(),
            forget_ok: ctx_forget_ok,
        })
    }

    /// This session's ticket in the message being built.
    fn ticket<'o>(&self, out: &'o mut Outgoing) -> &'o mut ShmTicket {
        out.ticket(|| ShmTicket {
            session: self.me.clone(),
            grants: SmallVec::new(),
            pool_announced: Vec::new(),
            shared_announced: Vec::new(),
            named: SmallVec::new(),
            returns_urgent: false,
        })
    }

    /// Lends `len` bytes at `start` of a shared segment.
    fn grant_shared(
        &self,
        seg: Arc<SharedSegment>,
        start: usize,
        len: usize,
        out: &mut Outgoing,
    ) -> Result<Location, ChannelError> {
        let lease = self.next_lease.fetch_add(1, Ordering::Relaxed);
        let id = seg.id();
        let announce = if lock(&self.forgets.announced).insert(id) {
            self.ticket(out).shared_announced.push((id, Arc::downgrade(&seg)));
            let fd = seg.dup_fd().map_err(|e| ChannelError::Backend(Arc::new(e)))?;
            let idx = out.attach_fd(fd);
            Some(SegmentAnnounce { fd: idx as u32, size: seg.len() as u64 })
        } else {
            None
        };
        self.record_grant(lease, Granted { core: Source::Shared(seg), start, len, settled: false }, out);
        Ok(Location::Shm(ShmRef {
            segment: id,
            offset: start as u64,
            len: len as u64,
            lease,
            announce,
            lazy_release: false,
        }))
    }

    /// Where this side's pool bytes are: the leases the peer holds on them.
    fn holders(&self) -> Holders {
        let granted = lock(&self.granted);
        let on_pool = granted.values().filter(|g| matches!(g.core, Source::Slot(_)));
        let (leases, leased_bytes) = on_pool.fold((0, 0u64), |(n, b), g| (n + 1, b + g.len as u64));
        Holders { leases, leased_bytes }
    }

    fn record_grant(&self, lease: u64, g: Granted, out: &mut Outgoing) {
        lock(&self.granted).insert(lease, g);
        self.ticket(out).grants.push(lease);
    }

    fn grant(
        &self,
        core: Arc<SlotCore>,
        start: usize,
        len: usize,
        out: &mut Outgoing,
    ) -> Result<Location, ChannelError> {
        let lease = self.next_lease.fetch_add(1, Ordering::Relaxed);
        let segment = core.segment();
        let offset = (core.offset() + start) as u64;
        let announce = if self.pool.mark_announced(segment, true) {
            None
        } else {
            let seg = self.pool.segment(segment).ok_or_else(|| bad("unknown own segment"))?;
            self.ticket(out).pool_announced.push(segment);
            let fd = seg.dup_fd().map_err(|e| ChannelError::Backend(Arc::new(e)))?;
            let idx = out.attach_fd(fd);
            Some(SegmentAnnounce { fd: idx as u32, size: seg.len() as u64 })
        };
        // A slot sent before is a buffer sent again and again: this side keeps using it,
        // and the peer's release of it frees nothing this side waits for (PROTOCOL.md
        // §11.5). A slot sent for the first time (a copy made for this message) may be
        // waited for: its release is due at once when large.
        let lazy_release = core.mark_sent();
        self.record_grant(lease, Granted { core: Source::Slot(core), start, len, settled: false }, out);
        Ok(Location::Shm(ShmRef {
            segment: u64::from(segment),
            offset,
            len: len as u64,
            lease,
            announce,
            lazy_release,
        }))
    }

    /// The lease (and offset in it) through which `[ptr, ptr+len)` is the peer's memory,
    /// named by the message being built in `out` until its place on the wire is fixed, so
    /// that the lease's release (if its last handle is dropped meanwhile: it need not be
    /// this tensor's own lease when several cover the range) cannot overtake the message.
    fn name_held(&self, ptr: usize, len: usize, out: &mut Outgoing) -> Option<(u64, u64)> {
        if !self.peer_span.may_hold(ptr, len) {
            return None;
        }
        let mut peer = lock(&self.peer);
        let (lease, offset, lease_len, lazy) = Self::find_held(&peer, ptr, len)?;
        *peer.named.entry(lease).or_insert(0) += 1;
        drop(peer);
        // The peer may wait for this memory, and its release is due as soon as it is
        // dropped (it fills a batch alone): send the release with the message. A smaller
        // lease's release waits for its batch whatever order this takes.
        let urgent = !lazy && lease_len as u64 >= self.opts.release_batch_bytes;
        let ticket = self.ticket(out);
        ticket.named.push(lease);
        ticket.returns_urgent |= urgent;
        Some((lease, offset))
    }

    /// The lease (and offset in it) through which `[ptr, ptr+len)` is the peer's memory,
    /// the lease's length, and whether the peer granted it with `lazy_release`.
    fn find_held(peer: &PeerState, ptr: usize, len: usize) -> Option<(u64, u64, usize, bool)> {
        let (&base, &seg_id) = peer.by_addr.range(..=ptr).next_back()?;
        let seg = peer.segs.get(&seg_id)?;
        let off = ptr - base;
        if off + len > seg.len() {
            return None;
        }
        let (&(s, start, lease), &(llen, lazy)) =
            peer.held.range((seg_id, 0, 0)..=(seg_id, off, u64::MAX)).next_back()?;
        (s == seg_id && off >= start && off + len <= start + llen).then_some((lease, (off - start) as u64, llen, lazy))
    }

    fn open_segment(
        &self,
        peer: &mut PeerState,
        id: u64,
        a: SegmentAnnounce,
        incoming: &mut Incoming,
    ) -> Result<(), ChannelError> {
        if peer.segs.contains_key(&id) {
            return Err(bad(format!("segment {id} announced twice")));
        }
        let fd = incoming
            .take_fd(a.fd as usize)
            .ok_or_else(|| bad(format!("announced descriptor {} is not in the frame", a.fd)))?;
        if peer.mapped.saturating_add(a.size) > self.opts.max_peer_bytes {
            return Err(ChannelError::Limit(LimitError {
                limit: "max_peer_bytes",
                what: "bytes of peer shared memory mapped",
                value: peer.mapped.saturating_add(a.size),
                max: self.opts.max_peer_bytes,
                hint: "raise ShmOptions::max_peer_bytes (ShmChannel::with_options) on the receiving side".into(),
            }));
        }
        let seg = PeerSegment::open(fd, a.size).map_err(|e| match e {
            PeerSegmentError::NotSealed(why) => bad(format!("segment {id} refused: {why}")),
            PeerSegmentError::WrongSize { announced, actual } => {
                bad(format!("segment {id} announced as {announced} bytes but is {actual}"))
            }
            PeerSegmentError::Io(e) => ChannelError::Backend(Arc::new(e)),
        })?;
        peer.mapped += a.size;
        self.peer_span.add(seg.addr(), seg.len());
        peer.by_addr.insert(seg.addr(), id);
        peer.segs.insert(id, Arc::new(seg));
        Ok(())
    }

    fn decode_shm(&self, meta: TensorMeta, r: &ShmRef, incoming: &mut Incoming) -> Result<Tensor, ChannelError> {
        let mut peer = lock(&self.peer);
        if let Some(a) = r.announce {
            self.open_segment(&mut peer, r.segment, a, incoming)?;
        }
        let seg = peer.segs.get(&r.segment).cloned().ok_or_else(|| bad(format!("unknown segment {}", r.segment)))?;
        let (start, len) = match (usize::try_from(r.offset), usize::try_from(r.len)) {
            (Ok(s), Ok(l)) if s.checked_add(l).is_some_and(|e| e <= seg.len()) => (s, l),
            _ => {
                return Err(bad(format!(
                    "range {}+{} is outside segment {} of {} bytes",
                    r.offset,
                    r.len,
                    r.segment,
                    seg.len()
                )));
            }
        };
        if !peer.held_ids.insert(r.lease) {
            return Err(bad(format!("lease {} granted twice", r.lease)));
        }
        peer.held.insert((r.segment, start, r.lease), (len, r.lazy_release));
        drop(peer);
        let owner = LeaseBytes { seg, seg_id: r.segment, start, len, lease: r.lease, session: self.me.clone() };
        Ok(Tensor::new(meta, Bytes::from_owner(owner))?)
    }

    /// The peer will never use these segments again: unmap them (once no tensor of this
    /// side refers to them).
    fn forget(&self, ids: &[u64]) -> Result<(), ChannelError> {
        if !self.forget_ok {
            return Err(bad("forget without the shm_forget feature"));
        }
        let mut peer = lock(&self.peer);
        for &id in ids {
            let Some(seg) = peer.segs.get(&id) else {
                return Err(bad(format!("forget of segment {id}, which is not mapped")));
            };
            if peer.held.range((id, 0, 0)..=(id, usize::MAX, u64::MAX)).next().is_some() {
                return Err(bad(format!("forget of segment {id}, on which leases are held")));
            }
            let (addr, len) = (seg.addr(), seg.len() as u64);
            peer.by_addr.remove(&addr);
            peer.segs.remove(&id);
            peer.mapped = peer.mapped.saturating_sub(len);
        }
        Ok(())
    }

    /// Decodes any location this channel sends (none of them waits).
    fn decode_any(&self, meta: TensorMeta, loc: &Location, incoming: &mut Incoming) -> Result<Tensor, ChannelError> {
        if meta.device != Device::Cpu {
            return Err(bad(format!("shm tensor claims device {}", meta.device)));
        }
        match loc {
            Location::Inline(_) => decode_inline(meta, loc, incoming),
            Location::Shm(r) => self.decode_shm(meta, r, incoming),
            Location::ShmReturn(r) => self.decode_return(meta, r),
            other => Err(bad(format!("unexpected location {other:?}"))),
        }
    }

    fn decode_return(&self, meta: TensorMeta, r: &ShmReturnRef) -> Result<Tensor, ChannelError> {
        let granted = lock(&self.granted);
        let g = granted.get(&r.lease).ok_or_else(|| bad(format!("returned lease {} was never granted", r.lease)))?;
        let (off, len) = match (usize::try_from(r.offset), usize::try_from(r.len)) {
            (Ok(o), Ok(l)) if o.checked_add(l).is_some_and(|e| e <= g.len) => (g.start + o, l),
            _ => {
                return Err(bad(format!(
                    "returned range {}+{} is outside lease {} of {} bytes",
                    r.offset, r.len, r.lease, g.len
                )));
            }
        };
        let owner = Returned { core: g.core.clone(), off, len };
        drop(granted);
        Ok(Tensor::new(meta, Bytes::from_owner(owner))?)
    }
}

#[async_trait]
impl ChannelSession for ShmSession {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn encode(&self, tensor: &Tensor, out: &mut Outgoing) -> Result<Location, ChannelError> {
        if let Some(done) = self.encode_now(tensor, out) {
            return done;
        }
        // Anywhere else: one copy into the pool (`encode_now` took every other case).
        let Storage::Host(bytes) = tensor.storage() else {
            return Err(ChannelError::Unsupported { channel: NAME, reason: "tensor is not in host memory".into() });
        };
        let n = bytes.len();
        let mut closed = self.ctx.closed.clone();
        let (seg, range) = self.pool.alloc(n, &mut closed, || self.holders()).await?;
        let mut slot = PoolSlotMut::new(&self.pool, seg, n, range);
        ferry_core::WritableStorage::bytes_mut(&mut slot).copy_from_slice(bytes);
        let core = slot.into_core().ok_or_else(|| bad("slot vanished"))?;
        self.grant(core, 0, n, out)
    }

    /// Every case of `encode` but the copy into the pool (which may wait for room).
    fn encode_now(&self, tensor: &Tensor, out: &mut Outgoing) -> Option<Result<Location, ChannelError>> {
        if tensor.device() != Device::Cpu {
            return Some(Err(ChannelError::Unsupported {
                channel: NAME,
                reason: format!("tensor is on {}", tensor.device()),
            }));
        }
        let Storage::Host(bytes) = tensor.storage() else {
            return Some(Err(ChannelError::Unsupported {
                channel: NAME,
                reason: "tensor is not in host memory".into(),
            }));
        };
        let (ptr, n) = (bytes.as_ptr() as usize, bytes.len());
        if n == 0 {
            return Some(Ok(Location::Inline(out.push_payload(Bytes::new()))));
        }
        // Already in this pipe's pool (pipe.alloc): no copy.
        if let Some(core) = self.pool.find(ptr, n) {
            let start = ptr - core.addr();
            return Some(self.grant(core, start, n, out));
        }
        // A shared segment (a store's bucket), lent to a peer that will unmap it when told.
        if self.forget_ok
            && let Some((seg, start)) = shared::find(ptr, n)
        {
            return Some(self.grant_shared(seg, start, n, out));
        }
        // The peer's own memory, leased to us: send it back by reference.
        if let Some((lease, offset)) = self.name_held(ptr, n, out) {
            return Some(Ok(Location::ShmReturn(ShmReturnRef { lease, offset, len: n as u64 })));
        }
        if n < self.opts.inline_below {
            return Some(Ok(Location::Inline(out.push_payload(bytes.clone()))));
        }
        None
    }

    async fn decode(&self, meta: TensorMeta, loc: &Location, incoming: &mut Incoming) -> Result<Tensor, ChannelError> {
        self.decode_any(meta, loc, incoming)
    }

    fn decode_now(
        &self,
        meta: TensorMeta,
        loc: &Location,
        incoming: &mut Incoming,
    ) -> Option<Result<Tensor, ChannelError>> {
        Some(self.decode_any(meta, loc, incoming))
    }

    async fn alloc(&self, meta: &TensorMeta) -> Result<Option<TensorMut>, ChannelError> {
        let len = usize::try_from(meta.byte_span()?).map_err(|_| ferry_core::MetaError::Overflow)?;
        if len == 0 || meta.device != Device::Cpu {
            return Ok(None);
        }
        let mut closed = self.ctx.closed.clone();
        let (seg, range) = self.pool.alloc(len, &mut closed, || self.holders()).await?;
        let slot = PoolSlotMut::new(&self.pool, seg, len, range);
        Ok(Some(TensorMut::from_storage(meta.clone(), Box::new(slot))?))
    }

    fn leases_granted(&self) -> usize {
        lock(&self.granted).len()
    }

    fn stats(&self) -> serde_json::Value {
        let peer = lock(&self.peer);
        let (segments, reserved, created, given_back) = self.pool.counts();
        serde_json::json!({
            "segments": segments,
            "reserved_bytes": reserved,
            "used_bytes": self.pool.used(),
            "segments_created": created,
            "segments_given_back": given_back,
            "leases_granted": lock(&self.granted).len(),
            "peer_segments": peer.segs.len(),
            "peer_mapped_bytes": peer.mapped,
            "leases_held": peer.held.len(),
        })
    }

    fn poll_control(&self, now: Instant, out: &mut Vec<ControlOut>) -> Option<Instant> {
        let (release, next) = match self.batcher.poll(now) {
            Ok(ids) => (ids, None),
            Err(next) => (Vec::new(), next),
        };
        // Idle pool segments are given back here, and the peer told to forget them (behind
        // any message that leased them: this runs on the writer, in wire order).
        let next = match (next, self.pool.give_back_idle(now)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut forget = self.forgets.take();
        forget.extend(self.pool.take_forgets());
        if !release.is_empty() || !forget.is_empty() {
            out.push(ControlOut::new(NAME, &ShmControl { release, forget }));
        }
        next
    }

    fn close(&self) {
        self.batcher.closed.store(true, Ordering::Relaxed);
        lock(&self.batcher.pending).take();
        let leases = std::mem::take(&mut *lock(&self.granted));
        tracing::debug!(reclaimed = leases.len(), "shm pipe closed: reclaiming leases the peer held");
        drop(leases);
        // Tensors still held keep their own mapping alive; forget the rest.
        let peer = std::mem::take(&mut *lock(&self.peer));
        drop(peer);
    }

    fn control(&self, body: &serde_json::value::RawValue, _: &mut Incoming) -> Result<(), ChannelError> {
        let c: ShmControl = serde_json::from_str(body.get()).map_err(|e| bad(format!("control message: {e}")))?;
        if !c.forget.is_empty() {
            self.forget(&c.forget)?;
        }
        let mut granted = lock(&self.granted);
        let mut freed = Vec::with_capacity(c.release.len());
        for id in c.release {
            match granted.remove(&id) {
                Some(mut g) => {
                    g.settled = true;
                    freed.push(g);
                }
                None => return Err(bad(format!("release of lease {id}, which is not granted"))),
            }
        }
        drop(granted);
        drop(freed); // slots go back to the pool here, outside the lock
        Ok(())
    }
}

/// What one message did in this session, settled as it goes out or does not
/// ([`ferry_core::ticket`]).
struct ShmTicket {
    session: Weak<ShmSession>,
    /// Leases it grants: forgotten if it is not sent.
    grants: SmallVec<[u64; 2]>,
    /// Pool segments it announces: not announced after all if it is not sent.
    pool_announced: Vec<u32>,
    /// Shared segments it announces: once it is sent, the peer is told to forget each when
    /// it goes; if it is not sent, not announced after all.
    shared_announced: Vec<(u64, Weak<SharedSegment>)>,
    /// The peer's leases it names (`shm_return`): their release waits until it is placed.
    named: SmallVec<[u64; 2]>,
    /// One of `named` was granted without `lazy_release` (the peer may wait for its
    /// memory: a slot it copied into for one message) and covers at least
    /// [`ShmOptions::release_batch_bytes`] (its release is due once it is dropped).
    returns_urgent: bool,
}

impl SendTicket for ShmTicket {
    fn placed(&mut self) {
        if self.named.is_empty() {
            return;
        }
        let Some(s) = self.session.upgrade() else { return };
        for &lease in &self.named {
            s.unname(lease);
        }
    }

    fn returns_peer_memory(&self) -> bool {
        self.returns_urgent
    }

    fn sent(self: Box<Self>) {
        if self.shared_announced.is_empty() {
            return;
        }
        let Some(s) = self.session.upgrade() else { return };
        for (_, seg) in &self.shared_announced {
            if let Some(seg) = seg.upgrade() {
                seg.announced_to(&s.forgets);
            }
        }
    }

    fn aborted(self: Box<Self>) {
        let Some(s) = self.session.upgrade() else { return };
        {
            let mut g = lock(&s.granted);
            for lease in &self.grants {
                if let Some(mut never_sent) = g.remove(lease) {
                    never_sent.settled = true;
                }
            }
        }
        for &segment in &self.pool_announced {
            s.pool.mark_announced(segment, false);
        }
        let mut announced = lock(&s.forgets.announced);
        for (id, _) in &self.shared_announced {
            announced.remove(id);
        }
    }
}

/// Owner of a received tensor's bytes: a lease on the peer's memory.
struct LeaseBytes {
    seg: Arc<PeerSegment>,
    seg_id: u64,
    start: usize,
    /// Bytes; its release counts them toward [`ShmOptions::release_batch_bytes`], whether
    /// or not the peer granted it with `lazy_release` (PROTOCOL.md §11.5).
    len: usize,
    lease: u64,
    session: Weak<ShmSession>,
}

impl AsRef<[u8]> for LeaseBytes {
    fn as_ref(&self) -> &[u8] {
        // The range was checked against the segment when the lease was decoded.
        self.seg.slice(self.start, self.len).unwrap_or(&[])
    }
}

impl Drop for LeaseBytes {
    fn drop(&mut self) {
        let Some(s) = self.session.upgrade() else { return };
        {
            let mut p = lock(&s.peer);
            p.held.remove(&(self.seg_id, self.start, self.lease));
            p.held_ids.remove(&self.lease);
            if p.named.contains_key(&self.lease) {
                p.deferred.insert(self.lease, self.len);
                return; // released by `unname`, after the message that names it
            }
        }
        s.batcher.push(self.lease, self.len);
    }
}

impl ShmSession {
    /// A message that named `lease` has its place on the wire (or will not be sent): if no
    /// other names it and it was dropped meanwhile, release it now.
    fn unname(&self, lease: u64) {
        let mut p = lock(&self.peer);
        let Some(n) = p.named.get_mut(&lease) else { return };
        *n -= 1;
        if *n > 0 {
            return;
        }
        p.named.remove(&lease);
        let Some(len) = p.deferred.remove(&lease) else { return };
        drop(p);
        self.batcher.push(lease, len);
    }
}

/// Owner of a tensor the peer sent back into our own pool.
struct Returned {
    core: Source,
    off: usize,
    len: usize,
}

impl AsRef<[u8]> for Returned {
    fn as_ref(&self) -> &[u8] {
        self.core.bytes().get(self.off..self.off + self.len).unwrap_or(&[])
    }
}
