//! What the safe crates lack (Linux): the scheduling policy of the threads that run
//! blocking handlers ([`crate::blocking`]).
#![allow(unsafe_code)]

/// Puts the calling thread under `SCHED_IDLE` (`idle`) or back under `SCHED_OTHER`: an
/// idle thread runs on CPU time no normally scheduled thread wants, and such a thread
/// waking up takes the CPU from it at once.
pub(crate) fn set_idle_policy(idle: bool) -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    let policy = if idle { libc::SCHED_IDLE } else { libc::SCHED_OTHER };
    // SAFETY: on Linux, sched_setscheduler with pid 0 acts on the calling thread only;
    // `param` is an initialized sched_param that outlives the call, which only reads it.
    let r = unsafe { libc::sched_setscheduler(0, policy, &param) };
    if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}
