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
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{Mutex, mpsc, watch};

use crate::channel::{ChannelSession, Committed, ControlOut, ControlSender, Incoming, Outgoing};
use crate::compact::DescsOut;
use crate::dtype::DeviceKind;
use crate::endpoint::Config;
use crate::error::{ChannelError, LimitError, PipeError, ProtocolError};
use crate::frame::{Frame, FrameKind, FrameReader, FrameWriter, OutFrame};
use crate::message::Message;
use crate::meta::TensorMeta;
use crate::tensor::{Tensor, TensorMut};
use crate::transport::ConnInfo;
use crate::wire::FEATURE_COMPACT_TENSORS;
use crate::wire::{Close, ControlHeader, Limits, MessageHeader, TensorDesc};

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
    writer: Mutex<FrameWriter>,
    /// Held from the first tensor encoded to the frame written, so that messages reach the
    /// wire in the order their tensors were encoded (channels may rely on it).
    send_order: Mutex<()>,
    sessions: BTreeMap<DeviceKind, Arc<dyn ChannelSession>>,
    peer_limits: Limits,
    limits: Limits,
    /// [`crate::EndpointBuilder::max_header_values`].
    max_header_values: usize,
    closed_tx: watch::Sender<bool>,
    error: StdMutex<Option<PipeError>>,
    handler: StdMutex<HandlerSlot>,
    /// For due CONTROL bodies a cancelled or failed `write_message` took but did not write.
    control: ControlSender,
    /// The peer takes compact tensor descriptors ([`crate::compact`]).
    compact: bool,
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
    control: tokio::task::JoinHandle<()>,
    info: PipeInfo,
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
        (control, control_rx): (ControlSender, mpsc::UnboundedReceiver<ControlOut>),
    ) -> Pipe {
        let shared = Arc::new(Shared {
            writer: Mutex::new(writer),
            send_order: Mutex::new(()),
            sessions,
            peer_limits,
            limits: cfg.limits,
            max_header_values: cfg.max_header_values,
            closed_tx,
            error: StdMutex::new(None),
            handler: StdMutex::new(HandlerSlot::default()),
            control,
            compact: info.features.iter().any(|f| f == FEATURE_COMPACT_TENSORS),
        });
        let (tx, rx) = mpsc::channel(cfg.recv_queue);
        let task = tokio::spawn(read_loop(reader, shared.clone(), tx));
        let control = tokio::spawn(control_loop(control_rx, shared.clone()));
        Pipe { shared, rx: Mutex::new(rx), reader: task, control, info }
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
        *self.shared.closed_tx.borrow()
    }

    /// Sends a message. Returns once it is handed to the transport.
    pub async fn send(&self, msg: Message) -> Result<(), PipeError> {
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
        let _order = self.shared.send_order.lock().await;
        let mut out = Outgoing::default();
        match self.encode(&msg, &mut out).await {
            Ok(header) => {
                let (frame, mut committed) = out.finish(header);
                self.shared.write_message(frame, msg, &mut committed).await?;
                committed.run();
                Ok(())
            }
            Err(e) => {
                out.abort();
                Err(e)
            }
        }
    }

    async fn encode(&self, msg: &Message, out: &mut Outgoing) -> Result<Vec<u8>, PipeError> {
        let limits = &self.shared.peer_limits;
        let mut descs = Vec::with_capacity(msg.tensors.len());
        for t in &msg.tensors {
            let session = self.session_for(t)?;
            let loc = session.encode(t, out).await?;
            descs.push(TensorDesc { meta: t.meta().clone(), data: loc });
        }
        let header = serde_json::to_vec(&HeaderRef {
            header: &msg.header,
            tensors: DescsOut { descs: &descs, compact: self.shared.compact },
        })
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
    pub async fn close_with(&self, code: &str, message: String) {
        if !self.is_closed() {
            let bye = Close { code: code.into(), message };
            let _ =
                tokio::time::timeout(Duration::from_secs(1), self.write(FrameKind::Close, OutFrame::json(&bye))).await;
        }
        self.shared.mark_closed(PipeError::Closed);
        let mut w = self.shared.writer.lock().await;
        w.shutdown().await;
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

    async fn write(&self, kind: FrameKind, frame: OutFrame) -> Result<(), PipeError> {
        self.shared.write(kind, frame).await
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        self.reader.abort();
        self.control.abort();
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

impl Shared {
    fn handler_slot(&self) -> std::sync::MutexGuard<'_, HandlerSlot> {
        self.handler.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces the handler (`None`: clears it); the old one is dropped outside the lock.
    fn replace_handler(&self, new: Option<MessageHandler>) {
        let old = {
            let mut slot = self.handler_slot();
            slot.generation = slot.generation.wrapping_add(1);
            std::mem::replace(&mut slot.handler, new)
        };
        drop(old);
    }

    fn closed_error(&self) -> PipeError {
        match &*self.error.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(e @ PipeError::ClosedByPeer(_)) => e.clone(),
            _ => PipeError::Closed,
        }
    }

    fn mark_closed(&self, e: PipeError) {
        let mut slot = self.error.lock().unwrap_or_else(|e| e.into_inner());
        // The peer's stated reason (its CLOSE frame) beats a bare end of stream seen first
        // (a write that failed because the peer had already closed).
        let bare =
            matches!(&*slot, Some(PipeError::Closed | PipeError::Transport(crate::error::TransportError::Closed)));
        if slot.is_none() || (bare && matches!(e, PipeError::ClosedByPeer(_))) {
            *slot = Some(e);
        }
        self.closed_tx.send_replace(true);
    }

    /// Writes a MESSAGE frame. Once the write side is ours, the ordered actions run
    /// ([`Outgoing::on_ordered`]: leases the frame names may be released again), the message
    /// (its tensors) is dropped, so a lease on the peer's memory that only it held is
    /// released now, and the channels' due CONTROL bodies (such releases) go behind the frame
    /// in the same write: after the frame that may still name the lease (`shm_return`),
    /// never before it.
    async fn write_message(&self, frame: OutFrame, msg: Message, committed: &mut Committed) -> Result<(), PipeError> {
        let mut closed = self.closed_tx.subscribe();
        if *closed.borrow() {
            return Err(self.closed_error());
        }
        let r = tokio::select! {
            r = async {
                let mut w = self.writer.lock().await;
                committed.run_ordered();
                drop(msg);
                let mut due = DueControls { taken: self.due_controls(), control: &self.control };
                let trailing: Vec<(FrameKind, &[u8])> =
                    due.taken.iter().map(|(_, h)| (FrameKind::Control, h.as_slice())).collect();
                let r = w.write_frame_then(FrameKind::Message, frame, &trailing).await;
                if r.is_ok() {
                    due.taken.clear();
                }
                r
            } => r,
            _ = closed.wait_for(|c| *c) => Err(self.closed_error()),
        };
        if let Err(e) = &r
            && e.is_closed()
        {
            self.mark_closed(e.clone());
        }
        r
    }

    /// The channels' due CONTROL bodies (see [`ChannelSession::due_control`]), each with
    /// its frame header.
    fn due_controls(&self) -> Vec<(ControlOut, Vec<u8>)> {
        let mut out = Vec::new();
        for s in self.sessions.values() {
            if let Some(body) = s.due_control() {
                let header = serde_json::to_vec(&ControlHeader { channel: s.name().to_string(), body: body.clone() })
                    .unwrap_or_default();
                out.push((ControlOut::new(s.name(), body), header));
            }
        }
        out
    }

    async fn write(&self, kind: FrameKind, frame: OutFrame) -> Result<(), PipeError> {
        let mut closed = self.closed_tx.subscribe();
        if *closed.borrow() {
            return Err(self.closed_error());
        }
        let r = tokio::select! {
            r = async { self.writer.lock().await.write_frame(kind, frame).await } => r,
            _ = closed.wait_for(|c| *c) => Err(self.closed_error()),
        };
        if let Err(e) = &r
            && e.is_closed()
        {
            self.mark_closed(e.clone());
        }
        r
    }

    /// The peer broke the protocol: say why (best effort) and close.
    async fn fail(&self, e: &PipeError) {
        let code = match e {
            PipeError::Limit(_) => "limit",
            _ => "protocol_error",
        };
        let bye = Close { code: code.into(), message: e.to_string() };
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            let mut w = self.writer.lock().await;
            let _ = w.write_frame(FrameKind::Close, OutFrame::json(&bye)).await;
            w.shutdown().await;
        })
        .await;
    }
}

