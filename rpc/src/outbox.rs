//! Answers not yet written, bounded per connection.
//!
//! Every answer a connection gets (results, errors, parse errors, cancellations, over-limit
//! refusals) holds a [`Ticket`] from the moment its request is read until its response is
//! written (or dropped): one answer, and the bytes of its response once they are known.
//! When a connection holds [`crate::RpcLimits::max_queued_answers`] answers or
//! [`crate::RpcLimits::max_queued_answer_bytes`] bytes, its reader stops reading until
//! answers leave: a client that sends calls and never reads their answers fills its own
//! socket, not the server's memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::sync::Notify;

/// One connection's answers not yet written.
pub(crate) struct Outbox {
    answers: AtomicUsize,
    bytes: AtomicU64,
    room: Notify,
    max_answers: usize,
    max_bytes: u64,
}

impl Outbox {
    pub(crate) fn new(max_answers: usize, max_bytes: u64) -> Arc<Outbox> {
        Arc::new(Outbox {
            answers: AtomicUsize::new(0),
            bytes: AtomicU64::new(0),
            room: Notify::new(),
            max_answers: max_answers.max(1),
            max_bytes: max_bytes.max(1),
        })
    }

    /// Counts one more answer (for a request just read).
    pub(crate) fn ticket(self: &Arc<Self>) -> Ticket {
        self.answers.fetch_add(1, Ordering::AcqRel);
        Ticket { outbox: self.clone(), bytes: 0 }
    }

    /// Whether the reader must wait for [`Outbox::room`] before reading on.
    pub(crate) fn full(&self) -> bool {
        self.answers.load(Ordering::Acquire) >= self.max_answers || self.bytes.load(Ordering::Acquire) >= self.max_bytes
    }

    /// Waits until the connection is below both bounds.
    pub(crate) async fn room(&self) {
        while self.full() {
            // `notify_one` keeps a wake-up for a later `notified`: none is lost between
            // the check and the wait.
            self.room.notified().await;
        }
    }
}

/// One answer counted in its connection's [`Outbox`], until dropped.
pub(crate) struct Ticket {
    outbox: Arc<Outbox>,
    bytes: u64,
}

impl Ticket {
    /// Counts the response's bytes (known once it is encoded).
    pub(crate) fn add_bytes(&mut self, n: u64) {
        self.outbox.bytes.fetch_add(n, Ordering::AcqRel);
        self.bytes += n;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.outbox.answers.fetch_sub(1, Ordering::AcqRel);
        self.outbox.bytes.fetch_sub(self.bytes, Ordering::AcqRel);
        self.outbox.room.notify_one();
    }
}

/// The length of `v` as compact JSON, without keeping the text.
pub(crate) fn json_len(v: &serde_json::Value) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len() as u64;
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    // Writing a `Value` into a sink that never fails cannot fail.
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn full_by_count_or_bytes_and_room_when_tickets_go() {
        let o = Outbox::new(2, 100);
        let a = o.ticket();
        assert!(!o.full());
        let mut b = o.ticket();
        assert!(o.full(), "two answers of two");
        drop(a);
        assert!(!o.full());
        b.add_bytes(100);
        assert!(o.full(), "100 bytes of 100");
        let waiter = tokio::spawn({
            let o = o.clone();
            async move { o.room().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(b);
        tokio::time::timeout(std::time::Duration::from_secs(10), waiter).await.unwrap().unwrap();
        assert!(!o.full());
    }

    #[test]
    fn json_len_is_the_compact_length() {
        let v = serde_json::json!({"jsonrpc": "2.0", "result": [1, 2.5, "x"], "id": 7});
        assert_eq!(json_len(&v), serde_json::to_vec(&v).unwrap().len() as u64);
    }
}
