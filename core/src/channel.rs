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
use crate::ticket::{SendTicket, Tickets};
use crate::transport::ConnInfo;
use crate::wire::{ChannelOffer, InlineRef, Location};

/// A CONTROL frame a session has for its peer session, pulled by the pipe's writer
/// ([`ChannelSession::poll_control`]). CONTROL frames carry no descriptors.
///
/// The body is JSON text already (a session serializes its typed body once, with no
/// `serde_json::Value` between: a shm release goes out on every large round trip).
#[derive(Debug, Clone)]
pub struct ControlOut {
    /// The sending channel's name.
    pub channel: &'static str,
    /// Channel-specific body, as JSON text.
    pub body: Box<serde_json::value::RawValue>,
}

impl ControlOut {
    /// A CONTROL body of channel `channel`: `body` turned into JSON text (`null` for a
    /// value JSON cannot hold, such as a map with keys that are not strings).
    pub fn new(channel: &'static str, body: &impl serde::Serialize) -> Self {
        let body =
            serde_json::value::to_raw_value(body).unwrap_or_else(|_| serde_json::value::RawValue::NULL.to_owned());
        ControlOut { channel, body }
    }
}

impl PartialEq for ControlOut {
    fn eq(&self, other: &Self) -> bool {
        self.channel == other.channel && self.body.get() == other.body.get()
    }
}

/// [`crate::wire::ControlHeader`] as the pipe writes and reads it: the body kept as JSON text, parsed
/// only by its channel's session into that channel's own type (no `serde_json::Value`
/// between, on a frame that goes out on every large round trip). The same bytes on the wire.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct ControlFrame<'a> {
    #[serde(borrow)]
    pub channel: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    pub body: &'a serde_json::value::RawValue,
}

/// Tells the pipe's writer that a session has CONTROL frames due (or a new time to be asked
/// again): the writer then pulls them ([`ChannelSession::poll_control`]) as soon as it
/// holds the write side. Waking is cheap and idempotent. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct ControlWaker {
    notify: Arc<tokio::sync::Notify>,
    /// [`HELD`] while a writer is about to pull anyway ([`ControlWaker::hold`]), [`MISSED`]
    /// when a wake came meanwhile, else 0.
    state: Arc<std::sync::atomic::AtomicU8>,
    /// The control task looks again within [`CONTROL_TICK`] whether or not it is woken
    /// ([`ControlWaker::wake_soon`]).
    ticking: Arc<std::sync::atomic::AtomicBool>,
    /// A [`ControlWaker::wake_soon`] left its frames for the next writer or tick.
    soon: Arc<std::sync::atomic::AtomicBool>,
}

/// How often the pipe's control task looks for due CONTROL frames while
/// [`ControlWaker::wake_soon`] leaves them to it (it stops at a tick, or any other wake-up,
/// that finds none came since the last).
pub const CONTROL_TICK: std::time::Duration = std::time::Duration::from_millis(1);

/// A writer holds the waker: it pulls before it lets go.
const HELD: u8 = 1;
/// A wake came while held.
const MISSED: u8 = 2;

impl ControlWaker {
    /// A new waker (the pipe holds its own clone and waits on it).
    pub fn new() -> Self {
        ControlWaker::default()
    }

    /// Asks the writer to pull. While a writer holds the waker (the pipe does while it sends) the
    /// wake is only noted: that writer pulls before it lets go, and wakes the control task
    /// then if the wake came after its last pull.
    pub fn wake(&self) {
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        let mut s = self.state.load(Acquire);
        loop {
            match s {
                HELD => match self.state.compare_exchange(HELD, MISSED, AcqRel, Acquire) {
                    Ok(_) => return,
                    Err(now) => s = now,
                },
                MISSED => return,
                _ => {
                    self.notify.notify_one();
                    return;
                }
            }
        }
    }

    /// [`ControlWaker::wake`] for frames that may wait up to a [`CONTROL_TICK`] (a lease's
    /// release: the peer's memory comes back a little later at worst): while the control
    /// task is ticking anyway it wakes nobody, and the next write takes them along (step g
    /// of the send sequence) or the next tick writes them. Otherwise it is a
    /// [`ControlWaker::wake`] (which starts the tick).
    ///
    /// Why: a request-response pair that drops each received tensor before its next send
    /// made every round trip wake the runtime for a release that the send would have taken
    /// anyway; on two CPUs that thread took a spinning side's CPU (measured in Python, a
    /// 24.9 MB echo: 21 µs a round trip where 5 µs is possible).
    pub fn wake_soon(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        // The caller queued its frames before this load; a task that stops ticking stores
        // `false` and then pulls: one of the two sees the other.
        self.soon.store(true, SeqCst);
        if !self.ticking.load(SeqCst) {
            self.wake();
        }
    }

