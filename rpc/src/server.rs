//! [`Server`]: serves a method table on ferry pipes, on plain newline-delimited JSON
//! connections of the same socket, and (feature `http`) over HTTP POST.
//!
//! - Every connection runs in its own task; every call in its own task. A slow handler
//!   blocks neither other calls on its connection nor other connections; responses go out
//!   as they finish, matched by id. (Calls to cheap methods, built-in ones and those marked
//!   [`crate::method::MethodDoc::inline`], are first polled in the connection's task and
//!   answered from there when they finish at once; only if they wait do they get a task.)
//! - Calls in flight per connection are bounded ([`RpcLimits::max_in_flight`]); a call over
//!   the limit is answered at once with a limit error. A slot is freed only once its
//!   response is written, so a peer that stops reading cannot grow the server's memory.
//! - When a connection ends, every call still running on it is cancelled, and so are the
//!   tasks (`ferry.task.*`) it submitted, unless they were submitted `detached`.

mod lines;

use std::pin::Pin;
use std::sync::{Arc, OnceLock};

use ferry_core::{Accepted, ForeignConn, Handled, Message, Pipe, PipeError, PipeListener, Tensor};
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::codes::ErrorObject;
use crate::dispatch::{Conn, Shared};
use crate::jsonrpc::failure;
use crate::limits::RpcLimits;
use crate::method::{ConnKind, Identity, Methods, PeerInfo, Reply, next_connection_id};
use crate::openrpc::ApiInfo;
use crate::outbox::{Ticket, json_len};
use crate::task::TaskTable;
use lines::{Line, Readable, inline_line, parse_line, parse_request, parse_room, read_line, wait_readable};

/// Builds a [`Server`]: `Server::builder(methods).limits(..).title(..).build()`.
#[must_use]
pub struct ServerBuilder {
    methods: Methods,
    limits: RpcLimits,
    api: ApiInfo,
    spawner: Option<Spawner>,
    ref_copy: Option<RefCopy>,
    ref_backing: Option<Arc<dyn crate::remote::RefBacking>>,
}

/// Runs answers (a call's handler, then writing its response) that do not finish at once,
/// instead of `tokio::spawn` (see [`ServerBuilder::spawner`]). Returns true when the answer
/// runs off the runtime's workers, so that the connection's reader may busy-poll for the
/// next call meanwhile.
pub type Spawner = Arc<dyn Fn(Pin<Box<dyn Future<Output = ()> + Send>>) -> bool + Send + Sync>;

