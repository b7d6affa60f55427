//! The transport layer: [`Transport`] makes [`Listener`]s and [`Connection`]s, which carry
//! bytes (and, on unix, file descriptors) between two processes.
//!
//! Contract (enforced by the conformance suite, `ferry-conformance`):
//! - A connection is a reliable, ordered byte stream in each direction.
//! - End of stream or a dead peer shows as EOF / `BrokenPipe` promptly (well within a second).
//! - If [`ConnInfo::fd_passing`] is true, descriptors given to [`FdQueue::attach`] arrive at the
//!   peer's [`FdQueue`] no later than the first byte written after the attach.
//! - A listener accepts only peers it is configured to trust (by default: the same user).

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::error::TransportError;
use crate::spin::{BusyPoll, ListenerSpin};

/// An address: a scheme and the rest, e.g. `unix:ferry-demo`, `unix:/run/ferry.sock`,
/// `quic://host:4433`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Address {
    scheme: String,
    rest: String,
}

impl Address {
    /// A new address.
    pub fn new(scheme: impl Into<String>, rest: impl Into<String>) -> Self {
        Address { scheme: scheme.into(), rest: rest.into() }
    }

    /// The scheme (`unix`, `quic`).
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// Everything after `scheme:` (for `quic://h:p`, `//h:p`).
    pub fn rest(&self) -> &str {
        &self.rest
    }
}

impl FromStr for Address {
    type Err = TransportError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            Some((scheme, rest))
                if !scheme.is_empty()
                    && scheme.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'-') =>
            {
                if rest.is_empty() {
                    return Err(TransportError::BadAddress {
                        addr: s.into(),
                        reason: "nothing after the scheme".into(),
                    });
                }
                Ok(Address::new(scheme, rest))
            }
            _ => Err(TransportError::BadAddress {
                addr: s.into(),
                reason: "expected SCHEME:REST, e.g. unix:my-service or unix:/path/to.sock".into(),
            }),
        }
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.scheme, self.rest)
    }
}

/// What is known about a connection and its peer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnInfo {
    /// Transport name (`"unix"`).
    pub transport: &'static str,
    /// The address connected to or accepted on.
    pub addr: String,
    /// Peer process id, where the OS reports it.
    pub peer_pid: Option<u32>,
    /// Peer user id, where the OS reports it. On Windows (named pipes), where users are
    /// SIDs, a number the process gives each user it meets (from 1, in order): equal for
    /// the connections of one user, different for different users, within this process.
    pub peer_uid: Option<u32>,
    /// True when the connection can carry file descriptors.
    pub fd_passing: bool,
    /// True when the peer is on the same host (so host-local channels may work).
    pub same_host: bool,
    /// The transport's own connection object, for channels made to work with it (e.g. the
    /// QUIC stream channel opens streams on the QUIC connection).
    pub handle: Option<TransportHandle>,
}

/// An opaque, shareable handle to a transport's connection (see [`ConnInfo::handle`]).
#[derive(Clone)]
pub struct TransportHandle(pub Arc<dyn std::any::Any + Send + Sync>);

impl TransportHandle {
    /// The handle as `T`, if it is one.
    pub fn downcast<T: Send + Sync + 'static>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

impl fmt::Debug for TransportHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TransportHandle")
    }
}

impl PartialEq for TransportHandle {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for TransportHandle {}

/// File descriptors travelling with a connection (unix). The transport's write half sends
/// what was attached with the next bytes it writes; its read half queues what arrives.
///
/// Received descriptors no frame has claimed yet are capped ([`FdQueue::set_incoming_cap`]):
/// those beyond the cap are closed as they arrive, and the queue remembers it
/// ([`FdQueue::overflowed`]), so that a peer cannot park descriptors in the process.
#[derive(Default)]
pub struct FdQueue {
    #[cfg(unix)]
    incoming: Mutex<VecDeque<std::os::fd::OwnedFd>>,
    /// 0: no cap set yet (then [`DEFAULT_INCOMING_FDS`]).
    #[cfg(unix)]
    cap: std::sync::atomic::AtomicUsize,
    #[cfg(unix)]
    dropped: std::sync::atomic::AtomicUsize,
    #[cfg(unix)]
    outgoing: Mutex<Vec<std::os::fd::OwnedFd>>,
    #[cfg(not(unix))]
    _never: Mutex<VecDeque<()>>,
}

impl fmt::Debug for FdQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FdQueue")
    }
}

#[cfg(unix)]
impl FdQueue {
    /// A new shared queue.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Takes up to `n` received descriptors, oldest first.
    pub fn take(&self, n: usize) -> Vec<std::os::fd::OwnedFd> {
        let mut q = self.incoming.lock().unwrap_or_else(|e| e.into_inner());
        let n = n.min(q.len());
        q.drain(..n).collect()
    }

