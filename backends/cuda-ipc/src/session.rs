//! One pipe's cuda-ipc session: encodes device tensors as IPC descriptors (granting leases),
//! decodes the peer's descriptors into mapped tensors (through the handle cache), handles
//! releases and retirements, and batches its own.
//!
//! Ordering: a producer records its IPC event after the writes (every descriptor carries
//! it) and the consumer makes its stream wait on it before the tensor is handed out. A
//! release carries the consumer's event, recorded after its last use; the producer's stream
//! waits on it before the memory can be written again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use async_trait::async_trait;
use ferry_core::wire::{CudaIpcRef, CudaIpcReturnRef, Location};
use ferry_core::{
    ChannelError, ChannelSession, ControlOut, ControlWaker, Device, DeviceBuffer, Incoming, LimitError, Outgoing,
    SendTicket, SessionCtx, Storage, Tensor, TensorMeta,
};

use crate::cache::{AllocCache, CacheError, EventCache};
use crate::descriptor::{self, Control, Desc, ReturnDesc};
use crate::driver::{DeviceInfo, Driver, EventId, IpcHandle};
use crate::lease::{Grants, Held, Pending};
use crate::pool::{Pool, PoolBuffer, RetireSink, Slot, backend};
use crate::{CudaIpcOptions, WaitMode};

pub(crate) const NAME: &str = "cuda-ipc";
/// Most peer events one session keeps open.
const PEER_EVENTS: usize = 64;

pub(crate) fn bad(reason: impl Into<String>) -> ChannelError {
    ChannelError::BadDescriptor { channel: NAME, reason: reason.into() }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn control_out(body: &Control) -> ControlOut {
    ControlOut::new(NAME, body)
}

/// An event created or opened through the driver; destroyed on drop.
pub(crate) struct EventGuard {
    driver: Arc<dyn Driver>,
    dev: u32,
    id: EventId,
    /// Its IPC handle (own events only).
    handle: Option<IpcHandle>,
}

impl Drop for EventGuard {
    fn drop(&mut self) {
        let _ = self.driver.event_destroy(self.dev, self.id);
    }
}

/// A peer allocation mapped into this process; closed when the last user drops it.
pub(crate) struct Mapping {
    driver: Arc<dyn Driver>,
    dev: u32,
    ptr: u64,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if let Err(e) = self.driver.close_mem_handle(self.dev, self.ptr) {
            tracing::warn!("closing a cuda-ipc mapping failed: {e}");
        }
    }
}

/// A lease this side granted.
struct Granted {
    slot: Arc<Slot>,
    start: u64,
    len: u64,
    /// The sent buffer itself, held as long as the lease (not only its slot): an owner that
    /// tracks the buffer weakly (ferry-store's superseded versions) sees it alive while a
    /// peer holds it.
    _buf: Option<Arc<dyn DeviceBuffer>>,
}

struct PeerState {
    allocs: AllocCache<Mapping>,
    events: EventCache<EventGuard>,
    held: Held,
}

#[derive(Default)]
struct Counters {
    copies_in: AtomicU64,
    returns_sent: AtomicU64,
    returns_received: AtomicU64,
    releases_sent: AtomicU64,
    retires_received: AtomicU64,
}

/// What a session and its buffers share.
pub(crate) struct Core {
    driver: Arc<dyn Driver>,
    alive: AtomicBool,
    granted: Mutex<Grants<Granted>>,
    peer: Mutex<PeerState>,
    own_events: Mutex<HashMap<u32, Arc<EventGuard>>>,
    pending: Mutex<Pending>,
    /// Tells the pipe's writer that releases or retirements are pending.
    waker: ControlWaker,
    counters: Counters,
}

impl RetireSink for Core {
    fn retire(&self, alloc_id: u64) {
        if self.alive.load(Ordering::Acquire) {
            lock(&self.pending).retire(alloc_id);
            self.waker.wake();
        }
    }
}

impl Core {
    /// This side's IPC event on `dev` (created once).
    fn own_event(&self, dev: u32) -> Result<Arc<EventGuard>, ChannelError> {
        let mut evs = lock(&self.own_events);
        if let Some(e) = evs.get(&dev) {
            return Ok(e.clone());
        }
        let id = self.driver.event_create(dev).map_err(backend)?;
        let mut g = EventGuard { driver: self.driver.clone(), dev, id, handle: None };
        g.handle = Some(self.driver.event_handle(dev, id).map_err(backend)?);
        let g = Arc::new(g);
        evs.insert(dev, g.clone());
        Ok(g)
    }

