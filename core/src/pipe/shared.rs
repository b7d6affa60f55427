//! The pipe's shared state's own work: packing a message for the ring, the handler slot,
//! closing (and what a failed send reports), and telling a peer at fault why.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{HandlerSlot, MessageHandler, Shared, packed};
use crate::error::PipeError;
use crate::frame::{FrameKind, OutFrame};
use crate::message::Message;
use crate::wire::{Close, Location};

impl Shared {
    /// `msg`, its tensors encoded to `locs`, as a packed ring record ([`packed`]), when this
    /// pipe packs messages and `msg` qualifies.
    /// The record is built in `out` (`send_order`'s buffer); false: it goes as a frame.
    pub(super) fn pack(&self, msg: &Message, locs: &[Location], out: &mut Vec<u8>) -> bool {
        if self.pack_room == 0 {
            return false;
        }
        let room = packed::PackRoom { peer: &self.peer_limits, max_record: self.pack_room };
        let packed = packed::pack_into(msg, locs, &room, out).is_some();
        if !packed {
            // It goes as a frame: what a record that did not fit left is not kept.
            packed::trim_scratch(out);
        }
        packed
    }

    pub(super) fn handler_slot(&self) -> std::sync::MutexGuard<'_, HandlerSlot> {
        self.handler.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the handler out to call it (so that it may use the pipe freely), with the
    /// slot's generation for [`Shared::put_handler_back`]; `None`: there is none.
    pub(super) fn take_handler(&self) -> Option<(MessageHandler, u64)> {
        let mut slot = self.handler_slot();
        let generation = slot.generation;
        slot.handler.take().map(|h| (h, generation))
    }

    /// Puts a handler taken out by [`Shared::take_handler`] back, unless it was replaced
    /// or cleared meanwhile (then it is dropped, outside the lock).
    pub(super) fn put_handler_back(&self, handler: MessageHandler, generation: u64) {
        let mut slot = self.handler_slot();
        if slot.generation == generation && slot.handler.is_none() {
            slot.handler = Some(handler);
        } else {
            drop(slot);
            drop(handler);
        }
    }

    /// Replaces the handler (`None`: clears it); the old one is dropped outside the lock.
    pub(super) fn replace_handler(&self, new: Option<MessageHandler>) {
        let old = {
            let mut slot = self.handler_slot();
            slot.generation = slot.generation.wrapping_add(1);
            self.has_handler.store(new.is_some(), Ordering::Release);
            std::mem::replace(&mut slot.handler, new)
        };
        drop(old);
    }

    /// True once the pipe is closed.
    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub(super) fn closed_error(&self) -> PipeError {
        match &*self.error.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(e @ PipeError::ClosedByPeer(_)) => e.clone(),
            _ => PipeError::Closed,
        }
    }

    pub(super) fn mark_closed(&self, e: PipeError) {
        let mut slot = self.error.lock().unwrap_or_else(|e| e.into_inner());
        // The peer's stated reason (its CLOSE frame) beats a bare end of stream seen first
        // (a write that failed because the peer had already closed).
        let bare =
            matches!(&*slot, Some(PipeError::Closed | PipeError::Transport(crate::error::TransportError::Closed)));
        if slot.is_none() || (bare && matches!(e, PipeError::ClosedByPeer(_))) {
            *slot = Some(e);
        }
        drop(slot);
        self.closed.store(true, Ordering::Release);
        self.ring_closer.close();
        if let Some(d) = &self.direct {
            d.interrupt();
        }
        if !self.closed_tx.send_replace(true) {
            for s in self.sessions.values() {
                s.close();
            }
        }
    }

    /// What a send that failed reports: a pipe that ended without a word from the peer,
    /// not closed by this side, while the peer's end is closed, is [`PipeError::PeerGone`]
    /// (the peer process died; whichever path noticed first).
    pub(super) fn send_error(&self, e: PipeError) -> PipeError {
        let bare = matches!(e, PipeError::Closed | PipeError::Transport(crate::error::TransportError::Closed));
        if bare
            && !self.closed_here.load(Ordering::Acquire)
            && !self.peer_said_bye.load(Ordering::Acquire)
            && self.liveness.as_ref().is_some_and(|l| l.peer_gone())
        {
            return PipeError::PeerGone;
        }
        e
    }

    /// The peer broke the protocol: say why (best effort) and close.
    pub(super) async fn fail(&self, e: &PipeError) {
        let code = match e {
            PipeError::Limit(_) => "limit",
            _ => "protocol_error",
        };
        let bye = Close { code: code.into(), message: e.to_string() };
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            let mut w = self.writer.lock().await;
            let _ = w.frames.write_frame(FrameKind::Close, OutFrame::json(&bye)).await;
            w.frames.shutdown().await;
        })
        .await;
    }
}
