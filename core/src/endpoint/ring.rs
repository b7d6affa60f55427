//! The ring's part of the handshake (feature `ring`, Linux; PROTOCOL.md §22): the client
//! offers feature `ring`; a server that grants it creates the ring file and sends its memfd
//! with the WELCOME ([`crate::wire::Welcome::ring`]); the client maps it (`ferry-ring`
//! checks the seals, the size and the header) and answers with a RING frame, the last of
//! the handshake. After `ready` both sides read and write through the ring.

use ferry_ring::{Ring, RingOptions};

use crate::error::{PipeError, ProtocolError};
use crate::frame::{FrameKind, FrameReader, FrameWriter, OutFrame};
use crate::wire::{FEATURE_RING, FEATURE_RING_MESSAGES, Hello, RingAnswer, RingOffer, Welcome};

/// Client: whether to offer the ring (configured, and the connection passes descriptors);
/// when it does, the feature goes into `hello` and the WELCOME may carry one descriptor.
pub(super) fn client_offer(opts: Option<&RingOptions>, reader: &mut FrameReader, hello: &mut Hello) -> bool {
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
    opts: Option<&RingOptions>,
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
    let opts = opts.expect("offered implies options");
    let answer = usize::try_from(offer.capacity)
        .map_err(|_| format!("capacity {} does not fit this machine", offer.capacity))
        .and_then(|cap| Ring::open(fd, cap, opts).map_err(|e| e.to_string()));
    match answer {
        Ok(ring) => {
            writer.write_frame(FrameKind::Ring, OutFrame::json(&RingAnswer::Ready)).await?;
            let (tx, rx) = ring.into_split();
            reader.attach_ring(rx, welcome.features.iter().any(|f| f == FEATURE_RING_MESSAGES));
            writer.attach_ring(tx);
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
    opts: Option<&RingOptions>,
    hello: &Hello,
    reader: &FrameReader,
    welcome: &mut Welcome,
) -> Option<(Ring, std::os::fd::OwnedFd)> {
    let opts = opts?;
    if !hello.features.iter().any(|f| f == FEATURE_RING) || !reader.passes_fds() {
        return None;
    }
    match Ring::create(opts) {
        Ok((ring, fd)) => {
            welcome.features.push(FEATURE_RING.into());
            if hello.features.iter().any(|f| f == FEATURE_RING_MESSAGES) {
                welcome.features.push(FEATURE_RING_MESSAGES.into());
            }
            welcome.ring = Some(RingOffer { capacity: ring.capacity() as u64 });
            Some((ring, fd))
        }
        Err(e) => {
            tracing::warn!("could not make a ring for a client that offered one: {e}");
            None
        }
    }
}

/// Server: reads the client's answer (after the WELCOME went out) and attaches the ring to
/// both halves when it is ready (`packed`: the WELCOME granted
/// [`FEATURE_RING_MESSAGES`]). Returns whether the ring is in use.
pub(super) async fn server_finish(
    ring: Ring,
    packed: bool,
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
            let (tx, rx) = ring.into_split();
            reader.attach_ring(rx, packed);
            writer.attach_ring(tx);
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
