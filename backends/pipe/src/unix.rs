//! Unix sockets: peer credentials and descriptor passing (SCM_RIGHTS with rustix on the
//! tokio socket).

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use ferry_core::{Address, BusyPoll, ConnInfo, Connection, FdQueue, Split, TransportError};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags,
};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::UnixStream;

use super::IpcStream;

/// Most descriptors one `recvmsg` can return (Linux `SCM_MAX_FD`).
const MAX_FDS_PER_RECV: usize = 253;

/// A unix-socket connection.
pub(crate) struct PipeConnection {
    stream: Arc<UnixStream>,
    info: ConnInfo,
    /// The listener's, for a connection it accepted ([`PipeConnection::serving`]).
    activity: Option<(Arc<Activity>, u32)>,
}

impl PipeConnection {
    pub(crate) fn new(stream: IpcStream, addr: &Address, allow_any_user: bool) -> Result<Self, TransportError> {
        let stream: UnixStream = match stream {
            IpcStream::UdSocket(s) => s.into(),
        };
        let cred = stream.peer_cred().map_err(|e| TransportError::Io(Arc::new(e)))?;
        let me = rustix::process::geteuid().as_raw();
        if !allow_any_user && cred.uid() != me {
            return Err(TransportError::PeerRefused(format!(
                "peer runs as uid {} (pid {:?}), this process as uid {me}; only the same user may connect \
                 (PipeTransport::allow_any_user lifts this)",
                cred.uid(),
                cred.pid()
            )));
        }
        let info = ConnInfo {
            transport: "unix",
            addr: addr.to_string(),
            peer_pid: cred.pid().and_then(|p| u32::try_from(p).ok()),
            peer_uid: Some(cred.uid()),
            fd_passing: true,
            same_host: true,
            handle: None,
        };
        Ok(PipeConnection { stream: Arc::new(stream), info, activity: None })
    }

    /// A connection `listener_activity`'s listener accepted: its reader busy-polls only
    /// while none of that listener's other connections is active.
    pub(crate) fn serving(mut self, listener_activity: &Arc<Activity>) -> Self {
        self.activity = Some((listener_activity.clone(), listener_activity.next_id()));
        self
    }
}

impl Connection for PipeConnection {
    fn info(&self) -> &ConnInfo {
        &self.info
    }

    fn split(self: Box<Self>) -> Split {
        let fds = FdQueue::new();
        let busy = Arc::new(BusyPoll::default());
        Split {
            read: Box::new(ReadHalf {
                stream: self.stream.clone(),
                fds: fds.clone(),
                busy: busy.clone(),
                last_data: None,
                activity: self.activity,
            }),
            write: Box::new(WriteHalf { stream: self.stream, fds: fds.clone() }),
            fds: Some(fds),
            busy_poll: Some(busy),
        }
    }
}

struct ReadHalf {
    stream: Arc<UnixStream>,
    fds: Arc<FdQueue>,
    busy: Arc<BusyPoll>,
    /// When bytes last arrived; `None` once a busy poll found none (cold until they do).
    last_data: Option<Instant>,
    /// The accepting listener's activity and this reader's id in it; `None` on the
    /// connecting side, whose reader never busy-polls.
    activity: Option<(Arc<Activity>, u32)>,
}

/// Which connections of one listener received bytes last, and when: busy polling pays
/// while one connection is active, and costs while several are. A reader that spins holds
/// its worker thread (and the runtime's I/O driver, when it is the only worker), so the
/// other connections' requests wait for its window: 16 clients calling at once on 2 CPUs
/// measured a p99 of 7.7 ms with spinning and 0.2 ms without. So a reader spins only if no
/// other connection of its listener received bytes within [`BUSY_WINDOW_OTHERS`].
///
/// Two words, each `micros since start (wrapping u32) << 32 | reader id`: the last read,
/// and the last read by another reader than that one. Updated without a lock: a lost
/// update only makes one spin decision on stale data.
#[derive(Default)]
pub(crate) struct Activity {
    last: AtomicU64,
    last_other: AtomicU64,
    /// The last reader id given out (ids start at 1; 0 means "no read yet").
    ids: AtomicU32,
}

/// How recently another connection must have received bytes to keep a reader from spinning.
const BUSY_WINDOW_OTHERS: Duration = Duration::from_millis(1);

/// Microseconds since the first call, wrapping at 2^32 (71 minutes): only differences
/// shorter than that are compared.
fn now_us() -> u32 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_micros() as u32
}

impl Activity {
    /// An id for a new reader (never 0; wraps after 2^32 readers).
    fn next_id(&self) -> u32 {
        loop {
            let id = self.ids.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
            if id != 0 {
                return id;
            }
        }
    }

    /// Reader `id` received bytes at `now` (µs).
    fn read(&self, id: u32, now: u32) {
        let last = self.last.swap((u64::from(now) << 32) | u64::from(id), Ordering::Relaxed);
        if last as u32 != id {
            self.last_other.store(last, Ordering::Relaxed);
        }
    }

