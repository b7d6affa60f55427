//! [`Endpoint`] (the compiled-in transports and channels plus options) and
//! [`PipeListener`]: where pipes come from. See [`crate::Pipe`] for what they do.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::channel::{Channel, ControlWaker, SessionCtx};
use crate::error::{PipeError, ProtocolError, TransportError};
use crate::frame::{FrameKind, FrameReader, FrameWriter, OutFrame};
use crate::handshake::{ServerPolicy, client_accept, client_hello, server_decide};
use crate::logsafe::peer_text;
use crate::pipe::{Pipe, PipeInfo};
use crate::transport::{Address, Connection, Listener, Split, Transport};
use crate::wire::{Hello, Limits, PROTOCOL_VERSION, Refusal, Welcome};

#[cfg(unix)]
mod ring;

/// Default time a handshake may take.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a frame, once begun, may take to deliver its prefix and header, and its
/// payload may go without a byte (see [`EndpointBuilder::frame_timeout`]).
pub const DEFAULT_FRAME_TIMEOUT: Duration = Duration::from_secs(30);

/// Default of [`EndpointBuilder::max_header_values`]: about 32 MiB of parsed values at
/// most, however the header is written.
pub const DEFAULT_MAX_HEADER_VALUES: usize = 1 << 20;

/// Options shared by every pipe an endpoint makes.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) transports: Vec<Arc<dyn Transport>>,
    pub(crate) channels: Vec<Arc<dyn Channel>>,
    pub(crate) limits: Limits,
    pub(crate) handshake_timeout: Duration,
    pub(crate) frame_timeout: Duration,
    pub(crate) version: u16,
    pub(crate) token: Option<String>,
    pub(crate) require_token: Option<String>,
    pub(crate) recv_queue: usize,
    pub(crate) accept_foreign: bool,
    pub(crate) busy_poll: Duration,
    pub(crate) blocking_spin: Duration,
    pub(crate) max_header_values: usize,
    /// What makes and opens the link beside the socket (`ferry-ring`'s same-host ring).
    #[cfg(unix)]
    pub(crate) ring: Option<Arc<dyn crate::frame::LinkProvider>>,
}

impl Config {
    #[cfg(unix)]
    fn ring(&self) -> Option<&dyn crate::frame::LinkProvider> {
        self.ring.as_deref()
    }
}

/// Builds an [`Endpoint`]: `Endpoint::builder().transport(..).channel(..).build()`.
#[must_use]
pub struct EndpointBuilder {
    cfg: Config,
}

impl Default for EndpointBuilder {
    fn default() -> Self {
        EndpointBuilder {
            cfg: Config {
                transports: Vec::new(),
                channels: Vec::new(),
                limits: Limits::default(),
                handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
                frame_timeout: DEFAULT_FRAME_TIMEOUT,
                version: PROTOCOL_VERSION,
                token: None,
                require_token: None,
                recv_queue: 16,
                accept_foreign: false,
                busy_poll: Duration::ZERO,
                blocking_spin: crate::spin::default_busy_poll(),
                max_header_values: DEFAULT_MAX_HEADER_VALUES,
                #[cfg(unix)]
                ring: None,
            },
        }
    }
}

impl EndpointBuilder {
    /// Adds a transport (one per address scheme; a later one replaces an earlier one).
    pub fn transport(mut self, t: Arc<dyn Transport>) -> Self {
        self.cfg.transports.retain(|x| x.scheme() != t.scheme());
        self.cfg.transports.push(t);
        self
    }

    /// Adds a channel. Add them in priority order, fastest first.
    pub fn channel(mut self, c: Arc<dyn Channel>) -> Self {
        self.cfg.channels.retain(|x| x.name() != c.name());
        self.cfg.channels.push(c);
        self
    }

    /// Receive limits (defaults: see [`Limits`]).
    pub fn limits(mut self, limits: Limits) -> Self {
        self.cfg.limits = limits;
        self
    }

    /// How long a handshake may take (default 10 s).
    pub fn handshake_timeout(mut self, d: Duration) -> Self {
        self.cfg.handshake_timeout = d;
        self
    }

