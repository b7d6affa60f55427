//! The pipe's read side: the reader task reads frames, decodes MESSAGE frames (validating
//! every descriptor through the channel sessions), hands CONTROL frames to their session,
//! and gives each message to the handler or the `recv` queue.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::channel::{ControlFrame, Incoming};
use crate::error::{ChannelError, LimitError, PipeError, ProtocolError};
use crate::frame::{Frame, FrameKind, FrameReader, Received, WaitSpin};
use crate::message::Message;
use crate::wire::{Close, MessageHeader};

use super::{Handled, Shared};

pub(super) async fn read_loop(reader: FrameReader, shared: Arc<Shared>, tx: mpsc::Sender<Result<Message, PipeError>>) {
    let end = read_frames(reader, &shared, &tx).await;
    // The handler may hold what holds this pipe: let it go before waiting for room in the
    // queue (whose reader may be what the handler keeps alive).
    shared.replace_handler(None);
    if let Some(e) = end {
        let _ = tx.send(Err(e)).await;
    }
    drop(tx);
    shared.handover.end();
}

/// Reads until the pipe ends; returns the error to report to `recv` (`None`: `recv`'s side
/// is gone, or a blocking caller read the end and reported it).
async fn read_frames(
    mut reader: FrameReader,
    shared: &Shared,
    tx: &mpsc::Sender<Result<Message, PipeError>>,
) -> Option<PipeError> {
    loop {
        // Between frames, a blocking caller may take the reader over ([`super::blocking`]).
        let ready = if shared.handover.wanted() {
            None
        } else {
            tokio::select! {
                biased;
                r = reader.wait_readable(WaitSpin::BusyPoll) => Some(r.map(drop)),
                () = shared.handover.asked() => None,
            }
        };
        let result = match ready {
            None => {
                let mut held = None;
                if shared.handover.wanted() {
                    reader.arm_busy_poll(false);
                    let drain = |r: &mut FrameReader| r.controls_now(|frame| control_frame(shared, frame));
                    match shared.handover.park(reader, drain).await? {
                        Ok(r) => {
                            reader = r;
                            // What a follower's thread left ([`super::follow`]): reads its
                            // handler paused, or a message it read for no handler.
                            let (pause, msg) = shared.handover.take_returned();
                            if let Some(pause) = pause {
                                shared.handover.set_stuck(true);
                                pause.await;
                                shared.handover.set_stuck(false);
                            }
                            held = msg;
                        }
                        Err(e) => {
                            end_with(shared, &e).await;
                            return Some(e);
                        }
                    }
                }
                match held {
                    Some(msg) => Ok(Some(msg)),
                    None => continue,
                }
            }
            Some(Err(e)) => Err(e),
            Some(Ok(())) => match read_frame_marked(&mut reader, shared).await {
                Err(e) => Err(e),
                Ok(read) => handle_read(shared, read).await,
            },
        };
        match result {
            Ok(Some(msg)) => {
                // The handler is taken out while it runs, so that it may use the pipe freely.
                let Some((mut handler, generation)) = shared.take_handler() else {
                    reader.arm_busy_poll(false);
                    let sent = match tx.try_send(Ok(msg)) {
                        Ok(()) => true,
                        Err(mpsc::error::TrySendError::Closed(_)) => false,
                        Err(mpsc::error::TrySendError::Full(msg)) => {
                            // Waits for a receiver: a blocking send must not wait for it.
                            shared.handover.set_stuck(true);
                            let sent = tx.send(msg).await.is_ok();
                            shared.handover.set_stuck(false);
                            sent
                        }
                    };
                    if !sent {
                        return None;
                    }
                    shared.handover.queued();
                    continue;
                };
                shared.handover.set_stuck(true);
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
                shared.put_handler_back(handler, generation);
                if let Some(until) = pause {
                    until.await;
                }
                shared.handover.set_stuck(false);
            }
            Ok(None) => {}
            Err(e) => {
                reader.arm_busy_poll(false);
                end_with(shared, &e).await;
                return Some(e);
            }
        }
    }
}

/// Reads the next frame; while it waits for the peer's bytes (a frame not all here yet),
/// the task is marked stuck, so that a blocking send does not wait for it to park the
/// reader ([`super::Pipe`]'s `controls_now`): a peer that trickles a frame holds up only
/// the reads. A frame already here (a ring record, bytes in the buffer) is read at the first
/// poll, unmarked.
async fn read_frame_marked(reader: &mut FrameReader, shared: &Shared) -> Result<Received, PipeError> {
    let mut read = std::pin::pin!(reader.read_frame());
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(read.as_mut().poll(cx))).await;
    match first {
        std::task::Poll::Ready(r) => r,
        std::task::Poll::Pending => {
            shared.handover.set_stuck(true);
            let r = read.await;
            shared.handover.set_stuck(false);
            r
        }
    }
}

