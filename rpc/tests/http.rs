//! JSON-RPC over HTTP POST (feature `http`), spoken by hand over TCP on loopback.
#![cfg(feature = "http")]

mod common;

use std::sync::Arc;

use common::{methods, t};
use ferry_rpc::{RpcLimits, Server};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Http {
    port: u16,
    server: Server,
}

impl Drop for Http {
    fn drop(&mut self) {
        self.server.shutdown();
    }
}

async fn serve(limits: RpcLimits) -> Http {
    let server = Server::builder(methods(Arc::default())).limits(limits).build();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let s = server.clone();
    tokio::spawn(async move { s.serve_http(l).await });
    Http { port, server }
}

/// One request on a fresh connection: (status, body).
async fn request(port: u16, method: &str, body: &str) -> (u16, String) {
    let mut s = t(tokio::net::TcpStream::connect(("127.0.0.1", port))).await.unwrap();
    let req = format!(
        "{method} / HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    t(s.write_all(req.as_bytes())).await.unwrap();
    let mut out = Vec::new();
    t(s.read_to_end(&mut out)).await.unwrap();
    let text = String::from_utf8(out).unwrap();
    let status = text[9..12].parse().unwrap();
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_batches_notifications() {
    let h = serve(RpcLimits::default()).await;
    let (status, body) = request(h.port, "POST", r#"{"jsonrpc":"2.0","method":"add","params":[1,2],"id":1}"#).await;
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap(), json!({"jsonrpc": "2.0", "result": 3.0, "id": 1}));
    let (status, body) = request(
        h.port,
        "POST",
        r#"[{"jsonrpc":"2.0","method":"add","params":[1,2],"id":"a"},{"jsonrpc":"2.0","method":"add","params":[1,1]}]"#,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap(), json!([{"jsonrpc": "2.0", "result": 3.0, "id": "a"}]));
    let (status, body) = request(h.port, "POST", r#"{"jsonrpc":"2.0","method":"add","params":[1,2]}"#).await;
    assert_eq!((status, body.as_str()), (204, ""));
    let (status, body) = request(h.port, "POST", "{oops").await;
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["error"]["code"], -32700);
    let (status, _) = request(h.port, "GET", "").await;
    assert_eq!(status, 405);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tensors_inline_and_size_limit() {
    let h = serve(RpcLimits::default().max_request_bytes(300)).await;
    let (_, body) = request(h.port, "POST", r#"{"jsonrpc":"2.0","method":"weights","id":1}"#).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["result"]["fc.bias"]["$tensor"]["shape"], json!([2]));
    assert_eq!(v["result"]["fc.bias"]["$tensor"]["data"], "AAAAPwAAAL8=");
    let big = format!(r#"{{"jsonrpc":"2.0","method":"add","params":[1,2],"id":"{}"}}"#, "x".repeat(400));
    let (status, body) = request(h.port, "POST", &big).await;
    assert_eq!(status, 413);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["data"]["limit"], "max_request_bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_results_are_bounded() {
    let h = serve(RpcLimits::default().max_inline_bytes(1000)).await;
    let (status, body) = request(h.port, "POST", r#"{"jsonrpc":"2.0","method":"zeros","params":[1000],"id":1}"#).await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["result"]["$tensor"]["shape"], json!([1000]), "{body}");
    let (status, body) = request(h.port, "POST", r#"{"jsonrpc":"2.0","method":"zeros","params":[1001],"id":2}"#).await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["id"], 2);
    assert_eq!(v["error"]["data"]["limit"], "max_inline_bytes", "{body}");
    assert!(v["error"]["message"].as_str().unwrap().contains("ferry pipe"), "{body}");
}
