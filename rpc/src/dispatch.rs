//! Dispatch: from one incoming JSON value (a request or a batch) to the work that answers
//! it, for any kind of connection.
//!
//! [`Conn::start`] does the synchronous part at once, in the connection's read loop:
//! classify, take an in-flight slot per call (or answer with a limit error), decode params
//! (or answer invalid params), and register the call's cancellation token under its id.
//! It returns a [`Work`] future that runs the handlers and yields the response (one object,
//! or an array for a batch; `None` when nothing is to be answered) plus the slots, which
//! the caller drops once the response is written, so a peer that does not read its
//! responses runs out of slots instead of growing the server's memory.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use ferry_core::{Pipe, Tensor};
use futures_util::FutureExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::codes::ErrorObject;
use crate::jsonrpc::{self, Entry, Incoming, failure, success};
use crate::limits::RpcLimits;
use crate::method::{CallContext, HandlerFuture, Methods, PeerInfo, Reply, decode_params, encode_result};
use crate::openrpc::ApiInfo;
use crate::outbox::Outbox;
use crate::remote::{
    FetchParams, FreeParams, KeepParams, ListRefsParams, PublishParams as RefPublishParams, RefTable, check_ttl,
};
use crate::task::{ResultParams, SubmitParams, Submitted, Submitter, TaskParams, TaskTable};
use crate::tensor::shift_refs;

/// Params of `ferry.cancel`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelParams {
    /// The id of the call to cancel (on the same connection).
    pub id: Value,
}

/// Result of `ferry.cancel` (when sent as a call rather than a notification).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct CancelResult {
    /// True if a call with that id was running and is now cancelled.
    pub cancelled: bool,
}

/// What every connection of a server shares.
pub(crate) struct Shared {
    pub(crate) methods: Methods,
    pub(crate) limits: RpcLimits,
    pub(crate) tasks: TaskTable,
    /// Remote tensor references ([`crate::remote`]).
    pub(crate) refs: Arc<RefTable>,
    /// Copies a tensor a client sent into memory the server keeps (`ferry.ref.keep`).
    pub(crate) ref_copy: crate::server::RefCopy,
    pub(crate) api: ApiInfo,
    pub(crate) doc: OnceLock<Value>,
    /// Connections served now (bounded by [`RpcLimits::max_connections`]).
    pub(crate) connections: AtomicUsize,
    /// Runs answers instead of `tokio::spawn` ([`crate::ServerBuilder::spawner`]).
    pub(crate) spawner: Option<crate::server::Spawner>,
    /// Room for big requests parsed and being answered, in KiB
    /// ([`RpcLimits::max_parse_bytes_in_flight`]; `crate::server::lines::parse_room`).
    pub(crate) parse_room: Arc<tokio::sync::Semaphore>,
}

/// One served connection's place under [`RpcLimits::max_connections`]; freed when dropped.
pub(crate) struct ConnSlot(Arc<Shared>);

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Shared {
    /// A place for one more connection, or `None` at [`RpcLimits::max_connections`].
    pub(crate) fn conn_slot(self: &Arc<Self>) -> Option<ConnSlot> {
        let max = self.limits.max_connections;
        self.connections.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).ok()?;
        Some(ConnSlot(self.clone()))
    }

    pub(crate) fn document(&self) -> &Value {
        self.doc.get_or_init(|| crate::openrpc::document(&self.api, &self.methods))
    }
}

/// One connection's calls.
pub(crate) struct Conn {
    shared: Arc<Shared>,
    peer: Arc<PeerInfo>,
    pipe: Option<Arc<Pipe>>,
    in_flight: AtomicUsize,
    /// When the connection was made, and milliseconds after it of the last request
    /// started or call ended (for the idle timeout).
    born: std::time::Instant,
    active_ms: AtomicU64,
    seq: AtomicU64,
    calls: Mutex<HashMap<String, (u64, CancellationToken)>>,
    /// Cancelled when the connection ends: every call still running is cancelled.
    pub(crate) closed: CancellationToken,
    /// Its answers not yet written.
    pub(crate) outbox: Arc<Outbox>,
}

