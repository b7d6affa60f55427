//! The producer's pool of exportable device memory: slabs from [`Driver::alloc`] (legacy
//! `cuMemAlloc`, so `cuIpcGetMemHandle` works on them), carved into slots (first fit,
//! coalescing free lists), with a byte limit per device.
//!
//! A slot's life: [`Pool::alloc`] -> [`Slot`] (an `Arc`, inside a [`PoolBuffer`], inside a
//! `Tensor`) -> shared with the leases the peer holds -> back to the free list when the last
//! reference drops. Empty slabs are freed when room is needed under the limit, or by
//! [`Pool::trim`]; every session that sent a freed slab is told (a `retire` control
//! message), so the peer closes its mapping. Allocation ids are unique in the process and
//! never reused, even when the driver hands out the same address again.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use ferry_core::{ChannelError, Device, DeviceBuffer, LimitError};
use tokio::sync::Notify;

use crate::driver::{Driver, IpcHandle};

/// Alignment of every slot (CUDA's own allocation alignment).
pub(crate) const SLOT_ALIGN: u64 = 256;
/// Slabs grow in multiples of this (the driver's allocation granularity).
const SLAB_GRANULE: u64 = 2 << 20;

static NEXT_ALLOC_ID: AtomicU64 = AtomicU64::new(1);

/// Told when a slab it sent is freed.
pub(crate) trait RetireSink: Send + Sync + 'static {
    /// Allocation `alloc_id` was freed.
    fn retire(&self, alloc_id: u64);
}

/// Free ranges of one slab (offset -> length), first fit, coalescing. Pure.
#[derive(Debug)]
pub(crate) struct Carve {
    size: u64,
    free: BTreeMap<u64, u64>,
}

impl Carve {
    /// All of `size` bytes free.
    pub(crate) fn new(size: u64) -> Self {
        Carve { size, free: BTreeMap::from([(0, size)]) }
    }

    /// Takes `len` bytes (a multiple of [`SLOT_ALIGN`]) at the first fitting offset.
    pub(crate) fn take(&mut self, len: u64) -> Option<u64> {
        let (&off, &flen) = self.free.iter().find(|(_, l)| **l >= len)?;
        self.free.remove(&off);
        if flen > len {
            self.free.insert(off + len, flen - len);
        }
        Some(off)
    }

    /// Gives `[off, off + len)` back, merging with free neighbours.
    pub(crate) fn give(&mut self, off: u64, len: u64) {
        let (mut off, mut len) = (off, len);
        if let Some((&p, &pl)) = self.free.range(..off).next_back()
            && p + pl == off
        {
            self.free.remove(&p);
            off = p;
            len += pl;
        }
        if let Some(nl) = self.free.remove(&(off + len)) {
            len += nl;
        }
        self.free.insert(off, len);
    }

    /// True when nothing is taken.
    pub(crate) fn is_all_free(&self) -> bool {
        self.free.get(&0) == Some(&self.size)
    }
}

/// One exportable device allocation; freed through the driver when the last owner (the
/// pool or a slot) drops it.
pub(crate) struct SlabMem {
    driver: Arc<dyn Driver>,
    /// Local device ordinal.
    pub(crate) dev: u32,
    /// Base address.
    pub(crate) base: u64,
    /// Size in bytes.
    pub(crate) size: u64,
    /// IPC handle of the base.
    pub(crate) handle: IpcHandle,
    /// Process-unique id.
    pub(crate) id: u64,
}

impl Drop for SlabMem {
    fn drop(&mut self) {
        if let Err(e) = self.driver.free(self.dev, self.base) {
            tracing::warn!(alloc = self.id, "freeing a cuda-ipc slab failed: {e}");
        }
    }
}

struct SlabEntry {
    mem: Arc<SlabMem>,
    carve: Carve,
    sent_to: Vec<Weak<dyn RetireSink>>,
}

#[derive(Default)]
struct State {
    slabs: BTreeMap<u64, SlabEntry>,
    reserved: HashMap<u32, u64>,
}

/// Pool options.
#[derive(Debug, Clone)]
pub(crate) struct PoolOpts {
    /// Most bytes of slabs per device.
    pub(crate) limit: u64,
    /// Size of a new slab (a larger tensor gets a slab of its own size).
    pub(crate) slab_bytes: u64,
    /// How long an allocation waits for room.
    pub(crate) full_wait: Duration,
}

/// The pool of one channel (shared by its sessions).
pub(crate) struct Pool {
    driver: Arc<dyn Driver>,
    opts: PoolOpts,
    state: Mutex<State>,
    freed: Notify,
}