impl ServerBuilder {
    /// Sets the limits (default [`RpcLimits::default`]).
    pub fn limits(mut self, limits: RpcLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Runs the server's answers with `spawner` instead of `tokio::spawn`. It gets each
    /// answer that did not finish when first polled (or is not polled where it starts) and
    /// must poll it to the end, within the server's runtime: an executor that polls an
    /// answer on the thread that wakes it (the Python server's handler threads, which then
    /// write the response themselves instead of waking a runtime worker to).
    pub fn spawner(mut self, spawner: Spawner) -> Self {
        self.spawner = Some(spawner);
        self
    }

    /// Where kept tensors live ([`crate::remote::RefBacking`]: ferry-store's placement
    /// moves them between a cpu and a disk tier); default: in memory, as kept.
    pub fn ref_backing(mut self, b: Arc<dyn crate::remote::RefBacking>) -> Self {
        self.ref_backing = Some(b);
        self
    }

    /// How `ferry.ref.keep` copies a tensor a client sent into memory the server keeps
    /// (default: host memory of its own, host tensors only). A server that lends shared
    /// memory over shm (ferry-store's `shared_copy`) makes later fetches zero-copy.
    pub fn ref_copy(mut self, f: RefCopy) -> Self {
        self.ref_copy = Some(f);
        self
    }

    /// Sets the API title shown by `rpc.discover`.
    pub fn title(mut self, t: impl Into<String>) -> Self {
        self.api.title = t.into();
        self
    }

    /// Sets the API version shown by `rpc.discover`.
    pub fn version(mut self, v: impl Into<String>) -> Self {
        self.api.version = v.into();
        self
    }

    /// Sets the API description shown by `rpc.discover`.
    pub fn description(mut self, d: impl Into<String>) -> Self {
        self.api.description = Some(d.into());
        self
    }

    /// The server.
    pub fn build(self) -> Server {
        // A big ferry header is counted and parsed on a compute thread by ferry-core:
        // under the policy of this crate's compute, like a big plain-JSON request.
        ferry_core::compute::set_compute_thread_setup(crate::blocking::apply_priority);
        Server {
            shared: Arc::new(Shared {
                tasks: TaskTable::new(self.limits),
                refs: match self.ref_backing {
                    Some(b) => crate::remote::RefTable::with_backing(self.limits, b),
                    None => crate::remote::RefTable::new(self.limits),
                },
                ref_copy: self.ref_copy.unwrap_or_else(|| Arc::new(copy_to_host)),
                methods: self.methods,
                limits: self.limits,
                api: self.api,
                doc: OnceLock::new(),
                connections: std::sync::atomic::AtomicUsize::new(0),
                spawner: self.spawner,
                parse_room: Arc::new(tokio::sync::Semaphore::new(
                    (self.limits.max_parse_bytes_in_flight >> 10).min(tokio::sync::Semaphore::MAX_PERMITS),
                )),
            }),
            shutdown: CancellationToken::new(),
        }
    }
}

/// Copies a tensor into memory the server keeps ([`ServerBuilder::ref_copy`]).
pub type RefCopy = Arc<dyn Fn(&Tensor) -> Result<Tensor, String> + Send + Sync>;

/// The default [`RefCopy`]: a host tensor's bytes copied into an aligned buffer.
pub(crate) fn copy_to_host(t: &Tensor) -> Result<Tensor, String> {
    let bytes =
        t.host_bytes().ok_or_else(|| format!("a {} tensor cannot be kept here: send a cpu tensor", t.device()))?;
    Tensor::new(t.meta().clone(), ferry_core::AlignedBuf::copy_from(bytes).into_bytes()).map_err(|e| e.to_string())
}

/// A JSON-RPC 2.0 server over a method table. Cheap to clone.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// # use ferry_rpc::{Methods, Server, ErrorObject};
/// # let transport: std::sync::Arc<dyn ferry_core::Transport> = unimplemented!();
/// let mut methods = Methods::new();
/// methods.register("add", |(a, b): (f64, f64)| async move { Ok::<_, ErrorObject>(a + b) })?;
/// let server = Server::new(methods);
/// // accept_foreign(true): plain JSON-RPC clients on the same socket are served too.
/// let ep = ferry_core::Endpoint::builder().transport(transport)
///     .channel(std::sync::Arc::new(ferry_core::InlineChannel)).accept_foreign(true).build();
/// server.serve(ep.listen("unix:my-api").await?).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Server {
    pub(crate) shared: Arc<Shared>,
    pub(crate) shutdown: CancellationToken,
}

impl Server {
    /// A builder serving `methods`.
    pub fn builder(methods: Methods) -> ServerBuilder {
        ServerBuilder {
            methods,
            limits: RpcLimits::default(),
            api: ApiInfo::default(),
            spawner: None,
            ref_copy: None,
            ref_backing: None,
        }
    }

    /// A server with default limits.
    pub fn new(methods: Methods) -> Server {
        Self::builder(methods).build()
    }

    /// The limits in force.
    pub fn limits(&self) -> &RpcLimits {
        &self.shared.limits
    }

    /// The OpenRPC document (`rpc.discover`'s result).
    pub fn discover(&self) -> &Value {
        self.shared.document()
    }

    /// Stops every `serve*` loop and cancels every call on every connection.
    pub fn shutdown(&self) {
        self.shutdown.cancel();
    }

