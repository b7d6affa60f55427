//! The channel layer: a [`Channel`] moves tensor bytes; the handshake picks one per device
//! kind, and each pipe opens a [`ChannelSession`] of it.
//!
//! Contract (enforced by the conformance suite, `ferry-conformance`):
//! - `encode` then the peer's `decode` gives a tensor with the same metadata and bytes.
//! - `decode` validates every descriptor against the bytes really present and returns a
//!   typed error for anything inconsistent; it never panics or reads out of bounds.
//! - A channel offers itself only where it can work ([`Channel::offer`]).

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use crate::dtype::DeviceKind;
use crate::error::ChannelError;
use crate::frame::OutFrame;
use crate::meta::TensorMeta;
use crate::tensor::TensorMut;
use crate::tensor::{ALIGN, Tensor};
use crate::transport::ConnInfo;
use crate::wire::{ChannelOffer, InlineRef, Location};

/// A CONTROL frame a session wants sent to its peer session.
#[derive(Debug)]
pub struct ControlOut {
    /// The sending channel's name.
    pub channel: &'static str,
    /// Channel-specific body.
    pub body: serde_json::Value,
    /// Descriptors to attach (unix).
    #[cfg(unix)]
    pub fds: Vec<std::os::fd::OwnedFd>,
}

impl ControlOut {
    /// A CONTROL body with no descriptors (builds on every platform).
    pub fn new(channel: &'static str, body: serde_json::Value) -> Self {
        ControlOut {
            channel,
            body,
            #[cfg(unix)]
            fds: Vec::new(),
        }
    }
}

/// Sends CONTROL frames on behalf of a session; they go out in order, after any frame
/// already being written. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ControlSender {
    tx: tokio::sync::mpsc::UnboundedSender<ControlOut>,
}

impl ControlSender {
    /// A sender and the receiving end the pipe drains.
    pub fn channel() -> (ControlSender, tokio::sync::mpsc::UnboundedReceiver<ControlOut>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (ControlSender { tx }, rx)
    }

    /// Queues a CONTROL frame. Fails once the pipe is gone.
    pub fn send(&self, msg: ControlOut) -> Result<(), ChannelError> {
        self.tx.send(msg).map_err(|_| ChannelError::Closed)
    }
}

/// What a session gets from the pipe it serves.
#[derive(Debug, Clone)]
pub struct SessionCtx {
    /// The connection.
    pub conn: ConnInfo,
    /// Sends CONTROL frames to the peer's session.
    pub control: ControlSender,
    /// Becomes `true` when the pipe closes (for waits that must end then).
    pub closed: tokio::sync::watch::Receiver<bool>,
    /// True on the accepting side.
    pub is_server: bool,
    /// The handshake features both sides agreed to (`Welcome::features`).
    pub features: Vec<String>,
}

impl SessionCtx {
    /// Whether both sides agreed to handshake feature `name`.
    pub fn has_feature(&self, name: &str) -> bool {
        self.features.iter().any(|f| f == name)
    }
}

/// A way to move tensor bytes, registered in an [`crate::Endpoint`].
pub trait Channel: Send + Sync + 'static {
    /// Its name on the wire (`"inline"`, `"shm"`).
    fn name(&self) -> &'static str;
    /// The device kinds it carries.
    fn devices(&self) -> &'static [DeviceKind];
    /// Whether it can work on this machine at all.
    fn viability(&self) -> Result<(), ChannelError> {
        Ok(())
    }
    /// Client side: the offer to make over `conn`, or `None` where it cannot work over it.
    fn offer(&self, conn: &ConnInfo) -> Option<ChannelOffer>;
    /// Server side: whether it can serve a client that made `offer` over `conn`.
    fn accepts(&self, offer: &ChannelOffer, conn: &ConnInfo) -> bool;
    /// Opens a session for one pipe.
    fn open(&self, ctx: SessionCtx) -> Result<Arc<dyn ChannelSession>, ChannelError>;
}

