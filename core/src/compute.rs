//! Work this crate runs off the runtime's workers because it is compute (counting and
//! parsing a big message header), on the process's compute threads ([`spawn`]): before it
//! starts, the thread gets the scheduling policy the process chose for compute.
//! `ferry-rpc` sets that policy (`SCHED_IDLE` by default, see `ferry_rpc::blocking`), so a
//! peer's 16 MiB header is weighed on CPU time no runtime worker wants, as a blocking
//! handler's call is.
//!
//! The compute threads are a blocking pool of their own (threads named `ferry-compute`),
//! not Tokio's: a thread put under `SCHED_IDLE` cannot go back without privilege, and a
//! thread it starts inherits the policy. On Tokio's shared blocking pool, a thread that once
//! parsed a big header would later run anyone's `spawn_blocking` work (a weight store's
//! delta, a file read) under `SCHED_IDLE`, and on a machine whose CPUs other work fills it
//! then got no CPU at all (measured: a store's `update` beside two CPU burners got no answer
//! within 30 s, 3 times in 3, with its threads runnable under `SCHED_IDLE`).

use std::sync::OnceLock;

static SETUP: OnceLock<fn()> = OnceLock::new();

/// Sets what a compute thread calls before compute runs on it (the first call wins; later
/// ones are ignored and return false). `ferry-rpc` calls it when a server is made.
pub fn set_compute_thread_setup(setup: fn()) -> bool {
    SETUP.set(setup).is_ok()
}

/// Runs the setup, if one was set (on the compute thread about to compute).
fn enter() {
    if let Some(setup) = SETUP.get() {
        setup();
    }
}

/// Runs `f` on one of the process's compute threads, under the policy the setup gives it
/// ([`set_compute_thread_setup`]), in the caller's runtime context when it has one (as
/// `tokio::task::spawn_blocking` would: `Handle::current()`, its timers and I/O); the
/// handle is awaited from any runtime. The pool grows as calls need threads (as Tokio's
/// blocking pool does) and lets idle ones go after 10 s.
pub fn spawn<R, F>(f: F) -> tokio::task::JoinHandle<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    let caller = tokio::runtime::Handle::try_current().ok();
    pool().spawn_blocking(move || {
        let _context = caller.as_ref().map(tokio::runtime::Handle::enter);
        enter();
        f()
    })
}

/// The runtime whose blocking pool the compute threads are (its one worker idles: nothing
/// but blocking work is given to it).
fn pool() -> &'static tokio::runtime::Handle {
    static POOL: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    POOL.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("ferry-compute")
            .thread_keep_alive(std::time::Duration::from_secs(10))
            .build()
            // Building fails only when the OS refuses a thread: nothing else can run then.
            .expect("starting ferry's compute threads")
    })
    .handle()
}
