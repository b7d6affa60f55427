//! ferry-cuda-ipc: the CUDA IPC channel (name `cuda-ipc`, CUDA tensors): device tensors
//! between processes on one Linux host, without a copy.
//!
//! - **Driver**: the CUDA driver is loaded at run time through cudarc (`dynamic-loading`),
//!   so the crate builds, and the channel runs, with no CUDA installed. Before any driver call
//!   the channel checks that the library is there; no driver, no device, a device in
//!   compute mode *prohibited*, WSL, or `FERRY_CUDA_IPC_DISABLE=1` make the channel *not
//!   viable* with a reason (cached), and the handshake then never offers or picks it. It
//!   never panics for lack of a GPU.
//! - **Memory**: each channel owns a pool of exportable device memory per device: slabs
//!   from the synchronous `cuMemAlloc` (stream-ordered pool memory cannot be exported with
//!   `cuIpcGetMemHandle`), carved into 256-byte aligned slots. [`ferry_core::Pipe::alloc_device`]
//!   returns a tensor in it (contents unspecified, like `torch.empty`), which is then sent
//!   with no copy; a device tensor from anywhere else costs one device-to-device copy on the
//!   stream. [`CudaIpcOptions::pool_limit`] bounds the pool per device.
//! - **Descriptors**: the IPC handle of the allocation's base, the offset and length, the
//!   device UUID, and an IPC event the producer records after its writes; the consumer's
//!   stream waits on that event before the tensor is handed out ([`WaitMode`]). Handles are
//!   base64, 64-bit values JSON numbers at most 2^53 - 1 (see `docs/PROTOCOL.md` §5.5).
//! - **Consumer cache**: opened handles are cached per peer and allocation and reused only
//!   when the handle bytes match (an address reused for a new allocation never hits a stale
//!   mapping); they are closed when the producer retires the allocation or the pipe closes,
//!   once no tensor uses them. A process never opens its own handle: the channel is not
//!   negotiated between two pipes of one process, a tensor sent back to its producer travels
//!   as a reference to the producer's own lease (`cuda_ipc_return`), and the driver layer
//!   refuses handles this process exported. Devices are matched by UUID, never by ordinal,
//!   so peers may see different `CUDA_VISIBLE_DEVICES`.
//! - **Leases**: as in ferry-shm. A received tensor is a lease on the producer's memory;
//!   dropping its last clone queues a release, sent in batches (CONTROL frames) with an event
//!   recorded after the consumer's last use, and the producer's stream waits on that event
//!   before the memory is reused. When a pipe closes (the peer died, or either side
//!   closed), every lease the peer held is reclaimed at once.
//! - **When the producer dies**: the consumer's `recv` fails with `Closed`; tensors it
//!   already holds become *orphaned* ([`is_orphaned`]): their mappings stay open until the
//!   last clone drops (the driver keeps the memory of an open mapping alive, so work already
//!   enqueued never faults), but their contents are no longer guaranteed, and every ferry
//!   operation on them (sending, [`CudaIpcChannel::copy_to_host`]) returns
//!   [`ChannelError::Closed`]. Nothing crashes; copy out what you need before the pipe goes.
//! - **Streams**: ferry orders its work on the legacy default stream of each device's
//!   primary context (the context PyTorch and CuPy use). Work on *blocking* streams is
//!   ordered with it automatically; work on non-blocking streams must be synchronised by the
//!   caller before `send` and after `recv` (or use [`WaitMode::Host`]).
//!
//! Entry point: [`CudaIpcChannel::new`], registered in an [`ferry_core::Endpoint`] first
//! (highest priority); it carries CUDA tensors only, next to a CPU channel. Unsafe code
//! lives only in the [`sys`] module, behind the narrow [`driver::Driver`] interface; the
//! rest is plain Rust, tested with an in-memory driver on machines without a GPU. How to
//! run the GPU tests is in this crate's `README.md`.
//!
//! # Feature flags
//! None. (The facade `ferry` enables this crate with its `cuda-ipc` feature; `__testing`, for
//! tests only, adds the in-memory CUDA driver `fake`, and `fake::set_active`, which makes
//! [`CudaIpcChannel::new`] use a simulated process where a test cannot pass a driver: the
//! Python package's cuda-ipc tests.)

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ferry_core::wire::ChannelOffer;
use ferry_core::{
    Channel, ChannelError, ChannelSession, ConnInfo, Device, DeviceKind, SessionCtx, Storage, Tensor, TensorMeta,
};

