//! The packed message record on the wire (ring record tag 2, PROTOCOL.md §22.5): records
//! built by hand decode to the messages they describe and the encoder writes exactly them;
//! a server packs only for a client that asked; a peer that lies in tag-2 records, or sends
//! one without the feature, gets typed errors, and the socket ends with a CLOSE that says
//! why. Real unix sockets and shared memory, one process.

#![cfg(target_os = "linux")]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::packed::*;
use common::{addr, bytes_tensor, endpoint, has_ring};
use ferry_core::frame::{FrameKind, OutFrame};
use ferry_core::wire::FEATURE_RING_MESSAGES;
use ferry_core::{DType, Endpoint, Limits, Message, Pipe, PipeError, ProtocolError, Tensor, TensorMeta};
use ferry_ring::RingOptions;
use serde_json::{Value, json};

// ---- Records built by hand (PROTOCOL.md §22.5; core's pipe/packed.rs module docs). ----

/// One tensor of a hand-built record: the dtype number (its index in the wire order), the
/// shape, the byte length it claims, and the bytes it has.
#[derive(Clone)]
struct Part {
    dtype: u8,
    shape: Vec<u64>,
    nbytes: u64,
    data: Vec<u8>,
}

/// Wire dtype numbers (PROTOCOL.md §22.5), written out here, not taken from the code.
const DT_BOOL: u8 = 0;
const DT_U8: u8 = 1;
const DT_I64: u8 = 8;
const DT_BF16: u8 = 10;
const DT_F32: u8 = 11;
const DT_F64: u8 = 12;

/// A tensor part that tells the truth.
fn part(dtype: u8, shape: &[u64], data: &[u8]) -> Part {
    Part { dtype, shape: shape.to_vec(), nbytes: data.len() as u64, data: data.to_vec() }
}

/// A packed-message record, by the book: u32 header length, u32 tensor count, the JSON
/// header padded with zeros to a multiple of 8, per tensor a 16-byte descriptor (dtype u8,
/// ndim u8, 6 zero bytes, byte length u64) and its shape (ndim × u64), then the data, each
/// tensor at the next multiple of 64 from the data's start; the record ends with the last
/// tensor's last byte. All little-endian.
fn record(header: &str, count: u32, parts: &[Part]) -> Vec<u8> {
    let mut r = Vec::new();
    r.extend_from_slice(&(header.len() as u32).to_le_bytes());
    r.extend_from_slice(&count.to_le_bytes());
    r.extend_from_slice(header.as_bytes());
    while r.len() % 8 != 0 {
        r.push(0);
    }
    for p in parts {
        r.push(p.dtype);
        r.push(p.shape.len() as u8);
        r.extend_from_slice(&[0; 6]);
        r.extend_from_slice(&p.nbytes.to_le_bytes());
        for d in &p.shape {
            r.extend_from_slice(&d.to_le_bytes());
        }
    }
    let data_start = r.len();
    for p in parts {
        while (r.len() - data_start) % 64 != 0 {
            r.push(0);
        }
        r.extend_from_slice(&p.data);
    }
    r
}

/// A server pipe and a hand-made client past the ring handshake, the client offering
/// `features`.
async fn raw_connection(server: &Endpoint, features: &[&str]) -> (Arc<Pipe>, common::RawClient, Vec<String>) {
    let a = addr("raw");
    let mut l = server.listen(&a).await.unwrap();
    let accept = tokio::spawn(async move { l.accept().await });
    let (client, granted) = common::raw_ring_client_offering(&a, features).await;
    let s = tokio::time::timeout(BOUND, accept).await.expect("accepted").unwrap().unwrap();
    assert!(has_ring(&s));
    (Arc::new(s), client, granted)
}

