//! `ferry serve`, `ferry call` and `ferry discover`: the demo API from the command line.

use std::time::Duration;

use anyhow::{Context, bail};
use ferry_core::{DType, Tensor};
use ferry_rpc::tensor::map_refs;
use ferry_rpc::{CallError, Client, Server};
use serde_json::Value;

/// The address `ferry serve` uses when none is given.
pub const DEFAULT_ADDR: &str = "unix:ferry-demo";

/// The longest busy-polling window `ferry serve --busy-poll-us` takes, in µs.
pub const MAX_BUSY_POLL_US: u64 = 1000;

/// `ferry serve`'s default busy-polling window: the wait policy's
/// ([`ferry_core::spin::default_busy_poll`]: 50 µs when this process may use 2 or more
/// CPUs, else none). Each wait still asks the policy ([`ferry_core::spin::decide`]), which
/// does not spin while the machine is overloaded or the peer is slow.
pub fn default_busy_poll() -> std::time::Duration {
    ferry_core::spin::default_busy_poll()
}

/// The most runtime worker threads `ferry serve --workers` takes.
pub const MAX_WORKERS: usize = 1024;

/// `ferry serve`'s default number of runtime worker threads: half the CPUs this process
/// may use (at least one) when it busy-polls, else all of them.
///
/// While one worker spins on a connection it has just answered, the peer's next request
/// still wakes whichever idle worker waits in `epoll` for the runtime's I/O: it finds the
/// bytes already read, and parks again. On a machine whose other CPUs run the clients,
/// such a wake-up per request takes a client's CPU (on 2 CPUs, with a Python client: about
/// 1.5 context switches per call, and 4-5 µs of a 20 µs round trip).
/// Half the CPUs matches the spinning cap (at most half the CPUs spin) and leaves the
/// other half to the processes it serves.
pub fn default_workers(busy_poll: Duration) -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    if busy_poll.is_zero() { cpus } else { (cpus / 2).max(1) }
}

/// Raises this process's soft limit on open files to its hard limit: a server holds a
/// descriptor per connection (and a few per shm peer), and the common soft limit of 1024
/// let a handful of connections holding descriptors lock every new client out. Where it
/// cannot, the limit stays as it was (the accept loop backs off and recovers when
/// descriptors run out).
#[cfg(unix)]
pub fn raise_fd_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut l = getrlimit(Resource::Nofile);
    if let (Some(cur), Some(max)) = (l.current, l.maximum)
        && cur < max
    {
        l.current = Some(max);
        if let Err(e) = setrlimit(Resource::Nofile, l) {
            tracing::debug!("could not raise the open-file limit from {cur} to {max}: {e}");
        }
    }
}

/// Who may call `ferry serve` and how much one caller may hold: its `--token`,
/// `--allow-unauthenticated`, `--http-allow-origin`, `--http-allow-host` (threat model in
/// SECURITY.md), `--max-connections` and `--max-queued-answers`.
#[derive(Debug, Clone)]
pub struct Access {
    /// Every client must present this bearer token: ferry clients in their handshake
    /// (QUIC, unix), HTTP callers as `Authorization: Bearer TOKEN`. Plain JSON-RPC
    /// connections on the socket cannot present one and are then refused.
    pub token: Option<String>,
    /// Serve a non-loopback QUIC or HTTP address without a token.
    pub allow_unauthenticated: bool,
    /// Browser origins allowed to call over HTTP.
    pub http_allow_origins: Vec<String>,
    /// Extra host names allowed in HTTP `Host` headers.
    pub http_allow_hosts: Vec<String>,
    /// Connections served at once (`--max-connections`, [`ferry_rpc::RpcLimits::max_connections`]).
    pub max_connections: usize,
    /// [`ferry_rpc::RpcLimits::max_queued_answers`] (`--max-queued-answers`).
    pub max_queued_answers: usize,
    /// [`ferry_rpc::RpcLimits::max_queued_answer_bytes`] (`--max-queued-answer-mib`).
    pub max_queued_answer_bytes: u64,
}