impl Conn {
    /// Runs the answer to one request or batch (the call, then writing its response).
    ///
    /// Normally in a task of its own, even one that would finish at once: a handler doing
    /// long synchronous work before its first await must not stop the connection's read
    /// loop from reading the next calls. When every method it calls is cheap (`inline`:
    /// built-in ones and those marked [`crate::method::MethodDoc::inline`]), it is polled
    /// once right here instead, and only spawned if it is not done by then (the handler or
    /// the write waits), which saves a task spawn and a wake-up per call. Futures may be
    /// polled with a different waker each time, so the first poll's no-op waker is
    /// harmless: the task's first poll registers its own. Spawning is the server's
    /// [`crate::ServerBuilder::spawner`] if it has one.
    /// Returns true when the reader may busy-poll for the next call: the answer finished
    /// here, or the spawner runs it off the runtime.
    pub(crate) fn answer_here_or_spawn(&self, answer: impl Future<Output = ()> + Send + 'static, inline: bool) -> bool {
        let mut answer = Box::pin(answer);
        if inline && answer.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_ready() {
            return true;
        }
        match &self.shared.spawner {
            Some(spawn) => spawn(answer),
            None => {
                tokio::spawn(answer);
                false
            }
        }
    }

    /// Calls running (or answered and not yet written) on this connection.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// The peer's address, for logs.
    pub(crate) fn addr(&self) -> &str {
        &self.peer.addr
    }

    /// The connection ended: cancels its calls, and its tasks that are not detached.
    pub(crate) fn end(&self) {
        self.closed.cancel();
        if let Some(n) = self.peer.conn {
            let dropped = self.shared.tasks.connection_closed(n);
            if dropped > 0 {
                tracing::debug!(addr = %self.peer.addr, dropped, "connection closed: its tasks are cancelled");
            }
            let freed = self.shared.refs.connection_closed(n);
            if freed > 0 {
                tracing::debug!(addr = %self.peer.addr, freed, "connection closed: its tensor references are freed");
            }
        }
        for f in &self.shared.methods.closers {
            f(&self.peer);
        }
    }
}

/// An in-flight slot; dropping it frees the slot and forgets the call's id.
pub(crate) struct Slot {
    conn: Arc<Conn>,
    key: Option<(String, u64)>,
    token: CancellationToken,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.conn.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.conn.touch();
        if let Some((key, seq)) = self.key.take() {
            let mut calls = self.conn.calls.lock().unwrap_or_else(|e| e.into_inner());
            if calls.get(&key).is_some_and(|(s, _)| *s == seq) {
                calls.remove(&key);
            }
        }
    }
}

/// What answering one incoming value produced.
pub(crate) struct Output {
    /// The response (object or array) and its tensors; `None`: nothing to send.
    pub(crate) reply: Option<Reply>,
    /// Drop after the response is written.
    pub(crate) slots: Vec<Slot>,
}

/// The asynchronous part of answering one incoming value.
pub(crate) type Work = Pin<Box<dyn Future<Output = Output> + Send>>;
type EntryFuture = Pin<Box<dyn Future<Output = Option<Reply>> + Send>>;

fn ready(r: Option<Reply>) -> EntryFuture {
    Box::pin(std::future::ready(r))
}

fn respond(id: Value, r: Result<Reply, ErrorObject>) -> Reply {
    match r {
        Ok(Reply { value, tensors }) => Reply { value: success(id, value), tensors },
        Err(e) => Reply { value: failure(id, e), tensors: Vec::new() },
    }
}

impl Conn {
    pub(crate) fn new(shared: Arc<Shared>, peer: PeerInfo, pipe: Option<Arc<Pipe>>) -> Arc<Conn> {
        Arc::new(Conn {
            peer: Arc::new(peer),
            pipe,
            in_flight: AtomicUsize::new(0),
            born: std::time::Instant::now(),
            active_ms: AtomicU64::new(0),
            seq: AtomicU64::new(0),
            calls: Mutex::new(HashMap::new()),
            closed: CancellationToken::new(),
            outbox: Outbox::new(shared.limits.max_queued_answers, shared.limits.max_queued_answer_bytes),
            shared,
        })
    }