    /// How long a frame, once its first byte arrived, may take to deliver its prefix and
    /// header, and how long its payload may go without a byte (default
    /// [`DEFAULT_FRAME_TIMEOUT`], 30 s; zero: no limit). A pipe may idle between frames as
    /// long as it likes; a peer trickling a frame (slowloris) fails with
    /// [`crate::PipeError::Timeout`] naming `frame_timeout`, and its pipe is closed.
    pub fn frame_timeout(mut self, d: Duration) -> Self {
        self.cfg.frame_timeout = d;
        self
    }

    /// Client: the bearer token to present.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.cfg.token = Some(token.into());
        self
    }

    /// Server: refuse clients that do not present this token. Plain JSON connections
    /// ([`EndpointBuilder::accept_foreign`]) cannot present one, so a listener that requires
    /// a token closes them (with a JSON-RPC error line saying why) instead of serving them.
    pub fn require_token(mut self, token: impl Into<String>) -> Self {
        self.cfg.require_token = Some(token.into());
        self
    }

    /// How many received messages may wait for [`Pipe::recv`] before the pipe stops reading
    /// from the connection (default 16).
    pub fn recv_queue(mut self, n: usize) -> Self {
        self.cfg.recv_queue = n.max(1);
        self
    }

    /// Server: hand connections whose first byte is `{` or `[` (plain newline-delimited
    /// JSON, e.g. a JSON-RPC client) to [`PipeListener::accept_any`] as
    /// [`Accepted::Foreign`] instead of refusing them. Off by default.
    pub fn accept_foreign(mut self, yes: bool) -> Self {
        self.cfg.accept_foreign = yes;
        self
    }

    /// Most JSON values (member names and containers included) in one received message
    /// header (default [`DEFAULT_MAX_HEADER_VALUES`], at least 1). A header over 64 KiB is
    /// counted on its bytes before it is parsed (parsed, `[0,0,...]` takes 17 times its
    /// size), and one over 1 MiB is parsed off the runtime's workers; over the limit the
    /// pipe closes with a [`crate::LimitError`] naming `max_header_values`. Send big arrays
    /// as tensors.
    pub fn max_header_values(mut self, n: usize) -> Self {
        self.cfg.max_header_values = n.max(1);
        self
    }

    /// How long a pipe's reader may poll its socket for the next message before it sleeps
    /// (default zero: never), on transports that can (unix sockets). It saves a wake-up per
    /// message (several microseconds on a virtual machine) at the cost of a CPU spinning for
    /// up to `window` after each message. It only spins when a handler set with
    /// [`crate::Pipe::set_handler`] answered the last message at once (so nothing else waits
    /// for the thread), on a connection that received bytes within the last `window`, and
    /// at most on a few connections of the process at a time: it is meant for servers
    /// answering a request-response peer (`ferry serve --busy-poll-us`).
    pub fn busy_poll(mut self, window: Duration) -> Self {
        self.cfg.busy_poll = window;
        self
    }

    /// How long a blocking caller ([`crate::Pipe::recv_blocking`]) on a bare unix socket
    /// polls it before it sleeps in the kernel (zero: never). Default: 50 µs where this
    /// process may use 2 or more CPUs, else none ([`crate::spin::default_busy_poll`]).
    ///
    /// An answer that comes within the poll costs no wake-up of the caller (on a 2-vCPU VM,
    /// a 64-byte round trip between two processes took 10.5-12 µs so, 23-29 µs sleeping). The wait
    /// policy ([`crate::spin`]) keeps the poll from costing: no poll while threads wait for
    /// CPUs, at most half the process's CPUs' worth of callers polling at once, and a
    /// caller whose polls miss (a peer on its own CPU, or slower than the window) polls
    /// rarely until one catches an answer again ([`crate::spin::caller`]).
    /// A same-host ring has its own (`ferry_ring::RingOptions::spin`).
    pub fn blocking_spin(mut self, window: Duration) -> Self {
        self.cfg.blocking_spin = window;
        self
    }

    /// Use a link beside the socket (PROTOCOL.md §22), made and opened by `provider`,
    /// where the peer has one too and the connection passes descriptors (unix sockets):
    /// after the handshake, frames travel through the link, and the socket carries only
    /// what it cannot. `ferry-ring`'s same-host ring is such a provider: most callers set it
    /// with `ferry_ring::RingExt::ring` (`ferry::RingExt` in the facade). `None` (the
    /// default) offers and grants no link.
    #[cfg(unix)]
    pub fn link(mut self, provider: Option<Arc<dyn crate::frame::LinkProvider>>) -> Self {
        self.cfg.ring = provider;
        self
    }

    /// Speak another protocol version (for testing refusals).
    #[doc(hidden)]
    pub fn protocol_version(mut self, v: u16) -> Self {
        self.cfg.version = v;
        self
    }

    /// The endpoint.
    pub fn build(self) -> Endpoint {
        Endpoint { cfg: Arc::new(self.cfg) }
    }
}

