//! Handing a ring file to the peer over a unix stream socket: the descriptor (SCM_RIGHTS)
//! plus its ring capacity (8 bytes, little-endian), in one message. A minimal stand-in for
//! the handshake, used by this crate's tests and benchmark; the Pipe integration will send
//! the descriptor with the local transport's own descriptor passing instead.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
};

/// Sends `fd` and `capacity` over `socket`.
pub fn send_ring_fd(socket: impl AsFd, fd: impl AsFd, capacity: usize) -> io::Result<()> {
    let fds = [fd.as_fd()];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut cmsg = SendAncillaryBuffer::new(&mut space);
    if !cmsg.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other("control buffer too small"));
    }
    let bytes = (capacity as u64).to_le_bytes();
    let n = rustix::net::sendmsg(socket, &[IoSlice::new(&bytes)], &mut cmsg, SendFlags::NOSIGNAL)?;
    if n != bytes.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "short write of the ring capacity"));
    }
    Ok(())
}

/// Receives a descriptor and a capacity sent by [`send_ring_fd`]. The capacity is only
/// what the peer claims: [`crate::Ring::open`] checks it against the file.
pub fn recv_ring_fd(socket: impl AsFd) -> io::Result<(OwnedFd, usize)> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut cmsg = RecvAncillaryBuffer::new(&mut space);
    let mut bytes = [0u8; 8];
    let msg = rustix::net::recvmsg(socket, &mut [IoSliceMut::new(&mut bytes)], &mut cmsg, RecvFlags::CMSG_CLOEXEC)?;
    let mut fd = None;
    for m in cmsg.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = m {
            for f in fds {
                fd.get_or_insert(f); // any further descriptor is dropped (closed)
            }
        }
    }
    if msg.bytes != bytes.len() {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "no ring capacity (peer closed?)"));
    }
    let fd = fd.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no descriptor with the ring capacity"))?;
    let cap = usize::try_from(u64::from_le_bytes(bytes))
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "ring capacity out of range"))?;
    Ok((fd, cap))
}
