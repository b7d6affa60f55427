//! Target `frame`: the preamble, frame prefixes and headers, read by the real
//! [`FrameReader`] with the limits a server uses.

use ferry_core::frame::{
    self, FrameKind, FramePrefix, FrameReader, FrameWriter, HANDSHAKE_LIMITS, OutFrame, PREAMBLE_LEN, PREFIX_LEN,
};
use ferry_core::{ALIGN, Limits, PipeError};

use crate::{Sink, block_on, reader};

/// Most frames read from one input.
const MAX_FRAMES: usize = 64;

/// Reads `data` as a server reads a connection: the preamble, the first frame under
/// [`HANDSHAKE_LIMITS`], then frames under the default [`Limits`] (what a pipe agrees to
/// unless configured otherwise).
///
/// Asserts: every frame read has the header and payload lengths its prefix announced, a
/// (non-empty) payload aligned to [`ALIGN`], and frames within the limits; the preamble and the frames
/// read, written again by the real [`FrameWriter`], are the bytes they were read from; a
/// prefix decodes and encodes to the same 16 bytes.
pub fn frame(data: &[u8]) {
    if data.len() >= PREFIX_LEN {
        let mut p = [0u8; PREFIX_LEN];
        p.copy_from_slice(&data[..PREFIX_LEN]);
        assert_eq!(FramePrefix::decode(&p).encode(), p, "a prefix must encode to the bytes it came from");
    }
    block_on(read_all(data));
}

async fn read_all(data: &[u8]) {
    let mut r = FrameReader::new(reader(data), None, HANDSHAKE_LIMITS);
    let sink = Sink::default();
    let mut w = FrameWriter::new(Box::new(sink.clone()), None);
    let version = match r.read_preamble().await {
        Ok(v) => v,
        Err(e) => {
            check_error(&e);
            return;
        }
    };
    assert_eq!(frame::parse_preamble(&frame::preamble(version)).ok(), Some(version));
    w.write_preamble(version).await.expect("writing to memory");
    let mut limits = HANDSHAKE_LIMITS;
    for _ in 0..MAX_FRAMES {
        let f = match r.read_frame().await.and_then(ferry_core::frame::Received::into_frame) {
            Ok(f) => f,
            Err(e) => {
                check_error(&e);
                break;
            }
        };
        assert!(f.header.len() <= limits.max_header_bytes as usize, "header over the limit was read");
        assert!(f.payload.len() as u64 <= limits.max_payload_bytes, "payload over the limit was read");
        assert!(f.fds.is_empty(), "descriptors from a connection that carries none");
        assert!(
            f.payload.is_empty() || (f.payload.as_ptr() as usize).is_multiple_of(ALIGN),
            "payload not aligned to ALIGN"
        );
        let kind = f.kind;
        // What a server does with a header next (errors are fine; panics are not).
        let _ = f.parse::<serde_json::Value>();
        let out = OutFrame { header: f.header, payload: vec![f.payload], ..OutFrame::default() };
        w.write_frame(kind, out).await.expect("writing to memory");
        if kind == FrameKind::Hello {
            // The handshake is over: the agreed limits from now on.
            limits = Limits::default();
            r.set_limits(limits);
        }
    }
    let written = sink.bytes();
    assert!(written.len() >= PREAMBLE_LEN);
    assert_eq!(&data[..written.len().min(data.len())], &written[..], "frames read and written again differ");
}

/// Errors a reader may return on hostile bytes; anything else is a finding.
fn check_error(e: &PipeError) {
    match e {
        PipeError::Closed
        | PipeError::ClosedByPeer(_)
        | PipeError::Protocol(_)
        | PipeError::Limit(_)
        | PipeError::Transport(_) => {}
        other => panic!("unexpected error reading frames: {other:?}"),
    }
}
