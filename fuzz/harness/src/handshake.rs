//! Target `handshake`: the bytes a client sends, through the real server handshake of an
//! [`Endpoint`] (preamble, HELLO, token, the channel decision, WELCOME or REFUSE), over an
//! in-memory connection.

use std::sync::Arc;

use async_trait::async_trait;
use ferry_core::frame::{FrameKind, FrameReader, HANDSHAKE_LIMITS};
use ferry_core::transport::Split;
use ferry_core::wire::{Hello, Welcome};
use ferry_core::{
    Accepted, Address, Channel, ConnInfo, Connection, DeviceKind, Endpoint, FdQueue, InlineChannel, Listener,
    PipeError, PipeListener, Refusal, Transport, TransportError,
};
use ferry_cuda_ipc::fake::FakeGpu;
use ferry_cuda_ipc::{CudaIpcChannel, CudaIpcOptions};
use ferry_shm::ShmChannel;
use tokio::sync::mpsc;

use crate::{Sink, block_on, reader};

/// The token a server of this target requires (when it requires one).
pub const TOKEN: &str = "fuzz-token";

/// The first byte of `data` picks the server: bit 0 requires the token `fuzz-token`, bit 1 accepts
/// plain-JSON peers. The rest is what the client sends, then it hangs up.
///
/// The server has the inline, shm and cuda-ipc (over a fake driver) channels.
///
/// Asserts: a handshake task never fails (a panic inside it would be reported as
/// `ApiMisuse`); an accepted pipe was welcomed with a WELCOME frame naming the same
/// channels, one for cpu tensors, each offered by the client's HELLO for that kind, and
/// with the token when one is required; a refusal went to the client as a REFUSE frame
/// saying the same; a plain-JSON peer is handed over only when the server accepts them
/// and the bytes start like JSON.
pub fn handshake(data: &[u8]) {
    let Some((&mode, sent)) = data.split_first() else { return };
    let (need_token, foreign) = (mode & 1 != 0, mode & 2 != 0);
    block_on(async {
        let mut server = take_server(need_token, foreign).await;
        let sink = Sink::default();
        let conn = MemConn { info: conn_info(), read: sent.to_vec(), write: sink.clone() };
        server.tx.send(Box::new(conn)).await.expect("the listener is running");
        let got = server.listener.accept_any().await;
        let out = sink.bytes();
        check(need_token, foreign, sent, &out, got).await;
        put_server(need_token, foreign, server);
        crate::settle().await;
    });
}

async fn check(need_token: bool, foreign: bool, sent: &[u8], out: &[u8], got: Result<Accepted, PipeError>) {
    match got {
        Ok(Accepted::Foreign(_)) => {
            assert!(foreign, "a plain-JSON peer was accepted by a server that takes none");
            assert!(matches!(sent.first(), Some(b'{' | b'[')), "a peer handed over as plain JSON");
            assert!(out.is_empty(), "a plain-JSON peer got bytes from the ferry handshake");
        }
        Ok(Accepted::Pipe(pipe)) => {
            let hello = client_hello(sent).await.expect("a pipe was accepted without a readable HELLO");
            if need_token {
                assert_eq!(hello.token.as_deref(), Some(TOKEN), "a pipe was accepted without the token");
            }
            let (kind, header) = first_frame(out).await.expect("an accepted client got no WELCOME");
            assert_eq!(kind, FrameKind::Welcome);
            let welcome: Welcome = serde_json::from_slice(&header).expect("the WELCOME reads back");
            assert_eq!(welcome.channels, pipe.info().channels, "WELCOME and the pipe disagree");
            assert!(welcome.channels.contains_key(&DeviceKind::Cpu), "no channel for cpu tensors");
            for (kind, name) in &welcome.channels {
                assert!(
                    hello.channels.iter().any(|o| &o.name == name && o.devices.contains(kind)),
                    "the server chose {name} for {kind:?}, which the client did not offer"
                );
            }
            drop(pipe);
        }
        Err(PipeError::Refused(r)) => {
            if out.starts_with(&ferry_core::frame::MAGIC) {
                let (kind, header) = first_frame(out).await.expect("a refused client got no REFUSE");
                assert_eq!(kind, FrameKind::Refuse);
                let sent_r: Refusal = serde_json::from_slice(&header).expect("the REFUSE reads back");
                assert_eq!(sent_r, r, "REFUSE says something else than the server decided");
            } else {
                // A plain-JSON peer at a server that requires a token gets one JSON-RPC line.
                assert!(need_token && foreign && r == Refusal::BadToken, "refused without a REFUSE: {r}");
                let line: serde_json::Value = serde_json::from_slice(out).expect("a JSON-RPC error line");
                assert_eq!(line["error"]["code"], -32008);
            }
        }
        Err(PipeError::ApiMisuse(m)) => panic!("the handshake task failed: {m}"),
        Err(_) => {}
    }
}

