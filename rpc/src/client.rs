//! [`Client`]: JSON-RPC calls over a ferry [`Pipe`], many in flight at once, matched by id.
//!
//! - `call::<P, R>(method, params)` encodes `params` (tensors become `{"$tensor": i}` and
//!   travel over the pipe's channel), waits for the response with the same id and decodes
//!   the result into `R`.
//! - A per-call timeout ([`Client::with_timeout`], [`Client::call_timeout`]) fails the call
//!   with [`CallError::Timeout`]. A call that times out or whose future is dropped is
//!   cancelled on the server (a `ferry.cancel` notification).
//! - When the server goes away, every call waiting fails with [`CallError::Closed`] at
//!   once, and later calls fail the same way: nothing hangs.

mod direct;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_core::{Message, Pipe, PipeError, Tensor};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::codes::ErrorObject;
use crate::jsonrpc::{self, parse_response};
use crate::pending::Pending;
use crate::task::{Submitted, TaskStatus};
use crate::tensor::{self, TensorMode};

/// Why a call failed, on the client side.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The server answered with an error.
    #[error("{0}")]
    Rpc(ErrorObject),
    /// The connection is closed (the server went away, or this client closed it).
    #[error("connection to the server closed: {0}")]
    Closed(PipeError),
    /// No response in time; the call was cancelled on the server.
    #[error("no response within {0:?}; the call was cancelled")]
    Timeout(Duration),
    /// The params could not be encoded.
    #[error("params cannot be sent: {0}")]
    Params(String),
    /// The result does not decode into the expected type.
    #[error("unexpected result: {0}")]
    Result(String),
    /// The pipe refused the request (e.g. over the server's limits).
    #[error("request not sent: {0}")]
    Pipe(PipeError),
}

impl CallError {
    /// The server's error code, if the server answered with an error.
    pub fn code(&self) -> Option<i64> {
        match self {
            CallError::Rpc(e) => Some(e.code),
            _ => None,
        }
    }
}

type Outcome = Result<(Value, Vec<Tensor>), CallError>;
type Waiter = oneshot::Sender<Outcome>;

struct Shared {
    pipe: Pipe,
    pending: Mutex<Pending<Waiter>>,
    next_id: AtomicU64,
    /// Why the pipe ended (the server's CLOSE reason), once it has.
    ended: Mutex<Option<PipeError>>,
    /// The runtime the client was made on: a call given up on a plain thread sends its
    /// cancellation from there.
    handle: tokio::runtime::Handle,
    /// Blocking calls ([`Client::call_raw_blocking`]) that read the pipe on their own
    /// threads, and when the last ended: the read loop stands aside meanwhile.
    direct: direct::Direct,
}

impl Shared {
    fn pending(&self) -> std::sync::MutexGuard<'_, Pending<Waiter>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The error a call on an ended pipe gets: the reason it ended, where known.
    fn closed(&self) -> CallError {
        let e = self.ended.lock().unwrap_or_else(|e| e.into_inner()).clone();
        CallError::Closed(e.unwrap_or(PipeError::Closed))
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A JSON-RPC client over one ferry pipe. Cheap to clone; clones share the pipe, and calls
/// from any of them may be in flight at once.
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
    timeout: Option<Duration>,
    _reader: Arc<AbortOnDrop>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("pipe", &self.shared.pipe).field("timeout", &self.timeout).finish()
    }
}

/// Removes a call from the pending table and cancels it on the server unless disarmed.
struct CallGuard {
    shared: Arc<Shared>,
    id: u64,
    armed: bool,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.shared.pending().remove(self.id);
        if self.shared.pipe.is_closed() {
            return;
        }
        let shared = self.shared.clone();
        let msg = jsonrpc::request(None, "ferry.cancel", Some(json!({ "id": self.id })));
        self.shared.handle.spawn(async move {
            let _ = shared.pipe.send(Message::new(msg)).await;
        });
    }
}

impl Client {
    /// A client over `pipe` (no default timeout). Starts a task reading responses.
    pub fn new(pipe: Pipe) -> Client {
        let shared = Arc::new(Shared {
            pipe,
            pending: Mutex::new(Pending::new()),
            next_id: AtomicU64::new(1),
            ended: Mutex::new(None),
            handle: tokio::runtime::Handle::current(),
            direct: direct::Direct::default(),
        });
        let reader = tokio::spawn(read_loop(shared.clone()));
        Client { shared, timeout: None, _reader: Arc::new(AbortOnDrop(reader)) }
    }

