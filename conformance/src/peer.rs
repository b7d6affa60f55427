//! Peers for the cases: roles that run in a thread or in a re-executed copy of the test
//! binary, and a raw connection for sending hand-made (often malformed) frames.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

use ferry_core::frame::{FrameKind, FramePrefix, FrameReader, preamble};
use ferry_core::wire::{ChannelOffer, Close, Hello, PROTOCOL, Welcome};
use ferry_core::{Address, Limits, PROTOCOL_VERSION, Pipe, PipeError};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::oneshot;

use crate::{Failed, Fixture, Peers};

/// Environment variable naming the role of a re-executed peer.
pub const ENV_ROLE: &str = "FERRY_PEER";
/// Environment variable with the peer's address.
pub const ENV_ADDR: &str = "FERRY_PEER_ADDR";

/// Roles a peer can play.
pub mod role {
    /// Listens and echoes every message back on every pipe.
    pub const ECHO: &str = "echo";
    /// Connects, completes the handshake, writes half of a message frame, then waits.
    pub const DIE_MID_MESSAGE: &str = "die-mid-message";
    /// Connects and waits.
    pub const IDLE_CLIENT: &str = "idle-client";
}

/// Runs a peer role if this process was started as one (see [`spawn`]).
pub fn run_if_peer<F: Fixture>() -> Option<ExitCode> {
    let role = std::env::var(ENV_ROLE).ok()?;
    let addr = std::env::var(ENV_ADDR).ok()?;
    // Exit when the parent goes away (its end of our stdin closes), however it died.
    std::thread::spawn(|| {
        let mut b = [0u8; 1];
        let _ = std::io::stdin().read(&mut b);
        std::process::exit(0);
    });
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().ok()?;
    let fx = F::default();
    let r = rt.block_on(run_role(&fx, &role, &addr, Ready::Stdout));
    Some(match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("peer {role} failed: {e}");
            ExitCode::FAILURE
        }
    })
}

enum Ready {
    Stdout,
    Chan(oneshot::Sender<()>),
}

impl Ready {
    fn signal(self) {
        match self {
            Ready::Stdout => {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "ready");
                let _ = out.flush();
            }
            Ready::Chan(tx) => {
                let _ = tx.send(());
            }
        }
    }
}

async fn run_role<F: Fixture>(fx: &F, role: &str, addr: &str, ready: Ready) -> Result<(), String> {
    match role {
        role::ECHO => echo_server(fx, addr, ready).await,
        role::DIE_MID_MESSAGE => {
            let mut raw = RawConn::connect(fx, addr).await.map_err(|e| format!("{e:?}"))?;
            raw.handshake().await.map_err(|e| format!("{e:?}"))?;
            let header = serde_json::json!({"header": {"n": 1}, "tensors": [
                {"meta": {"dtype": "u8", "shape": [1 << 20]}, "data": {"inline": {"offset": 0, "len": 1 << 20}}}
            ]});
            let header = serde_json::to_vec(&header).map_err(|e| e.to_string())?;
            raw.write_prefix(FrameKind::Message as u8, 0, 0, header.len() as u32, 1 << 20)
                .await
                .map_err(|e| format!("{e:?}"))?;
            raw.write_raw(&header).await.map_err(|e| format!("{e:?}"))?;
            raw.write_raw(&vec![7u8; 1 << 19]).await.map_err(|e| format!("{e:?}"))?;
            ready.signal();
            std::future::pending::<()>().await;
            Ok(())
        }
        role::IDLE_CLIENT => {
            let pipe = fx.endpoint().build().connect(addr).await.map_err(|e| e.to_string())?;
            ready.signal();
            let _ = pipe.recv().await;
            Ok(())
        }
        other => Err(format!("unknown peer role {other:?}")),
    }
}

async fn echo_server<F: Fixture>(fx: &F, addr: &str, ready: Ready) -> Result<(), String> {
    let mut listener = fx.endpoint().build().listen(addr).await.map_err(|e| e.to_string())?;
    ready.signal();
    let mut pipes = tokio::task::JoinSet::new();
    loop {
        match listener.accept().await {
            Ok(p) => {
                pipes.spawn(echo_pipe(p));
            }
            Err(PipeError::Closed) => return Ok(()),
            Err(e) => eprintln!("echo peer: a connection failed: {e}"),
        }
    }
}

