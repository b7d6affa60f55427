use super::*;
use crate::error::PipeError;
use serde_json::json;

fn room(limits: &Limits) -> PackRoom<'_> {
    PackRoom { peer: limits, max_record: 1 << 20 }
}

fn rules(limits: &Limits) -> UnpackRules<'_> {
    UnpackRules { limits, max_header_values: 1 << 20 }
}

/// Every tensor inline (as the inline channel sends them).
fn inline(msg: &Message) -> Vec<Location> {
    msg.tensors.iter().map(|t| Location::Inline(InlineRef { offset: 0, len: t.nbytes() as u64 })).collect()
}

/// A record with no tensor but inline ones needs no session.
fn no_session(index: usize, _: TensorMeta, loc: &Location) -> Result<Tensor, PipeError> {
    panic!("tensor {index} at {loc:?} asked for a session")
}

fn unpack_inline(record: &[u8], rules: &UnpackRules<'_>) -> Result<Message, PipeError> {
    unpack(record, rules, no_session)
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
    pack(msg, &inline(msg), &room(&Limits::default())).expect("the sample qualifies")
}

#[test]
fn a_packed_message_comes_back_equal_with_aligned_tensors() {
    let limits = Limits::default();
    for msg in [sample(), Message::new(json!(null)), Message::new(json!({"only": "a header"}))] {
        let back = unpack_inline(&packed(&msg), &rules(&limits)).unwrap();
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
    let locs = inline(&msg);
    let mut announcing = locs.clone();
    announcing[1] = Location::Shm(ShmRef {
        segment: 1,
        offset: 0,
        len: 24,
        lease: 1,
        announce: Some(crate::wire::SegmentAnnounce { fd: 0, size: 4096 }),
        lazy_release: false,
    });
    assert!(pack(&msg, &announcing, &room(&limits)).is_none(), "a segment's announcement travels with its descriptor");
    let strided = Tensor::new(TensorMeta::new(DType::U8, vec![2, 2]).with_strides(vec![1, 2]), vec![0u8; 4].into());
    let strided = Message::with_tensors(json!({}), vec![strided.unwrap()]);
    assert!(pack(&strided, &inline(&strided), &room(&limits)).is_none(), "strides");
    let small = PackRoom { peer: &limits, max_record: packed(&msg).len() - 1 };
    assert!(pack(&msg, &locs, &small).is_none(), "over the ring's largest record");
    assert!(pack(&msg, &locs, &PackRoom { peer: &limits, max_record: packed(&msg).len() }).is_some());
    let tight = Limits { max_header_bytes: 10, ..Limits::default() };
    assert!(pack(&msg, &locs, &room(&tight)).is_none(), "over the peer's max_header_bytes");
    let tight = Limits { max_payload_bytes: 64, ..Limits::default() };
    assert!(pack(&msg, &locs, &room(&tight)).is_none(), "over the peer's max_payload_bytes");
}

/// Shm and shm_return locations travel as binary fields and reach the session as they left.
#[test]
fn shm_locations_reach_the_session_as_sent() {
    let limits = Limits::default();
    let msg = sample();
    let mut locs = inline(&msg);
    let shm = ShmRef { segment: 7, offset: 4096, len: 24, lease: 99, announce: None, lazy_release: true };
    locs[1] = Location::Shm(shm);
    locs[4] = Location::ShmReturn(ShmReturnRef { lease: u64::MAX, offset: 3, len: 6 });
    let record = pack(&msg, &locs, &room(&limits)).unwrap();
    let mut asked = Vec::new();
    let back = unpack(&record, &rules(&limits), |index, meta, loc| {
        asked.push((index, loc.clone()));
        assert_eq!(&meta, msg.tensors[index].meta());
        Ok(msg.tensors[index].clone())
    })
    .unwrap();
    assert_eq!(back, msg);
    assert_eq!(asked, vec![(1, locs[1].clone()), (4, locs[4].clone())]);
    let e = unpack(&record, &rules(&limits), |index, _, _| {
        Err(PipeError::from(ProtocolError::BadTensor { index, reason: "refused".into() }))
    });
    bad_tensor(e, "refused");
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
    ring_error(unpack_inline(&good[..5], &rules), "shorter than its 8-byte start");
    limit_error(unpack_inline(&with(0, &u32::MAX.to_le_bytes()), &rules), "max_header_bytes");
    ring_error(unpack_inline(&with(0, &((good.len() as u32) + 4).to_le_bytes()), &rules), "-byte header in a");
    ring_error(
        unpack_inline(&with(0, &((good.len() as u32) - 16).to_le_bytes()), &rules),
        "ends inside the descriptor",
    );
    limit_error(unpack_inline(&with(4, &u32::MAX.to_le_bytes()), &rules), "max_tensors");
    let one_more = unpack_inline(&with(4, &6u32.to_le_bytes()), &rules);
    assert!(matches!(one_more, Err(PipeError::Protocol(_))), "{one_more:?}");
    bad_tensor(unpack_inline(&with(d + 2, &[9]), &rules), "unknown place number 9");
    bad_tensor(unpack_inline(&with(d + 3, &[1]), &rules), "reserved descriptor bits");
    bad_tensor(unpack_inline(&with(d + 5, &[1]), &rules), "reserved descriptor bits");
    bad_tensor(unpack_inline(&with(d, &[200]), &rules), "unknown dtype number 200");
    bad_tensor(unpack_inline(&with(d + 1, &[65]), &rules), "65 dimensions");
    ring_error(unpack_inline(&with(d + 8, &u64::MAX.to_le_bytes()), &rules), "past the");
    // A length that fits the record but not the shape: the tensor check catches it.
    bad_tensor(unpack_inline(&with(d + 8, &63u64.to_le_bytes()), &rules), "");
    ring_error(unpack_inline(&[good.as_slice(), &[0; 8]].concat(), &rules), "8 bytes after its last tensor");
    let mut not_json = good.clone();
    not_json[FIXED] = b'!';
    assert!(matches!(unpack_inline(&not_json, &rules), Err(PipeError::Protocol(ProtocolError::BadHeader(_)))));
    let tight = Limits { max_payload_bytes: 64, ..Limits::default() };
    limit_error(unpack_inline(&good, &UnpackRules { limits: &tight, max_header_values: 1 << 20 }), "max_payload_bytes");
}

/// Every cut of a good record, and thousands of records with random bytes changed: each
/// is a value or an error, never a panic (the loop is bounded).
#[test]
fn cut_and_scribbled_records_never_panic() {
    let limits = Limits::default();
    let rules = rules(&limits);
    let good = packed(&sample());
    for n in 0..good.len() {
        assert!(unpack_inline(&good[..n], &rules).is_err(), "a record cut at {n} of {}", good.len());
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
        let _ = unpack_inline(&r, &rules);
    }
}

#[test]
fn one_buffer_packs_record_after_record_and_big_ones_are_let_go() {
    let (small, limits) = (sample(), Limits::default());
    let mut buf = Vec::new();
    pack_into(&small, &inline(&small), &room(&limits), &mut buf).unwrap();
    assert_eq!(buf, packed(&small), "the same record as a fresh buffer's");
    // A record left in the buffer is cleared, not appended to.
    pack_into(&small, &inline(&small), &room(&limits), &mut buf).unwrap();
    assert_eq!(buf, packed(&small));
    trim_scratch(&mut buf);
    assert!(buf.capacity() > 0, "a small buffer is kept for the next send");
    let t = Tensor::from_slice(vec![SCRATCH_KEEP as u64], &vec![1u8; SCRATCH_KEEP]).unwrap();
    let big = Message::with_tensors(json!(null), vec![t]);
    let room = PackRoom { peer: &limits, max_record: 1 << 20 };
    pack_into(&big, &inline(&big), &room, &mut buf).unwrap();
    assert!(buf.capacity() > SCRATCH_KEEP);
    trim_scratch(&mut buf);
    assert_eq!(buf.capacity(), 0, "a big record's memory is let go once it is out");
}
