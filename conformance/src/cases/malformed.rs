//! Malformed input: hand-made frames after a good handshake. Each gives the receiver a typed
//! error, the sender a CLOSE frame saying why, then end of stream (a clean close).

use std::time::Duration;

use ferry_core::frame::{FrameKind, FramePrefix};
use ferry_core::{Limits, PipeError, ProtocolError};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use crate::peer::RawConn;
use crate::util::fail;
use crate::{Fixture, Outcome, ensure, run_async};

const LIMIT: Duration = Duration::from_secs(60);

fn frame(kind: u8, flags: u8, fds: u16, header: &[u8], payload: &[u8]) -> Vec<u8> {
    let p = FramePrefix { kind, flags, fds, header_len: header.len() as u32, payload_len: payload.len() as u64 };
    let mut v = p.encode().to_vec();
    v.extend_from_slice(header);
    v.extend_from_slice(payload);
    v
}

fn message(header: Value, payload: &[u8]) -> Vec<u8> {
    frame(FrameKind::Message as u8, 0, 0, &serde_json::to_vec(&header).unwrap_or_default(), payload)
}

fn one_tensor(meta: Value, offset: u64, len: u64) -> Value {
    json!({"header": null, "tensors": [{"meta": meta, "data": {"inline": {"offset": offset, "len": len}}}]})
}

