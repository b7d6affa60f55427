//! `RpcLimits::max_queued_answers`: a connection holding that many answers not yet written
//! (running calls count) is not read until one leaves, over plain JSON and ferry pipes.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Plain, addr, endpoint, t};
use ferry_rpc::{ErrorObject, Methods, RpcLimits, Server};
use tokio::sync::Semaphore;

/// Calls that started, and the gate each waits at.
struct Gate {
    started: AtomicUsize,
    open: Semaphore,
}

async fn serve(limits: RpcLimits, gate: Arc<Gate>) -> (String, Server) {
    let mut m = Methods::new();
    m.register("wait", move |(): ()| {
        let gate = gate.clone();
        async move {
            gate.started.fetch_add(1, Ordering::SeqCst);
            let _pass = gate.open.acquire().await.map_err(|_| ErrorObject::internal("gate closed"))?;
            Ok::<_, ErrorObject>(true)
        }
    })
    .unwrap();
    let server = Server::builder(m).limits(limits).build();
    let addr = addr();
    let listener = t(endpoint().listen(&addr)).await.unwrap();
    let s = server.clone();
    tokio::spawn(async move {
        let _ = s.serve(listener).await;
    });
    (addr, server)
}

/// Waits (bounded) until `n` calls started, then a little longer to see that no more do.
async fn started_settles_at(gate: &Gate, n: usize) {
    for _ in 0..400 {
        if gate.started.load(Ordering::SeqCst) >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Had the server read on, the next calls would start now.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(gate.started.load(Ordering::SeqCst), n, "calls started with {n} answers allowed in the queue");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_json_reading_stops_at_the_bound() {
    let gate = Arc::new(Gate { started: AtomicUsize::new(0), open: Semaphore::new(0) });
    let (addr, server) = serve(RpcLimits::default().max_queued_answers(3), gate.clone()).await;
    let mut p = Plain::connect(&addr).await;
    for id in 0..6 {
        p.send(&format!("{{\"jsonrpc\":\"2.0\",\"method\":\"wait\",\"id\":{id}}}\n")).await;
    }
    started_settles_at(&gate, 3).await;
    // Answers leave: the rest is read, and everything is answered.
    gate.open.add_permits(6);
    let mut ids: Vec<i64> = Vec::new();
    for _ in 0..6 {
        let r = p.line().await;
        assert_eq!(r["result"], true, "{r}");
        ids.push(r["id"].as_i64().unwrap());
    }
    ids.sort();
    assert_eq!(ids, (0..6).collect::<Vec<_>>());
    assert_eq!(gate.started.load(Ordering::SeqCst), 6);
    server.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ferry_local_reading_stops_at_the_bound() {
    let gate = Arc::new(Gate { started: AtomicUsize::new(0), open: Semaphore::new(0) });
    let (addr, server) = serve(RpcLimits::default().max_queued_answers(2), gate.clone()).await;
    let client = Arc::new(common::client(&addr).await);
    let calls: Vec<_> = (0..5)
        .map(|_| {
            let c = client.clone();
            tokio::spawn(async move { c.call::<(), bool>("wait", &()).await })
        })
        .collect();
    started_settles_at(&gate, 2).await;
    gate.open.add_permits(5);
    for c in calls {
        assert!(t(c).await.unwrap().unwrap());
    }
    assert_eq!(gate.started.load(Ordering::SeqCst), 5);
    server.shutdown();
}

/// `RpcLimits::max_parse_bytes_in_flight`: big requests (1 MiB of text or more) from
/// different connections are parsed and answered one budget at a time, while small ones go
/// on: with a 1 MiB budget, the second big call starts only once the first ended; a small
/// call on a third connection is not held behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_requests_wait_for_parse_room_and_small_ones_do_not() {
    let gate = Arc::new(Gate { started: AtomicUsize::new(0), open: Semaphore::new(0) });
    let limits = RpcLimits::default().max_parse_bytes_in_flight(1 << 20);
    let mut m = Methods::new();
    let g = gate.clone();
    m.register("big", move |(pad,): (String,)| {
        let gate = g.clone();
        async move {
            gate.started.fetch_add(1, Ordering::SeqCst);
            let _pass = gate.open.acquire().await.map_err(|_| ErrorObject::internal("gate closed"))?;
            Ok::<_, ErrorObject>(pad.len())
        }
    })
    .unwrap();
    m.register("small", |(): ()| async move { Ok::<_, ErrorObject>(true) }).unwrap();
    let server = Server::builder(m).limits(limits).build();
    let addr = addr();
    let listener = t(endpoint().listen(&addr)).await.unwrap();
    let s = server.clone();
    tokio::spawn(async move {
        let _ = s.serve(listener).await;
    });
    let pad = "x".repeat((1 << 20) + 100);
    let big = format!("{{\"jsonrpc\":\"2.0\",\"method\":\"big\",\"params\":[\"{pad}\"],\"id\":1}}\n");
    let (mut a, mut b, mut c) = (Plain::connect(&addr).await, Plain::connect(&addr).await, Plain::connect(&addr).await);
    a.send(&big).await;
    b.send(&big).await;
    started_settles_at(&gate, 1).await;
    // A small call is answered while both big ones are held.
    c.send("{\"jsonrpc\":\"2.0\",\"method\":\"small\",\"id\":7}\n").await;
    assert_eq!(c.line().await["result"], true);
    // The first big call ends: the second gets the room and starts.
    gate.open.add_permits(1);
    started_settles_at(&gate, 2).await;
    gate.open.add_permits(1);
    for p in [&mut a, &mut b] {
        let r = p.line().await;
        assert_eq!(r["result"], pad.len(), "{r}");
    }
    server.shutdown();
}
