//! ferry-ring: the same-host fast path of issue 22: frames between two processes through
//! single-producer single-consumer rings in shared memory, with round trips well under a
//! microsecond while both sides spin, and no CPU at all while a connection is idle.
//!
//! What it is:
//!
//! - **One file per connection, two rings.** One side creates a sealed memfd
//!   ([`Ring::create`]) holding a ring per direction and hands the descriptor to the other
//!   (over the connection's unix socket; [`handoff`] is a minimal version), which checks the
//!   seals (`SHRINK | GROW | SEAL`), the size (for the capacity it was told) and the header
//!   before it maps it ([`Ring::open`]). Nothing is named in /dev/shm or on disk: when
//!   either process dies, even by SIGKILL, the kernel frees it. The layout is in
//!   `src/layout.rs` (its module docs draw the file).
//! - **Frames are length-prefixed records** (`len: u32`, `tag: u32`, payload, padded to 8
//!   bytes), copied in and out. A frame over [`Sender::max_frame`] is refused with
//!   [`RingError::TooLarge`], and the caller sends it over the socket.
//! - **Waiting spins, then sleeps.** A waiting side polls the indices while ferry's one
//!   wait policy allows (`ferry_core::spin::decide_alone`: at most [`RingOptions::spin`],
//!   zero turns spinning off; not while threads wait for CPUs on the machine; not while
//!   its history says the peer is not answering quickly; not on the CPU the peer runs on:
//!   it moves to another, or stops), then sleeps on a futex
//!   word in the shared memory; the other side issues `FUTEX_WAKE` only when that word says
//!   someone sleeps, so a round trip between spinning sides makes no system call. A wait
//!   that slept long turns the spin off until a wait ends soon again, so an idle
//!   connection spins at most one window after its last frame and then sleeps in the
//!   kernel at once.
//! - **The peer is not trusted.** It can write any byte of the file at any time, so every
//!   access is atomic (no data race on our side), each shared index or length is read once,
//!   then checked (tail ahead of head by at most the capacity, a length within the
//!   published bytes and the largest frame); a failed check is [`RingError::Corrupt`],
//!   never a panic, an out-of-bounds access or a hang. A corrupt connection stays failed.
//! - **Death is noticed outside the ring**, because a futex does not notice a dead process:
//!   [`DeathWatch`] sleeps in `poll` on the socket beside the ring and, at EOF, calls
//!   [`PeerNotice::peer_gone`], which wakes every waiter of the connection
//!   ([`RingError::PeerGone`]). An orderly close (dropping a [`Sender`] or [`Receiver`])
//!   is written in the ring itself and seen as [`RingError::Closed`]. Every wait also has a
//!   deadline.
//!
//! **Blocking API**: [`Ring::send`] / [`Ring::recv`] with a deadline, from plain threads;
//! [`Ring::into_split`] gives a [`Sender`] and a [`Receiver`] for two threads.
//!
//! **Async callers** wait in a blocking pool: `Receiver` is `Send`, so
//! `tokio::task::spawn_blocking(move || { let r = rx.recv(&mut buf, deadline); (rx, buf, r) })`
//! waits without holding a runtime worker; [`Receiver::try_recv`] checks without waiting.
//! This crate needs no runtime. The choice: the latency this ring exists for is lost anyway
//! once a tokio wake-up is on the path (microseconds), so the async path only has to be
//! correct and idle-free, and a blocking-pool thread sleeping on the futex is both, with no
//! more shared state. What it costs is a pool thread per waiting connection; an eventfd
//! "doorbell" (a third value of the sleeping word meaning "write my eventfd", which tokio's
//! `AsyncFd` can wait on) is the upgrade when many idle async connections matter. Its trap:
//! the waker writes a descriptor the peer handed over, so it must check that it is an
//! eventfd and never block on it (a peer can fill an eventfd's counter, or hand a pipe).
//!
//! **In ferry's Pipe** (`src/link.rs`: ferry-core's `LinkRead` / `LinkWrite` / `LinkProvider`,
//! set with [`RingExt::ring`] on an `EndpointBuilder`): the handshake
//! agrees on a ring (the server makes the file and sends it with its WELCOME), every frame
//! then goes through the rings except those that cannot (descriptors, or larger than a
//! record), which take the socket behind a divert record; an async reader with nothing to
//! read arms a doorbell ([`Receiver::arm_doorbell`]) and waits on the socket; a blocking
//! caller (`Pipe::recv_blocking`) waits on the ring itself ([`Receiver::wait_for_data`]).
//! PROTOCOL.md §22 and `src/link.rs` have the details.
//!
//! Unsafe code lives only in the `sys` module (the shared mapping and its atomic
//! accesses, `sched_getcpu`).
//!
//! # Feature flags
//! None (`__testing` is for this crate's tests: hostile writes to the shared words).
#![cfg_attr(not(target_os = "linux"), allow(unused))]

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[cfg(target_os = "linux")]
mod cpu;
#[cfg(target_os = "linux")]
pub mod handoff;
#[cfg(target_os = "linux")]
mod layout;
#[cfg(target_os = "linux")]
mod link;
#[cfg(target_os = "linux")]
mod ring;
#[cfg(target_os = "linux")]
mod sys;
#[cfg(all(target_os = "linux", feature = "__testing"))]
#[doc(hidden)]
pub mod testing;
#[cfg(target_os = "linux")]
mod watch;

