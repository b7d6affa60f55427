//! The threads Python handlers run on.
//!
//! A thread that enters Python for one call and leaves it again creates and destroys a
//! Python thread state each time (and CPython's per-thread frame stack with it): measured
//! here, about 45 µs of a 60 µs call to a trivial handler. The pool's threads enter Python
//! once and keep their thread state; between jobs they wait with the GIL released.
//!
//! Each idle thread waits on a slot of its own (no shared queue whose lock wakes every
//! waiter in turn); the thread idle last gets the next job. Having finished a job, a
//! thread first spins for up to [`set_spin`] (the server's busy-poll time) before it
//! parks, as the wait policy allows ([`ferry_core::spin::decide`]: at most
//! [`max_spinners`] at once, not while the machine is overloaded, not after its last wait
//! was long): a caller's next call, arriving within it, then starts without a thread
//! wake-up (tens of µs on a busy or virtual machine).
//!
//! A thread that answered a call then reads the caller's next request itself
//! ([`follow_after`], [`ferry_rpc::Follower`]) for up to [`FOLLOW_WINDOW`], and runs its job
//! at once: no hand-off from the connection's reader to this thread, and one thread fewer
//! wanting a CPU (on 2 CPUs, the caller, the reader and this thread were three).
//!
//! The pool grows by a thread whenever a job arrives and no thread is idle (a hung handler
//! never delays another call), up to [`MAX_THREADS`] (jobs beyond wait in a queue the
//! threads take from before they idle); a thread idle for [`IDLE_EXIT`] ends unless it is
//! one of the first [`KEEP`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

use ferry_core::spin::{self, Spin, SpinHistory, SpinInputs, Waited};
use pyo3::prelude::*;

/// The most threads the pool runs (jobs beyond wait for one).
pub const MAX_THREADS: usize = 512;
/// Threads that stay however long they idle.
pub const KEEP: usize = 4;
/// How long a thread beyond [`KEEP`] idles before it ends.
pub const IDLE_EXIT: Duration = Duration::from_secs(30);
/// How long a thread that answered a call waits for the same connection's next request
/// (spinning first as the wait policy allows, then asleep on the socket) before it idles.
pub const FOLLOW_WINDOW: Duration = Duration::from_millis(2);

