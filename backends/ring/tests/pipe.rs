//! Pipes over the same-host ring (core's feature `ring`): what the handshake agrees on, the
//! order of frames that take the ring and frames that take the socket, a full ring, a
//! peer that lies in the ring, and a peer without a ring. Real unix sockets, real shared
//! memory, one process (the conformance suite runs the ring with peers in processes and
//! kills them).

#![cfg(target_os = "linux")]

mod common;

use std::time::Duration;

use common::{addr, bytes_tensor, check_bytes, endpoint, has_ring, pair};
use ferry_core::{DType, Message, PipeError, ProtocolError, TensorMeta};
use ferry_ring::RingOptions;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_sides_agree_on_the_ring_only_when_both_have_one() {
    let with = endpoint(Some(RingOptions::default()), false);
    let without = endpoint(None, false);
    for (server, client, want) in [(&with, &with, true), (&with, &without, false), (&without, &with, false)] {
        let (s, c) = pair(server, client, "agree").await;
        assert_eq!((has_ring(&s), has_ring(&c)), (want, want), "server ring / client ring");
        c.send(Message::new(json!({"n": 1}))).await.unwrap();
        assert_eq!(s.recv().await.unwrap().header, json!({"n": 1}));
        s.send(Message::new(json!({"n": 2}))).await.unwrap();
        assert_eq!(c.recv().await.unwrap().header, json!({"n": 2}));
    }
}

/// Small frames go through the ring, frames larger than its largest record and frames with
/// descriptors (new shm segments) over the socket: the peer gets them all, in order, whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_on_both_paths_keep_their_order() {
    // 4 KiB rings: the largest record is under 4 KiB.
    let small = RingOptions::default().capacity(4096);
    for shm in [false, true] {
        let ep = endpoint(Some(small.clone()), shm);
        let (s, c) = pair(&ep, &ep, "order").await;
        assert!(has_ring(&s) && has_ring(&c));
        let sizes = [0usize, 10, 3000, 5000, 64, 200_000, 1, 4000, 70_000, 8];
        let sender = async {
            for round in 0..3u8 {
                for (i, n) in sizes.iter().enumerate() {
                    let seed = round * 16 + i as u8;
                    let tensors = if *n == 0 { vec![] } else { vec![bytes_tensor(*n, seed)] };
                    c.send(Message::with_tensors(json!({"round": round, "i": i}), tensors)).await.unwrap();
                }
            }
        };
        let receiver = async {
            for round in 0..3u8 {
                for (i, n) in sizes.iter().enumerate() {
                    let m = s.recv().await.unwrap();
                    assert_eq!(m.header, json!({"round": round, "i": i}), "shm {shm}");
                    if *n > 0 {
                        check_bytes(&m.tensors[0], *n, round * 16 + i as u8);
                    }
                }
            }
        };
        tokio::join!(sender, receiver);
        // And back the other way.
        for i in 0..20u8 {
            s.send(Message::with_tensors(json!(i), vec![bytes_tensor(100 + 700 * i as usize, i)])).await.unwrap();
        }
        for i in 0..20u8 {
            let m = c.recv().await.unwrap();
            assert_eq!(m.header, json!(i));
            check_bytes(&m.tensors[0], 100 + 700 * i as usize, i);
        }
    }
}

/// A reader that does not read fills the ring: the writer waits (it neither fails nor
/// drops frames) and goes on when the reader does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_ring_makes_the_writer_wait() {
    let ep = endpoint(Some(RingOptions::default().capacity(4096)), false);
    let (s, c) = pair(&ep, &ep, "full").await;
    const N: u32 = 2000;
    let writer = tokio::spawn(async move {
        for i in 0..N {
            c.send(Message::new(json!({"i": i, "pad": "x".repeat(100)}))).await.unwrap();
        }
        c
    });
    // Let the writer run into the full ring (the pipe's receive queue fills too).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!writer.is_finished(), "2000 frames cannot all fit in a 4 KiB ring and the receive queue");
    for i in 0..N {
        let m = tokio::time::timeout(Duration::from_secs(20), s.recv()).await.expect("frames keep coming").unwrap();
        assert_eq!(m.header["i"], json!(i));
    }
    let _c = tokio::time::timeout(Duration::from_secs(20), writer).await.unwrap().unwrap();
}

