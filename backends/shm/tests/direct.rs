//! The socket path's blocking calls (issue 45, point 2): a blocking caller over a bare unix
//! socket (no ring) waits for the socket on its own thread and reads the frames itself. The
//! hand-over with the pipe's reader task loses and reorders nothing; CONTROL frames (shm
//! releases) and descriptors are handled on the way; a peer's death and a close end the
//! call with a typed error. Real unix sockets, shared memory and processes.

#![cfg(unix)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Fx, T, endpoint};
use ferry_conformance::Fixture;
use ferry_core::{DType, Endpoint, Message, Pipe, PipeError, Tensor, TensorMeta};
use ferry_shm::ShmOptions;
use serde_json::json;

const LONG: Option<Duration> = Some(Duration::from_secs(20));
/// Bytes of a tensor that goes through shared memory (over `inline_below`).
const SHM_BYTES: usize = 100_000;

fn ep() -> Endpoint {
    endpoint(ShmOptions::default(), Duration::ZERO)
}

fn bytes_tensor(n: usize, seed: u8) -> Tensor {
    let v: Vec<u8> = (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
    Tensor::from_slice(vec![n as u64], &v).unwrap()
}

fn check_bytes(t: &Tensor, n: usize, seed: u8) {
    let b = t.as_bytes();
    assert_eq!(b.len(), n);
    assert!(b.iter().enumerate().all(|(i, x)| *x == (i as u8).wrapping_mul(31).wrapping_add(seed)), "bytes differ");
}

/// A connected pair in this process: (server side, client side), no ring.
async fn pair(tag: &str) -> (Arc<Pipe>, Arc<Pipe>) {
    let ep = ep();
    let a = Fx.addr(tag);
    let mut l = ep.listen(&a).await.unwrap();
    let (s, c) = tokio::join!(l.accept(), ep.connect(&a));
    let (s, c) = (s.unwrap(), c.unwrap());
    assert!(!c.info().features.iter().any(|f| f == "ring"), "a bare socket");
    (Arc::new(s), Arc::new(c))
}

/// Starts this test binary as the peer (`peer_process`) in `mode`, connecting to a fresh
/// address; returns the accepted pipe and the child.
async fn spawn_peer(mode: &str) -> (Arc<Pipe>, std::process::Child) {
    let ep = ep();
    let a = Fx.addr(mode);
    let mut l = ep.listen(&a).await.unwrap();
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "peer_process", "--nocapture", "--test-threads=1"])
        .env("FERRY_DIRECT_PEER", format!("{a} {mode}"))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let s = tokio::time::timeout(T, l.accept()).await.expect("the peer connects").unwrap();
    (Arc::new(s), child)
}

