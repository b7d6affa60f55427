//! A handler's thread reads the next message itself (`Pipe::serve_next_blocking`, the
//! Python server's handler threads): over a real unix socket, the message goes to the
//! pipe's handler on that thread; nothing by the deadline gives the reader back to the
//! pipe's task, which reads on; a burst beside a follower is handled once each, in order,
//! the follower taking one at most; a second thread finds the reader taken; a peer that
//! closes ends it.
#![cfg(target_os = "linux")]

use std::sync::Arc;
use std::sync::mpsc;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use ferry_core::{Endpoint, Handled, InlineChannel, Message, Pipe, Served};
use ferry_local::LocalTransport;
use serde_json::json;

/// The longest any step may take before the test calls it hung.
const WAIT: Duration = Duration::from_secs(20);

async fn pair(name: &str) -> (Arc<Pipe>, Pipe) {
    let ep = Endpoint::builder().transport(Arc::new(LocalTransport::new())).channel(Arc::new(InlineChannel)).build();
    let a = format!("unix:ferry-follow-{name}-{}", std::process::id());
    let mut l = ep.listen(&a).await.unwrap();
    let (s, c) = tokio::join!(l.accept(), ep.connect(&a));
    (Arc::new(s.unwrap()), c.unwrap())
}

/// A handler that reports each message's `n` and the thread it ran on.
fn recording(s: &Pipe) -> mpsc::Receiver<(u64, ThreadId)> {
    let (tx, rx) = mpsc::channel();
    s.set_handler(Box::new(move |m: Message| {
        let _ = tx.send((m.header["n"].as_u64().unwrap(), std::thread::current().id()));
        Handled::Started
    }));
    rx
}

fn next(rx: &mpsc::Receiver<(u64, ThreadId)>) -> (u64, ThreadId) {
    rx.recv_timeout(WAIT).expect("the handler was called")
}

/// `serve_next_blocking` on a plain thread, its result and that thread's id.
fn follow(s: &Arc<Pipe>, window: Duration) -> std::thread::JoinHandle<(Served, ThreadId)> {
    let s = s.clone();
    std::thread::spawn(move || (s.serve_next_blocking(Instant::now() + window), std::thread::current().id()))
}

/// Sends messages from `n` on, each with a follower waiting, until one is handled on the
/// follower's thread (the first may still be read by the task: a follower gets the reader
/// only at the task's next wait). Each message is handled once, in order. Returns the
/// next `n` and the follower's thread.
async fn until_followed(s: &Arc<Pipe>, c: &Pipe, rx: &mpsc::Receiver<(u64, ThreadId)>, mut n: u64) -> (u64, ThreadId) {
    for _ in 0..50 {
        let f = follow(s, Duration::from_millis(500));
        // Time for the follower to ask and the task to park the reader (a message that
        // comes first is the task's to read, and the loop tries again).
        tokio::time::sleep(Duration::from_millis(20)).await;
        c.send(Message::new(json!({"n": n}))).await.unwrap();
        let (got, on) = next(rx);
        assert_eq!(got, n, "in order, once");
        let (served, follower) = f.join().unwrap();
        n += 1;
        if served == Served::Handled {
            assert_eq!(on, follower, "handled on the follower's thread");
            return (n, follower);
        }
        assert_eq!(served, Served::Idle, "the task read it: nothing came for the follower");
        assert_ne!(on, follower);
    }
    panic!("no follower got the reader in 50 tries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_message_is_handled_on_the_followers_thread_and_the_task_reads_after_it() {
    let (s, c) = pair("thread").await;
    let rx = recording(&s);
    c.send(Message::new(json!({"n": 0}))).await.unwrap();
    let (_, task_thread) = next(&rx);
    let (n, follower) = until_followed(&s, &c, &rx, 1).await;
    assert_ne!(follower, task_thread);

    // Nothing comes within its window: the reader goes back, and the task reads the next.
    let (served, _) = follow(&s, Duration::from_millis(30)).join().unwrap();
    assert_eq!(served, Served::Idle);
    for n in n..n + 3 {
        c.send(Message::new(json!({"n": n}))).await.unwrap();
        assert_eq!(next(&rx).0, n, "the task reads on, in order");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_beside_a_follower_is_handled_once_each_in_order() {
    let (s, c) = pair("burst").await;
    let rx = recording(&s);
    let (mut n, _) = until_followed(&s, &c, &rx, 0).await;
    // Three messages at once beside a follower: it handles one of them at most (the first
    // it reads; the task may read some first), the task the rest, in order, none lost.
    for _ in 0..50 {
        let f = follow(&s, Duration::from_millis(500));
        tokio::time::sleep(Duration::from_millis(20)).await;
        for k in n..n + 3 {
            c.send(Message::new(json!({"n": k}))).await.unwrap();
        }
        let got: Vec<(u64, ThreadId)> = (0..3).map(|_| next(&rx)).collect();
        let (served, follower) = f.join().unwrap();
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), [n, n + 1, n + 2]);
        let on_follower = got.iter().filter(|g| g.1 == follower).count();
        n += 3;
        match served {
            Served::Handled => {
                assert_eq!(on_follower, 1, "one message per follow: {got:?}");
                return;
            }
            Served::Idle => assert_eq!(on_follower, 0),
            other => panic!("{other:?}"),
        }
    }
    panic!("no follower got the reader in 50 tries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_follower_finds_the_reader_taken() {
    let (s, c) = pair("busy").await;
    let rx = recording(&s);
    c.send(Message::new(json!({"n": 0}))).await.unwrap();
    next(&rx);
    let barrier = Arc::new(std::sync::Barrier::new(2));
    let both: Vec<_> = (0..2)
        .map(|_| {
            let (s, b) = (s.clone(), barrier.clone());
            std::thread::spawn(move || {
                b.wait();
                s.serve_next_blocking(Instant::now() + Duration::from_secs(2))
            })
        })
        .collect();
    let mut got: Vec<Served> = both.into_iter().map(|t| t.join().unwrap()).collect();
    got.sort_by_key(|s| format!("{s:?}"));
    // One waits out its window with the reader; the other finds it taken.
    assert_eq!(got, [Served::Busy, Served::Idle]);
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_closes_ends_a_waiting_follower() {
    let (s, c) = pair("closed").await;
    let rx = recording(&s);
    c.send(Message::new(json!({"n": 0}))).await.unwrap();
    next(&rx);
    let f = follow(&s, WAIT);
    c.close().await;
    let (served, _) = f.join().unwrap();
    assert_eq!(served, Served::Ended);
    assert!(s.is_closed());
    // Later followers are told at once.
    assert_eq!(follow(&s, WAIT).join().unwrap().0, Served::Ended);
}
