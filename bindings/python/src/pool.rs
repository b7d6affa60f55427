//! The threads Python handlers run on.
//!
//! A thread that enters Python for one call and leaves it again creates and destroys a
//! Python thread state each time (and CPython's per-thread frame stack with it): measured
//! here, about 45 µs of a 60 µs call to a trivial handler. The pool's threads enter Python
//! once and keep their thread state; between jobs they wait with the GIL released.
//!
//! The pool grows by a thread whenever a job arrives and no thread is idle (a hung handler
//! never delays another call), up to [`MAX_THREADS`]; a thread idle for [`IDLE_EXIT`] ends
//! unless it is one of the first [`KEEP`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::Duration;

use pyo3::prelude::*;

/// The most threads the pool runs (jobs beyond wait for one).
pub const MAX_THREADS: usize = 512;
/// Threads that stay however long they idle.
pub const KEEP: usize = 4;
/// How long a thread beyond [`KEEP`] idles before it ends.
pub const IDLE_EXIT: Duration = Duration::from_secs(30);

type Job = Box<dyn FnOnce(Python<'_>) + Send>;

struct Pool {
    tx: Mutex<mpsc::Sender<Job>>,
    rx: Mutex<mpsc::Receiver<Job>>,
    threads: AtomicUsize,
    idle: AtomicUsize,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let (tx, rx) = mpsc::channel();
        Pool { tx: Mutex::new(tx), rx: Mutex::new(rx), threads: AtomicUsize::new(0), idle: AtomicUsize::new(0) }
    })
}

/// Runs `job` with the GIL on a pool thread: an idle one, claimed here (so jobs arriving
/// together each get their own), else a new one.
pub fn run(job: impl FnOnce(Python<'_>) + Send + 'static) {
    let p = pool();
    let claimed = p.idle.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok();
    if !claimed && p.threads.load(Ordering::Acquire) < MAX_THREADS {
        spawn_thread(p);
    }
    if let Ok(tx) = p.tx.lock() {
        // The receiver lives as long as the pool (a static): sending cannot fail.
        let _ = tx.send(Box::new(job));
    }
}

fn spawn_thread(p: &'static Pool) {
    let n = p.threads.fetch_add(1, Ordering::AcqRel);
    let started = std::thread::Builder::new().name(format!("ferry-py-{n}")).spawn(move || worker(p));
    if started.is_err() {
        p.threads.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A pool thread. It is started for a job, so it counts as idle only once that job is
/// done; `idle` counts the waiting threads no job has claimed.
fn worker(p: &'static Pool) {
    Python::attach(|py| {
        loop {
            let job = py.detach(|| match p.rx.lock() {
                Ok(rx) => rx.recv_timeout(IDLE_EXIT),
                Err(_) => Err(mpsc::RecvTimeoutError::Disconnected),
            });
            match job {
                Ok(job) => {
                    job(py);
                    p.idle.fetch_add(1, Ordering::AcqRel);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    // Leave only if not needed and no job has claimed this idle slot.
                    if p.threads.load(Ordering::Acquire) > KEEP
                        && p.idle.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok()
                    {
                        break;
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
    });
    p.threads.fetch_sub(1, Ordering::AcqRel);
}