/// The peer process (`FERRY_DIRECT_PEER=ADDR MODE`), on plain threads with the blocking
/// calls: `idle` says ready and waits; `flood` sends numbered messages with tensors as fast
/// as it can; `echo` answers each message with its number and a checksum of its tensor,
/// and every other time a fresh shm tensor of its own, until the pipe ends. A no-op in a
/// normal run.
#[test]
fn peer_process() {
    let Ok(arg) = std::env::var("FERRY_DIRECT_PEER") else { return };
    let (addr, mode) = arg.split_once(' ').unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let p = rt.block_on(ep().connect(addr)).unwrap();
    p.send_blocking(Message::new(json!("ready"))).unwrap();
    let bound = std::time::Instant::now() + Duration::from_secs(60);
    let mut i = 0u64;
    while std::time::Instant::now() < bound {
        match mode {
            "flood" => {
                let t = bytes_tensor(1000 + (i as usize % 30_000), i as u8);
                p.send_blocking(Message::with_tensors(json!(i), vec![t])).unwrap();
                i += 1;
            }
            "echo" => {
                let Ok(m) = p.recv_blocking(LONG) else { return };
                let sum: u64 = m.tensors.iter().flat_map(|t| t.as_bytes()).map(|b| u64::from(*b)).sum();
                let n = m.header["i"].as_u64().unwrap();
                drop(m);
                let tensors = if n.is_multiple_of(2) {
                    let mut t = rt.block_on(p.alloc(TensorMeta::new(DType::U8, vec![SHM_BYTES as u64]))).unwrap();
                    t.as_bytes_mut().copy_from_slice(bytes_tensor(SHM_BYTES, n as u8).as_bytes());
                    vec![t.freeze()]
                } else {
                    vec![]
                };
                if p.send_blocking(Message::with_tensors(json!({"i": n, "sum": sum}), tensors)).is_err() {
                    return;
                }
            }
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// A sender sends numbered messages while the receiving side switches between
/// `recv_blocking` on a plain thread and `recv` in a task, in runs of different lengths,
/// with pauses past the blocking caller's linger (the reader goes back to the task) and
/// without: every message arrives once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_and_async_receivers_take_turns_in_order() {
    let (s, c) = pair("turns").await;
    let n = 2000u64;
    let sender = tokio::spawn(async move {
        for i in 0..n {
            let tensors = if i.is_multiple_of(7) { vec![bytes_tensor(SHM_BYTES, i as u8)] } else { vec![] };
            s.send(Message::with_tensors(json!(i), tensors)).await.unwrap();
            if i.is_multiple_of(97) {
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        }
        s
    });
    let mut next = 0u64;
    let mut run = 0u64;
    while next < n {
        run += 1;
        let len = (run * 13) % 41 + 1;
        let blocking = run.is_multiple_of(2);
        let got: Vec<Message> = if blocking {
            let c = c.clone();
            let take = len.min(n - next);
            tokio::task::spawn_blocking(move || (0..take).map(|_| c.recv_blocking(LONG).unwrap()).collect())
                .await
                .unwrap()
        } else {
            let mut v = Vec::new();
            for _ in 0..len.min(n - next) {
                v.push(tokio::time::timeout(T, c.recv()).await.expect("a message comes").unwrap());
            }
            v
        };
        for m in got {
            assert_eq!(m.header, json!(next), "in order (blocking run: {blocking})");
            if next.is_multiple_of(7) {
                check_bytes(&m.tensors[0], SHM_BYTES, next as u8);
            }
            next += 1;
        }
        if run.is_multiple_of(5) {
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
    }
    let s = sender.await.unwrap();
    drop(s);
}

/// A blocking receiver and an async receiver at the same time on one pipe: each message
/// goes to exactly one of them, each sees its messages in order, none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_and_async_receivers_at_once_share_the_stream() {
    let (s, c) = pair("at-once").await;
    let n = 3000u64;
    let sender = tokio::spawn(async move {
        for i in 0..n {
            s.send(Message::new(json!(i))).await.unwrap();
        }
        s.send(Message::new(json!("end-a"))).await.unwrap();
        s.send(Message::new(json!("end-b"))).await.unwrap();
        s
    });
    let c2 = c.clone();
    let blocking = tokio::task::spawn_blocking(move || {
        let mut got = Vec::new();
        loop {
            let m = c2.recv_blocking(LONG).unwrap();
            match m.header.as_u64() {
                Some(i) => got.push(i),
                None => return got,
            }
        }
    });
    let mut got = Vec::new();
    loop {
        let m = tokio::time::timeout(T, c.recv()).await.expect("a message comes").unwrap();
        match m.header.as_u64() {
            Some(i) => got.push(i),
            None => break,
        }
    }
    let other = tokio::time::timeout(T, blocking).await.expect("the blocking receiver ends").unwrap();
    for g in [&got, &other] {
        assert!(g.windows(2).all(|w| w[0] < w[1]), "each receiver sees its messages in order");
    }
    let mut all: Vec<u64> = got.iter().chain(&other).copied().collect();
    all.sort_unstable();
    assert_eq!(all, (0..n).collect::<Vec<_>>(), "every message once");
    drop(sender.await.unwrap());
}

/// A blocking caller exchanges shm tensors with a peer process: the peer's release
/// CONTROL frames (it drops each tensor this side sent) and its new segments' descriptors
/// arrive while this side's caller reads the socket itself; the releases are handled (no
/// lease outlives the exchange) and the peer's tensors arrive whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_caller_handles_releases_and_descriptors() {
    let (s, mut child) = spawn_peer("echo").await;
    let s2 = s.clone();
    tokio::task::spawn_blocking(move || {
        assert_eq!(s2.recv_blocking(LONG).unwrap().header, json!("ready"));
        for i in 0..300u64 {
            let t = bytes_tensor(SHM_BYTES, i as u8);
            let sum: u64 = t.as_bytes().iter().map(|b| u64::from(*b)).sum();
            s2.send_blocking(Message::with_tensors(json!({"i": i}), vec![t])).unwrap();
            let m = s2.recv_blocking(LONG).unwrap();
            assert_eq!(m.header, json!({"i": i, "sum": sum}));
            if i.is_multiple_of(2) {
                check_bytes(&m.tensors[0], SHM_BYTES, i as u8);
            } else {
                assert!(m.tensors.is_empty());
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(s.channel(), "shm");
    // The last release trails the last answer: the reader (back with the task) reads it.
    let mut left = s.leases_granted();
    for _ in 0..400 {
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        left = s.leases_granted();
    }
    assert_eq!(left, 0, "every lease the peer held was released");
    s.close().await;
    let status = tokio::task::spawn_blocking(move || child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "the peer ended cleanly: {status}");
}

/// A peer process killed (SIGKILL) while this side waits in `recv_blocking` (idle) or
/// reads its stream of messages (flood): every message received is whole and in order, and
/// the call ends with [`PipeError::Closed`], with no hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_killed_during_a_blocking_read_ends_it() {
    for mode in ["idle", "flood"] {
        let (s, mut child) = spawn_peer(mode).await;
        let s2 = s.clone();
        let reader = tokio::task::spawn_blocking(move || {
            assert_eq!(s2.recv_blocking(LONG).unwrap().header, json!("ready"));
            let mut n = 0u64;
            loop {
                match s2.recv_blocking(None) {
                    Ok(m) => {
                        assert_eq!(m.header, json!(n), "messages in order");
                        check_bytes(&m.tensors[0], 1000 + (n as usize % 30_000), n as u8);
                        n += 1;
                    }
                    Err(e) => return (n, e),
                }
            }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        child.kill().unwrap();
        child.wait().unwrap();
        let (n, e) = tokio::time::timeout(T, reader).await.expect("the call ends").unwrap();
        assert!(matches!(e, PipeError::Closed), "{mode}: {e:?}");
        assert!(s.is_closed());
        if mode == "flood" {
            assert!(n > 0, "the flood got through before the kill");
        }
    }
}

/// `close` from another task while a caller waits in `recv_blocking` with no deadline and
/// nothing coming: the wait ends with [`PipeError::Closed`] (the peer, still alive and
/// holding its end open, would never end it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_ends_a_blocking_read() {
    let (s, c) = pair("close").await;
    s.send(Message::new(json!("first"))).await.unwrap();
    let c2 = c.clone();
    let reader = tokio::task::spawn_blocking(move || {
        let first = c2.recv_blocking(LONG).unwrap();
        (first, c2.recv_blocking(None))
    });
    // Let the caller reach its wait (if it has not yet, it finds the pipe closed: the same).
    tokio::time::sleep(Duration::from_millis(100)).await;
    c.close().await;
    let (first, r) = tokio::time::timeout(T, reader).await.expect("close ends the call").unwrap();
    assert_eq!(first.header, json!("first"));
    assert!(matches!(r, Err(PipeError::Closed)), "{r:?}");
    // The peer is still there, and sees the close.
    let e = tokio::time::timeout(T, s.recv()).await.expect("the peer sees the close").unwrap_err();
    assert!(matches!(e, PipeError::Closed), "{e:?}");
}

/// A blocking caller's deadline on the bare socket loses nothing: a message that comes
/// after a timed-out call is received by the next call, whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_on_the_socket_loses_nothing() {
    let (s, c) = pair("deadline").await;
    let c2 = c.clone();
    let r = tokio::task::spawn_blocking(move || c2.recv_blocking(Some(Duration::from_millis(30)))).await.unwrap();
    assert!(matches!(r, Err(PipeError::Timeout(_, "recv_blocking"))), "{r:?}");
    s.send(Message::with_tensors(json!("late"), vec![bytes_tensor(SHM_BYTES, 9)])).await.unwrap();
    let m = tokio::task::spawn_blocking(move || c.recv_blocking(LONG)).await.unwrap().unwrap();
    assert_eq!(m.header, json!("late"));
    check_bytes(&m.tensors[0], SHM_BYTES, 9);
}

/// A blocking caller that spins before it sleeps ([`ferry_core::EndpointBuilder::blocking_spin`],
/// here with a window far longer than anything the test waits for, so that its waits end
/// within the spin): a deadline inside the spin is kept, every message comes in order and
/// whole (shm tensors and their releases too), and a close ends a spinning call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spinning_caller_keeps_its_deadline_its_order_and_sees_a_close() {
    let ep = Endpoint::builder()
        .transport(Arc::new(ferry_local::LocalTransport::new()))
        .channel(Arc::new(ferry_shm::ShmChannel::with_options(ShmOptions::default())))
        .channel(Arc::new(ferry_core::InlineChannel))
        .blocking_spin(Duration::from_secs(5))
        .build();
    let a = Fx.addr("spin");
    let mut l = ep.listen(&a).await.unwrap();
    let (s, c) = tokio::join!(l.accept(), ep.connect(&a));
    let (s, c) = (Arc::new(s.unwrap()), Arc::new(c.unwrap()));
    let c2 = c.clone();
    let (idle_tx, idle_rx) = tokio::sync::oneshot::channel();
    let reader = tokio::task::spawn_blocking(move || {
        // Nothing comes (the sender waits for this): the deadline ends the spin.
        let idle = c2.recv_blocking(Some(Duration::from_millis(5)));
        let _ = idle_tx.send(());
        assert!(matches!(idle, Err(PipeError::Timeout(_, "recv_blocking"))), "{idle:?}");
        let mut got = Vec::new();
        for _ in 0..200 {
            let m = c2.recv_blocking(LONG).unwrap();
            let i = m.header.as_u64().unwrap();
            let n = if i % 10 == 0 { SHM_BYTES } else { 64 };
            check_bytes(&m.tensors[0], n, i as u8);
            got.push(i);
        }
        (got, c2.recv_blocking(None))
    });
    tokio::time::timeout(T, idle_rx).await.expect("the idle call ends").unwrap();
    for i in 0..200u64 {
        let n = if i % 10 == 0 { SHM_BYTES } else { 64 };
        s.send(Message::with_tensors(json!(i), vec![bytes_tensor(n, i as u8)])).await.unwrap();
        if i % 7 == 0 {
            // Now and then the caller waits (and spins) for the next one.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    // The caller spins for the 201st, which never comes, until the close.
    tokio::time::sleep(Duration::from_millis(50)).await;
    c.close().await;
    let (got, r) = tokio::time::timeout(T, reader).await.expect("the close ends the spinning call").unwrap();
    assert_eq!(got, (0..200).collect::<Vec<u64>>(), "every message, in order");
    assert!(matches!(r, Err(PipeError::Closed)), "{r:?}");
}
