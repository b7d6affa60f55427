//! Shared memory given back while the connection lives (issue 45 point 5): empty pool
//! segments are unmapped and closed on both sides after `idle_release`, a large send after
//! many small ones makes room from empty segments instead of failing "pool full", and a peer
//! that cannot be told to unmap (no `shm_forget`) keeps its segments and keeps working.
//!
//! The mapping counts read /proc/self/maps, which both ends of each pipe share (they live
//! in this test's process): nextest runs each test in a process of its own.
#![cfg(target_os = "linux")] // ferry-shm exists on Linux only

use std::time::Duration;

use ferry_conformance::Fixture;
use ferry_conformance::peer::RawConn;
use ferry_core::frame::FrameKind;
use ferry_core::{Channel, ConnInfo, DType, DeviceKind, Message, Pipe, PipeListener, Tensor, TensorMeta};
use ferry_shm::{ShmChannel, ShmOptions};
use serde_json::{Value, json};

mod common;

use common::{Fx, T};

const MIB: usize = 1 << 20;

async fn pair(opts: ShmOptions, tag: &str) -> (PipeListener, Pipe, Pipe) {
    let addr = Fx.addr(tag);
    let ep = common::endpoint(opts, Duration::ZERO);
    let mut l = ep.listen(&addr).await.unwrap();
    let c = ep.connect(&addr).await.unwrap();
    let s = tokio::time::timeout(T, l.accept()).await.unwrap().unwrap();
    assert_eq!((c.channel(), s.channel()), ("shm", "shm"));
    (l, c, s)
}

/// Mappings of ferry-shm memfds in this process (own segments and peers' alike).
fn memfd_mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps").unwrap().lines().filter(|l| l.contains("memfd:ferry-shm")).count()
}

fn stat(p: &Pipe, key: &str) -> u64 {
    p.stats()["shm"][key].as_u64().unwrap_or_else(|| panic!("no shm stat {key}: {}", p.stats()))
}

/// Waits (bounded by `T`) until `cond` holds.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + T;
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "{what}: not within {T:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn heap(len: usize, fill: u8) -> Tensor {
    Tensor::from_slice(vec![len as u64], &vec![fill; len]).unwrap()
}

/// A param and its result, then both dropped: one idle interval later every segment is
/// gone on both sides (the pools' stats, the peers' tables and the process's mappings).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segments_of_a_dropped_param_and_result_are_unmapped_on_both_sides() {
    let before = memfd_mappings();
    let opts = ShmOptions { idle_release: Duration::from_millis(20), keep_idle_bytes: 0, ..ShmOptions::default() };
    let (_l, c, s) = pair(opts, "param-result").await;
    let len = 96 * MIB;
    // The param: a heap tensor, copied once into the client's pool.
    c.send(Message::with_tensors(json!("param"), vec![heap(len, 3)])).await.unwrap();
    let param = s.recv_timeout(T).await.unwrap();
    // The result: made in the server's pool.
    let mut r = s.alloc(TensorMeta::new(DType::U8, vec![len as u64])).await.unwrap();
    r.as_bytes_mut().fill(param.tensors[0].as_bytes()[len - 1] + 1);
    s.send(Message::with_tensors(json!("result"), vec![r.freeze()])).await.unwrap();
    drop(param);
    let result = c.recv_timeout(T).await.unwrap();
    assert_eq!(result.tensors[0].as_bytes()[len / 2], 4);
    assert_eq!((stat(&c, "segments"), stat(&s, "segments")), (1, 1));
    assert_eq!((stat(&c, "peer_segments"), stat(&s, "peer_segments")), (1, 1));
    assert_eq!(memfd_mappings(), before + 4, "two segments, each mapped by its owner and its peer");
    drop(result);

    for (p, side) in [(&c, "client"), (&s, "server")] {
        eventually(&format!("the {side}'s segment is given back"), || stat(p, "segments") == 0).await;
        eventually(&format!("the {side} unmaps its peer's segment"), || stat(p, "peer_segments") == 0).await;
        assert_eq!(stat(p, "reserved_bytes"), 0);
        assert_eq!(stat(p, "peer_mapped_bytes"), 0);
        assert_eq!(stat(p, "segments_given_back"), 1);
    }
    eventually("every memfd mapping is gone", || memfd_mappings() == before).await;

    // The pipe goes on: a new segment (a new id) is made, announced and read.
    c.send(Message::with_tensors(json!("again"), vec![heap(MIB, 9)])).await.unwrap();
    assert_eq!(s.recv_timeout(T).await.unwrap().tensors[0].as_bytes()[7], 9);
    assert_eq!(stat(&c, "segments_created"), 2);
}

/// Empty segments up to `keep_idle_bytes` stay mapped however long they idle: a steady
/// stream of messages does not make and unmake segments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_segments_under_keep_idle_bytes_are_kept() {
    let opts = ShmOptions { idle_release: Duration::from_millis(5), ..ShmOptions::default() };
    let (_l, c, s) = pair(opts, "keep").await;
    for i in 0..3u8 {
        c.send(Message::with_tensors(json!(i), vec![heap(MIB, i)])).await.unwrap();
        drop(s.recv_timeout(T).await.unwrap());
        eventually("the lease is released", || stat(&c, "leases_granted") == 0).await;
    }
    // Many idle intervals: the one 64 MiB segment (= keep_idle_bytes) stays.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!((stat(&c, "segments"), stat(&c, "segments_created"), stat(&c, "segments_given_back")), (1, 1, 0));
    assert_eq!(stat(&s, "peer_segments"), 1);
}