mod cache;
mod descriptor;
pub mod driver;
// An in-memory CUDA driver for tests. Test-only, behind the `__testing` feature: not part of
// the API. (A `///` here would make rustdoc resolve the module's own doc links from this
// crate root.)
#[cfg(any(test, feature = "__testing"))]
#[doc(hidden)]
pub mod fake;
mod lease;
mod pool;
mod session;
pub mod sys;
#[cfg(test)]
mod tests;

pub use driver::{DeviceInfo, Driver, DriverError};

use crate::pool::{Pool, PoolOpts, backend};
use crate::session::{CudaSession, LeaseBuffer, NAME};

/// How a consumer waits for the producer's writes before handing a tensor out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WaitMode {
    /// Make the device's legacy default stream wait on the producer's event (no host
    /// wait): later work on blocking streams is ordered after the producer's writes.
    #[default]
    Stream,
    /// Also block the receiving thread until the producer's writes are done (for work on
    /// non-blocking streams, or host-side use).
    Host,
}

/// Options of the cuda-ipc channel.
#[derive(Debug, Clone)]
pub struct CudaIpcOptions {
    /// Most bytes of exportable memory the channel's pool allocates per device (default
    /// 4 GiB). Empty slabs are freed to make room.
    pub pool_limit: u64,
    /// Size of a new slab (default 64 MiB; a larger tensor gets a slab of its own size).
    pub slab_bytes: u64,
    /// How long `send` / `alloc_device` wait for pool room before failing (default 10 s;
    /// zero: fail at once).
    pub full_wait: Duration,
    /// Most bytes of a peer's allocations one pipe maps (default 64 GiB); also the largest
    /// allocation a descriptor may name.
    pub max_peer_bytes: u64,
    /// Most distinct peer allocations one pipe maps (default 4096).
    pub max_peer_allocs: usize,
    /// How received tensors wait for the producer (default [`WaitMode::Stream`]).
    pub wait: WaitMode,
}

impl Default for CudaIpcOptions {
    fn default() -> Self {
        CudaIpcOptions {
            pool_limit: 4 << 30,
            slab_bytes: 64 << 20,
            full_wait: Duration::from_secs(10),
            max_peer_bytes: 64 << 30,
            max_peer_allocs: 4096,
            wait: WaitMode::Stream,
        }
    }
}

/// The CUDA IPC channel.
#[derive(Clone)]
pub struct CudaIpcChannel {
    driver: Arc<dyn Driver>,
    opts: CudaIpcOptions,
    pool: Arc<Pool>,
}

impl std::fmt::Debug for CudaIpcChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaIpcChannel").field("opts", &self.opts).finish_non_exhaustive()
    }
}

impl Default for CudaIpcChannel {
    fn default() -> Self {
        Self::new()
    }
}

impl CudaIpcChannel {
    /// With the real driver and default options. Loads nothing until first used.
    pub fn new() -> Self {
        Self::with_options(CudaIpcOptions::default())
    }

    /// With the real driver and these options.
    pub fn with_options(opts: CudaIpcOptions) -> Self {
        // Tests only (feature `__testing`): a simulated process, where one was set.
        #[cfg(any(test, feature = "__testing"))]
        if let Some(d) = fake::active() {
            return Self::with_driver(d, opts);
        }
        Self::with_driver(sys::CudaDriver::shared(), opts)
    }

    /// Over another [`Driver`] (tests use the in-memory driver of the `__testing` feature).
    #[doc(hidden)]
    pub fn with_driver(driver: Arc<dyn Driver>, opts: CudaIpcOptions) -> Self {
        let pool_opts = PoolOpts { limit: opts.pool_limit, slab_bytes: opts.slab_bytes, full_wait: opts.full_wait };
        CudaIpcChannel { pool: Pool::new(driver.clone(), pool_opts), driver, opts }
    }

