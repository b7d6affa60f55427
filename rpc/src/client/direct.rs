//! [`Client::call_raw_blocking`]: a call from a plain thread that sends and reads on that
//! thread, for a caller who waits anyway (a Python program's `client.call`).
//!
//! An async call is answered by the client's read loop (a task on the runtime): the
//! response wakes a runtime worker, which wakes the caller, two thread wake-ups (tens of
//! µs each on a busy or virtual machine). A blocking call instead sends with
//! [`Pipe::send_blocking_timeout`] and reads the pipe itself with [`Pipe::recv_blocking`],
//! which on a same-host ring spins for the answer as the wait policy allows
//! ([`ferry_core::spin`]: briefly, not on an overloaded machine) and then sleeps on the
//! ring's futex: an answer that comes within the spin costs no wake-up at all.
//!
//! - **The read loop stands aside** while blocking calls read: a caller counts itself in
//!   and nudges the loop, which drops its `recv` (cancel-safe) and waits until no
//!   blocking call has read for [`LINGER`] (a caller calling again within it finds the
//!   pipe free, with no nudge); then it reads again, so a close, or an async call's
//!   answer, is seen when no blocking call reads. A blocking call leaving while async
//!   calls wait makes it read again at once.
//! - **One reader at a time.** Blocking callers on several threads take turns: one reads
//!   and hands every response to its call (its own, another blocking caller's, an async
//!   call's); the others wait for theirs, and one of them takes over when the reader
//!   leaves.
//! - **Ending.** A read that fails ends the client as the read loop would: every call
//!   waiting fails with the reason.

use std::future::Future as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::Thread;
use std::time::{Duration, Instant};

use ferry_core::{Message, PipeError, Tensor};
use serde_json::Value;
use tokio::sync::Notify;
use tokio::sync::oneshot::{self, error::TryRecvError};

use super::{CallError, CallGuard, Client, Outcome, Shared, ended, received};
use crate::jsonrpc;

/// How long the read loop stays aside after the last blocking call read.
pub(super) const LINGER: Duration = Duration::from_millis(10);

/// The longest one read of a blocking caller lasts before it looks at its answer and its
/// deadline again (its answer, read by another thread, wakes it earlier).
const SLICE: Duration = Duration::from_millis(50);

/// The blocking callers' side of a client.
#[derive(Default)]
pub(super) struct Direct {
    /// Blocking calls under way.
    calls: AtomicUsize,
    /// Set by the read loop before it looks at `calls` and reads: a blocking call that
    /// begins then nudges it (a store and a load on each side, sequentially consistent: one
    /// of the two sees the other, so the loop never keeps reading under a blocking call).
    loop_reads: AtomicBool,
    /// Blocking calls that ended (the read loop takes the pipe back after a [`LINGER`]
    /// in which this did not change).
    ends: AtomicU64,
    /// Wakes the read loop: a blocking call began (drop the `recv`), or the last ended
    /// while async calls wait (read again).
    nudge: Notify,
    /// Held by the blocking caller that reads the pipe now.
    reading: Mutex<()>,
    /// Blocking callers waiting for another to read their answer (woken when it leaves).
    waiting: Mutex<Vec<Thread>>,
}

