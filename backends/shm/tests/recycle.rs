//! [`SharedPool`]: a pooled shared segment is filled again only once its owner let go and
//! its peers released every lease on it; never when a pipe closed while its peer held one;
//! and kept segments are given back when idle or past the pool's bound.
#![cfg(target_os = "linux")] // ferry-shm exists on Linux only

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::{DType, Endpoint, InlineChannel, Message, Pipe, PipeListener, Tensor, TensorMeta};
use ferry_local::LocalTransport;
use ferry_shm::{SharedPool, SharedPoolOptions, SharedPoolStats, ShmChannel};
use serde_json::json;

const T: Duration = Duration::from_secs(20);
const LEN: usize = 1 << 20;

async fn pair(tag: &str) -> (PipeListener, Pipe, Pipe) {
    let addr = format!("unix:ferry-shm-recycle-{}", ferry_conformance::unique(tag));
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

/// A pooled segment filled with `fill`, frozen, as one f32 tensor over all of it; and the
/// address of its first byte.
fn filled(pool: &SharedPool, fill: u8) -> (Tensor, usize) {
    let mut w = pool.alloc(LEN).unwrap();
    assert_eq!(w.len(), LEN, "a page multiple keeps its length");
    w.as_mut_slice().fill(fill);
    let addr = w.as_slice().as_ptr() as usize;
    let seg = w.freeze();
    let t = Tensor::new(TensorMeta::new(DType::F32, vec![LEN as u64 / 4]), seg.bytes(0, LEN).unwrap()).unwrap();
    (t, addr)
}

/// Waits (bounded) until the pool's figures satisfy `f`.
async fn eventually(what: &str, pool: &SharedPool, f: impl Fn(&SharedPoolStats) -> bool) {
    for _ in 0..400 {
        if f(&pool.stats()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not after 4 s ({:?})", pool.stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_is_filled_again_only_after_its_peer_released_it() {
    let (_l, c, s) = pair("released").await;
    let pool = SharedPool::new(SharedPoolOptions::default());
    let (a, a_addr) = filled(&pool, 0xAA);
    c.send(Message::with_tensors(json!("a"), vec![a.clone()])).await.unwrap();
    let held = s.recv_timeout(T).await.unwrap();
    drop(a);

    // The owner let go, the peer has not: the segment is not kept, a new one is made, and
    // writing that one changes nothing the peer reads.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(pool.stats().kept_segments, 0, "kept while the peer holds a lease on it");
    let (b, b_addr) = filled(&pool, 0xBB);
    assert_ne!(b_addr, a_addr, "filled again while the peer holds a lease on it");
    assert_eq!((pool.stats().created, pool.stats().reused), (2, 0));
    assert!(held.tensors[0].as_bytes().iter().all(|&x| x == 0xAA), "the peer's bytes changed");
    drop(b);
    eventually("b comes back (never sent)", &pool, |st| st.kept_segments == 1).await;

    // The peer lets go: the release comes back, and the segment is kept, then filled again
    // (the same pages) and sent under a new id that the peer maps anew.
    drop(held);
    eventually("a comes back once released", &pool, |st| st.kept_segments == 2).await;
    let (again, again_addr) = filled(&pool, 0xCC);
    assert!(again_addr == a_addr || again_addr == b_addr, "a new segment although two were kept");
    assert_eq!(pool.stats().reused, 1);
    c.send(Message::with_tensors(json!("again"), vec![again.clone()])).await.unwrap();
    let got = s.recv_timeout(T).await.unwrap();
    assert!(got.tensors[0].as_bytes().iter().all(|&x| x == 0xCC), "the peer reads stale bytes");
    assert_eq!(pool.stats().withheld, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_leased_when_its_pipe_closes_is_never_filled_again() {
    let (_l, c, s) = pair("closed").await;
    let pool = SharedPool::new(SharedPoolOptions::default());
    let (a, _) = filled(&pool, 0x11);
    c.send(Message::with_tensors(json!("a"), vec![a.clone()])).await.unwrap();
    let held = s.recv_timeout(T).await.unwrap();
    drop(a);
    // The peer closes its end while still holding the tensor (an aborted fetch): its
    // mapping stays, so the memfd must never be written again.
    s.close().await;
    eventually("the segment is withheld", &pool, |st| st.withheld == 1).await;
    let st = pool.stats();
    assert_eq!((st.kept_segments, st.reused), (0, 0), "kept although the peer may still read it");
    let (_b, _) = filled(&pool, 0x22);
    assert_eq!(pool.stats().created, 2, "the withheld segment was handed out");
    assert!(held.tensors[0].as_bytes().iter().all(|&x| x == 0x11), "the peer's bytes changed");
}

#[test]
fn kept_segments_go_when_idle_or_past_keep_bytes() {
    let idle = Duration::from_secs(3);
    let pool = SharedPool::new(SharedPoolOptions { keep_bytes: 2 * LEN as u64, idle_release: idle });
    let held: Vec<_> = (0..3).map(|i| filled(&pool, i)).collect();
    drop(held);
    let st = pool.stats();
    assert_eq!((st.kept_segments, st.kept_bytes, st.given_back), (2, 2 * LEN as u64, 1), "{st:?}");
    let now = Instant::now();
    let next = pool.give_back_idle(now).expect("a kept segment has a due time");
    assert!(next > now && next <= now + idle, "due {next:?}");
    assert_eq!(pool.stats().kept_segments, 2, "given back before idle_release");
    assert_eq!(pool.give_back_idle(now + idle), None, "nothing is kept");
    let st = pool.stats();
    assert_eq!((st.kept_segments, st.kept_bytes, st.given_back), (0, 0, 3), "{st:?}");

    // Closed, it keeps nothing.
    let (t, _) = filled(&pool, 9);
    pool.close();
    drop(t);
    assert_eq!(pool.stats().kept_segments, 0);
}
