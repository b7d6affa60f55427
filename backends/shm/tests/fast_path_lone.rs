//! One test alone in its process: it counts the busy-polling readers of the whole process
//! (`ferry_pipe::busy_polling_readers`), which the tests of `fast_path.rs` running beside it
//! in one process would change (it failed there under `cargo test`, whose tests share a
//! process, though never under nextest, which runs each in its own).
#![cfg(target_os = "linux")] // ferry-shm exists on Linux only

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{T, echo_now, endpoint};
use ferry_core::Message;
use ferry_shm::ShmOptions;
use serde_json::json;

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
    assert_eq!(ferry_pipe::busy_polling_readers(), 0);
    let call = |i: u32| {
        client_rt.block_on(async {
            c.send(Message::new(json!(i))).await.unwrap();
            assert_eq!(c.recv_timeout(T).await.unwrap().header, json!(i));
        });
    };
    call(1);
    let spun = (0..10_000).any(|_| {
        std::thread::sleep(Duration::from_millis(1));
        ferry_pipe::busy_polling_readers() == 1
    });
    assert!(spun, "the server's reader did not busy-poll after answering at once");
    call(2);
    drop(c); // (end of stream ends the spin)
    drop(s);
    drop(l);
}
