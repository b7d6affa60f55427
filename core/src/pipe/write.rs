//! The pipe's write side: whoever holds it writes, and everything that must be ordered on
//! the wire happens while it is held.
//!
//! Sending a message (`Pipe::send`), step by step:
//!
//! 1. Take `send_order`, so that messages reach the wire in the order their tensors were
//!    encoded.
//! 2. Each tensor's session encodes it into the [`Outgoing`](crate::Outgoing) being built,
//!    and notes in its ticket what it did ([`crate::ticket`]).
//! 3. Check the peer's limits. On any failure the tickets are aborted; nothing was written.
//! 4. Wait for the write side, and take one turn with it ([`Shared::turn`]): the one send
//!    sequence, which every write follows (a MESSAGE frame, a packed record, a CLOSE, the
//!    control task's CONTROL frames alone):
//!    a. *settle* what an earlier, dropped write left ([`WriteSide::settle`]);
//!    b. *hold* the [`crate::ControlWaker`]: the sessions' wakes from here on are noted,
//!    not sent to the control task (this writer pulls before it lets go);
//!    c. the tickets are *placed*: a lease this message names may be released now;
//!    d. the message itself is *dropped*: a lease on the peer's memory that only its
//!    tensors held is released now;
//!    e. every session is asked for its due CONTROL frames
//!    ([`crate::ChannelSession::poll_control`]): such releases among them;
//!    f. the frame is *written*, the CONTROL frames behind it, in one write where they fit:
//!    a release never reaches the peer before a frame that names its lease;
//!    g. the write is *settled*: its tickets are sent (or, if it failed, aborted); CONTROL
//!    frames that the steps since (e) made due go right behind it.
//!
//! What differs between kinds of write is what (e) pulls ([`Put`]):
//!
//! - a MESSAGE frame, and the control task's turn, take every due CONTROL frame along;
//! - a packed message ([`super::packed`]: a same-host ring record) carries no frame behind
//!   it: a CONTROL frame left over from a dropped write goes first, and its (e) pulls only
//!   what its own steps made due (the release of a lease it named), right after the
//!   record. Its message is dropped as soon as the record is out (off the way of the
//!   answer; what that frees is pulled behind the record either way), unless it gives the
//!   peer back memory the peer may wait for ([`crate::ticket::SendTicket::returns_peer_memory`]):
//!   then d and e come first, and the releases go out with the record, published together
//!   where the link can ([`FrameWriter::try_write_packed_with_controls_now`]). A blocking caller's
//!   thread runs the same turn ([`Shared::try_write_packed_now`]): with room in the ring it
//!   ends at its first poll;
//! - a CLOSE takes only what is left over: nothing follows it.
//!
//! CONTROL frames have this one route. When no message goes out, the pipe's control task
//! takes the write side and pulls them the same way, when a session wakes it
//! ([`crate::ControlWaker`]) or when the time a session asked for comes. Frames that may
//! wait a little ([`crate::ControlWaker::wake_soon`]: a lease's release) are left to the next
//! write, which pulls behind itself (step g), or to the control task's tick, which runs
//! while such wakes keep coming: a request-response pair's releases then cost no wake-up.
//!
//! A dropped `send` future is safe at every step: before 4f its tickets abort; during 4f
//! its tickets and pulled frames stay in the write side, and the next holder settles them
//! by whether the write went out whole ([`crate::frame::FrameWriter::writes_done`]) or not
//! at all; a write that stopped part-way tore the stream, and the pipe closes. A wake the
//! held waker noted goes to the control task when the guard drops.

use std::sync::Arc;
use std::time::Instant;

use crate::channel::{ControlFrame, ControlOut};
use crate::error::PipeError;
use crate::frame::{FrameKind, FrameWriter, OutFrame};
use crate::message::Message;
use crate::ticket::Tickets;

use super::Shared;

/// The write half and the sending state that only its holder may touch.
pub(super) struct WriteSide {
    pub(super) frames: FrameWriter,
    /// CONTROL frame headers pulled from the sessions and not written yet.
    pulled: Vec<Vec<u8>>,
    /// The write under way (its future may be dropped): [`FrameWriter::writes_done`] when
    /// it began, and its message's tickets (none for CONTROL frames alone).
    in_flight: Option<(u64, Option<Tickets>)>,
    /// The soonest time a session asked to be polled again.
    next_poll: Option<Instant>,
}

impl WriteSide {
    pub(super) fn new(frames: FrameWriter) -> Self {
        WriteSide { frames, pulled: Vec::new(), in_flight: None, next_poll: None }
    }