#[cfg(target_os = "linux")]
pub use link::{RingExt, RingLink};
#[cfg(target_os = "linux")]
pub use ring::{Nudge, PeerNotice, Pushed, Receiver, Sender, WaitEnd};
#[cfg(target_os = "linux")]
pub use watch::DeathWatch;

/// Why a send or a receive failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RingError {
    /// The frame does not fit in the ring; nothing was written. Send it over the socket.
    #[error("a frame of {len} bytes is larger than the ring's largest frame ({max} bytes): send it over the socket")]
    TooLarge {
        /// The payload's length.
        len: usize,
        /// The largest payload the ring carries.
        max: usize,
    },
    /// The deadline passed first.
    #[error("the deadline passed")]
    Timeout,
    /// The peer closed its end of the ring in order (after every frame it published).
    #[error("the peer closed the ring")]
    Closed,
    /// The death notice arrived: the peer's socket closed (it exited or was killed).
    #[error("the peer is gone (its end of the connection closed)")]
    PeerGone,
    /// The peer wrote impossible indices or lengths into the shared memory; the connection
    /// is over.
    #[error("the peer corrupted the ring: {0}")]
    Corrupt(Arc<str>),
}

/// Why a ring file could not be created or opened.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The capacity is not a power of two within the limits.
    #[error("{0}")]
    BadCapacity(String),
    /// The descriptor is not a memfd with the required seals.
    #[error("the ring file is not sealed: {0}")]
    NotSealed(String),
    /// Its real size is not the one the capacity implies.
    #[error("the ring file has {actual} bytes, {expected} expected")]
    WrongSize {
        /// Bytes implied by the announced capacity.
        expected: u64,
        /// Bytes really there.
        actual: u64,
    },
    /// The header (magic, version, capacity) is not the one this side expects.
    #[error("the ring file's header is wrong: {0}")]
    BadHeader(String),
    /// A system call failed.
    #[error("I/O: {0}")]
    Io(Arc<io::Error>),
    /// Not supported on this platform (Linux only).
    #[error("ferry-ring works on Linux only")]
    Unsupported,
}

/// Options of one side of a ring connection.
#[derive(Debug, Clone)]
pub struct RingOptions {
    capacity: usize,
    spin: Duration,
}

impl Default for RingOptions {
    fn default() -> Self {
        RingOptions { capacity: 256 * 1024, spin: Duration::from_micros(50) }
    }
}

impl RingOptions {
    /// Defaults: rings of 256 KiB per direction, spinning up to 50 µs per wait.
    pub fn new() -> RingOptions {
        RingOptions::default()
    }

    /// Bytes of each ring (a power of two from 4 KiB to 1 GiB). The creator makes rings of
    /// this size; the opener is told the creator's and accepts at most this (a peer cannot
    /// make it map, or buffer frames of, more than it chose). The largest frame is this
    /// minus 8.
    pub fn capacity(mut self, bytes: usize) -> RingOptions {
        self.capacity = bytes;
        self
    }

    /// The longest a wait spins before it sleeps (the wait policy's window,
    /// `ferry_core::spin`); zero turns spinning off. Each side chooses its own.
    pub fn spin(mut self, max: Duration) -> RingOptions {
        self.spin = max;
        self
    }
}

/// Both halves of one side of a ring connection. Use it from one thread, or split it
/// ([`Ring::into_split`]).
#[cfg(target_os = "linux")]
#[derive(Debug)]
pub struct Ring {
    tx: Sender,
    rx: Receiver,
}