impl Direct {
    /// The read loop is about to read, unless blocking calls are under way (then it must
    /// stand aside): true when it may read.
    pub(super) fn loop_may_read(&self) -> bool {
        self.loop_reads.store(true, Ordering::SeqCst);
        if self.calls.load(Ordering::SeqCst) > 0 {
            self.loop_reads.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Whether blocking calls are under way.
    fn active(&self) -> bool {
        self.calls.load(Ordering::SeqCst) > 0
    }

    /// Resolves when the read loop is nudged ([`Direct::nudge`]).
    pub(super) async fn asked(&self) {
        self.nudge.notified().await;
    }
}

/// The read loop's wait while blocking calls read: until none is under way and none
/// ended for a [`LINGER`], or the last ended while async calls wait.
pub(super) async fn stand_aside(shared: &Shared) {
    let d = &shared.direct;
    let mut seen = d.ends.load(Ordering::Acquire);
    loop {
        tokio::select! {
            () = tokio::time::sleep(LINGER) => {}
            () = d.nudge.notified() => {}
        }
        let now = d.ends.load(Ordering::Acquire);
        if !d.active() && (now == seen || !shared.pending().is_empty()) {
            return;
        }
        seen = now;
    }
}

/// A blocking call counted in ([`Direct::calls`]) until dropped.
struct Counted<'a>(&'a Shared);

impl<'a> Counted<'a> {
    fn enter(shared: &'a Shared) -> Counted<'a> {
        let d = &shared.direct;
        d.calls.fetch_add(1, Ordering::SeqCst);
        if d.loop_reads.load(Ordering::SeqCst) {
            // The loop drops its `recv` (the pipe's receiver is then free for this thread).
            d.nudge.notify_one();
        }
        Counted(shared)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        let d = &self.0.direct;
        d.ends.fetch_add(1, Ordering::AcqRel);
        if d.calls.fetch_sub(1, Ordering::SeqCst) == 1 && !self.0.pending().is_empty() {
            // Async calls wait: the loop reads for them again now.
            d.nudge.notify_one();
        }
    }
}

impl Client {
    /// [`Client::call_raw`] for a plain thread: sends and waits for the answer on this
    /// thread (up to `timeout`; `None`: until it comes or the connection ends), reading
    /// the pipe itself with [`ferry_core::Pipe::recv_blocking`] (the client's read task
    /// stands aside meanwhile): a same-host ring's answer costs no thread wake-up when it
    /// comes within the wait policy's spin, a socket's one wake-up (this thread's). Calls
    /// from other threads and async calls may be in flight at once; answers go to their
    /// calls whoever reads them. A call that times out is cancelled on the server, as
    /// [`Client::call_raw`]'s. Unlike it, the send is bounded by `timeout` too: a request
    /// that cannot go out in time (a server that does not read) fails with
    /// [`CallError::Timeout`], nothing sent.
    ///
    /// Not for async tasks: it would hold a runtime worker while it waits.
    pub fn call_raw_blocking(
        &self,
        method: &str,
        params: Option<Value>,
        tensors: Vec<Tensor>,
        timeout: Option<Duration>,
    ) -> Result<(Value, Vec<Tensor>), CallError> {
        let shared = &self.shared;
        let deadline = timeout.and_then(|d| Instant::now().checked_add(d));
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, mut rx) = oneshot::channel();
        if shared.pending().insert(id, tx).is_err() {
            return Err(shared.closed());
        }
        let mut guard = CallGuard { shared: shared.clone(), id, armed: true };
        let _counted = Counted::enter(shared);
        let req = jsonrpc::request(Some(Value::from(id)), method, params);
        if let Err(e) = shared.pipe.send_blocking_timeout(Message::with_tensors(req, tensors), timeout) {
            guard.armed = false;
            if !e.is_closed() {
                shared.pending().remove(id);
                return Err(match e {
                    PipeError::Timeout(d, _) => CallError::Timeout(d),
                    e => CallError::Pipe(e),
                });
            }
            // The pipe ended: reading it gives the reason (the server's CLOSE frame, if it
            // sent one), which every waiter then gets. Take that rather than the bare write
            // error, waiting a moment for it.
            let soon = Instant::now() + Duration::from_secs(1);
            return match wait(shared, &mut rx, Some(soon)) {
                Some(Err(reason)) => Err(reason),
                _ => {
                    shared.pending().remove(id);
                    Err(CallError::Closed(e))
                }
            };
        }
        match wait(shared, &mut rx, deadline) {
            Some(r) => {
                guard.armed = false;
                r
            }
            // The guard, still armed, cancels the call on the server.
            None => Err(CallError::Timeout(timeout.unwrap_or_default())),
        }
    }
}

/// Waits for the answer in `rx`, reading the pipe while no other blocking caller does;
/// `None` at `deadline`.
fn wait(shared: &Arc<Shared>, rx: &mut oneshot::Receiver<Outcome>, deadline: Option<Instant>) -> Option<Outcome> {
    let d = &shared.direct;
    loop {
        match rx.try_recv() {
            Ok(r) => return Some(r),
            Err(TryRecvError::Closed) => return Some(Err(shared.closed())),
            Err(TryRecvError::Empty) => {}
        }
        let left = match deadline {
            Some(at) => match at.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => Some(left),
                _ => return None,
            },
            None => None,
        };
        let slice = left.map_or(SLICE, |l| l.min(SLICE));
        if let Ok(reading) = d.reading.try_lock() {
            // (Delivered between the look above and taking the turn: no read needed.)
            if let Ok(r) = rx.try_recv() {
                return Some(r);
            }
            match shared.pipe.recv_blocking(Some(slice)) {
                Ok(msg) => received(shared, msg),
                Err(PipeError::Timeout(_, "recv_blocking")) => {}
                Err(e) => ended(shared, e),
            }
            drop(reading);
            // Whoever waits for the reader takes over (or finds its answer).
            for t in std::mem::take(&mut *d.waiting.lock().unwrap_or_else(|e| e.into_inner())) {
                t.unpark();
            }
        } else {
            // Another caller reads: it hands this call its answer (waking this thread
            // through the receiver) or leaves (and wakes it).
            d.waiting.lock().unwrap_or_else(|e| e.into_inner()).push(std::thread::current());
            let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
            let polled = std::pin::Pin::new(&mut *rx).poll(&mut std::task::Context::from_waker(&waker));
            if let std::task::Poll::Ready(r) = polled {
                return Some(r.unwrap_or_else(|_| Err(shared.closed())));
            }
            if d.reading.try_lock().is_err() {
                std::thread::park_timeout(slice);
            }
        }
    }
}

/// Unparks the waiting caller's thread.
struct Unpark(Thread);

impl std::task::Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}
