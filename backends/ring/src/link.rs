//! The same-host fast path as a link of ferry's frame layer (Linux): once both sides
//! agreed in the handshake (PROTOCOL.md §22), frames travel through a pair of
//! single-producer single-consumer rings in a sealed memfd (this crate), and the unix
//! socket beside them carries only what the rings cannot. Core asks for it through
//! `ferry_core::frame::{LinkRead, LinkWrite, LinkProvider}` and names no ring:
//! [`RingLink`] is the provider, [`RingExt::ring`] sets it on an `EndpointBuilder`.
//!
//! - **One ordered path.** A writer puts each write (a frame and the CONTROL frames that
//!   trail it) into one ring record ([`TAG_FRAMES`]). A frame the ring cannot carry (it
//!   has descriptors, or it is larger than the ring's largest record) is written to the
//!   socket, and a [`TAG_DIVERT`] record per frame takes its place in the ring as soon as
//!   the frame's first byte is on the socket (behind the frame when the ring is full then).
//!   The reader reads the ring in order and, at a divert record, takes the next frame from
//!   the socket, while it is still being written. No sequence numbers, nothing to merge.
//! - **The doorbell.** A reader with nothing to read arms its doorbell (the ring's sleeping
//!   word, `ferry_ring::Receiver::arm_doorbell`) and waits on the socket as it would without
//!   a ring, so an idle connection costs no CPU and no thread. A writer that finds the
//!   doorbell armed after publishing writes a RING frame (a 16-byte prefix, nothing else)
//!   to the socket, which wakes the reader's task through the runtime. While the pipe's
//!   busy polling is armed (`FrameReader::arm_busy_poll`), the reader first polls
//!   the ring for the busy-poll window, as it would poll the socket.
//! - **Blocking callers** (`Pipe::recv_blocking`, on their own thread) wait on the ring
//!   itself: the wait policy's spin, then its futex, which the writer wakes directly (no
//!   doorbell, one wake-up), in slices of [`DEATH_CHECK`] between which they look at the
//!   socket for its end. A divert record wakes them like any record; a writer whose
//!   diverted frame does not fit the socket at once, and whose ring had no room for its
//!   divert, nudges them (`ferry_ring::Nudge`): they then wait on the socket behind the doorbell,
//!   on their own thread where the transport offers a direct wait
//!   (`SocketReader::wait_readable_here`), else through the runtime.
//! - **Death and close.** The socket is the death notice: its end of stream, once the
//!   ring is empty, ends the pipe ([`PipeError::Closed`]). A peer's orderly close of its
//!   ring is the same.
//! - **A full ring** (the reader is behind) makes the writer wait: it yields, then sleeps a
//!   little between tries, as a writer whose socket buffer is full waits for room.
//! - **Hostile peers.** Everything read from a ring record is checked as a socket frame is
//!   (the same [`FramePrefix::check`] against the same limits); a frame in a record must lie
//!   within it and announce no descriptors; indices and lengths are checked by `ferry-ring`,
//!   whose findings are [`ProtocolError::Ring`]. A peer that puts frames on the socket with
//!   no divert record for them may run at most [`MAX_EARLY`] ahead.

mod provider;
mod write;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::{Receiver, RingError, WaitEnd};

use ferry_core::frame::{
    Frame, FrameKind, FramePrefix, LinkRead, PREFIX_LEN, Received, SocketReader, WaitSpin, aligned_copy,
};
use ferry_core::spin::{self, Spin, SpinHistory, SpinInputs, Waited};
use ferry_core::wire::Limits;
use ferry_core::{PipeError, ProtocolError, Readiness};
pub use provider::{RingExt, RingLink};
pub(crate) use write::RingWrite;

/// A ring record holding whole frames.
pub(crate) const TAG_FRAMES: u32 = 0;
/// A ring record saying "the next frame is on the socket".
pub(crate) const TAG_DIVERT: u32 = 1;
/// A ring record holding one packed message (PROTOCOL.md §22.5; `crate::pipe::packed`).
pub(crate) const TAG_MESSAGE: u32 = 2;

