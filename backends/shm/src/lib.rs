//! ferry-shm: the shared-memory channel (name `shm`, CPU tensors): zero-copy tensors between
//! processes on one Linux host.
//!
//! - **Memory**: each side owns a pool for what it sends, made of unnamed memfd segments
//!   sealed against shrinking and growing. A segment's descriptor crosses the connection
//!   once (SCM_RIGHTS, attached to the first message that uses it); the receiver checks
//!   the seals and the size and maps it private (copy-on-write: a write by foreign code,
//!   e.g. torch, copies a page and never reaches the sender). Nothing is ever named in
//!   /dev/shm or on disk, so nothing is left behind when a process dies, even by SIGKILL.
//! - **Zero copy**: [`ferry_core::Pipe::alloc`] returns a writable tensor inside the pool;
//!   sending it moves only a descriptor (segment, offset, length, lease). A tensor that lives
//!   elsewhere is copied into the pool exactly once; tensors under
//!   [`ShmOptions::inline_below`] bytes travel inline (a copy is cheaper than a lease there).
//! - **Leases**: the receiver's tensor is a lease on the sender's slot. Dropping its last
//!   clone queues a release; releases go out in batches (CONTROL frames) and the sender
//!   reuses the slot. A received tensor sent back over the same pipe travels as a reference
//!   to the peer's own memory (no copy either way).
//! - **Limits**: [`ShmOptions::pool_limit`] bounds what a side allocates (sends wait up to
//!   [`ShmOptions::full_wait`], then fail naming the limit in the caller's words,
//!   [`ShmOptions::names`]); [`ShmOptions::max_peer_bytes`] bounds what a side maps of its
//!   peer's memory.
//! - **Giving memory back**: a segment no slot of which is in use is unmapped and closed
//!   once it has been empty for [`ShmOptions::idle_release`] (past the
//!   [`ShmOptions::keep_idle_bytes`] kept for the next messages), or at once when a new
//!   segment would not fit under the limit; the peer is told to unmap it too (`forget`,
//!   feature `shm_forget`).
//! - **Shared segments**: [`SharedSegment`]s belong to no pipe (a store's buckets) and are
//!   lent to every pipe; a [`SharedPool`] fills them again once every handle and every
//!   peer's lease let go (never while a peer may still read one).
//! - **Negotiation**: offered only over transports that pass descriptors, accepted only when
//!   both peers share boot id and IPC / network namespaces; otherwise the handshake falls
//!   back to the next channel (inline).
//!
//! Entry point: [`ShmChannel::new`], registered in an [`ferry_core::Endpoint`] before the
//! inline channel. Unsafe code lives only in the `sys` module.
//!
//! # Feature flags
//! None.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ferry_core::wire::ChannelOffer;
use ferry_core::{Channel, ChannelError, ChannelSession, ConnInfo, DeviceKind, SessionCtx};

#[cfg(target_os = "linux")]
mod batch;
#[cfg(target_os = "linux")]
mod cow;
#[cfg(target_os = "linux")]
mod pool;
#[cfg(target_os = "linux")]
mod recycle;
#[cfg(target_os = "linux")]
mod session;
#[cfg(target_os = "linux")]
mod shared;
#[cfg(target_os = "linux")]
mod span;
#[cfg(target_os = "linux")]
mod sys;

#[cfg(target_os = "linux")]
pub use cow::CowBuf;
#[cfg(target_os = "linux")]
pub use recycle::{DEFAULT_IDLE_RELEASE, DEFAULT_KEEP_BYTES, SharedPool, SharedPoolOptions, SharedPoolStats};
#[cfg(target_os = "linux")]
pub use shared::{SharedSegment, SharedSegmentMut};
#[cfg(target_os = "linux")]
pub use sys::discard_private_pages;

/// Off Linux no segment is ever received, so there is nothing to discard: always `false`.
#[cfg(not(target_os = "linux"))]
pub fn discard_private_pages(_addr: usize, _len: usize) -> bool {
    false
}

