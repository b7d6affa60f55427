//! The disk tier on the file system (SECURITY.md, "What belongs to whom"): its directory is
//! mode 0700 and its files 0600, so another local user (uid 65534, when the test runs as
//! root) reads nothing; a store killed with SIGKILL (a real child process) leaves its
//! directory, and the next store to start removes it, while the directory of a live store
//! (its lock held) stays, whatever the pid in its name says; a directory given by the caller
//! is held by one live store at a time and cleaned of a dead owner's files.

#[cfg(target_os = "linux")]
#[path = "disk_tier/linux.rs"]
mod linux;

#[cfg(target_os = "linux")]
fn main() -> std::process::ExitCode {
    linux::main()
}

#[cfg(not(target_os = "linux"))]
fn main() {}