    /// The devices usable for IPC here, or why there are none.
    pub fn devices(&self) -> Result<Vec<DeviceInfo>, ChannelError> {
        self.driver.probe().map_err(|e| ChannelError::NotViable(e.into()))
    }

    fn device(&self, d: Device) -> Result<u32, ChannelError> {
        let Device::Cuda(n) = d else {
            return Err(ChannelError::Unsupported { channel: NAME, reason: format!("tensor is on {d}") });
        };
        if self.devices()?.iter().any(|i| i.ordinal == n) {
            Ok(n)
        } else {
            Err(ChannelError::Unsupported { channel: NAME, reason: format!("cuda:{n} is not an IPC device here") })
        }
    }

    /// A device tensor in this channel's exportable pool, outside any pipe (e.g. to fill
    /// before connecting); sending it on a pipe of this channel costs no copy. Its contents
    /// are unspecified until written.
    pub async fn alloc_device(&self, meta: TensorMeta) -> Result<Tensor, ChannelError> {
        let dev = self.device(meta.device)?;
        let len = meta.byte_span()?;
        let slot = self.pool.alloc(dev, len, None).await?;
        Ok(Tensor::from_device(meta, Arc::new(pool::PoolBuffer { slot, start: 0, len }))?)
    }

    /// Copies `src` into device tensor `t` (which must be exactly `src.len()` bytes), ordered
    /// after the device's stream; returns when done. Received tensors are read-only.
    pub fn copy_from_host(&self, t: &Tensor, src: &[u8]) -> Result<(), ChannelError> {
        let dev = self.device(t.device())?;
        let Storage::Device(buf) = t.storage() else {
            return Err(ChannelError::Unsupported { channel: NAME, reason: "tensor is not in device memory".into() });
        };
        if buf.as_any().is::<LeaseBuffer>() {
            return Err(ChannelError::Unsupported { channel: NAME, reason: "received tensors are read-only".into() });
        }
        if src.len() != buf.len() {
            return Err(ChannelError::Unsupported {
                channel: NAME,
                reason: format!("{} bytes given for a tensor of {} bytes", src.len(), buf.len()),
            });
        }
        self.driver.copy_htod(dev, buf.device_ptr(), src).map_err(backend)
    }

    /// The bytes of device tensor `t`, copied to the host after the device's stream (so
    /// after the producer's writes, for a received tensor). Fails with
    /// [`ChannelError::Closed`] for an orphaned tensor ([`is_orphaned`]).
    pub fn copy_to_host(&self, t: &Tensor) -> Result<Vec<u8>, ChannelError> {
        let dev = self.device(t.device())?;
        let Storage::Device(buf) = t.storage() else {
            return Err(ChannelError::Unsupported { channel: NAME, reason: "tensor is not in device memory".into() });
        };
        if is_orphaned(t) {
            return Err(ChannelError::Closed);
        }
        let mut out = vec![0u8; buf.len()];
        self.driver.copy_dtoh(dev, &mut out, buf.device_ptr()).map_err(backend)?;
        Ok(out)
    }

    /// A copy of device tensor `t` in this channel's exportable pool: one device-to-device
    /// copy, finished when this returns (so `t`, a received tensor whose lease then ends,
    /// may be let go at once). Sending the copy on a pipe of this channel costs no copy.
    /// Fails with [`ChannelError::Closed`] for an orphaned tensor ([`is_orphaned`]).
    pub async fn copy_on_device(&self, t: &Tensor) -> Result<Tensor, ChannelError> {
        let dev = self.device(t.device())?;
        let Storage::Device(buf) = t.storage() else {
            return Err(ChannelError::Unsupported { channel: NAME, reason: "tensor is not in device memory".into() });
        };
        if is_orphaned(t) {
            return Err(ChannelError::Closed);
        }
        let len = buf.len() as u64;
        let slot = self.pool.alloc(dev, len, None).await?;
        self.driver.copy_dtod(dev, slot.ptr(), buf.device_ptr(), len).map_err(backend)?;
        let ev = self.driver.event_create(dev).map_err(backend)?;
        let done = self.driver.event_record(dev, ev).and_then(|()| self.driver.event_sync(dev, ev));
        let destroyed = self.driver.event_destroy(dev, ev);
        done.and(destroyed).map_err(backend)?;
        Ok(Tensor::from_device(t.meta().clone(), Arc::new(pool::PoolBuffer { slot, start: 0, len }))?)
    }