    /// Sets the default timeout of every call (`None`: wait as long as it takes).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Option<Duration>) -> Client {
        self.timeout = timeout;
        self
    }

    /// The pipe.
    pub fn pipe(&self) -> &Pipe {
        &self.shared.pipe
    }

    /// Calls `method` with `params` (a struct or map: by name; a tuple or array: by
    /// position; `()`: none) and decodes the result.
    pub async fn call<P: Serialize + ?Sized, R: DeserializeOwned>(
        &self,
        method: &str,
        params: &P,
    ) -> Result<R, CallError> {
        self.call_with(method, params, self.timeout).await
    }

    /// [`Client::call`] with its own timeout.
    pub async fn call_timeout<P: Serialize + ?Sized, R: DeserializeOwned>(
        &self,
        method: &str,
        params: &P,
        timeout: Duration,
    ) -> Result<R, CallError> {
        self.call_with(method, params, Some(timeout)).await
    }

    async fn call_with<P: Serialize + ?Sized, R: DeserializeOwned>(
        &self,
        method: &str,
        params: &P,
        timeout: Option<Duration>,
    ) -> Result<R, CallError> {
        let (params, tensors) = encode_params(params)?;
        let (value, tensors) = self.call_raw(method, params, tensors, timeout).await?;
        tensor::from_value(value, &tensors).map_err(|e| CallError::Result(format!("{}: {}", e.path(), e.inner())))
    }

    /// Calls with raw JSON params (which may hold `{"$tensor": i}` refs into `tensors`);
    /// returns the raw result and its tensors.
    pub async fn call_raw(
        &self,
        method: &str,
        params: Option<Value>,
        tensors: Vec<Tensor>,
        timeout: Option<Duration>,
    ) -> Result<(Value, Vec<Tensor>), CallError> {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        if self.shared.pending().insert(id, tx).is_err() {
            return Err(self.shared.closed());
        }
        let mut guard = CallGuard { shared: self.shared.clone(), id, armed: true };
        let req = jsonrpc::request(Some(Value::from(id)), method, params);
        if let Err(e) = self.shared.pipe.send(Message::with_tensors(req, tensors)).await {
            guard.armed = false;
            if !e.is_closed() {
                self.shared.pending().remove(id);
                return Err(CallError::Pipe(e));
            }
            // The pipe ended: the read loop is about to fail every waiter with the reason
            // (the server's CLOSE frame, if it sent one). Take that rather than the bare
            // write error, waiting a moment for it.
            return match tokio::time::timeout(Duration::from_secs(1), rx).await {
                Ok(Ok(Err(reason))) => Err(reason),
                _ => {
                    self.shared.pending().remove(id);
                    Err(CallError::Closed(e))
                }
            };
        }
        let r = match timeout {
            Some(d) => tokio::time::timeout(d, rx).await.map_err(|_| CallError::Timeout(d))?,
            None => rx.await,
        };
        guard.armed = false;
        r.unwrap_or_else(|_| Err(self.shared.closed()))
    }

    /// Sends a notification (no response, no error from the server).
    pub async fn notify<P: Serialize + ?Sized>(&self, method: &str, params: &P) -> Result<(), CallError> {
        let (params, tensors) = encode_params(params)?;
        let req = jsonrpc::request(None, method, params);
        self.shared
            .pipe
            .send(Message::with_tensors(req, tensors))
            .await
            .map_err(|e| if e.is_closed() { CallError::Closed(e) } else { CallError::Pipe(e) })
    }

    /// Sends a batch of calls (method, raw params) in one message, params referring to
    /// `tensors`; returns each call's outcome in order.
    pub async fn batch(
        &self,
        calls: &[(&str, Option<Value>)],
        tensors: Vec<Tensor>,
    ) -> Result<Vec<Result<(Value, Vec<Tensor>), ErrorObject>>, CallError> {
        let mut requests = Vec::with_capacity(calls.len());
        let mut waits = Vec::with_capacity(calls.len());
        let mut guards = Vec::with_capacity(calls.len());
        for (method, params) in calls {
            let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = oneshot::channel();
            if self.shared.pending().insert(id, tx).is_err() {
                return Err(self.shared.closed());
            }
            guards.push(CallGuard { shared: self.shared.clone(), id, armed: true });
            waits.push(rx);
            requests.push(jsonrpc::request(Some(Value::from(id)), method, params.clone()));
        }
        if let Err(e) = self.shared.pipe.send(Message::with_tensors(Value::Array(requests), tensors)).await {
            return Err(if e.is_closed() { CallError::Closed(e) } else { CallError::Pipe(e) });
        }
        let all = futures_util::future::join_all(waits);
        let results = match self.timeout {
            Some(d) => tokio::time::timeout(d, all).await.map_err(|_| CallError::Timeout(d))?,
            None => all.await,
        };
        guards.iter_mut().for_each(|g| g.armed = false);
        results
            .into_iter()
            .map(|r| match r.unwrap_or_else(|_| Err(self.shared.closed())) {
                Ok(x) => Ok(Ok(x)),
                Err(CallError::Rpc(e)) => Ok(Err(e)),
                Err(e) => Err(e),
            })
            .collect()
    }

    /// The server's OpenRPC document (`rpc.discover`).
    pub async fn discover(&self) -> Result<Value, CallError> {
        Ok(self.call_raw("rpc.discover", None, Vec::new(), self.timeout).await?.0)
    }

    /// Starts `method` as a task (`ferry.task.submit`); returns the task id. The task is
    /// cancelled, and its result dropped, when this client's connection closes; see
    /// [`Client::submit_detached`] for one that outlives it.
    pub async fn submit<P: Serialize + ?Sized>(
        &self,
        method: &str,
        params: &P,
        keep: bool,
    ) -> Result<String, CallError> {
        self.submit_task(method, params, keep, false).await
    }

    /// Starts `method` as a detached task: it outlives this connection, and any connection
    /// of the same identity may fetch its result until it expires.
    pub async fn submit_detached<P: Serialize + ?Sized>(
        &self,
        method: &str,
        params: &P,
        keep: bool,
    ) -> Result<String, CallError> {
        self.submit_task(method, params, keep, true).await
    }

    async fn submit_task<P: Serialize + ?Sized>(
        &self,
        method: &str,
        params: &P,
        keep: bool,
        detached: bool,
    ) -> Result<String, CallError> {
        let (params, tensors) = encode_params(params)?;
        let p = json!({ "method": method, "params": params, "keep": keep, "detached": detached });
        let (v, t) = self.call_raw("ferry.task.submit", Some(p), tensors, self.timeout).await?;
        let s: Submitted = tensor::from_value(v, &t).map_err(|e| CallError::Result(e.to_string()))?;
        Ok(s.task)
    }

    /// A task's status (`ferry.task.status`).
    pub async fn task_status(&self, task: &str) -> Result<TaskStatus, CallError> {
        self.call("ferry.task.status", &json!({ "task": task })).await
    }

    /// A task's result (`ferry.task.result`), waiting up to `wait` on the server.
    pub async fn task_result<R: DeserializeOwned>(&self, task: &str, wait: Duration) -> Result<R, CallError> {
        let p = json!({ "task": task, "wait_ms": wait.as_millis() as u64 });
        let timeout = self.timeout.map(|t| t + wait);
        self.call_with("ferry.task.result", &p, timeout).await
    }

    /// Cancels a task (`ferry.task.cancel`).
    pub async fn task_cancel(&self, task: &str) -> Result<TaskStatus, CallError> {
        self.call("ferry.task.cancel", &json!({ "task": task })).await
    }

    /// Why the connection ended (the server's CLOSE reason, or how the stream ended), once
    /// it has; `None` while it is open.
    pub fn close_reason(&self) -> Option<PipeError> {
        self.shared.ended.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Closes the pipe; calls waiting fail with [`CallError::Closed`].
    pub async fn close(&self) {
        self.shared.pipe.close().await;
    }
}

