//! Dispatch without sockets: a `Conn` with no pipe, fed JSON values.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::Notify;

use super::*;
use crate::codes::{CANCELLED, LIMIT_EXCEEDED};
use crate::method::ConnKind;

fn conn(limits: RpcLimits, gate: Arc<Notify>) -> Arc<Conn> {
    let mut m = Methods::new();
    m.register("wait", move |(): ()| {
        let gate = gate.clone();
        async move {
            gate.notified().await;
            Ok::<_, ErrorObject>("opened")
        }
    })
    .unwrap();
    m.register("one", |(): ()| async { Ok::<_, ErrorObject>(1) }).unwrap();
    m.register("add", |p: AddParams| async move { Ok::<_, ErrorObject>(p.a + p.b) }).unwrap();
    m.register("add_loose", |p: AddParams| async move { Ok::<_, ErrorObject>(p.a + p.b) })
        .unwrap()
        .allow_unknown_params();
    let shared = Arc::new(Shared {
        tasks: TaskTable::new(limits),
        refs: crate::remote::RefTable::new(limits),
        ref_copy: Arc::new(crate::server::copy_to_host),
        methods: m,
        limits,
        api: ApiInfo::default(),
        doc: OnceLock::new(),
        connections: std::sync::atomic::AtomicUsize::new(0),
        spawner: None,
        parse_room: Arc::new(tokio::sync::Semaphore::new(limits.max_parse_bytes_in_flight >> 10)),
    });
    Conn::new(shared, peer(), None)
}

fn peer() -> PeerInfo {
    PeerInfo {
        kind: ConnKind::Json,
        addr: String::new(),
        pid: None,
        uid: None,
        agent: String::new(),
        channel: "json".into(),
        identity: crate::method::Identity::Uid(0),
        conn: Some(1),
    }
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct AddParams {
    a: f64,
    b: f64,
}

fn call(method: &str, id: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "id": id})
}

async fn finish(w: Work) -> Output {
    tokio::time::timeout(Duration::from_secs(5), w).await.expect("work did not finish")
}

#[tokio::test]
async fn slots_are_taken_at_start_and_freed_after_the_reply() {
    let gate = Arc::new(Notify::new());
    let c = conn(RpcLimits::default().max_in_flight(2), gate.clone());
    let a = c.start(call("wait", json!(1)), Vec::new());
    let b = c.start(call("wait", json!(2)), Vec::new());
    assert_eq!(c.in_flight.load(Ordering::SeqCst), 2);
    // The third is refused at once, by name.
    let out = finish(c.start(call("one", json!(3)), Vec::new())).await;
    let r = out.reply.unwrap().value;
    assert_eq!(r["error"]["code"], LIMIT_EXCEEDED);
    assert_eq!(r["error"]["data"]["limit"], "max_in_flight");
    // A notification over the limit is dropped without an answer.
    let n = finish(c.start(json!({"jsonrpc": "2.0", "method": "one"}), Vec::new())).await;
    assert!(n.reply.is_none());
    let (a, b) = (tokio::spawn(finish(a)), tokio::spawn(finish(b)));
    tokio::task::yield_now().await;
    gate.notify_waiters();
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    assert_eq!(a.reply.as_ref().unwrap().value["result"], "opened");
    // Replies are produced, but the slots are held until the caller drops them.
    assert_eq!(c.in_flight.load(Ordering::SeqCst), 2);
    drop((a, b));
    assert_eq!(c.in_flight.load(Ordering::SeqCst), 0);
    assert!(c.calls.lock().unwrap().is_empty());
}

#[tokio::test]
async fn cancel_by_id_matches_the_exact_id() {
    let c = conn(RpcLimits::default(), Arc::new(Notify::new()));
    let w = c.start(call("wait", json!("1")), Vec::new());
    // The number 1 is not the string "1".
    let r = finish(c.start(json!({"jsonrpc": "2.0", "method": "ferry.cancel", "params": {"id": 1}, "id": 9}), vec![]))
        .await;
    assert_eq!(r.reply.unwrap().value["result"], json!({"cancelled": false}));
    let r =
        finish(c.start(json!({"jsonrpc": "2.0", "method": "ferry.cancel", "params": ["1"], "id": 10}), vec![])).await;
    assert_eq!(r.reply.unwrap().value["result"], json!({"cancelled": true}));
    let out = finish(w).await;
    assert_eq!(out.reply.unwrap().value["error"]["code"], CANCELLED);
}

