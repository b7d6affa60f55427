//! Send tickets: what a channel session does as a message it encoded tensors into goes out,
//! or does not.
//!
//! A session that must act on a message's fate keeps one ticket of its own type in the
//! message being built ([`Outgoing::ticket`]) and records there what it did while encoding:
//! the leases it granted and the segments it announced (to forget if the message is not
//! sent), the peer's leases the message names (whose release must not overtake it), the
//! bytes that travel apart from the frame (to start once the frame is written). The pipe
//! then takes every ticket of the message through one sequence:
//!
//! 1. [`SendTicket::placed`], exactly once: the pipe holds the write side for the message,
//!    so nothing can reach the wire before it any more (or it will not be sent at all).
//! 2. Then exactly one of [`SendTicket::sent`] (the frame went to the transport whole) and
//!    [`SendTicket::aborted`] (it did not: encoding or a limit check failed, the send was
//!    dropped before the frame's first byte, or the pipe failed or closed meanwhile; the
//!    peer never reads the frame, or the pipe is closing anyway).
//!
//! Tickets of one message run in the order they were made; aborts run newest first. A
//! [`Tickets`] dropped unsettled aborts.
//!
//! [`Outgoing::ticket`]: crate::Outgoing::ticket

use std::any::{Any, TypeId};

/// One session's part in one outgoing message (see the module docs for the sequence).
pub trait SendTicket: Any + Send {
    /// The message holds the write side (or will not be sent): nothing can be written before
    /// it any more. E.g. a lease the message names may be released now: its release can only
    /// follow the message. Runs once, before [`SendTicket::sent`] or
    /// [`SendTicket::aborted`].
    fn placed(&mut self) {}
    /// Whether the message gives the peer back memory the peer lent, so that dropping it
    /// may make a release of that memory due at once: the writer then drops it before the
    /// write and sends the release with it (`crate::pipe::write`).
    fn returns_peer_memory(&self) -> bool {
        false
    }
    /// The frame was handed to the transport whole. E.g. start sending bytes that travel
    /// apart from it; count an announced segment as known to the peer.
    fn sent(self: Box<Self>) {}
    /// The message was not sent. E.g. forget a lease granted or a segment announced for it.
    fn aborted(self: Box<Self>) {}
}

/// The tickets of one message, settled together.
#[derive(Default)]
#[must_use = "settle them: sent() once the frame is written, aborted() if it is not"]
pub struct Tickets {
    /// Inline room for one (a message's tickets are usually one session's): no list
    /// allocated per message.
    list: smallvec::SmallVec<[Box<dyn SendTicket>; 1]>,
    placed: bool,
}

impl std::fmt::Debug for Tickets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tickets").field("len", &self.list.len()).field("placed", &self.placed).finish()
    }
}

impl Tickets {
    /// The ticket of type `T`, made with `make` if there is none yet.
    pub(crate) fn get_or_insert<T: SendTicket>(&mut self, make: impl FnOnce() -> T) -> &mut T {
        let at = self.list.iter().position(|t| (&**t as &dyn Any).type_id() == TypeId::of::<T>());
        let at = at.unwrap_or_else(|| {
            self.list.push(Box::new(make()));
            self.list.len() - 1
        });
        let t: &mut dyn Any = &mut *self.list[at];
        t.downcast_mut::<T>().expect("the ticket at this index has type T")
    }

    /// How many sessions hold a ticket.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// True when no session holds a ticket.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Whether any session's ticket says [`SendTicket::returns_peer_memory`].
    pub fn returns_peer_memory(&self) -> bool {
        self.list.iter().any(|t| t.returns_peer_memory())
    }

    /// Step 1: the message holds the write side. Later calls do nothing.
    pub fn placed(&mut self) {
        if !self.placed {
            self.placed = true;
            for t in &mut self.list {
                t.placed();
            }
        }
    }

    /// Step 2: the frame was written whole ([`Tickets::placed`] first, if it has not run).
    pub fn sent(mut self) {
        self.placed();
        for t in std::mem::take(&mut self.list) {
            t.sent();
        }
    }

    /// Step 2: the message was not sent ([`Tickets::placed`] first, if it has not run);
    /// newest first.
    pub fn aborted(mut self) {
        self.abort_all();
    }

    fn abort_all(&mut self) {
        self.placed();
        while let Some(t) = self.list.pop() {
            t.aborted();
        }
    }
}

impl Drop for Tickets {
    fn drop(&mut self) {
        self.abort_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    type Log = Arc<Mutex<Vec<String>>>;

    struct Named(&'static str, Log);
    struct Other(Log, u32);

    impl SendTicket for Named {
        fn placed(&mut self) {
            self.1.lock().unwrap().push(format!("{} placed", self.0));
        }
        fn sent(self: Box<Self>) {
            self.1.lock().unwrap().push(format!("{} sent", self.0));
        }
        fn aborted(self: Box<Self>) {
            self.1.lock().unwrap().push(format!("{} aborted", self.0));
        }
    }

    impl SendTicket for Other {
        fn placed(&mut self) {
            self.0.lock().unwrap().push(format!("other({}) placed", self.1));
        }
        fn aborted(self: Box<Self>) {
            self.0.lock().unwrap().push(format!("other({}) aborted", self.1));
        }
    }

    fn two(log: &Log) -> Tickets {
        let mut t = Tickets::default();
        t.get_or_insert(|| Named("a", log.clone()));
        t.get_or_insert(|| Other(log.clone(), 0)).1 += 1;
        // The same type again: the same ticket, not a new one.
        t.get_or_insert(|| Other(log.clone(), 100)).1 += 1;
        assert_eq!(t.len(), 2);
        t
    }

    fn taken(log: &Log) -> Vec<String> {
        std::mem::take(&mut *log.lock().unwrap())
    }

    #[test]
    fn sent_places_first_then_sends_in_order() {
        let log = Log::default();
        let mut t = two(&log);
        t.placed();
        t.placed();
        assert_eq!(taken(&log), ["a placed", "other(2) placed"]);
        t.sent();
        assert_eq!(taken(&log), ["a sent"]);
    }

    #[test]
    fn aborted_places_then_aborts_newest_first() {
        let log = Log::default();
        two(&log).aborted();
        assert_eq!(taken(&log), ["a placed", "other(2) placed", "other(2) aborted", "a aborted"]);
    }

    #[test]
    fn dropped_unsettled_aborts_once() {
        let log = Log::default();
        let mut t = two(&log);
        t.placed();
        drop(t);
        assert_eq!(taken(&log), ["a placed", "other(2) placed", "other(2) aborted", "a aborted"]);
    }
}
