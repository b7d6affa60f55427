//! Named pipes (Windows): the same-user rule by security descriptor and peer process owner,
//! and the connection's halves.
//!
//! - A listener's pipe gets a protected DACL that grants the current user alone (with
//!   [`LocalTransport::allow_any_user`](crate::LocalTransport::allow_any_user): also any
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
    Ok(sddl_for(me()?, allow_any_user))
}

/// What authenticated users may do to a pipe with `allow_any_user`: FILE_GENERIC_READ |
/// FILE_GENERIC_WRITE without FILE_APPEND_DATA, which on a pipe is FILE_CREATE_PIPE_INSTANCE
/// (with it, any user could add server instances to the pipe and take its connections).
pub(crate) const OTHERS_MASK: &str = "0x12019b";

/// [`pipe_sddl`] for the user `sid`.
fn sddl_for(sid: &str, allow_any_user: bool) -> String {
    let others = if allow_any_user { format!("(A;;{OTHERS_MASK};;;AU)") } else { String::new() };
    format!("D:P(A;;GA;;;{sid}){others}")
}

/// The number this process gives the user `sid` (see `ConnInfo::peer_uid`): users are
/// numbered from 1 in the order this process meets them, so two connections of one user
/// get one number, and two users never share one.
fn user_number(sid: &str) -> u32 {
    static USERS: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut users = USERS.lock().unwrap_or_else(|e| e.into_inner());
    let i = match users.iter().position(|u| u == sid) {
        Some(i) => i,
        None => {
            users.push(sid.to_owned());
            users.len() - 1
        }
    };
    u32::try_from(i + 1).unwrap_or(u32::MAX)
}

/// Why the same-user rule refuses peer process `pid` (`None`: it passes), given this
/// process's user `me` and a lookup of a process's user.
fn same_user_refusal(me: &str, pid: Option<u32>, user_of: impl FnOnce(u32) -> io::Result<String>) -> Option<String> {
    const LIFT: &str = "only the same user may connect (LocalTransport::allow_any_user lifts this)";
    let Some(pid) = pid else {
        return Some(format!("the peer's process id is unknown, so its user cannot be checked; {LIFT}"));
    };
    match user_of(pid) {
        Ok(user) if user == me => None,
        Ok(user) => Some(format!("peer process {pid} runs as {user}, this process as {me}; {LIFT}")),
        Err(e) => Some(format!("the user of peer process {pid} cannot be read ({e}); {LIFT}")),
    }
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
pub(crate) struct LocalConnection {
    stream: IpcStream,
    info: ConnInfo,
}

impl LocalConnection {
    pub(crate) fn new(stream: IpcStream, addr: &Address, allow_any_user: bool) -> Result<Self, TransportError> {
        let pid = stream.peer_creds().ok().and_then(|c| c.pid());
        let me = me()?;
        // The peer's user, looked up once: checked against this one's, and numbered.
        let mut user = None;
        let mut lookup = |pid| {
            let u = sys::process_user(pid);
            user = u.as_ref().ok().cloned();
            u
        };
        if allow_any_user {
            if let Some(pid) = pid {
                let _ = lookup(pid);
            }
        } else if let Some(why) = same_user_refusal(me, pid, lookup) {
            return Err(TransportError::PeerRefused(why));
        }
        let info = ConnInfo {
            transport: "unix",
            addr: addr.to_string(),
            peer_pid: pid,
            peer_uid: user.as_deref().map(user_number),
            fd_passing: false,
            same_host: true,
            handle: None,
        };
        Ok(LocalConnection { stream, info })
    }
}

impl Connection for LocalConnection {
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
            liveness: None,
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
/// while a named pipe's flush (FlushFileBuffers) waits until the peer has read them all.
/// That wait happens once, when the pipe closes: interprocess hands a pipe with unread
/// bytes to its linger threads, which flush it and then close it, so a peer that stops
/// reading delays only the closing of its own pipe (and holds one linger thread).
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use interprocess::local_socket::tokio::prelude::*;
    use interprocess::local_socket::{GenericNamespaced, ListenerOptions};
    use interprocess::os::windows::local_socket::ListenerOptionsExt;

    use super::*;

    const OTHER: &str = "S-1-5-21-1111111111-2222222222-3333333333-1001";

    #[test]
    fn another_users_process_is_refused_by_name() {
        let me = me().unwrap();
        assert!(me.starts_with("S-1-"), "{me}");
        assert_eq!(same_user_refusal(me, Some(7), |_| Ok(me.to_owned())), None);
        let why = same_user_refusal(me, Some(7), |_| Ok(OTHER.to_owned())).unwrap();
        assert!(why.contains(&format!("peer process 7 runs as {OTHER}, this process as {me}")), "{why}");
        assert!(why.contains("allow_any_user"), "{why}");
        let why = same_user_refusal(me, Some(7), |_| Err(io::ErrorKind::PermissionDenied.into())).unwrap();
        assert!(why.contains("cannot be read"), "{why}");
        assert!(same_user_refusal(me, None, |_| unreachable!()).unwrap().contains("unknown"));
    }

    #[test]
    fn users_get_numbers_of_their_own() {
        let mine = user_number(me().unwrap());
        let other = user_number(OTHER);
        assert_ne!(mine, other);
        assert_eq!(user_number(OTHER), other);
        assert_eq!(user_number(me().unwrap()), mine);
    }

    #[test]
    fn this_process_runs_as_its_own_user() {
        let me = me().unwrap();
        assert_eq!(sys::process_user(std::process::id()).unwrap(), me);
    }

    /// The DACL is what keeps other users out: a pipe whose DACL grants only another user
    /// cannot be opened by this one. Windows enforces it; Wine 8 does not check pipe DACLs
    /// (the pipe opens), so there the test only says so.
    #[tokio::test]
    async fn a_pipe_granted_to_another_user_cannot_be_opened() {
        if std::path::Path::new(r"Z:\proc\self").exists() {
            eprintln!("under Wine, which does not enforce pipe DACLs: not checked");
            return;
        }
        let name = format!("ferry-local-dacl-test-{}", std::process::id());
        let wide = widestring::U16CString::from_str(sddl_for(OTHER, false)).unwrap();
        let sd = SecurityDescriptor::deserialize(&wide).unwrap();
        let opts = ListenerOptions::new().name(name.as_str().to_ns_name::<GenericNamespaced>().unwrap());
        let _l = opts.security_descriptor(sd).create_tokio().unwrap();
        let connect = IpcStream::connect(name.as_str().to_ns_name::<GenericNamespaced>().unwrap());
        let e = tokio::time::timeout(Duration::from_secs(20), connect).await.unwrap().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    }
}