#[tokio::test]
async fn closing_the_connection_cancels_everything() {
    let c = conn(RpcLimits::default(), Arc::new(Notify::new()));
    let w = c.start(json!([call("wait", json!(1)), call("one", json!(2))]), Vec::new());
    c.closed.cancel();
    let out = finish(w).await;
    let v = out.reply.unwrap().value;
    // Even a call that would finish at once: cancellation wins once the peer is gone.
    assert_eq!(v[0]["error"]["code"], CANCELLED);
    assert_eq!(v[1]["error"]["code"], CANCELLED);
}

#[tokio::test]
async fn unknown_by_name_params_are_refused_unless_allowed() {
    let c = conn(RpcLimits::default(), Arc::new(Notify::new()));
    let req = |m: &str, p: Value| json!({"jsonrpc": "2.0", "method": m, "params": p, "id": 1});
    let r = finish(c.start(req("add", json!({"a": 1, "b": 2, "c": 3})), vec![])).await.reply.unwrap().value;
    assert_eq!(r["error"]["code"], crate::codes::INVALID_PARAMS);
    assert_eq!(r["error"]["data"]["path"], "c");
    assert!(r["error"]["message"].as_str().unwrap().contains("add takes a, b"), "{r}");
    let r = finish(c.start(req("add_loose", json!({"a": 1, "b": 2, "c": 3})), vec![])).await.reply.unwrap().value;
    assert_eq!(r["result"], 3.0);
    // Through a task too, and for the built-in methods' own params.
    let r =
        finish(c.start(req("ferry.task.submit", json!({"method": "add", "params": {"a": 1, "b": 2, "x": 0}})), vec![]))
            .await
            .reply
            .unwrap()
            .value;
    assert_eq!(r["error"]["data"]["path"], "x", "{r}");
    let r =
        finish(c.start(req("ferry.task.status", json!({"task": "t1", "tsak": 1})), vec![])).await.reply.unwrap().value;
    assert_eq!(r["error"]["code"], crate::codes::INVALID_PARAMS, "{r}");
    // The OpenRPC document says which.
    let doc = c.shared.document();
    let flag = |name: &str| {
        doc["methods"].as_array().unwrap().iter().find(|m| m["name"] == name).unwrap()["x-ferry-additional-params"]
            .clone()
    };
    assert_eq!((flag("add"), flag("add_loose")), (json!(false), json!(true)));
}

#[tokio::test]
async fn non_finite_results_are_errors() {
    let mut m = Methods::new();
    m.register("add", |p: AddParams| async move { Ok::<_, ErrorObject>(p.a + p.b) }).unwrap();
    m.register("maybe", |(): ()| async { Ok::<_, ErrorObject>(json!({"x": null})) }).unwrap();
    let limits = RpcLimits::default();
    let shared = Arc::new(Shared {
        tasks: TaskTable::new(limits),
        refs: crate::remote::RefTable::new(limits),
        ref_copy: Arc::new(crate::server::copy_to_host),
        methods: m,
        limits,
        api: ApiInfo::default(),
        doc: OnceLock::new(),
        connections: std::sync::atomic::AtomicUsize::new(0),
        spawner: None,
        parse_room: Arc::new(tokio::sync::Semaphore::new(limits.max_parse_bytes_in_flight >> 10)),
    });
    let c = Conn::new(shared, peer(), None);
    let r = finish(c.start(json!({"jsonrpc": "2.0", "method": "add", "params": [1e308, 1e308], "id": 1}), vec![]))
        .await
        .reply
        .unwrap()
        .value;
    assert_eq!(r["error"]["code"], crate::codes::INTERNAL_ERROR, "{r}");
    assert!(r["error"]["data"]["reason"].as_str().unwrap().contains("is inf, which JSON cannot represent"), "{r}");
    // A null that was meant is a null.
    let r = finish(c.start(json!({"jsonrpc": "2.0", "method": "maybe", "id": 2}), vec![])).await.reply.unwrap().value;
    assert_eq!(r["result"], json!({"x": null}));
}