/// Frames a peer may put on the socket ahead of their divert records (a writer publishes
/// the divert once the frame starts, or right after it when its ring is full, so one is the
/// most an honest peer gets ahead).
pub(crate) const MAX_EARLY: usize = 4;

/// How long a blocking caller sleeps on the ring before it looks at the socket for the
/// peer's end (a dead peer is noticed within this).
const DEATH_CHECK: Duration = Duration::from_millis(50);

/// The reading half of a pipe's ring.
pub(crate) struct RingRead {
    rx: Receiver,
    /// The record being read, and how far.
    record: Vec<u8>,
    at: usize,
    /// Frames read from the socket before their divert record.
    early: VecDeque<Frame>,
    /// The socket ended: the ring is read to its end, then the pipe is closed.
    socket_ended: bool,
    /// A divert record was taken by [`FrameReader::packed_now`]: the next frame is on the
    /// socket (cleared once it is read).
    divert_taken: bool,
    /// [`FrameReader::packed_now`]'s wait was nudged: the next blocking wait looks at the
    /// socket first.
    nudged: bool,
    /// Packed message records are allowed (the feature was agreed).
    packed: bool,
    /// The wait policy's state (boxed: the reader is moved between its task and blocking
    /// callers, and stays small).
    wait: Box<RingWait>,
}

/// A ring reader's state for the wait policy ([`spin::decide`]).
struct RingWait {
    /// What its waits taught the policy.
    history: SpinHistory,
    /// When the reader task's last spin began, having missed (its wait goes on behind the
    /// doorbell, and is recorded when that ends).
    missed_at: Option<Instant>,
}

impl RingRead {
    pub(crate) fn new(rx: Receiver, packed: bool) -> RingRead {
        RingRead {
            packed,
            wait: Box::new(RingWait { history: SpinHistory::new(rx.spin_max()), missed_at: None }),
            rx,
            record: Vec::new(),
            at: 0,
            early: VecDeque::new(),
            socket_ended: false,
            divert_taken: false,
            nudged: false,
        }
    }

    /// Polls the ring for a record for up to `d` from `start` (and not past `until`); true
    /// when one came (the history learns it).
    fn spin_for(&mut self, d: Duration, start: Instant, until: Option<Instant>) -> bool {
        let end = until.map_or(start + d, |u| u.min(start + d));
        if !self.rx.spin_for_data(end) {
            return false;
        }
        // (A warm history learns nothing from a caught spin: no clock read on the way to
        // the record.)
        if self.wait.history.learns_from_spins() {
            self.wait.history.record(Waited::Spun(start.elapsed()));
        }
        true
    }

    /// A blocking caller's wait for a record until `until`, from `start` (the clock as just
    /// read): the wait policy's spin (when [`spin::decide_alone`] allows one), then the
    /// ring's futex at once; a nudge ends it,
    /// and so do bytes on the socket (`s`) that are there when it would sleep: a nudge the
    /// writer sent while this side was still spinning (or not yet waiting) woke nobody.
    fn wait(&mut self, s: &SocketReader, start: Instant, until: Instant) -> Result<WaitEnd, RingError> {
        if self.rx.has_data() {
            return Ok(WaitEnd::Data);
        }
        if let Spin::Poll(d) = spin::decide_alone(self.wait.history.window(), &self.wait.history, start)
            && self.spin_for(d, start, Some(until))
        {
            return Ok(WaitEnd::Data);
        }
        let end = self.rx.sleep_for_data_unless(until, || s.readable_now() == Some(true));
        self.wait.history.record(Waited::Slept(start.elapsed()));
        end
    }

    /// The reader task's wait behind the doorbell ended: its history learns how long the
    /// whole wait took, from its missed spin on.
    fn woke(&mut self) {
        if let Some(t) = self.wait.missed_at.take() {
            self.wait.history.record(Waited::Slept(t.elapsed()));
        }
    }

