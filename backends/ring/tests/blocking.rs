//! The blocking fast path (`Pipe::recv_blocking` / `Pipe::send_blocking`, issue 22 point
//! 2): round trips from plain threads over the ring and over the bare socket, with shm
//! tensors and frames the ring diverts to the socket; order with messages the pipe's task
//! read; deadlines that lose nothing; the reader going back to the task; a peer that lies
//! in the ring or goes away while a caller reads. Real unix sockets and shared memory.

#![cfg(target_os = "linux")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{addr, bytes_tensor, check_bytes, endpoint, has_ring};
use ferry_core::{DType, Endpoint, Message, Pipe, PipeError, ProtocolError, TensorMeta};
use ferry_ring::RingOptions;
use serde_json::json;

/// A connected pair: (server side, client side).
async fn pair(ep: &Endpoint, tag: &str) -> (Arc<Pipe>, Arc<Pipe>) {
    let (s, c) = common::pair(ep, ep, tag).await;
    (Arc::new(s), Arc::new(c))
}

const LONG: Option<Duration> = Some(Duration::from_secs(20));

/// An echo on a plain thread: `n` messages received and sent back with the blocking calls.
fn blocking_echo(p: Arc<Pipe>, n: usize) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for _ in 0..n {
            let m = p.recv_blocking(LONG).unwrap();
            p.send_blocking(m).unwrap();
        }
    })
}

/// Both sides on plain threads, with and without a ring, with and without shm: small
/// messages, shm tensors (the release CONTROL frames ride along), and sizes the ring
/// diverts to the socket (over its largest record, or a new shm segment's descriptors).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_from_plain_threads() {
    let sizes = [0usize, 64, 3000, 5000, 200_000, 8, 70_000, 1];
    for ring in [true, false] {
        for shm in [false, true] {
            let ep = endpoint(ring.then(|| RingOptions::default().capacity(4096)), shm);
            let (s, c) = pair(&ep, "rtt").await;
            assert_eq!(has_ring(&c), ring);
            let rounds = 40;
            let echo = blocking_echo(s.clone(), rounds * sizes.len());
            let client = std::thread::spawn(move || {
                for round in 0..rounds {
                    for (i, n) in sizes.iter().enumerate() {
                        let seed = (round * 16 + i) as u8;
                        let tensors = if *n == 0 { vec![] } else { vec![bytes_tensor(*n, seed)] };
                        c.send_blocking(Message::with_tensors(json!({"round": round, "i": i}), tensors)).unwrap();
                        let m = c.recv_blocking(LONG).unwrap();
                        assert_eq!(m.header, json!({"round": round, "i": i}), "ring {ring}, shm {shm}");
                        if *n > 0 {
                            check_bytes(&m.tensors[0], *n, seed);
                        }
                    }
                }
                c
            });
            let c = tokio::task::spawn_blocking(move || client.join().unwrap()).await.unwrap();
            tokio::task::spawn_blocking(move || echo.join().unwrap()).await.unwrap();
            // The async side still works after the blocking calls (the task takes the
            // reader back once it lies unused).
            s.send(Message::new(json!("after"))).await.unwrap();
            let m = tokio::time::timeout(Duration::from_secs(10), c.recv()).await.expect("the task reads again");
            assert_eq!(m.unwrap().header, json!("after"));
        }
    }
}

/// Messages the pipe's task read and queued come before what the blocking caller reads
/// itself; a blocking call and async calls may alternate on one pipe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_and_async_receives_keep_the_order() {
    let ep = endpoint(Some(RingOptions::default()), false);
    let (s, c) = pair(&ep, "order").await;
    for i in 0..5 {
        s.send(Message::new(json!(i))).await.unwrap();
    }
    // Let the task read them into the queue.
    tokio::time::sleep(Duration::from_millis(50)).await;
    for i in 5..10 {
        s.send(Message::new(json!(i))).await.unwrap();
    }
    let c2 = c.clone();
    let got: Vec<serde_json::Value> =
        tokio::task::spawn_blocking(move || (0..7).map(|_| c2.recv_blocking(LONG).unwrap().header).collect())
            .await
            .unwrap();
    let want: Vec<_> = (0..7).map(|i| json!(i)).collect::<Vec<_>>();
    assert_eq!(got, want);
    // The rest, by the async recv (the task takes the reader back after its linger).
    for i in 7..10 {
        let m = tokio::time::timeout(Duration::from_secs(10), c.recv()).await.expect("async recv").unwrap();
        assert_eq!(m.header, json!(i));
    }
    // And blocking again.
    s.send(Message::new(json!(10))).await.unwrap();
    let c2 = c.clone();
    let m = tokio::task::spawn_blocking(move || c2.recv_blocking(LONG)).await.unwrap().unwrap();
    assert_eq!(m.header, json!(10));
}