#[cfg(target_os = "linux")]
impl Ring {
    /// Creates the connection's ring file (two rings of [`RingOptions::capacity`] bytes) and
    /// this side's halves; returns the descriptor to hand to the peer with the capacity
    /// (this side produces into ring 0 and consumes ring 1).
    pub fn create(opts: &RingOptions) -> Result<(Ring, std::os::fd::OwnedFd), OpenError> {
        use std::sync::atomic::Ordering;
        let len = layout::file_len(opts.capacity).map_err(OpenError::BadCapacity)?;
        let (map, fd) = sys::SharedMap::create(len).map_err(|e| OpenError::Io(e.into()))?;
        let word = |at| map.u64_at(at).ok_or_else(|| OpenError::BadHeader("header outside the file".into()));
        word(layout::MAGIC_AT)?.store(layout::MAGIC, Ordering::Relaxed);
        word(layout::VERSION_AT)?.store(u64::from(layout::VERSION), Ordering::Relaxed);
        word(layout::CAPACITY_AT)?.store(opts.capacity as u64, Ordering::Relaxed);
        Ok((Ring::with(map, 0, opts.capacity, opts.spin), fd))
    }

    /// Opens a ring file received from the peer, which said its rings hold `capacity` bytes:
    /// checks the capacity, the seals, the size and the header, then maps it (this side
    /// produces into ring 1 and consumes ring 0). A capacity over `opts`' is refused.
    pub fn open(fd: std::os::fd::OwnedFd, capacity: usize, opts: &RingOptions) -> Result<Ring, OpenError> {
        use std::sync::atomic::Ordering;
        if capacity > opts.capacity {
            return Err(OpenError::BadCapacity(format!(
                "ring capacity {capacity} is over this side's limit ({})",
                opts.capacity
            )));
        }
        let len = layout::file_len(capacity).map_err(OpenError::BadCapacity)?;
        let map = sys::SharedMap::open(fd, len)?;
        let read = |at| map.u64_at(at).map_or(0, |w| w.load(Ordering::Relaxed));
        let (magic, version, cap) = (read(layout::MAGIC_AT), read(layout::VERSION_AT), read(layout::CAPACITY_AT));
        if magic != layout::MAGIC || version != u64::from(layout::VERSION) || cap != capacity as u64 {
            return Err(OpenError::BadHeader(format!(
                "magic {magic:#x}, version {version}, capacity {cap}; expected {:#x}, {}, {capacity}",
                layout::MAGIC,
                layout::VERSION
            )));
        }
        Ok(Ring::with(map, 1, capacity, opts.spin))
    }

    fn with(map: sys::SharedMap, tx_index: usize, capacity: usize, spin: Duration) -> Ring {
        let tx = layout::RingLayout::new(tx_index, capacity);
        let rx = layout::RingLayout::new(1 - tx_index, capacity);
        let sh = Arc::new(ring::Shared::new(map, tx, rx));
        Ring { tx: Sender::new(sh.clone(), spin), rx: Receiver::new(sh, spin) }
    }

    /// Bytes of each ring (what the opener must be told with the descriptor).
    pub fn capacity(&self) -> usize {
        self.tx.sh.tx.capacity
    }

    /// The largest payload one frame can carry.
    pub fn max_frame(&self) -> usize {
        self.tx.max_frame()
    }

    /// Sends one frame (tag 0); see [`Sender::send_tagged`].
    pub fn send(&mut self, payload: &[u8], deadline: Instant) -> Result<(), RingError> {
        self.tx.send(payload, deadline)
    }

    /// Sends one frame with a tag; see [`Sender::send_tagged`].
    pub fn send_tagged(&mut self, tag: u32, payload: &[u8], deadline: Instant) -> Result<(), RingError> {
        self.tx.send_tagged(tag, payload, deadline)
    }

    /// Receives one frame into `buf`, returning its tag; see [`Receiver::recv`].
    pub fn recv(&mut self, buf: &mut Vec<u8>, deadline: Instant) -> Result<u32, RingError> {
        self.rx.recv(buf, deadline)
    }

    /// Receives a frame if one is there; see [`Receiver::try_recv`].
    pub fn try_recv(&mut self, buf: &mut Vec<u8>) -> Result<Option<u32>, RingError> {
        self.rx.try_recv(buf)
    }

    /// A handle for the death notice ([`PeerNotice::peer_gone`]).
    pub fn notice(&self) -> PeerNotice {
        PeerNotice(self.tx.sh.clone())
    }

    /// Starts a [`DeathWatch`] on `socket`, this side's end of the socket beside the ring.
    pub fn watch_socket(&self, socket: std::os::fd::OwnedFd) -> io::Result<DeathWatch> {
        DeathWatch::spawn(socket, self.notice())
    }

    /// The two halves, for two threads.
    pub fn into_split(self) -> (Sender, Receiver) {
        (self.tx, self.rx)
    }
}

/// A deadline `timeout` from now (far in the future when that overflows).
pub fn deadline_in(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout).unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
}
