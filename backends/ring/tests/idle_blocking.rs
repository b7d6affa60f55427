//! Blocking callers waiting on an idle ring use no CPU: they spin at most the ring's window,
//! then sleep on its futex (waking every 50 ms to look at the socket). Alone in its test
//! binary, so that the process's CPU time is this test's.

#![cfg(target_os = "linux")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::cpu_ticks;
use ferry_core::{Endpoint, InlineChannel, Message};
use ferry_local::LocalTransport;
use ferry_ring::{RingExt, RingOptions};
use serde_json::json;

/// Both sides on plain threads: a blocking echo and a blocking client. After 200 round
/// trips (the adaptive windows are wide open), both wait in `recv_blocking` for a second
/// with nothing coming: the process uses a small fraction of a CPU (two callers spinning
/// through it would use 200 ticks). Then a message still gets through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_callers_on_an_idle_ring_use_no_cpu() {
    let ep = Endpoint::builder()
        .transport(Arc::new(LocalTransport::new()))
        .channel(Arc::new(InlineChannel))
        .ring(Some(RingOptions::default().spin(Duration::from_micros(200))))
        .build();
    let a = format!("unix:ferry-ring-idle-blocking-{}", std::process::id());
    let mut l = ep.listen(&a).await.unwrap();
    let (s, c) = tokio::join!(l.accept(), ep.connect(&a));
    let (s, c) = (Arc::new(s.unwrap()), Arc::new(c.unwrap()));
    let echo = std::thread::spawn(move || {
        while let Ok(m) = s.recv_blocking(Some(Duration::from_secs(20))) {
            if s.send_blocking(m).is_err() {
                break;
            }
        }
    });
    let c2 = c.clone();
    let idle = std::thread::spawn(move || {
        for i in 0..200 {
            c2.send_blocking(Message::new(json!(i))).unwrap();
            assert_eq!(c2.recv_blocking(Some(Duration::from_secs(20))).unwrap().header, json!(i));
        }
        // Nothing comes: this waits out its deadline.
        let before = cpu_ticks();
        let r = c2.recv_blocking(Some(Duration::from_secs(1)));
        let used = cpu_ticks() - before;
        assert!(matches!(r, Err(ferry_core::PipeError::Timeout(..))), "{r:?}");
        used
    });
    let used = tokio::task::spawn_blocking(move || idle.join().unwrap()).await.unwrap();
    assert!(used < 30, "the idle blocking callers used {used} ticks of CPU in one second");
    let c2 = c.clone();
    let back = tokio::task::spawn_blocking(move || {
        c2.send_blocking(Message::new(json!("after"))).unwrap();
        c2.recv_blocking(Some(Duration::from_secs(20)))
    })
    .await
    .unwrap();
    assert_eq!(back.unwrap().header, json!("after"));
    c.close().await;
    tokio::task::spawn_blocking(move || echo.join().unwrap()).await.unwrap();
}