/// Due CONTROL bodies taken for a write: any not written (the send was cancelled, or the
/// write failed) go out through the control queue instead, never lost.
struct DueControls<'a> {
    taken: Vec<(ControlOut, Vec<u8>)>,
    control: &'a ControlSender,
}

impl Drop for DueControls<'_> {
    fn drop(&mut self) {
        for (c, _) in self.taken.drain(..) {
            let _ = self.control.send(c);
        }
    }
}

async fn read_loop(reader: FrameReader, shared: Arc<Shared>, tx: mpsc::Sender<Result<Message, PipeError>>) {
    let end = read_frames(reader, &shared, &tx).await;
    // The handler may hold what holds this pipe: let it go before waiting for room in the
    // queue (whose reader may be what the handler keeps alive).
    shared.replace_handler(None);
    if let Some(e) = end {
        let _ = tx.send(Err(e)).await;
    }
}

/// Reads until the pipe ends; returns the error to report to `recv` (`None`: `recv`'s side
/// is gone).
async fn read_frames(
    mut reader: FrameReader,
    shared: &Shared,
    tx: &mpsc::Sender<Result<Message, PipeError>>,
) -> Option<PipeError> {
    loop {
        let result = match reader.read_frame().await {
            Err(e) => Err(e),
            Ok(frame) => handle_frame(shared, frame).await,
        };
        match result {
            Ok(Some(msg)) => {
                // The handler is taken out while it runs, so that it may use the pipe freely.
                let (handler, generation) = {
                    let mut slot = shared.handler_slot();
                    (slot.handler.take(), slot.generation)
                };
                let Some(mut handler) = handler else {
                    reader.arm_busy_poll(false);
                    if tx.send(Ok(msg)).await.is_err() {
                        return None;
                    }
                    continue;
                };
                let pause = match handler(msg) {
                    Handled::Done => {
                        reader.arm_busy_poll(true);
                        None
                    }
                    Handled::Started => {
                        reader.arm_busy_poll(false);
                        None
                    }
                    Handled::Pause(until) => {
                        reader.arm_busy_poll(false);
                        Some(until)
                    }
                };
                {
                    let mut slot = shared.handler_slot();
                    // Unless it was replaced or cleared meanwhile.
                    if slot.generation == generation && slot.handler.is_none() {
                        slot.handler = Some(handler);
                    } else {
                        drop(slot);
                        drop(handler);
                    }
                }
                if let Some(until) = pause {
                    until.await;
                }
            }
            Ok(None) => {}
            Err(e) => {
                let peer_fault = !matches!(e, PipeError::Closed | PipeError::ClosedByPeer(_) | PipeError::Transport(_));
                reader.arm_busy_poll(false);
                if peer_fault {
                    tracing::warn!(error = %e, "closing pipe: peer sent bad data");
                    shared.fail(&e).await;
                }
                shared.mark_closed(e.clone());
                return Some(e);
            }
        }
    }
}