/// Helpers for tests of hostile peers (descriptors a misbehaving peer might send). Test-only,
/// behind the `__testing` feature: not part of the API.
#[cfg(all(target_os = "linux", feature = "__testing"))]
#[doc(hidden)]
pub mod testing {
    use std::os::fd::OwnedFd;

    /// A sealed memfd of `len` bytes holding `content` at `offset` (as ferry would make).
    pub fn sealed_memfd(len: usize, offset: usize, content: &[u8]) -> std::io::Result<OwnedFd> {
        let seg = crate::sys::OwnSegment::create(len)?;
        if !content.is_empty() {
            let mut w = seg
                .claim(offset, content.len())
                .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "range outside the segment"))?;
            w.as_mut_slice().copy_from_slice(content);
        }
        seg.dup_fd()
    }

    /// A memfd of `len` bytes without seals (which a receiver must refuse).
    pub fn unsealed_memfd(len: u64) -> std::io::Result<OwnedFd> {
        crate::sys::unsealed_memfd(len)
    }
}

/// Options of the shm channel.
#[derive(Debug, Clone)]
pub struct ShmOptions {
    /// Most bytes of segments one pipe's pool may create (default 2 GiB; pages are only
    /// committed when written).
    pub pool_limit: u64,
    /// Size of a new segment (default 64 MiB; a larger tensor gets a segment of its own size).
    pub segment_bytes: usize,
    /// How long `send` / `alloc` wait for pool space before failing (default 10 s; zero:
    /// fail at once).
    pub full_wait: Duration,
    /// Tensors smaller than this that are not already in the pool travel inline (default
    /// 16 KiB).
    pub inline_below: usize,
    /// Most bytes of the peer's segments this side maps (default 16 GiB).
    pub max_peer_bytes: u64,
    /// Releases of the peer's leases wait to go out together: behind the next message this
    /// side sends once this many are pending (default 32) or they cover
    /// [`ShmOptions::release_batch_bytes`], else at most [`ShmOptions::release_delay`] after
    /// the first. A CONTROL frame per call costs a request-response peer (a Python client)
    /// about as much as a tenth of the call.
    pub release_batch: usize,
    /// Pending releases that cover this many bytes of the peer's memory are due at once
    /// (default 16 MiB), so that a peer allocating a large tensor per call gets its memory
    /// back with the answer instead of growing its pool (over a ring, in the same publish
    /// as an answer that returns it: PROTOCOL.md §11.5). Leases the peer granted with
    /// `lazy_release` (memory it keeps using: a buffer it sends again and again) count
    /// their bytes too; their releases only go behind the answer, not with it.
    pub release_batch_bytes: u64,
    /// The longest a release of the peer's lease waits to be batched (default 1 ms; zero:
    /// every release goes out at once, behind the next message or in a frame of its own).
    pub release_delay: Duration,
    /// A segment of the pool no slot of which has been in use for this long is given back:
    /// unmapped and closed here, and the peer told to unmap it (default 250 ms; zero: as soon
    /// as it empties). Segments kept under [`ShmOptions::keep_idle_bytes`] stay. A peer that
    /// did not agree to `shm_forget` cannot be told, so segments it was sent stay until the
    /// connection ends.
    pub idle_release: Duration,
    /// Bytes of empty segments kept however long they idle, so that a steady stream of
    /// messages does not make and unmake segments (default 64 MiB: one segment of the default
    /// size; the largest empty segments go first).
    pub keep_idle_bytes: u64,
    /// How errors name these options: in the words of whoever sets them (Rust, a command
    /// line, Python).
    pub names: ShmOptionNames,
}

/// How the shm channel's errors tell the user to change its options, in the words of the
/// layer that sets them: a Rust field, a command-line flag, a Python argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShmOptionNames {
    /// How to raise [`ShmOptions::pool_limit`] (default: the Rust field, and the flag of
    /// `ferry serve` and `App.serve(shm_pool_mib=...)` for a server).
    pub pool_limit: Cow<'static, str>,
    /// How to lengthen [`ShmOptions::full_wait`]; `None` where the caller cannot set it.
    pub full_wait: Option<Cow<'static, str>>,
}

