//! A server's handler threads read the next request themselves (leader/follower).
//!
//! A pipe with a handler ([`Pipe::set_handler`]) is read by its reader task, which gives
//! each request to the handler; a handler that runs its work on a thread of its own (the
//! Python server's handler threads) then costs two thread hand-offs per call: the task
//! wakes the handler's thread, and that thread's answer goes out while the task waits for
//! the next request. On a small machine the three threads (the caller, the task polling
//! for the next request, the handler's thread) also want more CPUs than there are.
//!
//! [`Pipe::serve_next_blocking`] lets the handler's thread, once it has answered, take the
//! reader over (the hand-over of [`super::blocking`]) and read the next request itself,
//! as a blocking caller reads its answers: it spins on the socket while the wait policy
//! allows, then sleeps on it until its deadline. The request goes to the pipe's handler on
//! that thread, which may then run the work there. A call then costs what a Rust-served
//! call costs: the caller's thread and one thread of the server.
//!
//! - **While the work runs** the reader lies parked for [`FOLLOW_LINGER`]: the follower
//!   takes it back for the next request without a wake-up; a longer job, and the task
//!   takes it back and reads (requests that come meanwhile wait at most that long).
//! - **More than one request waiting** (a client with several calls out): the reader goes
//!   back to the task at once, which gives them to the handler as they come (on as many
//!   threads as the handler uses), not one after another on this thread. (Over a bare
//!   socket; a ring's records are not looked at, and wait for the linger.)
//! - **Nothing by the deadline:** the reader goes back to the task at once (woken).
//! - **The handler paused reads** ([`Handled::Pause`]): the reader goes back to the task,
//!   which waits for the pause first, as when it called the handler itself.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::error::PipeError;

use super::{Handled, Pipe, read};

/// How long a reader that a follower parked while its handler's work runs may lie unused
/// before the pipe's task takes it back and reads (a request that comes meanwhile waits at
/// most this long, when its work runs longer).
pub const FOLLOW_LINGER: Duration = Duration::from_millis(1);

/// What [`Pipe::serve_next_blocking`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// A message came and was given to the pipe's handler on this thread.
    Handled,
    /// None came by the deadline: the reader went back to the pipe's task.
    Idle,
    /// Nothing done: the reader is elsewhere (another thread has it, or the task did not
    /// give it up by the deadline), or the pipe has no handler.
    Busy,
    /// The pipe ended.
    Ended,
}

impl Pipe {
    /// For a handler's thread that has just answered a request of this pipe: reads the
    /// next message on this thread (waiting until `deadline` at most, spinning first as
    /// the wait policy allows: [`crate::spin::caller`]) and gives it to the pipe's handler
    /// ([`Pipe::set_handler`]) here, in the pipe's runtime's context. See the module docs.
    ///
    /// Not for async tasks: it holds the thread while it waits.
    pub fn serve_next_blocking(&self, deadline: Instant) -> Served {
        let shared = &*self.shared;
        if shared.is_closed() {
            return Served::Ended;
        }
        if !shared.has_handler.load(Ordering::Acquire) {
            return Served::Busy;
        }
        let h = &shared.handover;
        let mut reader = match h.lend_to_follower(deadline) {
            Ok(r) => r,
            Err(s) => return s,
        };
        const WHAT: &str = "serve_next_blocking";
        let msg = match self.read_message_here(&mut reader, Some(deadline), || PipeError::Timeout(Duration::ZERO, WHAT))
        {
            Ok(msg) => msg,
            Err(PipeError::Timeout(_, WHAT)) => {
                h.give_back_now(reader, None, None);
                return Served::Idle;
            }
            Err(e) => {
                drop(reader);
                self.run_here(read::end_with(shared, &e));
                h.end();
                return Served::Ended;
            }
        };
        let Some((mut handler, generation)) = shared.take_handler() else {
            // Cleared meanwhile: the task gives the message on as it would have.
            h.give_back_now(reader, None, Some(msg));
            return Served::Ended;
        };
        // Requests beyond this one already here go to the task, which hands them out as
        // they come; this thread's job then runs beside them.
        let more = reader.more_now();
        let handled = {
            let _context = self.handle.enter();
            // A handler that panics here ends the pipe, as it would end the reader task.
            let _ending = EndOnPanic(self);
            handler(msg)
        };
        shared.put_handler_back(handler, generation);
        match handled {
            Handled::Pause(until) => h.give_back_now(reader, Some(until), None),
            Handled::Done | Handled::Started if more => h.give_back_now(reader, None, None),
            Handled::Done | Handled::Started => h.lock().give_back_for(reader, FOLLOW_LINGER),
        }
        Served::Handled
    }
}

/// Ends the pipe when a handler called on a follower's thread unwinds: its reader is lost
/// with the unwinding, and nothing would read the pipe again.
struct EndOnPanic<'a>(&'a Pipe);

impl Drop for EndOnPanic<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let shared = &self.0.shared;
        shared.mark_closed(PipeError::Closed);
        shared.handover.end();
    }
}