    /// Accepts connections until the listener stops or [`Server::shutdown`]: ferry pipes
    /// and (if the endpoint was built with `accept_foreign(true)`) plain JSON clients,
    /// each served in its own task.
    ///
    /// A connection that fails its handshake is logged and skipped. (`PipeListener` reports
    /// a peer that hung up during the handshake with the same [`PipeError::Closed`] as a
    /// stopped listener; since a held listener does not stop by itself, `Closed` is treated
    /// as a failed connection too, with a short pause after many in a row.)
    pub async fn serve(&self, mut listener: PipeListener) -> Result<(), PipeError> {
        let mut closed_in_a_row = 0u32;
        loop {
            let accepted = tokio::select! {
                a = listener.accept_any() => a,
                _ = self.shutdown.cancelled() => return Ok(()),
            };
            match accepted {
                Ok(Accepted::Pipe(p)) => {
                    closed_in_a_row = 0;
                    let Some(slot) = self.shared.conn_slot() else {
                        let msg = self.too_many();
                        tracing::warn!(addr = %p.info().conn.addr, "{msg}");
                        tokio::spawn(async move { p.close_with("limit", msg).await });
                        continue;
                    };
                    let s = self.clone();
                    tokio::spawn(async move {
                        s.serve_pipe(p).await;
                        drop(slot);
                    });
                }
                Ok(Accepted::Foreign(mut f)) => {
                    closed_in_a_row = 0;
                    let Some(slot) = self.shared.conn_slot() else {
                        let msg = self.too_many();
                        tracing::warn!(addr = %f.info.addr, "{msg}");
                        let line = inline_line(
                            Reply {
                                value: failure(Value::Null, ErrorObject::new(crate::codes::UNAVAILABLE, msg)),
                                tensors: Vec::new(),
                            },
                            0,
                        );
                        tokio::spawn(async move {
                            let _ =
                                tokio::time::timeout(std::time::Duration::from_secs(1), f.write.write_all(&line)).await;
                            let _ = f.write.shutdown().await;
                        });
                        continue;
                    };
                    let s = self.clone();
                    tokio::spawn(async move {
                        s.serve_json(f).await;
                        drop(slot);
                    });
                }
                Err(e) => {
                    tracing::debug!("connection not accepted: {}", ferry_core::logsafe::peer_text(&e.to_string()));
                    if matches!(e, PipeError::Closed) {
                        closed_in_a_row = closed_in_a_row.saturating_add(1);
                        if closed_in_a_row > 64 {
                            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                        }
                    }
                }
            }
        }
    }

    /// The refusal of a connection over [`RpcLimits::max_connections`].
    pub(crate) fn too_many(&self) -> String {
        format!(
            "Unavailable: this server serves at most max_connections = {} connections at once; try again later \
             (ferry serve --max-connections, RpcLimits::max_connections)",
            self.shared.limits.max_connections
        )
    }

    /// Serves one ferry pipe until it closes.
    pub async fn serve_pipe(&self, pipe: Pipe) {
        let info = pipe.info();
        let n = next_connection_id();
        let peer = PeerInfo {
            kind: ConnKind::Pipe,
            addr: info.conn.addr.clone(),
            pid: info.conn.peer_pid,
            uid: info.conn.peer_uid,
            agent: info.peer_agent.clone(),
            channel: pipe.channel().to_owned(),
            identity: Identity::of_connection(info.conn.peer_uid, info.token_verified, n),
            conn: Some(n),
        };
        let pipe = Arc::new(pipe);
        let conn = Conn::new(self.shared.clone(), peer, Some(pipe.clone()));
        // Requests are answered in the pipe's reader task as they are decoded: no queue and
        // no second task between the socket and the call. (The handler holds the pipe
        // through `conn`; the pipe drops it when it ends, and so does this loop.)
        let (c, weak) = (conn.clone(), Arc::downgrade(&pipe));
        pipe.set_handler(Box::new(move |msg| match weak.upgrade() {
            Some(pipe) => answer_message(&c, pipe, msg),
            None => Handled::Started,
        }));
        // However this ends (the pipe ends, shutdown, or this future is dropped): no more
        // answers, calls still running cancelled, the cycle through the handler broken.
        let _end = EndServing { pipe: pipe.clone(), conn: conn.clone() };
        // What `recv` still gives: messages that came before the handler, then the end.
        let idle = self.shared.limits.idle_timeout;
        loop {
            let msg = tokio::select! {
                m = pipe.recv() => m,
                _ = self.shutdown.cancelled() => break,
                () = conn.idle(idle) => {
                    tracing::debug!(addr = %conn.addr(), "closing an idle ferry pipe (idle_timeout)");
                    let why = format!(
                        "the pipe was idle for {} ms holding nothing (RpcLimits::idle_timeout)",
                        idle.as_millis()
                    );
                    pipe.close_with("idle", why).await;
                    break;
                }
            };
            let Ok(msg) = msg else { break };
            if let Handled::Pause(room) = answer_message(&conn, pipe.clone(), msg) {
                room.await;
            }
        }
    }

