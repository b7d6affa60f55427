//! Where the pipe's reader goes between its task and the threads that read on their own
//! ([`super::blocking`]'s blocking callers, [`super::follow`]'s followers): the slot it is
//! parked in, the asks, and the task's lingering wait before it takes it back.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex as StdMutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::sync::mpsc::{self, error::TryRecvError};

use crate::error::PipeError;
use crate::frame::FrameReader;
use crate::message::Message;

/// How long a reader parked by a blocking caller lies unused before the reader task takes
/// it back (so the next blocking call within it takes it without a wake-up).
pub(super) const LINGER: Duration = Duration::from_millis(10);

/// The longest a waiting caller sleeps before it looks at the queue again (a backstop: the
/// task wakes it when it queues a message or parks the reader).
pub(super) const RECHECK: Duration = Duration::from_millis(5);

/// Where the pipe's reader goes between its task and blocking callers.
#[derive(Default)]
pub(super) struct Handover {
    pub(super) slot: StdMutex<Slot>,
    /// Wakes a blocking caller: the reader is parked, a message was queued, or the task
    /// ended.
    pub(super) parked: Condvar,
    /// Wakes the reader task: a caller asks for the reader.
    pub(super) ask: Notify,
    /// Wakes the reader task parked in [`Handover::park`]: a handler's thread gave the
    /// reader back for the task to read at once ([`Handover::give_back_now`]).
    returned: Notify,
    /// Blocking callers waiting for the reader or reading with it.
    pub(super) wanted: AtomicUsize,
    /// A blocking caller took a message the task had queued ([`Handover::call_soon`]).
    pub(super) soon: AtomicBool,
    /// The task waits for something other than a CPU before its next wait (room in the
    /// queue, its handler, the rest of a frame from the peer): a caller must not wait for
    /// it to park the reader.
    pub(super) stuck: AtomicBool,
}

#[derive(Default)]
pub(super) struct Slot {
    /// The reader, when parked.
    pub(super) reader: Option<FrameReader>,
    /// How many times a caller parked it (the task takes it back after a [`LINGER`] in
    /// which this did not change: counting costs a caller no clock read).
    returns: u64,
    /// The task ended, or a caller's read closed the pipe: no reader will come.
    pub(super) ended: bool,
    /// A blocking caller has the reader (neither parked nor the task's).
    pub(super) lent: bool,
    /// How long the parked reader may lie unused before the task takes it back (zero:
    /// [`LINGER`]); set by whoever parked it.
    linger: Duration,
    /// Given back for the task to read at once ([`Handover::give_back_now`]): not lent
    /// again before the task has taken it.
    back_now: bool,
    /// A follower asked for the reader ([`Handover::lend_to_follower`]): parked for it
    /// with [`super::FOLLOW_LINGER`].
    follower_asked: bool,
    /// What the task waits for before it reads again: a handler called on a follower's
    /// thread paused the reads ([`super::Handled::Pause`]).
    pause: Option<Pause>,
    /// A message a follower read when the pipe had no handler any more: the task gives it
    /// on (to `recv`, or a new handler) before it reads again.
    held: Option<Message>,
}

/// What the reader task waits for before it reads again ([`super::Handled::Pause`]).
pub(super) type Pause = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

impl Handover {
    pub(super) fn lock(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// True while a blocking caller wants the reader, or will soon (the task: give it up at
    /// the next wait).
    pub(super) fn wanted(&self) -> bool {
        self.wanted.load(Ordering::Acquire) > 0 || self.soon.load(Ordering::Acquire)
    }

    /// A blocking caller took a message that the task had read and queued: the task parks
    /// the reader at its next wait, so that the caller's next call reads on its own thread.
    /// Without this, a caller that always found the next message queued never asked for the
    /// reader, and every message took the task's wake-up and a hand-over through the queue
    /// (measured in Python: a fresh pair's 64 B round trips took 62-75 µs for their first
    /// 10-40 messages, against 5 µs once the caller read itself).
    ///
    /// A reader already parked needs no ask: the next call takes it from the slot.
    pub(super) fn call_soon(&self) {
        if self.lock().reader.is_none() && !self.soon.swap(true, Ordering::AcqRel) {
            self.ask.notify_one();
        }
    }

    /// Resolves when a caller asks for the reader (maybe one that no longer wants it:
    /// check [`Handover::wanted`]).
    pub(super) async fn asked(&self) {
        self.ask.notified().await;
    }

    /// The task queued a message: a waiting caller takes it.
    pub(super) fn queued(&self) {
        if self.wanted() {
            let _slot = self.lock();
            self.parked.notify_all();
        }
    }

    /// The parked reader if it is there now, or what the queue holds first (a message the
    /// task queued before it parked the reader comes before anything the reader reads);
    /// `None`: neither (the caller asks for the reader and waits).
    pub(super) fn take_parked(&self, rx: &mut mpsc::Receiver<Result<Message, PipeError>>) -> Option<Took> {
        let mut slot = self.lock();
        slot.reader.as_ref()?;
        match rx.try_recv() {
            Ok(r) => return Some(Took::Queued(r)),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) => {}
        }
        slot.lend().map(Took::Reader)
    }