/// A deadline that passes loses nothing: the message that comes later is received by the
/// next call, blocking or async. The task takes the reader back after the linger and reads
/// a CLOSE while no caller reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_loses_nothing() {
    for ring in [true, false] {
        let ep = endpoint(ring.then(RingOptions::default), false);
        let (s, c) = pair(&ep, "deadline").await;
        let c2 = c.clone();
        let e = tokio::task::spawn_blocking(move || c2.recv_blocking(Some(Duration::from_millis(30))))
            .await
            .unwrap()
            .unwrap_err();
        assert!(matches!(e, PipeError::Timeout(_, "recv_blocking")), "{e:?}");
        assert!(!c.is_closed());
        s.send(Message::new(json!("late"))).await.unwrap();
        let c2 = c.clone();
        let m = tokio::task::spawn_blocking(move || c2.recv_blocking(LONG)).await.unwrap().unwrap();
        assert_eq!(m.header, json!("late"));
        // Nobody reads now: the task takes the reader back and notices the peer's close.
        s.close().await;
        let closed = tokio::time::timeout(Duration::from_secs(10), async {
            while !c.is_closed() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(closed.is_ok(), "the task read the CLOSE (ring {ring})");
        let c2 = c.clone();
        let e = tokio::task::spawn_blocking(move || c2.recv_blocking(LONG)).await.unwrap().unwrap_err();
        assert!(matches!(e, PipeError::Closed), "{e:?}");
    }
}

/// A peer that goes away while the caller waits: the call ends with `Closed` (the socket's
/// end, read by the caller itself), and so do later calls, blocking or async.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_goes_away_ends_the_call() {
    for ring in [true, false] {
        let ep = endpoint(ring.then(RingOptions::default), true);
        let (s, c) = pair(&ep, "gone").await;
        let c2 = c.clone();
        let call = tokio::task::spawn_blocking(move || c2.recv_blocking(LONG));
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(s);
        let e = tokio::time::timeout(Duration::from_secs(10), call).await.expect("the call ends").unwrap();
        assert!(matches!(e, Err(PipeError::Closed | PipeError::ClosedByPeer(_))), "ring {ring}: {e:?}");
        assert!(c.is_closed());
        let later = tokio::time::timeout(Duration::from_secs(10), c.recv()).await.expect("async recv ends");
        assert!(later.is_err());
        let c2 = c.clone();
        assert!(tokio::task::spawn_blocking(move || c2.recv_blocking(LONG)).await.unwrap().is_err());
    }
}

/// A caller on a pipe with a handler is told so (the handler gets the messages).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipe_with_a_handler_refuses_blocking_receives() {
    let ep = endpoint(Some(RingOptions::default()), false);
    let (_s, c) = pair(&ep, "handler").await;
    c.set_handler(Box::new(|_m| ferry_core::Handled::Done));
    let c2 = c.clone();
    let e = tokio::task::spawn_blocking(move || c2.recv_blocking(LONG)).await.unwrap().unwrap_err();
    assert!(matches!(&e, PipeError::ApiMisuse(m) if m.contains("handler")), "{e:?}");
}

/// Zero-copy shm tensors both ways from plain threads: the tensor the peer sends back is
/// the one sent (no copy), and many round trips leave the pool as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_copy_round_trips_from_plain_threads() {
    let ep = endpoint(Some(RingOptions::default()), true);
    let (s, c) = pair(&ep, "zc").await;
    assert!(has_ring(&c));
    let echo = blocking_echo(s.clone(), 300);
    let mut t = c.alloc(TensorMeta::new(DType::U8, vec![1 << 20])).await.unwrap();
    t.as_mut_slice::<u8>().unwrap().fill(7);
    let t = t.freeze();
    let addr = t.as_bytes().as_ptr() as usize;
    let client = std::thread::spawn(move || {
        for i in 0..300u32 {
            c.send_blocking(Message::with_tensors(json!(i), vec![t.clone()])).unwrap();
            let m = c.recv_blocking(LONG).unwrap();
            assert_eq!(m.header, json!(i));
            assert_eq!(m.tensors[0].as_bytes().as_ptr() as usize, addr, "the tensor came back without a copy");
        }
        c
    });
    let _c = tokio::task::spawn_blocking(move || client.join().unwrap()).await.unwrap();
    tokio::task::spawn_blocking(move || echo.join().unwrap()).await.unwrap();
}