/// Echoes every message back until the pipe closes.
pub async fn echo_pipe(p: Pipe) {
    while let Ok(m) = p.recv().await {
        if p.send(m).await.is_err() {
            break;
        }
    }
}

/// A running peer. Dropping it stops the peer (a process is killed and reaped).
pub struct PeerHandle {
    inner: PeerInner,
}

enum PeerInner {
    Thread { stop: Option<oneshot::Sender<()>>, join: Option<std::thread::JoinHandle<()>> },
    Process { child: Child, reaped: bool },
}

impl PeerHandle {
    /// The peer process's pid (None for a thread).
    pub fn pid(&self) -> Option<u32> {
        match &self.inner {
            PeerInner::Process { child, .. } => Some(child.id()),
            PeerInner::Thread { .. } => None,
        }
    }

    /// Kills the peer: SIGKILL for a process (then reaps it), stops a thread's runtime.
    pub fn kill(&mut self) {
        match &mut self.inner {
            PeerInner::Process { child, reaped } => {
                if !*reaped {
                    let _ = child.kill();
                    let _ = child.wait();
                    *reaped = true;
                }
            }
            PeerInner::Thread { stop, join } => {
                if let Some(s) = stop.take() {
                    let _ = s.send(());
                }
                if let Some(j) = join.take() {
                    let _ = j.join();
                }
            }
        }
    }
}

impl Drop for PeerHandle {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `role` at `addr` in a thread or a process and waits (up to 20 s) until it is ready.
pub async fn spawn<F: Fixture>(mode: Peers, role: &str, addr: &str) -> Result<PeerHandle, Failed> {
    let limit = Duration::from_secs(20);
    match mode {
        Peers::Threads => {
            let (ready_tx, ready_rx) = oneshot::channel();
            let (stop_tx, stop_rx) = oneshot::channel::<()>();
            let (role_name, addr) = (role.to_string(), addr.to_string());
            let join = std::thread::spawn(move || {
                let Ok(rt) = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build() else {
                    return;
                };
                let fx = F::default();
                rt.block_on(async {
                    tokio::select! {
                        r = run_role(&fx, &role_name, &addr, Ready::Chan(ready_tx)) => {
                            if let Err(e) = r { eprintln!("peer {role_name} failed: {e}"); }
                        }
                        _ = stop_rx => {}
                    }
                });
                rt.shutdown_timeout(Duration::from_secs(2));
            });
            let handle = PeerHandle { inner: PeerInner::Thread { stop: Some(stop_tx), join: Some(join) } };
            match tokio::time::timeout(limit, ready_rx).await {
                Ok(Ok(())) => Ok(handle),
                _ => Err(format!("peer {role} (thread) did not become ready").into()),
            }
        }
        Peers::Processes => {
            let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
            let mut child = Command::new(exe)
                .env(ENV_ROLE, role)
                .env(ENV_ADDR, addr)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| format!("spawning peer process: {e}"))?;
            let stdout = child.stdout.take();
            let mut handle = PeerHandle { inner: PeerInner::Process { child, reaped: false } };
            let (tx, rx) = oneshot::channel();
            std::thread::spawn(move || {
                let mut line = String::new();
                if let Some(out) = stdout {
                    let _ = BufReader::new(out).read_line(&mut line);
                }
                let _ = tx.send(line);
            });
            match tokio::time::timeout(limit, rx).await {
                Ok(Ok(line)) if line.trim() == "ready" => Ok(handle),
                other => {
                    handle.kill();
                    Err(format!("peer {role} (process) did not become ready: {other:?}").into())
                }
            }
        }
    }
}

/// A connection below the Pipe layer, for writing hand-made frames.
pub struct RawConn {
    /// Frames from the peer.
    pub reader: FrameReader,
    /// Raw bytes to the peer.
    pub write: Box<dyn AsyncWrite + Send + Unpin>,
    /// The connection's descriptor queue, when it passes descriptors.
    pub fds: Option<ferry_core::transport::FdQueueRef>,
    /// What the transport knows about the connection (for QUIC, its `handle` is the
    /// `QuicConn`: a test opens streams of its own on it).
    pub info: ferry_core::ConnInfo,
}

