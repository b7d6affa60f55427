//! The QUIC [`Transport`]: one QUIC connection per pipe, its first bidirectional stream
//! carrying ferry's frames.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use ferry_core::{Address, ConnInfo, Connection, Listener, Split, Transport, TransportError, TransportHandle};
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::mpsc;

use crate::QuicOptions;
use crate::tls::{self, Identity};

/// A parsed `quic://host:port[#sha256=HEX]` address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuicAddr {
    /// `host:port`.
    pub host_port: String,
    /// The pinned server fingerprint, if given.
    pub pin: Option<String>,
}

impl QuicAddr {
    /// Parses the part after `quic:`.
    pub fn parse(addr: &Address) -> Result<Self, TransportError> {
        let bad = |reason: String| TransportError::BadAddress { addr: addr.to_string(), reason: reason.into() };
        let rest = addr
            .rest()
            .strip_prefix("//")
            .ok_or_else(|| bad("expected quic://host:port[#sha256=FINGERPRINT]".into()))?;
        let (host_port, frag) = match rest.split_once('#') {
            Some((h, f)) => (h, Some(f)),
            None => (rest, None),
        };
        if host_port.rsplit_once(':').is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err()) {
            return Err(bad(format!("{host_port:?} is not host:port")));
        }
        let pin = match frag {
            None => None,
            Some(f) => match f.strip_prefix("sha256=") {
                Some(hex) if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
                    Some(hex.to_ascii_lowercase())
                }
                _ => return Err(bad(format!("fragment {f:?} must be sha256=<64 hex digits>"))),
            },
        };
        Ok(QuicAddr { host_port: host_port.to_string(), pin })
    }

    async fn resolve(&self, addr: &Address) -> Result<SocketAddr, TransportError> {
        tokio::net::lookup_host(&self.host_port).await.map_err(|e| TransportError::Io(Arc::new(e)))?.next().ok_or_else(
            || TransportError::BadAddress {
                addr: addr.to_string(),
                reason: "the host name resolves to nothing".into(),
            },
        )
    }
}

/// The QUIC transport (scheme `quic`).
#[derive(Debug, Default)]
pub struct QuicTransport {
    opts: QuicOptions,
    identity: OnceLock<Arc<Identity>>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Identity(sha256={})", self.fingerprint())
    }
}

impl QuicTransport {
    /// With default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// With these options.
    pub fn with_options(opts: QuicOptions) -> Self {
        QuicTransport { opts, identity: OnceLock::new() }
    }

    /// The server identity (loaded from its file, or created there on first use).
    pub fn identity(&self) -> Result<Arc<Identity>, TransportError> {
        if let Some(id) = self.identity.get() {
            return Ok(id.clone());
        }
        let id = match &self.opts.identity {
            crate::IdentitySource::Ephemeral => Identity::generate()?,
            crate::IdentitySource::File(p) => Identity::load_or_create(p)?,
            crate::IdentitySource::Default => Identity::load_or_create(&tls::default_identity_path())?,
        };
        // Calls racing here may each have made one (an ephemeral identity differs per call):
        // every one of them returns the one stored first, never its own.
        Ok(self.identity.get_or_init(|| Arc::new(id)).clone())
    }

    /// The server's SHA-256 fingerprint, for clients to pin.
    pub fn fingerprint(&self) -> Result<String, TransportError> {
        Ok(self.identity()?.fingerprint())
    }

    pub(crate) fn transport_config_for_baseline(&self) -> Result<Arc<quinn::TransportConfig>, TransportError> {
        self.transport_config()
    }

    fn transport_config(&self) -> Result<Arc<quinn::TransportConfig>, TransportError> {
        let o = &self.opts;
        if o.keep_alive.is_zero() || (!o.idle_timeout.is_zero() && o.keep_alive >= o.idle_timeout) {
            return Err(TransportError::ApiMisuse(
                "QuicOptions::keep_alive must be above zero and shorter than QuicOptions::idle_timeout \
                 (a third of it or less, so that a lost keep-alive does not end the connection)",
            ));
        }
        let mut t = quinn::TransportConfig::default();
        let idle = quinn::IdleTimeout::try_from(o.idle_timeout)
            .map_err(|_| TransportError::ApiMisuse("QuicOptions::idle_timeout is out of range"))?;
        t.max_idle_timeout(Some(idle));
        t.keep_alive_interval(Some(o.keep_alive));
        let var = |v: u64| quinn::VarInt::from_u64(v).unwrap_or(quinn::VarInt::MAX);
        t.stream_receive_window(var(o.stream_window));
        t.receive_window(var(o.connection_window));
        t.send_window(o.connection_window);
        t.max_concurrent_uni_streams(var(o.max_streams));
        Ok(Arc::new(t))
    }
}

