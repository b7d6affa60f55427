//! Work this crate runs on Tokio's blocking pool because it is compute (counting and
//! parsing a big message header): before it starts, the thread gets the scheduling policy
//! the process chose for compute. `ferry-rpc` sets that policy (`SCHED_IDLE` by default, see
//! `ferry_rpc::blocking`), so a peer's 16 MiB header is weighed on CPU time no runtime
//! worker wants, as a blocking handler's call is.

use std::sync::OnceLock;

static SETUP: OnceLock<fn()> = OnceLock::new();

/// Sets what a blocking-pool thread calls before this crate's compute runs on it (the
/// first call wins; later ones are ignored and return false). `ferry-rpc` calls it when
/// a server is made.
pub fn set_compute_thread_setup(setup: fn()) -> bool {
    SETUP.set(setup).is_ok()
}

/// Runs the setup, if one was set (on the blocking-pool thread about to compute).
pub(crate) fn enter() {
    if let Some(setup) = SETUP.get() {
        setup();
    }
}
