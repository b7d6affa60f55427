//! JSON-RPC over HTTP POST (feature `http`, hyper 1, HTTP/1.1 with keep-alive).
//!
//! - `POST` any path with a JSON-RPC request or batch as the body; the answer is `200` with
//!   `Content-Type: application/json`, or `204 No Content` when there is nothing to answer
//!   (notifications only). JSON-RPC errors (parse errors included) are `200` with an error
//!   object, as JSON-RPC clients expect.
//! - A body over [`crate::RpcLimits::max_request_bytes`] gets `413` with a JSON-RPC limit
//!   error; any other method gets `405`.
//! - Tensors are inline (base64), as on plain JSON connections.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{ALLOW, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;

use crate::codes::ErrorObject;
use crate::jsonrpc::failure;
use crate::method::{ConnKind, PeerInfo};
use crate::server::Server;

impl Server {
    /// Serves JSON-RPC over HTTP POST on `listener` until [`Server::shutdown`]. Each TCP
    /// connection runs in its own task.
    pub async fn serve_http(&self, listener: TcpListener) -> std::io::Result<()> {
        loop {
            let (stream, addr) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!("http accept failed: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                        continue;
                    }
                },
                _ = self.shutdown.cancelled() => return Ok(()),
            };
            let server = self.clone();
            tokio::spawn(async move { server.serve_http_conn(stream, addr).await });
        }
    }

    async fn serve_http_conn(&self, stream: tokio::net::TcpStream, addr: SocketAddr) {
        let _ = stream.set_nodelay(true);
        let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
            let server = self.clone();
            async move { Ok::<_, Infallible>(server.handle_http(req, addr).await) }
        });
        let conn = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc);
        tokio::select! {
            r = conn => if let Err(e) = r { tracing::debug!("http connection from {addr}: {e}") },
            _ = self.shutdown.cancelled() => {}
        }
    }

    async fn handle_http(&self, req: Request<Incoming>, addr: SocketAddr) -> Response<Full<Bytes>> {
        if req.method() != Method::POST {
            let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "JSON-RPC over HTTP: use POST\n");
            r.headers_mut().insert(ALLOW, hyper::header::HeaderValue::from_static("POST"));
            return r;
        }
        let max = self.shared.limits.max_request_bytes;
        let too_big = |n: u64| {
            let e = ErrorObject::limit("max_request_bytes", "request body length in bytes", n, max as u64);
            json(StatusCode::PAYLOAD_TOO_LARGE, serde_json::to_vec(&failure(Value::Null, e)).unwrap_or_default())
        };
        let declared = req.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if let Some(n) = declared.filter(|&n| n > max as u64) {
            return too_big(n);
        }
        let body = match Limited::new(req.into_body(), max).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => return too_big(max as u64 + 1),
            Err(e) => return plain(StatusCode::BAD_REQUEST, &format!("cannot read the body: {e}\n")),
        };
        let peer = PeerInfo {
            kind: ConnKind::Http,
            addr: addr.to_string(),
            pid: None,
            uid: None,
            agent: String::new(),
            channel: "json".into(),
        };
        match self.handle_text(&body, peer).await {
            Some(out) => json(StatusCode::OK, out),
            None => {
                let mut r = Response::new(Full::new(Bytes::new()));
                *r.status_mut() = StatusCode::NO_CONTENT;
                r
            }
        }
    }
}

fn json(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    r
}

fn plain(status: StatusCode, text: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(text.to_owned())));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}