fn backend(e: impl std::error::Error + Send + Sync + 'static) -> TransportError {
    TransportError::Backend(Arc::new(e))
}

#[async_trait]
impl Transport for QuicTransport {
    fn scheme(&self) -> &'static str {
        "quic"
    }

    fn name(&self) -> &'static str {
        "quic"
    }

    async fn listen(&self, addr: &Address) -> Result<Box<dyn Listener>, TransportError> {
        let qa = QuicAddr::parse(addr)?;
        let sock = qa.resolve(addr).await?;
        let id = self.identity()?;
        let crypto = QuicServerConfig::try_from(tls::server_config(&id)?).map_err(backend)?;
        let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        cfg.transport_config(self.transport_config()?);
        let endpoint = quinn::Endpoint::server(cfg, sock).map_err(|e| match e.kind() {
            std::io::ErrorKind::AddrInUse => TransportError::AddrInUse {
                addr: addr.to_string(),
                detail: ": another process has this UDP port; stop it or choose another port".into(),
            },
            _ => TransportError::Io(Arc::new(e)),
        })?;
        let local = endpoint.local_addr().map_err(|e| TransportError::Io(Arc::new(e)))?;
        let fp = id.fingerprint();
        let shown = Address::new("quic", format!("//{local}#sha256={fp}"));
        tracing::info!(addr = %shown, "QUIC listening; clients pin sha256={fp}");
        let (tx, rx) = mpsc::channel(64);
        let task = tokio::spawn(accept_loop(endpoint.clone(), tx, self.opts.clone(), shown.to_string()));
        Ok(Box::new(QuicListener { endpoint, rx, task, addr: shown }))
    }

    async fn connect(&self, addr: &Address) -> Result<Box<dyn Connection>, TransportError> {
        let qa = QuicAddr::parse(addr)?;
        let sock = qa.resolve(addr).await?;
        let tls = tls::client_config(qa.pin.as_deref(), self.opts.ca_bundle.as_deref()).map_err(|e| match e {
            TransportError::BadAddress { reason, .. } => TransportError::BadAddress { addr: addr.to_string(), reason },
            other => other,
        })?;
        let mut cfg = quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls).map_err(backend)?));
        cfg.transport_config(self.transport_config()?);
        let bind: SocketAddr = if sock.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" }.parse().map_err(backend)?;
        let endpoint = quinn::Endpoint::client(bind).map_err(|e| TransportError::Io(Arc::new(e)))?;
        let host = qa.host_port.rsplit_once(':').map(|(h, _)| h.trim_matches(['[', ']'])).unwrap_or("ferry");
        let server_name = if host.parse::<std::net::IpAddr>().is_ok() { "ferry" } else { host };
        let connecting = endpoint.connect_with(cfg, sock, server_name).map_err(backend)?;
        let conn = match tokio::time::timeout(self.opts.handshake_timeout, connecting).await {
            Err(_) => {
                return Err(TransportError::PeerRefused(format!(
                    "no QUIC handshake with {sock} within {:?}",
                    self.opts.handshake_timeout
                )));
            }
            Ok(Err(e)) => return Err(TransportError::PeerRefused(format!("QUIC handshake with {sock} failed: {e}"))),
            Ok(Ok(c)) => c,
        };
        let (send, recv) =
            conn.open_bi().await.map_err(|e| TransportError::PeerRefused(format!("opening the frame stream: {e}")))?;
        let idle = self.opts.idle_timeout;
        Ok(Box::new(QuicConnection::new(conn, send, recv, addr.to_string(), Some(endpoint), idle)))
    }
}

