//! The direct wait of a unix socket's read half ([`ferry_core::DirectRead`]): a blocking
//! caller waits for the socket on its own thread, so the kernel wakes it when bytes
//! arrive, with no runtime thread woken first; the read half's next read then takes the
//! bytes from the socket at once (`primed`), before the runtime has seen them.
//!
//! **A wait is a blocking read** ([`DirectRead::wait_readable`]): the caller's thread
//! sleeps in `recvmsg` itself, and what it reads is kept ([`Stash`]) for the read half's
//! next reads, which take it before the socket. A plain blocking read is what a waiter
//! woken across CPUs pays least for: on a 2-vCPU VM, a 64-byte round trip between two
//! processes on two CPUs took 25 µs with blocking reads and 40 µs with each read waited
//! for in `epoll` or `poll` (`cargo xtask bench-ring`, "unix socket" rows); on one CPU both
//! take 7.5 µs. It also saves the wait's own system call: one `recvmsg` per message.
//!
//! - The socket's file is therefore *blocking*, and every other read and write on it says
//!   `MSG_DONTWAIT` (the runtime's, a spin's, a driven read's: `super::recv_with_fds`,
//!   `super::send_with_fds`).
//! - **Interrupt.** [`DirectRead::interrupt`] shuts the socket's reading down
//!   (`shutdown(SHUT_RD)`) when a blocking read is under way, which ends it at once; bytes
//!   already queued stay readable. The pipe is closing then: nothing more is read.
//! - **Deadlines.** A blocking read's time limit is the socket's `SO_RCVTIMEO`, which the
//!   kernel counts in scheduler ticks (up to 4 ms late); a wait whose deadline is nearer
//!   than [`NEAR`] (and whatever is left of a longer one) waits in an `epoll` set of its
//!   own instead (the socket and the interrupt pair, level triggered), on time to the
//!   microsecond. `SO_RCVTIMEO` is set only when a wait needs a shorter one than is set.

use std::io;
use std::os::unix::net::{UnixStream, UnixStream as StdUnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ferry_core::{DirectRead, FdQueue, Half, Readiness};
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;

use rustix::event::{Timespec, epoll};
use tokio::io::Interest;

use super::Reg;

/// A connection's direct wait, shared with its read half.
pub(crate) struct Direct {
    stream: Arc<UnixStream>,
    /// The read half's registration with the runtime, put away while a blocking caller
    /// waits here (the runtime's thread is then not woken by the bytes it takes).
    read: Reg<Arc<UnixStream>>,
    /// The write half's registration with the runtime (for room), put away while a
    /// blocking caller waits for room here.
    write: Reg<OwnedFd>,
    /// A direct wait saw the socket readable: the read half reads it before asking the
    /// runtime (cleared at the first read that finds nothing).
    primed: AtomicBool,
    /// The thread that drives the read half ([`DirectRead::drive`]; 0: none): a read made
    /// on it that finds nothing returns `Pending` without registering with the runtime.
    read_driver: AtomicU64,
    /// The same for the write half.
    write_driver: AtomicU64,
    wake: Mutex<Wake>,
    /// What a blocking wait read ([`Stash`]).
    stash: Mutex<Stash>,
    /// The connection's received descriptors (set when it is split): a blocking wait's
    /// `recvmsg` puts those it receives there, as the read half's own reads do.
    fds: OnceLock<Arc<FdQueue>>,
    /// [`DirectRead::interrupt`] was called: every wait ends (set under the `wake` lock;
    /// read without it by a blocking wait about to read).
    interrupted: AtomicBool,
    /// A blocking read is under way (or about to be): an interrupt must shut the reading.
    blocking: AtomicBool,
    /// The socket's `SO_RCVTIMEO` in nanoseconds (0: none, the kernel's default).
    rcvtimeo_ns: AtomicU64,
}

/// Bytes (or an error) a blocking wait read, not yet taken by the read half.
#[derive(Default)]
struct Stash {
    /// [`STASH`] bytes, made at the first blocking wait.
    buf: Vec<u8>,
    /// `buf[taken..len]` is what the read half has not taken yet.
    taken: usize,
    len: usize,
    /// The read's error, for the read half's next read.
    err: Option<io::Error>,
}

/// How much one blocking wait reads at most (the rest of a larger frame stays in the
/// socket for the read half's own reads).
const STASH: usize = 64 << 10;

/// Waits with a deadline nearer than this wait in `epoll` (on time), not in a blocking read
/// (whose `SO_RCVTIMEO` the kernel rounds up to a scheduler tick).
const NEAR: Duration = Duration::from_millis(20);

/// How [`DirectRead::interrupt`] reaches a wait.
#[derive(Default)]
struct Wake {
    /// What a wait waits on. Made at the first wait (most connections never wait
    /// directly: no descriptors spent on them).
    waiter: Option<Arc<Waiter>>,
}

/// A direct wait's descriptors.
struct Waiter {
    /// A socket pair whose first end is in the set beside the connection's socket; the
    /// interrupt writes to the second.
    pair: (StdUnixStream, StdUnixStream),
    /// The set: the socket ([`SOCKET`]) and the pair's first end ([`INTERRUPT`]).
    epoll: OwnedFd,
}

/// The timeout of one wait until `deadline` (rounded up: a wait never ends before its
/// deadline), and whether it is the last: past the deadline, a wait only looks (a zero
/// timeout), so a deadline of now asks whether the socket is ready.
fn until(deadline: Option<Instant>) -> (Option<Timespec>, bool) {
    let Some(d) = deadline else { return (None, false) };
    let left = d.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return (Some(Timespec { tv_sec: 0, tv_nsec: 0 }), true);
    }
    let left = left + std::time::Duration::from_nanos(999);
    (
        Some(Timespec { tv_sec: left.as_secs().try_into().unwrap_or(i64::MAX), tv_nsec: left.subsec_nanos().into() }),
        false,
    )
}