    /// The next frame of the record being read, if it has one left.
    fn next_in_record(&mut self, limits: &Limits) -> Result<Option<Frame>, PipeError> {
        let rest = &self.record[self.at..];
        if rest.is_empty() {
            return Ok(None);
        }
        let bad = |what: String| PipeError::from(ProtocolError::Ring(what));
        let Some(p) = rest.first_chunk::<PREFIX_LEN>() else {
            return Err(bad(format!("a ring record ends {} bytes into a frame's prefix", rest.len())));
        };
        let prefix = FramePrefix::decode(p);
        let kind = prefix.check(limits)?;
        if prefix.fds != 0 {
            return Err(bad(format!(
                "a frame in the ring announces {} descriptors (they travel on the socket)",
                prefix.fds
            )));
        }
        let (header_len, payload_len) = (prefix.header_len as usize, prefix.payload_len);
        let body = &rest[PREFIX_LEN..];
        let fits = u64::try_from(body.len()).is_ok_and(|n| header_len as u64 + payload_len <= n);
        if !fits {
            return Err(bad(format!(
                "a frame in the ring claims a {header_len}-byte header and a {payload_len}-byte payload, \
                 but its record has {} bytes left",
                body.len()
            )));
        }
        let header = body[..header_len].to_vec();
        let payload = aligned_copy(&body[header_len..header_len + payload_len as usize]);
        self.at += PREFIX_LEN + header_len + payload_len as usize;
        Ok(Some(Frame { kind, header, payload, fds: Vec::new() }))
    }
}

/// The end of a blocking caller's next wait on the ring: a [`DEATH_CHECK`] slice, cut short
/// by the caller's `deadline`; `None` when the deadline has passed.
/// The most frames records one [`RingRead::ring_controls_now`] takes.
const CONTROLS_NOW_RECORDS: usize = 16;

/// Also the clock as read for it, which the wait then starts from (one clock read less per
/// wait on the round trip's path).
/// Takes what the socket has into its buffer without waiting: `Some` when that ends a
/// blocking wait (the socket's end: the read says so; or its error), `None` to look again.
fn socket_now(s: &mut SocketReader) -> Option<Result<bool, PipeError>> {
    let mut fill = std::pin::pin!(tokio::io::AsyncBufReadExt::fill_buf(s.stream()));
    let cx = &mut std::task::Context::from_waker(std::task::Waker::noop());
    match fill.as_mut().poll(cx) {
        std::task::Poll::Ready(Ok([])) => Some(Ok(true)),
        std::task::Poll::Ready(Err(e)) => Some(Err(e.into())),
        std::task::Poll::Ready(Ok(_)) | std::task::Poll::Pending => None,
    }
}

fn slice_end(deadline: Option<Instant>) -> Option<(Instant, Instant)> {
    let now = Instant::now();
    if deadline.is_some_and(|d| d <= now) {
        return None;
    }
    let slice = now + DEATH_CHECK;
    Some((now, deadline.map_or(slice, |d| d.min(slice))))
}

/// A ring's finding as a pipe error: an orderly close or a death is the end of the pipe,
/// anything else is the peer's fault.
pub(crate) fn ring_error(e: RingError) -> PipeError {
    match e {
        RingError::Closed => PipeError::Closed,
        RingError::PeerGone => PipeError::PeerGone,
        other => ProtocolError::Ring(other.to_string()).into(),
    }
}

#[async_trait::async_trait]
impl LinkRead for RingRead {
    fn carries_packed(&self) -> bool {
        self.packed
    }

    fn wakes_blocking_reader(&self) -> bool {
        true
    }

    async fn read(&mut self, s: &mut SocketReader) -> Result<Received, PipeError> {
        self.read_ring_frame(s).await
    }

    async fn wait_readable(&mut self, s: &mut SocketReader, spin: WaitSpin) -> Result<bool, PipeError> {
        self.wait_ring_readable(s, spin).await
    }

    fn packed_now(
        &mut self,
        s: &mut SocketReader,
        deadline: Option<Instant>,
        control: &mut dyn FnMut(Frame) -> Result<(), PipeError>,
        unpack: &mut dyn FnMut(&[u8]) -> Result<(), PipeError>,
    ) -> Option<Result<(), PipeError>> {
        self.ring_packed_now(s, deadline, control, unpack)
    }

