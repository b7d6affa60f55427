//! A unix socket's registration with the runtime, for one interest, made when it is first
//! needed and put away on demand.
//!
//! A connection registers its read and write sides apart ([`Reg`]), so that bytes arriving
//! wake the runtime's I/O driver only when a task waits to read them: a writer waiting for
//! room registers for room alone (a descriptor of its own: the registration is keyed by
//! descriptor), and the read side's registration is put away while a blocking caller reads
//! the socket itself ([`super::direct`]). Without this, every message that arrives while a
//! blocking caller waits on its own thread would wake a runtime thread as well, for
//! nothing: two wake-ups per message where a plain socket costs one.

use std::io;
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll, ready};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::sys::{OwnsFd as Fd, register};

/// A descriptor that the runtime watches for `interest` while a task waits on it.
pub(crate) struct Reg<T: Fd> {
    state: Mutex<State<T>>,
    interest: Interest,
}

enum State<T: Fd> {
    /// Not made yet, or made and not registered.
    Bare(Option<T>),
    Registered(AsyncFd<T>),
    /// Registration failed: the descriptor is gone.
    Broken,
}

impl<T: Fd> Reg<T> {
    /// `fd` (`None`: made at the first wait), registered when a wait first needs it.
    pub(crate) fn new(fd: Option<T>, interest: Interest) -> Self {
        Reg { state: Mutex::new(State::Bare(fd)), interest }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits (registering first if it is not) until the descriptor is ready for the
    /// interest, then runs `io`, again while it finds nothing (`WouldBlock`).
    /// `make`: the descriptor, when there is none yet.
    pub(crate) fn poll_io<R>(
        &self,
        cx: &mut Context<'_>,
        make: impl FnOnce() -> io::Result<T>,
        mut io: impl FnMut() -> io::Result<R>,
    ) -> Poll<io::Result<R>> {
        let mut st = self.lock();
        if let State::Bare(fd) = &mut *st {
            if tokio::runtime::Handle::try_current().is_err() {
                return Poll::Ready(Err(io::Error::other("a unix socket waits outside a Tokio runtime")));
            }
            let fd = match fd.take() {
                Some(fd) => fd,
                None => make()?,
            };
            *st = match register(fd, self.interest) {
                Ok(a) => State::Registered(a),
                Err(e) => {
                    *st = State::Broken;
                    return Poll::Ready(Err(e));
                }
            };
        }
        let State::Registered(a) = &*st else {
            return Poll::Ready(Err(io::Error::other("this unix socket could not be registered with the runtime")));
        };
        loop {
            let mut guard = if self.interest.is_readable() {
                ready!(a.poll_read_ready(cx))?
            } else {
                ready!(a.poll_write_ready(cx))?
            };
            match guard.try_io(|_| io()) {
                Ok(r) => return Poll::Ready(r),
                Err(_would_block) => continue,
            }
        }
    }

    /// Puts the registration away (a blocking caller reads the socket itself): the runtime
    /// no longer watches it until the next [`Reg::poll_io`]. Nothing may wait on it now.
    pub(crate) fn unregister(&self) {
        let mut st = self.lock();
        if matches!(&*st, State::Registered(_)) {
            *st = match std::mem::replace(&mut *st, State::Broken) {
                State::Registered(a) => State::Bare(Some(a.into_inner())),
                other => other,
            };
        }
    }
}