    /// Settles what a write whose future was dropped left behind: if it went out whole, its
    /// message was sent and its CONTROL frames are written; if it never began, its message
    /// was not sent and its CONTROL frames wait for this write. A write that stopped
    /// part-way tore the stream: an error, and the pipe must close.
    fn settle(&mut self) -> Result<(), PipeError> {
        if let Some((before, tickets)) = self.in_flight.take() {
            if self.frames.writes_done() > before {
                self.pulled.clear();
                if let Some(t) = tickets {
                    t.sent();
                }
            } else if let Some(t) = tickets {
                t.aborted();
            }
        }
        if self.frames.is_torn() {
            return Err(PipeError::Transport(crate::error::TransportError::Io(Arc::new(std::io::Error::other(
                "a send was dropped part-way through writing its frame: the stream has lost its frame boundaries",
            )))));
        }
        Ok(())
    }

    /// Writes `frame` (or, when `None`, the first pulled CONTROL frame) with the pulled
    /// CONTROL frames behind it, then settles `tickets` by the outcome.
    async fn write(&mut self, frame: Option<(FrameKind, OutFrame)>, tickets: Option<Tickets>) -> Result<(), PipeError> {
        let (kind, frame, skip) = match frame {
            Some((kind, frame)) => (kind, frame, 0),
            None => match self.pulled.first() {
                Some(h) => (FrameKind::Control, OutFrame { header: h.clone(), ..OutFrame::default() }, 1),
                None => return Ok(()),
            },
        };
        self.in_flight = Some((self.frames.writes_done(), tickets));
        let trailing: Vec<(FrameKind, &[u8])> =
            self.pulled[skip..].iter().map(|h| (FrameKind::Control, h.as_slice())).collect();
        let r = self.frames.write_frame_then(kind, frame, &trailing).await;
        // Finished either way: settle now (a failed write's tickets abort).
        let settled = self.settle();
        r.and(settled)
    }

    /// Writes a packed message record and settles its tickets by the outcome; `msg` is
    /// dropped as soon as the record is out (or, when it must wait for room, before it
    /// waits). The pulled CONTROL frames must have been written before.
    async fn write_packed(
        &mut self,
        record: &[u8],
        tickets: Option<Tickets>,
        msg: Option<Message>,
    ) -> Result<(), PipeError> {
        // With room in the ring (the common case) the record is published with no wait.
        if let Some(doorbell) = self.frames.try_write_packed_now(record) {
            if let Some(t) = tickets {
                t.sent();
            }
            drop(msg);
            return if doorbell { self.frames.pay_ring_doorbell().await } else { Ok(()) };
        }
        drop(msg);
        self.in_flight = Some((self.frames.writes_done(), tickets));
        let r = self.frames.write_packed(record).await;
        let settled = self.settle();
        r.and(settled)
    }
}

impl WriteSide {
    /// Writes a packed message record with the pulled CONTROL frames right behind it,
    /// published together where the link can ([`FrameWriter::try_write_packed_with_controls_now`]),
    /// else one after the other; settles `tickets` by the record's outcome.
    async fn write_packed_with_pulled(&mut self, record: &[u8], tickets: Option<Tickets>) -> Result<(), PipeError> {
        if !self.pulled.is_empty()
            && let Some(doorbell) = self.frames.try_write_packed_with_controls_now(record, &self.pulled)
        {
            self.pulled.clear();
            if let Some(t) = tickets {
                t.sent();
            }
            return if doorbell { self.frames.pay_ring_doorbell().await } else { Ok(()) };
        }
        self.write_packed(record, tickets, None).await?;
        // Pulled before the record: written right behind it.
        self.write(None, None).await
    }
}

/// What one turn of the write side writes ([`Shared::turn`]); it decides what the turn
/// pulls (module docs, step 4e).
pub(super) enum Put<'a> {
    /// A frame: a MESSAGE takes every due CONTROL frame along; another kind (CLOSE) only
    /// those left over from a dropped write.
    Frame(FrameKind, OutFrame),
    /// A packed message record: CONTROL frames its own steps made due go right after it.
    Packed(&'a [u8]),
    /// The due CONTROL frames alone (the control task's turn).
    Controls,
}

impl Put<'_> {
    /// Whether the turn pulls every due CONTROL frame before it writes (to go along).
    fn pulls_along(&self) -> bool {
        matches!(self, Put::Frame(FrameKind::Message, _) | Put::Controls)
    }
}

/// What [`Shared::try_write_packed_now`] did.
pub(super) enum Now {
    /// It wrote the message (or failed to), on this thread.
    Done(Result<(), PipeError>),
    /// Another writer held the write side: nothing happened, here is everything back.
    Busy(Message, Tickets),
}