/// Params as JSON (tensors as refs): objects and arrays as they are, `()` / `null` as
/// absent; anything else is an error (JSON-RPC allows only structured params).
fn encode_params<P: Serialize + ?Sized>(params: &P) -> Result<(Option<Value>, Vec<Tensor>), CallError> {
    let (v, tensors) = tensor::to_value(params, TensorMode::Refs).map_err(|e| CallError::Params(e.to_string()))?;
    match v {
        Value::Null => Ok((None, tensors)),
        v @ (Value::Array(_) | Value::Object(_)) => Ok((Some(v), tensors)),
        other => Err(CallError::Params(format!(
            "params must be a struct, map, tuple or array (JSON object or array), not {other}"
        ))),
    }
}

/// Reads the responses and hands each to its call, except while blocking calls read them
/// on their own threads ([`direct`]): it then stands aside (its `recv` dropped, which is
/// cancel-safe) until none has for a while.
async fn read_loop(shared: Arc<Shared>) {
    loop {
        if !shared.direct.loop_may_read() {
            direct::stand_aside(&shared).await;
            continue;
        }
        let r = tokio::select! {
            biased;
            () = shared.direct.asked() => continue,
            r = shared.pipe.recv() => r,
        };
        match r {
            Ok(msg) => received(&shared, msg),
            Err(e) => {
                ended(&shared, e);
                return;
            }
        }
    }
}

/// A message read from the pipe: each response in it goes to its call.
fn received(shared: &Shared, msg: Message) {
    match msg.header {
        Value::Array(items) => {
            for item in items {
                deliver(shared, item, msg.tensors.clone());
            }
        }
        v => deliver(shared, v, msg.tensors),
    }
}

/// The pipe ended with `e`: every call waiting fails with it (the first reason is kept).
fn ended(shared: &Shared, e: PipeError) {
    {
        let mut ended = shared.ended.lock().unwrap_or_else(|e| e.into_inner());
        if ended.is_none() {
            *ended = Some(e.clone());
        }
    }
    let waiters = shared.pending().close();
    for w in waiters {
        let _ = w.send(Err(CallError::Closed(e.clone())));
    }
}

fn deliver(shared: &Shared, v: Value, tensors: Vec<Tensor>) {
    let resp = match parse_response(v) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(
                "ignoring a message that is not a JSON-RPC response: {}",
                ferry_core::logsafe::peer_text(&e.to_string())
            );
            return;
        }
    };
    let Some(w) = shared.pending().resolve(&resp.id) else {
        if let Err(e) = &resp.outcome {
            tracing::warn!(
                id = %resp.id,
                "server error for no waiting call: {}",
                ferry_core::logsafe::peer_text(&e.to_string())
            );
        }
        return;
    };
    let _ = w.send(resp.outcome.map(|v| (v, tensors)).map_err(CallError::Rpc));
}
