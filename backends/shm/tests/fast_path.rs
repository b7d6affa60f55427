//! The server fast path over unix sockets and shm: messages handed to a handler in the
//! pipe's reader task (`Pipe::set_handler`), the reader busy-polling after a message the
//! handler answered at once (`EndpointBuilder::busy_poll`), and releases of the peer's
//! leases batched behind outgoing messages (`ShmOptions::release_batch`, `release_delay`).
//! Busy polling is counted per listener (`PipeListener::spin_stats`), so each test sees its
//! own readers' spins only, whatever runs beside it in the process.
#![cfg(target_os = "linux")] // ferry-shm exists on Linux only

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{T, echo_now, endpoint};
use ferry_core::{DType, Handled, Message, Pipe, PipeListener, TensorMeta};
use ferry_shm::ShmOptions;
use serde_json::json;

async fn pair(opts: ShmOptions, busy_poll: Duration, tag: &str) -> (PipeListener, Pipe, Arc<Pipe>) {
    let addr = format!("unix:ferry-fast-test-{}", ferry_conformance::unique(tag));
    let ep = endpoint(opts, busy_poll);
    let mut l = ep.listen(&addr).await.unwrap();
    let c = ep.connect(&addr).await.unwrap();
    let s = tokio::time::timeout(T, l.accept()).await.unwrap().unwrap();
    assert_eq!(c.channel(), "shm");
    (l, c, Arc::new(s))
}

/// Polls `f` until it is true (bounded).
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{what}: not within 10 s");
}