    /// Whether a [`ControlWaker::wake_soon`] came since the control task's last tick (a
    /// writer then pulls after its write; the flag stays for the tick).
    pub(crate) fn soon_pending(&self) -> bool {
        self.soon.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// [`ControlWaker::soon_pending`], cleared (the control task's tick: it ticks on while
    /// such wakes keep coming).
    pub(crate) fn take_soon(&self) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        self.soon.load(SeqCst) && self.soon.swap(false, SeqCst)
    }

    /// The control task starts or stops its [`CONTROL_TICK`] (see [`ControlWaker::wake_soon`]).
    pub(crate) fn set_ticking(&self, yes: bool) {
        self.ticking.store(yes, std::sync::atomic::Ordering::SeqCst);
    }

    /// Wakes the control task whether or not a writer holds the waker (the writer's own
    /// wake: a session asked for a sooner time, which only the control task keeps).
    pub(crate) fn wake_task(&self) {
        self.notify.notify_one();
    }

    /// The pipe's writer, holding the write side, is about to pull: wakes until it lets go
    /// of the guard are noted instead of waking the control task (a wake costs the waker a
    /// system call and the runtime a thread). The writer pulls when
    /// [`HeldWaker::take_missed`] says a wake came; the guard's drop wakes the control task
    /// if one came after the last look.
    pub(crate) fn hold(&self) -> HeldWaker<'_> {
        self.state.store(HELD, std::sync::atomic::Ordering::Release);
        HeldWaker(self)
    }

    /// Waits for a [`ControlWaker::wake`] (one given while nobody waited counts too).
    pub async fn woken(&self) {
        self.notify.notified().await;
    }
}

/// A writer's hold on the [`ControlWaker`] (see [`ControlWaker::hold`]).
pub(crate) struct HeldWaker<'a>(&'a ControlWaker);

impl HeldWaker<'_> {
    /// Whether a wake came since the hold began or since the last call: the writer then
    /// pulls, which answers it.
    pub(crate) fn take_missed(&self) -> bool {
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        // A load first: the common answer (no wake came) costs no atomic write.
        self.0.state.load(Acquire) == MISSED && self.0.state.compare_exchange(MISSED, HELD, AcqRel, Acquire).is_ok()
    }
}

impl Drop for HeldWaker<'_> {
    fn drop(&mut self) {
        if self.0.state.swap(0, std::sync::atomic::Ordering::AcqRel) == MISSED {
            self.0.notify.notify_one();
        }
    }
}

/// What a session gets from the pipe it serves.
#[derive(Debug, Clone)]
pub struct SessionCtx {
    /// The connection.
    pub conn: ConnInfo,
    /// Asks the pipe's writer to pull this session's due CONTROL frames.
    pub control: ControlWaker,
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
    /// [`ChannelSession::encode`] without waiting, for a caller that must not (a blocking
    /// send on a same-host ring, PROTOCOL.md §22.5): `Some` with what `encode` would give
    /// when it can decide and finish now, `None` when it would have to wait (the caller then
    /// calls `encode`; anything this call recorded in `out` must be nothing). The default
    /// is `None`.
    fn encode_now(&self, tensor: &Tensor, out: &mut Outgoing) -> Option<Result<Location, ChannelError>> {
        let _ = (tensor, out);
        None
    }
    /// Rebuilds tensor `index` of a received message. Validates everything.
    /// May wait for bytes that travel apart from the frame (e.g. QUIC streams).
    async fn decode(&self, meta: TensorMeta, loc: &Location, incoming: &mut Incoming) -> Result<Tensor, ChannelError>;
    /// [`ChannelSession::decode`] without waiting, for a location that travels in a packed
    /// ring message (inline, and the shm channel's own): `None` when this session cannot
    /// decode it without waiting (the packed message is then refused). The default is
    /// `None`.
    fn decode_now(
        &self,
        meta: TensorMeta,
        loc: &Location,
        incoming: &mut Incoming,
    ) -> Option<Result<Tensor, ChannelError>> {
        let _ = (meta, loc, incoming);
        None
    }
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
    /// Handles a CONTROL frame (its body as JSON text, checked to be JSON, and attached
    /// descriptors) from the peer's session.
    fn control(&self, body: &serde_json::value::RawValue, incoming: &mut Incoming) -> Result<(), ChannelError> {
        let _ = (body, incoming);
        Err(ChannelError::BadDescriptor {
            channel: self.name(),
            reason: "this channel takes no control messages".into(),
        })
    }
    /// The CONTROL frames due now, appended to `out` (e.g. releases of the peer's leases
    /// this side dropped), and when to be asked again though no [`ControlWaker::wake`]
    /// comes (e.g. a release batch's delay ends); `None`: only a wake makes more due.
    ///
    /// The pipe calls it only while it holds the write side (as quinn's `poll_transmit`):
    /// before writing each MESSAGE frame, after that message's [`crate::SendTicket::placed`]
    /// and after its tensors are dropped, so what is due rides behind the frame in the same
    /// write; and whenever a wake comes or the time returned passes with no message going
    /// out. A frame pulled here is written, never lost (unless the pipe closes).
    fn poll_control(&self, now: std::time::Instant, out: &mut Vec<ControlOut>) -> Option<std::time::Instant> {
        let _ = (now, out);
        None
    }
    /// The pipe has closed (called once, by whichever side noticed first): end every lease
    /// both ways, so that memory lent to the peer comes back and the peer's is unmapped
    /// once no tensor of this side uses it.
    fn close(&self) {}
}

