//! The death notice: a thread that sleeps in `poll(2)` on a descriptor that the kernel closes
//! when the peer dies (its end of the connection's socket), and calls
//! [`PeerNotice::peer_gone`] when that happens.
//!
//! A futex cannot notice a dead process (nothing wakes it), so something outside the ring
//! must. The socket beside the ring is that thing in ferry's design (its EOF is the death
//! notice of every channel). This watcher asks only for `POLLRDHUP` (plus the `POLLHUP` /
//! `POLLERR` the kernel always reports), never `POLLIN`, so the socket can go on carrying
//! data read by someone else: poll consumes nothing and is not woken by data. It costs no
//! CPU while the peer lives. Dropping the watch stops the thread (an eventfd) and joins it.
//!
//! When the Pipe integration lands, its socket reader already sees EOF and can call
//! [`PeerNotice::peer_gone`] itself; this watcher is for users of the bare ring (tests,
//! benchmarks, a blocking caller without a reader).

use std::io;
use std::os::fd::OwnedFd;
use std::thread::JoinHandle;

use rustix::event::{EventfdFlags, PollFd, PollFlags};

use crate::PeerNotice;

/// A running death-notice thread; stopped and joined on drop.
#[derive(Debug)]
pub struct DeathWatch {
    stop: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

impl DeathWatch {
    /// Watches `socket` (this side's end of a stream socket whose other end only the peer
    /// holds) and calls `notice.peer_gone()` when the peer's end closes (exit, crash,
    /// SIGKILL, or an orderly close of the socket).
    pub fn spawn(socket: OwnedFd, notice: PeerNotice) -> io::Result<DeathWatch> {
        let stop = rustix::event::eventfd(0, EventfdFlags::CLOEXEC)?;
        let stop2 = stop.try_clone()?;
        let thread = std::thread::Builder::new().name("ferry-ring-watch".into()).spawn(move || {
            let events = PollFlags::RDHUP;
            loop {
                let mut fds = [PollFd::new(&socket, events), PollFd::new(&stop2, PollFlags::IN)];
                match rustix::event::poll(&mut fds, None) {
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(_) => break,
                    Ok(_) => {}
                }
                if !fds[1].revents().is_empty() {
                    return; // stopped by drop
                }
                if fds[0].revents().intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR | PollFlags::NVAL) {
                    break;
                }
            }
            notice.peer_gone();
        })?;
        Ok(DeathWatch { stop, thread: Some(thread) })
    }
}

impl Drop for DeathWatch {
    fn drop(&mut self) {
        let _ = rustix::io::write(&self.stop, &1u64.to_ne_bytes());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