impl Access {
    /// Checks what a listener on `what` (`QUIC address ...`, `--http ...`) bound to `ip`
    /// may do without a token: refused off loopback unless `allow_unauthenticated`, warned
    /// about on loopback.
    fn check_unauthenticated(&self, what: &str, ip: std::net::IpAddr) -> anyhow::Result<()> {
        if self.token.is_some() {
            return Ok(());
        }
        if !ip.is_loopback() && !self.allow_unauthenticated {
            bail!(
                "{what} is reachable from other hosts and no token is set: anyone who can reach it could call \
                 every method. Give a token (--token TOKEN or the FERRY_TOKEN environment variable) or, if that \
                 is really what you want, --allow-unauthenticated"
            );
        }
        if ip.is_loopback() {
            eprintln!(
                "ferry serve: warning: {what} has no token: any local user can call it (--token TOKEN or \
                 FERRY_TOKEN to require one)"
            );
        }
        Ok(())
    }
}

/// Serves `api` (the demo API unless told otherwise) on `addr` (ferry pipes and plain
/// JSON-RPC on the same socket) and, if `http` is given (`HOST:PORT`, feature `http`), over
/// HTTP POST, until interrupted. Prints `listening on ADDR` (and `http on http://HOST:PORT`)
/// to stdout once ready. Ferry connections busy-poll for `busy_poll` after each
/// answer ([`ferry::EndpointBuilder::busy_poll`]). `shm_pool` limits each connection's shm
/// pool (bytes; default 2 GiB). `access` says who may call.
pub async fn serve(
    addr: &str,
    http: Option<&str>,
    api: crate::sdk::Api,
    busy_poll: std::time::Duration,
    shm_pool: Option<u64>,
    access: &Access,
) -> anyhow::Result<()> {
    let limits = ferry_rpc::RpcLimits::default()
        .max_connections(access.max_connections)
        .max_queued_answers(access.max_queued_answers)
        .max_queued_answer_bytes(access.max_queued_answer_bytes);
    let server = match api {
        crate::sdk::Api::Demo => crate::demo::server_with(limits),
        crate::sdk::Api::Conformance => crate::conformance_api::server_with(limits),
    };
    let opts = ServeOptions {
        addrs: vec![addr.to_owned()],
        http: http.map(str::to_owned),
        busy_poll,
        shm_pool,
        access: access.clone(),
    };
    let bound = bind(&opts).await?;
    bound.announce()?;
    run(bound, &server, async {
        stop_signal().await?;
        eprintln!("ferry serve: interrupted, stopping");
        Ok(())
    })
    .await
}

/// Where and how to serve: what `ferry serve` and the Python package's `App.serve` take.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Addresses for ferry pipes and plain JSON-RPC (`unix:NAME`, a socket path,
    /// `quic://HOST:PORT`); at least one.
    pub addrs: Vec<String>,
    /// Also JSON-RPC over HTTP POST on `HOST:PORT` (feature `http`).
    pub http: Option<String>,
    /// How long a ferry connection polls for the next request after an answer
    /// ([`ferry::EndpointBuilder::busy_poll`]).
    pub busy_poll: Duration,
    /// Bytes each connection's shm pool may hold (default 2 GiB).
    pub shm_pool: Option<u64>,
    /// Who may call.
    pub access: Access,
}

/// Listeners bound by [`bind`], not yet serving.
pub struct Bound {
    listeners: Vec<ferry::PipeListener>,
    http: Option<HttpListener>,
    access: Access,
}

impl Bound {
    /// The real addresses (a port the OS chose; for QUIC the fingerprint clients pin),
    /// then `http://HOST:PORT` if HTTP is served.
    pub fn addresses(&self) -> Vec<String> {
        #[cfg(feature = "http")]
        let http = self.http.as_ref().and_then(|h| h.local_addr().ok()).map(|a| format!("http://{a}"));
        #[cfg(not(feature = "http"))]
        let http: Option<String> = None;
        self.listeners.iter().map(|l| l.local_addr().to_string()).chain(http).collect()
    }

    /// Prints `listening on ADDR` per address (`http on http://...` for HTTP) to stdout,
    /// flushed: what scripts and tests wait for.
    pub fn announce(&self) -> anyhow::Result<()> {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        for a in self.addresses() {
            if a.starts_with("http://") {
                writeln!(out, "http on {a}")?;
            } else {
                writeln!(out, "listening on {a}")?;
            }
        }
        out.flush()?;
        Ok(())
    }
}

