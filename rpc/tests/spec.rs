//! Every example of the JSON-RPC 2.0 specification's examples section
//! (<https://www.jsonrpc.org/specification#examples>), sent as text exactly as written
//! there, plus edge cases. No sockets: `Server::handle_text` is what a plain JSON or HTTP
//! peer gets.

use std::time::Duration;

use ferry_rpc::{ConnKind, ErrorObject, Methods, PeerInfo, Server};
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Deserialize, schemars::JsonSchema)]
struct Subtract {
    minuend: i64,
    subtrahend: i64,
}

fn server() -> Server {
    let mut m = Methods::new();
    m.register("subtract", |p: Subtract| async move { Ok::<_, ErrorObject>(p.minuend - p.subtrahend) }).unwrap();
    m.register("sum", |p: Vec<i64>| async move { Ok::<_, ErrorObject>(p.iter().sum::<i64>()) }).unwrap();
    m.register("update", |_: Vec<i64>| async move { Ok::<_, ErrorObject>(()) }).unwrap();
    m.register("notify_hello", |_: Vec<i64>| async move { Ok::<_, ErrorObject>(()) }).unwrap();
    m.register("notify_sum", |p: Vec<i64>| async move { Ok::<_, ErrorObject>(p.iter().sum::<i64>()) }).unwrap();
    m.register("get_data", |(): ()| async move { Ok::<_, ErrorObject>(json!(["hello", 5])) }).unwrap();
    m.register("echo_id", |p: Value| async move { Ok::<_, ErrorObject>(p) }).unwrap();
    Server::new(m)
}

fn peer() -> PeerInfo {
    PeerInfo {
        kind: ConnKind::Json,
        addr: "test".into(),
        pid: None,
        uid: None,
        agent: String::new(),
        channel: "json".into(),
        identity: ferry_rpc::Identity::AnonymousHttp,
        conn: None,
    }
}

/// Sends `text`, returns the parsed answer (None: no answer). Errors are reduced to the
/// members the specification shows (`code`, `message`), since ferry adds `data`.
async fn send(s: &Server, text: &str) -> Option<Value> {
    let out = tokio::time::timeout(Duration::from_secs(5), s.handle_text(text.as_bytes(), peer())).await.unwrap()?;
    let mut v: Value = serde_json::from_slice(&out).unwrap();
    strip_data(&mut v);
    Some(v)
}

fn strip_data(v: &mut Value) {
    match v {
        Value::Array(a) => a.iter_mut().for_each(strip_data),
        Value::Object(o) => {
            if let Some(Value::Object(e)) = o.get_mut("error") {
                e.remove("data");
            }
        }
        _ => {}
    }
}

