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
//! 4. Wait for the write side ([`Shared::write_message`]). Holding it:
//!    a. settle what an earlier, dropped write left ([`WriteSide::settle`]);
//!    b. the tickets are *placed*: a lease this message names may be released now;
//!    c. the message itself is dropped: a lease on the peer's memory that only its tensors
//!    held is released now;
//!    d. every session is asked for its due CONTROL frames
//!    ([`crate::ChannelSession::poll_control`]): such releases among them;
//!    e. the MESSAGE frame is written, the CONTROL frames behind it, in one write where they
//!    fit: a release never reaches the peer before a frame that names its lease.
//! 5. The tickets are *sent* (or, if the write failed, *aborted*).
//!
//! A packed message ([`super::packed`]: a same-host ring record) takes the same steps with
//! no JSON frame: [`Shared::write_packed`], or [`Shared::try_write_packed_now`] on a
//! blocking caller's thread. Its step 4d pulls only what placing, dropping and settling it
//! made due (the release of a lease it named), right behind it, while the writer holds the
//! [`crate::ControlWaker`] so that the sessions' wakes in between wake no control task.
//!
//! CONTROL frames have this one route. When no message goes out, the pipe's control task
//! takes the write side and pulls them the same way, when a session wakes it
//! ([`crate::ControlWaker`]) or when the time a session asked for comes.
//!
//! A dropped `send` future is safe at every step: before 4e its tickets abort; during 4e
//! its tickets and pulled frames stay in the write side, and the next holder settles them
//! by whether the write went out whole ([`crate::frame::FrameWriter::writes_done`]) or not
//! at all; a write that stopped part-way tore the stream, and the pipe closes.

use std::sync::Arc;
use std::time::Instant;

use crate::channel::ControlOut;
use crate::error::PipeError;
use crate::frame::{FrameKind, FrameWriter, OutFrame};
use crate::message::Message;
use crate::ticket::Tickets;
use crate::wire::ControlHeader;

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

    /// Writes a packed message record and settles its tickets by the outcome. The pulled
    /// CONTROL frames must have been written before.
    async fn write_packed(&mut self, record: &[u8], tickets: Tickets) -> Result<(), PipeError> {
        self.in_flight = Some((self.frames.writes_done(), Some(tickets)));
        let r = self.frames.write_packed(record).await;
        let settled = self.settle();
        r.and(settled)
    }

    /// True when a write may start without settling anything first.
    fn clean(&self) -> bool {
        self.in_flight.is_none() && !self.frames.is_torn() && self.pulled.is_empty()
    }
}

/// What [`Shared::try_write_packed_now`] did.
pub(super) enum Now {
    /// It wrote the message (or failed to), on this thread.
    Done(Result<(), PipeError>),
    /// The write side was busy or not clean: nothing happened, here is everything back.
    Busy(Message, Tickets),
}

impl Shared {
    /// Steps 4 and 5 of sending a message (module docs). Ends early with the pipe's error
    /// if it closes meanwhile.
    pub(super) async fn write_message(&self, frame: OutFrame, msg: Message, tickets: Tickets) -> Result<(), PipeError> {
        self.until_closed(async {
            let mut side = self.writer.lock().await;
            let mut tickets = tickets;
            self.check_torn(&mut side).await?;
            tickets.placed();
            drop(msg);
            self.pull(&mut side);
            let r = side.write(Some((FrameKind::Message, frame)), Some(tickets)).await;
            self.close_if_torn(&mut side, r).await
        })
        .await
    }

