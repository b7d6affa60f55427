//! JSON-RPC over HTTP POST (feature `http`), spoken by hand over TCP on loopback.
#![cfg(feature = "http")]

mod common;

use std::sync::Arc;

use common::{methods, t};
use ferry_rpc::{HttpOptions, RpcLimits, Server};
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
    serve_with(limits, HttpOptions::default()).await
}

async fn serve_with(limits: RpcLimits, opts: HttpOptions) -> Http {
    let server = Server::builder(methods(Arc::default())).limits(limits).build();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let s = server.clone();
    tokio::spawn(async move { s.serve_http_with(l, opts).await });
    Http { port, server }
}

/// One request on a fresh connection: (status, body).
async fn request(port: u16, method: &str, body: &str) -> (u16, String) {
    request_with(port, method, "Host: localhost\r\n", body).await
}

/// One request on a fresh connection with `headers` (each ending in CRLF; a Host among
/// them): (status, body).
async fn request_with(port: u16, method: &str, headers: &str, body: &str) -> (u16, String) {
    let mut s = t(tokio::net::TcpStream::connect(("127.0.0.1", port))).await.unwrap();
    let req = format!(
        "{method} / HTTP/1.1\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\n\
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

const ADD: &str = r#"{"jsonrpc":"2.0","method":"add","params":[1,2],"id":1}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_with_text_after_an_ipv6_literal_is_refused() {
    let h = serve(RpcLimits::default()).await;
    for host in ["[::1].evil.example", "[::1]evil.example:80", "[::1]:80.evil.example"] {
        let (status, body) = request_with(h.port, "POST", &format!("Host: {host}\r\n"), ADD).await;
        assert_eq!(status, 403, "Host: {host}: {body}");
        assert!(body.contains("Host"), "{body}");
    }
    for host in ["[::1]", "[::1]:8080", "127.0.0.1:1", "localhost"] {
        let (status, body) = request_with(h.port, "POST", &format!("Host: {host}\r\n"), ADD).await;
        assert_eq!(status, 200, "Host: {host}: {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_scheme_name_is_case_insensitive() {
    let h = serve_with(RpcLimits::default(), HttpOptions::default().token("s3cret")).await;
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let headers = format!("Host: localhost\r\nAuthorization: {scheme} s3cret\r\n");
        let (status, body) = request_with(h.port, "POST", &headers, ADD).await;
        assert_eq!(status, 200, "{scheme}: {body}");
        assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["result"], 3.0, "{scheme}");
    }
    for auth in ["bearer wrong", "Basic s3cret", "Bearers3cret", "s3cret"] {
        let headers = format!("Host: localhost\r\nAuthorization: {auth}\r\n");
        let (status, _) = request_with(h.port, "POST", &headers, ADD).await;
        assert_eq!(status, 401, "{auth}");
    }
}