    /// Frees every empty slab of the pool now (peers that mapped them are told); returns
    /// how many.
    pub fn trim(&self) -> usize {
        self.pool.trim(None)
    }

    /// Slabs and bytes the pool holds.
    pub fn pool_stats(&self) -> serde_json::Value {
        serde_json::json!({ "slabs": self.pool.slabs(), "pool_bytes": self.pool.reserved() })
    }

    fn domain(&self, devices: &[DeviceInfo]) -> BTreeMap<String, String> {
        let mut d = host_domain().clone();
        d.insert("pid".into(), self.driver.process_id().to_string());
        d.insert("uuids".into(), devices.iter().map(|i| i.uuid.as_str()).collect::<Vec<_>>().join(","));
        d
    }

    fn same_process(&self, conn: &ConnInfo) -> bool {
        conn.peer_pid == Some(self.driver.process_id())
    }
}

/// True when `t` was received over a cuda-ipc pipe that has since closed: its contents are
/// no longer guaranteed and ferry operations on it fail with [`ChannelError::Closed`].
pub fn is_orphaned(t: &Tensor) -> bool {
    session::is_orphaned(t)
}

/// Where this host's processes can share device memory: boot id and pid namespace.
fn host_domain() -> &'static BTreeMap<String, String> {
    static D: OnceLock<BTreeMap<String, String>> = OnceLock::new();
    D.get_or_init(|| {
        let mut d = BTreeMap::new();
        if let Ok(b) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
            d.insert("boot_id".into(), b.trim().to_string());
        }
        if let Ok(l) = std::fs::read_link("/proc/self/ns/pid") {
            d.insert("pid_ns".into(), l.to_string_lossy().into_owned());
        }
        d
    })
}

impl Channel for CudaIpcChannel {
    fn name(&self) -> &'static str {
        NAME
    }

    fn devices(&self) -> &'static [DeviceKind] {
        &[DeviceKind::Cuda]
    }

    fn viability(&self) -> Result<(), ChannelError> {
        if !cfg!(target_os = "linux") {
            return Err(ChannelError::NotViable("the cuda-ipc channel is Linux only".into()));
        }
        for (key, path) in [("boot_id", "/proc/sys/kernel/random/boot_id"), ("pid_ns", "/proc/self/ns/pid")] {
            if !host_domain().contains_key(key) {
                return Err(ChannelError::NotViable(format!("cannot read {path}").into()));
            }
        }
        self.devices().map(drop)
    }

    fn offer(&self, conn: &ConnInfo) -> Option<ChannelOffer> {
        if !conn.same_host || self.same_process(conn) {
            return None;
        }
        let devices = self.driver.probe().ok()?;
        Some(ChannelOffer { name: NAME.into(), devices: vec![DeviceKind::Cuda], domain: self.domain(&devices) })
    }

    fn accepts(&self, offer: &ChannelOffer, conn: &ConnInfo) -> bool {
        let Ok(devices) = self.driver.probe() else { return false };
        let mine = self.domain(&devices);
        let same = |k: &str| mine.get(k).is_some_and(|v| offer.domain.get(k) == Some(v));
        let other_pid =
            offer.domain.get("pid").and_then(|p| p.parse::<u32>().ok()).is_some_and(|p| p != self.driver.process_id());
        let shared_gpu =
            offer.domain.get("uuids").is_some_and(|u| u.split(',').any(|u| devices.iter().any(|d| d.uuid == u)));
        conn.same_host
            && !self.same_process(conn)
            && offer.name == NAME
            && same("boot_id")
            && same("pid_ns")
            && other_pid
            && shared_gpu
    }

    fn open(&self, ctx: SessionCtx) -> Result<Arc<dyn ChannelSession>, ChannelError> {
        let devices = self.devices()?;
        Ok(CudaSession::new(ctx, self.driver.clone(), self.pool.clone(), self.opts.clone(), devices))
    }
}