/// The message frame being built: payload parts and descriptors to send.
#[derive(Default)]
pub struct Outgoing {
    frame: OutFrame,
    len: u64,
    tickets: Tickets,
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

    /// The session's ticket of type `T` for this message, made with `make` on first use: a
    /// session keeps one ticket per message and records in it what it must do as the
    /// message goes out or does not (see [`crate::ticket`]).
    pub fn ticket<T: SendTicket>(&mut self, make: impl FnOnce() -> T) -> &mut T {
        self.tickets.get_or_insert(make)
    }

    /// The message will not be sent: every ticket is placed, then aborted.
    pub fn abort(self) {
        self.tickets.aborted();
    }

    /// Finishes with the JSON header: the frame to write and the tickets to settle.
    pub fn finish(self, header: Vec<u8>) -> (OutFrame, Tickets) {
        let Outgoing { mut frame, tickets, .. } = self;
        frame.header = header;
        (frame, tickets)
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

#[cfg(test)]
mod tests {
    use super::ControlWaker;

    /// Whether the control task would wake now (a stored permit), taking the permit.
    fn woken(w: &ControlWaker) -> bool {
        let mut f = std::pin::pin!(w.woken());
        let cx = &mut std::task::Context::from_waker(std::task::Waker::noop());
        f.as_mut().poll(cx).is_ready()
    }

    /// `wake_soon` wakes the task only while it is not ticking; the flag it leaves stays for
    /// writers to see until the task's tick takes it.
    #[test]
    fn a_soon_wake_wakes_nobody_while_the_task_ticks() {
        let w = ControlWaker::new();
        w.wake_soon();
        assert!(woken(&w), "not ticking: the task is woken");
        assert!(w.soon_pending(), "and learns it was a soon wake");
        assert!(w.take_soon());
        assert!(!w.take_soon(), "taken once");
        w.set_ticking(true);
        w.wake_soon();
        assert!(!woken(&w), "ticking: nobody is woken");
        assert!(w.soon_pending() && w.soon_pending(), "a writer sees it, and leaves it for the tick");
        assert!(w.take_soon(), "the tick takes it and ticks on");
        w.set_ticking(false);
        w.wake_soon();
        assert!(woken(&w), "stopped: woken again");
    }

    #[test]
    fn a_held_waker_notes_wakes_and_the_guard_sends_only_those_after_the_last_pull() {
        let w = ControlWaker::new();
        w.wake();
        assert!(woken(&w), "not held: a wake wakes the task");
        assert!(!woken(&w));

        let held = w.hold();
        w.wake();
        w.wake();
        assert!(!woken(&w), "held: the wakes are only noted");
        assert!(held.take_missed(), "the writer learns it must pull");
        assert!(!held.take_missed(), "and only once");
        drop(held);
        assert!(!woken(&w), "answered by the pull: the guard wakes nobody");

        let held = w.hold();
        assert!(!held.take_missed());
        w.wake();
        drop(held);
        assert!(woken(&w), "a wake after the last look wakes the task when the guard drops");

        let held = w.hold();
        w.wake_task();
        assert!(woken(&w), "the writer's own wake for a sooner time is never held");
        drop(held);
        assert!(!woken(&w));
    }
}
