//! [`Pipe`]: one negotiated connection. `send(Message)` / `recv() -> Message`, ordered, with
//! any number of tensors per message and any number of messages in flight.
//!
//! A background task reads frames, decodes messages (validating every descriptor) and
//! handles channel control frames. It queues messages for `recv`, or hands each to a
//! handler set with [`Pipe::set_handler`] (a server's fast path: no queue, no second task).
//! When the peer goes away or breaks the protocol, every pending and later operation
//! fails: `recv` returns the error once, then [`PipeError::Closed`].

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use serde::Serialize;
// futures' mutex, not tokio's: a lock and an unlock free of contention are one atomic
// write each (tokio's unlock also takes its waiter list's lock), and a send takes two.
use futures_util::lock::Mutex;
use tokio::sync::{mpsc, watch};

use crate::channel::{ChannelSession, ControlWaker, Outgoing};
use crate::compact::DescsOut;
use crate::dtype::DeviceKind;
use crate::endpoint::Config;
use crate::error::{ChannelError, LimitError, PipeError};
use crate::frame::{FrameKind, FrameReader, FrameWriter, OutFrame, RingCloser};
use crate::message::Message;
use crate::meta::TensorMeta;
use crate::tensor::{Tensor, TensorMut};
use crate::transport::ConnInfo;
use crate::wire::FEATURE_COMPACT_TENSORS;
use crate::wire::{Close, Limits, Location, TensorDesc};

mod blocking;
mod direct;
mod follow;
mod handover;
pub mod packed;
mod read;
mod shared;
mod write;
pub use follow::{FOLLOW_LINGER, Served};
use write::WriteSide;

/// What was negotiated for a pipe.
#[derive(Debug, Clone)]
pub struct PipeInfo {
    /// The connection.
    pub conn: ConnInfo,
    /// The channel chosen for each device kind.
    pub channels: BTreeMap<DeviceKind, String>,
    /// The peer's agent string.
    pub peer_agent: String,
    /// True on the accepting side.
    pub is_server: bool,
    /// The protocol features both sides use ([`crate::wire::Welcome::features`]).
    pub features: Vec<String>,
    /// Server side: true when the endpoint requires a bearer token
    /// ([`crate::EndpointBuilder::require_token`]) and this peer presented it. The RPC layer
    /// uses it as the peer's identity on transports without peer credentials.
    pub token_verified: bool,
}

struct Shared {
    /// The write side ([`write`]: the send sequence).
    writer: Mutex<WriteSide>,
    /// Held from the first tensor encoded to the frame written, so that messages reach the
    /// wire in the order their tensors were encoded (channels may rely on it). It holds
    /// the buffers a send reuses.
    send_order: Mutex<SendScratch>,
    sessions: BTreeMap<DeviceKind, Arc<dyn ChannelSession>>,
    peer_limits: Limits,
    limits: Limits,
    /// [`crate::EndpointBuilder::max_header_values`].
    max_header_values: usize,
    closed_tx: watch::Sender<bool>,
    /// `closed_tx`'s value, set first: what a send looks at (a load, where borrowing the
    /// watch takes and lets go of its lock: two atomic writes on every send).
    closed: AtomicBool,
    error: StdMutex<Option<PipeError>>,
    handler: StdMutex<HandlerSlot>,
    /// A handler is set ([`Pipe::set_handler`]; it stays set while the reader runs it).
    has_handler: AtomicBool,
    /// Woken by a session with CONTROL frames due ([`crate::SessionCtx::control`]).
    control: ControlWaker,
    /// The peer takes compact tensor descriptors ([`crate::compact`]).
    compact: bool,
    /// The reader's hand-over to blocking callers ([`blocking`]).
    handover: handover::Handover,
    /// The largest packed message record ([`packed`]) the ring takes; 0 when messages are
    /// not packed (no ring, or the peer did not grant [`crate::wire::FEATURE_RING_MESSAGES`]).
    pack_room: usize,
    /// Ends the ring's waits when the pipe closes (a write stuck on a full ring, on a plain
    /// thread, then fails at once).
    ring_closer: RingCloser,
    /// Whether the peer's end is closed ([`crate::PeerLiveness`]), when the transport tells.
    liveness: Option<Arc<dyn crate::PeerLiveness>>,
    /// The socket's direct wait ([`direct`], and a blocking caller's driven frames:
    /// [`crate::DirectRead::drive`]), interrupted when the pipe closes.
    direct: Option<Arc<dyn crate::DirectRead>>,
    /// This side closed the pipe ([`Pipe::close`]).
    closed_here: AtomicBool,
    /// The peer sent a CLOSE frame (an orderly close, not a death).
    peer_said_bye: AtomicBool,
}

