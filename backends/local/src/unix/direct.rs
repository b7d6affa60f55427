//! The direct wait of a unix socket's read half ([`ferry_core::DirectRead`]): a blocking
//! caller polls the socket on its own thread (`poll(2)`), so the kernel wakes it when bytes
//! arrive, with no runtime thread woken first; the read half's next read then takes the
//! bytes from the socket at once (`primed`), before the runtime has seen them.

use std::io;
use std::os::unix::net::{UnixStream, UnixStream as StdUnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ferry_core::{DirectRead, Readiness};
use rustix::event::{PollFd, PollFlags, Timespec};
use tokio::io::Interest;

use super::Reg;

/// A connection's direct wait, shared with its read half.
pub(crate) struct Direct {
    stream: Arc<UnixStream>,
    /// The read half's registration with the runtime, put away while a blocking caller
    /// waits here (the runtime's thread is then not woken by the bytes it takes).
    read: Reg<Arc<UnixStream>>,
    /// A direct wait saw the socket readable: the read half reads it before asking the
    /// runtime (cleared at the first read that finds nothing).
    primed: AtomicBool,
    wake: Mutex<Wake>,
}

/// How [`DirectRead::interrupt`] reaches a wait.
#[derive(Default)]
struct Wake {
    interrupted: bool,
    /// A socket pair whose first end a wait polls beside the connection's socket; the
    /// interrupt writes to the second. Made at the first wait (most connections never
    /// wait directly: no descriptors spent on them).
    pair: Option<Arc<(StdUnixStream, StdUnixStream)>>,
}

impl Direct {
    pub(crate) fn new(stream: Arc<UnixStream>) -> Arc<Self> {
        Arc::new(Direct {
            read: Reg::new(Some(stream.clone()), Interest::READABLE),
            stream,
            primed: AtomicBool::new(false),
            wake: Mutex::default(),
        })
    }

    /// The read half's registration with the runtime.
    pub(crate) fn read(&self) -> &Reg<Arc<UnixStream>> {
        &self.read
    }

    /// True when the read half should read the socket before asking the runtime.
    pub(crate) fn primed(&self) -> bool {
        self.primed.load(Ordering::Acquire)
    }

    /// A read found nothing: the runtime's readiness rules again.
    pub(crate) fn unprime(&self) {
        self.primed.store(false, Ordering::Release);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Wake> {
        self.wake.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl DirectRead for Direct {
    fn wait_readable(&self, deadline: Option<Instant>) -> io::Result<Readiness> {
        let pair = {
            let mut w = self.lock();
            if w.interrupted {
                return Ok(Readiness::Interrupted);
            }
            match &w.pair {
                Some(p) => p.clone(),
                None => {
                    let (a, b) = StdUnixStream::pair()?;
                    let p = Arc::new((a, b));
                    w.pair = Some(p.clone());
                    p
                }
            }
        };
        self.read.unregister();
        loop {
            let timeout = match deadline {
                None => None,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(Readiness::Deadline);
                    }
                    // Rounded up: a wait never ends before its deadline.
                    let left = left + std::time::Duration::from_nanos(999);
                    Some(Timespec {
                        tv_sec: left.as_secs().try_into().unwrap_or(i64::MAX),
                        tv_nsec: left.subsec_nanos().into(),
                    })
                }
            };
            let mut fds = [PollFd::new(&*self.stream, PollFlags::IN), PollFd::new(&pair.0, PollFlags::IN)];
            match rustix::event::poll(&mut fds, timeout.as_ref()) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
            if !fds[1].revents().is_empty() {
                return Ok(Readiness::Interrupted);
            }
            // Bytes, the end (HUP), or an error: the read says which.
            if !fds[0].revents().is_empty() {
                self.primed.store(true, Ordering::Release);
                return Ok(Readiness::Readable);
            }
        }
    }

    fn interrupt(&self) {
        let mut w = self.lock();
        if w.interrupted {
            return;
        }
        w.interrupted = true;
        if let Some(p) = &w.pair {
            // The byte stays unread: every later poll sees it too.
            let _ = rustix::io::write(&p.1, &[1]);
        }
    }
}