impl RawConn {
    /// Connects with the fixture's transport (no handshake).
    pub async fn connect<F: Fixture>(fx: &F, addr: &str) -> Result<RawConn, Failed> {
        let addr: Address = addr.parse().map_err(|e| format!("{e}"))?;
        let conn = fx.transport().connect(&addr).await.map_err(|e| format!("raw connect: {e}"))?;
        let info = conn.info().clone();
        let split = conn.split();
        Ok(RawConn {
            reader: FrameReader::new(split.read, split.fds.clone(), Limits::default()),
            write: split.write,
            fds: split.fds,
            info,
        })
    }

    /// Writes bytes as they are.
    pub async fn write_raw(&mut self, b: &[u8]) -> Result<(), Failed> {
        self.write.write_all(b).await.map_err(|e| Failed::from(format!("raw write: {e}")))
    }

    /// Writes a frame prefix with any values.
    pub async fn write_prefix(
        &mut self,
        kind: u8,
        flags: u8,
        fds: u16,
        header_len: u32,
        payload_len: u64,
    ) -> Result<(), Failed> {
        let p = FramePrefix { kind, flags, fds, header_len, payload_len };
        self.write_raw(&p.encode()).await
    }

    /// Writes a whole frame with a consistent prefix.
    pub async fn write_frame(&mut self, kind: u8, header: &[u8], payload: &[u8]) -> Result<(), Failed> {
        self.write_prefix(kind, 0, 0, header.len() as u32, payload.len() as u64).await?;
        self.write_raw(header).await?;
        self.write_raw(payload).await
    }

    /// Runs the client handshake by hand, offering `inline`.
    pub async fn handshake(&mut self) -> Result<Welcome, Failed> {
        self.handshake_with(serde_json::json!([{"name": "inline", "devices": ["cpu"]}])).await
    }

    /// Runs the client handshake by hand with a raw JSON list of channel offers.
    pub async fn handshake_with(&mut self, offers: serde_json::Value) -> Result<Welcome, Failed> {
        let channels: Vec<ChannelOffer> =
            serde_json::from_value(offers).map_err(|e| format!("test offers do not parse: {e}"))?;
        self.write_raw(&preamble(PROTOCOL_VERSION)).await?;
        let hello = Hello {
            protocol: PROTOCOL.into(),
            version: PROTOCOL_VERSION,
            channels,
            token: None,
            agent: "ferry-conformance-raw".into(),
            limits: None,
            features: Vec::new(),
        };
        let h = serde_json::to_vec(&hello).map_err(|e| e.to_string())?;
        self.write_frame(FrameKind::Hello as u8, &h, &[]).await?;
        self.reader.read_preamble().await.map_err(|e| format!("server preamble: {e}"))?;
        let f = self
            .reader
            .read_frame()
            .await
            .and_then(ferry_core::frame::Received::into_frame)
            .map_err(|e| format!("welcome: {e}"))?;
        if f.kind != FrameKind::Welcome {
            return Err(format!("expected WELCOME, got {:?}", f.kind).into());
        }
        f.parse::<Welcome>().map_err(|e| format!("welcome: {e}").into())
    }

    /// Expects the peer to send a CLOSE frame and then end the stream (a clean close).
    pub async fn expect_close(&mut self) -> Result<Close, Failed> {
        let limit = Duration::from_secs(5);
        let f = tokio::time::timeout(limit, async { self.reader.read_frame().await?.into_frame() })
            .await
            .map_err(|_| "no CLOSE frame within 5 s")?
            .map_err(|e| format!("expected a CLOSE frame, got {e}"))?;
        if f.kind != FrameKind::Close {
            return Err(format!("expected a CLOSE frame, got {:?}", f.kind).into());
        }
        let close: Close = f.parse().map_err(|e| format!("close frame: {e}"))?;
        match tokio::time::timeout(limit, self.reader.read_frame()).await {
            Ok(Err(PipeError::Closed)) => Ok(close),
            other => Err(format!("expected end of stream after CLOSE, got {other:?}").into()),
        }
    }
}

/// A shared handle type for pipes used from several tasks.
pub type SharedPipe = Arc<Pipe>;