/// Binds every address of `opts` (and its HTTP address) with its access rules: nothing is
/// served yet, so "listening" can be announced only once everything listens.
pub async fn bind(opts: &ServeOptions) -> anyhow::Result<Bound> {
    #[cfg(unix)]
    raise_fd_limit();
    let access = &opts.access;
    if access.token.as_deref() == Some("") {
        bail!("the token is empty: give a non-empty --token (or FERRY_TOKEN)");
    }
    if opts.addrs.is_empty() {
        bail!("no address to serve on: give at least one (e.g. unix:NAME)");
    }
    let ep = match opts.shm_pool {
        #[cfg(feature = "shm")]
        Some(b) if b < 2 << 20 => {
            bail!("--shm-pool-mib {}: the pool needs at least 2 MiB (segments grow in 2 MiB steps)", b >> 20)
        }
        #[cfg(feature = "shm")]
        Some(bytes) => ferry::endpoint_with_shm_pool(bytes),
        #[cfg(not(feature = "shm"))]
        Some(_) => bail!("--shm-pool-mib needs ferry built with the `shm` feature"),
        None => ferry::endpoint(),
    };
    let mut ep = ep.accept_foreign(true).busy_poll(opts.busy_poll);
    if let Some(t) = &access.token {
        ep = ep.require_token(t.clone());
    }
    let ep = ep.build();
    let mut listeners = Vec::new();
    for addr in &opts.addrs {
        // Checked before listening where the address says (a name is checked once resolved).
        let given = quic_ip(addr);
        if let Some(ip) = given {
            access.check_unauthenticated(&format!("QUIC address {addr}"), ip)?;
        }
        let listener = ep.listen(addr).await.with_context(|| format!("listening on {addr}"))?;
        if given.is_none()
            && let Some(ip) = quic_ip(&listener.local_addr().to_string())
        {
            access.check_unauthenticated(&format!("QUIC address {addr}"), ip)?;
        }
        listeners.push(listener);
    }
    let http = match &opts.http {
        Some(h) => Some(bind_http(h, access).await?),
        None => None,
    };
    Ok(Bound { listeners, http, access: access.clone() })
}

/// Serves `server` on `bound` until `stop` resolves (then shuts the server down and
/// returns its result) or a listener fails. Returning drops the listeners, which removes
/// socket files.
pub async fn run(
    bound: Bound,
    server: &Server,
    stop: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let mut tasks = tokio::task::JoinSet::new();
    if let Some(h) = bound.http {
        start_http(server, h, &bound.access, &mut tasks)?;
    }
    for listener in bound.listeners {
        let s = server.clone();
        tasks.spawn(async move { s.serve(listener).await.map_err(anyhow::Error::from) });
    }
    let r = tokio::select! {
        r = tasks.join_next() => match r {
            Some(Ok(r)) => r,
            Some(Err(e)) => Err(e.into()),
            None => Ok(()),
        },
        r = stop => r,
    };
    server.shutdown();
    tasks.shutdown().await;
    r
}

/// The IP address a `quic://HOST:PORT#...` listener is bound to.
fn quic_ip(addr: &str) -> Option<std::net::IpAddr> {
    let rest = addr.strip_prefix("quic://")?;
    let hostport = rest.split('#').next()?;
    hostport.parse::<std::net::SocketAddr>().ok().map(|a| a.ip())
}

/// Ctrl-C (SIGINT) or, on unix, SIGTERM.
pub(crate) async fn stop_signal() -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r.context("waiting for Ctrl-C"),
            _ = term.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")
    }
}

/// A bound HTTP listener (or, without the `http` feature, nothing).
#[cfg(feature = "http")]
type HttpListener = tokio::net::TcpListener;
#[cfg(not(feature = "http"))]
type HttpListener = std::convert::Infallible;

#[cfg(feature = "http")]
async fn bind_http(http: &str, access: &Access) -> anyhow::Result<HttpListener> {
    let l = tokio::net::TcpListener::bind(http).await.with_context(|| format!("binding {http}"))?;
    access.check_unauthenticated(&format!("--http {http}"), l.local_addr()?.ip())?;
    Ok(l)
}

#[cfg(not(feature = "http"))]
async fn bind_http(_: &str, _: &Access) -> anyhow::Result<HttpListener> {
    bail!(
        "--http needs ferry built with the `http` feature (in this workspace: cargo build --release -p ferry-cli \
         --features http)"
    )
}