    /// The task may wait for something other than a CPU before its next wait (`true`), or
    /// not any more.
    pub(super) fn set_stuck(&self, stuck: bool) {
        self.stuck.store(stuck, Ordering::Release);
    }

    /// A follower's thread gives the reader back for the task to read at once (no message
    /// came for it, its handler paused the reads (`pause`, which the task waits for first),
    /// or it read a message for a handler that is gone (`held`, which the task gives on)).
    pub(super) fn give_back_now(&self, reader: FrameReader, pause: Option<Pause>, held: Option<Message>) {
        let mut slot = self.lock();
        slot.give_back_for(reader, LINGER);
        // Nobody takes it before the task (`lend`): nothing here is overwritten.
        slot.back_now = true;
        slot.pause = pause;
        slot.held = held;
        drop(slot);
        self.returned.notify_one();
    }

    /// What a follower left for the task with the reader ([`Handover::give_back_now`]).
    pub(super) fn take_returned(&self) -> (Option<Pause>, Option<Message>) {
        let mut slot = self.lock();
        (slot.pause.take(), slot.held.take())
    }

    /// The reader for a follower ([`Pipe::serve_next_blocking`]): the parked one, or the
    /// task's, asked for and waited for until `deadline`. Another thread's is left to it.
    pub(super) fn lend_to_follower(&self, deadline: Instant) -> Result<FrameReader, super::Served> {
        use super::Served;
        let mut slot = self.lock();
        if slot.ended {
            return Err(Served::Ended);
        }
        if let Some(r) = slot.lend() {
            return Ok(r);
        }
        if slot.lent {
            return Err(Served::Busy);
        }
        self.wanted.fetch_add(1, Ordering::AcqRel);
        slot.follower_asked = true;
        self.ask.notify_one();
        let got = loop {
            if let Some(r) = slot.lend() {
                break Ok(r);
            }
            if slot.ended {
                break Err(Served::Ended);
            }
            if slot.lent {
                // Another follower got it first.
                break Err(Served::Busy);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break Err(Served::Busy);
            }
            slot = self.parked.wait_timeout(slot, left.min(RECHECK)).unwrap_or_else(|e| e.into_inner()).0;
        };
        // Under the lock: a task that parks the reader after this sees that nobody wants it
        // and keeps it ([`Handover::park`]).
        self.wanted.fetch_sub(1, Ordering::AcqRel);
        if got.is_err() {
            slot.follower_asked = false;
        }
        got
    }

    /// The task ended: waiting callers stop waiting for the reader.
    pub(super) fn end(&self) {
        let mut slot = self.lock();
        slot.ended = true;
        slot.reader = None;
        self.parked.notify_all();
    }