    fn controls_now(
        &mut self,
        s: &mut SocketReader,
        control: &mut dyn FnMut(Frame) -> Result<(), PipeError>,
    ) -> Result<(), PipeError> {
        self.ring_controls_now(s, control)
    }
}

impl RingRead {
    /// `FrameReader::read_frame` with a ring: the next frame of the ring's order.
    /// A packed record is allowed when the peer may send packed messages (both sides
    /// agreed to `FEATURE_RING_MESSAGES`); without it, it is a protocol error, as any
    /// unknown tag is.
    async fn read_ring_frame(&mut self, s: &mut SocketReader) -> Result<Received, PipeError> {
        loop {
            let limits = s.limits();
            let ring = &mut *self;
            if let Some(f) = ring.next_in_record(&limits)? {
                return Ok(Received::Frame(f));
            }
            if ring.divert_taken {
                let f = match ring.early.pop_front() {
                    Some(f) => f,
                    None => read_diverted(s).await?,
                };
                {
                    let ring = &mut *self;
                    ring.divert_taken = false;
                }
                return Ok(Received::Frame(f));
            }
            match ring.rx.try_recv(&mut ring.record) {
                Ok(Some(TAG_FRAMES)) => {
                    ring.at = 0;
                    if ring.record.is_empty() {
                        return Err(ProtocolError::Ring("an empty frames record".into()).into());
                    }
                    continue;
                }
                Ok(Some(TAG_MESSAGE)) if ring.packed => {
                    // The record is the frame's (no copy); the next read starts a new one.
                    let record = std::mem::take(&mut ring.record);
                    ring.at = 0;
                    return Ok(Received::Packed(record));
                }
                Ok(Some(TAG_DIVERT)) => {
                    ring.record.clear();
                    ring.at = 0;
                    if let Some(f) = ring.early.pop_front() {
                        return Ok(Received::Frame(f));
                    }
                    return read_diverted(s).await.map(Received::Frame);
                }
                Ok(Some(tag)) => {
                    return Err(ProtocolError::Ring(format!("a ring record with unknown tag {tag}")).into());
                }
                Ok(None) => {}
                Err(e) => return Err(ring_error(e)),
            }
            if ring.socket_ended {
                return Err(PipeError::Closed);
            }
            if self.spin_on_ring(s) {
                continue;
            }
            let ring = &mut *self;
            if !ring.rx.arm_doorbell().map_err(ring_error)? {
                continue;
            }
            let got = s.read_frame().await.and_then(doorbell_or_frame);
            let ring = &mut *self;
            ring.rx.disarm();
            ring.woke();
            match got {
                Ok(f) if f.kind == FrameKind::Ring => {}
                Ok(f) => {
                    if ring.early.len() >= MAX_EARLY {
                        return Err(ProtocolError::Ring(format!(
                            "the peer wrote more than {MAX_EARLY} frames to the socket that no ring record points to"
                        ))
                        .into());
                    }
                    ring.early.push_back(f);
                }
                // The ring may still hold what was published before the end.
                Err(PipeError::Closed) => ring.socket_ended = true,
                Err(e) => return Err(e),
            }
        }
    }