/// The client's HELLO, as the server reads it.
async fn client_hello(sent: &[u8]) -> Option<Hello> {
    let mut r = FrameReader::new(reader(sent), None, HANDSHAKE_LIMITS);
    r.read_preamble().await.ok()?;
    r.read_frame().await.ok()?.into_frame().ok()?.parse().ok()
}

/// The first frame the server wrote after its preamble.
async fn first_frame(out: &[u8]) -> Option<(FrameKind, Vec<u8>)> {
    let mut r = FrameReader::new(reader(out), None, HANDSHAKE_LIMITS);
    r.read_preamble().await.ok()?;
    let f = r.read_frame().await.ok()?.into_frame().ok()?;
    Some((f.kind, f.header))
}

fn conn_info() -> ConnInfo {
    ConnInfo {
        transport: "mem",
        addr: "mem:fuzz".into(),
        peer_pid: Some(1),
        peer_uid: Some(0),
        fd_passing: true,
        same_host: true,
        handle: None,
    }
}

/// A listening server and the way to hand it connections.
struct Server {
    tx: mpsc::Sender<Box<dyn Connection>>,
    listener: PipeListener,
}

thread_local! {
    static SERVERS: std::cell::RefCell<[Option<Server>; 4]> = const { std::cell::RefCell::new([None, None, None, None]) };
}

fn slot(need_token: bool, foreign: bool) -> usize {
    usize::from(need_token) | usize::from(foreign) << 1
}

async fn take_server(need_token: bool, foreign: bool) -> Server {
    if let Some(s) = SERVERS.with(|s| s.borrow_mut()[slot(need_token, foreign)].take()) {
        return s;
    }
    let (tx, rx) = mpsc::channel(1);
    let gpu = FakeGpu::new(1);
    let cuda = CudaIpcChannel::with_driver(gpu.process(1), CudaIpcOptions::default());
    let channels: Vec<Arc<dyn Channel>> = vec![Arc::new(cuda), Arc::new(ShmChannel::new()), Arc::new(InlineChannel)];
    let mut b = Endpoint::builder().transport(Arc::new(MemTransport { rx: std::sync::Mutex::new(Some(rx)) }));
    for c in channels {
        b = b.channel(c);
    }
    if need_token {
        b = b.require_token(TOKEN);
    }
    let listener = b.accept_foreign(foreign).build().listen("mem:fuzz").await.expect("listening in memory");
    Server { tx, listener }
}

fn put_server(need_token: bool, foreign: bool, s: Server) {
    SERVERS.with(|slots| slots.borrow_mut()[slot(need_token, foreign)] = Some(s));
}

/// A transport whose one listener takes connections from a channel.
struct MemTransport {
    rx: std::sync::Mutex<Option<mpsc::Receiver<Box<dyn Connection>>>>,
}

#[async_trait]
impl Transport for MemTransport {
    fn scheme(&self) -> &'static str {
        "mem"
    }

    async fn listen(&self, addr: &Address) -> Result<Box<dyn Listener>, TransportError> {
        let rx = self.rx.lock().ok().and_then(|mut r| r.take()).ok_or(TransportError::ApiMisuse("listened twice"))?;
        Ok(Box::new(MemListener { rx, addr: addr.clone() }))
    }

    async fn connect(&self, _: &Address) -> Result<Box<dyn Connection>, TransportError> {
        Err(TransportError::ApiMisuse("the in-memory transport only listens"))
    }
}

struct MemListener {
    rx: mpsc::Receiver<Box<dyn Connection>>,
    addr: Address,
}

#[async_trait]
impl Listener for MemListener {
    async fn accept(&mut self) -> Result<Box<dyn Connection>, TransportError> {
        self.rx.recv().await.ok_or(TransportError::Closed)
    }

    fn local_addr(&self) -> Address {
        self.addr.clone()
    }
}

/// One connection: the client's bytes, then end of stream; what the server writes.
struct MemConn {
    info: ConnInfo,
    read: Vec<u8>,
    write: Sink,
}

impl Connection for MemConn {
    fn info(&self) -> &ConnInfo {
        &self.info
    }

    fn split(self: Box<Self>) -> Split {
        Split {
            read: reader(&self.read),
            write: Box::new(self.write),
            fds: Some(FdQueue::new()),
            busy_poll: None,
            liveness: None,
        }
    }
}