async fn control_loop(mut rx: mpsc::UnboundedReceiver<ControlOut>, shared: Arc<Shared>) {
    while let Some(c) = rx.recv().await {
        let header =
            serde_json::to_vec(&ControlHeader { channel: c.channel.to_string(), body: c.body }).unwrap_or_default();
        let frame = OutFrame {
            header,
            payload: Vec::new(),
            #[cfg(unix)]
            fds: c.fds,
        };
        if shared.write(FrameKind::Control, frame).await.is_err() {
            return;
        }
    }
}

async fn handle_frame(shared: &Shared, frame: Frame) -> Result<Option<Message>, PipeError> {
    match frame.kind {
        FrameKind::Message => decode_message(shared, frame).await.map(Some),
        FrameKind::Control => {
            let c: ControlHeader = frame.parse()?;
            let session = shared.sessions.values().find(|s| s.name() == c.channel).ok_or_else(|| {
                ProtocolError::BadHeader(format!(
                    "control frame for channel {:?}, which this pipe does not use",
                    c.channel
                ))
            })?;
            let mut incoming = Incoming::new(
                frame.payload,
                #[cfg(unix)]
                frame.fds,
            );
            session.control(c.body, &mut incoming)?;
            Ok(None)
        }
        FrameKind::Close => {
            let c: Close =
                frame.parse().unwrap_or_else(|e| Close { code: "unreadable".into(), message: e.to_string() });
            if c.code == "normal" {
                Err(PipeError::Closed)
            } else {
                Err(PipeError::ClosedByPeer(format!("{}: {}", c.code, c.message)))
            }
        }
        k => Err(ProtocolError::UnexpectedFrame { kind: k as u8, context: "after the handshake" }.into()),
    }
}

