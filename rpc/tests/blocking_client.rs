//! `Client::call_raw_blocking`: calls from plain threads that read the pipe themselves,
//! beside async calls on the same client, timeouts that cancel on the server, and a server
//! going away; over real unix sockets.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{Sleep, client, serve, t};
use ferry_rpc::codes::CANCELLED;
use ferry_rpc::{CallError, Client, RpcLimits};
use serde_json::{Value, json};

/// A blocking call of `method` with `params` on a thread of the blocking pool.
async fn blocking(
    c: &Client,
    method: &'static str,
    params: Value,
    timeout: Option<Duration>,
) -> Result<Value, CallError> {
    let c = c.clone();
    let r = t(tokio::task::spawn_blocking(move || c.call_raw_blocking(method, Some(params), vec![], timeout))).await;
    r.unwrap().map(|(v, _)| v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_calls_from_many_threads_and_async_calls_get_their_own_answers() {
    let fx = serve(RpcLimits::default()).await;
    let c = client(&fx.addr).await;
    // Four threads calling in turn, and async calls (some waiting) on the same client.
    let threads: Vec<_> = (0..4u64)
        .map(|k| {
            let c = c.clone();
            tokio::task::spawn_blocking(move || {
                for i in 0..50u64 {
                    let (v, _) = c.call_raw_blocking("add", Some(json!([k * 1000, i])), vec![], None).unwrap();
                    assert_eq!(v, json!((k * 1000 + i) as f64), "thread {k}, call {i}");
                }
            })
        })
        .collect();
    let naps: Vec<_> = (0..10u64)
        .map(|i| {
            let c = c.clone();
            tokio::spawn(async move { c.call::<_, u64>("sleep", &Sleep { ms: 20 + i * 5 }).await })
        })
        .collect();
    for (i, n) in naps.into_iter().enumerate() {
        assert_eq!(t(n).await.unwrap().unwrap(), 20 + i as u64 * 5);
    }
    for th in threads {
        t(th).await.unwrap();
    }
    // After the blocking callers left, async calls are answered by the read loop again.
    assert_eq!(t(c.call::<_, f64>("add", &(2, 3))).await.unwrap(), 5.0);
    // An async call waiting while a blocking call ends is answered, not stranded.
    let slow = {
        let c = c.clone();
        tokio::spawn(async move { c.call::<_, u64>("sleep", &Sleep { ms: 200 }).await })
    };
    assert_eq!(blocking(&c, "add", json!([1, 1]), None).await.unwrap(), json!(2.0));
    assert_eq!(t(slow).await.unwrap().unwrap(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_call_that_times_out_is_cancelled_on_the_server() {
    let fx = serve(RpcLimits::default()).await;
    let c = client(&fx.addr).await;
    let r = blocking(&c, "sleep", json!({ "ms": 10_000 }), Some(Duration::from_millis(100))).await;
    assert!(matches!(r, Err(CallError::Timeout(d)) if d == Duration::from_millis(100)), "{r:?}");
    for _ in 0..200 {
        if fx.seen.cancelled.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(fx.seen.cancelled.load(Ordering::SeqCst), 1, "the handler was cancelled");
    assert_eq!(blocking(&c, "add", json!([1, 2]), None).await.unwrap(), json!(3.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_going_away_fails_a_waiting_blocking_call_and_later_ones() {
    let fx = serve(RpcLimits::default()).await;
    let c = client(&fx.addr).await;
    let waiting = {
        let c = c.clone();
        tokio::task::spawn_blocking(move || c.call_raw_blocking("sleep", Some(json!({ "ms": 60_000 })), vec![], None))
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    fx.server.shutdown();
    let r = t(waiting).await.unwrap();
    assert!(
        matches!(&r, Err(CallError::Closed(_))) || r.as_ref().err().and_then(CallError::code) == Some(CANCELLED),
        "{r:?}"
    );
    let r = blocking(&c, "add", json!([1, 1]), Some(Duration::from_secs(5))).await;
    assert!(matches!(r, Err(CallError::Closed(_))), "{r:?}");
    assert!(c.close_reason().is_some(), "the reason is kept");
}