/// The compiled-in transports and channels, and the options every pipe gets. Cheap to clone.
#[derive(Clone)]
pub struct Endpoint {
    cfg: Arc<Config>,
}

impl Endpoint {
    /// A builder with no transports and no channels.
    pub fn builder() -> EndpointBuilder {
        EndpointBuilder::default()
    }

    /// Names of the registered channels, in priority order.
    pub fn channel_names(&self) -> Vec<&'static str> {
        self.cfg.channels.iter().map(|c| c.name()).collect()
    }

    /// Schemes of the registered transports.
    pub fn schemes(&self) -> Vec<&'static str> {
        self.cfg.transports.iter().map(|t| t.scheme()).collect()
    }

    fn transport_for(&self, addr: &Address) -> Result<&Arc<dyn Transport>, PipeError> {
        self.cfg.transports.iter().find(|t| t.scheme() == addr.scheme()).ok_or_else(|| {
            PipeError::Transport(TransportError::BadAddress {
                addr: addr.to_string(),
                reason: format!(
                    "no transport for scheme {:?} is compiled in (have: {})",
                    addr.scheme(),
                    self.schemes().join(", ")
                )
                .into(),
            })
        })
    }

    /// Listens on `addr` (e.g. `unix:my-service`). Handshakes run in the background;
    /// [`PipeListener::accept`] returns finished pipes.
    pub async fn listen(&self, addr: &str) -> Result<PipeListener, PipeError> {
        let addr: Address = addr.parse()?;
        let t = self.transport_for(&addr)?;
        t.viability()?;
        let listener = t.listen(&addr).await?;
        let local = listener.local_addr();
        let spin = listener.spin();
        let (tx, rx) = mpsc::channel(64);
        let cfg = self.cfg.clone();
        let task = tokio::spawn(accept_loop(listener, cfg, tx));
        Ok(PipeListener { rx, task, addr: local, spin })
    }

    /// Connects to `addr` and runs the handshake.
    pub async fn connect(&self, addr: &str) -> Result<Pipe, PipeError> {
        let addr: Address = addr.parse()?;
        let t = self.transport_for(&addr)?;
        t.viability()?;
        let timeout = self.cfg.handshake_timeout;
        let fut = async {
            let conn = t.connect(&addr).await?;
            client_handshake(conn, self.cfg.clone()).await
        };
        tokio::time::timeout(timeout, fut).await.map_err(|_| PipeError::Timeout(timeout, "handshake"))?
    }
}

/// A connection whose peer does not speak ferry's frame protocol but starts with `{` or
/// `[` (accepted only with [`EndpointBuilder::accept_foreign`]). Nothing it sent is lost:
/// `read` still holds every byte.
pub struct ForeignConn {
    /// What is known about the connection.
    pub info: crate::transport::ConnInfo,
    /// The peer's bytes, buffered (`AsyncBufRead`, so `lines()` works).
    pub read: tokio::io::BufReader<Box<dyn tokio::io::AsyncRead + Send + Unpin>>,
    /// Bytes to the peer.
    pub write: Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
}

