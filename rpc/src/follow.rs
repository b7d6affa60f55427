//! A handler's thread reads its connection's next request itself ([`Follower`]): for
//! servers whose handlers run on threads of their own (the Python server), so that a call
//! costs no hand-off between the connection's reader and that thread
//! ([`ferry_core::Pipe::serve_next_blocking`]).

use std::sync::Weak;
use std::time::Instant;

use ferry_core::{Pipe, Served};

use crate::method::CallContext;

/// The connection a call came on, for the thread that answered it to read and start the
/// next request there ([`Follower::serve_next`]). Holds the connection weakly: it does not
/// keep a closed connection alive.
#[derive(Clone, Debug)]
pub struct Follower(Weak<Pipe>);

impl Follower {
    /// Reads the connection's next request on this thread, waiting until `deadline` at
    /// most, and starts it here as the connection's reader would (its handler may run its
    /// work on this thread): [`ferry_core::Pipe::serve_next_blocking`]. Call it after the
    /// call's answer is written, from a plain thread (it blocks).
    pub fn serve_next(&self, deadline: Instant) -> Served {
        match self.0.upgrade() {
            Some(pipe) => pipe.serve_next_blocking(deadline),
            None => Served::Ended,
        }
    }
}

impl CallContext {
    /// The call's connection for [`Follower::serve_next`]; `None` where the call did not
    /// come on a ferry pipe (plain JSON, HTTP, a detached context).
    pub fn follower(&self) -> Option<Follower> {
        self.pipe.as_ref().map(|p| Follower(std::sync::Arc::downgrade(p)))
    }
}