    /// The task parks its reader for the callers that want it, and takes it back once it
    /// has lain unused for [`LINGER`]; `None`: the pipe ended meanwhile. `drain` handles
    /// the CONTROL frames already in the link as the task takes it back, under the lock a
    /// blocking send's [`Pipe::controls_now`] takes: a release that came while it lay parked
    /// is handled before that send can look (or the error it met, to end the pipe with).
    pub(super) async fn park(
        &self,
        reader: FrameReader,
        mut drain: impl FnMut(&mut FrameReader) -> Result<(), PipeError>,
    ) -> Option<Result<FrameReader, PipeError>> {
        let mut seen = {
            let mut slot = self.lock();
            if slot.ended {
                return None;
            }
            if self.wanted.load(Ordering::Acquire) == 0 && !self.soon.load(Ordering::Acquire) {
                // The caller that asked gave up meanwhile (under this lock): nobody to park
                // it for, and a reader parked for nobody would lie unread for a LINGER.
                return Some(Ok(reader));
            }
            slot.reader = Some(reader);
            slot.lent = false;
            // Parked for a follower: its requests' jobs run while it lies here, and
            // requests that come meanwhile wait for the task to take it back.
            slot.linger = if std::mem::take(&mut slot.follower_asked) { super::FOLLOW_LINGER } else { LINGER };
            self.soon.store(false, Ordering::Release);
            self.parked.notify_all();
            slot.returns
        };
        loop {
            let linger = self.lock().linger;
            tokio::select! {
                () = tokio::time::sleep(if linger.is_zero() { LINGER } else { linger }) => {}
                () = self.returned.notified() => {}
            }
            let mut slot = self.lock();
            if slot.ended {
                return None;
            }
            // Unused for a whole linger: no caller parked it since the last look. (Only
            // callers that wait count here: a `soon` set while the reader lay parked asked
            // for what was already there.) Or given back for the task to read now.
            let now = std::mem::take(&mut slot.back_now);
            let idle = slot.returns == seen;
            seen = slot.returns;
            // A reader given back for the task is its own, whoever waits (they ask again).
            if (now || (self.wanted.load(Ordering::Acquire) == 0 && idle)) && slot.reader.is_some() {
                self.soon.store(false, Ordering::Release);
                let mut reader = slot.reader.take()?;
                return Some(drain(&mut reader).map(|()| reader));
            }
        }
    }
}

impl Slot {
    /// The parked reader, for a blocking caller.
    /// Not one given back for the task ([`Handover::give_back_now`]): that one goes to the
    /// task first, with the pause or message left for it.
    pub(super) fn lend(&mut self) -> Option<FrameReader> {
        if self.back_now {
            return None;
        }
        let r = self.reader.take();
        self.lent |= r.is_some();
        r
    }

    /// A blocking caller parks the reader again.
    pub(super) fn give_back(&mut self, reader: FrameReader) {
        self.give_back_for(reader, LINGER);
    }

    /// [`Slot::give_back`], for the task to take back after `linger` unused.
    pub(super) fn give_back_for(&mut self, reader: FrameReader, linger: Duration) {
        self.reader = Some(reader);
        self.lent = false;
        self.linger = linger;
        self.returns = self.returns.wrapping_add(1);
    }
}

/// What a blocking caller got while it waited for the reader.
pub(super) enum Took {
    Reader(FrameReader),
    Queued(Result<Message, PipeError>),
}

/// Counts a caller out of [`Handover::wanted`] however its call ends.
pub(super) struct Unwant<'a>(pub(super) &'a Handover);

impl Drop for Unwant<'_> {
    fn drop(&mut self) {
        self.0.wanted.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader over nothing (the hand-over never reads it).
    fn reader() -> FrameReader {
        FrameReader::new(Box::new(tokio::io::empty()), None, crate::wire::Limits::default())
    }

    /// A caller that took a message the task had queued asks for the reader without
    /// waiting for it: the task, asked, parks the reader at its next wait (the caller's
    /// next call takes it from the slot), and takes it back after a [`LINGER`] unused.
    #[tokio::test]
    async fn a_caller_served_from_the_queue_gets_the_reader_next_time() {
        let h = std::sync::Arc::new(Handover::default());
        assert!(!h.wanted(), "nobody asked");
        h.call_soon();
        assert!(h.wanted(), "the task gives the reader up at its next wait");
        // The task's wait ends: it was asked.
        tokio::time::timeout(Duration::from_secs(10), h.asked()).await.expect("the task is asked");
        h.call_soon(); // a second take before the task parked: no second ask needed
        let task = {
            let h = h.clone();
            tokio::spawn(async move { h.park(reader(), |_| Ok(())).await.is_some_and(|r| r.is_ok()) })
        };
        // Parked: the caller's next call finds it there (bounded wait for the task to run).
        let (tx, mut rx) = mpsc::channel(1);
        let mut took = None;
        for _ in 0..1000 {
            match h.take_parked(&mut rx) {
                Some(Took::Reader(r)) => {
                    took = Some(r);
                    break;
                }
                Some(Took::Queued(_)) => panic!("nothing was queued"),
                None => tokio::time::sleep(Duration::from_millis(1)).await,
            }
        }
        let r = took.expect("the task parked the reader for the caller");
        assert!(!h.wanted(), "parking answered the ask");
        // The caller parks it again when done (as `recv_blocking` does); unused for a
        // LINGER, the task takes it back.
        {
            h.lock().give_back(r);
        }
        let back = tokio::time::timeout(Duration::from_secs(10), task).await.expect("the task ends").expect("join");
        assert!(back, "the task has its reader back");
        drop(tx);
    }
}