impl std::fmt::Debug for ForeignConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForeignConn").field("info", &self.info).finish_non_exhaustive()
    }
}

/// What [`PipeListener::accept_any`] returns.
#[derive(Debug)]
pub enum Accepted {
    /// A ferry peer, handshake done.
    Pipe(Pipe),
    /// A plain JSON peer.
    Foreign(ForeignConn),
}

/// Accepts pipes. Dropping it stops listening and aborts handshakes in progress.
pub struct PipeListener {
    rx: mpsc::Receiver<Result<Accepted, PipeError>>,
    task: tokio::task::JoinHandle<()>,
    addr: Address,
    spin: Option<Arc<crate::spin::ListenerSpin>>,
}

impl PipeListener {
    /// The next pipe. A connection whose handshake failed or was refused is reported as an
    /// `Err` (the listener keeps going: call `accept` again; a client that hung up during
    /// the handshake is [`PipeError::ClosedByPeer`]); only [`PipeError::Closed`] means the
    /// listener itself has stopped.
    pub async fn accept(&mut self) -> Result<Pipe, PipeError> {
        loop {
            match self.accept_any().await? {
                Accepted::Pipe(p) => return Ok(p),
                Accepted::Foreign(f) => {
                    tracing::debug!(addr = %f.info.addr, "dropping a plain-JSON connection: accept() takes ferry pipes only");
                }
            }
        }
    }

    /// The next ferry pipe or (with [`EndpointBuilder::accept_foreign`]) plain JSON
    /// connection. Errors as for [`PipeListener::accept`].
    pub async fn accept_any(&mut self) -> Result<Accepted, PipeError> {
        self.rx.recv().await.unwrap_or(Err(PipeError::Closed))
    }

    /// The address listened on.
    pub fn local_addr(&self) -> &Address {
        &self.addr
    }

    /// Its connections' busy polling (readers spinning now, polls and the polls that found
    /// bytes; see [`crate::spin`]); `None` when its transport never polls (QUIC, Windows).
    pub fn spin_stats(&self) -> Option<crate::spin::SpinStats> {
        self.spin.as_ref().map(|s| s.stats())
    }
}