    /// `FrameReader::wait_readable` with a ring: until the ring has a record (or a
    /// close), or the socket has bytes other than doorbells, or it ended or failed.
    /// Doorbells on the socket are consumed (a wait abandoned after the writer rang leaves
    /// one there).
    ///
    /// - The reader task polls the ring while busy polling is armed, then arms the doorbell
    ///   and waits on the socket in the runtime; the doorbell is taken down however the
    ///   wait ends.
    /// - A blocking caller waits on the ring itself ([`Receiver::wait_for_data`]: its
    ///   wait policy's spin, then its futex, which the writer wakes directly) in slices of
    ///   [`DEATH_CHECK`], looking at the socket between them without waiting: the socket's
    ///   end is the only thing the ring cannot say (frames on the socket have divert
    ///   records in the ring).
    async fn wait_ring_readable(&mut self, s: &mut SocketReader, spin: WaitSpin) -> Result<bool, PipeError> {
        loop {
            if self.ring_readable(s) {
                return Ok(true);
            }
            let ring = &mut *self;
            if let WaitSpin::Blocking(deadline) = spin {
                let Some((now, until)) = slice_end(deadline) else { return Ok(false) };
                let end = if std::mem::take(&mut ring.nudged) {
                    WaitEnd::Nudged
                } else {
                    ring.wait(s, now, until).map_err(ring_error)?
                };
                match end {
                    WaitEnd::Data => return Ok(true),
                    // The socket, without waiting: its end ends the wait, bytes are looked
                    // at above (doorbells skipped).
                    WaitEnd::Deadline => match socket_now(s) {
                        Some(r) => return r,
                        None => continue,
                    },
                    // A frame is coming on the socket, ahead of its divert record: wait for
                    // its bytes there, behind the doorbell (a publish wakes it too); on
                    // this thread where the transport lets it. What woke it is looked at
                    // above too: a doorbell left in the socket (a writer that rang while
                    // this side spun, or a wake-up that was no nudge) is no frame, and a
                    // wait that took it for one would read on past its deadline.
                    WaitEnd::Nudged => match self.wait_behind_doorbell(s, Some(until), true).await? {
                        Woke::Read => match socket_now(s) {
                            Some(r) => return r,
                            None => continue,
                        },
                        Woke::LookAgain => continue,
                    },
                }
            }
            if self.spin_on_ring(s) {
                return Ok(true);
            }
            if let Woke::Read = self.wait_behind_doorbell(s, None, false).await? {
                return Ok(true);
            }
        }
    }

    /// `FrameReader::packed_now` with a ring. When nothing is
    /// pending but the ring, it waits on the ring itself for one slice (as
    /// [`FrameReader::wait_ring_readable`] does) and, when the next record is a packed
    /// message, hands it to `unpack` on this thread, with no future and no copy out of the
    /// record buffer. `None`: anything else (another record, taken and kept for
    /// [`FrameReader::read_frame`]; a nudge, kept for the next wait; the slice's end):
    /// the caller takes the ordinary way.
    fn ring_packed_now(
        &mut self,
        s: &mut SocketReader,
        deadline: Option<Instant>,
        control: &mut dyn FnMut(Frame) -> Result<(), PipeError>,
        unpack: &mut dyn FnMut(&[u8]) -> Result<(), PipeError>,
    ) -> Option<Result<(), PipeError>> {
        skip_doorbells(s);
        if !s.stream().buffer().is_empty() {
            return None;
        }
        let limits = s.limits();
        loop {
            let ring = &mut *self;
            // Frames left in a frames record: CONTROL frames (a release that followed the
            // last message) are handled here; anything else is the ordinary path's.
            if let Some(&kind) = ring.record.get(ring.at) {
                if kind != FrameKind::Control as u8 {
                    return None;
                }
                match ring.next_in_record(&limits) {
                    Ok(Some(f)) => match control(f) {
                        Ok(()) => continue,
                        Err(e) => return Some(Err(e)),
                    },
                    Ok(None) => return None,
                    Err(e) => return Some(Err(e)),
                }
            }
            if !ring.early.is_empty() || ring.socket_ended || ring.divert_taken || ring.nudged {
                return None;
            }
            if ring.rx.has_data() {
                // Found without a wait: say where this side runs all the same.
                ring.rx.note_cpu();
            } else {
                let (now, until) = slice_end(deadline)?;
                match ring.wait(s, now, until) {
                    Ok(WaitEnd::Data) => {}
                    Ok(WaitEnd::Nudged) => {
                        ring.nudged = true;
                        return None;
                    }
                    Ok(WaitEnd::Deadline) => return None,
                    Err(e) => return Some(Err(ring_error(e))),
                }
            }
            ring.at = 0;
            match ring.rx.try_recv(&mut ring.record) {
                Ok(Some(TAG_MESSAGE)) if ring.packed => {
                    let r = unpack(&ring.record);
                    ring.record.clear();
                    return Some(r);
                }
                Ok(Some(TAG_FRAMES)) if ring.record.is_empty() => {
                    return Some(Err(ProtocolError::Ring("an empty frames record".into()).into()));
                }
                Ok(Some(TAG_FRAMES)) => {}
                Ok(Some(TAG_DIVERT)) => {
                    ring.record.clear();
                    ring.divert_taken = true;
                    return None;
                }
                Ok(Some(tag)) => {
                    return Some(Err(ProtocolError::Ring(format!("a ring record with unknown tag {tag}")).into()));
                }
                Ok(None) => return None,
                Err(e) => return Some(Err(ring_error(e))),
            }
        }
    }