    /// True if the answer to `v` (a request or a batch) may be polled in the connection's
    /// read loop: every entry calls a built-in method, an unknown one (an error), or one
    /// marked [`crate::method::MethodDoc::inline`], or is invalid (an error).
    pub(crate) fn runs_inline(&self, v: &Value) -> bool {
        let one = |e: &Value| match e.get("method").and_then(Value::as_str) {
            Some(name) => self.shared.methods.map.get(name).is_none_or(|m| m.inline),
            None => true,
        };
        match v {
            Value::Array(entries) => entries.iter().all(one),
            e => one(e),
        }
    }

    /// Notes activity now (a request came, a call ended).
    fn touch(&self) {
        let ms = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.active_ms.fetch_max(ms, Ordering::AcqRel);
    }

    /// How long the connection has gone without a request or a call ending.
    pub(crate) fn quiet_for(&self) -> std::time::Duration {
        let since = std::time::Duration::from_millis(self.active_ms.load(Ordering::Acquire));
        self.born.elapsed().saturating_sub(since)
    }

    /// Whether the connection holds nothing that closing it would lose: no call running or
    /// unwritten, no tensor reference or task of its own (published references and
    /// detached tasks outlive it anyway), no lease of server memory its peer still uses.
    pub(crate) fn holds_nothing(&self) -> bool {
        let mine = |n| self.shared.refs.held_by_connection(n) || self.shared.tasks.held_by_connection(n);
        self.in_flight() == 0
            && !self.peer.conn.is_some_and(mine)
            && self.pipe.as_ref().is_none_or(|p| p.leases_granted() == 0)
    }

    /// Resolves once the connection has been quiet for `idle` holding nothing
    /// ([`crate::RpcLimits::idle_timeout`] for ferry pipes); checks again every `idle`
    /// while it holds something.
    pub(crate) async fn idle(&self, idle: std::time::Duration) {
        loop {
            let quiet = self.quiet_for();
            if quiet >= idle && self.holds_nothing() {
                return;
            }
            let wait = if quiet >= idle { idle } else { idle - quiet };
            tokio::time::sleep(wait.max(std::time::Duration::from_millis(10))).await;
        }
    }

    /// Starts answering `v` (a request or a batch), whose `{"$tensor": i}` refer to `tensors`.
    pub(crate) fn start(self: &Arc<Self>, v: Value, tensors: Vec<Tensor>) -> Work {
        self.touch();
        match jsonrpc::classify(v, self.shared.limits.max_batch) {
            Err(e) => Box::pin(std::future::ready(Output {
                reply: Some(Reply { value: failure(Value::Null, e), tensors: Vec::new() }),
                slots: Vec::new(),
            })),
            Ok(Incoming::Single(e)) => {
                let (slot, fut) = self.entry(e, &tensors);
                Box::pin(async move { Output { reply: fut.await, slots: slot.into_iter().collect() } })
            }
            Ok(Incoming::Batch(entries)) => {
                let mut slots = Vec::new();
                let mut futs = Vec::with_capacity(entries.len());
                for e in entries {
                    let (slot, fut) = self.entry(e, &tensors);
                    slots.extend(slot);
                    futs.push(fut);
                }
                Box::pin(async move {
                    let replies = futures_util::future::join_all(futs).await;
                    let mut values = Vec::new();
                    let mut all_tensors = Vec::new();
                    for Reply { mut value, tensors } in replies.into_iter().flatten() {
                        shift_refs(&mut value, all_tensors.len() as u64);
                        all_tensors.extend(tensors);
                        values.push(value);
                    }
                    // A batch of notifications only gets no response at all.
                    let reply =
                        (!values.is_empty()).then(|| Reply { value: Value::Array(values), tensors: all_tensors });
                    Output { reply, slots }
                })
            }
        }
    }