/// The pipe ended with `e`: a peer at fault is told why, and the pipe is marked closed.
pub(super) async fn end_with(shared: &Shared, e: &PipeError) {
    let peer_fault = !matches!(e, PipeError::Closed | PipeError::ClosedByPeer(_) | PipeError::Transport(_));
    if peer_fault {
        tracing::warn!(error = %e, "closing pipe: peer sent bad data");
        shared.fail(e).await;
    }
    shared.mark_closed(e.clone());
}

/// Handles what the reader read: a message (a MESSAGE frame, or a packed record) to give
/// on, or a CONTROL frame for its session, or the end.
pub(super) async fn handle_read(shared: &Shared, read: Received) -> Result<Option<Message>, PipeError> {
    match read {
        Received::Packed(record) => unpack(shared, &record).map(Some),
        Received::Frame(frame) => handle_frame(shared, frame).await,
    }
}

async fn handle_frame(shared: &Shared, frame: Frame) -> Result<Option<Message>, PipeError> {
    match frame.kind {
        FrameKind::Message => decode_message(shared, frame).await.map(Some),
        FrameKind::Control => control_frame(shared, frame).map(|()| None),
        FrameKind::Close => {
            shared.peer_said_bye.store(true, std::sync::atomic::Ordering::Release);
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

/// Hands a CONTROL frame to its channel's session.
pub(super) fn control_frame(shared: &Shared, frame: Frame) -> Result<(), PipeError> {
    let c: ControlFrame<'_> = crate::frame::parse_header(&frame.header)?;
    let session = shared.sessions.values().find(|s| s.name() == c.channel).ok_or_else(|| {
        ProtocolError::BadHeader(format!("control frame for channel {:?}, which this pipe does not use", c.channel))
    })?;
    let mut incoming = Incoming::new(
        frame.payload,
        #[cfg(unix)]
        frame.fds,
    );
    session.control(c.body, &mut incoming)?;
    Ok(())
}

/// The message a packed ring record holds ([`super::packed`]), checked against this side's
/// limits; tensors not inline are decoded by the CPU channel's session, without waiting.
pub(super) fn unpack(shared: &Shared, record: &[u8]) -> Result<Message, PipeError> {
    let rules = super::packed::UnpackRules { limits: &shared.limits, max_header_values: shared.max_header_values };
    let mut incoming = Incoming::new(
        bytes::Bytes::new(),
        #[cfg(unix)]
        Vec::new(),
    );
    super::packed::unpack(record, &rules, |index, meta, loc| {
        let bad = |reason: String| PipeError::from(ProtocolError::BadTensor { index, reason });
        let session = shared
            .sessions
            .get(&crate::dtype::DeviceKind::Cpu)
            .ok_or_else(|| bad("no channel was negotiated for Cpu tensors".into()))?;
        match session.decode_now(meta, loc, &mut incoming) {
            Some(Ok(t)) => Ok(t),
            Some(Err(ChannelError::Limit(l))) => Err(PipeError::Limit(l)),
            Some(Err(e)) => Err(bad(e.to_string())),
            None => Err(bad(format!("the {} channel cannot take it in a packed message", session.name()))),
        }
    })
}

/// Headers at least this long are counted before they are parsed
/// ([`crate::json_shape::check`]); shorter ones cannot hold a harmful number of values.
const COUNT_HEADER_FROM: usize = 64 << 10;

/// Headers at least this long are parsed on the blocking pool, not on the runtime worker
/// that other connections' readers need.
const PARSE_OFF_WORKER_FROM: usize = 1 << 20;

/// Parses a MESSAGE frame's header, after counting its values when it is big; a header of
/// [`PARSE_OFF_WORKER_FROM`] bytes or more is counted and parsed on a compute thread
/// ([`crate::compute::spawn`]).
async fn message_header(shared: &Shared, frame: &mut Frame) -> Result<MessageHeader, PipeError> {
    let max = shared.max_header_values;
    if frame.header.len() < PARSE_OFF_WORKER_FROM {
        count_header_values(&frame.header, max)?;
        return Ok(frame.parse()?);
    }
    let header = std::mem::take(&mut frame.header);
    crate::compute::spawn(move || {
        count_header_values(&header, max)?;
        Ok(crate::frame::parse_header::<MessageHeader>(&header)?)
    })
    .await
    .map_err(|e| ProtocolError::BadHeader(format!("parsing the header: {e}")))?
}

/// Checks a header of [`COUNT_HEADER_FROM`] bytes or more against `max` values (and the
/// parser's depth) before it is parsed.
pub(super) fn count_header_values(text: &[u8], max: usize) -> Result<(), PipeError> {
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
