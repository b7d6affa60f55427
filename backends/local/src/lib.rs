//! ferry-local: the local-socket [`Transport`] (scheme `unix`).
//!
//! - `unix:NAME` is a socket in Linux's abstract namespace (no file, nothing to clean up,
//!   even after SIGKILL); on other unixes a file in the temp directory; on Windows the named
//!   pipe `\\.\pipe\NAME` (also written `unix:\\.\pipe\NAME`; socket files are refused
//!   there). `unix:/path/to.sock` (or any name with a `/`) is a socket file, created with
//!   mode 0600 and removed when the listener is dropped.
//! - On Windows the same-user rule is a protected pipe DACL for the current user's SID plus
//!   a check of the peer process's user (`windows.rs`); the crate's unsafe code (Windows
//!   security calls) lives in `sys/`.
//! - An address in use: a socket file that nobody listens on (its server was killed) is
//!   removed and bound again, so a supervisor's restart loop recovers; a live listener is
//!   never disturbed, and the error names its pid and uid (peer credentials), for socket
//!   files and abstract names alike.
//! - Peer credentials: by default both sides check that the peer runs as the same user
//!   (abstract sockets have no file permissions); [`LocalTransport::allow_any_user`] lifts it.
//! - On unix, connections carry file descriptors (SCM_RIGHTS) through the connection's
//!   [`FdQueue`](ferry_core::FdQueue): the shm channel passes its memfd segments this way.
//!
//! It does no framing of its own: ferry-core's frame format runs on top. Entry point:
//! [`LocalTransport::new`], registered in an [`ferry_core::Endpoint`].
//!
//! # Feature flags
//! None.
#![deny(unsafe_code)]

use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::{Address, Connection, Listener, Transport, TransportError};
use interprocess::local_socket::tokio::{Listener as IpcListener, Stream as IpcStream, prelude::*};
use interprocess::local_socket::{GenericFilePath, GenericNamespaced, ListenerOptions, Name};

#[cfg(unix)]
mod holder;
#[cfg(windows)]
mod sys;
#[cfg(unix)]
#[path = "sys/unix.rs"]
mod sys;
#[cfg(unix)]
mod unix;
#[cfg(windows)]
mod windows;

/// The local-socket transport.
#[derive(Debug, Clone, Default)]
pub struct LocalTransport {
    allow_any_user: bool,
}

impl LocalTransport {
    /// A transport that only talks to peers of the same user.
    pub fn new() -> Self {
        Self::default()
    }

    /// Accept (and connect to) peers of any user. Off by default.
    pub fn allow_any_user(mut self, yes: bool) -> Self {
        self.allow_any_user = yes;
        self
    }
}

/// How an address names a socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SocketName {
    /// An abstract / namespaced name.
    Namespaced(String),
    /// A filesystem path.
    Path(String),
}

impl SocketName {
    /// Parses the part after `unix:`.
    pub fn parse(addr: &Address) -> Result<Self, TransportError> {
        let rest = addr.rest();
        let bad = |reason: &'static str| TransportError::BadAddress { addr: addr.to_string(), reason: reason.into() };
        if rest.contains('\0') {
            return Err(bad("socket names cannot contain NUL"));
        }
        #[cfg(windows)]
        if rest.contains('/') || (rest.contains('\\') && !rest.starts_with(r"\\.\pipe\")) {
            return Err(bad(
                "on Windows a unix: address names a pipe: unix:NAME (\\\\.\\pipe\\NAME) or unix:\\\\.\\pipe\\NAME; \
                 socket files are not supported",
            ));
        }
        if rest.contains('/') || rest.contains('\\') {
            if rest.len() > 107 {
                return Err(bad("socket paths are limited to 107 bytes"));
            }
            Ok(SocketName::Path(rest.to_string()))
        } else {
            if rest.len() > 100 {
                return Err(bad("socket names are limited to 100 bytes"));
            }
            Ok(SocketName::Namespaced(rest.to_string()))
        }
    }

    fn to_name(&self) -> std::io::Result<Name<'_>> {
        match self {
            SocketName::Namespaced(n) => n.as_str().to_ns_name::<GenericNamespaced>(),
            SocketName::Path(p) => p.as_str().to_fs_name::<GenericFilePath>(),
        }
    }
}

fn io_err(addr: &Address, e: std::io::Error) -> TransportError {
    use std::io::ErrorKind::*;
    match e.kind() {
        AddrInUse => TransportError::AddrInUse { addr: addr.to_string(), detail: String::new() },
        NotFound | ConnectionRefused => TransportError::NotListening { addr: addr.to_string(), detail: e.to_string() },
        _ => TransportError::Io(Arc::new(e)),
    }
}

