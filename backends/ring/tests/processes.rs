//! Two processes over a ring: this test binary re-executes itself as the peer
//! (`FERRY_RING_PEER=<role>`), with its stdin being the peer's end of a unix socket pair;
//! the ring file crosses that socket (SCM_RIGHTS), and the socket's EOF is the death notice.
//!
//! Every wait has a deadline (`linux::BOUND`) and every loop a count: a bug fails a test, it
//! never hangs it. No test measures time.

#[cfg(target_os = "linux")]
#[path = "processes/linux.rs"]
mod linux;

fn main() -> std::process::ExitCode {
    #[cfg(target_os = "linux")]
    return linux::main();
    #[cfg(not(target_os = "linux"))]
    {
        eprintln!("ferry-ring works on Linux only: nothing to test here");
        std::process::ExitCode::SUCCESS
    }
}