    /// Records this side's event on `dev` after the work enqueued so far; its handle.
    fn record(&self, dev: u32) -> Result<IpcHandle, ChannelError> {
        let ev = self.own_event(dev)?;
        self.driver.event_record(dev, ev.id).map_err(backend)?;
        ev.handle.ok_or_else(|| bad("own event without a handle"))
    }

    /// Makes `dev`'s stream wait for the peer's event `handle` (opened once, cached).
    fn wait_peer(&self, dev: u32, handle: &IpcHandle, mode: WaitMode) -> Result<(), ChannelError> {
        let cached = lock(&self.peer).events.get(dev, handle);
        let ev = match cached {
            Some(e) => e,
            None => {
                let id = self.driver.event_open(dev, handle).map_err(backend)?;
                let e = Arc::new(EventGuard { driver: self.driver.clone(), dev, id, handle: None });
                lock(&self.peer).events.insert(dev, *handle, e.clone());
                e
            }
        };
        self.driver.wait_event(dev, ev.id).map_err(backend)?;
        if mode == WaitMode::Host {
            self.driver.event_sync(dev, ev.id).map_err(backend)?;
        }
        Ok(())
    }

    /// The pipe closed: ends every lease both ways and forgets the peer's objects.
    fn close(&self) {
        self.alive.store(false, Ordering::Release);
        let grants = lock(&self.granted).reclaim();
        tracing::debug!(reclaimed = grants.len(), "cuda-ipc pipe closed: reclaiming leases the peer held");
        drop(grants);
        let mut p = lock(&self.peer);
        let maps = p.allocs.clear();
        p.events.clear();
        p.held.clear();
        drop(p);
        drop(maps);
        *lock(&self.pending) = Pending::default();
        lock(&self.own_events).clear();
    }
}

/// A received tensor's memory: a lease on a range of the peer's allocation.
pub(crate) struct LeaseBuffer {
    mapping: Arc<Mapping>,
    offset: u64,
    len: u64,
    lease: u64,
    core: Weak<Core>,
}

impl LeaseBuffer {
    /// True once the pipe it came from has closed (its producer may be gone).
    pub(crate) fn orphaned(&self) -> bool {
        self.core.upgrade().is_none_or(|c| !c.alive.load(Ordering::Acquire))
    }
}

