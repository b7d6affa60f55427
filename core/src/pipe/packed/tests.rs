use super::*;
use crate::error::PipeError;
use serde_json::json;

fn room(limits: &Limits) -> PackRoom<'_> {
    PackRoom { peer: limits, max_record: 1 << 20 }
}

fn rules(limits: &Limits) -> UnpackRules<'_> {
    UnpackRules { limits, max_header_values: 1 << 20, cpu_channel: true }
}

fn sample() -> Message {
    let f32s: Vec<f32> = (0..6).map(|i| i as f32 * 0.5).collect();
    Message::with_tensors(
        json!({"op": "add", "n": [1, 2, 3], "nested": {"ok": true, "s": "ü\"\\"}}),
        vec![
            Tensor::from_slice(vec![64], &[7u8; 64]).unwrap(),
            Tensor::from_slice(vec![2, 3], &f32s).unwrap(),
            Tensor::from_slice(Vec::<u64>::new(), &[2.5f64]).unwrap(),
            Tensor::from_slice(vec![0, 4], &[] as &[i64]).unwrap(),
            Tensor::new(TensorMeta::new(DType::Bf16, vec![3]), bytes::Bytes::from_static(&[1, 2, 3, 4, 5, 6])).unwrap(),
        ],
    )
}

fn packed(msg: &Message) -> Vec<u8> {
    pack(msg, |_| true, &room(&Limits::default())).expect("the sample qualifies")
}

#[test]
fn a_packed_message_comes_back_equal_with_aligned_tensors() {
    let limits = Limits::default();
    for msg in [sample(), Message::new(json!(null)), Message::new(json!({"only": "a header"}))] {
        let back = unpack(&packed(&msg), &rules(&limits)).unwrap();
        assert_eq!(back, msg);
        for t in &back.tensors {
            if t.nbytes() > 0 {
                assert_eq!(t.as_bytes().as_ptr() as usize % ALIGN, 0, "{:?}", t.meta());
            }
        }
    }
}

#[test]
fn messages_that_do_not_qualify_are_not_packed() {
    let limits = Limits::default();
    let msg = sample();
    assert!(pack(&msg, |t| t.nbytes() != 64, &room(&limits)).is_none(), "the session refused one");
    let strided = Tensor::new(TensorMeta::new(DType::U8, vec![2, 2]).with_strides(vec![1, 2]), vec![0u8; 4].into());
    let strided = Message::with_tensors(json!({}), vec![strided.unwrap()]);
    assert!(pack(&strided, |_| true, &room(&limits)).is_none(), "strides");
    let small = PackRoom { peer: &limits, max_record: packed(&msg).len() - 1 };
    assert!(pack(&msg, |_| true, &small).is_none(), "over the ring's largest record");
    assert!(pack(&msg, |_| true, &PackRoom { peer: &limits, max_record: packed(&msg).len() }).is_some());
    let tight = Limits { max_header_bytes: 10, ..Limits::default() };
    assert!(pack(&msg, |_| true, &room(&tight)).is_none(), "over the peer's max_header_bytes");
    let tight = Limits { max_payload_bytes: 64, ..Limits::default() };
    assert!(pack(&msg, |_| true, &room(&tight)).is_none(), "over the peer's max_payload_bytes");
}

fn ring_error(r: Result<Message, PipeError>, says: &str) {
    match r {
        Err(PipeError::Protocol(ProtocolError::Ring(m))) => assert!(m.contains(says), "{m:?} should say {says:?}"),
        other => panic!("expected a ring error saying {says:?}, got {other:?}"),
    }
}

fn limit_error(r: Result<Message, PipeError>, limit: &str) {
    match r {
        Err(PipeError::Limit(l)) => assert_eq!(l.limit, limit, "{l}"),
        other => panic!("expected limit {limit}, got {other:?}"),
    }
}

fn bad_tensor(r: Result<Message, PipeError>, says: &str) {
    match r {
        Err(PipeError::Protocol(ProtocolError::BadTensor { reason, .. })) => {
            assert!(reason.contains(says), "{reason:?} should say {says:?}")
        }
        other => panic!("expected a bad tensor saying {says:?}, got {other:?}"),
    }
}

/// The offset of tensor 0's descriptor in a packed `msg`.
fn first_desc(record: &[u8]) -> usize {
    (FIXED + u32::from_le_bytes(record[..4].try_into().unwrap()) as usize).next_multiple_of(8)
}

#[test]
fn lying_records_are_typed_errors() {
    let limits = Limits::default();
    let rules = rules(&limits);
    let good = packed(&sample());
    let d = first_desc(&good);
    let with = |at: usize, bytes: &[u8]| {
        let mut r = good.clone();
        r[at..at + bytes.len()].copy_from_slice(bytes);
        r
    };
    ring_error(unpack(&good[..5], &rules), "shorter than its 8-byte start");
    limit_error(unpack(&with(0, &u32::MAX.to_le_bytes()), &rules), "max_header_bytes");
    ring_error(unpack(&with(0, &((good.len() as u32) + 4).to_le_bytes()), &rules), "-byte header in a");
    ring_error(unpack(&with(0, &((good.len() as u32) - 16).to_le_bytes()), &rules), "ends inside the descriptor");
    limit_error(unpack(&with(4, &u32::MAX.to_le_bytes()), &rules), "max_tensors");
    ring_error(unpack(&with(4, &6u32.to_le_bytes()), &rules), "past the");
    bad_tensor(unpack(&with(d, &[200]), &rules), "unknown dtype number 200");
    bad_tensor(unpack(&with(d + 1, &[65]), &rules), "65 dimensions");
    ring_error(unpack(&with(d + 8, &u64::MAX.to_le_bytes()), &rules), "past the");
    // A length that fits the record but not the shape: the tensor check catches it.
    bad_tensor(unpack(&with(d + 8, &63u64.to_le_bytes()), &rules), "");
    ring_error(unpack(&[good.as_slice(), &[0; 8]].concat(), &rules), "8 bytes after its last tensor");
    let mut not_json = good.clone();
    not_json[FIXED] = b'!';
    assert!(matches!(unpack(&not_json, &rules), Err(PipeError::Protocol(ProtocolError::BadHeader(_)))));
    bad_tensor(unpack(&good, &UnpackRules { cpu_channel: false, ..rules }), "no channel was negotiated");
    let tight = Limits { max_payload_bytes: 64, ..Limits::default() };
    limit_error(unpack(&good, &UnpackRules { limits: &tight, ..rules }), "max_payload_bytes");
}

/// Every cut of a good record, and thousands of records with random bytes changed: each
/// is a value or an error, never a panic (the loop is bounded).
#[test]
fn cut_and_scribbled_records_never_panic() {
    let limits = Limits::default();
    let rules = rules(&limits);
    let good = packed(&sample());
    for n in 0..good.len() {
        assert!(unpack(&good[..n], &rules).is_err(), "a record cut at {n} of {}", good.len());
    }
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..20_000 {
        let mut r = good.clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() % r.len() as u64) as usize;
            r[at] = next() as u8;
        }
        let _ = unpack(&r, &rules);
    }
}