#[cfg(feature = "http")]
fn start_http(
    server: &Server,
    l: HttpListener,
    access: &Access,
    tasks: &mut tokio::task::JoinSet<anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let mut opts = ferry_rpc::HttpOptions::default();
    if let Some(t) = &access.token {
        opts = opts.token(t.clone());
    }
    for o in &access.http_allow_origins {
        opts = opts.allow_origin(o.clone());
    }
    for h in &access.http_allow_hosts {
        opts = opts.allow_host(h.clone());
    }
    let s = server.clone();
    tasks.spawn(async move { s.serve_http_with(l, opts).await.map_err(anyhow::Error::from) });
    Ok(())
}

#[cfg(not(feature = "http"))]
fn start_http(
    _: &Server,
    l: HttpListener,
    _: &Access,
    _: &mut tokio::task::JoinSet<anyhow::Result<()>>,
) -> anyhow::Result<()> {
    match l {}
}

async fn client(addr: &str, token: Option<&str>, timeout: Duration) -> anyhow::Result<Client> {
    let mut ep = ferry::endpoint();
    if let Some(t) = token {
        ep = ep.token(t);
    }
    let pipe = ep.build().connect(addr).await.with_context(|| format!("connecting to {addr}"))?;
    Ok(Client::new(pipe).with_timeout(Some(timeout)))
}

fn explain(e: CallError) -> anyhow::Error {
    match e {
        CallError::Rpc(obj) => {
            let name = obj.known().map(|c| format!(" {}", c.name)).unwrap_or_default();
            let data = obj.data.map(|d| format!("\n  data: {d}")).unwrap_or_default();
            anyhow::anyhow!("server error {}{name}: {}{data}", obj.code, obj.message)
        }
        other => other.into(),
    }
}

/// The params text `ferry call` was given: `-` reads standard input, `@PATH` a file,
/// anything else is the JSON itself.
pub fn params_text(arg: &str) -> anyhow::Result<String> {
    if arg == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .context("reading params from standard input")?;
        Ok(text)
    } else if let Some(path) = arg.strip_prefix('@') {
        std::fs::read_to_string(path).with_context(|| format!("reading params from {path}"))
    } else {
        Ok(arg.to_owned())
    }
}

/// Calls `method` with `params` (JSON text: an object or an array, or empty for none) and
/// returns the result with every tensor replaced by a one-line summary. `token`: the bearer
/// token to present, if the server requires one.
pub async fn call(
    addr: &str,
    method: &str,
    params: Option<&str>,
    token: Option<&str>,
    timeout: Duration,
) -> anyhow::Result<Value> {
    let params = match params.map(str::trim).filter(|p| !p.is_empty()) {
        None => None,
        Some(text) => match serde_json::from_str::<Value>(text).context("params are not valid JSON")? {
            v @ (Value::Object(_) | Value::Array(_)) => Some(v),
            Value::Null => None,
            other => bail!("params must be a JSON object (by name) or array (by position), not {other}"),
        },
    };
    let c = client(addr, token, timeout).await?;
    let channel = c.pipe().channel().to_owned();
    let (mut v, tensors) = c.call_raw(method, params, Vec::new(), Some(timeout)).await.map_err(explain)?;
    c.close().await;
    map_refs::<()>(&mut v, &mut |i| {
        Ok(Value::String(match tensors.get(i as usize) {
            Some(t) => format!("<tensor {} via {channel}>", summary(t)),
            None => format!("<tensor #{i}: missing from the message>"),
        }))
    })
    .ok();
    Ok(v)
}

/// The server's OpenRPC document (`token`: as for [`call`]).
pub async fn discover(addr: &str, token: Option<&str>, timeout: Duration) -> anyhow::Result<Value> {
    let c = client(addr, token, timeout).await?;
    let doc = c.discover().await.map_err(explain)?;
    c.close().await;
    Ok(doc)
}

/// `f32[2,3] 24 B [1, 2, 3, 4, 5, 6]`, with at most 8 values.
pub fn summary(t: &Tensor) -> String {
    let shape = t.shape().iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    format!("{}[{shape}] {} B {}", t.dtype(), t.nbytes(), preview(t, 8))
}