    /// Serves one plain JSON connection (newline-delimited JSON-RPC, tensors inline)
    /// until the peer closes it. Requests are read while earlier ones run.
    pub async fn serve_json(&self, fc: ForeignConn) {
        let ForeignConn { info, mut read, mut write } = fc;
        let n = next_connection_id();
        let peer = PeerInfo {
            kind: ConnKind::Json,
            addr: info.addr.clone(),
            pid: info.peer_pid,
            uid: info.peer_uid,
            agent: String::new(),
            channel: "json".into(),
            identity: Identity::of_connection(info.peer_uid, false, n),
            conn: Some(n),
        };
        let conn = Conn::new(self.shared.clone(), peer, None);
        let max = self.shared.limits.max_request_bytes;
        let max_inline = self.shared.limits.max_inline_bytes;
        // Each line travels with its answer's ticket, dropped once the line is written.
        let (tx, mut rx) = mpsc::channel::<(Vec<u8>, Ticket)>(self.shared.limits.max_in_flight.max(1));
        let writer = tokio::spawn(async move {
            while let Some((buf, ticket)) = rx.recv().await {
                if write.write_all(&buf).await.is_err() || write.flush().await.is_err() {
                    break;
                }
                drop(ticket);
            }
        });
        let line_for = |line: Vec<u8>| {
            let mut ticket = conn.outbox.ticket();
            ticket.add_bytes(line.len() as u64);
            (line, ticket)
        };
        let mut buf = Vec::new();
        let (idle, line_timeout) = (self.shared.limits.idle_timeout, self.shared.limits.request_timeout);
        loop {
            // A client that does not read its answers: read nothing more until some leave.
            if conn.outbox.full() {
                tokio::select! {
                    () = conn.outbox.room() => {}
                    _ = self.shutdown.cancelled() => break,
                }
            }
            // Waiting for a request: a connection with nothing running is closed after
            // `idle_timeout`; one whose calls still run waits for them.
            let first = tokio::select! {
                r = wait_readable(&mut read, idle, || conn.in_flight() == 0) => r,
                _ = self.shutdown.cancelled() => break,
            };
            match first {
                Readable::Data => {}
                Readable::Eof => break,
                Readable::Idle => {
                    tracing::debug!(addr = %conn.addr(), "closing an idle plain JSON connection (idle_timeout)");
                    break;
                }
            }
            // A request that started must arrive whole within `request_timeout`.
            let line = tokio::select! {
                l = tokio::time::timeout(line_timeout, read_line(&mut read, max, &mut buf)) => match l {
                    Ok(l) => l,
                    Err(_) => {
                        tracing::debug!(addr = %conn.addr(), "closing a plain JSON connection: a request line took over request_timeout");
                        let e = ErrorObject::limit(
                            "request_timeout",
                            "milliseconds to send one request line",
                            line_timeout.as_millis() as u64 + 1,
                            line_timeout.as_millis() as u64,
                        );
                        let line = inline_line(Reply { value: failure(Value::Null, e), tensors: Vec::new() }, 0);
                        let _ = tx.send(line_for(line)).await;
                        break;
                    }
                },
                _ = self.shutdown.cancelled() => break,
            };
            let v = match line {
                Err(_) | Ok(Line::Eof) => break,
                Ok(Line::TooLong(n)) => {
                    let e =
                        ErrorObject::limit("max_request_bytes", "request line length in bytes", n as u64, max as u64);
                    failure(Value::Null, e)
                }
                Ok(Line::Data) => {
                    // A big request waits for room first (its connection is not read
                    // meanwhile), and holds it until its call ends.
                    let room = tokio::select! {
                        r = parse_room(&self.shared, buf.len()) => r,
                        _ = self.shutdown.cancelled() => break,
                    };
                    match parse_line(&mut buf, self.shared.limits).await {
                        Err(e) => failure(Value::Null, e),
                        Ok(None) => continue,
                        Ok(Some(v)) => {
                            let inline = conn.runs_inline(&v);
                            let mut ticket = conn.outbox.ticket();
                            let work = conn.start(v, Vec::new());
                            let tx = tx.clone();
                            let answer = async move {
                                let _room = room;
                                let out = work.await;
                                if let Some(reply) = out.reply {
                                    let line = inline_line(reply, max_inline);
                                    ticket.add_bytes(line.len() as u64);
                                    let _ = tx.send((line, ticket)).await;
                                }
                                drop(out.slots);
                            };
                            conn.answer_here_or_spawn(answer, inline);
                            continue;
                        }
                    }
                }
            };
            if tx.send(line_for(inline_line(Reply { value: v, tensors: Vec::new() }, max_inline))).await.is_err() {
                break;
            }
        }
        // The peer may have only shut down its writing side: answer what is running, then close.
        drop(tx);
        tokio::select! {
            _ = writer => {}
            _ = self.shutdown.cancelled() => {}
        }
        conn.end();
    }

