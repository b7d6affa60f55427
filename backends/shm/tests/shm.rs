//! shm-specific behaviour: zero copy, pool reuse and limits, and hostile descriptors.
#![cfg(target_os = "linux")] // ferry-shm exists on Linux only

use std::sync::Arc;
use std::time::Duration;

use ferry_conformance::Fixture;
use ferry_conformance::peer::RawConn;
use ferry_core::frame::FrameKind;
use ferry_core::{
    Channel, ChannelError, ConnInfo, DType, DeviceKind, Endpoint, InlineChannel, Message, Pipe, PipeError,
    PipeListener, Tensor, TensorMeta, Transport,
};
use ferry_local::LocalTransport;
use ferry_shm::{ShmChannel, ShmOptions};
use serde_json::{Value, json};

#[derive(Default)]
struct Fx;

impl Fixture for Fx {
    const NAME: &'static str = "shm";
    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(LocalTransport::new())
    }
    fn channels(&self) -> Vec<Arc<dyn Channel>> {
        vec![Arc::new(ShmChannel::new()), Arc::new(InlineChannel)]
    }
    fn addr(&self, tag: &str) -> String {
        format!("unix:ferry-shm-test-{}", ferry_conformance::unique(tag))
    }
}

const T: Duration = Duration::from_secs(20);

fn endpoint(opts: ShmOptions) -> Endpoint {
    Endpoint::builder()
        .transport(Arc::new(LocalTransport::new()))
        .channel(Arc::new(ShmChannel::with_options(opts)))
        .channel(Arc::new(InlineChannel))
        .build()
}

async fn pair(opts: ShmOptions, tag: &str) -> (PipeListener, Pipe, Pipe) {
    let addr = Fx.addr(tag);
    let ep = endpoint(opts);
    let mut l = ep.listen(&addr).await.unwrap();
    let c = ep.connect(&addr).await.unwrap();
    let s = tokio::time::timeout(T, l.accept()).await.unwrap().unwrap();
    assert_eq!(c.channel(), "shm");
    assert_eq!(s.channel(), "shm");
    (l, c, s)
}

fn echo(p: Pipe) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Ok(m) = p.recv().await {
            if p.send(m).await.is_err() {
                break;
            }
        }
    })
}

