//! Unix glue of the socket transport: a socket's descriptor registered with Tokio's
//! reactor for one interest, and a receive into memory that is not initialized yet. The
//! only unsafe code of this crate on unix.
#![allow(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use tokio::io::unix::AsyncFd;
use tokio::io::{Interest, ReadBuf};

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

/// Most descriptors one receive takes (Linux `SCM_MAX_FD`); more are a truncation, which
/// [`recv_into`] reports.
const MAX_FDS_PER_RECV: usize = 253;

/// Bytes of control space for [`MAX_FDS_PER_RECV`] descriptors.
// SAFETY: `CMSG_SPACE` is arithmetic on its argument (unsafe in libc only for its C origin).
const CONTROL_LEN: usize = unsafe { libc::CMSG_SPACE((MAX_FDS_PER_RECV * size_of::<libc::c_int>()) as u32) } as usize;

/// One `recvmsg(2)` into the unfilled part of `buf`, at most `max` bytes of it, which need
/// not be initialized: the kernel writes the bytes it returns, and only those are marked
/// filled. Safe code would have to zero the room first, a second pass over every byte a
/// large frame brings (17% of the CPU time of a 24.9 MB round trip, measured).
/// Waits when `block` (up to the socket's `SO_RCVTIMEO`); else `WouldBlock` when nothing
/// is there. A message with more descriptors than fit is an `InvalidData` error (those
/// that came are closed). Returns the bytes received (0: the end of the stream) and the
/// descriptors that came with them (close-on-exec).
pub(crate) fn recv_into(
    stream: &UnixStream,
    buf: &mut ReadBuf<'_>,
    max: usize,
    block: bool,
) -> io::Result<(usize, Vec<OwnedFd>)> {
    // u64 words: the control space aligned as `cmsghdr` wants.
    let mut control = [0u64; CONTROL_LEN.div_ceil(8)];
    // SAFETY: the slice is only written by the kernel below (never de-initialized), and
    // only the bytes it reports written are marked initialized (`assume_init`).
    let room = unsafe { buf.unfilled_mut() };
    let len = room.len().min(max);
    let mut iov = libc::iovec { iov_base: room.as_mut_ptr().cast(), iov_len: len };
    // SAFETY: a `msghdr` of zeros is valid (no name, no buffers); the fields are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = CONTROL_LEN as _;
    let flags = libc::MSG_CMSG_CLOEXEC | if block { 0 } else { libc::MSG_DONTWAIT };
    // SAFETY: `msg` points at `iov` (`len` writable bytes of `room`) and at `control`
    // (`CONTROL_LEN` bytes), all live and unaliased for the call.
    let r = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, flags) };
    let Ok(got) = usize::try_from(r) else { return Err(io::Error::last_os_error()) };
    // SAFETY: `msg` is as the kernel left it: its control length covers only the messages
    // it wrote into `control`, which `CMSG_FIRSTHDR`/`CMSG_NXTHDR` walk within.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    let mut received = Vec::new();
    while !c.is_null() {
        // SAFETY: `c` points at a whole `cmsghdr` within `control` (the walk checks it),
        // aligned (the kernel aligns them, and `control` is 8-aligned).
        let h = unsafe { &*c };
        if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: as for `CONTROL_LEN`.
            let header = unsafe { libc::CMSG_LEN(0) } as usize;
            let n = (h.cmsg_len as usize).saturating_sub(header) / size_of::<libc::c_int>();
            // SAFETY: the data of a message the kernel wrote, `cmsg_len` bytes from `c`.
            let data = unsafe { libc::CMSG_DATA(c) }.cast::<libc::c_int>();
            for i in 0..n {
                // SAFETY: descriptor `i` lies within the message's data (`n` counts them);
                // the kernel opened it for this process, and nothing else owns it.
                received.push(unsafe { OwnedFd::from_raw_fd(data.add(i).read_unaligned()) });
            }
        }
        // SAFETY: as for `CMSG_FIRSTHDR`; `c` is a message of this walk.
        c = unsafe { libc::CMSG_NXTHDR(&msg, c) };
    }
    // A receive that fails fills nothing (bytes that came with too many descriptors are
    // not the caller's: its connection fails).
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "peer sent more file descriptors than fit in one message",
        ));
    }
    // SAFETY: the kernel wrote `got` bytes (at most `len`) at the start of the room.
    unsafe { buf.assume_init(got) };
    buf.advance(got);
    Ok((got, received))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::MaybeUninit;
    use std::os::fd::AsFd;

    /// Bytes land in memory that was never initialized, `max` bounds a receive, the
    /// descriptors that came with the bytes are handed over open, and an empty socket says
    /// `WouldBlock` (not waiting) and an ended one 0.
    #[test]
    fn receives_into_uninitialized_room_with_descriptors() {
        let (a, b) = UnixStream::pair().expect("pair");
        let (keep1, keep2) = (rustix::io::dup(&a).expect("dup"), rustix::io::dup(&b).expect("dup"));
        let fds = [keep1.as_fd(), keep2.as_fd()];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut cmsg = rustix::net::SendAncillaryBuffer::new(&mut space);
        assert!(cmsg.push(rustix::net::SendAncillaryMessage::ScmRights(&fds)));
        let payload: Vec<u8> = (0..200u8).collect();
        let sent =
            rustix::net::sendmsg(&a, &[std::io::IoSlice::new(&payload)], &mut cmsg, rustix::net::SendFlags::empty())
                .expect("send");
        assert_eq!(sent, payload.len());

        let mut room = vec![MaybeUninit::<u8>::uninit(); 4096];
        let mut buf = ReadBuf::uninit(&mut room);
        let (n, got_fds) = recv_into(&b, &mut buf, 150, false).expect("first receive");
        assert_eq!((n, buf.filled()), (150, &payload[..150]));
        assert_eq!(got_fds.len(), 2, "the descriptors come with the first bytes");
        for fd in &got_fds {
            rustix::fs::fstat(fd).expect("a received descriptor is open");
        }
        let (n, more) = recv_into(&b, &mut buf, 4096, false).expect("second receive");
        assert_eq!((n, buf.filled()), (50, &payload[..]));
        assert!(more.is_empty(), "no more descriptors");

        let e = recv_into(&b, &mut buf, 4096, false).expect_err("nothing there");
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        // Every copy of the other end closes (two travelled as descriptors).
        drop((a, keep1, keep2, got_fds));
        assert_eq!(recv_into(&b, &mut buf, 4096, true).expect("the end").0, 0);
        assert_eq!(buf.filled().len(), 200);
    }
}