    /// Received descriptors not yet taken.
    pub fn pending(&self) -> usize {
        self.incoming.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Transport side: queues received descriptors; those beyond the cap are closed here.
    pub fn push_received(&self, fds: impl IntoIterator<Item = std::os::fd::OwnedFd>) {
        use std::sync::atomic::Ordering;
        let cap = match self.cap.load(Ordering::Relaxed) {
            0 => DEFAULT_INCOMING_FDS,
            n => n,
        };
        let mut q = self.incoming.lock().unwrap_or_else(|e| e.into_inner());
        for fd in fds {
            if q.len() < cap {
                q.push_back(fd);
            } else {
                drop(fd);
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Sets how many received descriptors may wait for a frame to claim them.
    pub fn set_incoming_cap(&self, n: usize) {
        self.cap.store(n.max(1), std::sync::atomic::Ordering::Relaxed);
    }

    /// Descriptors closed on arrival because the queue was at its cap.
    pub fn overflowed(&self) -> usize {
        self.dropped.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Attaches descriptors to the next bytes written.
    pub fn attach(&self, fds: Vec<std::os::fd::OwnedFd>) {
        self.outgoing.lock().unwrap_or_else(|e| e.into_inner()).extend(fds);
    }

    /// Transport side: takes the descriptors to send with the next write.
    pub fn take_outgoing(&self) -> Vec<std::os::fd::OwnedFd> {
        std::mem::take(&mut *self.outgoing.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Transport side: puts back descriptors a write did not send (it sent no byte).
    pub fn restore_outgoing(&self, mut fds: Vec<std::os::fd::OwnedFd>) {
        let mut q = self.outgoing.lock().unwrap_or_else(|e| e.into_inner());
        fds.append(&mut q);
        *q = fds;
    }
}

/// Received descriptors that may wait unclaimed when no cap is set (the frame reader sets
/// it from [`crate::Limits::max_fds`]).
pub const DEFAULT_INCOMING_FDS: usize = 256;

/// Shared handle to a connection's descriptor queue.
pub type FdQueueRef = Arc<FdQueue>;

/// The two halves of a connection.
pub struct Split {
    /// Bytes from the peer.
    pub read: Box<dyn AsyncRead + Send + Unpin>,
    /// Bytes to the peer.
    pub write: Box<dyn AsyncWrite + Send + Unpin>,
    /// Descriptor queue, when the connection passes file descriptors.
    pub fds: Option<FdQueueRef>,
    /// Busy-polling control, when the read half can poll its socket before it sleeps.
    pub busy_poll: Option<Arc<BusyPoll>>,
    /// Asks whether the peer's end is closed without reading (see [`PeerLiveness`]), when
    /// the transport can tell.
    pub liveness: Option<Arc<dyn PeerLiveness>>,
}

/// A transport's answer to "is the peer still there?", asked without reading or waiting.
///
/// A writer that waits for room the peer makes by reading (a full same-host ring) asks it
/// now and then, so that a peer that died (exit, crash, SIGKILL) fails the write with
/// [`crate::PipeError::PeerGone`] instead of leaving it waiting for ever, even when nobody
/// reads the connection's socket to see its end.
pub trait PeerLiveness: Send + Sync + 'static {
    /// True once the peer's end of the connection is closed (the kernel closes it when the
    /// peer process dies) or shut for writing. Must not block or consume data.
    fn peer_gone(&self) -> bool;
}

/// One established connection.
pub trait Connection: Send + 'static {
    /// What is known about it.
    fn info(&self) -> &ConnInfo;
    /// Splits into read and write halves (which may be used from different tasks).
    fn split(self: Box<Self>) -> Split;
    /// Its read half waited on from a caller's own thread, without the runtime
    /// ([`DirectRead`]), when the transport can (a unix socket). Asked before
    /// [`Connection::split`]; `None` by default (the read half is then only read through
    /// the runtime).
    fn direct_read(&self) -> Option<Arc<dyn DirectRead>> {
        None
    }
}

/// A connection's half, driven by a blocking caller ([`DirectRead::drive`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Half {
    /// The read half: the caller reads a frame.
    Read,
    /// The write half: the caller writes one.
    Write,
}

/// What a [`DirectRead::wait_readable`] ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// The read half has something to read: bytes, its end, or an error.
    Readable,
    /// The deadline passed first.
    Deadline,
    /// [`DirectRead::interrupt`] was called (now or before).
    Interrupted,
}

/// A connection's read half, waited on from a blocking caller's own thread
/// ([`crate::Pipe::recv_blocking`]): the kernel wakes that thread when bytes arrive, with
/// no runtime thread woken first to pass the news on (one wake-up per message, as a plain
/// blocking socket read costs, instead of two).
///
/// Contract:
/// - [`DirectRead::wait_readable`] consumes nothing; after it says
///   [`Readiness::Readable`], the read half's next `poll_read` takes what is there from
///   the socket at once, even before the runtime has seen it (without this, it would wait
///   for the runtime's I/O driver: the very wake-up this saves).
/// - Only the one who holds the read half waits on it (the pipe hands it over).
/// - [`DirectRead::interrupt`] ends every wait, the current one and all later ones, at once.
pub trait DirectRead: Send + Sync + 'static {
    /// Blocks this thread until the read half is readable, `deadline` passes (`None`: no
    /// deadline), or the waits are interrupted.
    fn wait_readable(&self, deadline: Option<std::time::Instant>) -> std::io::Result<Readiness>;
    /// Ends every wait, now and later, with [`Readiness::Interrupted`] (the pipe closed).
    fn interrupt(&self);
    /// Whether the read half is readable now (bytes, its end, or an error), asked of the
    /// kernel without waiting and without reading. A link that sleeps elsewhere (the
    /// ring's futex) asks it last before it sleeps, so bytes that came on the socket
    /// meanwhile are never slept through. `None`: cannot tell (the default).
    fn readable_now(&self) -> Option<bool> {
        None
    }
    /// Takes what the read half has now without waiting, as [`DirectRead::wait_readable`]'s
    /// read would (a blocking caller's spin polls with it): [`Readiness::Readable`] when
    /// bytes, the end or an error are there for the read half's next read,
    /// [`Readiness::Deadline`] when nothing is yet, [`Readiness::Interrupted`] after
    /// [`DirectRead::interrupt`]. `None`: this transport cannot (the default; the caller
    /// waits without spinning).
    fn read_now(&self) -> Option<std::io::Result<Readiness>> {
        None
    }
    /// Blocks this thread until the write half has room, `deadline` passes, or the waits
    /// are interrupted (then [`Readiness::Readable`] means "room"). `None`: this transport
    /// cannot wait for room on a caller's thread (the default).
    fn wait_writable(&self, deadline: Option<std::time::Instant>) -> Option<std::io::Result<Readiness>> {
        let _ = deadline;
        None
    }
    /// While `yes`, the calling thread drives `half` itself, one frame at a time
    /// (`crate::Pipe::send_blocking` and `recv_blocking` moving a frame larger than the
    /// socket holds): a read or write made *on this thread* that finds the socket empty or
    /// full returns `Pending` without asking the runtime to watch it, for the caller waits
    /// with [`DirectRead::wait_readable`] / [`DirectRead::wait_writable`] and polls again.
    /// Each socket buffer's worth then costs one wake-up of the caller's thread, by the
    /// kernel, where the runtime's would cost two (its I/O thread, then the caller). Polls
    /// from other threads (the pipe's tasks) are never affected. Default: nothing changes
    /// (the runtime keeps watching, and the caller's waits still work).
    fn drive(&self, half: Half, yes: bool) {
        let _ = (half, yes);
    }
}

/// Accepts connections.
#[async_trait]
pub trait Listener: Send + 'static {
    /// The next trusted connection. Untrusted peers are refused and logged, not returned.
    async fn accept(&mut self) -> Result<Box<dyn Connection>, TransportError>;
    /// The address it listens on.
    fn local_addr(&self) -> Address;
    /// Its readers' busy polling (see [`crate::spin`]), if its connections can poll.
    fn spin(&self) -> Option<Arc<ListenerSpin>> {
        None
    }
}

/// Moves bytes between processes; chosen by the address scheme.
#[async_trait]
pub trait Transport: Send + Sync + 'static {
    /// The address scheme it serves (`"unix"`).
    fn scheme(&self) -> &'static str;
    /// The backend's name (`"local"`), for reports; the scheme by default.
    fn name(&self) -> &'static str {
        self.scheme()
    }
    /// Whether it can work on this machine.
    fn viability(&self) -> Result<(), TransportError> {
        Ok(())
    }
    /// Listens on `addr`.
    async fn listen(&self, addr: &Address) -> Result<Box<dyn Listener>, TransportError>;
    /// Connects to `addr`.
    async fn connect(&self, addr: &Address) -> Result<Box<dyn Connection>, TransportError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        let a: Address = "unix:/tmp/x.sock".parse().unwrap();
        assert_eq!((a.scheme(), a.rest()), ("unix", "/tmp/x.sock"));
        assert_eq!(a.to_string(), "unix:/tmp/x.sock");
        let q: Address = "quic://h:1".parse().unwrap();
        assert_eq!(q.rest(), "//h:1");
        for bad in ["", "noscheme", ":x", "unix:", "a b:c"] {
            assert!(bad.parse::<Address>().is_err(), "{bad}");
        }
    }
}