    fn entry(self: &Arc<Self>, e: Entry, tensors: &[Tensor]) -> (Option<Slot>, EntryFuture) {
        match e {
            Entry::Invalid { id, error } => {
                (None, ready(Some(Reply { value: failure(id, error), tensors: Vec::new() })))
            }
            Entry::Call { id, method, params } => self.call(Some(id), &method, params, tensors),
            Entry::Notification { method, params } => self.call(None, &method, params, tensors),
        }
    }

    fn call(
        self: &Arc<Self>,
        id: Option<Value>,
        method: &str,
        params: Option<Value>,
        tensors: &[Tensor],
    ) -> (Option<Slot>, EntryFuture) {
        if method == "ferry.cancel" {
            let r = decode_params::<CancelParams>(params, tensors)
                .and_then(|p| encode_result(&CancelResult { cancelled: self.cancel(&p.id) }));
            return (None, ready(id.map(|id| respond(id, r))));
        }
        // References in the params become the kept tensors, appended to the message's.
        // (Always looked for, even with no reference held: a freed one is NOT_FOUND.)
        let mut params = params;
        let resolved = match params.as_mut().map(|p| self.shared.refs.resolve(p, tensors, &self.peer.identity)) {
            Some(Err(e)) => return (None, ready(id.map(|id| respond(id, Err(e))))),
            Some(Ok(r)) => r,
            None => None,
        };
        let tensors = resolved.as_deref().unwrap_or(tensors);
        let Some(slot) = self.try_slot(id.as_ref()) else {
            let max = self.shared.limits.max_in_flight as u64;
            let e = ErrorObject::limit("max_in_flight", "calls in flight on this connection", max + 1, max);
            if id.is_none() {
                tracing::warn!(method, "dropping a notification: {}", e.message);
            }
            return (None, ready(id.map(|id| respond(id, Err(e)))));
        };
        let token = slot.token.clone();
        let ctx = CallContext {
            peer: self.peer.clone(),
            id: id.clone(),
            cancel: token.clone(),
            pipe: self.pipe.clone(),
            permit: None,
            refs: Some(self.shared.refs.clone()),
            conn_closed: Some(self.closed.clone()),
        };
        let started = self.start_method(method, params, tensors, ctx);
        let fut = async move {
            let r = match started {
                Err(e) => Err(e),
                Ok(f) => run(f, &token).await,
            };
            id.map(|id| respond(id, r))
        };
        (Some(slot), Box::pin(fut))
    }