#[async_trait]
impl Transport for LocalTransport {
    fn scheme(&self) -> &'static str {
        "unix"
    }

    fn name(&self) -> &'static str {
        "local"
    }

    async fn listen(&self, addr: &Address) -> Result<Box<dyn Listener>, TransportError> {
        let name = SocketName::parse(addr)?;
        let bind = || -> std::io::Result<IpcListener> {
            let opts = ListenerOptions::new().name(name.to_name()?);
            #[cfg(unix)]
            let opts = {
                use interprocess::os::unix::local_socket::ListenerOptionsExt;
                if self.allow_any_user { opts } else { opts.mode(0o600) }
            };
            #[cfg(windows)]
            let opts = {
                use interprocess::os::windows::local_socket::ListenerOptionsExt;
                opts.security_descriptor(windows::pipe_security(self.allow_any_user)?)
            };
            opts.create_tokio()
        };
        let inner = match bind() {
            Ok(l) => l,
            #[cfg(unix)]
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => match holder::holder(&name) {
                // A socket file nobody listens on (its server died without removing it,
                // e.g. by SIGKILL): remove it and bind.
                holder::Holder::Stale(path) => {
                    tracing::info!(%addr, "removing a stale socket file (nothing listens on it)");
                    std::fs::remove_file(&path).map_err(|e| io_err(addr, e))?;
                    bind().map_err(|e| io_err(addr, e))?
                }
                holder::Holder::Live { pid, uid } => {
                    return Err(TransportError::AddrInUse {
                        addr: addr.to_string(),
                        detail: format!(
                            ": another process listens there (pid {}, uid {uid}); stop it or choose another address",
                            pid.map_or_else(|| "unknown".to_owned(), |p| p.to_string())
                        ),
                    });
                }
                holder::Holder::Unknown => return Err(io_err(addr, e)),
            },
            // FILE_FLAG_FIRST_PIPE_INSTANCE on a name that exists fails with ACCESS_DENIED.
            #[cfg(windows)]
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(TransportError::AddrInUse {
                    addr: addr.to_string(),
                    detail: ": a pipe of this name already exists (another listener, possibly another user's); \
                             stop it or choose another address"
                        .into(),
                });
            }
            Err(e) => return Err(io_err(addr, e)),
        };
        tracing::debug!(%addr, "listening");
        Ok(Box::new(LocalListener {
            inner,
            addr: addr.clone(),
            allow_any_user: self.allow_any_user,
            #[cfg(unix)]
            spin: Arc::default(),
        }))
    }

    async fn connect(&self, addr: &Address) -> Result<Box<dyn Connection>, TransportError> {
        let name = SocketName::parse(addr)?;
        let stream =
            IpcStream::connect(name.to_name().map_err(|e| io_err(addr, e))?).await.map_err(|e| io_err(addr, e))?;
        let conn = LocalConnection::new(stream, addr, self.allow_any_user)?;
        Ok(Box::new(conn))
    }
}

struct LocalListener {
    inner: IpcListener,
    addr: Address,
    allow_any_user: bool,
    /// Its connections' busy polling (which received bytes last: it backs off while
    /// several do; how many spin).
    #[cfg(unix)]
    spin: Arc<ferry_core::ListenerSpin>,
}

#[async_trait]
impl Listener for LocalListener {
    async fn accept(&mut self) -> Result<Box<dyn Connection>, TransportError> {
        loop {
            let stream = self.inner.accept().await.map_err(|e| io_err(&self.addr, e))?;
            match LocalConnection::new(stream, &self.addr, self.allow_any_user) {
                #[cfg(unix)]
                Ok(c) => return Ok(Box::new(c.serving(&self.spin))),
                #[cfg(not(unix))]
                Ok(c) => return Ok(Box::new(c)),
                Err(TransportError::PeerRefused(why)) => {
                    tracing::warn!(addr = %self.addr, "refused a peer: {why}");
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn local_addr(&self) -> Address {
        self.addr.clone()
    }

    #[cfg(unix)]
    fn spin(&self) -> Option<Arc<ferry_core::ListenerSpin>> {
        Some(self.spin.clone())
    }
}

#[cfg(unix)]
use unix::LocalConnection;
#[cfg(windows)]
use windows::LocalConnection;

/// The owner and access list (DACL) of the named pipe at `addr`, in SDDL (Windows; for
/// diagnostics and tests). It connects once, which the listener sees as a connection that
/// closes before its handshake.
#[cfg(windows)]
pub async fn pipe_security(addr: &Address) -> Result<String, TransportError> {
    let name = SocketName::parse(addr)?;
    let stream = IpcStream::connect(name.to_name().map_err(|e| io_err(addr, e))?).await.map_err(|e| io_err(addr, e))?;
    windows::stream_sddl(&stream).map_err(|e| io_err(addr, e))
}

/// The DACL a listener of this process gives its named pipes, in SDDL (Windows).
#[cfg(windows)]
pub fn listener_dacl(allow_any_user: bool) -> Result<String, TransportError> {
    windows::pipe_sddl(allow_any_user)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let n = |s: &str| SocketName::parse(&s.parse().unwrap());
        assert_eq!(n("unix:svc").unwrap(), SocketName::Namespaced("svc".into()));
        #[cfg(unix)]
        {
            assert_eq!(n("unix:/run/x.sock").unwrap(), SocketName::Path("/run/x.sock".into()));
            assert_eq!(n("unix:./x.sock").unwrap(), SocketName::Path("./x.sock".into()));
        }
        #[cfg(windows)]
        {
            assert_eq!(n(r"unix:\\.\pipe\svc").unwrap(), SocketName::Path(r"\\.\pipe\svc".into()));
            for bad in ["unix:/run/x.sock", "unix:./x.sock", r"unix:C:\x.sock"] {
                let e = n(bad).unwrap_err().to_string();
                assert!(e.contains("on Windows a unix: address names a pipe"), "{bad}: {e}");
            }
        }
        assert!(n(&format!("unix:{}", "a".repeat(101))).is_err());
        assert!(n("unix:a\0b").is_err());
    }
}
