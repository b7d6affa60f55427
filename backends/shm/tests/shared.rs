//! Shared segments (a tensor store's buckets): lent without a copy to every pipe, announced
//! once per pipe, and forgotten by the peer (unmapped) once the owner and every lease let go.
#![cfg(target_os = "linux")] // ferry-shm exists on Linux only

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferry_core::{DType, Endpoint, InlineChannel, Message, Pipe, PipeListener, Tensor, TensorMeta};
use ferry_local::LocalTransport;
use ferry_shm::{SharedSegmentMut, ShmChannel};
use serde_json::json;

const T: Duration = Duration::from_secs(20);

async fn pair(tag: &str) -> (PipeListener, Pipe, Pipe) {
    let addr = format!("unix:ferry-shm-shared-{}", ferry_conformance::unique(tag));
    let ep = Endpoint::builder()
        .transport(Arc::new(LocalTransport::new()))
        .channel(Arc::new(ShmChannel::new()))
        .channel(Arc::new(InlineChannel))
        .build();
    let mut l = ep.listen(&addr).await.unwrap();
    let c = ep.connect(&addr).await.unwrap();
    let s = tokio::time::timeout(T, l.accept()).await.unwrap().unwrap();
    (l, c, s)
}

fn tensor(bytes: Bytes) -> Tensor {
    let n = bytes.len() as u64 / 4;
    Tensor::new(TensorMeta::new(DType::F32, vec![n]), bytes).unwrap()
}

/// Waits (bounded) until `f` holds.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..400 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not after 4 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_segment_is_lent_without_a_copy_and_forgotten_when_it_goes() {
    let (_l1, c1, s1) = pair("lent-1").await;
    let (_l2, c2, s2) = pair("lent-2").await;
    let len = 4 << 20;
    let mut w = SharedSegmentMut::create(len).unwrap();
    for (i, b) in w.as_mut_slice().iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let seg = w.freeze();
    let a = tensor(seg.bytes(0, 1 << 20).unwrap());
    let b = tensor(seg.bytes(2 << 20, 1 << 20).unwrap());
    assert!(seg.bytes(len - 4, 8).is_none(), "a range past the end");

    // Two pipes, two messages each: the segment is announced once per pipe, nothing is copied.
    for (c, s) in [(&c1, &s1), (&c2, &s2)] {
        for t in [&a, &b] {
            c.send(Message::with_tensors(json!("x"), vec![t.clone()])).await.unwrap();
        }
        let m1 = s.recv_timeout(T).await.unwrap();
        let m2 = s.recv_timeout(T).await.unwrap();
        assert_eq!(m1.tensors[0].as_bytes(), a.as_bytes());
        assert_eq!(m2.tensors[0].as_bytes(), b.as_bytes());
        assert_eq!(c.stats()["shm"]["reserved_bytes"], 0, "the sender copied into its pool");
        assert_eq!(s.stats()["shm"]["peer_segments"], 1, "the segment is mapped once per pipe");
        assert_eq!(s.stats()["shm"]["peer_mapped_bytes"], len as u64);
        // Sent back, it is the owner's own memory again.
        s.send(Message::with_tensors(json!("back"), vec![m2.tensors[0].clone()])).await.unwrap();
        let back = c.recv_timeout(T).await.unwrap();
        assert_eq!(back.tensors[0].as_bytes().as_ptr(), b.as_bytes().as_ptr(), "not returned by reference");
        drop((m1, m2, back));
    }

    // The owner lets go while pipe 2's peer still holds a tensor: the segment lives on (its
    // memory is still in use), so no peer forgets it yet.
    c2.send(Message::with_tensors(json!("held"), vec![a.clone()])).await.unwrap();
    let held = s2.recv_timeout(T).await.unwrap();
    drop((a, b, seg));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(s1.stats()["shm"]["peer_segments"], 1, "forgotten while in use");
    assert_eq!(s2.stats()["shm"]["peer_segments"], 1, "forgotten while a lease was held");
    assert_eq!(held.tensors[0].as_bytes()[5], 5);
    drop(held);
    for s in [&s1, &s2] {
        eventually("the peers forget the segment", || s.stats()["shm"]["peer_segments"] == 0).await;
        assert_eq!(s.stats()["shm"]["peer_mapped_bytes"], 0);
    }
    // Both pipes still work.
    for (c, s) in [(&c1, &s1), (&c2, &s2)] {
        c.send(Message::with_tensors(json!(1), vec![tensor(Bytes::from(vec![7u8; 1 << 20]))])).await.unwrap();
        assert_eq!(s.recv_timeout(T).await.unwrap().tensors[0].as_bytes()[0], 7);
    }
}