    fn try_slot(self: &Arc<Self>, id: Option<&Value>) -> Option<Slot> {
        let max = self.shared.limits.max_in_flight;
        self.in_flight.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).ok()?;
        let token = self.closed.child_token();
        let key = id.map(|id| {
            let seq = self.seq.fetch_add(1, Ordering::Relaxed);
            let key = id.to_string();
            self.calls.lock().unwrap_or_else(|e| e.into_inner()).insert(key.clone(), (seq, token.clone()));
            (key, seq)
        });
        Some(Slot { conn: self.clone(), key, token })
    }

    /// Cancels the running call with this id; true if there was one.
    fn cancel(&self, id: &Value) -> bool {
        let calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        match calls.get(&id.to_string()) {
            Some((_, token)) => {
                token.cancel();
                true
            }
            None => false,
        }
    }

    fn start_method(
        &self,
        method: &str,
        params: Option<Value>,
        tensors: &[Tensor],
        ctx: CallContext,
    ) -> Result<HandlerFuture, ErrorObject> {
        let shared = &self.shared;
        match method {
            "rpc.discover" => {
                let doc = shared.document().clone();
                Ok(Box::pin(std::future::ready(Ok(Reply { value: doc, tensors: Vec::new() }))))
            }
            "ferry.task.submit" => {
                let p: SubmitParams = decode_params(params, tensors)?;
                let m = shared.methods.map.get(&p.method).ok_or_else(|| ErrorObject::method_not_found(&p.method))?;
                m.check_param_names(p.params.as_ref())?;
                let handler = &m.handler;
                // The task outlives this call (and if detached its connection): its own
                // token, no pipe.
                let token = CancellationToken::new();
                let task_ctx = CallContext {
                    peer: ctx.peer.clone(),
                    id: None,
                    cancel: token.clone(),
                    pipe: None,
                    permit: None,
                    refs: ctx.refs.clone(),
                    conn_closed: ctx.conn_closed.clone(),
                };
                let fut = handler.call(p.params, tensors, task_ctx)?;
                let by =
                    Submitter { owner: ctx.peer.identity.clone(), conn: if p.detached { None } else { ctx.peer.conn } };
                let task = shared.tasks.submit(&p.method, fut, token, p.keep, by, Instant::now())?;
                encode_result(&Submitted { task }).map(ready_ok)
            }
            "ferry.task.status" => {
                let p: TaskParams = decode_params(params, tensors)?;
                encode_result(&shared.tasks.status(&p.task, &ctx.peer.identity, Instant::now())?).map(ready_ok)
            }
            "ferry.task.cancel" => {
                let p: TaskParams = decode_params(params, tensors)?;
                encode_result(&shared.tasks.cancel(&p.task, &ctx.peer.identity, Instant::now())?).map(ready_ok)
            }
            "ferry.task.result" => {
                let p: ResultParams = decode_params(params, tensors)?;
                let tasks = shared.tasks.clone();
                let who = ctx.peer.identity.clone();
                Ok(Box::pin(async move { tasks.result(&p.task, &who, Duration::from_millis(p.wait_ms), p.keep).await }))
            }
            "ferry.ref.keep" => {
                let p: KeepParams = decode_params(params, tensors)?;
                let t = (shared.ref_copy)(&p.tensor).map_err(|m| ErrorObject::invalid_params("tensor", m))?;
                let ttl = p.ttl_ms.map(|ms| check_ttl("ttl_ms", Duration::from_millis(ms))).transpose()?;
                encode_result(&ctx.keep(t, ttl)?).map(ready_ok)
            }
            "ferry.ref.fetch" => {
                let p: FetchParams = decode_params(params, tensors)?;
                encode_result(&p.reference).map(ready_ok)
            }
            "ferry.ref.free" => {
                let p: FreeParams = decode_params(params, tensors)?;
                let freed = shared.refs.free(&p.ids, &ctx.peer.identity, Instant::now());
                encode_result(&crate::remote::Freed { freed: freed as u64 }).map(ready_ok)
            }
            "ferry.ref.publish" => {
                let p: RefPublishParams = decode_params(params, tensors)?;
                encode_result(&shared.refs.publish(&p.id, &ctx.peer.identity, Instant::now())?).map(ready_ok)
            }
            "ferry.ref.list" => {
                let _: ListRefsParams = decode_params(params, tensors)?;
                encode_result(&shared.refs.list(&ctx.peer.identity, Instant::now())).map(ready_ok)
            }
            name => {
                let m = shared.methods.map.get(name).ok_or_else(|| ErrorObject::method_not_found(name))?;
                m.check_param_names(params.as_ref())?;
                m.handler.call(params, tensors, ctx)
            }
        }
    }
}

fn ready_ok(r: Reply) -> HandlerFuture {
    Box::pin(std::future::ready(Ok(r)))
}

/// Runs a handler until it finishes, panics (internal error) or is cancelled.
async fn run(f: HandlerFuture, token: &CancellationToken) -> Result<Reply, ErrorObject> {
    tokio::select! {
        biased;
        _ = token.cancelled() => Err(ErrorObject::cancelled("by ferry.cancel, because the connection closed, or because the server is shutting down")),
        r = AssertUnwindSafe(f).catch_unwind() => r.unwrap_or_else(|p| {
            let what = panic_message(p.as_ref());
            tracing::error!("handler panicked: {what}");
            Err(ErrorObject::internal(format!("the handler panicked: {what}")))
        }),
    }
}

/// What a panic said (its `&str` or `String` payload).
pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

#[cfg(test)]
mod tests;