/// The next record the server published to the hand-made client (bounded polling).
async fn next_record(ring: &mut ferry_ring::Ring) -> (u32, Vec<u8>) {
    let bound = Instant::now() + BOUND;
    let mut buf = Vec::new();
    loop {
        if let Some(tag) = ring.try_recv(&mut buf).expect("the server's ring is sound") {
            return (tag, buf);
        }
        assert!(Instant::now() < bound, "no record from the server within the bound");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The hand-made client publishes a tag-2 record and rings the doorbell.
async fn publish(client: &mut common::RawClient, tag: u32, rec: &[u8]) {
    client.ring.send_tagged(tag, rec, ferry_ring::deadline_in(BOUND)).unwrap();
    // A reader waiting on the socket needs the doorbell; one sleeping on the ring was woken
    // by the publish (and one that already failed may have closed: best effort).
    let _ = client.writer.write_frame(FrameKind::Ring, OutFrame::default()).await;
}

/// The messages of [`hand_built_records_are_the_wire_format`] and their records.
fn well_formed() -> Vec<(Message, Vec<u8>)> {
    let f32s: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|f| f.to_le_bytes()).collect();
    let pi = std::f64::consts::PI.to_le_bytes();
    let i64s: Vec<u8> = [-1i64, 0, i64::MAX, i64::MIN].iter().flat_map(|v| v.to_le_bytes()).collect();
    let bf16 = [0x80u8, 0x3f, 0x00, 0x40, 0x40, 0xc0]; // 1.0, 2.0, -3.0
    let full = (
        Message::with_tensors(
            json!({"op": "hand"}),
            vec![
                Tensor::from_slice(vec![2], &[1.0f32, 2.0]).unwrap(),
                Tensor::from_slice(vec![3], &[1u8, 2, 3]).unwrap(),
                Tensor::from_slice(Vec::<u64>::new(), &[std::f64::consts::PI]).unwrap(),
                Tensor::from_slice(vec![2, 2], &[-1i64, 0, i64::MAX, i64::MIN]).unwrap(),
                raw_tensor(TensorMeta::new(DType::Bf16, vec![3]), &bf16),
            ],
        ),
        record(
            r#"{"op":"hand"}"#,
            5,
            &[
                part(DT_F32, &[2], &f32s),
                part(DT_U8, &[3], &[1, 2, 3]),
                part(DT_F64, &[], &pi),
                part(DT_I64, &[2, 2], &i64s),
                part(DT_BF16, &[3], &bf16),
            ],
        ),
    );
    let bare = (Message::new(Value::Null), record("null", 0, &[]));
    let empty_last = (
        Message::with_tensors(
            json!([1, "two"]),
            vec![
                Tensor::from_slice(vec![3], &[1u8, 0, 1]).unwrap(),
                Tensor::zeros(TensorMeta::new(DType::F32, vec![0, 4])).unwrap(),
            ],
        ),
        record(r#"[1,"two"]"#, 2, &[part(DT_U8, &[3], &[1, 0, 1]), part(DT_F32, &[0, 4], &[])]),
    );
    let one_bool = (
        Message::with_tensors(json!("b"), vec![raw_tensor(TensorMeta::new(DType::Bool, vec![2]), &[1, 0])]),
        record(r#""b""#, 1, &[part(DT_BOOL, &[2], &[1, 0])]),
    );
    vec![full, bare, empty_last, one_bool]
}

/// Records built by hand by a client offering `ring_messages` are received as the
/// messages they describe (by `recv` and by `recv_blocking`), and the server packs those
/// messages into exactly those bytes: the format is pinned both ways, independently of
/// the encoder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_built_records_are_the_wire_format() {
    // The dtype numbers are the wire order.
    for (n, d) in [
        (DT_BOOL, DType::Bool),
        (DT_U8, DType::U8),
        (DT_I64, DType::I64),
        (DT_BF16, DType::Bf16),
        (DT_F32, DType::F32),
        (DT_F64, DType::F64),
    ] {
        assert_eq!(DType::ALL[usize::from(n)], d);
    }
    let cases = well_formed();
    // The helper's arithmetic, checked once by hand: a 13-byte header padded to 16; the
    // descriptors 24 + 24 + 16 + 32 + 24 bytes; the data at 0, 64, 128, 192, 256 (+6).
    assert_eq!(cases[0].1.len(), 8 + 16 + 120 + 262);
    assert_eq!(&cases[0].1[..8], &[13, 0, 0, 0, 5, 0, 0, 0]);
    assert_eq!(&cases[0].1[24..40], &[DT_F32, 1, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(cases[1].1, [4, 0, 0, 0, 0, 0, 0, 0, b'n', b'u', b'l', b'l', 0, 0, 0, 0]);
    // The empty last tensor starts at 64: the record ends there, 61 zeros after the 3 bytes.
    assert_eq!(cases[2].1.len(), 8 + 16 + (24 + 32) + 64);

    let ep = endpoint(Some(RingOptions::default()), false);
    let (s, mut client, granted) = raw_connection(&ep, &["ring", FEATURE_RING_MESSAGES]).await;
    assert!(granted.iter().any(|f| f == FEATURE_RING_MESSAGES), "{granted:?}");
    assert!(packs(&s));
    for (i, (want, rec)) in cases.iter().enumerate() {
        // By `recv`.
        publish(&mut client, TAG_MESSAGE, rec).await;
        assert_same(&recv(&s).await.unwrap(), want, &format!("case {i}, recv"));
        // By `recv_blocking`.
        publish(&mut client, TAG_MESSAGE, rec).await;
        let s2 = s.clone();
        let got = join(std::thread::spawn(move || s2.recv_blocking(LONG))).await.unwrap();
        assert_same(&got, want, &format!("case {i}, recv_blocking"));
        // And back: `send`, then `send_blocking`, give exactly these bytes.
        s.send(want.clone()).await.unwrap();
        let (tag, got) = next_record(&mut client.ring).await;
        assert_eq!(tag, TAG_MESSAGE, "case {i}: send packs");
        assert_eq!(&got, rec, "case {i}: send's record");
        let s2 = s.clone();
        let want2 = want.clone();
        join(std::thread::spawn(move || s2.send_blocking(want2))).await.unwrap();
        let (tag, got) = next_record(&mut client.ring).await;
        assert_eq!(tag, TAG_MESSAGE, "case {i}: send_blocking packs");
        assert_eq!(&got, rec, "case {i}: send_blocking's record");
    }
    assert!(!s.is_closed());
}

/// A server grants `ring_messages` only to a client that offers it, and packs messages
/// only for such a client: to one offering just `ring` it sends MESSAGE frames in tag-0
/// records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_packs_only_for_a_client_that_asked() {
    let ep = endpoint(Some(RingOptions::default()), false);
    for (offer, want) in [(&["ring"][..], false), (&["ring", FEATURE_RING_MESSAGES][..], true)] {
        let (s, mut client, granted) = raw_connection(&ep, offer).await;
        assert!(granted.iter().any(|f| f == "ring"), "{granted:?}");
        assert_eq!(granted.iter().any(|f| f == FEATURE_RING_MESSAGES), want, "{offer:?}: {granted:?}");
        assert_eq!(packs(&s), want, "{offer:?}");
        let m = Message::with_tensors(json!("x"), vec![bytes_tensor(10, 1)]);
        s.send(m.clone()).await.unwrap();
        let (tag, rec) = next_record(&mut client.ring).await;
        if want {
            assert_eq!(tag, TAG_MESSAGE);
            assert_eq!(rec, record(r#""x""#, 1, &[part(DT_U8, &[10], bytes_tensor(10, 1).as_bytes())]));
        } else {
            assert_eq!(tag, 0, "a frames record");
            // A MESSAGE frame (kind 4) with its JSON header.
            assert_eq!(rec[0], FrameKind::Message as u8);
            let header_len = u32::from_le_bytes(rec[4..8].try_into().unwrap()) as usize;
            let header: Value = serde_json::from_slice(&rec[16..16 + header_len]).unwrap();
            assert_eq!(header["header"], json!("x"), "{header}");
        }
    }
}

/// The server got `record` (tag 2) from a hand-made client that offered `ring_messages`,
/// reading with `recv` or (`blocking`) `recv_blocking` on a plain thread: returns the error
/// it failed with, after checking that the pipe is closed, that the socket ends, and that
/// the CLOSE frame the server put in its ring says why.
async fn lie_and_fail(record: &[u8], blocking: bool) -> PipeError {
    let server = limited_endpoint(Limits { max_tensors: 4, max_payload_bytes: 1 << 16, ..Limits::default() });
    let (s, mut client, granted) = raw_connection(&server, &["ring", FEATURE_RING_MESSAGES]).await;
    assert!(granted.iter().any(|f| f == FEATURE_RING_MESSAGES), "{granted:?}");
    assert!(packs(&s));
    let call = blocking.then(|| {
        let s2 = s.clone();
        std::thread::spawn(move || s2.recv_blocking(LONG))
    });
    publish(&mut client, TAG_MESSAGE, record).await;
    let e = match call {
        Some(t) => join(t).await.expect_err("the blocking caller fails"),
        None => recv(&s).await.expect_err("the server fails"),
    };
    assert!(s.is_closed(), "{e:?}");
    let later = recv(&s).await;
    assert!(matches!(later, Err(PipeError::Closed)), "later: {later:?}");
    // The server closed the connection: the hand-made client reads to the end of the
    // stream (doorbells may come first).
    let end = tokio::time::timeout(BOUND, async {
        loop {
            match client.reader.read_frame().await.and_then(ferry_core::frame::Received::into_frame) {
                Ok(f) if f.kind == FrameKind::Close || f.kind == FrameKind::Ring => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("the socket ends");
    assert!(matches!(end, Err(PipeError::Closed)), "{end:?}");
    // The CLOSE went into the ring before the end: a frames record with the reason.
    let mut buf = Vec::new();
    let close = (0..16)
        .find_map(|_| match client.ring.try_recv(&mut buf) {
            Ok(Some(0)) if buf.first() == Some(&(FrameKind::Close as u8)) => {
                let header_len = u32::from_le_bytes(buf[4..8].try_into().unwrap()) as usize;
                Some(serde_json::from_slice::<Value>(&buf[16..16 + header_len]).unwrap())
            }
            Ok(Some(_)) => None,
            Ok(None) | Err(_) => Some(Value::Null),
        })
        .unwrap_or(Value::Null);
    let code = if matches!(e, PipeError::Limit(_)) { "limit" } else { "protocol_error" };
    assert_eq!(close, json!({"code": code, "message": e.to_string()}), "the CLOSE says why");
    e
}

fn ring_error(e: &PipeError, says: &str) {
    assert!(
        matches!(e, PipeError::Protocol(ProtocolError::Ring(m)) if m.contains(says)),
        "want a ring error {says:?}: {e:?}"
    );
}

fn bad_tensor(e: &PipeError, at: usize, says: &str) {
    assert!(
        matches!(e, PipeError::Protocol(ProtocolError::BadTensor { index, reason }) if *index == at && reason.contains(says)),
        "want a bad tensor {at} {says:?}: {e:?}"
    );
}

/// A peer that offered `ring_messages` and lies in tag-2 records (or sends more than the
/// server's limits take): every lie is a typed error naming it, for `recv` and for
/// `recv_blocking`, the pipe closes, the socket ends. One fresh connection per lie.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lying_packed_records_fail_the_pipe_cleanly() {
    let u8s = |n: usize| part(DT_U8, &[n as u64], &vec![7; n]);
    // (a) A header longer than the record.
    let mut header_past = record("{}", 0, &[]);
    header_past[..4].copy_from_slice(&100u32.to_le_bytes());
    // (b) A tensor claiming more bytes than the data has.
    let bytes_past = record("{}", 1, &[Part { nbytes: 100, shape: vec![100], ..u8s(10) }]);
    // (c) An unknown dtype number (tensor 1; 17 is one past the last).
    let unknown_dtype = record("{}", 2, &[u8s(4), Part { dtype: 17, ..u8s(4) }]);
    let unknown_dtype_255 = record("{}", 1, &[Part { dtype: 255, ..u8s(4) }]);
    // (d) Bytes after the last tensor.
    let mut trailing = record("{}", 1, &[u8s(4)]);
    trailing.extend_from_slice(&[0, 0, 0]);
    // (e) More tensors than the server's max_tensors (4).
    let too_many = record("{}", 5, &[u8s(1), u8s(1), u8s(1), u8s(1), u8s(1)]);
    let way_too_many = record("{}", u32::MAX, &[]);
    // And more: a shape that disagrees with the byte length, too many dimensions, a record
    // cut inside a descriptor or a shape, a header that is not JSON, a record shorter than
    // its start, a header over max_header_bytes, the data of tensor 1 past the end.
    let shape_lies = record("{}", 1, &[Part { dtype: DT_F32, shape: vec![3], ..u8s(8) }]);
    let too_many_dims = record("{}", 1, &[Part { shape: vec![1; 65], ..u8s(1) }]);
    let mut cut_desc = record("{}", 1, &[u8s(4)]);
    cut_desc.truncate(8 + 8 + 10);
    let mut cut_shape = record("{}", 1, &[u8s(4)]);
    cut_shape.truncate(8 + 8 + 16 + 4);
    let not_json = record("{nope", 0, &[]);
    let short = vec![1, 0, 0, 0, 0];
    let mut huge_header = record("{}", 0, &[]);
    huge_header[..4].copy_from_slice(&(Limits::default().max_header_bytes + 1).to_le_bytes());
    let second_past = record("{}", 2, &[u8s(4), Part { nbytes: 1 << 40, ..u8s(4) }]);
    // Well formed, but its data is over the server's max_payload_bytes (64 KiB).
    let payload_over = record("{}", 2, &[u8s(100), u8s((1 << 16) - 100)]);

    for blocking in [false, true] {
        let e = lie_and_fail(&header_past, blocking).await;
        ring_error(&e, "a packed message claims a 100-byte header in a 16-byte record");

        let e = lie_and_fail(&bytes_past, blocking).await;
        ring_error(&e, "claims 100 bytes for tensor 0, past the 10 bytes of data");

        let e = lie_and_fail(&unknown_dtype, blocking).await;
        bad_tensor(&e, 1, "unknown dtype number 17");
        let e = lie_and_fail(&unknown_dtype_255, blocking).await;
        bad_tensor(&e, 0, "unknown dtype number 255");

        let e = lie_and_fail(&trailing, blocking).await;
        ring_error(&e, "has 3 bytes after its last tensor");

        for rec in [&too_many, &way_too_many] {
            let e = lie_and_fail(rec, blocking).await;
            assert!(
                matches!(&e, PipeError::Limit(l) if l.limit == "max_tensors" && l.max == 4
                    && l.value == u64::from(u32::from_le_bytes(rec[4..8].try_into().unwrap()))),
                "{e:?}"
            );
        }

        let e = lie_and_fail(&shape_lies, blocking).await;
        bad_tensor(&e, 0, "tensor needs 12 bytes but 8 are present");
        let e = lie_and_fail(&too_many_dims, blocking).await;
        bad_tensor(&e, 0, "65 dimensions, over 64");
        for rec in [&cut_desc, &cut_shape] {
            let e = lie_and_fail(rec, blocking).await;
            // The shape is part of the descriptor (the decoder may name either).
            let says = ["ends inside the descriptor of tensor 0", "ends inside the shape of tensor 0"];
            assert!(
                matches!(&e, PipeError::Protocol(ProtocolError::Ring(m)) if says.iter().any(|s| m.contains(s))),
                "{e:?}"
            );
        }
        let e = lie_and_fail(&not_json, blocking).await;
        assert!(matches!(&e, PipeError::Protocol(ProtocolError::BadHeader(_))), "{e:?}");
        let e = lie_and_fail(&short, blocking).await;
        ring_error(&e, "record of 5 bytes is shorter than its 8-byte start");
        let e = lie_and_fail(&huge_header, blocking).await;
        assert!(matches!(&e, PipeError::Limit(l) if l.limit == "max_header_bytes"), "{e:?}");
        let e = lie_and_fail(&second_past, blocking).await;
        ring_error(&e, "claims 1099511627776 bytes for tensor 1, past the 68 bytes of data");
        let e = lie_and_fail(&payload_over, blocking).await;
        assert!(
            matches!(&e, PipeError::Limit(l) if l.limit == "max_payload_bytes" && l.value == 128 + (1 << 16) - 100),
            "{e:?}"
        );
    }
}

/// A peer that was not granted `ring_messages` (it offered only `ring`) and sends a tag-2
/// record anyway breaks the ring's rules (PROTOCOL.md §22.3: any tag but 0 and 1 is a
/// protocol error on such a connection): the pipe fails with a ring error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_packed_record_without_the_feature_fails_the_pipe() {
    let ep = endpoint(Some(RingOptions::default()), false);
    for blocking in [false, true] {
        let (s, mut client, granted) = raw_connection(&ep, &["ring"]).await;
        assert!(!granted.iter().any(|f| f == FEATURE_RING_MESSAGES), "{granted:?}");
        assert!(!packs(&s));
        let call = blocking.then(|| {
            let s2 = s.clone();
            std::thread::spawn(move || s2.recv_blocking(LONG))
        });
        publish(&mut client, TAG_MESSAGE, &record("null", 0, &[])).await;
        let got = match call {
            Some(t) => join(t).await,
            None => recv(&s).await,
        };
        let e = got.expect_err("a tag-2 record on a connection without ring_messages is refused");
        assert!(matches!(&e, PipeError::Protocol(ProtocolError::Ring(m)) if m.contains("tag 2")), "{e:?}");
    }
}
