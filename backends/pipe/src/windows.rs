//! Named pipes (Windows): the same-user rule by security descriptor and peer process owner,
//! and the connection's halves.
//!
//! - A listener's pipe gets a protected DACL that grants the current user alone (with
//!   [`PipeTransport::allow_any_user`](crate::PipeTransport::allow_any_user): also any
//!   authenticated user), so another user's process cannot open it at all.
//! - Both sides then check the peer process's owner: a client refuses a server run by
//!   another user (a pipe name squatted before the real server started), and a server
//!   refuses a client of another user (a DACL changed behind its back).

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::task::{Context, Poll, Waker};

use ferry_core::{Address, ConnInfo, Connection, Split, TransportError};
use interprocess::local_socket::traits::StreamCommon as _;
use interprocess::os::windows::security_descriptor::SecurityDescriptor;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::IpcStream;
use crate::sys;

/// The string SID of the user this process runs as (looked up once).
fn me() -> Result<&'static str, TransportError> {
    static ME: OnceLock<Result<String, String>> = OnceLock::new();
    ME.get_or_init(|| sys::current_user().map_err(|e| e.to_string()))
        .as_deref()
        .map_err(|e| TransportError::Io(Arc::new(io::Error::other(format!("the current user's SID: {e}")))))
}

/// The DACL of a listener's pipe, in SDDL: protected (nothing inherited), full access for
/// this user and, when any user may connect, read and write for authenticated users.
pub(crate) fn pipe_sddl(allow_any_user: bool) -> Result<String, TransportError> {
    let me = me()?;
    let others = if allow_any_user { "(A;;GRGW;;;AU)" } else { "" };
    Ok(format!("D:P(A;;GA;;;{me}){others}"))
}

/// The security descriptor of [`pipe_sddl`].
pub(crate) fn pipe_security(allow_any_user: bool) -> io::Result<SecurityDescriptor> {
    let sddl = pipe_sddl(allow_any_user).map_err(io::Error::other)?;
    let wide = widestring::U16CString::from_str(&sddl).map_err(io::Error::other)?;
    SecurityDescriptor::deserialize(&wide)
}

/// The owner and DACL of the pipe `stream` is connected to, in SDDL.
pub(crate) fn stream_sddl(stream: &IpcStream) -> io::Result<String> {
    use std::os::windows::io::AsHandle;
    let IpcStream::NamedPipe(s) = stream;
    sys::security_sddl(s.inner().as_handle())
}

/// A named-pipe connection (no descriptor passing).
pub(crate) struct PipeConnection {
    stream: IpcStream,
    info: ConnInfo,
}

impl PipeConnection {
    pub(crate) fn new(stream: IpcStream, addr: &Address, allow_any_user: bool) -> Result<Self, TransportError> {
        let pid = stream.peer_creds().ok().and_then(|c| c.pid());
        if !allow_any_user {
            let me = me()?;
            let Some(pid) = pid else {
                return Err(TransportError::PeerRefused(
                    "the peer's process id is unknown, so its user cannot be checked \
                     (PipeTransport::allow_any_user lifts this)"
                        .into(),
                ));
            };
            match sys::process_user(pid) {
                Ok(user) if user == me => {}
                Ok(user) => {
                    return Err(TransportError::PeerRefused(format!(
                        "peer process {pid} runs as {user}, this process as {me}; only the same user may \
                         connect (PipeTransport::allow_any_user lifts this)"
                    )));
                }
                Err(e) => {
                    return Err(TransportError::PeerRefused(format!(
                        "the user of peer process {pid} cannot be read ({e}); only the same user may connect \
                         (PipeTransport::allow_any_user lifts this)"
                    )));
                }
            }
        }
        let info = ConnInfo {
            transport: "unix",
            addr: addr.to_string(),
            peer_pid: pid,
            peer_uid: None,
            fd_passing: false,
            same_host: true,
            handle: None,
        };
        Ok(PipeConnection { stream, info })
    }
}

impl Connection for PipeConnection {
    fn info(&self) -> &ConnInfo {
        &self.info
    }

    fn split(self: Box<Self>) -> Split {
        let shared = Arc::new(Shared { stream: RwLock::new(Some(self.stream)), reader: Mutex::default() });
        Split {
            read: Box::new(ReadHalf(shared.clone())),
            write: Box::new(WriteHalf(shared)),
            fds: None,
            busy_poll: None,
        }
    }
}

/// What the two halves share. A named pipe has no half-close: the peer sees the end only
/// when the pipe's handle closes. So shutting the write half down (or dropping it) closes
/// the stream for both halves: the read half then reads end-of-stream (a read waiting for
/// bytes is woken), and the peer reads what was written, then end-of-stream (interprocess
/// keeps a pipe with unread bytes open until the peer has read them).
///
/// Reads and writes hold the lock only while they poll, which never blocks.
struct Shared {
    stream: RwLock<Option<IpcStream>>,
    /// The waker of a read waiting for bytes.
    reader: Mutex<Option<Waker>>,
}

impl Shared {
    fn stream(&self) -> std::sync::RwLockReadGuard<'_, Option<IpcStream>> {
        self.stream.read().unwrap_or_else(|e| e.into_inner())
    }

    fn shut_down(&self) {
        let stream = self.stream.write().unwrap_or_else(|e| e.into_inner()).take();
        drop(stream);
        if let Some(w) = self.reader.lock().unwrap_or_else(|e| e.into_inner()).take() {
            w.wake();
        }
    }
}

/// The read half: reads through a shared reference (named pipes read and write at once).
struct ReadHalf(Arc<Shared>);

impl AsyncRead for ReadHalf {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        {
            let mut w = self.0.reader.lock().unwrap_or_else(|e| e.into_inner());
            if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *w = Some(cx.waker().clone());
            }
        }
        // Looked at after the waker is in place: a shutdown in between wakes this read.
        match &*self.0.stream() {
            Some(s) => Pin::new(&mut &*s).poll_read(cx, buf),
            None => Poll::Ready(Ok(())),
        }
    }
}

/// The write half. Flushing does nothing: a write completes once the pipe holds the bytes,
/// while a named pipe's flush (FlushFileBuffers) waits until the peer has read them all,
/// which would let a peer that stops reading hold a thread per flush.
struct WriteHalf(Arc<Shared>);

impl AsyncWrite for WriteHalf {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match &*self.0.stream() {
            Some(s) => Pin::new(&mut &*s).poll_write(cx, buf),
            None => Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.0.shut_down();
        Poll::Ready(Ok(()))
    }
}

impl Drop for WriteHalf {
    /// As a unix socket's write half: dropping it ends the stream for the peer.
    fn drop(&mut self) {
        self.0.shut_down();
    }
}
