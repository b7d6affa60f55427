//! The blocking fast path (issue 22, point 2): [`Pipe::recv_blocking`] and
//! [`Pipe::send_blocking`] for a request-response caller on a plain thread, who wants the
//! latency that a runtime wake-up (microseconds by itself) would cost.
//!
//! A pipe's frames are read by its reader task. A blocking caller instead reads them on its
//! own thread: it takes the pipe's [`FrameReader`] over (leader/follower), reads until a
//! message comes (handling CONTROL frames on the way, as the task would), and parks the
//! reader again. On a same-host ring the caller polls the ring itself while the wait
//! policy allows ([`crate::spin`]: at most `ferry_ring::RingOptions::spin`, not on an
//! overloaded machine), so an answer arriving within it costs no system call and no wake-up at all; past it, the caller sleeps on the socket
//! (the ring's doorbell) like the task would.
//!
//! The hand-over:
//!
//! - **Asking.** The caller counts itself in `wanted` and notifies the task. The task
//!   gives the reader up only between frames, at its wait for the next one
//!   ([`FrameReader::wait_readable`], which is cancel-safe), after it has queued every
//!   message read before: a caller first takes what is queued, then reads, so messages are
//!   received in order.
//! - **Lingering.** A caller parks the reader in the slot, not back in the task: the next
//!   call takes it from there without a wake-up. The task takes it back once it has lain
//!   unused for [`super::handover::LINGER`] (so CONTROL frames, a CLOSE or the peer's death are read then,
//!   when no caller is reading), and waits as before.
//! - **Ending.** An error a caller reads closes the pipe as the task would (with a CLOSE
//!   to a peer at fault); the task then ends too. A task that ends wakes waiting callers.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{self, error::TryRecvError};

use crate::error::PipeError;
use crate::frame::{FrameReader, WaitSpin};
use crate::message::Message;
use crate::transport::{Half, Readiness};

use super::handover::{RECHECK, Took, Unwant};
use super::write::Now;
use super::{Pipe, read};

/// A tensor this large may take a slot in a channel's pool (the shm channel sends smaller
/// ones inline): a blocking send of one first handles the releases already waiting
/// ([`Pipe::controls_now`]).
const POOL_SIZED: usize = 16 << 10;

impl Pipe {
    /// [`Pipe::recv`] for a plain thread: waits on this thread (up to `timeout`; `None`:
    /// until a message comes or the pipe ends) and reads the pipe's frames itself, so that
    /// an answer costs no runtime wake-up. On a same-host ring
    /// ([`crate::EndpointBuilder::link`], `ferry_ring::RingExt::ring`) it polls the ring while the wait policy allows
    /// ([`crate::spin`]) before it sleeps: a peer answering within it is received with no system call.
    ///
    /// Messages arrive in order with those [`Pipe::recv`] gets (both may be used on one
    /// pipe). After a blocking call the reader stays with this thread's side for a few
    /// milliseconds (10 ms: the next call takes it without a wake-up); the pipe's task
    /// reads again after that. A pipe with a handler ([`Pipe::set_handler`]) gives its
    /// messages to the handler: `recv_blocking` on it is an error.
    ///
    /// Not for async tasks: it would hold a runtime worker while it waits (use
    /// [`Pipe::recv`] there, or call this from `tokio::task::spawn_blocking`).
    pub fn recv_blocking(&self, timeout: Option<Duration>) -> Result<Message, PipeError> {
        let deadline = timeout.map(|d| Instant::now().checked_add(d).unwrap_or_else(far_future));
        let timed_out = || PipeError::Timeout(timeout.unwrap_or_default(), "recv_blocking");
        let mut rx = match self.rx.try_lock() {
            Some(rx) => rx,
            None => self.run_here(self.rx.lock()),
        };
        if let Ok(r) = rx.try_recv() {
            self.shared.handover.call_soon();
            return r;
        }
        if self.shared.has_handler.load(Ordering::Acquire) {
            return Err(PipeError::ApiMisuse(
                "recv_blocking on a pipe with a handler (set_handler): the handler gets its messages".into(),
            ));
        }
        let h = &self.shared.handover;
        // The reader parked by the last call, when it is still there (the common case of a
        // caller calling again within LINGER): taken with no ask and no count.
        let parked = match h.take_parked(&mut rx) {
            Some(Took::Reader(r)) => Some(r),
            Some(Took::Queued(r)) => return r,
            None => None,
        };
        let _unwant;
        let mut reader = match parked {
            Some(r) => r,
            None => {
                h.wanted.fetch_add(1, Ordering::AcqRel);
                _unwant = Unwant(h);
                h.ask.notify_one();
                match self.take_reader(&mut rx, deadline) {
                    Some(Took::Reader(r)) => r,
                    Some(Took::Queued(r)) => {
                        h.call_soon();
                        return r;
                    }
                    None => return Err(timed_out()),
                }
            }
        };
        let shared = &*self.shared;
        let got = self.read_message_here(&mut reader, deadline, timed_out);
        match got {
            Err(PipeError::Timeout(_, "recv_blocking")) | Ok(_) => {
                h.lock().give_back(reader);
                got
            }
            Err(e) => {
                drop(reader);
                self.run_here(read::end_with(shared, &e));
                h.end();
                Err(e)
            }
        }
    }