/// The pipe's own CONTROL frames (shm releases) and messages share the ring; many
/// round trips with tensors both ways leave nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_with_shm_tensors() {
    let ep = endpoint(Some(RingOptions::default()), true);
    let (s, c) = pair(&ep, &ep, "rtt").await;
    let echo = tokio::spawn(async move {
        for _ in 0..500 {
            let m = s.recv().await.unwrap();
            s.send(m).await.unwrap();
        }
        s
    });
    for i in 0..500u32 {
        let mut t = c.alloc(TensorMeta::new(DType::U8, vec![4096])).await.unwrap();
        t.as_mut_slice::<u8>().unwrap().fill(i as u8);
        c.send(Message::with_tensors(json!(i), vec![t.freeze()])).await.unwrap();
        let m = c.recv().await.unwrap();
        assert_eq!(m.header, json!(i));
        assert!(m.tensors[0].as_bytes().iter().all(|b| *b == i as u8));
    }
    echo.await.unwrap();
}

/// A hand-made client that does the handshake by the book, then lies in the ring (a record
/// claiming a megabyte with 8 bytes published) and rings the doorbell: the server fails the
/// pipe with a typed ring error, never reads out of bounds, and closes the socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lying_record_fails_the_pipe_cleanly() {
    use ferry_core::frame::{FrameKind, OutFrame};

    let ep = endpoint(Some(RingOptions::default()), false);
    let a = addr("lie");
    let mut l = ep.listen(&a).await.unwrap();
    let server = tokio::spawn(async move { l.accept().await });
    let common::RawClient { reader: mut r, writer: mut w, ring } = common::raw_ring_client(&a).await;
    let s = server.await.unwrap().unwrap();
    assert!(has_ring(&s));

    ferry_ring::testing::publish_header(&ring, 1 << 20, 0, 8);
    w.write_frame(FrameKind::Ring, OutFrame::default()).await.unwrap();
    let e = tokio::time::timeout(Duration::from_secs(10), s.recv()).await.expect("the server notices").unwrap_err();
    assert!(matches!(&e, PipeError::Protocol(ProtocolError::Ring(_))), "{e:?}");
    assert!(e.to_string().contains("claims 1048576 bytes but 8 are published"), "{e}");
    // The server closed the connection: the hand-made client reads to the end of the
    // stream (a CLOSE frame may come first).
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match r.read_frame().await.and_then(ferry_core::frame::Received::into_frame) {
                Ok(f) if f.kind == FrameKind::Close || f.kind == FrameKind::Ring => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("the socket ends");
    assert!(matches!(end, Err(PipeError::Closed)), "{end:?}");
}

/// A RING frame after the handshake is a doorbell, a prefix and nothing else: one that
/// carries a header or a payload is refused with a typed ring error (not read and ignored),
/// whether it comes while the reader waits for its doorbell or where a divert record
/// points.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_frame_with_bytes_is_refused() {
    use ferry_core::frame::{FrameKind, OutFrame};

    for (what, frame) in [
        ("header", OutFrame { header: b"{\"hidden\":1}".to_vec(), ..OutFrame::default() }),
        ("payload", OutFrame { payload: vec![bytes::Bytes::from_static(&[7u8; 32])], ..OutFrame::default() }),
    ] {
        let ep = endpoint(Some(RingOptions::default()), false);
        let a = addr("ring-bytes");
        let mut l = ep.listen(&a).await.unwrap();
        let server = tokio::spawn(async move { l.accept().await });
        let common::RawClient { reader: _r, writer: mut w, ring: _ring } = common::raw_ring_client(&a).await;
        let s = server.await.unwrap().unwrap();
        assert!(has_ring(&s));
        w.write_frame(FrameKind::Ring, frame).await.unwrap();
        let e = tokio::time::timeout(Duration::from_secs(10), s.recv()).await.expect("the server notices").unwrap_err();
        assert!(matches!(&e, PipeError::Protocol(ProtocolError::Ring(_))), "{what}: {e:?}");
        assert!(e.to_string().contains("a doorbell carries none"), "{what}: {e}");
    }
}
