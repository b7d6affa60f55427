//! An idle pipe over the same-host ring uses no CPU. Alone in its test binary, so that the
//! process's CPU time is this test's.

#![cfg(target_os = "linux")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::cpu_ticks;
use ferry_core::{Endpoint, InlineChannel, Message, Pipe};
use ferry_local::LocalTransport;
use ferry_ring::{RingExt, RingOptions};
use serde_json::json;

async fn pair(ep: &Endpoint) -> (Pipe, Pipe) {
    let a = format!("unix:ferry-ring-idle-{}", std::process::id());
    let mut l = ep.listen(&a).await.unwrap();
    let (s, c) = tokio::join!(l.accept(), ep.connect(&a));
    (s.unwrap(), c.unwrap())
}

/// An idle pipe over the ring spins on nothing: with busy polling armed and a window set,
/// its readers poll the ring at most for the window after the last frame, then wait on the
/// socket behind the doorbell. Over a second of idling, the process uses a small fraction
/// of one CPU (a reader spinning through it would use all of it, 100 ticks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_ring_uses_no_cpu() {
    let ep = Endpoint::builder()
        .transport(Arc::new(LocalTransport::new()))
        .channel(Arc::new(InlineChannel))
        .ring(Some(RingOptions::default()))
        .busy_poll(Duration::from_micros(200))
        .build();
    let (s, c) = pair(&ep).await;
    // Traffic first: an answering handler arms busy polling on the server's reader.
    let s = Arc::new(s);
    let echo = s.clone();
    s.set_handler(Box::new(move |m| {
        let p = echo.clone();
        tokio::spawn(async move {
            let _ = p.send(m).await;
        });
        ferry_core::Handled::Done
    }));
    for i in 0..200 {
        c.send(Message::new(json!(i))).await.unwrap();
        assert_eq!(c.recv().await.unwrap().header, json!(i));
    }
    let before = cpu_ticks();
    // The test's own thread sleeps (the pipes' tasks run on the runtime's workers): a
    // reader that never stopped spinning would hold a worker, and the check must still come.
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_ticks() - before;
    assert!(used < 30, "the idle pipe used {used} ticks of CPU in one second");
    c.send(Message::new(json!("after"))).await.unwrap();
    assert_eq!(c.recv().await.unwrap().header, json!("after"));
}