fn memfd_mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps").unwrap().lines().filter(|l| l.contains("memfd:ferry-shm")).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_tensor_comes_back_as_the_same_memory() {
    let (_l, c, s) = pair(ShmOptions::default(), "identity").await;
    let _echo = echo(s);
    let mut t = c.alloc(TensorMeta::new(DType::F32, vec![1024, 1024])).await.unwrap();
    for (i, x) in t.as_mut_slice::<f32>().unwrap().iter_mut().enumerate() {
        *x = i as f32;
    }
    let t = t.freeze();
    let ptr = t.as_bytes().as_ptr();
    c.send(Message::with_tensors(json!(1), vec![t.clone()])).await.unwrap();
    let back = c.recv_timeout(T).await.unwrap();
    // Zero copy both ways: the echo received a lease and returned it by reference.
    assert_eq!(back.tensors[0].as_bytes().as_ptr(), ptr);
    assert_eq!(back.tensors[0].as_slice::<f32>().unwrap()[1000], 1000.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heap_tensor_is_copied_in_once_and_intact() {
    let (_l, c, s) = pair(ShmOptions::default(), "copy-in").await;
    let data: Vec<u64> = (0..1 << 20).collect();
    let t = Tensor::from_slice(vec![1 << 20], &data).unwrap();
    c.send(Message::with_tensors(json!(1), vec![t.clone()])).await.unwrap();
    let got = s.recv_timeout(T).await.unwrap();
    assert_ne!(got.tensors[0].as_bytes().as_ptr(), t.as_bytes().as_ptr());
    assert_eq!(got.tensors[0], t);
    // The received tensor is read-only shared memory of the sender: it shows in our maps.
    assert!(memfd_mappings() >= 2, "expected the pool segment and its read-only peer mapping");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_pool_makes_no_new_segments() {
    let (_l, c, s) = pair(ShmOptions::default(), "reuse").await;
    let _echo = echo(s);
    let meta = TensorMeta::new(DType::U8, vec![8 << 20]);
    let mut after_first = 0;
    for i in 0..50u8 {
        let mut t = c.alloc(meta.clone()).await.unwrap();
        t.as_bytes_mut().fill(i);
        c.send(Message::with_tensors(json!(i), vec![t.freeze()])).await.unwrap();
        let back = c.recv_timeout(T).await.unwrap();
        assert!(back.tensors[0].as_bytes().iter().all(|&b| b == i));
        drop(back);
        // Let the echo's release arrive before the next alloc.
        tokio::time::sleep(Duration::from_millis(2)).await;
        if i == 0 {
            after_first = c.stats()["shm"]["segments"].as_u64().unwrap();
        }
    }
    assert_eq!(c.stats()["shm"]["segments"].as_u64().unwrap(), after_first, "the warm pool created new segments");
    assert_eq!(after_first, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_limit_fails_or_waits_as_configured() {
    let opts =
        ShmOptions { pool_limit: 8 << 20, segment_bytes: 2 << 20, full_wait: Duration::ZERO, ..Default::default() };
    let (_l, c, _s) = pair(opts, "full-fail").await;
    let e = c.alloc(TensorMeta::new(DType::U8, vec![16 << 20])).await.unwrap_err();
    assert!(matches!(&e, PipeError::Channel(ferry_core::ChannelError::Limit(l)) if l.limit == "pool_limit"), "{e:?}");
    assert!(e.to_string().contains("ShmOptions::pool_limit"), "{e}");

    let opts = ShmOptions {
        pool_limit: 8 << 20,
        segment_bytes: 2 << 20,
        full_wait: Duration::from_millis(300),
        ..Default::default()
    };
    let (_l, c, s) = pair(opts, "full-wait").await;
    let t = c.alloc(TensorMeta::new(DType::U8, vec![6 << 20])).await.unwrap().freeze();
    c.send(Message::with_tensors(json!(1), vec![t])).await.unwrap();
    let held = s.recv_timeout(T).await.unwrap(); // the server holds the lease
    let e = c.alloc(TensorMeta::new(DType::U8, vec![6 << 20])).await.unwrap_err();
    assert!(matches!(&e, PipeError::Channel(ferry_core::ChannelError::Timeout(..))), "{e:?}");
    assert!(e.to_string().contains("pool_limit"), "{e}");
    // A send of a heap tensor waits the same way.
    let heap = Tensor::from_slice(vec![6 << 20], &vec![1u8; 6 << 20]).unwrap();
    let r = c.send(Message::with_tensors(json!(2), vec![heap])).await;
    assert!(r.is_err(), "send into a full pool should time out");
    drop(held); // release -> the slot is free again
    let again = tokio::time::timeout(T, async {
        loop {
            if let Ok(t) = c.alloc(TensorMeta::new(DType::U8, vec![6 << 20])).await {
                return t;
            }
        }
    })
    .await
    .expect("space came back after the release");
    assert_eq!(again.as_bytes().len(), 6 << 20);
}

/// Connects raw and negotiates shm; returns the raw side and the server's pipe.
async fn raw_shm(opts: ShmOptions, tag: &str) -> (PipeListener, RawConn, Pipe) {
    let addr = Fx.addr(tag);
    let mut l = endpoint(opts).listen(&addr).await.unwrap();
    let mut raw = RawConn::connect(&Fx, &addr).await.unwrap();
    let conn = ConnInfo { fd_passing: true, same_host: true, ..Default::default() };
    let offer = ShmChannel::new().offer(&conn).unwrap();
    let w = raw.handshake_with(json!([offer])).await.unwrap();
    assert_eq!(w.channels[&DeviceKind::Cpu], "shm");
    let pipe = tokio::time::timeout(T, l.accept()).await.unwrap().unwrap();
    (l, raw, pipe)
}

async fn send_raw(raw: &mut RawConn, kind: FrameKind, header: Value, fds: Vec<std::os::fd::OwnedFd>) {
    let h = serde_json::to_vec(&header).unwrap();
    let n = fds.len() as u16;
    if n > 0 {
        raw.fds.as_ref().unwrap().attach(fds);
    }
    raw.write_prefix(kind as u8, 0, n, h.len() as u32, 0).await.unwrap();
    raw.write_raw(&h).await.unwrap();
}

fn shm_msg(shm: Value, len: u64) -> Value {
    json!({"header": null, "tensors": [{"meta": {"dtype": "u8", "shape": [len]}, "data": {"shm": shm}}]})
}

async fn expect_bad(pipe: &Pipe, raw: &mut RawConn, needle: &str) {
    let e = pipe.recv_timeout(T).await.unwrap_err();
    let text = e.to_string();
    assert!(text.contains(needle), "error {e:?} does not mention {needle:?}");
    assert!(matches!(e, PipeError::Protocol(_) | PipeError::Channel(_)), "{e:?}");
    let close = raw.expect_close().await.unwrap();
    assert_eq!(close.code, "protocol_error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_segment_is_refused() {
    let (_l, mut raw, pipe) = raw_shm(ShmOptions::default(), "unknown-seg").await;
    send_raw(
        &mut raw,
        FrameKind::Message,
        shm_msg(json!({"segment": 7, "offset": 0, "len": 4, "lease": 1}), 4),
        vec![],
    )
    .await;
    expect_bad(&pipe, &mut raw, "unknown segment").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_outside_segment_is_refused() {
    let (_l, mut raw, pipe) = raw_shm(ShmOptions::default(), "outside").await;
    let fd = ferry_shm::testing::sealed_memfd(4096, 0, &[]).unwrap();
    let shm = json!({"segment": 1, "offset": 4000, "len": 200, "lease": 1, "announce": {"fd": 0, "size": 4096}});
    send_raw(&mut raw, FrameKind::Message, shm_msg(shm, 200), vec![fd]).await;
    expect_bad(&pipe, &mut raw, "outside segment").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsealed_segment_is_refused() {
    let (_l, mut raw, pipe) = raw_shm(ShmOptions::default(), "unsealed").await;
    let fd = ferry_shm::testing::unsealed_memfd(4096).unwrap();
    let shm = json!({"segment": 1, "offset": 0, "len": 4, "lease": 1, "announce": {"fd": 0, "size": 4096}});
    send_raw(&mut raw, FrameKind::Message, shm_msg(shm, 4), vec![fd]).await;
    expect_bad(&pipe, &mut raw, "SHRINK and GROW are required").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lying_segment_size_is_refused() {
    let (_l, mut raw, pipe) = raw_shm(ShmOptions::default(), "size-lie").await;
    let fd = ferry_shm::testing::sealed_memfd(4096, 0, &[]).unwrap();
    let shm = json!({"segment": 1, "offset": 0, "len": 8000, "lease": 1, "announce": {"fd": 0, "size": 8192}});
    send_raw(&mut raw, FrameKind::Message, shm_msg(shm, 8000), vec![fd]).await;
    expect_bad(&pipe, &mut raw, "announced as 8192 bytes but is 4096").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_descriptor_is_refused() {
    let (_l, mut raw, pipe) = raw_shm(ShmOptions::default(), "no-fd").await;
    let shm = json!({"segment": 1, "offset": 0, "len": 4, "lease": 1, "announce": {"fd": 3, "size": 4096}});
    send_raw(&mut raw, FrameKind::Message, shm_msg(shm, 4), vec![]).await;
    expect_bad(&pipe, &mut raw, "not in the frame").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segment_over_the_mapping_limit_is_refused() {
    let (_l, mut raw, pipe) = raw_shm(ShmOptions { max_peer_bytes: 1 << 20, ..Default::default() }, "too-big").await;
    let fd = ferry_shm::testing::sealed_memfd(2 << 20, 0, &[]).unwrap();
    let shm = json!({"segment": 1, "offset": 0, "len": 4, "lease": 1, "announce": {"fd": 0, "size": 2 << 20}});
    send_raw(&mut raw, FrameKind::Message, shm_msg(shm, 4), vec![fd]).await;
    let e = pipe.recv_timeout(T).await.unwrap_err();
    assert!(matches!(&e, PipeError::Limit(l) if l.limit == "max_peer_bytes"), "{e:?}");
    assert!(e.to_string().contains("ShmOptions::max_peer_bytes"), "{e}");
    assert_eq!(raw.expect_close().await.unwrap().code, "limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_of_a_lease_never_granted_is_refused() {
    let (_l, mut raw, pipe) = raw_shm(ShmOptions::default(), "bad-release").await;
    send_raw(&mut raw, FrameKind::Control, json!({"channel": "shm", "body": {"release": [99]}}), vec![]).await;
    expect_bad(&pipe, &mut raw, "release of lease 99").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_control_bodies_are_refused() {
    // Strict (`ShmControl`, deny_unknown_fields) and under the 64-bit rule (PROTOCOL.md 5.5).
    let cases = [
        (json!({"free": [1]}), "unknown field `free`"),
        (json!({"release": ["1"]}), "invalid type: string"),
        (json!({"release": [9_007_199_254_740_992u64]}), "0..=9007199254740991"),
        (json!({"release": [], "forget": [u64::MAX]}), "0..=9007199254740991"),
    ];
    for (i, (body, needle)) in cases.into_iter().enumerate() {
        let (_l, mut raw, pipe) = raw_shm(ShmOptions::default(), &format!("bad-control-{i}")).await;
        send_raw(&mut raw, FrameKind::Control, json!({"channel": "shm", "body": body}), vec![]).await;
        let e = pipe.recv_timeout(T).await.unwrap_err();
        assert!(matches!(&e, PipeError::Channel(ChannelError::BadDescriptor { channel: "shm", .. })), "{e:?}");
        assert!(e.to_string().contains(needle), "error {e:?} does not mention {needle:?}");
        assert_eq!(raw.expect_close().await.unwrap().code, "protocol_error");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn integers_past_2_pow_53_in_descriptors_are_refused() {
    for (i, field) in ["segment", "offset", "len", "lease"].into_iter().enumerate() {
        let (_l, mut raw, pipe) = raw_shm(ShmOptions::default(), &format!("big-int-{i}")).await;
        let mut shm = json!({"segment": 7, "offset": 0, "len": 4, "lease": 1});
        shm[field] = json!(9_007_199_254_740_992u64);
        send_raw(&mut raw, FrameKind::Message, shm_msg(shm, 4), vec![]).await;
        let e = pipe.recv_timeout(T).await.unwrap_err();
        assert!(matches!(&e, PipeError::Protocol(_)), "{field}: {e:?}");
        assert!(e.to_string().contains("0..=9007199254740991"), "{field}: {e}");
        assert_eq!(raw.expect_close().await.unwrap().code, "protocol_error");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_raw_descriptor_is_read_in_place() {
    let (_l, mut raw, pipe) = raw_shm(ShmOptions::default(), "good").await;
    let fd = ferry_shm::testing::sealed_memfd(4096, 64, b"abcd").unwrap();
    let shm = json!({"segment": 5, "offset": 64, "len": 4, "lease": 77, "announce": {"fd": 0, "size": 4096}});
    send_raw(&mut raw, FrameKind::Message, shm_msg(shm, 4), vec![fd]).await;
    let m = pipe.recv_timeout(T).await.unwrap();
    assert_eq!(m.tensors[0].as_bytes(), b"abcd");
    drop(m);
    // The release comes back as a CONTROL frame naming the lease.
    let f = tokio::time::timeout(T, raw.reader.read_frame()).await.unwrap().unwrap().into_frame().unwrap();
    assert_eq!(f.kind, FrameKind::Control);
    let body: Value = serde_json::from_slice(&f.header).unwrap();
    assert_eq!(body, json!({"channel": "shm", "body": {"release": [77]}}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_boot_or_namespace_falls_back_to_inline() {
    let addr = Fx.addr("fallback");
    let mut l = endpoint(ShmOptions::default()).listen(&addr).await.unwrap();
    let conn = ConnInfo { fd_passing: true, same_host: true, ..Default::default() };
    let mut offer = serde_json::to_value(ShmChannel::new().offer(&conn).unwrap()).unwrap();
    for key in ["boot_id", "ipc_ns", "net_ns"] {
        let mut o = offer.clone();
        o["domain"][key] = json!("elsewhere");
        let mut raw = RawConn::connect(&Fx, &addr).await.unwrap();
        let w = raw.handshake_with(json!([o, {"name": "inline", "devices": ["cpu"]}])).await.unwrap();
        assert_eq!(w.channels[&DeviceKind::Cpu], "inline", "{key} differs: shm must not be chosen");
        let p = tokio::time::timeout(T, l.accept()).await.unwrap().unwrap();
        assert_eq!(p.channel(), "inline");
    }
    // Without descriptor passing the client does not even offer shm.
    let no_fds = ConnInfo { fd_passing: false, same_host: true, ..Default::default() };
    assert!(ShmChannel::new().offer(&no_fds).is_none());
    offer["domain"] = json!({});
    let mut raw = RawConn::connect(&Fx, &addr).await.unwrap();
    let w = raw.handshake_with(json!([offer, {"name": "inline", "devices": ["cpu"]}])).await.unwrap();
    assert_eq!(w.channels[&DeviceKind::Cpu], "inline", "an offer without a domain must not get shm");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sends_announce_segments_in_order() {
    // Small segments so that almost every tensor needs a new one.
    let opts = ShmOptions { segment_bytes: 2 << 20, ..Default::default() };
    let (_l, c, s) = pair(opts, "concurrent-announce").await;
    let c = Arc::new(c);
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..4u8 {
        let c = c.clone();
        tasks.spawn(async move {
            for i in 0..10u8 {
                let mut t =
                    c.alloc(TensorMeta::new(DType::U8, vec![(1 << 20) + 4096 * u64::from(task)])).await.unwrap();
                t.as_bytes_mut().fill(task * 16 + i);
                c.send(Message::with_tensors(json!([task, i]), vec![t.freeze()])).await.unwrap();
            }
        });
    }
    for _ in 0..40 {
        let m = s.recv_timeout(T).await.expect("a message was lost or the pipe broke");
        let (task, i) = (m.header[0].as_u64().unwrap() as u8, m.header[1].as_u64().unwrap() as u8);
        assert!(m.tensors[0].as_bytes().iter().all(|&b| b == task * 16 + i));
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_send_leaves_the_pipe_usable() {
    let opts =
        ShmOptions { pool_limit: 8 << 20, segment_bytes: 2 << 20, full_wait: Duration::ZERO, ..Default::default() };
    let (_l, c, s) = pair(opts, "failed-send").await;
    // The first tensor fits (and would announce a new segment), the second does not.
    let a = Tensor::from_slice(vec![2 << 20], &vec![1u8; 2 << 20]).unwrap();
    let b = Tensor::from_slice(vec![7 << 20], &vec![2u8; 7 << 20]).unwrap();
    let e = c.send(Message::with_tensors(json!("both"), vec![a.clone(), b])).await.unwrap_err();
    assert!(e.to_string().contains("pool_limit"), "{e}");
    assert_eq!(c.stats()["shm"]["leases_granted"], 0, "the aborted message's lease must be forgotten");
    // The segment made for `a` was never announced to the peer: the next send must announce it.
    c.send(Message::with_tensors(json!("a"), vec![a.clone()])).await.unwrap();
    let m = s.recv_timeout(T).await.unwrap();
    assert_eq!(m.header, json!("a"));
    assert_eq!(m.tensors[0], a);
}

/// A lease granted with `lazy_release` counts its bytes toward `release_batch_bytes` like
/// any other: a large one goes back as soon as it is dropped (PROTOCOL.md 11.5; counting
/// zero bytes, a zero-copy loop's releases went out one CONTROL frame per 32 calls, and its
/// p99 rose from 16-18 to 24-41 us on a 2-vCPU VM).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_release_lease_counts_its_bytes_toward_a_batch() {
    // Neither the count nor the delay sends anything in this test's lifetime: only bytes.
    let opts = ShmOptions {
        release_batch: 1000,
        release_batch_bytes: 16 << 20,
        release_delay: Duration::from_secs(3600),
        ..Default::default()
    };
    let (_l, mut raw, pipe) = raw_shm(opts, "lazy").await;
    let size = 64 << 20;
    let fd = ferry_shm::testing::sealed_memfd(size, 0, &[]).unwrap();
    let len = 20u64 << 20;
    let lazy = json!({"segment": 1, "offset": 0, "len": len, "lease": 1, "lazy_release": true,
        "announce": {"fd": 0, "size": size}});
    let small = json!({"segment": 1, "offset": len, "len": 1024, "lease": 2});
    send_raw(&mut raw, FrameKind::Message, shm_msg(lazy, len), vec![fd]).await;
    let got = pipe.recv_timeout(T).await.unwrap();
    assert_eq!(got.tensors[0].as_bytes().len(), len as usize);
    send_raw(&mut raw, FrameKind::Message, shm_msg(small, 1024), vec![]).await;
    drop(pipe.recv_timeout(T).await.unwrap()); // 1 KiB: not due, waits for a batch
    drop(got); // 20 MiB, lazy or not: due at once, with the waiting one
    let f = tokio::time::timeout(T, raw.reader.read_frame()).await.unwrap().unwrap().into_frame().unwrap();
    assert_eq!(f.kind, FrameKind::Control);
    let mut body: Value = f.parse().unwrap();
    let mut ids: Vec<u64> = serde_json::from_value(body["body"]["release"].take()).unwrap();
    ids.sort_unstable();
    assert_eq!(body["channel"], "shm");
    assert_eq!(ids, [1, 2], "the large lazy lease went back at once, with the waiting one");
}