impl Shared {
    /// One turn of the write side, the send sequence of the module docs (step 4: settle,
    /// hold, placed, drop, pull, write, settle) for every kind of write; `sending` is the
    /// message going out with it and its tickets.
    async fn turn(
        &self,
        side: &mut WriteSide,
        put: Put<'_>,
        sending: Option<(Message, Tickets)>,
    ) -> Result<(), PipeError> {
        // a. Settle.
        self.check_torn(side).await?;
        if matches!(put, Put::Packed(_)) && !side.pulled.is_empty() {
            // A record carries no frame behind it: leftovers go first.
            let r = side.write(None, None).await;
            self.close_if_torn(side, r).await?;
        }
        // b. Hold.
        let held = self.control.hold();
        // c. Placed.
        let (msg, tickets) = match sending {
            Some((msg, mut tickets)) => {
                tickets.placed();
                (Some(msg), Some(tickets))
            }
            None => (None, None),
        };
        // A CLOSE is the last frame: nothing goes behind it.
        let after = !matches!(put, Put::Frame(kind, _) if kind != FrameKind::Message);
        let r = match put {
            Put::Packed(record) if tickets.as_ref().is_some_and(Tickets::returns_peer_memory) => {
                // A message that gives the peer its memory back: d and e before f, and the
                // releases its drop made due go out with the record, visible to the peer
                // at once. Behind it (step g), they could come late: the peer, once it has
                // the answer, may send again before this side gets its CPU back, and its
                // pool, without the memory, grows by a segment whose first touch costs
                // more than many round trips (a 24.9 MB copy-in echo on a busy 2-vCPU VM:
                // 35-45 ms).
                drop(msg);
                held.take_missed();
                self.pull(side);
                side.write_packed_with_pulled(record, tickets).await
            }
            Put::Packed(record) => {
                // f, g (d once the record is out); e behind it.
                side.write_packed(record, tickets, msg).await
            }
            put => {
                // d. Drop.
                drop(msg);
                // e. Pull.
                if put.pulls_along() {
                    held.take_missed();
                    self.pull(side);
                }
                // f, g. Write and settle.
                match put {
                    Put::Frame(kind, frame) => side.write(Some((kind, frame)), tickets).await,
                    _ => side.write(None, None).await,
                }
            }
        };
        self.close_if_torn(side, r).await?;
        // g. What the steps since the pull made due goes right behind (after a CLOSE, a wake
        // it noted goes to the control task as the guard drops).
        if after && (held.take_missed() | self.control.soon_pending()) {
            self.pull(side);
            self.write_pulled_after(side).await;
        }
        Ok(())
    }

    /// Steps 4 and 5 of sending a message (module docs) as a MESSAGE frame. Ends early with
    /// the pipe's error if it closes meanwhile.
    pub(super) async fn write_message(&self, frame: OutFrame, msg: Message, tickets: Tickets) -> Result<(), PipeError> {
        self.until_closed(async {
            let mut side = self.writer.lock().await;
            self.turn(&mut side, Put::Frame(FrameKind::Message, frame), Some((msg, tickets))).await
        })
        .await
    }

    /// Steps 4 and 5 for a packed message ([`super::packed`]).
    pub(super) async fn write_packed(&self, record: &[u8], msg: Message, tickets: Tickets) -> Result<(), PipeError> {
        self.until_closed(async {
            let mut side = self.writer.lock().await;
            self.turn(&mut side, Put::Packed(record), Some((msg, tickets))).await
        })
        .await
    }

    /// [`Shared::write_packed`] for a blocking caller that holds `send_order`: when the
    /// write side is free, takes the turn on this thread through `run` (which polls it to
    /// its end here): with room in the ring it ends at its first poll, with no wait. Else
    /// hands everything back.
    pub(super) fn try_write_packed_now(
        &self,
        record: &[u8],
        msg: Message,
        tickets: Tickets,
        run: impl Fn(std::pin::Pin<&mut dyn Future<Output = Result<(), PipeError>>>) -> Result<(), PipeError>,
    ) -> Now {
        let Some(mut side) = self.writer.try_lock() else { return Now::Busy(msg, tickets) };
        Now::Done(run(std::pin::pin!(self.until_closed(self.turn(
            &mut side,
            Put::Packed(record),
            Some((msg, tickets))
        )))))
    }

    /// Writes a frame of another kind (CLOSE), with any CONTROL frames left over from a
    /// dropped write behind it.
    pub(super) async fn write(&self, kind: FrameKind, frame: OutFrame) -> Result<(), PipeError> {
        self.until_closed(async {
            let mut side = self.writer.lock().await;
            self.turn(&mut side, Put::Frame(kind, frame), None).await
        })
        .await
    }

    /// The control task's turn: takes the write side, pulls every session's due CONTROL
    /// frames and writes them. Returns when to pull again though no wake comes.
    async fn write_controls(&self) -> Result<Option<Instant>, PipeError> {
        self.until_closed(async {
            let mut side = self.writer.lock().await;
            self.turn(&mut side, Put::Controls, None).await?;
            Ok(side.next_poll)
        })
        .await
    }