impl Drop for PipeListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(mut listener: Box<dyn Listener>, cfg: Arc<Config>, tx: mpsc::Sender<Result<Accepted, PipeError>>) {
    let mut handshakes = JoinSet::new();
    loop {
        tokio::select! {
            conn = listener.accept() => match conn {
                Ok(conn) => {
                    let cfg = cfg.clone();
                    let timeout = cfg.handshake_timeout;
                    handshakes.spawn(async move {
                        match tokio::time::timeout(timeout, server_handshake(conn, cfg)).await {
                            Err(_) => Err(PipeError::Timeout(timeout, "handshake")),
                            // `Closed` from `accept` means the listener stopped; a client
                            // that hangs up mid-handshake is something else.
                            Ok(Err(PipeError::Closed)) => {
                                Err(PipeError::ClosedByPeer("the client hung up during the handshake".into()))
                            }
                            Ok(r) => r,
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    if tx.send(Err(e.into())).await.is_err() {
                        return;
                    }
                    // Back off a little: persistent errors (EMFILE) must not spin.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            },
            Some(done) = handshakes.join_next(), if !handshakes.is_empty() => {
                let r = done.unwrap_or_else(|e| Err(PipeError::ApiMisuse(format!("handshake task failed: {e}").into())));
                if tx.send(r).await.is_err() {
                    return;
                }
            }
        }
    }
}

fn halves(conn: Box<dyn Connection>, cfg: &Config) -> (crate::transport::ConnInfo, FrameReader, FrameWriter) {
    let info = conn.info().clone();
    let direct = conn.direct_read();
    let Split { read, write, fds, busy_poll, liveness } = conn.split();
    if let Some(b) = &busy_poll {
        b.set_window(cfg.busy_poll);
    }
    // Until the handshake is done, frames are held to the small handshake limits.
    let frame_timeout = (!cfg.frame_timeout.is_zero()).then_some(cfg.frame_timeout);
    let reader = FrameReader::new(read, fds.clone(), crate::frame::HANDSHAKE_LIMITS)
        .with_busy_poll(busy_poll)
        .with_frame_timeout(frame_timeout)
        .with_direct(direct)
        .with_caller_spin(cfg.blocking_spin);
    (info, reader, FrameWriter::new(write, fds).with_liveness(liveness))
}

async fn client_handshake(conn: Box<dyn Connection>, cfg: Arc<Config>) -> Result<Pipe, PipeError> {
    let (info, mut reader, mut writer) = halves(conn, &cfg);
    #[cfg_attr(not(unix), allow(unused_mut))]
    let mut hello = client_hello(&cfg.channels, &info, cfg.version, cfg.token.clone(), cfg.limits);
    #[cfg(unix)]
    let ring_offered = ring::client_offer(cfg.ring(), &mut reader, &mut hello);
    writer.write_preamble(cfg.version).await?;
    writer.write_frame(FrameKind::Hello, OutFrame::json(&hello)).await?;
    reader.read_preamble().await?;
    #[cfg_attr(not(unix), allow(unused_mut))]
    let mut frame = reader.read_frame().await?.into_frame()?;
    #[cfg_attr(not(unix), allow(unused_mut))]
    let mut welcome: Welcome = match frame.kind {
        FrameKind::Welcome => frame.parse()?,
        FrameKind::Refuse => {
            let r: Refusal = frame.parse()?;
            tracing::warn!(addr = %info.addr, "server refused the handshake: {}", peer_text(&r.to_string()));
            return Err(PipeError::Refused(r));
        }
        _ => {
            return Err(ProtocolError::UnexpectedFrame {
                kind: frame.kind as u8,
                context: "expected WELCOME or REFUSE",
            }
            .into());
        }
    };
    let open = client_accept(&cfg.channels, &hello, &welcome)?;
    #[cfg(unix)]
    {
        let fds = std::mem::take(&mut frame.fds);
        if !ring::client_finish(cfg.ring(), ring_offered, &welcome, fds, &mut reader, &mut writer).await? {
            welcome.features.retain(|f| f != crate::wire::FEATURE_RING && f != crate::wire::FEATURE_RING_MESSAGES);
        }
    }
    let (ctx, closed_tx) = session_ctx(&info, false, &welcome.features);
    let mut sessions = BTreeMap::new();
    for (kind, c) in open {
        sessions.insert(kind, c.open(ctx.clone())?);
    }
    tracing::debug!(addr = %info.addr, channels = ?welcome.channels, "connected");
    let pipe_info = PipeInfo {
        conn: info,
        channels: welcome.channels,
        peer_agent: welcome.agent,
        is_server: false,
        features: welcome.features,
        token_verified: false,
    };
    reader.set_limits(cfg.limits);
    Ok(Pipe::start(reader, writer, sessions, pipe_info, welcome.limits, &cfg, closed_tx, ctx.control))
}

/// The one line a plain JSON peer gets from a listener that requires a bearer token: a
/// JSON-RPC error (code -32008, `UNAUTHORIZED` in ferry-rpc's table) with a null id.
const FOREIGN_NEEDS_TOKEN: &str = "{\"jsonrpc\":\"2.0\",\"error\":{\"code\":-32008,\"message\":\"Unauthorized: this server requires a bearer token, which a plain JSON-RPC connection cannot present; use a ferry client with a token (ferry call --token, the SDKs' token option) or HTTP with Authorization: Bearer\"},\"id\":null}\n";

async fn server_handshake(conn: Box<dyn Connection>, cfg: Arc<Config>) -> Result<Accepted, PipeError> {
    let (info, mut reader, mut writer) = halves(conn, &cfg);
    if cfg.accept_foreign && matches!(reader.peek_byte().await?, Some(b'{' | b'[')) {
        if cfg.require_token.is_some() {
            // A plain JSON peer has no way to present the token: tell it why, then close.
            tracing::warn!(addr = %info.addr, "refusing a plain-JSON connection: this listener requires a bearer token");
            let mut write = writer.into_inner();
            let _ = tokio::io::AsyncWriteExt::write_all(&mut write, FOREIGN_NEEDS_TOKEN.as_bytes()).await;
            let _ = tokio::io::AsyncWriteExt::shutdown(&mut write).await;
            return Err(PipeError::Refused(Refusal::BadToken));
        }
        return Ok(Accepted::Foreign(ForeignConn { info, read: reader.into_inner(), write: writer.into_inner() }));
    }
    // Read first: a peer that is not ferry (plain JSON-RPC, HTTP) gets no binary reply.
    let peer_version = reader.read_preamble().await?;
    writer.write_preamble(cfg.version).await?;
    let frame = reader.read_frame().await?.into_frame()?;
    if frame.kind != FrameKind::Hello {
        return Err(ProtocolError::UnexpectedFrame { kind: frame.kind as u8, context: "expected HELLO" }.into());
    }
    let policy = ServerPolicy {
        channels: &cfg.channels,
        version: cfg.version,
        limits: cfg.limits,
        require_token: cfg.require_token.as_deref(),
    };
    let decision = server_decide(&policy, peer_version, frame.parse::<Hello>().map_err(|e| e.to_string()), &info);
    match decision {
        Err((refusal, hello)) => {
            let agent = hello.map(|h| h.agent).unwrap_or_default();
            tracing::warn!(addr = %info.addr, peer = %peer_text(&agent), "refusing handshake: {}", peer_text(&refusal.to_string()));
            writer.write_frame(FrameKind::Refuse, OutFrame::json(&refusal)).await?;
            writer.shutdown().await;
            Err(PipeError::Refused(refusal))
        }
        #[cfg_attr(not(unix), allow(unused_mut))]
        Ok((mut welcome, hello)) => {
            #[cfg(unix)]
            let made = ring::server_make(cfg.ring(), &hello, &reader, &mut welcome);
            let (ctx, closed_tx) = session_ctx(&info, true, &welcome.features);
            let mut sessions = BTreeMap::new();
            for (kind, name) in &welcome.channels {
                if let Some(c) = cfg.channels.iter().find(|c| c.name() == name) {
                    sessions.insert(*kind, c.open(ctx.clone())?);
                }
            }
            #[cfg_attr(not(unix), allow(unused_mut))]
            let mut frame = OutFrame::json(&welcome);
            #[cfg(unix)]
            let made = made.map(|(link, fd)| {
                frame.fds.push(fd);
                link
            });
            writer.write_frame(FrameKind::Welcome, frame).await?;
            #[cfg(unix)]
            if let Some(link) = made
                && !ring::server_finish(link, &mut reader, &mut writer).await?
            {
                welcome.features.retain(|f| f != crate::wire::FEATURE_RING && f != crate::wire::FEATURE_RING_MESSAGES);
            }
            tracing::debug!(addr = %info.addr, peer = %peer_text(&hello.agent), channels = ?welcome.channels, "accepted");
            let pipe_info = PipeInfo {
                conn: info,
                channels: welcome.channels,
                peer_agent: hello.agent,
                is_server: true,
                features: welcome.features,
                token_verified: cfg.require_token.is_some(),
            };
            // A client that announces no limits accepts what this side accepts.
            let peer_limits = hello.limits.unwrap_or(cfg.limits);
            reader.set_limits(cfg.limits);
            Ok(Accepted::Pipe(Pipe::start(
                reader,
                writer,
                sessions,
                pipe_info,
                peer_limits,
                &cfg,
                closed_tx,
                ctx.control,
            )))
        }
    }
}

fn session_ctx(
    info: &crate::transport::ConnInfo,
    is_server: bool,
    features: &[String],
) -> (SessionCtx, watch::Sender<bool>) {
    let control = ControlWaker::new();
    let (closed_tx, closed) = watch::channel(false);
    (SessionCtx { conn: info.clone(), control, closed, is_server, features: features.to_vec() }, closed_tx)
}

/// Compares two secrets (bearer tokens) in time that does not depend on where they differ
/// (moved to [`crate::handshake`], kept here for existing users).
pub use crate::handshake::constant_time_eq;
