//! The ring as ferry-core's [`LinkProvider`]: the server makes the ring file, the client
//! maps it (checking the seals, the size and the header), each side splits it into the
//! two halves of a link; [`RingExt::ring`] sets it on an `EndpointBuilder`.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use ferry_core::EndpointBuilder;
use ferry_core::frame::{Link, LinkProvider};

use super::{RingRead, RingWrite};
use crate::{Ring, RingOptions};

/// The same-host ring as the link an endpoint offers and grants (PROTOCOL.md §22), made
/// and mapped with these options.
#[derive(Debug, Clone, Default)]
pub struct RingLink(pub RingOptions);

impl RingLink {
    fn link(ring: Ring, packed: bool) -> Link {
        let (tx, rx) = ring.into_split();
        Link { read: Box::new(RingRead::new(rx, packed)), write: Box::new(RingWrite::new(tx, packed)) }
    }
}

impl LinkProvider for RingLink {
    fn create(&self, packed: bool) -> Result<(u64, Link, OwnedFd), String> {
        let (ring, fd) = Ring::create(&self.0).map_err(|e| e.to_string())?;
        Ok((ring.capacity() as u64, RingLink::link(ring, packed), fd))
    }

    fn open(&self, fd: OwnedFd, capacity: u64, packed: bool) -> Result<Link, String> {
        let cap = usize::try_from(capacity).map_err(|_| format!("capacity {capacity} does not fit this machine"))?;
        let ring = Ring::open(fd, cap, &self.0).map_err(|e| e.to_string())?;
        Ok(RingLink::link(ring, packed))
    }
}

/// Sets the same-host ring on an [`EndpointBuilder`] (`use ferry_ring::RingExt`, or
/// `ferry::RingExt` from the facade).
pub trait RingExt: Sized {
    /// Use the same-host ring (Linux; PROTOCOL.md §22) where the peer has one too and the
    /// connection passes descriptors (unix sockets): after the handshake, frames travel
    /// through two shared-memory rings (a sealed memfd the server makes) instead of the
    /// socket, which carries only what the rings cannot (frames with descriptors, frames
    /// larger than a ring's largest record) and the doorbell that wakes a reader waiting
    /// on it. `opts` sets the capacity of each ring (the most this side makes, or maps when
    /// the peer made it) and how long a blocking caller spins; the pipe's own reader polls
    /// the ring only while busy polling is armed (`EndpointBuilder::busy_poll`). `None`
    /// (the default) offers and grants no ring.
    fn ring(self, opts: Option<RingOptions>) -> Self;
}

impl RingExt for EndpointBuilder {
    fn ring(self, opts: Option<RingOptions>) -> Self {
        self.link(opts.map(|o| Arc::new(RingLink(o)) as Arc<dyn LinkProvider>))
    }
}