/// Headers at least this long are counted before they are parsed
/// ([`crate::json_shape::check`]); shorter ones cannot hold a harmful number of values.
const COUNT_HEADER_FROM: usize = 64 << 10;

/// Headers at least this long are parsed on the blocking pool, not on the runtime worker
/// that other connections' readers need.
const PARSE_OFF_WORKER_FROM: usize = 1 << 20;

/// Parses a MESSAGE frame's header, after counting its values when it is big; a header of
/// [`PARSE_OFF_WORKER_FROM`] bytes or more is counted and parsed on the blocking pool.
async fn message_header(shared: &Shared, frame: &mut Frame) -> Result<MessageHeader, PipeError> {
    let max = shared.max_header_values;
    if frame.header.len() < PARSE_OFF_WORKER_FROM {
        count_header_values(&frame.header, max)?;
        return Ok(frame.parse()?);
    }
    let header = std::mem::take(&mut frame.header);
    tokio::task::spawn_blocking(move || {
        crate::compute::enter();
        count_header_values(&header, max)?;
        Ok(crate::frame::parse_header::<MessageHeader>(&header)?)
    })
    .await
    .map_err(|e| ProtocolError::BadHeader(format!("parsing the header: {e}")))?
}

/// Checks a header of [`COUNT_HEADER_FROM`] bytes or more against `max` values (and the
/// parser's depth) before it is parsed.
fn count_header_values(text: &[u8], max: usize) -> Result<(), PipeError> {
    if text.len() < COUNT_HEADER_FROM {
        return Ok(());
    }
    let Err(e) = crate::json_shape::check(text, usize::MAX, max) else { return Ok(()) };
    let (what, value, max) = match e {
        crate::json_shape::ShapeError::Depth(d) => {
            return Err(ProtocolError::BadHeader(format!(
                "the message header nests {d} deep, over the parser's {}",
                crate::json_shape::MAX_DEPTH
            ))
            .into());
        }
        crate::json_shape::ShapeError::Batch(n) | crate::json_shape::ShapeError::Values(n) => {
            ("JSON values in a received message header", n as u64, max as u64)
        }
    };
    Err(PipeError::Limit(LimitError {
        limit: "max_header_values",
        what,
        value,
        max,
        hint: "send big arrays as tensors, or raise it with EndpointBuilder::max_header_values on the receiving side"
            .into(),
    }))
}

async fn decode_message(shared: &Shared, mut frame: Frame) -> Result<Message, PipeError> {
    let h = message_header(shared, &mut frame).await?;
    if h.tensors.len() as u64 > u64::from(shared.limits.max_tensors) {
        return Err(PipeError::Limit(LimitError {
            limit: "max_tensors",
            what: "tensors in a received message",
            value: h.tensors.len() as u64,
            max: shared.limits.max_tensors.into(),
            hint: "raise it with Limits::max_tensors (EndpointBuilder::limits) on the receiving side".into(),
        }));
    }
    let mut incoming = Incoming::new(
        frame.payload,
        #[cfg(unix)]
        frame.fds,
    );
    let mut tensors = Vec::with_capacity(h.tensors.len());
    for (index, d) in h.tensors.into_iter().enumerate() {
        let kind = d.meta.device.kind();
        let session = shared.sessions.get(&kind).ok_or_else(|| ProtocolError::BadTensor {
            index,
            reason: format!("no channel was negotiated for {kind:?} tensors"),
        })?;
        let t = session.decode(d.meta, &d.data, &mut incoming).await.map_err(|e| match e {
            ChannelError::Limit(l) => PipeError::Limit(l),
            e => ProtocolError::BadTensor { index, reason: e.to_string() }.into(),
        })?;
        tensors.push(t);
    }
    Ok(Message { header: h.header, tensors })
}