    /// Writes the CONTROL frames a message's settling made due, right behind it. They are
    /// the message's afterthought: a failure here is the pipe's (a torn stream closes it;
    /// frames not written stay pulled for the next writer), not the message's.
    async fn write_pulled_after(&self, side: &mut WriteSide) {
        if !side.pulled.is_empty() {
            let r = side.write(None, None).await;
            let _ = self.close_if_torn(side, r).await;
        }
    }

    /// Asks every session for its due CONTROL frames (the writer holds the write side).
    fn pull(&self, side: &mut WriteSide) {
        let now = Instant::now();
        let mut due: Vec<ControlOut> = Vec::new();
        let mut next: Option<Instant> = None;
        for s in self.sessions.values() {
            if let Some(t) = s.poll_control(now, &mut due) {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        for c in due {
            let header = ControlFrame { channel: c.channel.into(), body: &c.body };
            side.pulled.push(serde_json::to_vec(&header).unwrap_or_default());
        }
        // A sooner time than the control task waits for: it must look again.
        if next.is_some_and(|t| side.next_poll.is_none_or(|n| t < n)) {
            self.control.wake_task();
        }
        side.next_poll = next;
    }

    /// Fails (and closes the pipe) when an earlier dropped write tore the stream.
    async fn check_torn(&self, side: &mut WriteSide) -> Result<(), PipeError> {
        let r = side.settle();
        self.close_if_torn(side, r).await
    }

    /// Passes `r` on; when the stream is torn, first closes the pipe (the peer sees the end
    /// of the stream, not a frame it cannot find the start of).
    async fn close_if_torn<T>(&self, side: &mut WriteSide, r: Result<T, PipeError>) -> Result<T, PipeError> {
        if let Err(e) = &r
            && side.frames.is_torn()
        {
            tracing::warn!(error = %e, "closing pipe: a write stopped part-way through a frame");
            // The end of the stream first, so that this write's own error is what it returns.
            side.frames.shutdown().await;
            self.mark_closed(e.clone());
        }
        r
    }

    /// Runs `f` unless the pipe closes first; a closed error from `f` closes the pipe.
    async fn until_closed<T>(&self, f: impl Future<Output = Result<T, PipeError>>) -> Result<T, PipeError> {
        if self.is_closed() {
            return Err(self.closed_error());
        }
        // `f` first, alone: a write that finishes at once (the common case) subscribes to
        // nothing. Only one that must wait also waits for the close (`wait_for` looks at the
        // current value first, so a close in between is not missed).
        let mut f = std::pin::pin!(f);
        let first = std::future::poll_fn(|cx| std::task::Poll::Ready(f.as_mut().poll(cx))).await;
        let r = match first {
            std::task::Poll::Ready(r) => r,
            std::task::Poll::Pending => {
                let mut closed = self.closed_tx.subscribe();
                tokio::select! {
                    biased;
                    r = &mut f => r,
                    _ = closed.wait_for(|c| *c) => Err(self.closed_error()),
                }
            }
        };
        if let Err(e) = &r
            && e.is_closed()
        {
            self.mark_closed(e.clone());
        }
        r
    }
}

/// Writes the sessions' CONTROL frames when no message takes them along: when a session
/// wakes it, or when the time one asked for comes. Ends when the pipe closes.
///
/// While [`crate::ControlWaker::wake_soon`]s keep coming it also looks every
/// [`crate::channel::CONTROL_TICK`] (and such wakes then wake nobody); a tick that finds
/// none came since the last stops that.
pub(super) async fn control_task(shared: Arc<Shared>) {
    let mut closed = shared.closed_tx.subscribe();
    let mut next: Option<Instant> = None;
    let mut tick: Option<Instant> = None;
    loop {
        let at = [next, tick].into_iter().flatten().min();
        let due = async {
            match at {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending().await,
            }
        };
        let woken = tokio::select! {
            _ = shared.control.woken() => true,
            _ = due => false,
            _ = closed.wait_for(|c| *c) => return,
        };
        let now = Instant::now();
        if woken || tick.is_some_and(|t| t <= now) {
            if shared.control.take_soon() {
                if tick.is_none() {
                    shared.control.set_ticking(true);
                }
                tick = Some(now + crate::channel::CONTROL_TICK);
            } else if tick.take().is_some() {
                // No `wake_soon` since the last look (at a tick, or another wake-up): stop.
                // The pull below comes after the store, so a `wake_soon` that still saw
                // the tick has its frames pulled.
                shared.control.set_ticking(false);
            }
        }
        match shared.write_controls().await {
            Ok(n) => next = n,
            Err(e) => {
                // A connection that cannot take a CONTROL frame is broken: the sessions'
                // releases would never reach the peer again. Close the pipe.
                shared.mark_closed(e);
                return;
            }
        }
    }
}
