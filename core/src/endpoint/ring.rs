//! The ring's part of the handshake (PROTOCOL.md §22): the client offers feature `ring`;
//! a server that grants it has its [`LinkProvider`] make the ring file and sends its memfd
//! with the WELCOME ([`crate::wire::Welcome::ring`]); the client's provider maps it
//! (`ferry-ring` checks the seals, the size and the header) and the client answers with a
//! RING frame, the last of the handshake. After `ready` both sides read and write through
//! the link.

use crate::error::{PipeError, ProtocolError};
use crate::frame::{FrameKind, FrameReader, FrameWriter, Link, LinkProvider, OutFrame};
use crate::wire::{FEATURE_RING, FEATURE_RING_MESSAGES, Hello, RingAnswer, RingOffer, Welcome};

/// Client: whether to offer the ring (configured, and the connection passes descriptors);
/// when it does, the feature goes into `hello` and the WELCOME may carry one descriptor.
pub(super) fn client_offer(opts: Option<&dyn LinkProvider>, reader: &mut FrameReader, hello: &mut Hello) -> bool {
    if opts.is_none() || !reader.passes_fds() {
        return false;
    }
    hello.features.push(FEATURE_RING.into());
    hello.features.push(FEATURE_RING_MESSAGES.into());
    reader.set_limits(crate::wire::Limits { max_fds: 1, ..crate::frame::HANDSHAKE_LIMITS });
    true
}

/// Client: checks what the WELCOME says about the ring against what was offered, maps it,
/// answers, and attaches it to both halves when ready; returns whether the ring is in use.
/// A ring that cannot be mapped is refused (both sides stay on the socket); a WELCOME that
/// breaks the rules fails the handshake.
pub(super) async fn client_finish(
    opts: Option<&dyn LinkProvider>,
    offered: bool,
    welcome: &Welcome,
    fds: Vec<std::os::fd::OwnedFd>,
    reader: &mut FrameReader,
    writer: &mut FrameWriter,
) -> Result<bool, PipeError> {
    let granted = welcome.features.iter().any(|f| f == FEATURE_RING);
    let (offer, fd) = match (welcome.ring, granted, fds.len()) {
        (None, false, 0) => return Ok(false),
        (Some(offer), true, 1) if offered => (offer, fds.into_iter().next().expect("one descriptor")),
        (ring, _, n) => {
            return Err(ProtocolError::Ring(format!(
                "the WELCOME {} a ring (feature {granted}, {n} descriptors) that this client {}",
                if ring.is_some() { "offers" } else { "does not describe" },
                if offered { "offered" } else { "did not offer" }
            ))
            .into());
        }
    };
    let Some(opts) = opts else {
        return Err(PipeError::ApiMisuse("a ring was offered without a link provider".into()));
    };
    let packed = welcome.features.iter().any(|f| f == FEATURE_RING_MESSAGES);
    match opts.open(fd, offer.capacity, packed) {
        Ok(link) => {
            writer.write_frame(FrameKind::Ring, OutFrame::json(&RingAnswer::Ready)).await?;
            attach(link, reader, writer);
            Ok(true)
        }
        Err(reason) => {
            tracing::warn!("refusing the server's ring, staying on the socket: {reason}");
            writer.write_frame(FrameKind::Ring, OutFrame::json(&RingAnswer::Refused { reason })).await?;
            Ok(false)
        }
    }
}

/// Server: makes the ring when the client offered it, this side has one configured and
/// the connection passes descriptors; grants it in `welcome` and returns the ring and the
/// descriptor to send with the WELCOME. A ring that cannot be made is logged and not
/// offered.
pub(super) fn server_make(
    opts: Option<&dyn LinkProvider>,
    hello: &Hello,
    reader: &FrameReader,
    welcome: &mut Welcome,
) -> Option<(Link, std::os::fd::OwnedFd)> {
    let opts = opts?;
    if !hello.features.iter().any(|f| f == FEATURE_RING) || !reader.passes_fds() {
        return None;
    }
    let packed = hello.features.iter().any(|f| f == FEATURE_RING_MESSAGES);
    match opts.create(packed) {
        Ok((capacity, link, fd)) => {
            welcome.features.push(FEATURE_RING.into());
            if packed {
                welcome.features.push(FEATURE_RING_MESSAGES.into());
            }
            welcome.ring = Some(RingOffer { capacity });
            Some((link, fd))
        }
        Err(e) => {
            tracing::warn!("could not make a ring for a client that offered one: {e}");
            None
        }
    }
}

/// Server: reads the client's answer (after the WELCOME went out) and attaches the link to
/// both halves when it is ready. Returns whether the ring is in use.
pub(super) async fn server_finish(
    link: Link,
    reader: &mut FrameReader,
    writer: &mut FrameWriter,
) -> Result<bool, PipeError> {
    let frame = reader.read_frame().await?.into_frame()?;
    if frame.kind != FrameKind::Ring {
        return Err(
            ProtocolError::UnexpectedFrame { kind: frame.kind as u8, context: "expected the RING answer" }.into()
        );
    }
    match frame.parse::<RingAnswer>()? {
        RingAnswer::Ready => {
            attach(link, reader, writer);
            Ok(true)
        }
        RingAnswer::Refused { reason } => {
            tracing::info!(
                "the client refused the ring, staying on the socket: {}",
                crate::logsafe::peer_text(&reason)
            );
            Ok(false)
        }
    }
}

/// Reads and writes through `link` from now on.
fn attach(link: Link, reader: &mut FrameReader, writer: &mut FrameWriter) {
    reader.attach_link(link.read);
    writer.attach_link(link.write);
}