/// After 1,000 small messages filled the pool with segments that are now empty, a large
/// send whose segment would not fit beside them succeeds at once (`full_wait` zero: no
/// waiting for a release that will never come): the empty segments make room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_send_after_1000_small_ones_succeeds_at_once() {
    let opts = ShmOptions {
        pool_limit: 512 << 20,
        full_wait: Duration::ZERO,
        // Only the room a large tensor needs gives segments back here.
        idle_release: Duration::from_secs(3600),
        ..ShmOptions::default()
    };
    let (_l, c, s) = pair(opts, "large-after-small").await;
    let small = 300 << 10;
    // The receiver reads every message and holds them all before dropping them: the
    // sender's pool grows to hold 1,000 at once.
    let reader = tokio::spawn(async move {
        let mut held = Vec::new();
        for _ in 0..1000 {
            held.push(s.recv_timeout(T).await.unwrap());
        }
        drop(held);
        s
    });
    for i in 0..1000u32 {
        c.send(Message::with_tensors(json!(i), vec![heap(small, i as u8)])).await.unwrap();
    }
    let s = tokio::time::timeout(T, reader).await.unwrap().unwrap();
    // The lease table empties before the slots are back in the pool (they are freed
    // outside its lock): wait for both.
    eventually("every small lease is released and its slot free", || {
        stat(&c, "leases_granted") == 0 && stat(&c, "used_bytes") == 0
    })
    .await;
    let reserved = stat(&c, "reserved_bytes");
    let big = 256 * MIB;
    assert!(reserved + big as u64 > 512 << 20, "the test must need room: {reserved} bytes reserved");

    let mut t =
        c.alloc(TensorMeta::new(DType::U8, vec![big as u64])).await.expect("a large alloc after many small ones");
    t.as_bytes_mut().fill(0xab);
    c.send(Message::with_tensors(json!("big"), vec![t.freeze()])).await.unwrap();
    let got = s.recv_timeout(T).await.unwrap();
    assert_eq!(got.tensors[0].as_bytes()[big - 1], 0xab);
    assert!(stat(&c, "segments_given_back") >= 1);
    assert!(stat(&c, "reserved_bytes") <= 512 << 20);
    // The receiver was told to unmap what was given back.
    eventually("the receiver forgets the segments given back", || {
        stat(&s, "peer_segments") == stat(&c, "segments") && stat(&s, "peer_mapped_bytes") == stat(&c, "reserved_bytes")
    })
    .await;
}

/// A peer that did not agree to `shm_forget` (an older one) cannot be told to unmap: the
/// segments it was sent stay, nothing it cannot parse is sent, and the pipe keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_without_shm_forget_keeps_its_segments_and_is_sent_no_forget() {
    let addr = Fx.addr("old-peer");
    let opts = ShmOptions { idle_release: Duration::from_millis(5), keep_idle_bytes: 0, ..ShmOptions::default() };
    let mut l = common::endpoint(opts, Duration::ZERO).listen(&addr).await.unwrap();
    let mut raw = RawConn::connect(&Fx, &addr).await.unwrap();
    let conn = ConnInfo { fd_passing: true, same_host: true, ..Default::default() };
    let offer = ShmChannel::new().offer(&conn).unwrap();
    let w = raw.handshake_with(json!([offer])).await.unwrap(); // no features
    assert_eq!(w.channels[&DeviceKind::Cpu], "shm");
    let s = tokio::time::timeout(T, l.accept()).await.unwrap().unwrap();

    for round in 0..2u8 {
        s.send(Message::with_tensors(json!(round), vec![heap(MIB, round)])).await.unwrap();
        let f = tokio::time::timeout(T, raw.reader.read_frame()).await.unwrap().unwrap().into_frame().unwrap();
        assert_eq!(f.kind, FrameKind::Message);
        let h: Value = f.parse().unwrap();
        let r = &h["tensors"][0]["data"]["shm"];
        assert_eq!(r["segment"], 0, "{h}");
        assert_eq!(r.get("announce").is_some(), round == 0, "announced once: {h}");
        let release = json!({"channel": "shm", "body": {"release": [r["lease"].clone()]}});
        raw.write_frame(FrameKind::Control as u8, &serde_json::to_vec(&release).unwrap(), &[]).await.unwrap();
        eventually("the release is read", || stat(&s, "leases_granted") == 0).await;
        // Many idle intervals: the segment the peer maps stays, and no CONTROL comes.
        let quiet = tokio::time::timeout(Duration::from_millis(100), raw.reader.read_frame()).await;
        assert!(quiet.is_err(), "the old peer was sent a frame: {quiet:?}");
        assert_eq!((stat(&s, "segments"), stat(&s, "segments_given_back")), (1, 0));
    }
}
