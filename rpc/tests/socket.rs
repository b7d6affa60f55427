//! The server and client over real unix sockets: ferry pipes and plain JSON on one socket,
//! tensors, concurrency, cancellation, limits, tasks.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{Plain, Scale, Sleep, client, endpoint, serve, t};
use ferry_core::Tensor;
use ferry_rpc::codes::{CANCELLED, INTERNAL_ERROR, LIMIT_EXCEEDED, METHOD_NOT_FOUND, TASK_NOT_FOUND, TASK_PENDING};
use ferry_rpc::{CallError, RpcLimits, RpcTensor, TaskState, TensorMap};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_calls_with_tensors_and_maps() {
    let fx = serve(RpcLimits::default()).await;
    let c = client(&fx.addr).await;
    let sum: f64 = t(c.call("add", &(1.5, 2.0))).await.unwrap();
    assert_eq!(sum, 3.5);
    let x = Tensor::from_slice(vec![3], &[1.0f32, 2.0, 3.0]).unwrap();
    let y: RpcTensor = t(c.call("scale", &Scale { x: x.into(), factor: 2.0 })).await.unwrap();
    assert_eq!(y.as_slice::<f32>().unwrap(), &[2.0, 4.0, 6.0]);
    let w: TensorMap = t(c.call("weights", &())).await.unwrap();
    assert_eq!(w.keys().collect::<Vec<_>>(), ["fc.bias", "fc.weight"]);
    assert_eq!(w["fc.weight"].shape(), &[2, 2]);
    let norms: BTreeMap<String, f64> = t(c.call("norms", &json!({ "weights": {} }))).await.unwrap();
    assert!(norms.is_empty());
    let norms: BTreeMap<String, f64> = t(c.call("norms", &common::Norms { weights: w })).await.unwrap();
    assert_eq!(norms["fc.weight"], 10.0);
    assert_eq!(norms["fc.bias"], 1.0);
    // The raw form: results hold {"$tensor": i} refs into the message's tensors.
    let (v, tensors) = t(c.call_raw("weights", None, vec![], None)).await.unwrap();
    assert_eq!(v, json!({"fc.bias": {"$tensor": 0}, "fc.weight": {"$tensor": 1}}));
    assert_eq!(tensors.len(), 2);
    // A batch whose results carry tensors: refs are renumbered into one message.
    let out = t(c.batch(&[("weights", None), ("add", Some(json!([1, 1]))), ("weights", None)], vec![])).await.unwrap();
    let (v0, t0) = out[0].clone().unwrap();
    let (v2, t2) = out[2].clone().unwrap();
    assert_eq!(v0["fc.bias"], json!({"$tensor": 0}));
    assert_eq!(v2["fc.bias"], json!({"$tensor": 2}));
    assert_eq!(t0[2], t2[2]);
    assert_eq!(out[1].clone().unwrap().0, json!(2.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_calls_in_flight_match_by_id() {
    let fx = serve(RpcLimits::default()).await;
    let c = client(&fx.addr).await;
    let start = Instant::now();
    // 60 calls at once whose answers come back in reverse order of sending.
    let calls: Vec<_> = (0..60u64)
        .map(|i| {
            let c = c.clone();
            tokio::spawn(async move { (i, c.call::<_, u64>("sleep", &Sleep { ms: 300 - i * 4 }).await) })
        })
        .collect();
    for h in calls {
        let (i, r) = t(h).await.unwrap();
        assert_eq!(r.unwrap(), 300 - i * 4);
    }
    assert!(start.elapsed() < Duration::from_secs(3), "calls ran one after another: {:?}", start.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_handler_does_not_stop_its_connection() {
    let fx = serve(RpcLimits::default()).await;
    let c = client(&fx.addr).await;
    let slow = {
        let c = c.clone();
        tokio::spawn(async move { c.call::<_, u64>("block", &Sleep { ms: 1_000 }).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let start = Instant::now();
    assert_eq!(t(c.call::<_, f64>("add", &(1, 2))).await.unwrap(), 3.0);
    assert!(start.elapsed() < Duration::from_millis(500), "waited {:?} behind a blocking handler", start.elapsed());
    assert_eq!(t(slow).await.unwrap().unwrap(), 1_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_handler_that_waits_does_not_stop_its_connection() {
    let fx = serve(RpcLimits::default()).await;
    let c = client(&fx.addr).await;
    let naps: Vec<_> = (0..3)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move { c.call::<_, u64>("nap", &Sleep { ms: 60_000 }).await })
        })
        .collect();
    // Were a waiting inline call kept in the read loop, nothing after it would be answered.
    for i in 0..20 {
        assert_eq!(t(c.call::<_, f64>("add", &(i, 1))).await.unwrap(), f64::from(i + 1));
    }
    assert_eq!(t(c.call::<_, u64>("nap", &Sleep { ms: 1 })).await.unwrap(), 1);
    let mut p = Plain::connect(&fx.addr).await;
    p.send("{\"jsonrpc\":\"2.0\",\"method\":\"nap\",\"params\":[60000],\"id\":1}\n").await;
    p.send("{\"jsonrpc\":\"2.0\",\"method\":\"add\",\"params\":[2,2],\"id\":2}\n").await;
    assert_eq!(p.line().await["result"], 4.0);
    for n in &naps {
        assert!(!n.is_finished());
    }
    c.close().await;
    for n in naps {
        assert!(t(n).await.unwrap().is_err(), "a nap ended by closing the connection");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_typed() {
    let fx = serve(RpcLimits::default()).await;
    let c = client(&fx.addr).await;
    let e = t(c.call::<_, Value>("fail", &())).await.unwrap_err();
    assert_eq!(e.code(), Some(42));
    let e = t(c.call::<_, Value>("panic", &())).await.unwrap_err();
    assert_eq!(e.code(), Some(INTERNAL_ERROR));
    assert!(e.to_string().contains("boom"), "{e}");
    let e = t(c.call::<_, Value>("nope", &())).await.unwrap_err();
    assert_eq!(e.code(), Some(METHOD_NOT_FOUND));
    let e = t(c.call::<_, String>("add", &(1, 2))).await.unwrap_err();
    assert!(matches!(e, CallError::Result(_)), "{e}");
    let e = t(c.call::<_, f64>("add", &5)).await.unwrap_err();
    assert!(matches!(e, CallError::Params(_)), "{e}");
    // The connection is still good.
    assert_eq!(t(c.call::<_, f64>("add", &[2, 2])).await.unwrap(), 4.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_and_dropped_calls_cancel_on_the_server() {
    let fx = serve(RpcLimits::default()).await;
    let c = client(&fx.addr).await;
    let e = t(c.call_timeout::<_, u64>("sleep", &Sleep { ms: 10_000 }, Duration::from_millis(100))).await;
    assert!(matches!(e, Err(CallError::Timeout(_))), "{e:?}");
    // Dropping the call's future cancels it too.
    let fut = c.call::<_, u64>("sleep", &Sleep { ms: 10_000 });
    assert!(tokio::time::timeout(Duration::from_millis(100), fut).await.is_err());
    for _ in 0..200 {
        if fx.seen.cancelled.load(Ordering::SeqCst) == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(fx.seen.cancelled.load(Ordering::SeqCst), 2, "both handlers were cancelled (their futures dropped)");
    assert_eq!(t(c.call::<_, f64>("add", &(1, 1))).await.unwrap(), 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_going_away_fails_every_call() {
    let fx = serve(RpcLimits::default()).await;
    let c = client(&fx.addr).await;
    let pending = {
        let c = c.clone();
        tokio::spawn(async move { c.call::<_, u64>("sleep", &Sleep { ms: 60_000 }).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    fx.server.shutdown();
    // Running calls are cancelled (and told so while the pipe is still up) or see the close.
    let r = t(pending).await.unwrap();
    assert!(
        matches!(&r, Err(CallError::Closed(_))) || r.as_ref().err().and_then(CallError::code) == Some(CANCELLED),
        "{r:?}"
    );
    let r = t(c.call::<_, f64>("add", &(1, 1))).await;
    assert!(matches!(r, Err(CallError::Closed(_))), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_json_on_the_same_socket() {
    let fx = serve(RpcLimits::default()).await;
    let mut p = Plain::connect(&fx.addr).await;
    // Pipelined: the slow call is answered after the fast one.
    p.send(concat!(
        r#"{"jsonrpc":"2.0","method":"sleep","params":{"ms":300},"id":"slow"}"#,
        "\n",
        r#"{"jsonrpc":"2.0","method":"add","params":[1,2],"id":7}"#,
        "\n"
    ))
    .await;
    assert_eq!(p.line().await, json!({"jsonrpc": "2.0", "result": 3.0, "id": 7}));
    assert_eq!(p.line().await, json!({"jsonrpc": "2.0", "result": 300, "id": "slow"}));
    // Tensors are inline, both ways.
    p.send(concat!(
        r#"{"jsonrpc":"2.0","method":"scale","params":{"x":{"$tensor":{"dtype":"f32","shape":[1],"data":"AADAPw=="}},"factor":2},"id":1}"#,
        "\n"
    ))
    .await;
    let r = p.line().await;
    assert_eq!(r["result"], json!({"$tensor": {"dtype": "f32", "shape": [1], "data": "AABAQA=="}}));
    // A ref on a plain connection has nothing to point at.
    p.send("{\"jsonrpc\":\"2.0\",\"method\":\"scale\",\"params\":{\"x\":{\"$tensor\":0},\"factor\":2},\"id\":2}\n")
        .await;
    let r = p.line().await;
    assert_eq!(r["error"]["code"], -32602);
    assert!(r["error"]["message"].as_str().unwrap().contains("out of range"), "{r}");
    // Parse errors do not end the connection; blank lines are ignored.
    p.send("{not json\n\n[]\n").await;
    assert_eq!(p.line().await["error"]["code"], -32700);
    assert_eq!(p.line().await["error"]["code"], -32600);
    // So is a big one (looked at on the blocking pool, past 1 MiB): the next call is the
    // next answer.
    p.send(&format!(
        "{}\t\r\n{{\"jsonrpc\":\"2.0\",\"method\":\"add\",\"params\":[2,2],\"id\":8}}\n",
        " ".repeat(3 << 20)
    ))
    .await;
    assert_eq!(p.line().await, json!({"jsonrpc": "2.0", "result": 4.0, "id": 8}));
    // Explicit cancellation by id.
    p.send("{\"jsonrpc\":\"2.0\",\"method\":\"sleep\",\"params\":{\"ms\":60000},\"id\":\"long\"}\n").await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    p.send("{\"jsonrpc\":\"2.0\",\"method\":\"ferry.cancel\",\"params\":{\"id\":\"long\"}}\n").await;
    let r = p.line().await;
    assert_eq!(r["id"], "long");
    assert_eq!(r["error"]["code"], CANCELLED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_name_themselves() {
    let fx = serve(RpcLimits::default().max_in_flight(2).max_request_bytes(200)).await;
    let mut p = Plain::connect(&fx.addr).await;
    for id in 1..=3 {
        p.send(&format!("{{\"jsonrpc\":\"2.0\",\"method\":\"sleep\",\"params\":{{\"ms\":500}},\"id\":{id}}}\n")).await;
    }
    let r = p.line().await;
    assert_eq!(r["id"], 3);
    assert_eq!(r["error"]["code"], LIMIT_EXCEEDED);
    assert_eq!(r["error"]["data"]["limit"], "max_in_flight");
    assert!(r["error"]["message"].as_str().unwrap().contains("RpcLimits::max_in_flight"), "{r}");
    let long = format!("{{\"jsonrpc\":\"2.0\",\"method\":\"add\",\"params\":[1,2],\"id\":\"{}\"}}\n", "x".repeat(300));
    p.send(&long).await;
    let r = p.line().await;
    assert_eq!(r["error"]["data"]["limit"], "max_request_bytes");
    // The two slow calls finish, and the connection goes on.
    let mut ids = vec![p.line().await["id"].as_u64().unwrap(), p.line().await["id"].as_u64().unwrap()];
    ids.sort_unstable();
    assert_eq!(ids, [1, 2]);
    p.send("{\"jsonrpc\":\"2.0\",\"method\":\"add\",\"params\":[1,2],\"id\":9}\n").await;
    assert_eq!(p.line().await["result"], 3.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_hanging_up_early_do_not_stop_the_server() {
    let fx = serve(RpcLimits::default()).await;
    for _ in 0..100 {
        drop(Plain::connect(&fx.addr).await);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let c = client(&fx.addr).await;
    assert_eq!(t(c.call::<_, f64>("add", &(1, 2))).await.unwrap(), 3.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_clients_stall_nobody() {
    let fx = serve(RpcLimits::default()).await;
    // 100 idle pipes, 100 plain connections that sent half a request, and slow calls.
    let mut idle = Vec::new();
    for _ in 0..100 {
        idle.push(client(&fx.addr).await);
    }
    let mut half = Vec::new();
    for _ in 0..100 {
        let mut p = Plain::connect(&fx.addr).await;
        p.send("{\"jsonrpc\":\"2.0\",\"method\":\"add\",").await;
        half.push(p);
    }
    let slow = client(&fx.addr).await;
    let slow_calls: Vec<_> = (0..30)
        .map(|_| {
            let c = slow.clone();
            tokio::spawn(async move { c.call::<_, u64>("sleep", &Sleep { ms: 2_000 }).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let start = Instant::now();
    let c = client(&fx.addr).await;
    for i in 0..200 {
        assert_eq!(t(c.call::<_, f64>("add", &(i, 1))).await.unwrap(), f64::from(i + 1));
    }
    let mut p = Plain::connect(&fx.addr).await;
    p.send("{\"jsonrpc\":\"2.0\",\"method\":\"add\",\"params\":[2,2],\"id\":1}\n").await;
    assert_eq!(p.line().await["result"], 4.0);
    assert!(start.elapsed() < Duration::from_secs(1), "took {:?} beside idle and slow clients", start.elapsed());
    for h in slow_calls {
        assert_eq!(t(h).await.unwrap().unwrap(), 2_000);
    }
    // The half-sent requests complete when their senders finish them.
    for p in half.iter_mut().take(3) {
        p.send("\"params\":[1,1],\"id\":5}\n").await;
        assert_eq!(p.line().await["result"], 2.0);
    }
    drop(idle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_lifecycle() {
    let fx = serve(RpcLimits::default().max_tasks(3)).await;
    let c = client(&fx.addr).await;
    let id = t(c.submit("add", &(2, 3), false)).await.unwrap();
    let r: f64 = t(c.task_result(&id, Duration::from_secs(5))).await.unwrap();
    assert_eq!(r, 5.0);
    let e = t(c.task_result::<f64>(&id, Duration::ZERO)).await.unwrap_err();
    assert_eq!(e.code(), Some(TASK_NOT_FOUND), "fetched once");
    // Kept results can be fetched again; tensors come back too.
    let id = t(c.submit("weights", &(), true)).await.unwrap();
    let w: TensorMap = t(c.task_result(&id, Duration::from_secs(5))).await.unwrap();
    assert_eq!(w.len(), 2);
    let w: TensorMap = t(c.task_result(&id, Duration::from_secs(5))).await.unwrap();
    assert_eq!(w["fc.bias"].as_slice::<f32>().unwrap(), &[0.5, -0.5]);
    // Running, pending, cancelled.
    let slow = t(c.submit("sleep", &Sleep { ms: 60_000 }, false)).await.unwrap();
    assert_eq!(t(c.task_status(&slow)).await.unwrap().state, TaskState::Running);
    let e = t(c.task_result::<u64>(&slow, Duration::from_millis(50))).await.unwrap_err();
    assert_eq!(e.code(), Some(TASK_PENDING));
    // The table is full (the kept result, the running task and one more).
    let third = t(c.submit("sleep", &Sleep { ms: 60_000 }, false)).await.unwrap();
    let e = t(c.submit("add", &(1, 1), false)).await.unwrap_err();
    assert_eq!(e.code(), Some(LIMIT_EXCEEDED));
    assert!(e.to_string().contains("max_tasks"), "{e}");
    assert_eq!(t(c.task_cancel(&slow)).await.unwrap().state, TaskState::Cancelled);
    t(c.task_cancel(&third)).await.unwrap();
    let e = t(c.task_result::<u64>(&slow, Duration::ZERO)).await.unwrap_err();
    assert_eq!(e.code(), Some(CANCELLED));
    // Detached tasks outlive the connection that submitted them; the others are cancelled
    // with it, their results dropped.
    let id = t(c.submit_detached("sleep", &Sleep { ms: 200 }, false)).await.unwrap();
    let gone = t(c.submit("sleep", &Sleep { ms: 200 }, true)).await.unwrap();
    c.close().await;
    let c2 = client(&fx.addr).await;
    assert_eq!(t(c2.task_result::<u64>(&id, Duration::from_secs(5))).await.unwrap(), 200);
    for _ in 0..200 {
        if t(c2.task_status(&gone)).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(t(c2.task_status(&gone)).await.unwrap_err().code(), Some(TASK_NOT_FOUND));
    // Submit checks the method and params at once.
    assert_eq!(t(c2.submit("nope", &(), false)).await.unwrap_err().code(), Some(METHOD_NOT_FOUND));
    assert_eq!(t(c2.submit("add", &("x",), false)).await.unwrap_err().code(), Some(-32602));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_results_become_errors() {
    // The client's pipe accepts at most 1 MiB of payload: a bigger result is refused by
    // the server's pipe and answered with a tensor error instead of being cut off.
    let fx = serve(RpcLimits::default()).await;
    let limits = ferry_core::Limits { max_payload_bytes: 1 << 20, ..Default::default() };
    let ep = ferry_core::Endpoint::builder()
        .transport(std::sync::Arc::new(ferry_local::LocalTransport::new()))
        .channel(std::sync::Arc::new(ferry_core::InlineChannel))
        .limits(limits)
        .build();
    let c = ferry_rpc::Client::new(t(ep.connect(&fx.addr)).await.unwrap());
    let small: RpcTensor = t(c.call("zeros", &(1000,))).await.unwrap();
    assert_eq!(small.nbytes(), 1000);
    let e = t(c.call::<_, RpcTensor>("zeros", &(2u64 << 20,))).await.unwrap_err();
    assert_eq!(e.code(), Some(ferry_rpc::codes::TENSOR_ERROR), "{e}");
    assert!(e.to_string().contains("max_payload_bytes"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_serve_pipe_ends_the_connection() {
    // `serve_pipe` hands requests to a handler that holds the connection's state, which
    // holds the pipe: dropping the future must still end serving and close the pipe.
    let seen = std::sync::Arc::new(common::Seen::default());
    let server = ferry_rpc::Server::new(common::methods(seen));
    let addr = common::addr();
    let mut listener = t(common::endpoint().listen(&addr)).await.unwrap();
    let (c, accepted) = tokio::join!(client(&addr), listener.accept());
    let pipe = accepted.unwrap();
    let s = server.clone();
    let task = tokio::spawn(async move { s.serve_pipe(pipe).await });
    let sum: f64 = t(c.call("add", &(1.0, 2.0))).await.unwrap();
    assert_eq!(sum, 3.0);
    task.abort();
    let _ = task.await;
    // The server side is gone: the call fails (closed), it is not answered.
    let r = t(c.call::<_, f64>("add", &(1.0, 2.0))).await;
    assert!(matches!(r, Err(CallError::Closed(_)) | Err(CallError::Pipe(_))), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_ferry_headers_are_counted_before_they_are_parsed() {
    let fx = serve(RpcLimits::default()).await;
    // A 2.5 MiB header of few values parses (off the runtime's workers) and is answered.
    let pipe = t(endpoint().connect(&fx.addr)).await.unwrap();
    let id = "x".repeat(5 << 19);
    let call = serde_json::json!({"jsonrpc": "2.0", "method": "add", "params": [1, 2], "id": id});
    t(pipe.send(ferry_core::Message::new(call))).await.unwrap();
    let answer = t(pipe.recv()).await.unwrap();
    assert_eq!(answer.header["result"], 3.0);
    assert_eq!(answer.header["id"].as_str().map(str::len), Some(5 << 19));
    // 2^21 zeros (4 MiB, parsed 64 MiB) are refused on their bytes: the pipe closes with
    // an error naming the limit; nobody else notices.
    let zeros = format!("{{\"jsonrpc\":\"2.0\",\"method\":\"add\",\"params\":[{}0],\"id\":1}}", "0,".repeat(1 << 21));
    let flood = t(endpoint().connect(&fx.addr)).await.unwrap();
    let header: serde_json::Value = serde_json::from_str(&zeros).unwrap();
    t(flood.send(ferry_core::Message::new(header))).await.unwrap();
    let err = t(flood.recv()).await.unwrap_err();
    assert!(err.to_string().contains("max_header_values"), "{err}");
    let c = client(&fx.addr).await;
    assert_eq!(t(c.call::<_, f64>("add", &(1, 2))).await.unwrap(), 3.0);
}