async fn accept_loop(
    endpoint: quinn::Endpoint,
    tx: mpsc::Sender<Result<Box<dyn Connection>, TransportError>>,
    opts: QuicOptions,
    addr: String,
) {
    let (limit, idle) = (opts.handshake_timeout, opts.idle_timeout);
    while let Some(incoming) = endpoint.accept().await {
        let (tx, addr) = (tx.clone(), addr.clone());
        tokio::spawn(async move {
            let remote = incoming.remote_address();
            let r = tokio::time::timeout(limit, async {
                let conn = incoming
                    .await
                    .map_err(|e| TransportError::PeerRefused(format!("QUIC handshake from {remote} failed: {e}")))?;
                let (send, recv) = conn
                    .accept_bi()
                    .await
                    .map_err(|e| TransportError::PeerRefused(format!("{remote} opened no frame stream: {e}")))?;
                Ok::<Box<dyn Connection>, TransportError>(Box::new(QuicConnection::new(
                    conn, send, recv, addr, None, idle,
                )))
            })
            .await
            .unwrap_or_else(|_| {
                Err(TransportError::PeerRefused(format!("{remote}: no QUIC handshake within {limit:?}")))
            });
            let _ = tx.send(r).await;
        });
    }
}

struct QuicListener {
    endpoint: quinn::Endpoint,
    rx: mpsc::Receiver<Result<Box<dyn Connection>, TransportError>>,
    task: tokio::task::JoinHandle<()>,
    addr: Address,
}

impl Drop for QuicListener {
    fn drop(&mut self) {
        self.task.abort();
        self.endpoint.close(0u32.into(), b"listener closed");
    }
}

#[async_trait]
impl Listener for QuicListener {
    async fn accept(&mut self) -> Result<Box<dyn Connection>, TransportError> {
        self.rx.recv().await.unwrap_or(Err(TransportError::Closed))
    }

    fn local_addr(&self) -> Address {
        self.addr.clone()
    }
}

/// The quinn connection of a pipe, as found in [`ConnInfo::handle`].
#[derive(Clone, Debug)]
pub struct QuicConn {
    /// The connection.
    pub conn: quinn::Connection,
    /// The client's own endpoint (kept alive with the connection).
    pub endpoint: Option<quinn::Endpoint>,
}

struct QuicConnection {
    info: ConnInfo,
    conn: quinn::Connection,
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    /// This side's [`QuicOptions::idle_timeout`], named when the connection dies of it.
    idle: Duration,
}

impl QuicConnection {
    fn new(
        conn: quinn::Connection,
        send: quinn::SendStream,
        recv: quinn::RecvStream,
        addr: String,
        endpoint: Option<quinn::Endpoint>,
        idle: Duration,
    ) -> Self {
        let handle = TransportHandle(Arc::new(QuicConn { conn: conn.clone(), endpoint }));
        let info = ConnInfo {
            transport: "quic",
            addr,
            peer_pid: None,
            peer_uid: None,
            fd_passing: false,
            same_host: false,
            handle: Some(handle),
        };
        QuicConnection { info, conn, send, recv, idle }
    }
}

impl Connection for QuicConnection {
    fn info(&self) -> &ConnInfo {
        &self.info
    }

    fn split(self: Box<Self>) -> Split {
        let this = *self;
        Split {
            read: Box::new(ReadHalf { recv: this.recv, peer: this.conn.remote_address(), idle: this.idle }),
            write: Box::new(WriteHalf { send: Some(this.send), conn: this.conn }),
            fds: None,
            busy_poll: None,
            liveness: None,
        }
    }
}

/// The frame stream's read half. Any connection loss reads as a reset (so the pipe reports
/// `Closed`).
///
/// Both halves spend tokio's cooperative budget ([`tokio::task::coop`]) the way tokio's own
/// sockets do. quinn's streams do not: a write is buffered and returns at once while the
/// flow-control window has room, so without this a task sending 10,000 small messages ran
/// them all in one poll and never yielded. The connection's driver, woken by those writes
/// into the same worker's (unstealable) LIFO slot, then sent nothing, keep-alives included,
/// for as long as that poll lasted; past the idle timeout the peer declared the connection
/// dead and the sender's `recv` read `Closed` (issue 45 point 6).
struct ReadHalf {
    recv: quinn::RecvStream,
    peer: SocketAddr,
    idle: Duration,
}