/// This thread's key for [`Direct`]'s drivers (never 0).
fn thread_key() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static KEY: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    KEY.with(|k| *k)
}

/// The socket's event data in [`Waiter::epoll`].
const SOCKET: u64 = 0;
/// The interrupt's.
const INTERRUPT: u64 = 1;

impl Waiter {
    fn new(stream: &UnixStream) -> io::Result<Waiter> {
        let pair = StdUnixStream::pair()?;
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        epoll::add(&epoll, stream, epoll::EventData::new_u64(SOCKET), epoll::EventFlags::IN)?;
        epoll::add(&epoll, &pair.0, epoll::EventData::new_u64(INTERRUPT), epoll::EventFlags::IN)?;
        Ok(Waiter { pair, epoll })
    }
}

impl Direct {
    pub(crate) fn new(stream: Arc<UnixStream>) -> Arc<Self> {
        Arc::new(Direct {
            read: Reg::new(Some(stream.clone()), Interest::READABLE),
            write: Reg::new(None, Interest::WRITABLE),
            stream,
            primed: AtomicBool::new(false),
            read_driver: AtomicU64::new(0),
            write_driver: AtomicU64::new(0),
            wake: Mutex::default(),
            stash: Mutex::default(),
            fds: OnceLock::new(),
            interrupted: AtomicBool::new(false),
            blocking: AtomicBool::new(false),
            rcvtimeo_ns: AtomicU64::new(0),
        })
    }

    /// The read half's registration with the runtime.
    pub(crate) fn read(&self) -> &Reg<Arc<UnixStream>> {
        &self.read
    }

    /// The write half's registration with the runtime (made at its first wait for room,
    /// on a descriptor of its own: registrations are keyed by descriptor).
    pub(crate) fn write(&self) -> &Reg<OwnedFd> {
        &self.write
    }

    /// True when this thread drives `half` ([`DirectRead::drive`]).
    pub(crate) fn driven_here(&self, half: Half) -> bool {
        let driver = match half {
            Half::Read => &self.read_driver,
            Half::Write => &self.write_driver,
        };
        driver.load(Ordering::Acquire) == thread_key()
    }

