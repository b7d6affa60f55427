//! The Python server's answers, polled on the thread that wakes them.
//!
//! A sync handler ends on a pool thread by sending its outcome to the answer (the call's
//! future, then writing its response). With `tokio::spawn`, that send wakes a runtime
//! worker to poll the answer and write: a thread wake-up per call, a quarter of a trivial
//! call's time on a small machine. Here the pool thread polls the answer itself right after
//! its job ([`run_deferred`]) and writes the response (within the runtime's context: the
//! runtime's I/O driver registers anything that must wait). Woken anywhere else (a
//! cancellation, a timer, the socket becoming writable, an async handler's outcome from the
//! asyncio loop), the answer is polled on the runtime, as a spawned task would be. A
//! cancelled call is answered at once as before: the handler's thread does not hold it.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::task::{Context, Poll, Wake, Waker};

use pyo3::prelude::*;

use crate::runtime;

type Answer = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The server's [`ferry_rpc::Spawner`].
pub fn spawner() -> ferry_rpc::Spawner {
    Arc::new(|answer| {
        let task = Arc::new(Task { answer: Mutex::new(Some(answer)), woken: AtomicBool::new(true) });
        // First polled where it starts, on the connection's reader: a Python handler's
        // answer only looks whether its job is done (the job was queued before).
        task.poll();
        // It runs on the handler's threads: the reader may busy-poll for the next call.
        true
    })
}

thread_local! {
    /// Set on a pool thread while it delivers a job's outcome: wakes then are deferred.
    static DEFER: Cell<bool> = const { Cell::new(false) };
    static DEFERRED: RefCell<Vec<Arc<Task>>> = const { RefCell::new(Vec::new()) };
}

/// Runs `deliver` (a job sending its outcome) so that the answers it wakes are polled on
/// this thread by the next [`run_deferred`] instead of on the runtime.
pub fn delivering<R>(deliver: impl FnOnce() -> R) -> R {
    DEFER.with(|d| d.set(true));
    let r = deliver();
    DEFER.with(|d| d.set(false));
    r
}

/// Polls the answers woken by [`delivering`] on this thread, the GIL released.
pub fn run_deferred(py: Python<'_>) {
    let tasks = DEFERRED.with(|d| std::mem::take(&mut *d.borrow_mut()));
    if tasks.is_empty() {
        return;
    }
    py.detach(|| {
        let _rt = runtime().enter();
        for t in tasks {
            t.poll();
        }
    });
}

/// One answer.
struct Task {
    /// `None` once it finished.
    answer: Mutex<Option<Answer>>,
    /// Woken since its last poll started.
    woken: AtomicBool,
}

impl Task {
    /// Polls it unless another thread is polling it now (that one polls again: it sees
    /// `woken`, set before this was called).
    fn poll(self: &Arc<Self>) {
        loop {
            let mut slot = match self.answer.try_lock() {
                Ok(slot) => slot,
                Err(TryLockError::WouldBlock) => return,
                // A poll panicked: the answer cannot be polled again, drop it (its call
                // is then answered by no one; its caller's timeout or close ends it).
                Err(TryLockError::Poisoned(p)) => {
                    *p.into_inner() = None;
                    return;
                }
            };
            self.woken.store(false, Ordering::SeqCst);
            if let Some(answer) = slot.as_mut() {
                let waker = Waker::from(self.clone());
                if let Poll::Ready(()) = answer.as_mut().poll(&mut Context::from_waker(&waker)) {
                    *slot = None;
                }
            }
            drop(slot);
            if !self.woken.load(Ordering::SeqCst) {
                return;
            }
        }
    }
}

impl Wake for Task {
    fn wake(self: Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        if DEFER.with(Cell::get) {
            DEFERRED.with(|d| d.borrow_mut().push(self));
        } else {
            runtime().spawn(async move { self.poll() });
        }
    }
}