    /// [`LinkRead::controls_now`]: the CONTROL frames at the head of the ring's order, now,
    /// with no wait; stops at anything else (left for the ordinary path: a frames record
    /// whose next frame is not CONTROL stays loaded, a packed message stays in the ring).
    fn ring_controls_now(
        &mut self,
        s: &mut SocketReader,
        control: &mut dyn FnMut(Frame) -> Result<(), PipeError>,
    ) -> Result<(), PipeError> {
        skip_doorbells(s);
        if !s.stream().buffer().is_empty() {
            return Ok(());
        }
        let limits = s.limits();
        // A peer that keeps writing CONTROL frames cannot hold a send here: at most this
        // many records are taken per call (the rest wait for the reads).
        let mut records = 0;
        loop {
            let ring = &mut *self;
            if let Some(&kind) = ring.record.get(ring.at) {
                if kind != FrameKind::Control as u8 {
                    return Ok(());
                }
                match ring.next_in_record(&limits)? {
                    Some(f) => {
                        control(f)?;
                        continue;
                    }
                    None => return Ok(()),
                }
            }
            if records == CONTROLS_NOW_RECORDS
                || !ring.early.is_empty()
                || ring.socket_ended
                || ring.divert_taken
                || ring.nudged
            {
                return Ok(());
            }
            records += 1;
            if ring.rx.next_tag() != Some(TAG_FRAMES) {
                return Ok(());
            }
            ring.at = 0;
            match ring.rx.try_recv(&mut ring.record) {
                Ok(Some(TAG_FRAMES)) if ring.record.is_empty() => {
                    return Err(ProtocolError::Ring("an empty frames record".into()).into());
                }
                Ok(Some(TAG_FRAMES)) => {}
                Ok(Some(tag)) => {
                    return Err(ProtocolError::Ring(format!("a ring record changed its tag to {tag}")).into());
                }
                Ok(None) => {
                    ring.record.clear();
                    return Ok(());
                }
                Err(e) => return Err(ring_error(e)),
            }
        }
    }

    /// Arms the doorbell and waits on the socket (until `until`, if given); the doorbell
    /// is taken down however the wait ends. [`Woke::Read`]: something is there to read (a
    /// record or a close that kept the doorbell from arming, or the socket's end, or with
    /// a direct wait its bytes); [`Woke::LookAgain`]: socket bytes in the reader's buffer
    /// (a doorbell is skipped at the next look, anything else is read) or the time is up.
    ///
    /// A blocking caller (`here`, with `until`) waits on its own thread where the transport
    /// has a direct wait ([`SocketReader::wait_readable_here`]): the kernel wakes this
    /// thread when the bytes come. Through the runtime, a nudged caller took three wake-ups
    /// in a row (this thread by the nudge, the runtime's I/O thread by the socket, this
    /// thread again), at the start of every frame larger than a ring record; under load
    /// each waits for a CPU.
    async fn wait_behind_doorbell(
        &mut self,
        s: &mut SocketReader,
        until: Option<Instant>,
        here: bool,
    ) -> Result<Woke, PipeError> {
        let ring = &mut *self;
        if !ring.rx.arm_doorbell().map_err(ring_error)? {
            return Ok(Woke::Read);
        }
        let armed = Armed(&mut ring.rx);
        let direct = match until {
            Some(t) if here => s.wait_readable_here(t),
            _ => None,
        };
        let woke = match direct {
            // The end, or a close here (`Interrupted`): the read says which.
            Some(Ok(Readiness::Readable | Readiness::Interrupted)) => Ok(Woke::Read),
            Some(Ok(Readiness::Deadline)) => Ok(Woke::LookAgain),
            Some(Err(e)) => Err(e.into()),
            None => {
                let fill = tokio::io::AsyncBufReadExt::fill_buf(s.stream());
                let got = match until {
                    Some(t) => tokio::time::timeout_at(t.into(), fill).await.ok(),
                    None => Some(fill.await),
                };
                match got {
                    Some(Ok([])) => Ok(Woke::Read),
                    Some(Err(e)) => Err(e.into()),
                    Some(Ok(_)) | None => Ok(Woke::LookAgain),
                }
            }
        };
        drop(armed);
        self.woke();
        woke
    }