fn stat(p: &Pipe, key: &str) -> u64 {
    p.stats()["shm"][key].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_answering_inline_with_busy_polling_echoes_every_message_intact() {
    // A window long enough that a slow (debug, loaded) machine still reads the next
    // message within it: each spin ends when the message comes.
    let (l, c, s) = pair(ShmOptions::default(), Duration::from_millis(50), "inline").await;
    let weak = Arc::downgrade(&s);
    let handled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = handled.clone();
    s.set_handler(Box::new(move |m| {
        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        echo_now(weak.clone(), m)
    }));
    let mut t = c.alloc(TensorMeta::new(DType::U32, vec![256, 1024])).await.unwrap();
    for (i, x) in t.as_mut_slice::<u32>().unwrap().iter_mut().enumerate() {
        *x = i as u32;
    }
    let t = t.freeze();
    for i in 0..300u32 {
        c.send(Message::with_tensors(json!(i), vec![t.clone()])).await.unwrap();
        let back = c.recv_timeout(T).await.unwrap();
        assert_eq!(back.header, json!(i));
        // Zero copy both ways, and the bytes intact.
        assert_eq!(back.tensors[0].as_bytes().as_ptr(), t.as_bytes().as_ptr());
        assert_eq!(back.tensors[0].as_slice::<u32>().unwrap()[1000 + i as usize], 1000 + i);
    }
    assert_eq!(handled.load(std::sync::atomic::Ordering::Relaxed), 300, "every message went to the handler");
    assert!(l.spin_stats().unwrap().polls > 0, "the reader never busy-polled after answering at once");
    // Every lease the server held (one per message) is released: in batches behind the
    // answers, the rest after the batching delay.
    eventually("all leases released", || stat(&c, "leases_granted") == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_spawns_is_not_held_up_by_busy_polling() {
    // A minute of busy polling: were the reader to spin after a message whose answer is in a
    // task (on its worker's queue), each answer would wait out the spin and `recv_timeout`
    // would fail.
    let (l, c, s) = pair(ShmOptions::default(), Duration::from_secs(60), "spawn").await;
    let weak = Arc::downgrade(&s);
    s.set_handler(Box::new(move |m| {
        let pipe = weak.clone();
        tokio::spawn(async move {
            tokio::task::yield_now().await;
            if let Some(p) = pipe.upgrade() {
                let _ = p.send(m).await;
            }
        });
        Handled::Started
    }));
    for i in 0..50 {
        c.send(Message::new(json!(i))).await.unwrap();
        assert_eq!(c.recv_timeout(T).await.unwrap().header, json!(i));
    }
    assert_eq!(l.spin_stats().unwrap().polls, 0, "the reader polled after a handler that spawned");
}

/// The one connection of its listener busy-polls after an answer given at once: its reader
/// takes a place among the spinning ones, and the next message comes through the spin.
/// (The client has a runtime of its own, as a client process would: a task of the server's
/// runtime waiting in the spinning worker's queue waits out the spin.)
#[test]
fn a_lone_connection_busy_polls_after_an_answer_given_at_once() {
    let runtime =
        |workers| tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build().unwrap();
    let (server_rt, client_rt) = (runtime(2), runtime(1));
    let addr = format!("unix:ferry-fast-test-{}", ferry_conformance::unique("lone"));
    let mut l = server_rt.block_on(endpoint(ShmOptions::default(), Duration::from_secs(5)).listen(&addr)).unwrap();
    let c = client_rt.block_on(endpoint(ShmOptions::default(), Duration::ZERO).connect(&addr)).unwrap();
    let s = Arc::new(server_rt.block_on(async { tokio::time::timeout(T, l.accept()).await }).unwrap().unwrap());
    let weak = Arc::downgrade(&s);
    s.set_handler(Box::new(move |m| echo_now(weak.clone(), m)));
    let stats = || l.spin_stats().expect("a unix listener counts its spins");
    assert_eq!((stats().spinning, stats().polls), (0, 0));
    let call = |i: u32| {
        client_rt.block_on(async {
            c.send(Message::new(json!(i))).await.unwrap();
            assert_eq!(c.recv_timeout(T).await.unwrap().header, json!(i));
        });
    };
    call(1);
    let spun = (0..10_000).any(|_| {
        std::thread::sleep(Duration::from_millis(1));
        stats().spinning == 1
    });
    assert!(spun, "the server's reader did not busy-poll after answering at once");
    call(2);
    assert!(stats().hits >= 1, "the next message did not come through the spin: {:?}", stats());
    drop(c); // (end of stream ends the spin)
    drop(s);
    drop(l);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_ride_behind_messages_once_a_batch_is_pending() {
    // A delay far longer than the test: releases can only come back behind the answers.
    let opts = ShmOptions { release_batch: 4, release_delay: Duration::from_secs(3600), ..Default::default() };
    let (_l, c, s) = pair(opts, Duration::ZERO, "batch").await;
    let weak = Arc::downgrade(&s);
    s.set_handler(Box::new(move |m| echo_now(weak.clone(), m)));
    let t = c.alloc(TensorMeta::new(DType::U8, vec![1 << 20])).await.unwrap().freeze();
    let mut most = 0;
    // 41: one release short of a whole batch at the end.
    for i in 0..41 {
        c.send(Message::with_tensors(json!(i), vec![t.clone()])).await.unwrap();
        drop(c.recv_timeout(T).await.unwrap());
        most = most.max(stat(&c, "leases_granted"));
    }
    // Without batching behind messages, 41 leases would be outstanding.
    assert!(most <= 5, "at most a batch (4) and the one in flight stay granted, saw {most}");
    assert!(stat(&c, "leases_granted") >= 1, "the last releases wait for their batch");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_release_goes_out_after_the_delay() {
    let opts = ShmOptions { release_batch: 1000, release_delay: Duration::from_millis(5), ..Default::default() };
    let (_l, c, s) = pair(opts, Duration::ZERO, "delay").await;
    let t = c.alloc(TensorMeta::new(DType::U8, vec![1 << 20])).await.unwrap().freeze();
    c.send(Message::with_tensors(json!(1), vec![t])).await.unwrap();
    let got = s.recv_timeout(T).await.unwrap();
    assert_eq!(stat(&c, "leases_granted"), 1);
    drop(got); // no message goes back: the release must go out on its own
    eventually("the lone release", || stat(&c, "leases_granted") == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_is_dropped_when_the_pipe_ends() {
    let (_l, c, s) = pair(ShmOptions::default(), Duration::ZERO, "drop").await;
    // The handler holds the server's pipe strongly (as a server's connection state does).
    let held = s.clone();
    let witness = Arc::new(());
    let w = witness.clone();
    s.set_handler(Box::new(move |m| {
        let _ = (&held, &w);
        drop(m);
        Handled::Done
    }));
    c.send(Message::new(json!("hi"))).await.unwrap();
    c.close().await;
    // The reader sees the end, `recv` reports it, and the handler (with its references) is gone.
    assert!(s.recv_timeout(T).await.is_err());
    eventually("handler dropped", || Arc::strong_count(&witness) == 1).await;
    assert_eq!(Arc::strong_count(&s), 1, "the handler's reference to the pipe is gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_covering_many_bytes_go_out_at_once() {
    // Neither the count nor the delay would send it in this test's lifetime: the bytes do.
    let opts = ShmOptions {
        release_batch: 1000,
        release_batch_bytes: 16 << 20,
        release_delay: Duration::from_secs(3600),
        ..Default::default()
    };
    let (_l, c, s) = pair(opts, Duration::ZERO, "bytes").await;
    let weak = Arc::downgrade(&s);
    s.set_handler(Box::new(move |m| echo_now(weak.clone(), m)));
    for i in 0..5 {
        let t = c.alloc(TensorMeta::new(DType::U8, vec![20 << 20])).await.unwrap().freeze();
        c.send(Message::with_tensors(json!(i), vec![t])).await.unwrap();
        drop(c.recv_timeout(T).await.unwrap());
        // The release came behind the answer: the slot is free before the next alloc.
        eventually("the large lease released", || stat(&c, "leases_granted") == 0).await;
    }
    assert_eq!(stat(&c, "segments"), 1, "the pool reused its memory");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_cleared_while_it_runs_is_not_put_back() {
    let (_l, c, s) = pair(ShmOptions::default(), Duration::ZERO, "clear").await;
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (n, weak) = (calls.clone(), Arc::downgrade(&s));
    s.set_handler(Box::new(move |m| {
        n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Cleared while it runs (as `clear_handler` from another task would).
        if let Some(p) = weak.upgrade() {
            p.clear_handler();
        }
        drop(m);
        Handled::Done
    }));
    for i in 0..3 {
        c.send(Message::new(json!(i))).await.unwrap();
    }
    // The first went to the handler; the others are queued for `recv` again.
    assert_eq!(s.recv_timeout(T).await.unwrap().header, json!(1));
    assert_eq!(s.recv_timeout(T).await.unwrap().header, json!(2));
    assert_eq!(calls.load(std::sync::atomic::Ordering::Relaxed), 1);
}