    /// Reads with `reader` (lent to this thread) until a message comes, handling CONTROL
    /// frames on the way, or `deadline` passes (`timed_out`'s error).
    pub(super) fn read_message_here(
        &self,
        reader: &mut FrameReader,
        deadline: Option<Instant>,
        timed_out: impl Fn() -> PipeError,
    ) -> Result<Message, PipeError> {
        let shared = &*self.shared;
        // A packed message within the first slice is read here, with no future at all.
        let control = |frame| read::control_frame(shared, frame);
        let now = self
            .recv_direct(reader, deadline, &timed_out)
            .or_else(|| reader.packed_now(deadline, control, |record| read::unpack(shared, record)));
        now.unwrap_or_else(|| {
            loop {
                let ready = self.run_here(async {
                    let waits_itself = reader.waits_for_deadlines();
                    let wait = reader.wait_readable(WaitSpin::Blocking(deadline));
                    match deadline {
                        Some(d) if !waits_itself => tokio::time::timeout_at(d.into(), wait).await.unwrap_or(Ok(false)),
                        _ => wait.await,
                    }
                })?;
                if !ready {
                    return Err(timed_out());
                }
                // A frame the ring diverted to the socket (larger than a ring record) is
                // read on this thread, driven ([`Pipe::run_driven`]).
                let read = self.run_driven(Half::Read, std::pin::pin!(reader.read_frame()))?;
                if let Some(msg) = self.run_here(std::pin::pin!(read::handle_read(shared, read)))? {
                    return Ok(msg);
                }
            }
        })
    }

    /// [`Pipe::send`] for a plain thread: sends on this thread (a write into a same-host
    /// ring, or to the socket), with no runtime wake-up when it does not have to wait.
    ///
    /// Not for async tasks, as [`Pipe::recv_blocking`].
    pub fn send_blocking(&self, msg: Message) -> Result<(), PipeError> {
        self.send_blocking_timeout(msg, None)
    }

    /// [`Pipe::send_blocking`] that waits at most `timeout` (`None`: until the message is
    /// out or the pipe ends) for a peer that does not read: past it, a
    /// [`PipeError::Timeout`], as [`Pipe::send_timeout`] says (nothing was sent and the pipe
    /// stays open, unless the write was cut part-way through a frame on the socket). A peer
    /// that dies while the send waits fails it with [`PipeError::PeerGone`].
    pub fn send_blocking_timeout(&self, msg: Message, timeout: Option<Duration>) -> Result<(), PipeError> {
        let deadline = timeout.map(|d| Instant::now().checked_add(d).unwrap_or_else(far_future));
        self.send_blocking_inner(msg, deadline, timeout).map_err(|e| self.shared.send_error(e))
    }