impl AsyncRead for ReadHalf {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let coop = std::task::ready!(tokio::task::coop::poll_proceed(cx));
        let this = self.get_mut();
        match Pin::new(&mut this.recv).poll_read(cx, buf) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(r) => {
                coop.made_progress();
                Poll::Ready(r.map_err(|e| {
                    let lost = e.get_ref().and_then(|inner| inner.downcast_ref::<quinn::ReadError>());
                    if let Some(quinn::ReadError::ConnectionLost(quinn::ConnectionError::TimedOut)) = lost {
                        // The pipe reports this as `Closed`; say here which option decided it.
                        tracing::warn!(
                            peer = %this.peer,
                            "QUIC connection timed out: nothing heard from the peer within the idle timeout \
                             (the smaller of the two sides' QuicOptions::idle_timeout; this side's is {:?})",
                            this.idle
                        );
                    }
                    std::io::Error::new(std::io::ErrorKind::ConnectionReset, format!("QUIC: {e}"))
                }))
            }
        }
    }
}

/// The frame stream's write half. Dropping it finishes the stream, waits (briefly, in the
/// background) until the peer has everything, then closes the connection: a last CLOSE or
/// REFUSE frame is delivered, not discarded.
struct WriteHalf {
    send: Option<quinn::SendStream>,
    conn: quinn::Connection,
}

fn gone() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::BrokenPipe, "QUIC stream finished")
}

impl tokio::io::AsyncWrite for WriteHalf {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let Some(s) = self.get_mut().send.as_mut() else { return Poll::Ready(Err(gone())) };
        // Yield when the task's budget is spent (see `ReadHalf`).
        let coop = std::task::ready!(tokio::task::coop::poll_proceed(cx));
        match tokio::io::AsyncWrite::poll_write(Pin::new(s), cx, buf) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(r) => {
                coop.made_progress();
                Poll::Ready(
                    r.map_err(|e| std::io::Error::new(std::io::ErrorKind::ConnectionReset, format!("QUIC: {e}"))),
                )
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut().send.as_mut() {
            Some(s) => tokio::io::AsyncWrite::poll_flush(Pin::new(s), cx),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if let Some(s) = self.get_mut().send.as_mut() {
            let _ = s.finish();
        }
        Poll::Ready(Ok(()))
    }
}

impl Drop for WriteHalf {
    fn drop(&mut self) {
        let Some(mut send) = self.send.take() else { return };
        let conn = self.conn.clone();
        let _ = send.finish();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    let _ = tokio::time::timeout(Duration::from_secs(2), send.stopped()).await;
                    conn.close(0u32.into(), b"pipe closed");
                });
            }
            Err(_) => conn.close(0u32.into(), b"pipe closed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keep_alive_not_under_the_idle_timeout_is_refused_naming_both() {
        let with = |keep_alive: u64, idle_timeout: u64| {
            QuicTransport::with_options(QuicOptions {
                keep_alive: Duration::from_millis(keep_alive),
                idle_timeout: Duration::from_millis(idle_timeout),
                ..QuicOptions::default()
            })
            .transport_config()
        };
        for (keep_alive, idle_timeout) in [(1000, 1000), (2000, 1000), (0, 1000)] {
            match with(keep_alive, idle_timeout) {
                Err(TransportError::ApiMisuse(m)) => {
                    assert!(m.contains("QuicOptions::keep_alive") && m.contains("QuicOptions::idle_timeout"), "{m}")
                }
                other => panic!("keep_alive {keep_alive} ms, idle_timeout {idle_timeout} ms gave {other:?}"),
            }
        }
        assert!(with(300, 1000).is_ok(), "a keep-alive under the idle timeout is accepted");
        assert!(with(2000, 0).is_ok(), "idle_timeout zero (no idle timeout) takes any keep-alive");
    }

    #[test]
    fn addresses() {
        let p = |s: &str| QuicAddr::parse(&s.parse().unwrap());
        let a = p("quic://127.0.0.1:4433").unwrap();
        assert_eq!((a.host_port.as_str(), a.pin), ("127.0.0.1:4433", None));
        let fp = "AB".repeat(32);
        let a = p(&format!("quic://[::1]:9#sha256={fp}")).unwrap();
        assert_eq!(a.pin.unwrap(), fp.to_lowercase());
        for bad in
            ["quic:host:1", "quic://host", "quic://:1", "quic://h:99999", "quic://h:1#sha256=zz", "quic://h:1#md5=00"]
        {
            assert!(p(bad).is_err(), "{bad}");
        }
    }
}