/// One pipe's use of a channel.
#[async_trait]
pub trait ChannelSession: Send + Sync + 'static {
    /// The channel's name.
    fn name(&self) -> &'static str;
    /// Prepares `tensor` for sending in the message being built in `out` and returns its
    /// location. May wait (e.g. for pool space).
    async fn encode(&self, tensor: &Tensor, out: &mut Outgoing) -> Result<Location, ChannelError>;
    /// Rebuilds tensor `index` of a received message. Validates everything.
    /// May wait for bytes that travel apart from the frame (e.g. QUIC streams).
    async fn decode(&self, meta: TensorMeta, loc: &Location, incoming: &mut Incoming) -> Result<Tensor, ChannelError>;
    /// A writable tensor in the channel's own memory (e.g. the shm pool), so that sending it
    /// costs no copy. `None`: the channel has no memory of its own (ordinary heap memory
    /// will do).
    async fn alloc(&self, meta: &TensorMeta) -> Result<Option<TensorMut>, ChannelError> {
        let _ = meta;
        Ok(None)
    }
    /// A device tensor in the channel's own exportable device memory (e.g. the CUDA IPC
    /// pool), to be filled on the device (by a kernel, or a copy on the caller's stream) and
    /// sent with no copy. `None`: the channel has no device memory of its own.
    async fn alloc_device(&self, meta: &TensorMeta) -> Result<Option<Tensor>, ChannelError> {
        let _ = meta;
        Ok(None)
    }
    /// Leases of this side's memory the peer holds now (tensors it received without a copy
    /// and has not released); 0 for channels that lend nothing. A server keeps a pipe whose
    /// peer holds some open however long it idles.
    fn leases_granted(&self) -> usize {
        0
    }
    /// Counters for diagnostics and tests (channel-specific JSON; `null` when none).
    fn stats(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
    /// Handles a CONTROL frame (body and attached descriptors) from the peer's session.
    fn control(&self, body: serde_json::Value, incoming: &mut Incoming) -> Result<(), ChannelError> {
        let _ = (body, incoming);
        Err(ChannelError::BadDescriptor {
            channel: self.name(),
            reason: "this channel takes no control messages".into(),
        })
    }
    /// A CONTROL body that is due now and may ride behind the message frame being written
    /// (e.g. the leases its tensors held, released as the message is sent), so that it
    /// costs no write of its own. `None` when nothing is due. Only bodies without
    /// descriptors; the pipe calls it while it holds the write side, after the message's
    /// own tensors are dropped.
    fn due_control(&self) -> Option<serde_json::Value> {
        None
    }
}

/// The message frame being built: payload parts and descriptors to send.
#[derive(Default)]
pub struct Outgoing {
    frame: OutFrame,
    len: u64,
    on_abort: Vec<Box<dyn FnOnce() + Send>>,
    on_commit: Vec<Box<dyn FnOnce() + Send>>,
    on_ordered: Vec<Box<dyn FnOnce() + Send>>,
}

impl std::fmt::Debug for Outgoing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outgoing").field("frame", &self.frame).field("len", &self.len).finish_non_exhaustive()
    }
}

impl Outgoing {
    /// Appends `bytes` to the payload at the next [`ALIGN`]-aligned offset (no copy).
    pub fn push_payload(&mut self, bytes: Bytes) -> InlineRef {
        static PAD: [u8; ALIGN] = [0; ALIGN];
        let pad = (ALIGN as u64 - self.len % ALIGN as u64) % ALIGN as u64;
        if pad != 0 {
            self.frame.payload.push(Bytes::from_static(&PAD[..pad as usize]));
            self.len += pad;
        }
        let r = InlineRef { offset: self.len, len: bytes.len() as u64 };
        self.len += r.len;
        if !bytes.is_empty() {
            self.frame.payload.push(bytes);
        }
        r
    }

    /// Attaches a file descriptor to the frame; returns its index in the frame.
    #[cfg(unix)]
    pub fn attach_fd(&mut self, fd: std::os::fd::OwnedFd) -> usize {
        self.frame.fds.push(fd);
        self.frame.fds.len() - 1
    }

    /// Payload bytes so far.
    pub fn payload_len(&self) -> u64 {
        self.len
    }