    /// True when the read half should read the socket before asking the runtime.
    pub(crate) fn primed(&self) -> bool {
        self.primed.load(Ordering::Acquire)
    }

    /// A read found nothing: the runtime's readiness rules again.
    pub(crate) fn unprime(&self) {
        self.primed.store(false, Ordering::Release);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Wake> {
        self.wake.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where a blocking wait puts the descriptors it receives: the connection's queue.
    pub(crate) fn set_fds(&self, fds: Arc<FdQueue>) {
        let _ = self.fds.set(fds);
    }

    /// Takes what a blocking wait read into `buf` (as much as fits); `None`: nothing kept.
    pub(crate) fn take_stash(&self, buf: &mut tokio::io::ReadBuf<'_>) -> Option<io::Result<()>> {
        let mut st = self.stash_lock();
        if st.taken < st.len {
            let n = (st.len - st.taken).min(buf.remaining());
            buf.put_slice(&st.buf[st.taken..st.taken + n]);
            st.taken += n;
            return Some(Ok(()));
        }
        st.err.take().map(Err)
    }

    fn stash_lock(&self) -> std::sync::MutexGuard<'_, Stash> {
        self.stash.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// True when a blocking wait kept bytes (or an error) the read half has not taken.
    fn stashed(&self) -> bool {
        let st = self.stash_lock();
        st.taken < st.len || st.err.is_some()
    }

    /// Sets `SO_RCVTIMEO` for a blocking read that must end within `left` (`None`: no
    /// limit), unless the one set already ends it soon enough: a read whose limit comes
    /// early is simply made again. A system call only when the limit must shrink.
    fn limit_read(&self, left: Option<Duration>) -> io::Result<()> {
        let set = self.rcvtimeo_ns.load(Ordering::Relaxed);
        let want = left.map_or(0, |l| u64::try_from(l.as_nanos()).unwrap_or(u64::MAX).max(1));
        let fine = match (set, want) {
            (0, 0) => true,
            (0, _) => false,
            (_, 0) => true,
            // Up to a quarter of NEAR late: within the half of it the caller keeps.
            (s, w) => s <= w.saturating_add(u64::try_from((NEAR / 4).as_nanos()).unwrap_or(u64::MAX)),
        };
        if !fine {
            rustix::net::sockopt::set_socket_timeout(&*self.stream, rustix::net::sockopt::Timeout::Recv, left)?;
            self.rcvtimeo_ns.store(want, Ordering::Relaxed);
        }
        Ok(())
    }

    /// One blocking read into the stash (all taken when called), within `left`.
    /// `Ok(Some(true))`: bytes, the end or an error are there for the read half;
    /// `Ok(Some(false))`: the time limit passed first (or a signal came); `Ok(None)`:
    /// interrupted.
    fn read_blocking(&self, left: Option<Duration>) -> io::Result<Option<bool>> {
        self.limit_read(left)?;
        Ok(self.read_into_stash(true))
    }

    /// One read into the stash (all taken when called): blocking (within the socket's
    /// `SO_RCVTIMEO`) or not. `Some(true)`: bytes, the end or an error are there for the
    /// read half; `Some(false)`: nothing came (the time limit passed, a signal came, or
    /// nothing was there); `None`: interrupted.
    fn read_into_stash(&self, block: bool) -> Option<bool> {
        // Said before looking at the interrupt, which looks at it after saying it
        // interrupts: one of the two sees the other (both `SeqCst`).
        self.blocking.store(true, Ordering::SeqCst);
        let mut got = None;
        if !self.interrupted.load(Ordering::SeqCst) {
            // The buffer is taken out for the read: the lock is not held while it blocks.
            let mut buf = {
                let mut st = self.stash_lock();
                (st.taken, st.len) = (0, 0);
                std::mem::take(&mut st.buf)
            };
            buf.resize(STASH, 0);
            let fds = self.fds.get().map(|q| &**q);
            let r = super::recv_with_fds_as(&self.stream, &mut tokio::io::ReadBuf::new(&mut buf), fds, block);
            let mut st = self.stash_lock();
            st.buf = buf;
            got = Some(match r {
                Ok(n) => {
                    st.len = n;
                    // An end read after an interrupt is the shutdown's, not the peer's.
                    n > 0 || !self.interrupted.load(Ordering::SeqCst)
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => false,
                Err(e) => {
                    st.err = Some(e);
                    true
                }
            });
            if got == Some(false) && self.interrupted.load(Ordering::SeqCst) {
                got = None;
            }
        }
        self.blocking.store(false, Ordering::SeqCst);
        got
    }
}

impl Direct {
    /// The waits' descriptors, made at the first wait; `None` once interrupted.
    fn waiter(&self) -> io::Result<Option<Arc<Waiter>>> {
        let mut w = self.lock();
        if self.interrupted.load(Ordering::SeqCst) {
            return Ok(None);
        }
        if w.waiter.is_none() {
            w.waiter = Some(Arc::new(Waiter::new(&self.stream)?));
        }
        Ok(w.waiter.clone())
    }

    /// [`DirectRead::wait_writable`]: a `poll(2)` of the socket for room and of the
    /// interrupt pair (a wait for room comes once per socket buffer's worth of a large
    /// frame, not per message: no set kept for it).
    fn wait_room(&self, deadline: Option<Instant>) -> io::Result<Readiness> {
        use rustix::event::{PollFd, PollFlags};
        let Some(waiter) = self.waiter()? else { return Ok(Readiness::Interrupted) };
        self.write.unregister();
        loop {
            let (timeout, last) = until(deadline);
            let mut fds = [PollFd::new(&*self.stream, PollFlags::OUT), PollFd::new(&waiter.pair.0, PollFlags::IN)];
            match rustix::event::poll(&mut fds, timeout.as_ref()) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
            if !fds[1].revents().is_empty() {
                return Ok(Readiness::Interrupted);
            }
            // Room, the end (HUP), or an error: the write says which.
            if !fds[0].revents().is_empty() {
                return Ok(Readiness::Readable);
            }
            if last {
                return Ok(Readiness::Deadline);
            }
        }
    }
}

impl DirectRead for Direct {
    fn wait_readable(&self, deadline: Option<Instant>) -> io::Result<Readiness> {
        let Some(waiter) = self.waiter()? else { return Ok(Readiness::Interrupted) };
        self.read.unregister();
        if self.stashed() {
            return Ok(Readiness::Readable);
        }
        // A blocking read while the deadline is far (module docs).
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left.is_some_and(|l| l < NEAR) {
                break;
            }
            match self.read_blocking(left.map(|l| l - NEAR / 2))? {
                Some(true) => {
                    self.primed.store(true, Ordering::Release);
                    return Ok(Readiness::Readable);
                }
                Some(false) => {}
                None => return Ok(Readiness::Interrupted),
            }
        }
        loop {
            let (timeout, last) = until(deadline);
            let mut buf = [MaybeUninit::<epoll::Event>::uninit(); 2];
            let events = match epoll::wait(&waiter.epoll, &mut buf, timeout.as_ref()) {
                Ok((events, _)) => events,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            };
            if events.iter().any(|e| e.data.u64() == INTERRUPT) {
                return Ok(Readiness::Interrupted);
            }
            // Bytes, the end (HUP), or an error: the read says which.
            if !events.is_empty() {
                self.primed.store(true, Ordering::Release);
                return Ok(Readiness::Readable);
            }
            if last {
                return Ok(Readiness::Deadline);
            }
        }
    }

    fn read_now(&self) -> Option<io::Result<Readiness>> {
        if self.stashed() {
            return Some(Ok(Readiness::Readable));
        }
        self.read.unregister();
        Some(Ok(match self.read_into_stash(false) {
            Some(true) => {
                self.primed.store(true, Ordering::Release);
                Readiness::Readable
            }
            Some(false) => Readiness::Deadline,
            None => Readiness::Interrupted,
        }))
    }

    fn readable_now(&self) -> Option<bool> {
        if self.stashed() {
            return Some(true);
        }
        let mut fds = [rustix::event::PollFd::new(&*self.stream, rustix::event::PollFlags::IN)];
        let zero = Timespec { tv_sec: 0, tv_nsec: 0 };
        match rustix::event::poll(&mut fds, Some(&zero)) {
            Ok(n) => Some(n > 0),
            Err(_) => None,
        }
    }

    fn wait_writable(&self, deadline: Option<Instant>) -> Option<io::Result<Readiness>> {
        Some(self.wait_room(deadline))
    }

    fn drive(&self, half: Half, yes: bool) {
        let driver = match half {
            Half::Read => &self.read_driver,
            Half::Write => &self.write_driver,
        };
        driver.store(if yes { thread_key() } else { 0 }, Ordering::Release);
    }

    fn interrupt(&self) {
        let w = self.lock();
        if self.interrupted.swap(true, Ordering::SeqCst) {
            return;
        }
        if self.blocking.load(Ordering::SeqCst) {
            // Ends the blocking read under way (module docs).
            let _ = rustix::net::shutdown(&*self.stream, rustix::net::Shutdown::Read);
        }
        if let Some(p) = &w.waiter {
            // The byte stays unread: every later wait sees it too (level triggered).
            let _ = rustix::io::write(&p.pair.1, &[1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stash's bytes, taken `n` at a time; `None` when it holds none.
    fn take(direct: &Direct, n: usize) -> Option<Vec<u8>> {
        let mut space = vec![0u8; n];
        let mut buf = tokio::io::ReadBuf::new(&mut space);
        direct.take_stash(&mut buf)?.expect("no error kept");
        Some(buf.filled().to_vec())
    }

    /// A wait is a blocking read: what it read is kept, and the read half takes it in order,
    /// however little it asks for at a time; then the socket again.
    #[test]
    fn a_wait_keeps_what_it_read_for_the_read_half_in_order() {
        let (a, b) = UnixStream::pair().expect("pair");
        let direct = Direct::new(Arc::new(a));
        std::io::Write::write_all(&mut &b, b"hello").expect("write");
        assert_eq!(direct.wait_readable(None).expect("wait"), Readiness::Readable);
        assert_eq!(direct.readable_now(), Some(true), "kept bytes are readable");
        assert_eq!(take(&direct, 3).as_deref(), Some(&b"hel"[..]));
        assert_eq!(take(&direct, 3).as_deref(), Some(&b"lo"[..]));
        assert_eq!(take(&direct, 3), None, "all taken");
        assert_eq!(direct.readable_now(), Some(false));
        // A wait with bytes kept returns at once, reading nothing more.
        std::io::Write::write_all(&mut &b, b"ab").expect("write");
        assert_eq!(direct.wait_readable(None).expect("wait"), Readiness::Readable);
        std::io::Write::write_all(&mut &b, b"cd").expect("write");
        assert_eq!(direct.wait_readable(None).expect("wait"), Readiness::Readable);
        assert_eq!(take(&direct, 8).as_deref(), Some(&b"ab"[..]));
        let mut rest = [0u8; 2];
        std::io::Read::read_exact(&mut &*direct.stream, &mut rest).expect("read");
        assert_eq!(&rest, b"cd", "the rest stayed in the socket");
    }

    /// An interrupt ends a blocking read that waits for bytes that never come, at once, and
    /// every wait after it.
    #[test]
    fn an_interrupt_ends_a_blocking_read() {
        let (a, _b) = UnixStream::pair().expect("pair");
        let direct = Direct::new(Arc::new(a));
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = direct.clone();
        std::thread::spawn(move || {
            let _ = tx.send(waiter.wait_readable(None).map_err(|e| e.to_string()));
        });
        // Most likely asleep in its read by then (else it finds the interrupt before it reads:
        // the same outcome). Bounded: the wait reports within 100 ms of an interrupt or the
        // loop interrupts again, 100 times at most.
        std::thread::sleep(Duration::from_millis(50));
        let mut got = None;
        for _ in 0..100 {
            direct.interrupt();
            if let Ok(r) = rx.recv_timeout(Duration::from_millis(100)) {
                got = Some(r);
                break;
            }
        }
        assert_eq!(got, Some(Ok(Readiness::Interrupted)));
        assert_eq!(direct.wait_readable(None).expect("wait"), Readiness::Interrupted);
    }

    /// A deadline far enough for a blocking read (beyond `NEAR`) is kept: the wait ends with
    /// `Deadline`, never before it.
    #[test]
    fn a_far_deadline_ends_the_wait_not_before_it() {
        let (a, _b) = UnixStream::pair().expect("pair");
        let direct = Direct::new(Arc::new(a));
        let until = Instant::now() + NEAR + NEAR / 2;
        assert_eq!(direct.wait_readable(Some(until)).expect("wait"), Readiness::Deadline);
        assert!(Instant::now() >= until, "ended before its deadline");
    }

    /// The peer's end is readable: a wait returns, the stash keeps nothing, and the read
    /// half's own read then finds the end.
    #[test]
    fn the_peers_end_ends_a_wait() {
        let (a, b) = UnixStream::pair().expect("pair");
        let direct = Direct::new(Arc::new(a));
        drop(b);
        assert_eq!(direct.wait_readable(None).expect("wait"), Readiness::Readable);
        assert_eq!(take(&direct, 4), None);
        let mut one = [0u8; 1];
        assert_eq!(std::io::Read::read(&mut &*direct.stream, &mut one).expect("read"), 0);
    }

    /// `read_now` (a blocking caller's spin) reads what is there without waiting, into the
    /// stash the read half takes first: nothing yet, then bytes, then an interrupt.
    #[test]
    fn read_now_takes_what_is_there_and_never_waits() {
        let (a, b) = UnixStream::pair().expect("pair");
        let mut b = b;
        let direct = Direct::new(Arc::new(a));
        assert_eq!(direct.read_now().expect("a unix socket can").expect("read"), Readiness::Deadline);
        std::io::Write::write_all(&mut b, b"xyz").expect("write");
        assert_eq!(direct.read_now().expect("can").expect("read"), Readiness::Readable);
        assert!(direct.primed(), "the read half reads before asking the runtime");
        assert_eq!(direct.read_now().expect("can").expect("read"), Readiness::Readable, "kept until taken");
        assert_eq!(take(&direct, 2).as_deref(), Some(&b"xy"[..]));
        assert_eq!(take(&direct, 8).as_deref(), Some(&b"z"[..]));
        assert_eq!(direct.read_now().expect("can").expect("read"), Readiness::Deadline);
        direct.interrupt();
        assert_eq!(direct.read_now().expect("can").expect("read"), Readiness::Interrupted);
    }

    /// `readable_now` asks the kernel without waiting or reading: nothing, then bytes (which
    /// it leaves there), then the peer's end.
    #[test]
    fn readable_now_tells_without_reading() {
        let (a, b) = UnixStream::pair().expect("pair");
        let mut b = b;
        let direct = Direct::new(Arc::new(a));
        assert_eq!(direct.readable_now(), Some(false));
        std::io::Write::write_all(&mut b, b"xy").expect("write");
        assert_eq!(direct.readable_now(), Some(true));
        assert_eq!(direct.readable_now(), Some(true), "the bytes are still there");
        let mut got = [0u8; 2];
        std::io::Read::read_exact(&mut &*direct.stream, &mut got).expect("read");
        assert_eq!(&got, b"xy");
        assert_eq!(direct.readable_now(), Some(false));
        drop(b);
        assert_eq!(direct.readable_now(), Some(true), "the end is readable");
    }
}
