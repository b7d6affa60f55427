//! The narrow interface between the channel's logic and the CUDA driver: [`Driver`].
//!
//! Everything above this trait (descriptors, the handle cache, leases, the pool, the
//! session) is plain Rust and is tested with the in-memory driver of the `fake` module
//! (feature `__testing`); everything below it is the real driver ([`crate::sys::CudaDriver`], the only unsafe code
//! of the crate).
//!
//! Contract every implementation keeps (the fake checks the callers against it):
//! - Devices are named by their ordinal **in this process** (`cuda:N`); across processes
//!   they are matched by [`DeviceInfo::uuid`] only.
//! - Memory from [`Driver::alloc`] is exportable ([`Driver::mem_handle`] works on its base).
//! - [`Driver::open_mem_handle`] never opens a handle this process exported (it fails), and
//!   opening a handle that is already open returns the same mapping and counts it; each
//!   open is balanced by one [`Driver::close_mem_handle`].
//! - Every pointer and event id is checked against what the implementation handed out (or,
//!   for pointers, against the driver's own allocation table): a wrong value is an error,
//!   never undefined behaviour.
//! - Work is ordered on one stream per device: the legacy default stream, which
//!   synchronises with every blocking stream of the device's primary context.
//!   [`Driver::event_record`], [`Driver::wait_event`] and [`Driver::copy_dtod`] are
//!   enqueued on it and return at once.

use std::fmt;

/// Size of a CUDA IPC handle (`CUipcMemHandle`, `CUipcEventHandle`) in bytes.
pub const HANDLE_BYTES: usize = 64;

/// A CUDA IPC handle (memory or event): 64 opaque bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IpcHandle(pub [u8; HANDLE_BYTES]);

impl fmt::Debug for IpcHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IpcHandle(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "..)")
    }
}

/// An event, as numbered by the driver implementation (not a raw `CUevent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(pub u64);

/// A device this process can use for IPC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Ordinal in this process (`cuda:N`); depends on `CUDA_VISIBLE_DEVICES`.
    pub ordinal: u32,
    /// The device's UUID as `nvidia-smi -L` prints it (`GPU-xxxxxxxx-xxxx-...`), the same in
    /// every process.
    pub uuid: String,
    /// Marketing name, for logs.
    pub name: String,
}

/// A failed driver call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CUDA {op} failed: {detail}")]
pub struct DriverError {
    /// The operation (e.g. `cuIpcOpenMemHandle`).
    pub op: &'static str,
    /// The `CUresult` code, when the driver returned one.
    pub code: Option<i32>,
    /// What happened (the driver's error name, or why the call was refused before it).
    pub detail: String,
}

impl DriverError {
    /// An error refused before reaching the driver (bad argument, not viable).
    pub fn refused(op: &'static str, detail: impl Into<String>) -> Self {
        DriverError { op, code: None, detail: detail.into() }
    }
}

/// The CUDA driver operations the channel needs, and nothing more.
pub trait Driver: Send + Sync + 'static {
    /// The process id used for the same-process rule (the real driver: this process's).
    fn process_id(&self) -> u32;

    /// Loads and initialises the driver (once; later calls return the cached answer) and
    /// lists the devices usable for IPC. `Err` says why the channel is not viable here.
    fn probe(&self) -> Result<Vec<DeviceInfo>, String>;

    /// Allocates `len > 0` bytes of exportable device memory on `dev` (`cuMemAlloc`).
    fn alloc(&self, dev: u32, len: u64) -> Result<u64, DriverError>;

    /// Frees memory from [`Driver::alloc`] (the base pointer).
    fn free(&self, dev: u32, ptr: u64) -> Result<(), DriverError>;

    /// The IPC handle of an allocation's base (`cuIpcGetMemHandle`).
    fn mem_handle(&self, dev: u32, ptr: u64) -> Result<IpcHandle, DriverError>;

    /// Maps another process's allocation on `dev` (`cuIpcOpenMemHandle`); returns its
    /// address here and the allocation's real size.
    fn open_mem_handle(&self, dev: u32, handle: &IpcHandle) -> Result<(u64, u64), DriverError>;

    /// Unmaps what [`Driver::open_mem_handle`] returned (one count).
    fn close_mem_handle(&self, dev: u32, ptr: u64) -> Result<(), DriverError>;

    /// Creates an interprocess event (timing disabled) on `dev`.
    fn event_create(&self, dev: u32) -> Result<EventId, DriverError>;

    /// The IPC handle of an event from [`Driver::event_create`].
    fn event_handle(&self, dev: u32, ev: EventId) -> Result<IpcHandle, DriverError>;

    /// Opens another process's event on `dev`.
    fn event_open(&self, dev: u32, handle: &IpcHandle) -> Result<EventId, DriverError>;

    /// Destroys an event (created or opened).
    fn event_destroy(&self, dev: u32, ev: EventId) -> Result<(), DriverError>;

    /// Records `ev` on `dev`'s stream: it completes after all work enqueued before.
    fn event_record(&self, dev: u32, ev: EventId) -> Result<(), DriverError>;

    /// Blocks until `ev`'s latest recording has completed.
    fn event_sync(&self, dev: u32, ev: EventId) -> Result<(), DriverError>;

    /// Makes later work on `dev`'s stream wait for `ev`'s latest recording (no host wait).
    fn wait_event(&self, dev: u32, ev: EventId) -> Result<(), DriverError>;

    /// Enqueues a device-to-device copy of `len` bytes on `dev`'s stream.
    fn copy_dtod(&self, dev: u32, dst: u64, src: u64, len: u64) -> Result<(), DriverError>;

    /// Copies host bytes to device memory, ordered after the stream's work; returns when done.
    fn copy_htod(&self, dev: u32, dst: u64, src: &[u8]) -> Result<(), DriverError>;

    /// Copies device memory to host bytes, ordered after the stream's work; returns when done.
    fn copy_dtoh(&self, dev: u32, dst: &mut [u8], src: u64) -> Result<(), DriverError>;
}