impl DeviceBuffer for LeaseBuffer {
    fn device(&self) -> Device {
        Device::Cuda(self.mapping.dev)
    }
    fn device_ptr(&self) -> u64 {
        self.mapping.ptr + self.offset
    }
    fn len(&self) -> usize {
        self.len as usize
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Drop for LeaseBuffer {
    fn drop(&mut self) {
        if let Some(core) = self.core.upgrade()
            && core.alive.load(Ordering::Acquire)
        {
            lock(&core.peer).held.remove(self.lease);
            lock(&core.pending).release(self.mapping.dev, self.lease);
            core.waker.wake();
        }
    }
}

/// One pipe's session.
pub(crate) struct CudaSession {
    ctx: SessionCtx,
    pool: Arc<Pool>,
    opts: CudaIpcOptions,
    devices: Vec<DeviceInfo>,
    core: Arc<Core>,
}

impl CudaSession {
    pub(crate) fn new(
        ctx: SessionCtx,
        driver: Arc<dyn Driver>,
        pool: Arc<Pool>,
        opts: CudaIpcOptions,
        devices: Vec<DeviceInfo>,
    ) -> Arc<Self> {
        let core = Arc::new(Core {
            driver,
            alive: AtomicBool::new(true),
            granted: Mutex::default(),
            peer: Mutex::new(PeerState {
                allocs: AllocCache::new(opts.max_peer_bytes, opts.max_peer_allocs),
                events: EventCache::new(PEER_EVENTS),
                held: Held::default(),
            }),
            own_events: Mutex::default(),
            pending: Mutex::default(),
            waker: ctx.control.clone(),
            counters: Counters::default(),
        });
        Arc::new(CudaSession { ctx, pool, opts, devices, core })
    }

    fn uuid(&self, dev: u32) -> Option<&str> {
        self.devices.iter().find(|d| d.ordinal == dev).map(|d| d.uuid.as_str())
    }

    fn local(&self, uuid: &str) -> Option<u32> {
        self.devices.iter().find(|d| d.uuid == uuid).map(|d| d.ordinal)
    }

    fn alive(&self) -> Result<(), ChannelError> {
        if self.core.alive.load(Ordering::Acquire) { Ok(()) } else { Err(ChannelError::Closed) }
    }

    /// Grants a lease on `[start, start + len)` of `slot` and describes it.
    fn grant(
        &self,
        slot: Arc<Slot>,
        start: u64,
        len: u64,
        buf: Option<Arc<dyn DeviceBuffer>>,
        out: &mut Outgoing,
    ) -> Result<Location, ChannelError> {
        let dev = slot.mem.dev;
        let uuid = self.uuid(dev).ok_or_else(|| bad(format!("cuda:{dev} is not an IPC device")))?.to_string();
        let event = self.core.record(dev)?;
        let sink: Arc<dyn RetireSink> = self.core.clone();
        self.pool.note_sent(slot.mem.id, &sink);
        let (mem, alloc_id, alloc_size, offset) = (slot.mem.handle, slot.mem.id, slot.mem.size, slot.offset + start);
        let lease = lock(&self.core.granted).grant(Granted { slot, start, len, _buf: buf });
        // Not sent after all (a later tensor failed): the peer never hears of the lease.
        out.ticket(|| CudaTicket { core: self.core.clone(), leases: Vec::new() }).leases.push(lease);
        let d = Desc { uuid, mem, alloc_id, alloc_size, offset, len, event, lease };
        Ok(Location::CudaIpc(descriptor::encode(&d)))
    }

    fn decode_ipc(&self, meta: TensorMeta, r: &CudaIpcRef) -> Result<Tensor, ChannelError> {
        let d = descriptor::decode(r, self.opts.max_peer_bytes).map_err(bad)?;
        let dev = self.local(&d.uuid).ok_or_else(|| bad(format!("device {} is not visible here", d.uuid)))?;
        let meta = TensorMeta { device: Device::Cuda(dev), ..meta };
        meta.validate(d.len)?;
        let mapping = self.mapping(&d, dev)?;
        self.core.wait_peer(dev, &d.event, self.opts.wait)?;
        if !lock(&self.core.peer).held.insert(d.lease) {
            return Err(bad(format!("lease {} granted twice", d.lease)));
        }
        let buf =
            LeaseBuffer { mapping, offset: d.offset, len: d.len, lease: d.lease, core: Arc::downgrade(&self.core) };
        Ok(Tensor::from_device(meta, Arc::new(buf))?)
    }

    /// The mapping of the descriptor's allocation: cached (same handle bytes) or opened.
    fn mapping(&self, d: &Desc, dev: u32) -> Result<Arc<Mapping>, ChannelError> {
        let mut peer = lock(&self.core.peer);
        let cache_err = |e| match e {
            CacheError::Inconsistent(why) => bad(why),
            CacheError::Limit { limit, value, max } => ChannelError::Limit(LimitError {
                limit,
                what: "peer CUDA memory mapped by this pipe",
                value,
                max,
                hint: format!("raise CudaIpcOptions::{limit} (CudaIpcChannel::with_options) on the receiving side")
                    .into(),
            }),
        };
        if let Some(m) = peer.allocs.lookup(d.alloc_id, &d.mem, d.alloc_size, dev).map_err(cache_err)? {
            return Ok(m);
        }
        peer.allocs.check_room(d.alloc_size).map_err(cache_err)?;
        let (ptr, size) = self.core.driver.open_mem_handle(dev, &d.mem).map_err(backend)?;
        let m = Arc::new(Mapping { driver: self.core.driver.clone(), dev, ptr });
        if size < d.alloc_size {
            return Err(bad(format!(
                "allocation {} claims {} bytes but the driver mapped {size}",
                d.alloc_id, d.alloc_size
            )));
        }
        peer.allocs.insert(d.alloc_id, d.mem, d.alloc_size, dev, m.clone());
        Ok(m)
    }

    fn decode_return(&self, meta: TensorMeta, r: &CudaIpcReturnRef) -> Result<Tensor, ChannelError> {
        let d = descriptor::decode_return(r).map_err(bad)?;
        let (slot, start, glen) = {
            let granted = lock(&self.core.granted);
            let g = granted.get(d.lease).ok_or_else(|| bad(format!("returned lease {} was never granted", d.lease)))?;
            (g.slot.clone(), g.start, g.len)
        };
        if d.offset.checked_add(d.len).is_none_or(|end| end > glen) {
            return Err(bad(format!(
                "returned range {}+{} is outside lease {} of {glen} bytes",
                d.offset, d.len, d.lease
            )));
        }
        let dev = slot.mem.dev;
        let meta = TensorMeta { device: Device::Cuda(dev), ..meta };
        meta.validate(d.len)?;
        self.core.wait_peer(dev, &d.event, self.opts.wait)?;
        self.core.counters.returns_received.fetch_add(1, Ordering::Relaxed);
        Ok(Tensor::from_device(meta, Arc::new(PoolBuffer { slot, start: start + d.offset, len: d.len }))?)
    }

    fn handle_release(&self, c: &Control) -> Result<(), ChannelError> {
        let uuid = c.device.as_deref().unwrap_or_default();
        let dev = self.local(uuid).ok_or_else(|| bad(format!("release names device {uuid}, not visible here")))?;
        let event = descriptor::handle_from_b64("event", c.event.as_deref().unwrap_or_default()).map_err(bad)?;
        let not_granted = |id| bad(format!("release of lease {id}, which is not granted"));
        {
            let granted = lock(&self.core.granted);
            granted.check(&c.release).map_err(not_granted)?;
            let elsewhere = c.release.iter().filter_map(|id| granted.get(*id)).find(|g| g.slot.mem.dev != dev);
            if let Some(g) = elsewhere {
                return Err(bad(format!("release names device {uuid} for a lease on cuda:{}", g.slot.mem.dev)));
            }
        }
        // The memory may be written again only after the peer's last read.
        self.core.wait_peer(dev, &event, WaitMode::Stream)?;
        let mut granted = lock(&self.core.granted);
        let freed = granted.release(&c.release).map_err(not_granted)?;
        // Back to the pool before the lease count drops for anyone watching it.
        drop(freed);
        drop(granted);
        Ok(())
    }
}

#[async_trait]
impl ChannelSession for CudaSession {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn encode(&self, tensor: &Tensor, out: &mut Outgoing) -> Result<Location, ChannelError> {
        let Device::Cuda(dev) = tensor.device() else {
            return Err(ChannelError::Unsupported {
                channel: NAME,
                reason: format!("tensor is on {}", tensor.device()),
            });
        };
        let Storage::Device(buf) = tensor.storage() else {
            return Err(ChannelError::Unsupported { channel: NAME, reason: "tensor is not in device memory".into() });
        };
        self.alive()?;
        if self.uuid(dev).is_none() {
            return Err(ChannelError::Unsupported {
                channel: NAME,
                reason: format!("cuda:{dev} is not an IPC device"),
            });
        }
        let any = buf.as_any();
        if let Some(lb) = any.downcast_ref::<LeaseBuffer>()
            && lb.core.upgrade().is_some_and(|c| Arc::ptr_eq(&c, &self.core))
        {
            // The peer's own memory: send it back by reference (it never opens its handle).
            let event = self.core.record(dev)?;
            self.core.counters.returns_sent.fetch_add(1, Ordering::Relaxed);
            let d = ReturnDesc { lease: lb.lease, offset: 0, len: lb.len, event };
            return Ok(Location::CudaIpcReturn(descriptor::encode_return(&d)));
        }
        if let Some(lb) = any.downcast_ref::<LeaseBuffer>()
            && lb.orphaned()
        {
            return Err(ChannelError::Closed);
        }
        if let Some(pb) = any.downcast_ref::<PoolBuffer>() {
            // Already exportable memory (pipe.alloc_device, or returned to us): no copy.
            return self.grant(pb.slot.clone(), pb.start, pb.len, Some(buf.clone()), out);
        }
        // Anywhere else: one device-to-device copy into the pool, on the stream.
        let len = buf.len() as u64;
        let mut closed = self.ctx.closed.clone();
        let slot = self.pool.alloc(dev, len, Some(&mut closed)).await?;
        self.core.driver.copy_dtod(dev, slot.ptr(), buf.device_ptr(), len).map_err(backend)?;
        self.core.counters.copies_in.fetch_add(1, Ordering::Relaxed);
        self.grant(slot, 0, len, None, out)
    }

    async fn decode(&self, meta: TensorMeta, loc: &Location, _: &mut Incoming) -> Result<Tensor, ChannelError> {
        if !matches!(meta.device, Device::Cuda(_)) {
            return Err(bad(format!("cuda-ipc tensor claims device {}", meta.device)));
        }
        match loc {
            Location::CudaIpc(r) => self.decode_ipc(meta, r),
            Location::CudaIpcReturn(r) => self.decode_return(meta, r),
            other => Err(bad(format!("unexpected location {other:?}"))),
        }
    }

    async fn alloc_device(&self, meta: &TensorMeta) -> Result<Option<Tensor>, ChannelError> {
        let Device::Cuda(dev) = meta.device else { return Ok(None) };
        if self.uuid(dev).is_none() {
            return Err(ChannelError::Unsupported {
                channel: NAME,
                reason: format!("cuda:{dev} is not an IPC device"),
            });
        }
        self.alive()?;
        let len = meta.byte_span()?;
        let mut closed = self.ctx.closed.clone();
        let slot = self.pool.alloc(dev, len, Some(&mut closed)).await?;
        Ok(Some(Tensor::from_device(meta.clone(), Arc::new(PoolBuffer { slot, start: 0, len }))?))
    }

    fn leases_granted(&self) -> usize {
        lock(&self.core.granted).len()
    }

    fn stats(&self) -> serde_json::Value {
        let c = &self.core.counters;
        let peer = lock(&self.core.peer);
        serde_json::json!({
            "slabs": self.pool.slabs(),
            "pool_bytes": self.pool.reserved(),
            "leases_granted": lock(&self.core.granted).len(),
            "leases_held": peer.held.len(),
            "peer_allocs": peer.allocs.len(),
            "peer_mapped_bytes": peer.allocs.mapped_bytes(),
            "peer_events": peer.events.len(),
            "stale_evictions": peer.allocs.stale_evictions(),
            "copies_in": c.copies_in.load(Ordering::Relaxed),
            "returns_sent": c.returns_sent.load(Ordering::Relaxed),
            "returns_received": c.returns_received.load(Ordering::Relaxed),
            "releases_sent": c.releases_sent.load(Ordering::Relaxed),
            "retires_received": c.retires_received.load(Ordering::Relaxed),
        })
    }

    fn poll_control(&self, _now: std::time::Instant, out: &mut Vec<ControlOut>) -> Option<std::time::Instant> {
        self.pending_controls(out);
        None
    }

    fn close(&self) {
        self.core.close();
    }

    fn control(&self, body: &serde_json::value::RawValue, _: &mut Incoming) -> Result<(), ChannelError> {
        let c = descriptor::decode_control(body).map_err(bad)?;
        if !c.release.is_empty() {
            self.handle_release(&c)?;
        }
        for &id in &c.retire {
            let m = lock(&self.core.peer).allocs.retire(id);
            self.core.counters.retires_received.fetch_add(1, Ordering::Relaxed);
            drop(m); // closes the mapping here unless a tensor still uses it
        }
        Ok(())
    }
}

/// The leases one message grants: forgotten if it is not sent (the peer never hears of them).
struct CudaTicket {
    core: Arc<Core>,
    leases: Vec<u64>,
}

impl SendTicket for CudaTicket {
    fn aborted(self: Box<Self>) {
        drop(lock(&self.core.granted).release(&self.leases));
    }
}

impl CudaSession {
    /// The batched releases (each with an event recorded after this side's last use of the
    /// leases) and retirements, as CONTROL frames.
    fn pending_controls(&self, out: &mut Vec<ControlOut>) {
        let (releases, retires) = lock(&self.core.pending).take();
        for (dev, leases) in releases {
            let Some(uuid) = self.uuid(dev).map(str::to_string) else { continue };
            let event = match self.core.record(dev) {
                Ok(h) => descriptor::handle_to_b64(&h),
                Err(e) => {
                    // Without an event the owner could overwrite memory still being read:
                    // keep those leases (they end when the pipe closes).
                    tracing::warn!("cuda-ipc: cannot record the release event, keeping {} leases: {e}", leases.len());
                    continue;
                }
            };
            let n = leases.len() as u64;
            let body = Control { release: leases, device: Some(uuid), event: Some(event), retire: Vec::new() };
            out.push(control_out(&body));
            self.core.counters.releases_sent.fetch_add(n, Ordering::Relaxed);
        }
        if !retires.is_empty() {
            out.push(control_out(&Control { retire: retires, ..Default::default() }));
        }
    }
}

/// True when `t` was received over a pipe that has since closed.
pub(crate) fn is_orphaned(t: &Tensor) -> bool {
    t.device_buffer().and_then(|b| b.as_any().downcast_ref::<LeaseBuffer>()).is_some_and(LeaseBuffer::orphaned)
}