    /// Skips the doorbells at the front of the socket's buffer; true when a frame can be
    /// read without waiting for the peer (or the end is known).
    fn ring_readable(&mut self, s: &mut SocketReader) -> bool {
        skip_doorbells(s);
        let buffered = !s.stream().buffer().is_empty();
        let ring = &mut *self;
        ring.at < ring.record.len()
            || ring.divert_taken
            || !ring.early.is_empty()
            || ring.socket_ended
            || buffered
            || ring.rx.has_data()
    }

    /// Polls the ring when the wait policy allows ([`spin::decide`]: busy polling armed by
    /// the pipe, the machine not overloaded, the ring's history warm); true when a record
    /// came.
    fn spin_on_ring(&mut self, s: &SocketReader) -> bool {
        let Some(b) = s.busy_poll() else { return false };
        let (window, armed) = (b.window(), b.armed());
        let ring = &mut *self;
        if window.is_zero() || !armed {
            return false;
        }
        let start = Instant::now();
        let learned = ring.wait.history.learned();
        let spin = spin::decide(SpinInputs {
            window,
            armed,
            learned,
            overloaded: learned.is_some() && spin::load::overloaded_at(start),
            others_active: false,
            spinning: 0,
            max_spinning: 1,
        });
        let Spin::Poll(d) = spin else { return false };
        if ring.spin_for(d, start, None) {
            return true;
        }
        ring.wait.missed_at = Some(start);
        false
    }
}

/// Consumes the doorbells (RING frames: a prefix and nothing else) at the front of the
/// socket's buffer.
fn skip_doorbells(s: &mut SocketReader) {
    use tokio::io::AsyncBufRead;
    while let Some(p) = s.stream().buffer().first_chunk::<PREFIX_LEN>() {
        let p = FramePrefix::decode(p);
        let doorbell =
            p.kind == FrameKind::Ring as u8 && p.flags == 0 && p.fds == 0 && p.header_len == 0 && p.payload_len == 0;
        if !doorbell {
            return;
        }
        std::pin::Pin::new(s.stream()).consume(PREFIX_LEN);
    }
}

/// The frame a divert record points to: the next one on the socket that is not a
/// doorbell.
async fn read_diverted(s: &mut SocketReader) -> Result<Frame, PipeError> {
    loop {
        let f = doorbell_or_frame(s.read_frame().await?)?;
        if f.kind != FrameKind::Ring {
            return Ok(f);
        }
    }
}

/// A RING frame on the socket after the handshake is a doorbell: a prefix and nothing
/// else. One that carries bytes is refused (a peer hiding data where nobody reads it).
fn doorbell_or_frame(f: Frame) -> Result<Frame, PipeError> {
    if f.kind == FrameKind::Ring && (!f.header.is_empty() || !f.payload.is_empty() || !f.fds.is_empty()) {
        return Err(ProtocolError::Ring(format!(
            "a RING frame after the handshake carries a {}-byte header, a {}-byte payload and {} descriptors; \
             a doorbell carries none",
            f.header.len(),
            f.payload.len(),
            f.fds.len()
        ))
        .into());
    }
    Ok(f)
}

/// How a wait behind the doorbell ended ([`RingRead::wait_behind_doorbell`]).
enum Woke {
    Read,
    LookAgain,
}

/// A doorbell armed for one wait: taken down when the wait ends, or is abandoned.
struct Armed<'a>(&'a mut Receiver);

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        self.0.disarm();
    }
}