impl Default for ShmOptionNames {
    fn default() -> Self {
        ShmOptionNames {
            pool_limit: "ShmOptions::pool_limit (ShmChannel::with_options); for a server: `ferry serve \
                         --shm-pool-mib N`, or shm_pool_mib=N of App.serve in Python"
                .into(),
            full_wait: Some("ShmOptions::full_wait".into()),
        }
    }
}

impl Default for ShmOptions {
    fn default() -> Self {
        ShmOptions {
            pool_limit: 2 << 30,
            segment_bytes: 64 << 20,
            full_wait: Duration::from_secs(10),
            inline_below: 16 << 10,
            max_peer_bytes: 16 << 30,
            release_batch: 32,
            release_batch_bytes: 16 << 20,
            release_delay: Duration::from_millis(1),
            idle_release: Duration::from_millis(250),
            keep_idle_bytes: 64 << 20,
            names: ShmOptionNames::default(),
        }
    }
}

/// The shared-memory channel.
#[derive(Debug, Clone, Default)]
pub struct ShmChannel {
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    opts: ShmOptions,
}

impl ShmChannel {
    /// With default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// With these options.
    pub fn with_options(opts: ShmOptions) -> Self {
        ShmChannel { opts }
    }
}

/// Where this process can share memory: boot id and namespaces.
fn domain() -> &'static BTreeMap<String, String> {
    static D: OnceLock<BTreeMap<String, String>> = OnceLock::new();
    D.get_or_init(|| {
        let mut d = BTreeMap::new();
        if let Ok(b) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
            d.insert("boot_id".into(), b.trim().to_string());
        }
        for ns in ["ipc", "net"] {
            if let Ok(l) = std::fs::read_link(format!("/proc/self/ns/{ns}")) {
                d.insert(format!("{ns}_ns"), l.to_string_lossy().into_owned());
            }
        }
        d
    })
}

#[cfg(target_os = "linux")]
fn probe() -> Result<(), String> {
    static P: OnceLock<Result<(), String>> = OnceLock::new();
    P.get_or_init(|| {
        sys::OwnSegment::create(4096).map(drop).map_err(|e| format!("cannot create a sealed memfd: {e}"))?;
        if !domain().contains_key("boot_id") {
            return Err("cannot read /proc/sys/kernel/random/boot_id".into());
        }
        Ok(())
    })
    .clone()
}

#[cfg(not(target_os = "linux"))]
fn probe() -> Result<(), String> {
    Err("the shm channel needs Linux memfd".into())
}

impl Channel for ShmChannel {
    fn name(&self) -> &'static str {
        "shm"
    }

    fn devices(&self) -> &'static [DeviceKind] {
        &[DeviceKind::Cpu]
    }

    fn viability(&self) -> Result<(), ChannelError> {
        probe().map_err(|e| ChannelError::NotViable(e.into()))
    }

    fn offer(&self, conn: &ConnInfo) -> Option<ChannelOffer> {
        (conn.fd_passing && conn.same_host).then(|| ChannelOffer {
            name: "shm".into(),
            devices: vec![DeviceKind::Cpu],
            domain: domain().clone(),
        })
    }

    fn accepts(&self, offer: &ChannelOffer, conn: &ConnInfo) -> bool {
        conn.fd_passing && conn.same_host && offer.name == "shm" && &offer.domain == domain()
    }

    #[cfg(target_os = "linux")]
    fn open(&self, ctx: SessionCtx) -> Result<Arc<dyn ChannelSession>, ChannelError> {
        Ok(session::ShmSession::new(ctx, self.opts.clone()))
    }

    #[cfg(not(target_os = "linux"))]
    fn open(&self, _: SessionCtx) -> Result<Arc<dyn ChannelSession>, ChannelError> {
        Err(ChannelError::NotViable("the shm channel needs Linux memfd".into()))
    }
}
