//! The frame reader's side of a blocking caller's direct wait ([`crate::DirectRead`],
//! used by `crate::pipe::direct`).

use std::sync::Arc;

use super::FrameReader;

impl FrameReader {
    /// With the read half's direct wait ([`crate::DirectRead`]), when the transport offers
    /// one: a blocking caller then waits for bytes on its own thread.
    pub fn with_direct(mut self, direct: Option<Arc<dyn crate::DirectRead>>) -> Self {
        self.sock.direct = direct;
        self
    }

    /// With a blocking caller's spin of at most `window` before each direct wait
    /// ([`crate::spin::caller`]; zero: none).
    pub fn with_caller_spin(mut self, window: std::time::Duration) -> Self {
        self.sock.caller_spin = crate::spin::caller::CallerSpin::new(window);
        self
    }

    /// The blocking caller's spin state ([`crate::spin::caller`]).
    pub(crate) fn caller_spin(&mut self) -> &mut crate::spin::caller::CallerSpin {
        &mut self.sock.caller_spin
    }

    /// The direct wait a blocking caller uses ([`crate::DirectRead`]): only on the bare
    /// byte stream (a link such as the ring has its own).
    pub(crate) fn direct(&self) -> Option<&Arc<dyn crate::DirectRead>> {
        if self.link.is_some() {
            return None;
        }
        self.sock.direct.as_ref()
    }

    /// The byte stream's direct wait, link or not (a blocking caller moving a frame on the
    /// socket drives it: [`crate::DirectRead::drive`]).
    pub(crate) fn socket_direct(&self) -> Option<&Arc<dyn crate::DirectRead>> {
        self.sock.direct.as_ref()
    }

    /// True when bytes of the stream are buffered here already (a frame has begun).
    pub(crate) fn has_buffered(&self) -> bool {
        !self.sock.inner.buffer().is_empty()
    }

    /// True when the next frame has begun to arrive: bytes buffered here, or waiting in a
    /// bare socket with a direct wait (the end or an error too). False when nothing is
    /// there, or this reader cannot look without reading (a link).
    pub(crate) fn more_now(&self) -> bool {
        self.has_buffered()
            || self.direct().and_then(|d| d.read_now()).is_some_and(|r| !matches!(r, Ok(crate::Readiness::Deadline)))
    }
}