/// What `send_order` guards: buffers each send reuses (no allocation per message).
#[derive(Default)]
struct SendScratch {
    /// Where packed records are built ([`Shared::pack`]).
    record: Vec<u8>,
    /// The tensors' locations (`send_blocking`).
    locs: Vec<Location>,
}

impl SendScratch {
    /// Empties the buffers after a send, letting go of a big one's memory.
    fn clear_and_trim(&mut self) {
        const KEEP_LOCS: usize = 256;
        packed::trim_scratch(&mut self.record);
        self.locs.clear();
        if self.locs.capacity() > KEEP_LOCS {
            self.locs = Vec::new();
        }
    }
}

/// The handler and a count of `set_handler` / `clear_handler` calls, so that the reader,
/// which takes the handler out while it runs, does not put back one that was replaced or
/// cleared meanwhile.
#[derive(Default)]
struct HandlerSlot {
    handler: Option<MessageHandler>,
    generation: u64,
}

/// Takes each received message in the pipe's reader task (see [`Pipe::set_handler`]).
pub type MessageHandler = Box<dyn FnMut(Message) -> Handled + Send>;

/// What a [`MessageHandler`] did with a message: what the reader does next.
pub enum Handled {
    /// Answered it, or started nothing that still waits to run: the reader may busy-poll
    /// for the next message ([`crate::BusyPoll`]).
    Done,
    /// Started work that goes on elsewhere: the reader waits for the next message the
    /// ordinary way.
    Started,
    /// Started work, and the handler's bound on work not yet finished is full: the reader
    /// reads nothing more until this future ends (a peer sending faster than its answers
    /// leave is held back by its own writes, not by the receiver's memory).
    Pause(Pin<Box<dyn Future<Output = ()> + Send>>),
}

/// One negotiated connection. `send` and `recv` take `&self`: share a pipe between tasks
/// with an `Arc` (concurrent sends are serialised; each message goes out whole).
pub struct Pipe {
    shared: Arc<Shared>,
    rx: Mutex<mpsc::Receiver<Result<Message, PipeError>>>,
    reader: tokio::task::JoinHandle<()>,
    info: PipeInfo,
    /// The runtime the pipe's tasks run on (blocking calls wait through it).
    handle: tokio::runtime::Handle,
}

#[derive(Serialize)]
struct HeaderRef<'a> {
    header: &'a serde_json::Value,
    tensors: DescsOut<'a>,
}

