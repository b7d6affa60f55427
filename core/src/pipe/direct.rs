//! A blocking caller's reads on a bare socket (issue 45, point 2): the socket path as lean
//! as the socket.
//!
//! Without a ring, [`Pipe::recv_blocking`] used to wait for the socket through the runtime:
//! the runtime's I/O driver (a worker thread asleep in `epoll_wait`) woke first and then
//! woke the caller, two wake-ups where a plain blocking read costs one. When the transport
//! offers a direct wait ([`crate::DirectRead`]: a unix socket), the caller that holds the
//! pipe's reader (the hand-over of [`super::blocking`]: the reader task gives it up between
//! frames) waits for the socket on its own thread instead, and reads the frame at once.
//!
//! - **What it reads.** Every frame, as the reader task would: a MESSAGE ends the call,
//!   CONTROL frames (shm leases and releases) go to their session on the way, a CLOSE or
//!   the socket's end closes the pipe ([`read::handle_frame`], the task's own code).
//! - **Waits.** Only at a frame boundary with nothing buffered does the caller wait
//!   directly, bounded by its deadline; a frame that has begun is read through the runtime
//!   (its bytes are coming: the frame time limit applies as in the task).
//! - **Spins.** Before it sleeps, the caller polls the socket for a while, yielding its
//!   CPU between looks
//!   ([`crate::EndpointBuilder::blocking_spin`], [`DirectRead::read_now`]) where the wait
//!   policy allows ([`crate::spin::caller`]: not while threads wait for CPUs, rarely while
//!   its spins miss): an answer within the spin costs no wake-up.
//! - **Close.** Closing the pipe interrupts a direct wait ([`crate::DirectRead::interrupt`]
//!   from [`super::Shared::mark_closed`]): the call ends with the pipe's error at once.
//! - **Hand-back.** The reader goes back to the slot as after any blocking call; whatever
//!   the caller did not read stays in the socket (or the reader's buffer) for the next
//!   holder, in order.

use std::time::Instant;

use crate::error::PipeError;
use crate::frame::FrameReader;
use crate::message::Message;
use crate::spin::caller::Place;
use crate::spin::{Spin, Waited};
use crate::transport::{DirectRead, Readiness};

use super::{Pipe, read};

impl Pipe {
    /// [`Pipe::recv_blocking`]'s read when `reader` reads a bare socket with a direct wait:
    /// frames until a message, on this thread. `None`: no direct wait here (a ring, or a
    /// transport without one); the caller waits the other way.
    pub(super) fn recv_direct(
        &self,
        reader: &mut FrameReader,
        deadline: Option<Instant>,
        timed_out: impl Fn() -> PipeError,
    ) -> Option<Result<Message, PipeError>> {
        let direct = reader.direct()?.clone();
        let shared = &*self.shared;
        // Once for every future this call runs.
        let _context = self.handle.enter();
        Some(loop {
            if !reader.has_buffered() {
                let ready = match spin(reader, &*direct, deadline) {
                    Ok(r) => r,
                    Err(start) => {
                        let r = direct.wait_readable(deadline);
                        if let Some(start) = start {
                            reader.caller_spin().record(Waited::Slept(start.elapsed()));
                        }
                        r
                    }
                };
                match ready {
                    Ok(Readiness::Readable) => {}
                    Ok(Readiness::Deadline) => break Err(timed_out()),
                    Ok(Readiness::Interrupted) => break Err(shared.closed_error()),
                    Err(e) => break Err(e.into()),
                }
            }
            // The bytes are there: a small frame is read at the first poll, a large one
            // driven on this thread ([`Pipe::run_driven`]).
            let got = self
                .run_driven_entered(crate::transport::Half::Read, std::pin::pin!(reader.read_frame()))
                .and_then(|frame| self.run_here_entered(std::pin::pin!(read::handle_read(shared, frame))));
            match got {
                Ok(Some(msg)) => break Ok(msg),
                Ok(None) => {}
                Err(e) => break Err(e),
            }
        })
    }
}

/// A blocking caller's spin before its direct wait, as the wait policy allows
/// ([`crate::spin::caller`]): polls the socket with [`DirectRead::read_now`] for up to the
/// window (never past `deadline`). `Ok`: what the spin found (bytes, the end, an interrupt
/// or an error), recorded as a hit. `Err`: nothing came within it, or it did not spin; the
/// caller waits in the kernel and records how long that took from the time given (`None`:
/// no spinning here, nothing to record).
fn spin(
    reader: &mut FrameReader,
    direct: &dyn DirectRead,
    deadline: Option<Instant>,
) -> Result<std::io::Result<Readiness>, Option<Instant>> {
    let policy = reader.caller_spin();
    if policy.window().is_zero() {
        return Err(None);
    }
    let start = Instant::now();
    let place = Place::take();
    let Spin::Poll(d) = policy.next(crate::spin::load::overloaded_at(start), place.is_some()) else {
        return Err(Some(start));
    };
    let until = deadline.map_or(start + d, |dl| dl.min(start + d));
    loop {
        match direct.read_now() {
            None => return Err(None),
            Some(Ok(Readiness::Deadline)) => {}
            Some(r) => {
                policy.record(Waited::Spun(start.elapsed()));
                return Ok(r);
            }
        }
        if Instant::now() >= until {
            // Missed: the wait goes on in the kernel (a deadline passed is its to say).
            return Err(Some(start));
        }
        // A thread that shares this CPU (on a small or busy machine, often the peer this
        // spin waits for) runs meanwhile; alone on its CPU, this returns at once.
        std::thread::yield_now();
    }
}