    /// Steps 4 and 5 for a packed message ([`super::packed`]). CONTROL frames due before it
    /// are the control task's (it was woken for them); a CONTROL frame left over from a
    /// dropped write goes first. Those that placing, dropping and settling the message make
    /// due (the release of a lease it named) go right after it, without waking the control
    /// task: the waker is held meanwhile ([`crate::ControlWaker::hold`]).
    pub(super) async fn write_packed(&self, record: &[u8], msg: Message, tickets: Tickets) -> Result<(), PipeError> {
        self.until_closed(async {
            let mut side = self.writer.lock().await;
            let mut tickets = tickets;
            self.check_torn(&mut side).await?;
            if !side.pulled.is_empty() {
                let r = side.write(None, None).await;
                self.close_if_torn(&mut side, r).await?;
            }
            let held = self.control.hold();
            tickets.placed();
            drop(msg);
            let r = side.write_packed(record, tickets).await;
            self.close_if_torn(&mut side, r).await?;
            if held.take_missed() {
                self.pull(&mut side);
                self.write_pulled_after(&mut side).await;
            }
            Ok(())
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

    /// [`Shared::write_packed`] for a blocking caller that holds `send_order`: when the
    /// write side is free and clean, does it on this thread, publishing the record with no
    /// future and no wait when the ring has room (`run` runs what must wait: CONTROL frames
    /// due before or after it, a full ring, a doorbell the peer is owed). Else hands
    /// everything back.
    pub(super) fn try_write_packed_now(
        &self,
        record: &[u8],
        msg: Message,
        mut tickets: Tickets,
        run: impl Fn(std::pin::Pin<&mut dyn Future<Output = Result<(), PipeError>>>) -> Result<(), PipeError>,
    ) -> Now {
        let Some(mut side) = self.writer.try_lock() else { return Now::Busy(msg, tickets) };
        if !side.clean() || self.is_closed() {
            return Now::Busy(msg, tickets);
        }
        let held = self.control.hold();
        tickets.placed();
        // The message is dropped once the record is out (off the way of the answer): the
        // releases that frees are pulled behind the record either way.
        let mut msg = Some(msg);
        let r = match side.frames.try_write_packed_now(record) {
            Some(doorbell) => {
                tickets.sent();
                drop(msg.take());
                if doorbell {
                    run(std::pin::pin!(self.until_closed(async {
                        let r = side.frames.pay_ring_doorbell().await;
                        self.close_if_torn(&mut side, r).await
                    })))
                } else {
                    Ok(())
                }
            }
            None => {
                drop(msg.take());
                run(std::pin::pin!(self.until_closed(async {
                    let r = side.write_packed(record, tickets).await;
                    self.close_if_torn(&mut side, r).await
                })))
            }
        };
        if r.is_err() {
            return Now::Done(r);
        }
        if held.take_missed() {
            self.pull(&mut side);
            if !side.pulled.is_empty() {
                let _ = run(std::pin::pin!(self.until_closed(async {
                    self.write_pulled_after(&mut side).await;
                    Ok(())
                })));
            }
        }
        Now::Done(Ok(()))
    }

    /// Writes a frame of another kind (CLOSE), with any pulled CONTROL frames behind it.
    pub(super) async fn write(&self, kind: FrameKind, frame: OutFrame) -> Result<(), PipeError> {
        self.until_closed(async {
            let mut side = self.writer.lock().await;
            self.check_torn(&mut side).await?;
            let r = side.write(Some((kind, frame)), None).await;
            self.close_if_torn(&mut side, r).await
        })
        .await
    }

    /// The control task's turn: takes the write side, pulls every session's due CONTROL
    /// frames and writes them. Returns when to pull again though no wake comes.
    async fn write_controls(&self) -> Result<Option<Instant>, PipeError> {
        self.until_closed(async {
            let mut side = self.writer.lock().await;
            self.check_torn(&mut side).await?;
            self.pull(&mut side);
            let r = side.write(None, None).await;
            self.close_if_torn(&mut side, r).await?;
            Ok(side.next_poll)
        })
        .await
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
            let header = ControlHeader { channel: c.channel.to_string(), body: c.body };
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
pub(super) async fn control_task(shared: Arc<Shared>) {
    let mut closed = shared.closed_tx.subscribe();
    let mut next: Option<Instant> = None;
    loop {
        let due = async {
            match next {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shared.control.woken() => {}
            _ = due => {}
            _ = closed.wait_for(|c| *c) => return,
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