    /// Whether a reader other than `id` received bytes within [`BUSY_WINDOW_OTHERS`] of `now`.
    fn others_active(&self, id: u32, now: u32) -> bool {
        let window = BUSY_WINDOW_OTHERS.as_micros() as u32;
        [self.last.load(Ordering::Relaxed), self.last_other.load(Ordering::Relaxed)].into_iter().any(|w| {
            let (at, who) = ((w >> 32) as u32, w as u32);
            who != 0 && who != id && now.wrapping_sub(at) < window
        })
    }
}

/// Read halves busy-polling right now, in this process.
static SPINNING: AtomicUsize = AtomicUsize::new(0);

/// [`SPINNING`] now.
pub(crate) fn spinning() -> usize {
    SPINNING.load(Ordering::Acquire)
}

/// At most half the CPUs this process may use (and at least one) busy-poll at once.
fn max_spinning() -> usize {
    static MAX: OnceLock<usize> = OnceLock::new();
    *MAX.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1)))
}

/// A place among the busy-polling read halves, given back on drop.
struct Spinning;

impl Spinning {
    fn enter() -> Option<Spinning> {
        let max = max_spinning();
        SPINNING
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
            .ok()
            .map(|_| Spinning)
    }
}

impl Drop for Spinning {
    fn drop(&mut self) {
        SPINNING.fetch_sub(1, Ordering::AcqRel);
    }
}

impl ReadHalf {
    /// Polls the socket (non-blocking `recvmsg`) for up to `window`. `None`: nothing came
    /// (or no place to spin); read the ordinary way.
    fn spin(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>, window: Duration) -> Option<Poll<io::Result<()>>> {
        let _place = Spinning::enter()?;
        // Within Tokio's cooperative budget, like its own I/O: a task that always finds
        // bytes still yields now and then.
        let coop = match tokio::task::coop::poll_proceed(cx) {
            Poll::Ready(c) => c,
            Poll::Pending => return Some(Poll::Pending),
        };
        let until = Instant::now() + window;
        loop {
            match recv_with_fds(&self.stream, recv_room(buf), &self.fds) {
                Ok(n) => {
                    coop.made_progress();
                    buf.advance(n);
                    self.last_data = Some(Instant::now());
                    if let Some((a, id)) = &self.activity {
                        a.read(*id, now_us());
                    }
                    return Some(Poll::Ready(Ok(())));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() >= until {
                        self.last_data = None;
                        return None;
                    }
                    // Not `spin_loop`: a peer that shares this CPU (a client on a small machine)
                    // gets to run, and answer, at once instead of after our window.
                    std::thread::yield_now();
                }
                Err(e) => {
                    coop.made_progress();
                    return Some(Poll::Ready(Err(e)));
                }
            }
        }
    }
}

/// The most of a caller's unfilled buffer one receive initializes (zeroes) and offers the
/// kernel: about what a unix socket holds at once. A caller reading a 4 GiB frame into its
/// reserved room then commits a step of it per receive, not all 4 GiB before a byte.
const RECV_ROOM: usize = 256 << 10;

/// The part of `buf` one receive writes into, initialized.
fn recv_room<'a>(buf: &'a mut ReadBuf<'_>) -> &'a mut [u8] {
    let n = buf.remaining().min(RECV_ROOM);
    buf.initialize_unfilled_to(n)
}

fn recv_with_fds(stream: &UnixStream, dst: &mut [u8], fds: &FdQueue) -> io::Result<usize> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_RECV))];
    let mut cmsg = RecvAncillaryBuffer::new(&mut space);
    let r = rustix::net::recvmsg(stream, &mut [IoSliceMut::new(dst)], &mut cmsg, RecvFlags::CMSG_CLOEXEC)?;
    for msg in cmsg.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = msg {
            fds.push_received(received);
        }
    }
    if r.flags.contains(ReturnFlags::CTRUNC) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "peer sent more file descriptors than fit in one message",
        ));
    }
    Ok(r.bytes)
}