/// What the receiver must report.
#[derive(Clone, Copy)]
enum Want {
    Protocol,
    BadTensor,
    Limit(&'static str),
    Closed,
}

impl Want {
    fn matches(self, e: &PipeError) -> bool {
        match self {
            Want::Protocol => matches!(e, PipeError::Protocol(_)),
            Want::BadTensor => matches!(e, PipeError::Protocol(ProtocolError::BadTensor { .. })),
            Want::Limit(l) => matches!(e, PipeError::Limit(x) if x.limit == l),
            Want::Closed => matches!(e, PipeError::Closed),
        }
    }
}

/// Sends `bytes` after a good handshake; checks the server's error and the close.
fn bad_input<F: Fixture>(fx: &F, tag: &str, limits: Limits, bytes: Vec<u8>, hang_up: bool, want: Want) -> Outcome {
    run_async(LIMIT, async {
        let addr = fx.addr(tag);
        let mut l = fx.endpoint().limits(limits).build().listen(&addr).await.map_err(fail("listen"))?;
        let mut raw = RawConn::connect(fx, &addr).await?;
        raw.handshake().await?;
        let pipe = l.accept().await.map_err(fail("accept"))?;
        raw.write_raw(&bytes).await?;
        if hang_up {
            let _ = raw.write.shutdown().await;
        }
        let r = pipe.recv_timeout(Duration::from_secs(5)).await;
        let e = match r {
            Err(e) => e,
            Ok(m) => return Err(format!("bad input was delivered as a message: {:?}", m.header).into()),
        };
        ensure!(want.matches(&e), "receiver got {e:?}");
        ensure!(!e.to_string().is_empty(), "empty error message");
        if !hang_up {
            let close = raw.expect_close().await?;
            ensure!(close.code == "protocol_error" || close.code == "limit", "close code {:?}", close.code);
            ensure!(!close.message.is_empty(), "CLOSE frame without a reason");
        }
        let again = pipe.recv_timeout(Duration::from_secs(1)).await;
        ensure!(matches!(again, Err(PipeError::Closed)), "after the error, recv gave {again:?}");
        let send = pipe.send(ferry_core::Message::new(json!(0))).await;
        ensure!(send.is_err(), "send on a pipe closed for bad input succeeded");
        Ok(())
    })
}

/// A frame kind that does not exist.
pub fn unknown_kind<F: Fixture>(fx: &F) -> Outcome {
    bad_input(fx, "kind", Limits::default(), frame(99, 0, 0, b"{}", &[]), false, Want::Protocol)
}

/// Reserved flag bits set.
pub fn reserved_flags<F: Fixture>(fx: &F) -> Outcome {
    let bytes = frame(FrameKind::Message as u8, 0x80, 0, br#"{"header":null,"tensors":[]}"#, &[]);
    bad_input(fx, "flags", Limits::default(), bytes, false, Want::Protocol)
}

/// A header that is not JSON.
pub fn header_not_json<F: Fixture>(fx: &F) -> Outcome {
    let bytes = frame(FrameKind::Message as u8, 0, 0, b"{\"header\": nope", &[]);
    bad_input(fx, "json", Limits::default(), bytes, false, Want::Protocol)
}

/// A header length over the receiver's limit is refused before it is read.
pub fn header_over_limit<F: Fixture>(fx: &F) -> Outcome {
    let limits = Limits { max_header_bytes: 4096, ..Limits::default() };
    let p = FramePrefix { kind: FrameKind::Message as u8, flags: 0, fds: 0, header_len: u32::MAX, payload_len: 0 };
    bad_input(fx, "hdr-limit", limits, p.encode().to_vec(), false, Want::Limit("max_header_bytes"))
}

/// A payload length over the receiver's limit is refused before it is read.
pub fn payload_over_limit<F: Fixture>(fx: &F) -> Outcome {
    let limits = Limits { max_payload_bytes: 1 << 20, ..Limits::default() };
    let h =
        serde_json::to_vec(&one_tensor(json!({"dtype": "u8", "shape": [1u64 << 40]}), 0, 1 << 40)).unwrap_or_default();
    let p = FramePrefix {
        kind: FrameKind::Message as u8,
        flags: 0,
        fds: 0,
        header_len: h.len() as u32,
        payload_len: 1 << 40,
    };
    let mut bytes = p.encode().to_vec();
    bytes.extend_from_slice(&h);
    bad_input(fx, "payload-limit", limits, bytes, false, Want::Limit("max_payload_bytes"))
}

/// More file descriptors announced than the limit allows.
pub fn too_many_fds<F: Fixture>(fx: &F) -> Outcome {
    let bytes = frame(FrameKind::Message as u8, 0, 1000, br#"{"header":null,"tensors":[]}"#, &[]);
    bad_input(fx, "fd-limit", Limits::default(), bytes, false, Want::Limit("max_fds"))
}

/// Descriptors announced in the prefix that never arrive.
pub fn fds_announced_not_sent<F: Fixture>(fx: &F) -> Outcome {
    let bytes = frame(FrameKind::Message as u8, 0, 2, br#"{"header":null,"tensors":[]}"#, &[]);
    bad_input(fx, "fd-missing", Limits::default(), bytes, false, Want::Protocol)
}

/// A tensor range that runs past the payload.
pub fn range_outside_payload<F: Fixture>(fx: &F) -> Outcome {
    let bytes = message(one_tensor(json!({"dtype": "f32", "shape": [4]}), 8, 16), &[0u8; 16]);
    bad_input(fx, "range", Limits::default(), bytes, false, Want::BadTensor)
}

/// A descriptor whose shape needs more bytes than its range has.
pub fn length_lies<F: Fixture>(fx: &F) -> Outcome {
    let bytes = message(one_tensor(json!({"dtype": "f64", "shape": [1000, 1000]}), 0, 64), &[0u8; 64]);
    bad_input(fx, "length", Limits::default(), bytes, false, Want::BadTensor)
}

/// A shape whose element count overflows 64 bits.
pub fn shape_overflows<F: Fixture>(fx: &F) -> Outcome {
    let meta = json!({"dtype": "f64", "shape": [u64::MAX, u64::MAX, 2]});
    let bytes = message(one_tensor(meta, 0, 8), &[0u8; 8]);
    bad_input(fx, "overflow", Limits::default(), bytes, false, Want::BadTensor)
}

/// A negative stride.
pub fn negative_stride<F: Fixture>(fx: &F) -> Outcome {
    let meta = json!({"dtype": "u8", "shape": [4], "strides": [-1]});
    let bytes = message(one_tensor(meta, 0, 4), &[0u8; 4]);
    bad_input(fx, "neg-stride", Limits::default(), bytes, false, Want::BadTensor)
}

/// More dimensions than ferry allows.
pub fn too_many_dims<F: Fixture>(fx: &F) -> Outcome {
    let meta = json!({"dtype": "u8", "shape": vec![1u64; 65]});
    let bytes = message(one_tensor(meta, 0, 1), &[0u8; 1]);
    bad_input(fx, "dims", Limits::default(), bytes, false, Want::BadTensor)
}

/// More tensors in one message than the receiver's limit.
pub fn too_many_tensors<F: Fixture>(fx: &F) -> Outcome {
    let limits = Limits { max_tensors: 10, ..Limits::default() };
    let t = json!({"meta": {"dtype": "u8", "shape": [0]}, "data": {"inline": {"offset": 0, "len": 0}}});
    let bytes = message(json!({"header": null, "tensors": vec![t; 11]}), &[]);
    bad_input(fx, "tensor-limit", limits, bytes, false, Want::Limit("max_tensors"))
}

/// A dtype ferry does not know.
pub fn unknown_dtype<F: Fixture>(fx: &F) -> Outcome {
    let bytes = message(one_tensor(json!({"dtype": "f128", "shape": [1]}), 0, 16), &[0u8; 16]);
    bad_input(fx, "dtype", Limits::default(), bytes, false, Want::Protocol)
}

/// A compact tensor descriptor (PROTOCOL.md §7.3) with an element missing.
pub fn compact_descriptor_short<F: Fixture>(fx: &F) -> Outcome {
    let bytes = message(json!({"header": null, "tensors": [["u8", [4], "inline", 0]]}), &[0u8; 4]);
    bad_input(fx, "compact-short", Limits::default(), bytes, false, Want::Protocol)
}

/// Compact and object descriptors side by side are read alike, from a peer that did not
/// even ask for the feature (receivers take both forms, PROTOCOL.md §7.3).
pub fn compact_descriptors_are_read<F: Fixture>(fx: &F) -> Outcome {
    run_async(LIMIT, async {
        let addr = fx.addr("compact-read");
        let mut l = fx.endpoint().build().listen(&addr).await.map_err(fail("listen"))?;
        let mut raw = RawConn::connect(fx, &addr).await?;
        let welcome = raw.handshake().await?;
        ensure!(welcome.features.is_empty(), "features granted that were not asked for: {:?}", welcome.features);
        let pipe = l.accept().await.map_err(fail("accept"))?;
        let header = json!({"header": "both", "tensors": [
            ["u16", [2, 2], "inline", 0, 8],
            {"meta": {"dtype": "u8", "shape": [3]}, "data": {"inline": {"offset": 64, "len": 3}}},
        ]});
        let mut payload = vec![0u8; 67];
        payload[..8].copy_from_slice(&[1, 0, 2, 0, 3, 0, 4, 0]);
        payload[64..].copy_from_slice(&[7, 8, 9]);
        raw.write_raw(&message(header, &payload)).await?;
        let m = pipe.recv_timeout(Duration::from_secs(5)).await.map_err(fail("recv"))?;
        ensure!(m.header == json!("both") && m.tensors.len() == 2, "got {:?}", m.header);
        ensure!(m.tensors[0].meta() == &ferry_core::TensorMeta::new(ferry_core::DType::U16, vec![2, 2]), "meta");
        ensure!(m.tensors[0].as_bytes() == [1, 0, 2, 0, 3, 0, 4, 0], "compact tensor bytes");
        ensure!(m.tensors[1].as_bytes() == [7, 8, 9], "object tensor bytes");
        Ok(())
    })
}

/// Half a frame, then end of stream: `Closed`, and nothing delivered.
pub fn truncated_frame<F: Fixture>(fx: &F) -> Outcome {
    let mut bytes = message(one_tensor(json!({"dtype": "u8", "shape": [4096]}), 0, 4096), &[1u8; 4096]);
    bytes.truncate(bytes.len() - 1000);
    bad_input(fx, "truncated", Limits::default(), bytes, true, Want::Closed)
}

/// A HELLO after the handshake.
pub fn second_hello<F: Fixture>(fx: &F) -> Outcome {
    bad_input(
        fx,
        "hello-again",
        Limits::default(),
        frame(FrameKind::Hello as u8, 0, 0, b"{}", &[]),
        false,
        Want::Protocol,
    )
}

/// Garbage instead of the preamble: the server's `accept` reports it and drops the
/// connection; the client sees end of stream.
pub fn bad_magic<F: Fixture>(fx: &F) -> Outcome {
    preamble_case(fx, "magic", b"GARBAGE!\x00\x01\x02\x03".to_vec(), "expected the ferry magic")
}

/// A plain JSON-RPC client on a frame socket gets a clear error, not a hang.
pub fn jsonrpc_on_frame_socket<F: Fixture>(fx: &F) -> Outcome {
    preamble_case(fx, "jsonrpc", b"{\"jsonrpc\":\"2.0\",\"method\":\"x\",\"id\":1}\n".to_vec(), "JSON-RPC")
}

fn preamble_case<F: Fixture>(fx: &F, tag: &str, bytes: Vec<u8>, needle: &'static str) -> Outcome {
    run_async(LIMIT, async {
        let addr = fx.addr(tag);
        let mut l = fx.endpoint().build().listen(&addr).await.map_err(fail("listen"))?;
        let mut raw = RawConn::connect(fx, &addr).await?;
        raw.write_raw(&bytes).await?;
        let r = tokio::time::timeout(Duration::from_secs(5), l.accept()).await.map_err(|_| "accept hung")?;
        ensure!(
            matches!(&r, Err(PipeError::Protocol(ProtocolError::BadMagic { .. }))),
            "server accept gave {:?}",
            r.as_ref().map(|_| "a pipe")
        );
        let text = r.err().map(|e| e.to_string()).unwrap_or_default();
        ensure!(text.contains(needle), "message {text:?} lacks {needle:?}");
        // The server reads before it writes: a foreign client gets no binary reply, just
        // end of stream.
        let end = tokio::time::timeout(Duration::from_secs(5), raw.reader.read_preamble()).await;
        ensure!(matches!(end, Ok(Err(PipeError::Closed))), "expected end of stream, got {end:?}");
        Ok(())
    })
}