/// A claimed range of a slab: the owner of a pool tensor's memory and of every lease on it.
pub(crate) struct Slot {
    pool: Weak<Pool>,
    /// The slab (kept alive by the slot).
    pub(crate) mem: Arc<SlabMem>,
    /// Offset of the slot in the slab.
    pub(crate) offset: u64,
    claim: u64,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot").field("alloc", &self.mem.id).field("offset", &self.offset).finish_non_exhaustive()
    }
}

impl Slot {
    /// Device address of the slot's first byte.
    pub(crate) fn ptr(&self) -> u64 {
        self.mem.base + self.offset
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.give_back(self.mem.id, self.offset, self.claim);
        }
    }
}

/// A range of a slot, as a tensor's device storage.
pub(crate) struct PoolBuffer {
    /// The slot.
    pub(crate) slot: Arc<Slot>,
    /// Offset of the range in the slot.
    pub(crate) start: u64,
    /// Length of the range.
    pub(crate) len: u64,
}

impl DeviceBuffer for PoolBuffer {
    fn device(&self) -> Device {
        Device::Cuda(self.slot.mem.dev)
    }
    fn device_ptr(&self) -> u64 {
        self.slot.ptr() + self.start
    }
    fn len(&self) -> usize {
        self.len as usize
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pool {
    pub(crate) fn new(driver: Arc<dyn Driver>, opts: PoolOpts) -> Arc<Pool> {
        Arc::new(Pool { driver, opts, state: Mutex::default(), freed: Notify::new() })
    }

    /// Slabs held.
    pub(crate) fn slabs(&self) -> usize {
        lock(&self.state).slabs.len()
    }

    /// Bytes of slabs held, all devices.
    pub(crate) fn reserved(&self) -> u64 {
        lock(&self.state).reserved.values().sum()
    }

    /// A slot of at least `len` bytes on `dev`; waits for room as the options say and gives
    /// up when `closed` turns true.
    pub(crate) async fn alloc(
        self: &Arc<Self>,
        dev: u32,
        len: u64,
        closed: Option<&mut tokio::sync::watch::Receiver<bool>>,
    ) -> Result<Arc<Slot>, ChannelError> {
        let need = len.max(1).checked_next_multiple_of(SLOT_ALIGN).ok_or(ferry_core::MetaError::Overflow)?;
        if need > self.opts.limit {
            return Err(self.full_error(dev, need, "a tensor larger than the whole pool"));
        }
        let deadline = tokio::time::Instant::now() + self.opts.full_wait;
        let mut closed = closed;
        loop {
            let notified = self.freed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(slot) = self.try_alloc(dev, need)? {
                return Ok(slot);
            }
            if self.opts.full_wait.is_zero() {
                return Err(self.full_error(dev, need, "pool full"));
            }
            let closed_fut = async {
                match closed.as_deref_mut() {
                    Some(c) => {
                        let _ = c.wait_for(|c| *c).await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(ChannelError::Timeout(self.opts.full_wait, format!(
                        "cuda-ipc pool full: no room for {need} bytes on cuda:{dev} within {:?} \
                         (pool_limit = {} bytes per device, all in use by tensors or leases; raise \
                         CudaIpcOptions::pool_limit or CudaIpcOptions::full_wait)",
                        self.opts.full_wait, self.opts.limit)));
                }
                _ = closed_fut => return Err(ChannelError::Closed),
            }
        }
    }

    fn full_error(&self, dev: u32, need: u64, what: &str) -> ChannelError {
        let reserved = lock(&self.state).reserved.get(&dev).copied().unwrap_or(0);
        ChannelError::Limit(LimitError {
            limit: "pool_limit",
            what: "cuda-ipc pool bytes needed",
            value: reserved.saturating_add(need),
            max: self.opts.limit,
            hint: format!("{what}; raise CudaIpcOptions::pool_limit (per device) on the sending side").into(),
        })
    }

    /// Tries once: a slot, or `None` when the device is at its limit.
    fn try_alloc(self: &Arc<Self>, dev: u32, need: u64) -> Result<Option<Arc<Slot>>, ChannelError> {
        let mut st = lock(&self.state);
        for e in st.slabs.values_mut().filter(|e| e.mem.dev == dev) {
            if let Some(offset) = e.carve.take(need) {
                return Ok(Some(self.slot(e.mem.clone(), offset, need)));
            }
        }
        let size = need.max(self.opts.slab_bytes).next_multiple_of(SLAB_GRANULE);
        let reserved = st.reserved.get(&dev).copied().unwrap_or(0);
        let mut retired = Vec::new();
        if reserved + size > self.opts.limit {
            // Make room by freeing this device's empty slabs.
            retired = Self::take_empty(&mut st, Some(dev));
            if st.reserved.get(&dev).copied().unwrap_or(0) + size > self.opts.limit {
                drop(st);
                Self::retire(retired);
                return Ok(None);
            }
        }
        let fresh = self.new_slab(dev, size);
        let out = match fresh {
            Ok(mem) => {
                let mem = Arc::new(mem);
                let mut carve = Carve::new(size);
                let offset = carve.take(need).unwrap_or(0);
                *st.reserved.entry(dev).or_default() += size;
                st.slabs.insert(mem.id, SlabEntry { mem: mem.clone(), carve, sent_to: Vec::new() });
                tracing::debug!(dev, size, alloc = mem.id, "cuda-ipc pool grew");
                Ok(Some(self.slot(mem, offset, need)))
            }
            Err(e) => Err(e),
        };
        drop(st);
        Self::retire(retired);
        out
    }

    fn new_slab(&self, dev: u32, size: u64) -> Result<SlabMem, ChannelError> {
        let base = self.driver.alloc(dev, size).map_err(backend)?;
        let handle = match self.driver.mem_handle(dev, base) {
            Ok(h) => h,
            Err(e) => {
                let _ = self.driver.free(dev, base);
                return Err(backend(e));
            }
        };
        let id = NEXT_ALLOC_ID.fetch_add(1, Ordering::Relaxed);
        Ok(SlabMem { driver: self.driver.clone(), dev, base, size, handle, id })
    }

    fn slot(self: &Arc<Self>, mem: Arc<SlabMem>, offset: u64, claim: u64) -> Arc<Slot> {
        Arc::new(Slot { pool: Arc::downgrade(self), mem, offset, claim })
    }

    fn give_back(&self, id: u64, offset: u64, claim: u64) {
        if let Some(e) = lock(&self.state).slabs.get_mut(&id) {
            e.carve.give(offset, claim);
        }
        self.freed.notify_waiters();
    }

    /// Remembers that `sink` sent slab `alloc_id` to its peer (told when it is freed).
    pub(crate) fn note_sent(&self, alloc_id: u64, sink: &Arc<dyn RetireSink>) {
        let mut st = lock(&self.state);
        if let Some(e) = st.slabs.get_mut(&alloc_id) {
            e.sent_to.retain(|w| w.strong_count() > 0);
            if !e.sent_to.iter().any(|w| std::ptr::addr_eq(w.as_ptr(), Arc::as_ptr(sink))) {
                e.sent_to.push(Arc::downgrade(sink));
            }
        }
    }

    /// Frees every empty slab (of `dev`, or of all devices); returns how many.
    pub(crate) fn trim(&self, dev: Option<u32>) -> usize {
        let retired = Self::take_empty(&mut lock(&self.state), dev);
        let n = retired.len();
        Self::retire(retired);
        n
    }

    fn take_empty(st: &mut State, dev: Option<u32>) -> Vec<SlabEntry> {
        let ids: Vec<u64> = st
            .slabs
            .values()
            .filter(|e| dev.is_none_or(|d| e.mem.dev == d) && e.carve.is_all_free())
            .map(|e| e.mem.id)
            .collect();
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(e) = st.slabs.remove(&id) {
                if let Some(r) = st.reserved.get_mut(&e.mem.dev) {
                    *r -= e.mem.size;
                }
                out.push(e);
            }
        }
        out
    }

    /// Frees retired slabs (outside the lock) and tells the sessions that sent them.
    fn retire(slabs: Vec<SlabEntry>) {
        for e in slabs {
            let id = e.mem.id;
            drop(e.mem);
            for sink in e.sent_to.iter().filter_map(Weak::upgrade) {
                sink.retire(id);
            }
            tracing::debug!(alloc = id, "cuda-ipc slab freed");
        }
    }
}

pub(crate) fn backend(e: crate::driver::DriverError) -> ChannelError {
    ChannelError::Backend(Arc::new(e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakeGpu;

    #[test]
    fn carving_first_fit_and_coalescing() {
        let mut c = Carve::new(1024);
        let a = c.take(256).unwrap();
        let b = c.take(512).unwrap();
        let d = c.take(256).unwrap();
        assert_eq!((a, b, d), (0, 256, 768));
        assert!(c.take(256).is_none());
        c.give(b, 512);
        assert_eq!(c.take(256), Some(256), "first fit reuses the hole");
        c.give(256, 256);
        c.give(a, 256);
        c.give(d, 256);
        assert!(c.is_all_free(), "neighbours merged back into one range");
        assert_eq!(c.take(1024), Some(0));
    }

    fn opts(limit: u64) -> PoolOpts {
        PoolOpts { limit, slab_bytes: 4 << 20, full_wait: Duration::ZERO }
    }

    struct Sink(Mutex<Vec<u64>>);
    impl RetireSink for Sink {
        fn retire(&self, id: u64) {
            lock(&self.0).push(id);
        }
    }

    #[tokio::test]
    async fn slabs_are_reused_limited_and_retired() {
        let gpu = FakeGpu::new(1);
        let drv = gpu.process(100);
        let pool = Pool::new(drv.clone(), opts(12 << 20));
        let a = pool.alloc(0, 1000, None).await.unwrap();
        let b = pool.alloc(0, 1000, None).await.unwrap();
        assert!(Arc::ptr_eq(&a.mem, &b.mem), "one slab, two slots");
        assert_eq!(b.ptr() - a.ptr(), 1024, "slots are 256-byte aligned");
        assert_eq!((pool.slabs(), pool.reserved()), (1, 4 << 20));
        // A second slab fits the limit; a third (6 MiB) does not.
        let big = pool.alloc(0, 4 << 20, None).await.unwrap();
        assert_eq!(pool.slabs(), 2);
        let e = pool.alloc(0, 5 << 20, None).await.unwrap_err();
        assert!(e.to_string().contains("CudaIpcOptions::pool_limit"), "{e}");
        // A session sent the big slab; once it is empty, the next allocation that needs room
        // frees it and the session hears of it.
        let sink = Arc::new(Sink(Mutex::default()));
        let dyn_sink: Arc<dyn RetireSink> = sink.clone();
        pool.note_sent(big.mem.id, &dyn_sink);
        pool.note_sent(big.mem.id, &dyn_sink);
        let big_id = big.mem.id;
        drop(big);
        assert_eq!(drv.live_allocs(), 2);
        let again = pool.alloc(0, 5 << 20, None).await.unwrap();
        assert_ne!(again.mem.id, big_id, "ids are never reused");
        assert_eq!(*lock(&sink.0), [big_id], "told once, though noted twice");
        assert_eq!((pool.slabs(), pool.reserved(), drv.live_allocs()), (2, 10 << 20, 2));
        drop((a, b, again));
        assert_eq!(pool.trim(None), 2);
        assert_eq!((pool.slabs(), pool.reserved(), drv.live_allocs()), (0, 0, 0));
    }

    #[tokio::test]
    async fn retire_reaches_the_sessions_that_sent_the_slab() {
        let gpu = FakeGpu::new(1);
        let pool = Pool::new(gpu.process(100), opts(64 << 20));
        let slot = pool.alloc(0, 10, None).await.unwrap();
        let id = slot.mem.id;
        let sink = Arc::new(Sink(Mutex::default()));
        let dyn_sink: Arc<dyn RetireSink> = sink.clone();
        pool.note_sent(id, &dyn_sink);
        assert_eq!(pool.trim(None), 0, "a slab in use is not freed");
        drop(slot);
        assert_eq!(pool.trim(None), 1);
        assert_eq!(*lock(&sink.0), [id]);
    }

    #[tokio::test]
    async fn waits_for_room_and_gives_up_on_close() {
        let gpu = FakeGpu::new(1);
        let o = PoolOpts { limit: 4 << 20, slab_bytes: 4 << 20, full_wait: Duration::from_secs(10) };
        let pool = Pool::new(gpu.process(100), o);
        let held = pool.alloc(0, 4 << 20, None).await.unwrap();
        let p2 = pool.clone();
        let waiter = tokio::spawn(async move { p2.alloc(0, 4 << 20, None).await.map(|s| s.ptr()) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        let ptr = held.ptr();
        drop(held);
        assert_eq!(waiter.await.unwrap().unwrap(), ptr, "the freed slot was handed to the waiter");
        let held = pool.alloc(0, 4 << 20, None).await.unwrap();
        let (tx, mut rx) = tokio::sync::watch::channel(false);
        let p3 = pool.clone();
        let waiter = tokio::spawn(async move { p3.alloc(0, 1, Some(&mut rx)).await.map(drop) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        tx.send_replace(true);
        assert!(matches!(waiter.await.unwrap(), Err(ChannelError::Closed)));
        drop(held);
    }

    #[tokio::test]
    async fn driver_failures_are_errors() {
        let gpu = FakeGpu::new(1);
        let drv = gpu.process(100);
        let pool = Pool::new(drv.clone(), opts(64 << 20));
        drv.fail_next("cuMemAlloc", 1);
        assert!(matches!(pool.alloc(0, 10, None).await, Err(ChannelError::Backend(_))));
        drv.fail_next("cuIpcGetMemHandle", 1);
        assert!(matches!(pool.alloc(0, 10, None).await, Err(ChannelError::Backend(_))));
        assert_eq!(drv.live_allocs(), 0, "the allocation whose handle failed was freed");
        assert!(pool.alloc(0, 10, None).await.is_ok());
        assert!(pool.alloc(0, u64::MAX, None).await.is_err());
    }
}
