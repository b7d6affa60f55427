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

/// Runs `job` with the GIL on a pool thread.
pub fn run(job: impl FnOnce(Python<'_>) + Send + 'static) {
    let p = pool();
    if p.idle.load(Ordering::Acquire) == 0 && p.threads.load(Ordering::Acquire) < MAX_THREADS {
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

fn worker(p: &'static Pool) {
    Python::attach(|py| {
        loop {
            p.idle.fetch_add(1, Ordering::AcqRel);
            let job = py.detach(|| match p.rx.lock() {
                Ok(rx) => rx.recv_timeout(IDLE_EXIT),
                Err(_) => Err(mpsc::RecvTimeoutError::Disconnected),
            });
            p.idle.fetch_sub(1, Ordering::AcqRel);
            match job {
                Ok(job) => job(py),
                Err(mpsc::RecvTimeoutError::Timeout) if p.threads.load(Ordering::Acquire) <= KEEP => {}
                Err(_) => break,
            }
        }
    });
    p.threads.fetch_sub(1, Ordering::AcqRel);
}