/// Heap tensors copied into the pool by a caller that sends and receives in turn: the
/// peer's release of each lease, written right behind its answer, is handled before the
/// next send takes pool memory, so every round trip reuses the one slot (without it, the
/// release waited in the ring for the next receive, and the sends took two slots in turn).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_handles_the_releases_behind_the_last_answer_first() {
    let ep = endpoint(Some(RingOptions::default()), true);
    let (s, c) = pair(&ep, "release").await;
    assert!(has_ring(&c));
    let (answered, answers) = std::sync::mpsc::channel();
    let echo = std::thread::spawn(move || {
        for _ in 0..20 {
            let m = s.recv_blocking(LONG).unwrap();
            s.send_blocking(m).unwrap();
            // The send is done: its release went right behind the answer.
            answered.send(()).unwrap();
        }
    });
    let client = std::thread::spawn(move || {
        let heap = bytes_tensor(1 << 20, 3);
        let mut slots = std::collections::BTreeSet::new();
        for i in 0..20u32 {
            c.send_blocking(Message::with_tensors(json!(i), vec![heap.clone()])).unwrap();
            let m = c.recv_blocking(LONG).unwrap();
            check_bytes(&m.tensors[0], 1 << 20, 3);
            // The answer names the pool slot the send copied into (it comes back by reference).
            slots.insert(m.tensors[0].as_bytes().as_ptr() as usize);
            drop(m);
            answers.recv_timeout(Duration::from_secs(20)).unwrap();
        }
        slots
    });
    let slots = tokio::task::spawn_blocking(move || client.join().unwrap()).await.unwrap();
    tokio::task::spawn_blocking(move || echo.join().unwrap()).await.unwrap();
    assert_eq!(slots.len(), 1, "pool slots used by 20 round trips: {slots:x?}");
}

/// A peer lying in the ring while a blocking caller reads it: the caller gets the typed
/// ring error, the pipe is closed for every later call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lying_record_fails_a_blocking_call_cleanly() {
    use ferry_core::frame::{FrameKind, OutFrame};

    let ep = endpoint(Some(RingOptions::default()), false);
    let a = addr("lie");
    let mut l = ep.listen(&a).await.unwrap();
    let server = tokio::spawn(async move { l.accept().await });
    let common::RawClient { mut writer, ring, .. } = common::raw_ring_client(&a).await;
    let s = Arc::new(server.await.unwrap().unwrap());
    assert!(has_ring(&s));

    let s2 = s.clone();
    let call = tokio::task::spawn_blocking(move || s2.recv_blocking(LONG));
    tokio::time::sleep(Duration::from_millis(50)).await;
    ferry_ring::testing::publish_header(&ring, 1 << 20, 0, 8);
    writer.write_frame(FrameKind::Ring, OutFrame::default()).await.unwrap();
    let e =
        tokio::time::timeout(Duration::from_secs(10), call).await.expect("the caller notices").unwrap().unwrap_err();
    assert!(matches!(&e, PipeError::Protocol(ProtocolError::Ring(_))), "{e:?}");
    assert!(s.is_closed());
    let later = tokio::time::timeout(Duration::from_secs(10), s.recv()).await.expect("async recv ends");
    assert!(later.is_err(), "{later:?}");
}

/// The peer process of the SIGKILL tests (`FERRY_BLOCKING_PEER=ADDR MODE`): connects with a
/// ring, then either waits (`idle`) or sends numbered messages with tensors as fast as it
/// can (`flood`) until it is killed. A no-op in a normal run.
#[test]
fn peer_process() {
    let Ok(arg) = std::env::var("FERRY_BLOCKING_PEER") else { return };
    let (addr, mode) = arg.split_once(' ').unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let p = rt.block_on(endpoint(Some(RingOptions::default()), true).connect(addr)).unwrap();
    p.send_blocking(Message::new(json!("ready"))).unwrap();
    let bound = std::time::Instant::now() + Duration::from_secs(60);
    let mut i = 0u64;
    while std::time::Instant::now() < bound {
        if mode == "flood" {
            let t = bytes_tensor(1000 + (i as usize % 5000), i as u8);
            p.send_blocking(Message::with_tensors(json!(i), vec![t])).unwrap();
            i += 1;
        } else {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A peer process killed (SIGKILL) while this side waits in `recv_blocking` (idle) or
/// reads its stream of messages (flood): every message received is whole and in order, and
/// the call then ends with the pipe closed, within the bound, with no hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_killed_mid_call_is_noticed() {
    for mode in ["idle", "flood"] {
        let ep = endpoint(Some(RingOptions::default()), true);
        let a = addr("kill");
        let mut l = ep.listen(&a).await.unwrap();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "peer_process", "--nocapture", "--test-threads=1"])
            .env("FERRY_BLOCKING_PEER", format!("{a} {mode}"))
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let s = Arc::new(tokio::time::timeout(Duration::from_secs(20), l.accept()).await.unwrap().unwrap());
        assert!(has_ring(&s));
        let s2 = s.clone();
        let reader = tokio::task::spawn_blocking(move || {
            assert_eq!(s2.recv_blocking(LONG).unwrap().header, json!("ready"));
            let mut n = 0u64;
            loop {
                match s2.recv_blocking(LONG) {
                    Ok(m) => {
                        assert_eq!(m.header, json!(n), "messages in order");
                        check_bytes(&m.tensors[0], 1000 + (n as usize % 5000), n as u8);
                        n += 1;
                    }
                    Err(e) => return (n, e),
                }
            }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        child.kill().unwrap();
        child.wait().unwrap();
        let (n, e) = tokio::time::timeout(Duration::from_secs(20), reader).await.expect("the call ends").unwrap();
        assert!(matches!(e, PipeError::Closed), "{mode}: {e:?}");
        assert!(s.is_closed());
        if mode == "flood" {
            assert!(n > 0, "the flood got through before the kill");
        }
    }
}
