//! Unix sockets: peer credentials and descriptor passing (SCM_RIGHTS with rustix on the
//! tokio socket).

use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use ferry_core::spin::{ListenerSpin, Spin, SpinReader};
use ferry_core::{Address, BusyPoll, ConnInfo, Connection, FdQueue, Split, TransportError};
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::IpcStream;

mod direct;
mod reg;
use direct::Direct;
use reg::Reg;

/// A unix-socket connection.
pub(crate) struct LocalConnection {
    stream: Arc<UnixStream>,
    info: ConnInfo,
    /// Its place among its listener's readers, for a connection it accepted
    /// ([`LocalConnection::serving`]); a connecting side never busy-polls.
    spin: Option<SpinReader>,
    /// Its read half's direct wait ([`ferry_core::DirectRead`]).
    direct: Arc<Direct>,
}

impl LocalConnection {
    pub(crate) fn new(stream: IpcStream, addr: &Address, allow_any_user: bool) -> Result<Self, TransportError> {
        let stream: tokio::net::UnixStream = match stream {
            IpcStream::UdSocket(s) => s.into(),
        };
        let cred = stream.peer_cred().map_err(|e| TransportError::Io(Arc::new(e)))?;
        let me = rustix::process::geteuid().as_raw();
        if !allow_any_user && cred.uid() != me {
            return Err(TransportError::PeerRefused(format!(
                "peer runs as uid {} (pid {:?}), this process as uid {me}; only the same user may connect \
                 (LocalTransport::allow_any_user lifts this)",
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
        // Out of the runtime's hands: each half registers what it waits for itself ([`reg`]).
        let stream = stream.into_std().map_err(|e| TransportError::Io(Arc::new(e)))?;
        // Blocking, for the direct wait's blocking read; every other read and write says
        // `MSG_DONTWAIT` ([`direct`]).
        stream.set_nonblocking(false).map_err(|e| TransportError::Io(Arc::new(e)))?;
        let stream = Arc::new(stream);
        Ok(LocalConnection { direct: Direct::new(stream.clone()), stream, info, spin: None })
    }

    /// A connection the listener of `spin` accepted: its reader may busy-poll, under that
    /// listener's policy ([`ferry_core::spin`]).
    pub(crate) fn serving(mut self, spin: &Arc<ListenerSpin>) -> Self {
        self.spin = Some(spin.reader());
        self
    }
}

impl Connection for LocalConnection {
    fn info(&self) -> &ConnInfo {
        &self.info
    }

    fn direct_read(&self) -> Option<Arc<dyn ferry_core::DirectRead>> {
        Some(self.direct.clone())
    }

    fn split(self: Box<Self>) -> Split {
        let fds = FdQueue::new();
        self.direct.set_fds(fds.clone());
        let busy = Arc::new(BusyPoll::default());
        Split {
            read: Box::new(ReadHalf {
                stream: self.stream.clone(),
                fds: fds.clone(),
                busy: busy.clone(),
                last_data: None,
                spin: self.spin,
                direct: self.direct.clone(),
            }),
            liveness: Some(Arc::new(Liveness(self.stream.clone()))),
            write: Box::new(WriteHalf { stream: self.stream, fds: fds.clone(), direct: self.direct.clone() }),
            fds: Some(fds),
            busy_poll: Some(busy),
        }
    }
}

/// The peer's end, seen without reading: `poll(2)` with no wait for `POLLRDHUP` (the peer
/// closed or shut its writing; the kernel closes a dead process's sockets) and the
/// `POLLHUP` / `POLLERR` it always reports. It consumes nothing and costs one system call.
struct Liveness(Arc<UnixStream>);

impl ferry_core::PeerLiveness for Liveness {
    fn peer_gone(&self) -> bool {
        use rustix::event::{PollFd, PollFlags, Timespec};
        let mut fds = [PollFd::new(&*self.0, PollFlags::RDHUP)];
        let zero = Timespec { tv_sec: 0, tv_nsec: 0 };
        match rustix::event::poll(&mut fds, Some(&zero)) {
            Ok(_) => fds[0].revents().intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR | PollFlags::NVAL),
            Err(_) => false,
        }
    }
}

struct ReadHalf {
    stream: Arc<UnixStream>,
    fds: Arc<FdQueue>,
    busy: Arc<BusyPoll>,
    /// When bytes last arrived; `None` once a busy poll found none (cold until they do).
    last_data: Option<Instant>,
    /// See [`LocalConnection::spin`].
    spin: Option<SpinReader>,
    /// See [`LocalConnection::direct`].
    direct: Arc<Direct>,
}

impl ReadHalf {
    /// Bytes came: a reader that may busy-poll notes when (its policy's input); others
    /// skip the clock read.
    fn got_data(&mut self) {
        if self.spin.is_some() {
            self.last_data = Some(Instant::now());
        }
    }

    /// Polls the socket (non-blocking `recvmsg`) for up to the window, when its listener's
    /// policy says so ([`ferry_core::spin::decide`]). `None`: it did not, or nothing came;
    /// read the ordinary way.
    fn spin(&mut self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Option<Poll<io::Result<()>>> {
        let reader = self.spin.as_ref()?;
        let Spin::Poll(window) = reader.decide(&self.busy, self.last_data.map(|t| t.elapsed())) else { return None };
        let place = reader.enter()?;
        // Within Tokio's cooperative budget, like its own I/O: a task that always finds
        // bytes still yields now and then.
        let coop = match tokio::task::coop::poll_proceed(cx) {
            Poll::Ready(c) => c,
            Poll::Pending => return Some(Poll::Pending),
        };
        let until = Instant::now() + window;
        loop {
            match recv_with_fds(&self.stream, buf, &self.fds) {
                Ok(_) => {
                    coop.made_progress();
                    place.hit();
                    reader.received();
                    self.last_data = Some(Instant::now());
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

/// The most of a caller's unfilled buffer one receive offers the kernel: about what a unix
/// socket holds at once. A caller reading a 4 GiB frame into its reserved room then
/// commits a step of it per receive, not all 4 GiB before a byte (the room is not zeroed
/// first: [`crate::sys::recv_into`]).
const RECV_ROOM: usize = 256 << 10;

/// A receive into `buf`'s unfilled room that does not wait (the socket's file is blocking:
/// [`direct`]); the bytes are marked filled.
fn recv_with_fds(stream: &UnixStream, buf: &mut ReadBuf<'_>, fds: &FdQueue) -> io::Result<usize> {
    recv_with_fds_as(stream, buf, Some(fds), false)
}

/// A receive, waiting when `block` (up to the socket's `SO_RCVTIMEO`); descriptors that
/// come with the bytes go to `fds` (`None`: closed, for a connection never split).
fn recv_with_fds_as(
    stream: &UnixStream,
    buf: &mut ReadBuf<'_>,
    fds: Option<&FdQueue>,
    block: bool,
) -> io::Result<usize> {
    let (n, received) = crate::sys::recv_into(stream, buf, RECV_ROOM, block)?;
    if let (Some(q), false) = (fds, received.is_empty()) {
        q.push_received(received);
    }
    Ok(n)
}

impl AsyncRead for ReadHalf {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // A direct wait saw bytes the runtime may not have seen yet: take them now (first
        // those it read itself).
        if this.direct.primed() {
            if let Some(r) = this.direct.take_stash(buf) {
                this.got_data();
                return Poll::Ready(r);
            }
            match recv_with_fds(&this.stream, buf, &this.fds) {
                Ok(_) => {
                    this.got_data();
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => this.direct.unprime(),
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        // A blocking caller drives this read: it waits for the socket itself and polls
        // again ([`ferry_core::DirectRead::drive`]), so the runtime is not asked to watch.
        if this.direct.driven_here(ferry_core::Half::Read) {
            return match recv_with_fds(&this.stream, buf, &this.fds) {
                Ok(_) => {
                    this.got_data();
                    Poll::Ready(Ok(()))
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Poll::Pending,
                Err(e) => Poll::Ready(Err(e)),
            };
        }
        if let Some(r) = this.spin(cx, buf) {
            return r;
        }
        let (stream, fds) = (&this.stream, &this.fds);
        ready!(this.direct.read().poll_io(cx, || Ok(Arc::clone(stream)), || recv_with_fds(stream, buf, fds)))?;
        this.got_data();
        if let Some(r) = &this.spin {
            r.received();
        }
        Poll::Ready(Ok(()))
    }
}

struct WriteHalf {
    stream: Arc<UnixStream>,
    fds: Arc<FdQueue>,
    /// The connection's direct wait, which keeps the write half's registration (for room
    /// alone, on a duplicate of the socket, made when a write first has to wait for room:
    /// most never do) and says when a blocking caller drives the write.
    direct: Arc<Direct>,
}

fn send_with_fds(stream: &UnixStream, src: &[u8], fds: &[OwnedFd]) -> io::Result<usize> {
    if fds.is_empty() {
        return Ok(rustix::net::send(stream, src, SendFlags::NOSIGNAL | SendFlags::DONTWAIT)?);
    }
    let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(borrowed.len()))];
    let mut cmsg = SendAncillaryBuffer::new(&mut space);
    if !cmsg.push(SendAncillaryMessage::ScmRights(&borrowed)) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many file descriptors for one message"));
    }
    Ok(rustix::net::sendmsg(stream, &[IoSlice::new(src)], &mut cmsg, SendFlags::NOSIGNAL | SendFlags::DONTWAIT)?)
}

impl AsyncWrite for WriteHalf {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, src: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let (stream, queue) = (&this.stream, &this.fds);
        let send = || {
            let fds = queue.take_outgoing();
            let r = send_with_fds(stream, src, &fds);
            if r.as_ref().is_err_and(|e| e.kind() == io::ErrorKind::WouldBlock) {
                // Not sent: they go with the next try (the kernel holds those of a send
                // that went; ours are closed as `fds` drops).
                queue.restore_outgoing(fds);
            }
            r
        };
        // Straight to the socket: room is the rule, and the runtime is asked only when
        // there is none.
        match send() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            r => return Poll::Ready(r),
        }
        // A blocking caller drives this write: it waits for room itself and polls again
        // ([`ferry_core::DirectRead::drive`]).
        if this.direct.driven_here(ferry_core::Half::Write) {
            return Poll::Pending;
        }
        this.direct.write().poll_io(cx, || stream.as_fd().try_clone_to_owned(), send)
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

    use crate::LocalTransport;

    fn memfd_with(content: &[u8]) -> std::os::fd::OwnedFd {
        let fd = rustix::fs::memfd_create("ferry-local-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        let mut f = std::fs::File::from(fd);
        f.write_all(content).unwrap();
        f.into()
    }

    #[tokio::test]
    async fn passes_descriptors_with_bytes() {
        let addr: ferry_core::Address = format!("unix:ferry-local-fds-{}", std::process::id()).parse().unwrap();
        let t = LocalTransport::new();
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
        let dir = std::env::temp_dir().join(format!("ferry-local-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let addr: ferry_core::Address = format!("unix:{}", path.display()).parse().unwrap();
        let l = LocalTransport::new().listen(&addr).await.unwrap();
        let mode = std::fs::metadata(&path).map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions())).unwrap();
        assert_eq!(mode & 0o077, 0, "socket file mode {mode:o}");
        drop(l);
        assert!(!path.exists(), "socket file left behind");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