#[tokio::test]
async fn positional_parameters() {
    let s = server();
    let r = send(&s, r#"{"jsonrpc": "2.0", "method": "subtract", "params": [42, 23], "id": 1}"#).await;
    assert_eq!(r, Some(json!({"jsonrpc": "2.0", "result": 19, "id": 1})));
    let r = send(&s, r#"{"jsonrpc": "2.0", "method": "subtract", "params": [23, 42], "id": 2}"#).await;
    assert_eq!(r, Some(json!({"jsonrpc": "2.0", "result": -19, "id": 2})));
}

#[tokio::test]
async fn named_parameters() {
    let s = server();
    let r =
        send(&s, r#"{"jsonrpc": "2.0", "method": "subtract", "params": {"subtrahend": 23, "minuend": 42}, "id": 3}"#)
            .await;
    assert_eq!(r, Some(json!({"jsonrpc": "2.0", "result": 19, "id": 3})));
    let r =
        send(&s, r#"{"jsonrpc": "2.0", "method": "subtract", "params": {"minuend": 42, "subtrahend": 23}, "id": 4}"#)
            .await;
    assert_eq!(r, Some(json!({"jsonrpc": "2.0", "result": 19, "id": 4})));
}

#[tokio::test]
async fn notifications() {
    let s = server();
    assert_eq!(send(&s, r#"{"jsonrpc": "2.0", "method": "update", "params": [1,2,3,4,5]}"#).await, None);
    assert_eq!(send(&s, r#"{"jsonrpc": "2.0", "method": "foobar"}"#).await, None);
}

#[tokio::test]
async fn non_existent_method() {
    let r = send(&server(), r#"{"jsonrpc": "2.0", "method": "foobar", "id": "1"}"#).await;
    assert_eq!(r, Some(json!({"jsonrpc": "2.0", "error": {"code": -32601, "message": "Method not found"}, "id": "1"})));
}

#[tokio::test]
async fn invalid_json() {
    let r = send(&server(), r#"{"jsonrpc": "2.0", "method": "foobar, "params": "bar", "baz]"#).await;
    assert_eq!(r, Some(json!({"jsonrpc": "2.0", "error": {"code": -32700, "message": "Parse error"}, "id": null})));
}

#[tokio::test]
async fn invalid_request_object() {
    let r = send(&server(), r#"{"jsonrpc": "2.0", "method": 1, "params": "bar"}"#).await;
    assert_eq!(r, Some(json!({"jsonrpc": "2.0", "error": {"code": -32600, "message": "Invalid Request"}, "id": null})));
}

#[tokio::test]
async fn batch_invalid_json() {
    let r = send(
        &server(),
        r#"[
  {"jsonrpc": "2.0", "method": "sum", "params": [1,2,4], "id": "1"},
  {"jsonrpc": "2.0", "method"
]"#,
    )
    .await;
    assert_eq!(r, Some(json!({"jsonrpc": "2.0", "error": {"code": -32700, "message": "Parse error"}, "id": null})));
}

#[tokio::test]
async fn empty_array() {
    let r = send(&server(), "[]").await;
    assert_eq!(r, Some(json!({"jsonrpc": "2.0", "error": {"code": -32600, "message": "Invalid Request"}, "id": null})));
}

#[tokio::test]
async fn invalid_batch_not_empty() {
    let r = send(&server(), "[1]").await;
    assert_eq!(
        r,
        Some(json!([{"jsonrpc": "2.0", "error": {"code": -32600, "message": "Invalid Request"}, "id": null}]))
    );
}

#[tokio::test]
async fn invalid_batch() {
    let r = send(&server(), "[1,2,3]").await;
    let one = json!({"jsonrpc": "2.0", "error": {"code": -32600, "message": "Invalid Request"}, "id": null});
    assert_eq!(r, Some(json!([one.clone(), one.clone(), one])));
}

#[tokio::test]
async fn rpc_call_batch() {
    let r = send(
        &server(),
        r#"[
        {"jsonrpc": "2.0", "method": "sum", "params": [1,2,4], "id": "1"},
        {"jsonrpc": "2.0", "method": "notify_hello", "params": [7]},
        {"jsonrpc": "2.0", "method": "subtract", "params": [42,23], "id": "2"},
        {"foo": "boo"},
        {"jsonrpc": "2.0", "method": "foo.get", "params": {"name": "myself"}, "id": "5"},
        {"jsonrpc": "2.0", "method": "get_data", "id": "9"}
    ]"#,
    )
    .await;
    assert_eq!(
        r,
        Some(json!([
            {"jsonrpc": "2.0", "result": 7, "id": "1"},
            {"jsonrpc": "2.0", "result": 19, "id": "2"},
            {"jsonrpc": "2.0", "error": {"code": -32600, "message": "Invalid Request"}, "id": null},
            {"jsonrpc": "2.0", "error": {"code": -32601, "message": "Method not found"}, "id": "5"},
            {"jsonrpc": "2.0", "result": ["hello", 5], "id": "9"}
        ]))
    );
}

#[tokio::test]
async fn rpc_call_batch_all_notifications() {
    let r = send(
        &server(),
        r#"[
        {"jsonrpc": "2.0", "method": "notify_sum", "params": [1,2,4]},
        {"jsonrpc": "2.0", "method": "notify_hello", "params": [7]}
    ]"#,
    )
    .await;
    assert_eq!(r, None);
}

// ---- edge cases beyond the specification's examples ----

#[tokio::test]
async fn ids_are_echoed_exactly() {
    let s = server();
    for id in ["0", "-1", "1.5", "18446744073709551615", "\"\"", "\"x y\"", "null", "1e3"] {
        let text = format!(r#"{{"jsonrpc": "2.0", "method": "sum", "params": [1], "id": {id}}}"#);
        let r = send(&s, &text).await.unwrap();
        let want: Value = serde_json::from_str(id).unwrap();
        assert_eq!(r["id"], want, "id {id}");
        assert_eq!(r["result"], 1);
    }
    // Ids that are not strings, numbers or null make the request invalid.
    for id in ["true", "[1]", "{}"] {
        let text = format!(r#"{{"jsonrpc": "2.0", "method": "sum", "params": [1], "id": {id}}}"#);
        let r = send(&s, &text).await.unwrap();
        assert_eq!(r["error"]["code"], -32600, "id {id}");
        assert_eq!(r["id"], Value::Null);
    }
}

#[tokio::test]
async fn invalid_params_explain_the_violation() {
    let s = server();
    let text = r#"{"jsonrpc": "2.0", "method": "subtract", "params": {"minuend": "x", "subtrahend": 1}, "id": 1}"#;
    let out = s.handle_text(text.as_bytes(), peer()).await.unwrap();
    let r: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(r["error"]["code"], -32602);
    assert_eq!(r["error"]["data"]["path"], "minuend");
    assert!(r["error"]["message"].as_str().unwrap().contains("expected i64"), "{r}");
    let r = send(&s, r#"{"jsonrpc": "2.0", "method": "subtract", "params": [1], "id": 2}"#).await.unwrap();
    assert_eq!(r["error"]["code"], -32602);
    let r = send(&s, r#"{"jsonrpc": "2.0", "method": "subtract", "id": 3}"#).await.unwrap();
    assert_eq!(r["error"]["code"], -32602);
}

#[tokio::test]
async fn structural_edge_cases() {
    let s = server();
    for (text, code) in [
        (r#"{"jsonrpc": "2.0", "method": "sum", "params": 5, "id": 1}"#, -32600),
        (r#"{"jsonrpc": "2.0", "method": "sum", "params": null, "id": 1}"#, -32600),
        (r#"{"jsonrpc": "1.0", "method": "sum", "params": [1], "id": 1}"#, -32600),
        (r#"{"method": "sum", "params": [1], "id": 1}"#, -32600),
        (r#""just a string""#, -32600),
        (r#"{"jsonrpc": "2.0", "method": "sum", "params": [1], "id": 1"#, -32700),
        (r#"{"jsonrpc": "2.0", "method": "rpc.nothing", "id": 1}"#, -32601),
    ] {
        let r = send(&s, text).await.unwrap();
        assert_eq!(r["error"]["code"], code, "{text}");
    }
    // A notification with invalid params is still not answered; an invalid request is.
    assert_eq!(send(&s, r#"{"jsonrpc": "2.0", "method": "subtract", "params": ["x"]}"#).await, None);
    assert!(send(&s, r#"{"jsonrpc": "2.0", "method": 5}"#).await.is_some());
    // Mixed batch: notifications and calls, answers only for calls, in order.
    let r = send(
        &s,
        r#"[{"jsonrpc": "2.0", "method": "sum", "params": [1]},
            {"jsonrpc": "2.0", "method": "sum", "params": [2], "id": "b"},
            {"jsonrpc": "2.0", "method": "nope"},
            {"jsonrpc": "2.0", "method": "sum", "params": [3], "id": null}]"#,
    )
    .await
    .unwrap();
    assert_eq!(r, json!([{"jsonrpc": "2.0", "result": 2, "id": "b"}, {"jsonrpc": "2.0", "result": 3, "id": null}]));
}

#[tokio::test]
async fn batch_size_is_limited() {
    let mut m = Methods::new();
    m.register("sum", |p: Vec<i64>| async move { Ok::<_, ErrorObject>(p.iter().sum::<i64>()) }).unwrap();
    let s = Server::builder(m).limits(ferry_rpc::RpcLimits::default().max_batch(2)).build();
    let text = r#"[{"jsonrpc": "2.0", "method": "sum", "params": [1], "id": 1},
                   {"jsonrpc": "2.0", "method": "sum", "params": [1], "id": 2},
                   {"jsonrpc": "2.0", "method": "sum", "params": [1], "id": 3}]"#;
    let out = s.handle_text(text.as_bytes(), peer()).await.unwrap();
    let r: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(r["error"]["code"], -32001);
    assert_eq!(r["error"]["data"]["limit"], "max_batch");
    assert!(r["error"]["message"].as_str().unwrap().contains("RpcLimits::max_batch"), "{r}");
}

#[tokio::test]
async fn discover_is_served() {
    let r = send(&server(), r#"{"jsonrpc": "2.0", "method": "rpc.discover", "id": 1}"#).await.unwrap();
    assert_eq!(r["result"]["openrpc"], "1.3.2");
    let names: Vec<&str> =
        r["result"]["methods"].as_array().unwrap().iter().filter_map(|m| m["name"].as_str()).collect();
    assert!(names.contains(&"subtract") && names.contains(&"ferry.task.submit"), "{names:?}");
    let sub = r["result"]["methods"].as_array().unwrap().iter().find(|m| m["name"] == "subtract").unwrap();
    let params: Vec<&str> = sub["params"].as_array().unwrap().iter().filter_map(|p| p["name"].as_str()).collect();
    assert_eq!(params, ["minuend", "subtrahend"]);
}

#[tokio::test]
async fn methods_without_params_accept_every_empty_spelling() {
    let mut m = Methods::new();
    m.register("ping", |_: ()| async move { Ok::<_, ErrorObject>("pong") }).unwrap();
    let s = Server::new(m);
    for req in [
        r#"{"jsonrpc":"2.0","method":"ping","id":1}"#,
        r#"{"jsonrpc":"2.0","method":"ping","params":{},"id":1}"#,
        r#"{"jsonrpc":"2.0","method":"ping","params":[],"id":1}"#,
    ] {
        let reply = send(&s, req).await.unwrap();
        assert_eq!(reply["result"], json!("pong"), "{req} -> {reply}");
    }
}