/// `1+2i`, `1-2i`, `NaN+NaNi`.
fn complex(re: impl std::fmt::Display, im: impl std::fmt::Display) -> String {
    let im = im.to_string();
    match im.strip_prefix('-') {
        Some(abs) => format!("{re}-{abs}i"),
        None => format!("{re}+{im}i"),
    }
}

fn preview(t: &Tensor, n: usize) -> String {
    if !t.meta().is_contiguous() || t.device() != ferry_core::Device::Cpu {
        return "[..]".into();
    }
    let numel = t.meta().numel().unwrap_or(0) as usize;
    let take = numel.min(n);
    // A small aligned copy of the first elements (the tensor may be large or misaligned).
    let head = t.as_bytes().get(..take * t.dtype().itemsize()).unwrap_or_default();
    let meta = ferry_core::TensorMeta::new(t.dtype(), vec![take as u64]);
    let Ok(t) = Tensor::new(meta, ferry_core::AlignedBuf::copy_from(head).into_bytes()) else {
        return "[..]".into();
    };
    fn fmt<T: ferry_core::Element>(t: &Tensor, take: usize, f: impl Fn(&T) -> String) -> Vec<String> {
        t.as_slice::<T>().map(|s| s.iter().take(take).map(f).collect()).unwrap_or_default()
    }
    let vals: Vec<String> = match t.dtype() {
        DType::Bool => t.as_bytes().iter().take(take).map(|b| (*b != 0).to_string()).collect(),
        DType::U8 => fmt::<u8>(&t, take, u8::to_string),
        DType::I8 => fmt::<i8>(&t, take, i8::to_string),
        DType::U16 => fmt::<u16>(&t, take, u16::to_string),
        DType::I16 => fmt::<i16>(&t, take, i16::to_string),
        DType::U32 => fmt::<u32>(&t, take, u32::to_string),
        DType::I32 => fmt::<i32>(&t, take, i32::to_string),
        DType::U64 => fmt::<u64>(&t, take, u64::to_string),
        DType::I64 => fmt::<i64>(&t, take, i64::to_string),
        DType::F16 => fmt::<half::f16>(&t, take, |x| x.to_string()),
        DType::Bf16 => fmt::<half::bf16>(&t, take, |x| x.to_string()),
        DType::F32 => fmt::<f32>(&t, take, f32::to_string),
        DType::F64 => fmt::<f64>(&t, take, f64::to_string),
        DType::F8E4M3Fn => {
            t.as_bytes().iter().take(take).map(|&b| ferry_core::float8::e4m3fn_to_f32(b).to_string()).collect()
        }
        DType::F8E5M2 => {
            t.as_bytes().iter().take(take).map(|&b| ferry_core::float8::e5m2_to_f32(b).to_string()).collect()
        }
        DType::C64 => fmt::<[f32; 2]>(&t, take, |[re, im]| complex(re, im)),
        DType::C128 => fmt::<[f64; 2]>(&t, take, |[re, im]| complex(re, im)),
    };
    let more = if numel > take { ", ..." } else { "" };
    format!("[{}{more}]", vals.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_of_checkpoint_dtypes() {
        let raw = |d: DType, bytes: &'static [u8]| {
            let meta = ferry_core::TensorMeta::new(d, vec![bytes.len() as u64]);
            Tensor::new(meta, ferry_core::AlignedBuf::copy_from(bytes).into_bytes()).unwrap()
        };
        assert_eq!(summary(&raw(DType::F8E4M3Fn, &[0x38, 0xc4, 0x7e, 0x7f])), "f8e4m3fn[4] 4 B [1, -3, 448, NaN]");
        assert_eq!(summary(&raw(DType::F8E5M2, &[0x3c, 0x7c])), "f8e5m2[2] 2 B [1, inf]");
        let c = Tensor::from_slice(vec![2], &[[1.5f32, -2.0], [0.0, 0.25]]).unwrap();
        assert_eq!(summary(&c), "c64[2] 16 B [1.5-2i, 0+0.25i]");
        let c = Tensor::from_slice(vec![1], &[[1.0f64, f64::NAN]]).unwrap();
        assert_eq!(summary(&c), "c128[1] 16 B [1+NaNi]");
    }
}