    fn send_blocking_inner(
        &self,
        msg: Message,
        deadline: Option<Instant>,
        timeout: Option<Duration>,
    ) -> Result<(), PipeError> {
        self.check_send(&msg)?;
        if msg.tensors.iter().any(|t| t.as_bytes().len() >= POOL_SIZED) {
            self.controls_now(deadline);
        }
        let Some(mut order) = self.shared.send_order.try_lock() else {
            return self.run_driven(Half::Write, within(deadline, timeout, std::pin::pin!(self.send_inner(msg))));
        };
        let scratch = &mut *order;
        let mut out = crate::channel::Outgoing::default();
        match self.encode_now_into(&msg, &mut out, &mut scratch.locs) {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                out.abort();
                scratch.locs.clear();
                return Err(e);
            }
            None => {
                scratch.locs.clear();
                drop(order);
                return self.run_driven(Half::Write, within(deadline, timeout, std::pin::pin!(self.send_inner(msg))));
            }
        }
        if !self.shared.pack(&msg, &scratch.locs, &mut scratch.record) {
            let locs = std::mem::take(&mut scratch.locs);
            // Pinned where it is made: the future (a few KiB) is not copied into each wrapper.
            let send = std::pin::pin!(self.send_encoded(msg, locs, out, &mut scratch.record));
            return self.run_driven(Half::Write, within(deadline, timeout, send));
        }
        // The frame (its payload parts) and the locations are freed after the record is
        // out, not before: off the way of the answer.
        let (frame, tickets) = out.finish(Vec::new());
        let record = &scratch.record;
        let run = |f: std::pin::Pin<&mut dyn Future<Output = Result<(), PipeError>>>| {
            self.run_here(within(deadline, timeout, f))
        };
        let r = match self.shared.try_write_packed_now(record, msg, tickets, run) {
            Now::Done(r) => r,
            Now::Busy(msg, tickets) => {
                self.run_here(within(deadline, timeout, std::pin::pin!(self.shared.write_packed(record, msg, tickets))))
            }
        };
        scratch.clear_and_trim();
        drop(frame);
        r
    }

    /// Before a blocking send that may take memory from a channel's pool: the CONTROL
    /// frames already waiting in the parked reader's link (the peer's releases of the leases
    /// the last answer named, which the peer writes right behind that answer) are handled
    /// now. Otherwise they would wait for this caller's next receive (or the reader task,
    /// after [`LINGER`]), and the send would find the memory they free still leased: a
    /// caller that sends and receives in turn would use two pool slots where one does (on
    /// a 2-vCPU VM, a 24.9 MB copy-in round trip over the ring took 1.1x the socket's).
    ///
    /// A reader the task was asked to park ([`Handover::call_soon`]: this caller's last
    /// receive took a message the task had queued) is waited for, up to `deadline`, while
    /// the task needs only a CPU to park it; on a busy machine the task may not have run
    /// since it queued the answer, with the release behind it still in the link. A reader
    /// another caller has, or the task keeps (nobody asked, or it waits for room in the
    /// queue, for its handler or for the rest of a frame) is left alone: the task handles
    /// what it reads.
    fn controls_now(&self, deadline: Option<Instant>) {
        let h = &self.shared.handover;
        let shared = &*self.shared;
        let r = {
            let mut slot = h.lock();
            let reader = loop {
                if let Some(reader) = slot.reader.as_mut() {
                    break reader;
                }
                if slot.ended || slot.lent || !h.soon.load(Ordering::Acquire) || h.stuck.load(Ordering::Acquire) {
                    return;
                }
                let mut wait = RECHECK;
                if let Some(d) = deadline {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return;
                    }
                    wait = wait.min(left);
                }
                slot = h.parked.wait_timeout(slot, wait).unwrap_or_else(|e| e.into_inner()).0;
            };
            reader.controls_now(|frame| read::control_frame(shared, frame))
        };
        if let Err(e) = r {
            // As a blocking read that meets a bad frame: the pipe closes.
            h.lock().reader = None;
            self.run_here(read::end_with(shared, &e));
            h.end();
        }
    }

    /// Runs `f` to its end on this thread, in the pipe's runtime's context (its I/O and
    /// timers), parking the thread while `f` waits. Cheaper than
    /// `tokio::runtime::Handle::block_on`, which seeds a random number generator from a
    /// lock the runtime shares and sets up a blocking region on every call (a third of a
    /// blocking round trip's CPU time, measured): a future that ends at its first poll
    /// (a write into the ring, a record already there) costs a poll and a context switch
    /// of a thread-local.
    pub(super) fn run_here<F: Future>(&self, f: F) -> F::Output {
        let _context = self.handle.enter();
        self.run_here_entered(f)
    }

    /// [`Pipe::run_here`] for a caller already in the runtime's context
    /// (`self.handle.enter()`), which a caller running several futures enters once.
    pub(super) fn run_here_entered<F: Future>(&self, f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        THREAD_WAKER.with(|waker| {
            let mut cx = std::task::Context::from_waker(waker);
            loop {
                if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                    return v;
                }
                // A wake that came before this park is kept (the thread's token): none is lost.
                std::thread::park();
            }
        })
    }

    /// [`Pipe::run_here`] for a future that moves a frame through the socket (reads one, or
    /// writes one): while it waits, this thread waits for the socket itself
    /// ([`crate::DirectRead::wait_readable`] / [`crate::DirectRead::wait_writable`]) with
    /// the socket driven ([`crate::DirectRead::drive`]), so that each socket buffer's worth
    /// of a large frame costs one wake-up of this thread by the kernel, not two (the
    /// runtime's I/O thread, then this one).
    ///
    /// - The waits are [`DRIVEN_SLICE`]s: a timer the future also holds (a frame's time
    ///   limit, a send's deadline) is seen at the next slice at the latest.
    /// - A future that still waits although the socket is ready waits for something else
    ///   (room in a ring or a pool): it is then polled undriven and this thread parks until
    ///   it is woken, as [`Pipe::run_here`] does.
    /// - Without a direct wait (no unix socket), a closed pipe's interrupted waits, or a
    ///   failed one: [`Pipe::run_here`].
    pub(super) fn run_driven<F: Future>(&self, half: Half, f: F) -> F::Output {
        let _context = self.handle.enter();
        self.run_driven_entered(half, f)
    }

    /// [`Pipe::run_driven`] for a caller already in the runtime's context.
    pub(super) fn run_driven_entered<F: Future>(&self, half: Half, f: F) -> F::Output {
        let Some(direct) = self.shared.direct.as_deref() else { return self.run_here_entered(f) };
        let mut f = std::pin::pin!(f);
        let undrive = Undrive(direct, half);
        THREAD_WAKER.with(|waker| {
            let mut cx = std::task::Context::from_waker(waker);
            let mut driven = true;
            loop {
                direct.drive(half, driven);
                WOKEN.set(false);
                if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                    drop(undrive);
                    return v;
                }
                if driven && WOKEN.get() {
                    // It woke itself while polled (a yield: a large frame's read yields
                    // every MiB for the runtime's other tasks): it has more to do now, and
                    // this thread is its own. Taken for a wait on the socket, which the
                    // peer keeps filling, the look below found the socket ready and sent
                    // the rest of the frame through the runtime's thread (two wake-ups per
                    // socket buffer; counted under load: about 6 times per 24.9 MB frame).
                    continue;
                }
                if !driven {
                    std::thread::park();
                    driven = true;
                    continue;
                }
                let wait = |until: Instant| match half {
                    Half::Read => Some(direct.wait_readable(Some(until))),
                    Half::Write => direct.wait_writable(Some(until)),
                };
                // First a look (a deadline of now): a socket ready already, which the
                // driven poll did not take, means the future waits for something else.
                // Undriven, the socket's runtime registration is back for whatever it does
                // next, and this thread parks until it is woken.
                driven = match wait(Instant::now()) {
                    Some(Ok(Readiness::Deadline)) => {
                        matches!(
                            wait(Instant::now() + DRIVEN_SLICE),
                            Some(Ok(Readiness::Readable | Readiness::Deadline))
                        )
                    }
                    _ => false,
                };
            }
        })
    }

    /// Waits for the parked reader, or a queued message (which comes first); `None` at the
    /// deadline.
    fn take_reader(
        &self,
        rx: &mut mpsc::Receiver<Result<Message, PipeError>>,
        deadline: Option<Instant>,
    ) -> Option<Took> {
        let h = &self.shared.handover;
        let mut slot = h.lock();
        loop {
            match rx.try_recv() {
                Ok(r) => return Some(Took::Queued(r)),
                Err(TryRecvError::Disconnected) => return Some(Took::Queued(Err(self.shared.closed_error()))),
                Err(TryRecvError::Empty) => {}
            }
            if let Some(r) = slot.lend() {
                return Some(Took::Reader(r));
            }
            if slot.ended {
                return Some(Took::Queued(Err(self.shared.closed_error())));
            }
            let mut wait = RECHECK;
            if let Some(d) = deadline {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return None;
                }
                wait = wait.min(left);
            }
            slot = h.parked.wait_timeout(slot, wait).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// Unparks the thread that made it ([`Pipe::run_here`]'s waker).
struct Unpark(std::thread::Thread);

impl std::task::Wake for Unpark {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        // Said on the thread that wakes: the one polling, when its future yields. (A
        // blocking caller waking another's future while polling its own costs its own one
        // poll more.)
        WOKEN.set(true);
        self.0.unpark();
    }
}

