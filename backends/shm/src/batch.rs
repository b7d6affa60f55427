//! Releases of the peer's leases, batched: queued as received tensors are dropped, pulled
//! by the pipe's writer when a batch is full or its delay is over ([`ShmOptions::release_batch`]).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ferry_core::ControlWaker;

use crate::ShmOptions;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Releases waiting to be sent.
pub(crate) struct Batcher {
    pub(crate) pending: Mutex<Pending>,
    /// Tells the pipe's writer that releases are due (or a batch began its delay).
    waker: ControlWaker,
    /// The pipe is gone: releases have nowhere to go.
    pub(crate) closed: AtomicBool,
    /// [`ShmOptions::release_batch`] (at least 1).
    batch: usize,
    /// [`ShmOptions::release_batch_bytes`].
    batch_bytes: u64,
    /// [`ShmOptions::release_delay`].
    delay: Duration,
}

/// Releases not sent yet.
#[derive(Default)]
pub(crate) struct Pending {
    ids: Vec<u64>,
    /// Bytes the leases in `ids` cover.
    bytes: u64,
    /// When the first of `ids` was queued (the batch's delay runs from it).
    since: Option<Instant>,
}

impl Pending {
    pub(crate) fn take(&mut self) -> Vec<u64> {
        self.bytes = 0;
        self.since = None;
        std::mem::take(&mut self.ids)
    }
}

impl Batcher {
    pub(crate) fn new(opts: &ShmOptions, waker: ControlWaker) -> Self {
        Batcher {
            pending: Mutex::default(),
            waker,
            closed: AtomicBool::new(false),
            batch: opts.release_batch.max(1),
            batch_bytes: opts.release_batch_bytes,
            delay: opts.release_delay,
        }
    }

    /// Queues the release of `lease` (counting `len` bytes toward the batch), waking the
    /// pipe's writer when it starts a batch (whose delay then runs) or makes the pending
    /// ones due.
    pub(crate) fn push(&self, lease: u64, len: usize) {
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        let mut pending = lock(&self.pending);
        let was_due = self.due(&pending);
        if pending.ids.is_empty() {
            pending.since = Some(Instant::now());
        }
        pending.ids.push(lease);
        pending.bytes = pending.bytes.saturating_add(len as u64);
        // The first starts the delay; a full batch ends it.
        let wake = pending.ids.len() == 1 || (!was_due && self.due(&pending));
        drop(pending);
        if wake {
            // A release may wait for the next write or the control task's tick: a
            // request-response caller's next send takes it along, with no wake-up.
            self.waker.wake_soon();
        }
    }

    /// Whether the pending releases are due now.
    pub(crate) fn due(&self, p: &Pending) -> bool {
        !p.ids.is_empty() && (p.ids.len() >= self.batch || p.bytes >= self.batch_bytes || self.delay.is_zero())
    }

    /// The pending releases if they are due at `now` (a full batch, or the delay over);
    /// else when they will be.
    pub(crate) fn poll(&self, now: Instant) -> Result<Vec<u64>, Option<Instant>> {
        let mut p = lock(&self.pending);
        let at = p.since.map(|t| t + self.delay);
        if self.due(&p) || (!p.ids.is_empty() && at.is_some_and(|t| t <= now)) {
            return Ok(p.take());
        }
        Err(if p.ids.is_empty() { None } else { at })
    }
}