    /// Descriptors attached so far.
    pub fn fd_count(&self) -> usize {
        #[cfg(unix)]
        return self.frame.fds.len();
        #[cfg(not(unix))]
        0
    }

    /// Registers an undo action, run if the message is not sent after all (a later tensor
    /// or a limit check failed): e.g. forget a lease granted or a segment announced.
    pub fn on_abort(&mut self, f: impl FnOnce() + Send + 'static) {
        self.on_abort.push(Box::new(f));
    }

    /// Registers an action to run once the message frame has been written (e.g. start
    /// sending bytes that travel apart from the frame).
    pub fn on_commit(&mut self, f: impl FnOnce() + Send + 'static) {
        self.on_commit.push(Box::new(f));
    }

    /// Registers an action to run once nothing can reach the wire before this message any
    /// more (the pipe holds the write side for it), or once it will not be sent at all.
    /// E.g. let a lease that the message names go: its release may now be written, since it
    /// can only follow the message.
    pub fn on_ordered(&mut self, f: impl FnOnce() + Send + 'static) {
        self.on_ordered.push(Box::new(f));
    }

    /// The message will not be sent: runs the undo actions, newest first, then the
    /// [`Outgoing::on_ordered`] ones.
    pub fn abort(mut self) {
        while let Some(f) = self.on_abort.pop() {
            f();
        }
        for f in std::mem::take(&mut self.on_ordered) {
            f();
        }
    }

    /// Finishes with the JSON header.
    pub fn finish(mut self, header: Vec<u8>) -> (OutFrame, Committed) {
        self.frame.header = header;
        let committed =
            Committed { after: std::mem::take(&mut self.on_commit), ordered: std::mem::take(&mut self.on_ordered) };
        (self.frame, committed)
    }
}

/// The actions to run once a message frame is written (see [`Outgoing::on_commit`]), and
/// those to run once its place on the wire is fixed ([`Outgoing::on_ordered`]; run when
/// this is dropped if they have not been).
#[must_use = "run() it once the frame is written"]
pub struct Committed {
    after: Vec<Box<dyn FnOnce() + Send>>,
    ordered: Vec<Box<dyn FnOnce() + Send>>,
}

impl Committed {
    /// Runs the [`Outgoing::on_ordered`] actions (the pipe holds the write side).
    pub fn run_ordered(&mut self) {
        for f in std::mem::take(&mut self.ordered) {
            f();
        }
    }

    /// Runs the actions, oldest first (the ordered ones first, if they have not run).
    pub fn run(mut self) {
        self.run_ordered();
        for f in std::mem::take(&mut self.after) {
            f();
        }
    }
}

impl Drop for Committed {
    fn drop(&mut self) {
        // Not written after all: the ordered actions still run (they let go of what the
        // message held); the after-write ones do not.
        self.run_ordered();
    }
}

/// A received message frame's payload and descriptors, for [`ChannelSession::decode`].
#[derive(Debug)]
pub struct Incoming {
    payload: Bytes,
    #[cfg(unix)]
    fds: Vec<Option<std::os::fd::OwnedFd>>,
}

impl Incoming {
    /// Wraps a received frame's parts.
    pub fn new(payload: Bytes, #[cfg(unix)] fds: Vec<std::os::fd::OwnedFd>) -> Self {
        Incoming {
            payload,
            #[cfg(unix)]
            fds: fds.into_iter().map(Some).collect(),
        }
    }

    /// The payload.
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// Takes descriptor `index` (each can be taken once).
    #[cfg(unix)]
    pub fn take_fd(&mut self, index: usize) -> Option<std::os::fd::OwnedFd> {
        self.fds.get_mut(index).and_then(Option::take)
    }

    /// The payload range `r`, checked against the payload length.
    pub fn slice(&self, r: InlineRef) -> Option<Bytes> {
        let end = r.offset.checked_add(r.len)?;
        if end > self.payload.len() as u64 {
            return None;
        }
        Some(self.payload.slice(r.offset as usize..end as usize))
    }
}