impl Pipe {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        reader: FrameReader,
        writer: FrameWriter,
        sessions: BTreeMap<DeviceKind, Arc<dyn ChannelSession>>,
        info: PipeInfo,
        peer_limits: Limits,
        cfg: &Config,
        closed_tx: watch::Sender<bool>,
        control: ControlWaker,
    ) -> Pipe {
        let packs = [crate::wire::FEATURE_RING, crate::wire::FEATURE_RING_MESSAGES]
            .iter()
            .all(|want| info.features.iter().any(|f| f == want));
        let pack_room = if packs { writer.ring_max_record().unwrap_or(0) } else { 0 };
        let ring_closer = writer.ring_closer();
        let liveness = writer.liveness();
        let shared = Arc::new(Shared {
            direct: reader.socket_direct().cloned(),
            ring_closer,
            liveness,
            closed_here: AtomicBool::new(false),
            peer_said_bye: AtomicBool::new(false),
            writer: Mutex::new(WriteSide::new(writer)),
            send_order: Mutex::new(SendScratch::default()),
            sessions,
            peer_limits,
            limits: cfg.limits,
            max_header_values: cfg.max_header_values,
            closed_tx,
            closed: AtomicBool::new(false),
            error: StdMutex::new(None),
            handler: StdMutex::new(HandlerSlot::default()),
            has_handler: AtomicBool::new(false),
            control,
            compact: info.features.iter().any(|f| f == FEATURE_COMPACT_TENSORS),
            handover: handover::Handover::default(),
            pack_room,
        });
        let (tx, rx) = mpsc::channel(cfg.recv_queue);
        let task = tokio::spawn(read::read_loop(reader, shared.clone(), tx));
        // Ends by itself when the pipe closes (after the sessions' `close`).
        tokio::spawn(write::control_task(shared.clone()));
        Pipe { shared, rx: Mutex::new(rx), reader: task, info, handle: tokio::runtime::Handle::current() }
    }

    /// What was negotiated.
    pub fn info(&self) -> &PipeInfo {
        &self.info
    }

    /// The channel carrying CPU tensors (`"inline"`, `"shm"`).
    pub fn channel(&self) -> &str {
        self.info.channels.get(&DeviceKind::Cpu).map(String::as_str).unwrap_or("")
    }

    /// The transport's name (`"unix"`).
    pub fn transport(&self) -> &'static str {
        self.info.conn.transport
    }

    /// True once the pipe is closed (by either side or by an error).
    pub fn is_closed(&self) -> bool {
        self.shared.is_closed()
    }

    /// Sends a message. Returns once it is handed to the transport. Dropping the future
    /// before then is safe: the message goes out whole or not at all (a write dropped
    /// part-way closes the pipe; [`write`] has the sequence).
    ///
    /// A send waits while the peer does not read (its ring or socket buffer is full); if the
    /// peer dies meanwhile, it fails with [`PipeError::PeerGone`]. [`Pipe::send_timeout`]
    /// bounds the wait.
    pub async fn send(&self, msg: Message) -> Result<(), PipeError> {
        self.send_inner(msg).await.map_err(|e| self.shared.send_error(e))
    }

    /// [`Pipe::send`] that gives up after `timeout` with [`PipeError::Timeout`] (the peer
    /// did not make room in time: it is not reading). A send given up before its message
    /// reached the wire sends nothing and leaves the pipe open; one given up part-way
    /// through a frame on the socket closes the pipe (the stream lost its frame boundary).
    pub async fn send_timeout(&self, msg: Message, timeout: Duration) -> Result<(), PipeError> {
        match tokio::time::timeout(timeout, self.send_inner(msg)).await {
            Ok(r) => r.map_err(|e| self.shared.send_error(e)),
            Err(_) => Err(PipeError::Timeout(timeout, "send")),
        }
    }

    async fn send_inner(&self, msg: Message) -> Result<(), PipeError> {
        self.check_send(&msg)?;
        let mut order = self.shared.send_order.lock().await;
        let mut out = Outgoing::default();
        let locs = match self.encode_now(&msg, &mut out) {
            Some(r) => r,
            None => self.encode_tensors(&msg, &mut out).await,
        };
        match locs {
            Ok(locs) => self.send_encoded(msg, locs, out, &mut order.record).await,
            Err(e) => {
                out.abort();
                Err(e)
            }
        }
    }

    /// Sends `msg`, whose tensors were encoded to `locs` in `out`, as a packed ring record
    /// ([`packed`]) when it can go as one, else as a MESSAGE frame ([`write`] has the
    /// sequence). The caller holds `send_order`; `scratch` is its record buffer.
    async fn send_encoded(
        &self,
        msg: Message,
        locs: Vec<Location>,
        out: Outgoing,
        scratch: &mut Vec<u8>,
    ) -> Result<(), PipeError> {
        if self.shared.pack(&msg, &locs, scratch) {
            let (_, tickets) = out.finish(Vec::new());
            let r = self.shared.write_packed(scratch, msg, tickets).await;
            packed::trim_scratch(scratch);
            return r;
        }
        let header = match self.frame_header(&msg, locs, &out) {
            Ok(h) => h,
            Err(e) => {
                out.abort();
                return Err(e);
            }
        };
        let (frame, tickets) = out.finish(header);
        self.shared.write_message(frame, msg, tickets).await
    }

    /// Encodes every tensor of `msg` without waiting ([`ChannelSession::encode_now`]);
    /// `None` when a session would have to wait (`out` is then empty again: what the
    /// tensors before it recorded was aborted).
    fn encode_now(&self, msg: &Message, out: &mut Outgoing) -> Option<Result<Vec<Location>, PipeError>> {
        let mut locs = Vec::with_capacity(msg.tensors.len());
        Some(self.encode_now_into(msg, out, &mut locs)?.map(|()| locs))
    }

    /// [`Pipe::encode_now`] into `locs` (a reused buffer, cleared first).
    fn encode_now_into(
        &self,
        msg: &Message,
        out: &mut Outgoing,
        locs: &mut Vec<Location>,
    ) -> Option<Result<(), PipeError>> {
        locs.clear();
        for t in &msg.tensors {
            let session = match self.session_for(t) {
                Ok(s) => s,
                Err(e) => return Some(Err(e)),
            };
            match session.encode_now(t, out) {
                Some(Ok(loc)) => locs.push(loc),
                Some(Err(e)) => return Some(Err(e.into())),
                None => {
                    std::mem::take(out).abort();
                    return None;
                }
            }
        }
        Some(Ok(()))
    }

    /// Encodes every tensor of `msg` through its channel's session (which may wait).
    async fn encode_tensors(&self, msg: &Message, out: &mut Outgoing) -> Result<Vec<Location>, PipeError> {
        let mut locs = Vec::with_capacity(msg.tensors.len());
        for t in &msg.tensors {
            locs.push(self.session_for(t)?.encode(t, out).await?);
        }
        Ok(locs)
    }

    /// What every send checks first: the pipe is open, and the peer takes that many tensors.
    fn check_send(&self, msg: &Message) -> Result<(), PipeError> {
        if self.is_closed() {
            return Err(self.shared.closed_error());
        }
        let limits = &self.shared.peer_limits;
        if msg.tensors.len() as u64 > u64::from(limits.max_tensors) {
            return Err(peer_limit(
                "max_tensors",
                "tensors in the message",
                msg.tensors.len() as u64,
                limits.max_tensors.into(),
            ));
        }
        Ok(())
    }

    /// The MESSAGE frame's JSON header for `msg` with its tensors at `locs`, checked
    /// against the peer's limits (with the payload and descriptors in `out`).
    fn frame_header(&self, msg: &Message, locs: Vec<Location>, out: &Outgoing) -> Result<Vec<u8>, PipeError> {
        let limits = &self.shared.peer_limits;
        let descs: Vec<TensorDesc> =
            msg.tensors.iter().zip(locs).map(|(t, data)| TensorDesc { meta: t.meta().clone(), data }).collect();
        // Room for a small message's header at once (growing from empty reallocates 4 times).
        let mut header = Vec::with_capacity(256);
        serde_json::to_writer(
            &mut header,
            &HeaderRef { header: &msg.header, tensors: DescsOut { descs: &descs, compact: self.shared.compact } },
        )
        .map_err(|e| PipeError::ApiMisuse(format!("header does not serialize: {e}").into()))?;
        let (h, p, f) = (header.len() as u64, out.payload_len(), out.fd_count() as u64);
        if h > u64::from(limits.max_header_bytes) {
            return Err(peer_limit("max_header_bytes", "message header length", h, limits.max_header_bytes.into()));
        }
        if p > limits.max_payload_bytes {
            return Err(peer_limit("max_payload_bytes", "message payload length", p, limits.max_payload_bytes));
        }
        if f > u64::from(limits.max_fds) {
            return Err(peer_limit("max_fds", "descriptors in the message", f, limits.max_fds.into()));
        }
        Ok(header)
    }

    /// A writable tensor for `meta`, in the negotiated channel's own memory where it has
    /// some (the shm pool: sending it then costs no copy), else on the heap. Fill it, then
    /// `freeze()` it and send it. Its bytes are unspecified (like `numpy.empty`): a
    /// recycled pool slot still holds what an earlier tensor wrote, so write every byte.
    pub async fn alloc(&self, meta: TensorMeta) -> Result<TensorMut, PipeError> {
        if meta.device != crate::Device::Cpu {
            return Err(PipeError::ApiMisuse(
                format!("alloc is for host tensors; use alloc_device for {} tensors", meta.device).into(),
            ));
        }
        let kind = meta.device.kind();
        if let Some(session) = self.shared.sessions.get(&kind)
            && let Some(t) = session.alloc(&meta).await?
        {
            return Ok(t);
        }
        Ok(TensorMut::zeros(meta)?)
    }

    /// A device tensor for `meta` (e.g. `cuda:0`) in the negotiated device channel's
    /// exportable memory, so that sending it costs no copy. Fails when no channel for that
    /// device was negotiated.
    pub async fn alloc_device(&self, meta: TensorMeta) -> Result<Tensor, PipeError> {
        let kind = meta.device.kind();
        let session = self.shared.sessions.get(&kind).ok_or_else(|| {
            PipeError::Channel(ChannelError::Unsupported {
                channel: "none",
                reason: format!("no channel was negotiated for {kind:?} tensors on this pipe"),
            })
        })?;
        match session.alloc_device(&meta).await? {
            Some(t) => Ok(t),
            None => Err(PipeError::Channel(ChannelError::Unsupported {
                channel: session.name(),
                reason: format!("the {} channel cannot allocate {} memory", session.name(), meta.device),
            })),
        }
    }

    /// Leases of this side's memory the peer holds now, over every channel
    /// ([`crate::ChannelSession::leases_granted`]).
    pub fn leases_granted(&self) -> usize {
        self.shared.sessions.values().map(|s| s.leases_granted()).sum()
    }

    /// Each negotiated channel's counters (e.g. the shm pool's segments and leases), by
    /// channel name.
    pub fn stats(&self) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        for s in self.shared.sessions.values() {
            m.insert(s.name().to_string(), s.stats());
        }
        serde_json::Value::Object(m)
    }

    /// Hands every message received from now on to `handler`, called in the pipe's reader
    /// task as soon as the message is decoded, instead of queueing it for [`Pipe::recv`]:
    /// no queue and no second task between the socket and the handler, the lowest latency
    /// (a server answering requests). `handler` must return quickly: it may answer at once
    /// what is cheap, and should spawn anything that waits. Its [`Handled`] allows the
    /// reader to busy-poll ([`crate::EndpointBuilder::busy_poll`]), or pauses it.
    ///
    /// Messages received before the call are still queued for `recv`; after them, `recv`
    /// returns only the error that ends the pipe. The handler is dropped when the pipe
    /// ends (it may hold what holds the pipe). It must not call `set_handler` itself.
    pub fn set_handler(&self, handler: MessageHandler) {
        self.shared.replace_handler(Some(handler));
    }

    /// Drops the handler set with [`Pipe::set_handler`]; later messages are queued for
    /// `recv` again.
    pub fn clear_handler(&self) {
        self.shared.replace_handler(None);
    }

    /// Receives the next message, in the order the peer sent them.
    pub async fn recv(&self) -> Result<Message, PipeError> {
        let mut rx = self.rx.lock().await;
        match rx.recv().await {
            Some(r) => r,
            None => Err(self.shared.closed_error()),
        }
    }

    /// Receives with a time limit.
    pub async fn recv_timeout(&self, d: Duration) -> Result<Message, PipeError> {
        tokio::time::timeout(d, self.recv()).await.map_err(|_| PipeError::Timeout(d, "recv"))?
    }

    /// Closes the pipe: tells the peer (a CLOSE frame) and shuts the connection down.
    pub async fn close(&self) {
        self.close_with("normal", String::new()).await;
    }

    /// Closes the pipe with a CLOSE frame of this `code` (`normal`, `limit`,
    /// `protocol_error`, ...) and `message`, which the peer's pending and later operations
    /// report.
    ///
    /// It never waits for a write that is stuck (a peer that does not read): the CLOSE
    /// frame goes only if the write side takes it within 100 ms; a send blocked meanwhile
    /// fails with [`PipeError::Closed`] at once.
    pub async fn close_with(&self, code: &str, message: String) {
        self.shared.closed_here.store(true, Ordering::Release);
        if !self.is_closed() {
            let bye = Close { code: code.into(), message };
            let _ = tokio::time::timeout(CLOSE_GRACE, self.shared.write(FrameKind::Close, OutFrame::json(&bye))).await;
        }
        self.shared.mark_closed(PipeError::Closed);
        // A write that was stuck ends on the close (its wait looks at it); the socket is
        // shut once it has let go of the write side.
        if let Ok(mut w) = tokio::time::timeout(CLOSE_GRACE, self.shared.writer.lock()).await {
            w.frames.shutdown().await;
        }
    }

    fn session_for(&self, t: &Tensor) -> Result<&Arc<dyn ChannelSession>, PipeError> {
        let kind = t.device().kind();
        self.shared.sessions.get(&kind).ok_or_else(|| {
            PipeError::Channel(ChannelError::Unsupported {
                channel: "none",
                reason: format!("no channel was negotiated for {kind:?} tensors on this pipe"),
            })
        })
    }
}

/// The longest [`Pipe::close`] waits for the write side to send its CLOSE frame and to
/// shut the socket: a peer that does not read makes it give up (the peer then sees the end
/// of the connection, without a reason).
const CLOSE_GRACE: Duration = Duration::from_millis(100);

impl Drop for Pipe {
    fn drop(&mut self) {
        self.reader.abort();
        self.shared.mark_closed(PipeError::Closed);
    }
}

impl std::fmt::Debug for Pipe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipe").field("info", &self.info).finish_non_exhaustive()
    }
}

fn peer_limit(limit: &'static str, what: &'static str, value: u64, max: u64) -> PipeError {
    PipeError::Limit(LimitError::endpoint(
        limit,
        what,
        value,
        max,
        " on the peer (its limit, announced in the handshake)",
    ))
}