impl AsyncRead for ReadHalf {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let window = this.busy.spin_window();
        if !window.is_zero()
            && this.last_data.is_some_and(|t| t.elapsed() < window)
            && this.activity.as_ref().is_some_and(|(a, id)| !a.others_active(*id, now_us()))
            && let Some(r) = this.spin(cx, buf, window)
        {
            return r;
        }
        loop {
            ready!(this.stream.poll_read_ready(cx))?;
            let dst = recv_room(buf);
            match this.stream.try_io(Interest::READABLE, || recv_with_fds(&this.stream, dst, &this.fds)) {
                Ok(n) => {
                    buf.advance(n);
                    this.last_data = Some(Instant::now());
                    if let Some((a, id)) = &this.activity {
                        a.read(*id, now_us());
                    }
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

struct WriteHalf {
    stream: Arc<UnixStream>,
    fds: Arc<FdQueue>,
}

fn send_with_fds(stream: &UnixStream, src: &[u8], fds: &[std::os::fd::OwnedFd]) -> io::Result<usize> {
    use std::os::fd::AsFd;
    if fds.is_empty() {
        return Ok(rustix::net::send(stream, src, SendFlags::NOSIGNAL)?);
    }
    let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(borrowed.len()))];
    let mut cmsg = SendAncillaryBuffer::new(&mut space);
    if !cmsg.push(SendAncillaryMessage::ScmRights(&borrowed)) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many file descriptors for one message"));
    }
    Ok(rustix::net::sendmsg(stream, &[IoSlice::new(src)], &mut cmsg, SendFlags::NOSIGNAL)?)
}

impl AsyncWrite for WriteHalf {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, src: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        loop {
            ready!(this.stream.poll_write_ready(cx))?;
            let fds = this.fds.take_outgoing();
            match this.stream.try_io(Interest::WRITABLE, || send_with_fds(&this.stream, src, &fds)) {
                // The kernel now holds the descriptors; ours are closed as `fds` drops.
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    this.fds.restore_outgoing(fds);
                    continue;
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        match rustix::net::shutdown(&*self.stream, rustix::net::Shutdown::Write) {
            Ok(()) | Err(rustix::io::Errno::NOTCONN) => Poll::Ready(Ok(())),
            Err(e) => Poll::Ready(Err(e.into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Seek, Write};

    use ferry_core::Transport;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use crate::PipeTransport;

    /// A reader spins while it alone receives bytes, not while another connection of its
    /// listener did within the window (the window counted from the other's last read, in
    /// µs, across the clock's wrap).
    #[test]
    fn a_reader_spins_only_while_no_other_connection_is_active() {
        let a = super::Activity::default();
        let (r1, r2, r3) = (a.next_id(), a.next_id(), a.next_id());
        assert!(r1 != 0 && r1 != r2 && r2 != r3);
        let w = super::BUSY_WINDOW_OTHERS.as_micros() as u32;
        let t0 = u32::MAX - 15; // (the µs clock wraps during the test)
        let at = |d: u32| t0.wrapping_add(d);
        assert!(!a.others_active(r1, at(0)), "nothing read yet");
        a.read(r1, at(10));
        a.read(r1, at(20));
        assert!(!a.others_active(r1, at(30)), "only reader 1 is active");
        assert!(a.others_active(r2, at(30)), "for reader 2, reader 1 is active");
        a.read(r2, at(40));
        assert!(a.others_active(r1, at(50)) && a.others_active(r2, at(50)), "both active");
        a.read(r2, at(60));
        a.read(r2, at(70)); // (reader 1's read stays the last other one)
        assert!(a.others_active(r2, at(20 + w - 1)), "reader 1 read within the window");
        assert!(!a.others_active(r2, at(20 + w)), "reader 1 fell out of the window");
        assert!(a.others_active(r1, at(70 + w - 1)) && !a.others_active(r1, at(70 + w)));
        assert!(!a.others_active(r3, at(70 + w)), "nobody within the window");
        // Another listener's readers are not counted.
        let other = super::Activity::default();
        assert!(!other.others_active(other.next_id(), at(71)));
    }

    fn memfd_with(content: &[u8]) -> std::os::fd::OwnedFd {
        let fd = rustix::fs::memfd_create("ferry-pipe-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        let mut f = std::fs::File::from(fd);
        f.write_all(content).unwrap();
        f.into()
    }

    #[tokio::test]
    async fn passes_descriptors_with_bytes() {
        let addr: ferry_core::Address = format!("unix:ferry-pipe-fds-{}", std::process::id()).parse().unwrap();
        let t = PipeTransport::new();
        let mut l = t.listen(&addr).await.unwrap();
        let server = tokio::spawn(async move {
            let c = l.accept().await.unwrap();
            assert!(c.info().fd_passing);
            assert_eq!(c.info().peer_pid, Some(std::process::id()));
            let mut s = c.split();
            let mut b = [0u8; 5];
            s.read.read_exact(&mut b).await.unwrap();
            assert_eq!(&b, b"hello");
            let fds = s.fds.unwrap().take(2);
            assert_eq!(fds.len(), 2);
            let mut texts = Vec::new();
            for fd in fds {
                let mut f = std::fs::File::from(fd);
                f.rewind().unwrap();
                let mut t = String::new();
                f.read_to_string(&mut t).unwrap();
                texts.push(t);
            }
            texts
        });
        let c = t.connect(&addr).await.unwrap();
        let mut s = c.split();
        s.fds.as_ref().unwrap().attach(vec![memfd_with(b"one"), memfd_with(b"two")]);
        s.write.write_all(b"hello").await.unwrap();
        let texts = tokio::time::timeout(std::time::Duration::from_secs(10), server).await.unwrap().unwrap();
        assert_eq!(texts, ["one", "two"]);
    }

    #[tokio::test]
    async fn path_sockets_are_private_and_removed() {
        let dir = std::env::temp_dir().join(format!("ferry-pipe-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let addr: ferry_core::Address = format!("unix:{}", path.display()).parse().unwrap();
        let l = PipeTransport::new().listen(&addr).await.unwrap();
        let mode = std::fs::metadata(&path).map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions())).unwrap();
        assert_eq!(mode & 0o077, 0, "socket file mode {mode:o}");
        drop(l);
        assert!(!path.exists(), "socket file left behind");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
