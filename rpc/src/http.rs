//! JSON-RPC over HTTP POST (feature `http`, hyper 1, HTTP/1.1 with keep-alive).
//!
//! - `POST` any path with a JSON-RPC request or batch as the body; the answer is `200` with
//!   `Content-Type: application/json`, or `204 No Content` when there is nothing to answer
//!   (notifications only). JSON-RPC errors (parse errors included) are `200` with an error
//!   object, as JSON-RPC clients expect.
//! - Before the body is read, a request is refused ([`HttpOptions`], threat model in
//!   SECURITY.md):
//!   - `403` when its `Origin` (a browser's) is not on [`HttpOptions::allow_origins`], or its
//!     `Host` is not the bound address, `localhost` or one of [`HttpOptions::allow_hosts`]
//!     (DNS rebinding: a web page whose name resolves to this machine);
//!   - `415` when its `Content-Type` is not `application/json` (a web page can POST
//!     `text/plain` across origins without asking; it cannot send JSON without a preflight);
//!   - `401` when the server has a token ([`HttpOptions::token`]) and the request does not
//!     carry `Authorization: Bearer TOKEN`.
//!
//!   Refusals carry a JSON-RPC error body (code `UNAUTHORIZED`, id null) saying which
//!   check failed and what to do.
//! - A body over [`crate::RpcLimits::max_request_bytes`] gets `413` with a JSON-RPC limit
//!   error; any other method gets `405` (`OPTIONS` from an allowed origin gets the CORS
//!   preflight answer).
//! - Tensors are inline (base64), as on plain JSON connections.
//! - Identity ([`crate::Identity`]): the token's holders when the server has a token, else
//!   one anonymous identity for every HTTP caller. An HTTP request belongs to no lasting
//!   connection, so the tasks it submits are always detached.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use bytes::Bytes;
use ferry_core::endpoint::constant_time_eq;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{
    ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_ALLOW_ORIGIN, ALLOW, AUTHORIZATION,
    CONTENT_LENGTH, CONTENT_TYPE, HOST, HeaderMap, HeaderValue, ORIGIN, VARY, WWW_AUTHENTICATE,
};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;

use crate::codes::{ErrorObject, UNAUTHORIZED};
use crate::jsonrpc::failure;
use crate::method::{ConnKind, Identity, PeerInfo};
use crate::server::Server;

/// Who may call over HTTP: the bearer token and the browser origins and host names
/// allowed. The default (no token, no origin, no extra host) serves non-browser clients
/// on the bound address and `localhost` only.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct HttpOptions {
    /// Requests must carry `Authorization: Bearer TOKEN` (compared in constant time).
    pub token: Option<String>,
    /// Browser origins (`https://app.example:8443`, exactly as browsers send them) whose
    /// requests are served; any other request that has an `Origin` header is refused.
    pub allow_origins: Vec<String>,
    /// Host names (without port) accepted in the `Host` header besides the bound address,
    /// `localhost`, `127.0.0.1` and `::1`; needed when clients use a DNS name or the
    /// listener is bound to an unspecified address (`0.0.0.0`).
    pub allow_hosts: Vec<String>,
}

impl HttpOptions {
    /// Sets [`HttpOptions::token`].
    #[must_use]
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Adds a browser origin to [`HttpOptions::allow_origins`].
    #[must_use]
    pub fn allow_origin(mut self, origin: impl Into<String>) -> Self {
        self.allow_origins.push(origin.into());
        self
    }

    /// Adds a host name to [`HttpOptions::allow_hosts`].
    #[must_use]
    pub fn allow_host(mut self, host: impl Into<String>) -> Self {
        self.allow_hosts.push(host.into().to_ascii_lowercase());
        self
    }
}

/// What a connection's requests are checked against.
struct Gate {
    opts: HttpOptions,
    bound: IpAddr,
}

impl Server {
    /// Serves JSON-RPC over HTTP POST on `listener` with default [`HttpOptions`] (no token)
    /// until [`Server::shutdown`].
    pub async fn serve_http(&self, listener: TcpListener) -> std::io::Result<()> {
        self.serve_http_with(listener, HttpOptions::default()).await
    }