thread_local! {
    /// A wake of a [`Pipe::run_here`] waker was made on this thread (by the future
    /// [`Pipe::run_driven`] polls, when it yields).
    static WOKEN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// This thread's waker for [`Pipe::run_here`].
    static THREAD_WAKER: std::task::Waker =
        std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
}

/// The longest one wait of [`Pipe::run_driven`] lasts before the future is polled again
/// (for the timers it holds).
const DRIVEN_SLICE: Duration = Duration::from_millis(5);

/// Gives the socket back to the runtime's watch however a driven future ends (a panic
/// included).
struct Undrive<'a>(&'a dyn crate::DirectRead, Half);

impl Drop for Undrive<'_> {
    fn drop(&mut self) {
        self.0.drive(self.1, false);
    }
}

/// `f`, given up at `deadline` with [`PipeError::Timeout`] (`timeout` is what it says).
async fn within<F: Future<Output = Result<(), PipeError>>>(
    deadline: Option<Instant>,
    timeout: Option<Duration>,
    f: F,
) -> Result<(), PipeError> {
    match deadline {
        None => f.await,
        Some(d) => tokio::time::timeout_at(d.into(), f)
            .await
            .unwrap_or_else(|_| Err(PipeError::Timeout(timeout.unwrap_or_default(), "send"))),
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(365 * 24 * 3600)
}