    /// Answers one plain JSON-RPC text (a request or a batch) as a plain JSON peer would
    /// get it: `None` when nothing is to be answered (notifications only).
    pub async fn handle_text(&self, text: &[u8], peer: PeerInfo) -> Option<Vec<u8>> {
        let conn = Conn::new(self.shared.clone(), peer, None);
        let mut text = text.to_vec();
        let room = parse_room(&self.shared, text.len()).await;
        let reply = match parse_request(&mut text, self.shared.limits).await {
            Err(e) => Some(Reply { value: failure(Value::Null, e), tensors: Vec::new() }),
            Ok(v) => conn.start(v, Vec::new()).await.reply,
        };
        drop(room);
        conn.end();
        reply.map(|r| {
            let mut line = inline_line(r, self.shared.limits.max_inline_bytes);
            line.pop();
            line
        })
    }
}

/// Ends serving a pipe when dropped: clears its handler (which holds the connection state,
/// which holds the pipe) and cancels the calls still running.
struct EndServing {
    pipe: Arc<Pipe>,
    conn: Arc<Conn>,
}

impl Drop for EndServing {
    fn drop(&mut self) {
        self.pipe.clear_handler();
        self.conn.end();
    }
}

/// Starts answering one ferry message (a request or a batch): [`Handled::Done`] when it is
/// answered already (nothing was left running), [`Handled::Pause`] when the connection's
/// answers not yet written are at their bound ([`crate::RpcLimits::max_queued_answers`]).
fn answer_message(conn: &Arc<Conn>, pipe: Arc<Pipe>, msg: Message) -> Handled {
    let inline = conn.runs_inline(&msg.header);
    let mut ticket = conn.outbox.ticket();
    let work = conn.start(msg.header, msg.tensors);
    let answer = async move {
        let out = work.await;
        if let Some(reply) = out.reply {
            ticket.add_bytes(json_len(&reply.value));
            send_reply(&pipe, reply).await;
        }
        drop(out.slots);
        drop(ticket);
    };
    let idle = conn.answer_here_or_spawn(answer, inline);
    if conn.outbox.full() {
        let c = conn.clone();
        return Handled::Pause(Box::pin(async move { c.outbox.room().await }));
    }
    if idle { Handled::Done } else { Handled::Started }
}

/// Sends a response; if it cannot go (a tensor over the peer's limits, a device tensor
/// with no channel), sends the same ids with a tensor error instead.
async fn send_reply(pipe: &Pipe, reply: Reply) {
    let Reply { value, tensors } = reply;
    let ids = response_ids(&value);
    let batch = value.is_array();
    match pipe.send(Message::with_tensors(value, tensors)).await {
        Ok(()) => {}
        Err(e) if e.is_closed() => {}
        Err(e) => {
            tracing::warn!("cannot send a response: {e}");
            let errs: Vec<Value> = ids.into_iter().map(|id| failure(id, ErrorObject::tensor(&e))).collect();
            let v = if batch { Value::Array(errs) } else { errs.into_iter().next().unwrap_or(Value::Null) };
            let _ = pipe.send(Message::new(v)).await;
        }
    }
}

fn response_ids(v: &Value) -> Vec<Value> {
    match v {
        Value::Array(a) => a.iter().map(|r| r.get("id").cloned().unwrap_or(Value::Null)).collect(),
        r => vec![r.get("id").cloned().unwrap_or(Value::Null)],
    }
}