type Job = Box<dyn FnOnce(Python<'_>) + Send>;

/// Where an idle thread waits for its next job.
struct Slot {
    job: Mutex<Option<Job>>,
    /// Set (after `job`) when a job is in the slot.
    full: AtomicBool,
    thread: Thread,
}

#[derive(Default)]
struct State {
    /// Idle threads, the one idle last on top.
    idle: Vec<Arc<Slot>>,
    /// Jobs that found no thread (the pool at [`MAX_THREADS`]).
    queued: VecDeque<Job>,
    threads: usize,
}

#[derive(Default)]
struct Pool {
    state: Mutex<State>,
    spinning: AtomicUsize,
    spin_us: AtomicU64,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(Pool::default)
}

fn lock(p: &Pool) -> MutexGuard<'_, State> {
    // No code panics while holding it; a poisoned lock's state is still whole.
    p.state.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sets how long a thread that finished a job spins for the next one before it parks
/// (a server's busy-poll time; zero: it parks at once).
pub fn set_spin(d: Duration) {
    pool().spin_us.store(d.as_micros().min(u128::from(u64::MAX)) as u64, Ordering::Relaxed);
}

/// How many idle threads may spin at once: as many as the runtime's readers leave of half
/// the CPUs (the busy-polling budget; the rest are the peers'), and one at least, so that
/// a caller's next call finds a thread awake. On 2 CPUs (one runtime worker) the reader
/// spinning for the next request and one pool thread spinning for the next job were
/// measured against the pool parking (`add` from a `ferry.Client`, release, quiet VM): 36
/// against 49 µs per call, the Rust-served `add` 24 µs in the same runs; the thread
/// wake-up it saves is the larger cost on a virtual machine. Spinning stops when the
/// machine is overloaded or a thread's waits were long ([`spin::decide`]), and there is
/// none without a busy-poll window (one CPU).
pub fn max_spinners() -> usize {
    // Counting CPUs reads cgroup files: once.
    static MAX: OnceLock<usize> = OnceLock::new();
    *MAX.get_or_init(|| {
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        (cpus / 2).saturating_sub(crate::runtime_workers()).max(1)
    })
}

thread_local! {
    /// The connection whose next request this pool thread reads once its job is done.
    static FOLLOW: std::cell::RefCell<Option<ferry_rpc::Follower>> = const { std::cell::RefCell::new(None) };
    /// Set while this pool thread reads a request ([`follow`]): the job it starts is kept
    /// in [`NEXT`] and run here.
    static FOLLOWING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static NEXT: std::cell::RefCell<Option<Job>> = const { std::cell::RefCell::new(None) };
}

/// Called by a job on a pool thread once its answer is given: the thread then reads the
/// connection's next request itself (`follow`).
pub fn follow_after(f: ferry_rpc::Follower) {
    FOLLOW.with(|c| *c.borrow_mut() = Some(f));
}

/// Reads the next request of the connection the last job asked for ([`follow_after`]),
/// the GIL released, until [`FOLLOW_WINDOW`]; the job it started, to run next here.
fn follow(py: Python<'_>) -> Option<Job> {
    let f = FOLLOW.with(|c| c.borrow_mut().take())?;
    let deadline = Instant::now() + FOLLOW_WINDOW;
    FOLLOWING.with(|c| c.set(true));
    // Whatever it served, a job it started (only a request handled here starts one).
    py.detach(|| f.serve_next(deadline));
    FOLLOWING.with(|c| c.set(false));
    NEXT.with(|c| c.borrow_mut().take())
}

/// Runs `job` with the GIL on a pool thread: the one idle last, else a new one, else
/// (at [`MAX_THREADS`]) the first to finish its job. On a pool thread reading a request
/// (`follow`), the first job it starts runs on that thread next.
pub fn run(job: impl FnOnce(Python<'_>) + Send + 'static) {
    let p = pool();
    let job: Job = Box::new(job);
    let job = if FOLLOWING.with(std::cell::Cell::get) {
        match NEXT.with(|c| {
            let mut next = c.borrow_mut();
            if next.is_none() {
                *next = Some(job);
                None
            } else {
                Some(job)
            }
        }) {
            None => return,
            Some(job) => job,
        }
    } else {
        job
    };
    let mut st = lock(p);
    if let Some(slot) = st.idle.pop() {
        drop(st);
        *slot.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(job);
        slot.full.store(true, Ordering::Release);
        slot.thread.unpark();
        return;
    }
    if st.threads >= MAX_THREADS {
        st.queued.push_back(job);
        return;
    }
    st.threads += 1;
    let n = st.threads;
    drop(st);
    let started = std::thread::Builder::new().name(format!("ferry-py-{n}")).spawn(move || worker(p, job));
    if let Err(e) = started {
        // The job is lost with the thread that could not start: the call it answers is
        // dropped, and its caller gets an internal error (its answer channel closes).
        tracing::error!("could not start a Python handler thread: {e}");
        lock(p).threads -= 1;
    }
}

/// A pool thread, started for `first`.
fn worker(p: &'static Pool, first: Job) {
    let slot = Arc::new(Slot { job: Mutex::new(None), full: AtomicBool::new(false), thread: std::thread::current() });
    let mut history = SpinHistory::new(Duration::from_micros(p.spin_us.load(Ordering::Relaxed)));
    Python::attach(|py| {
        let mut job = first;
        loop {
            job(py);
            crate::answer::run_deferred(py);
            if let Some(next) = follow(py) {
                job = next;
                continue;
            }
            job = {
                let mut st = lock(p);
                match st.queued.pop_front() {
                    Some(j) => j,
                    None => {
                        st.idle.push(slot.clone());
                        drop(st);
                        match py.detach(|| wait(p, &slot, &mut history)) {
                            Some(j) => j,
                            None => break,
                        }
                    }
                }
            };
        }
    });
}

/// Waits in the idle list for a job; `None` when the thread should end (idle too long,
/// beyond [`KEEP`], and taken off the list here). `history`: this thread's past waits.
fn wait(p: &Pool, slot: &Slot, history: &mut SpinHistory) -> Option<Job> {
    let take = || {
        if slot.full.swap(false, Ordering::Acquire) {
            slot.job.lock().unwrap_or_else(|e| e.into_inner()).take()
        } else {
            None
        }
    };
    let window = Duration::from_micros(p.spin_us.load(Ordering::Relaxed));
    if history.window() != window {
        *history = SpinHistory::new(window);
    }
    let start = Instant::now();
    let learned = history.learned();
    let spin = spin::decide(SpinInputs {
        window,
        armed: true,
        learned,
        overloaded: !window.is_zero() && learned.is_some() && spin::load::overloaded_at(start),
        others_active: false,
        spinning: p.spinning.load(Ordering::Acquire),
        max_spinning: max_spinners(),
    });
    // A place among the spinners (another thread may have taken the last since).
    let max = max_spinners();
    if let Spin::Poll(d) = spin
        && p.spinning.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).is_ok()
    {
        let until = start + d;
        let mut got = None;
        while Instant::now() < until {
            got = take();
            if got.is_some() {
                break;
            }
            // Let a thread that shares this CPU (the runtime worker reading the next
            // call) run: on a small machine it is what this spin waits for.
            std::thread::yield_now();
        }
        p.spinning.fetch_sub(1, Ordering::AcqRel);
        if got.is_some() {
            history.record(Waited::Spun(start.elapsed()));
            return got;
        }
    }
    let got = park(p, slot, take);
    history.record(Waited::Slept(start.elapsed()));
    got
}

/// Parks until a job comes (`take` finds it); `None` as [`wait`] says.
fn park(p: &Pool, slot: &Slot, take: impl Fn() -> Option<Job>) -> Option<Job> {
    let mut since = Instant::now();
    loop {
        if let Some(j) = take() {
            return Some(j);
        }
        std::thread::park_timeout(IDLE_EXIT.saturating_sub(since.elapsed()));
        if since.elapsed() >= IDLE_EXIT {
            let mut st = lock(p);
            if let Some(i) = st.idle.iter().position(|s| std::ptr::eq(Arc::as_ptr(s), slot))
                && st.threads > KEEP
            {
                st.idle.remove(i);
                st.threads -= 1;
                return None;
            }
            // Kept, or claimed just now (its job is on the way): wait on.
            since = Instant::now();
        }
    }
}
