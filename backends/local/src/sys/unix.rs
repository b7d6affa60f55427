//! Unix glue of the socket transport: a socket's descriptor registered with Tokio's
//! reactor for one interest. The only unsafe code of this crate on unix.
#![allow(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// A value that owns its descriptor: it stays open, and `as_raw_fd` names the same one,
/// for as long as the value lives. Only the types below.
pub(crate) trait OwnsFd: AsRawFd + Send + 'static {}
impl OwnsFd for OwnedFd {}
impl OwnsFd for Arc<UnixStream> {}

/// `fd`, registered with the current runtime's reactor for `interest` alone. The caller is
/// in a runtime's context.
pub(crate) fn register<T: OwnsFd>(fd: T, interest: Interest) -> io::Result<AsyncFd<T>> {
    // SAFETY: `T: OwnsFd` owns its descriptor (an `OwnedFd`, or a share of the socket
    // itself): it stays open and is the same descriptor while the `AsyncFd` holds the
    // value, until the `AsyncFd` is dropped or `into_inner` hands the value back.
    unsafe { AsyncFd::register_with_interest(fd, interest) }.map_err(io::Error::from)
}