    /// Serves JSON-RPC over HTTP POST on `listener`, checking every request against `opts`,
    /// until [`Server::shutdown`]. Each TCP connection runs in its own task.
    pub async fn serve_http_with(&self, listener: TcpListener, opts: HttpOptions) -> std::io::Result<()> {
        let gate = Arc::new(Gate { opts, bound: listener.local_addr()?.ip() });
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
            let Some(slot) = self.shared.conn_slot() else {
                tracing::warn!(%addr, "{}", self.too_many());
                drop(stream);
                continue;
            };
            let server = self.clone();
            let gate = gate.clone();
            tokio::spawn(async move {
                server.serve_http_conn(stream, addr, gate).await;
                drop(slot);
            });
        }
    }

    async fn serve_http_conn(&self, stream: tokio::net::TcpStream, addr: SocketAddr, gate: Arc<Gate>) {
        let _ = stream.set_nodelay(true);
        let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
            let server = self.clone();
            let gate = gate.clone();
            async move { Ok::<_, Infallible>(server.handle_http(req, addr, &gate).await) }
        });
        // A request's headers must arrive within request_timeout, and an idle keep-alive
        // connection is closed after it too (slowloris, parked connections).
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(self.shared.limits.request_timeout)
            .serve_connection(TokioIo::new(stream), svc);
        tokio::select! {
            r = conn => if let Err(e) = r { tracing::debug!("http connection from {addr}: {e}") },
            _ = self.shutdown.cancelled() => {}
        }
    }

    async fn handle_http(&self, req: Request<Incoming>, addr: SocketAddr, gate: &Gate) -> Response<Full<Bytes>> {
        let origin = match gate.check_origin_and_host(req.headers()) {
            Ok(origin) => origin,
            Err(refusal) => {
                tracing::warn!(%addr, "http request refused: {}", refusal.message);
                return refusal.into_response();
            }
        };
        let mut r = self.handle_http_checked(req, addr, gate).await;
        if let Some(o) = origin {
            r.headers_mut().insert(ACCESS_CONTROL_ALLOW_ORIGIN, o);
            r.headers_mut().insert(VARY, HeaderValue::from_static("Origin"));
        }
        r
    }

    async fn handle_http_checked(
        &self,
        req: Request<Incoming>,
        addr: SocketAddr,
        gate: &Gate,
    ) -> Response<Full<Bytes>> {
        if req.method() == Method::OPTIONS && req.headers().contains_key(ORIGIN) {
            // A CORS preflight from an allowed origin (others were refused above).
            let mut r = Response::new(Full::new(Bytes::new()));
            *r.status_mut() = StatusCode::NO_CONTENT;
            let h = r.headers_mut();
            h.insert(ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("POST"));
            h.insert(ACCESS_CONTROL_ALLOW_HEADERS, HeaderValue::from_static("content-type, authorization"));
            return r;
        }
        if req.method() != Method::POST {
            let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "JSON-RPC over HTTP: use POST\n");
            r.headers_mut().insert(ALLOW, HeaderValue::from_static("POST"));
            return r;
        }
        if let Err(refusal) = gate.check_content_type_and_token(req.headers()) {
            tracing::warn!(%addr, "http request refused: {}", refusal.message);
            return refusal.into_response();
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
            identity: if gate.opts.token.is_some() { Identity::Token } else { Identity::AnonymousHttp },
            conn: None,
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

/// A request refused before its body is read.
struct Refusal {
    status: StatusCode,
    message: String,
}

impl Refusal {
    fn new(status: StatusCode, message: String) -> Refusal {
        Refusal { status, message }
    }

    fn into_response(self) -> Response<Full<Bytes>> {
        let body = failure(Value::Null, ErrorObject::new(UNAUTHORIZED, format!("Unauthorized: {}", self.message)));
        let mut r = json(self.status, serde_json::to_vec(&body).unwrap_or_default());
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

impl Gate {
    /// Checks `Origin` and `Host`; returns the origin to echo in CORS headers, if any.
    fn check_origin_and_host(&self, h: &HeaderMap) -> Result<Option<HeaderValue>, Refusal> {
        let refuse = Refusal::new;
        let origin = match h.get(ORIGIN) {
            None => None,
            Some(o) if self.opts.allow_origins.iter().any(|a| a.as_bytes() == o.as_bytes()) => Some(o.clone()),
            Some(o) => {
                return Err(refuse(
                    StatusCode::FORBIDDEN,
                    format!(
                        "browser origin {:?} is not allowed (ferry serve --http-allow-origin ORIGIN allows one)",
                        String::from_utf8_lossy(o.as_bytes())
                    ),
                ));
            }
        };
        let host = h.get(HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
        if !self.host_allowed(host) {
            return Err(refuse(
                StatusCode::FORBIDDEN,
                format!(
                    "Host {host:?} is not this server's address or localhost (ferry serve --http-allow-host NAME \
                     allows a name)"
                ),
            ));
        }
        Ok(origin)
    }

    fn host_allowed(&self, host: &str) -> bool {
        let ip = match host_name(host) {
            None => return false,
            Some(HostName::Ip(ip)) => ip,
            Some(HostName::Name(name)) => {
                let name = name.to_ascii_lowercase();
                if name == "localhost" || self.opts.allow_hosts.contains(&name) {
                    return true;
                }
                match name.parse::<IpAddr>() {
                    Ok(ip) => ip,
                    Err(_) => return false,
                }
            }
        };
        ip.is_loopback() || (ip == self.bound && !ip.is_unspecified())
    }

    fn check_content_type_and_token(&self, h: &HeaderMap) -> Result<(), Refusal> {
        let ct = h.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
        let essence = ct.split(';').next().unwrap_or("").trim();
        if !essence.eq_ignore_ascii_case("application/json") {
            return Err(Refusal::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!(
                    "Content-Type must be application/json, not {ct:?} (curl: -H 'Content-Type: application/json')"
                ),
            ));
        }
        if let Some(want) = &self.opts.token {
            let got = h.get(AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(bearer_token);
            if !got.is_some_and(|t| constant_time_eq(t.as_bytes(), want.as_bytes())) {
                return Err(Refusal::new(
                    StatusCode::UNAUTHORIZED,
                    "this server requires a bearer token: send Authorization: Bearer TOKEN".into(),
                ));
            }
        }
        Ok(())
    }
}

/// The token of an `Authorization` header value in the `Bearer` scheme, whose name is
/// case-insensitive (RFC 7235 §2.1: `bearer TOKEN` and `BEARER TOKEN` are the same), then
/// one or more spaces or tabs; surrounding whitespace is not part of the token.
fn bearer_token(value: &str) -> Option<&str> {
    let value = value.trim_matches([' ', '\t']);
    let (scheme, token) = value.split_once([' ', '\t'])?;
    let token = token.trim_matches([' ', '\t']);
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The host of a `Host` header value.
#[derive(Debug, PartialEq, Eq)]
enum HostName<'a> {
    /// An IPv6 literal (`[::1]`).
    Ip(IpAddr),
    /// A name or an IPv4 address, not checked further.
    Name(&'a str),
}

/// The host of a `Host` header value (RFC 9110 §7.2: `uri-host [ ":" port ]`): an IPv6
/// literal in brackets is the whole host, and only an optional `:port` (digits) may follow
/// it; a name or IPv4 address holds no `:` and no brackets. `None` for anything else
/// (`[::1].evil.example`, `[::1]x`, `a:b:c`, an empty host).
fn host_name(host: &str) -> Option<HostName<'_>> {
    fn port_ok(port: &str) -> bool {
        port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit())
    }
    if let Some(rest) = host.strip_prefix('[') {
        let (literal, after) = rest.split_once(']')?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(port_ok)) {
            return None;
        }
        return literal.parse::<std::net::Ipv6Addr>().ok().map(|ip| HostName::Ip(IpAddr::V6(ip)));
    }
    let name = match host.split_once(':') {
        Some((name, port)) if port_ok(port) => name,
        Some(_) => return None,
        None => host,
    };
    (!name.is_empty() && !name.contains([']', '['])).then_some(HostName::Name(name))
}

fn json(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn plain(status: StatusCode, text: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(text.to_owned())));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(bound: &str, opts: HttpOptions) -> Gate {
        Gate { opts, bound: bound.parse().unwrap() }
    }

    #[test]
    fn hosts() {
        let g = gate("127.0.0.1", HttpOptions::default().allow_host("Api.Example"));
        for ok in ["127.0.0.1:8080", "localhost:1", "LOCALHOST", "[::1]:80", "api.example:9", "127.0.0.2"] {
            assert!(g.host_allowed(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "",
            "10.0.0.1:80",
            "localhost.evil.example",
            "[::1].evil.example",
            "[::1]evil.example",
            "[::1]:80.evil.example",
            "[::1]:80:80",
            "[127.0.0.1]",
            "::1",
            "localhost:80:80",
            "localhost:x",
            "[::1",
        ] {
            assert!(!g.host_allowed(bad), "{bad}");
        }
        let any = gate("0.0.0.0", HttpOptions::default());
        assert!(!any.host_allowed("0.0.0.0:80"));
        assert!(gate("10.1.2.3", HttpOptions::default()).host_allowed("10.1.2.3:8080"));
    }

    #[test]
    fn host_names() {
        let v6 = |s: &str| Some(HostName::Ip(s.parse().unwrap()));
        assert_eq!(host_name("a.b:80"), Some(HostName::Name("a.b")));
        assert_eq!(host_name("[::1]:80"), v6("::1"));
        assert_eq!(host_name("[::1]"), v6("::1"));
        assert_eq!(host_name("[::1]:"), v6("::1"));
        assert_eq!(host_name("name"), Some(HostName::Name("name")));
        for bad in ["[::1].evil.example", "[::1]x", "[::1]:80x", "[::1]:123456", "[evil]", "a:b:c", ":80", "a]:80", ""]
        {
            assert_eq!(host_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_bearer_scheme_is_matched_case_insensitively() {
        for (value, token) in [
            ("Bearer t0k", Some("t0k")),
            ("bearer t0k", Some("t0k")),
            ("BEARER t0k", Some("t0k")),
            ("bEaReR \t t0k ", Some("t0k")),
            ("Bearer", None),
            ("Bearer ", None),
            ("Basic t0k", None),
            ("Bearert0k", None),
            ("Bearerx t0k", None),
        ] {
            assert_eq!(bearer_token(value), token, "{value:?}");
        }
    }
}
