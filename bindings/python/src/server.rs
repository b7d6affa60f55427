//! The JSON-RPC server with Python handlers.
//!
//! A handler is a Python callable made by `ferry.App` (it validates params with pydantic,
//! calls the user's function, encodes the result):
//!
//! - sync: `call(params | None, [TensorRef], Context) -> outcome`, run on a thread of
//!   [`crate::pool`] with the GIL (`params`: a `dict` of the params by name, as
//!   `json.loads` makes it, see [`crate::json`]);
//! - async: `call(params | None, [TensorRef], Context, Done) -> handle`: it schedules
//!   the coroutine on the app's asyncio loop and returns at once; the loop calls
//!   `Done(outcome)` when it ends; dropping the call (cancelled, timed out, connection
//!   gone) calls `handle.cancel()`, which raises `CancelledError` in the coroutine.
//!
//! An outcome is `(result_json, [OutTensor | TensorRef])` or `(code, message, data_json | None)`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_cli::cli_rpc::{Access, ServeOptions};
use ferry_core::Tensor;
use ferry_rpc::method::{ErasedHandler, HandlerFuture};
use ferry_rpc::{CallContext, ErrorObject, GivenSchemas, MethodInfo, Methods, Reply, RpcLimits};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::runtime;
use crate::tensors::{OutTensor, TensorRef, meta_of};

/// An error for the caller from a Python exception the app's dispatcher did not turn into
/// an outcome (a bug of the dispatcher): its type and message.
fn internal_from(py: Python<'_>, e: &PyErr) -> ErrorObject {
    let ty = e.get_type(py).qualname().map(|q| q.to_string()).unwrap_or_else(|_| "exception".into());
    ErrorObject::internal(format!("{ty}: {}", e.value(py)))
}

/// The reply (or error) an outcome stands for.
fn outcome(py: Python<'_>, o: &Bound<'_, PyAny>) -> Result<Reply, ErrorObject> {
    let t = o.cast::<PyTuple>().map_err(|_| ErrorObject::internal("the handler wrapper returned no outcome tuple"))?;
    let bad = |e: PyErr| internal_from(py, &e);
    match t.len() {
        2 => {
            let json = t.get_item(0).map_err(bad)?;
            // `bytes` from pydantic's `dump_json`, `str` from `json.dumps`.
            let parsed = match json.cast::<PyBytes>() {
                Ok(b) => serde_json::from_slice(b.as_bytes()),
                Err(_) => serde_json::from_str(json.extract::<&str>().map_err(bad)?),
            };
            let value: Value = parsed.map_err(|e| ErrorObject::internal(format!("result JSON: {e}")))?;
            let outs = t.get_item(1).map_err(bad)?;
            let outs = outs.cast::<PyList>().map_err(|_| ErrorObject::internal("result tensors: not a list"))?;
            let mut tensors = Vec::with_capacity(outs.len());
            for o in outs.iter() {
                if let Ok(o) = o.cast::<OutTensor>() {
                    tensors.push(o.get().take().map_err(bad)?);
                } else if let Ok(r) = o.cast::<TensorRef>() {
                    // A received tensor sent back as it is (an echo): no copy, over shm the
                    // peer gets its own memory back.
                    tensors.push(r.get().tensor.clone());
                } else {
                    return Err(ErrorObject::internal("result tensor: neither an OutTensor nor a TensorRef"));
                }
            }
            Ok(Reply { value, tensors })
        }
        3 => {
            let code: i64 = t.get_item(0).and_then(|v| v.extract()).map_err(bad)?;
            let message: String = t.get_item(1).and_then(|v| v.extract()).map_err(bad)?;
            let data: Option<String> = t.get_item(2).and_then(|v| v.extract()).map_err(bad)?;
            let mut err = ErrorObject::new(code, message);
            if let Some(d) = data {
                err = err.with_data(serde_json::from_str(&d).unwrap_or(Value::String(d)));
            }
            Err(err)
        }
        n => Err(ErrorObject::internal(format!("the handler wrapper returned a tuple of {n}"))),
    }
}

/// The received tensors as a Python list of [`TensorRef`].
fn refs<'py>(py: Python<'py>, tensors: Vec<Tensor>) -> PyResult<Bound<'py, PyList>> {
    let items: Vec<Bound<'py, TensorRef>> =
        tensors.into_iter().map(|t| Bound::new(py, TensorRef::new(t))).collect::<PyResult<_>>()?;
    PyList::new(py, items)
}

/// A call's params for its handler: a `dict` by name, or `None` when there are none.
fn py_params<'py>(py: Python<'py>, params: Option<&Value>) -> PyResult<Bound<'py, PyAny>> {
    match params {
        Some(v) => crate::json::to_py(py, v),
        None => Ok(py.None().into_bound(py)),
    }
}

/// A Python handler.
struct PyHandler {
    call: Arc<Py<PyAny>>,
    is_async: bool,
    /// Its params in positional order.
    names: Vec<String>,
}

impl PyHandler {
    /// The params by name for the app's validator: params given by position are named
    /// here (cheaper than in Python), too many is an error.
    fn named_params(&self, params: Value) -> Result<Value, ErrorObject> {
        let Value::Array(values) = params else { return Ok(params) };
        if values.len() > self.names.len() {
            return Err(ErrorObject::invalid_params(
                "",
                format!(
                    "{} params given by position; it takes {} ({})",
                    values.len(),
                    self.names.len(),
                    self.names.join(", ")
                ),
            ));
        }
        let named: serde_json::Map<String, Value> = self.names.iter().cloned().zip(values).collect();
        Ok(Value::Object(named))
    }
}

impl ErasedHandler for PyHandler {
    fn call(&self, params: Option<Value>, tensors: &[Tensor], ctx: CallContext) -> Result<HandlerFuture, ErrorObject> {
        let mut tensors = tensors.to_vec();
        let params = match params {
            Some(mut v) => {
                // Plain JSON and HTTP callers send tensors inline: Python sees references only.
                ferry_rpc::tensor::inline_to_refs(&mut v, &mut tensors)
                    .map_err(|e| ErrorObject::invalid_params("", e))?;
                Some(self.named_params(v)?)
            }
            None => None,
        };
        let call = self.call.clone();
        if !self.is_async {
            let (tx, rx) = tokio::sync::oneshot::channel();
            crate::pool::run(move |py| {
                let r = match py_params(py, params.as_ref()).and_then(|p| Ok((p, refs(py, tensors)?))) {
                    Ok((params, refs)) => match call.call1(py, (params, refs, Context { ctx })) {
                        Ok(o) => outcome(py, o.bind(py)),
                        Err(e) => Err(internal_from(py, &e)),
                    },
                    Err(e) => Err(internal_from(py, &e)),
                };
                // The call may be gone (cancelled): then nobody waits for its answer.
                let _ = crate::answer::delivering(|| tx.send(r));
            });
            return Ok(Box::pin(async move {
                rx.await.unwrap_or_else(|_| Err(ErrorObject::internal("the handler's thread ended without an answer")))
            }));
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (started_tx, started) = tokio::sync::oneshot::channel();
        crate::pool::run(move |py| {
            let done = Done { tx: Mutex::new(Some(tx)) };
            let r = match py_params(py, params.as_ref()).and_then(|p| Ok((p, refs(py, tensors)?))) {
                Ok((params, refs)) => {
                    call.call1(py, (params, refs, Context { ctx }, done)).map_err(|e| internal_from(py, &e))
                }
                Err(e) => Err(internal_from(py, &e)),
            };
            // The handle travels armed: a call dropped (cancelled) before it took the handle
            // out of the channel drops it there, or here when the channel is gone, and
            // either drop cancels the task. A bare handle would be dropped unseen, and the
            // coroutine would run on though its call was answered `cancelled`.
            let r = r.map(|h| CancelOnDrop(Some(h)));
            let _ = crate::answer::delivering(|| started_tx.send(r));
        });
        Ok(Box::pin(async move {
            let mut guard = started
                .await
                .unwrap_or_else(|_| Err(ErrorObject::internal("the handler's thread ended without starting it")))?;
            let r = rx
                .await
                .unwrap_or_else(|_| Err(ErrorObject::internal("the app's event loop stopped before the call ended")));
            guard.0 = None;
            r
        }))
    }
}

/// Cancels an async call's asyncio task when the call is dropped before it ended.
struct CancelOnDrop(Option<Py<PyAny>>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            crate::pool::run(move |py| {
                if let Err(e) = h.call_method0(py, "cancel") {
                    e.print(py);
                }
            });
        }
    }
}

/// Where an async handler's outcome goes (called once, by the app's loop).
#[pyclass(frozen, module = "ferry._native")]
pub struct Done {
    tx: Mutex<Option<tokio::sync::oneshot::Sender<Result<Reply, ErrorObject>>>>,
}

#[pymethods]
impl Done {
    /// Delivers the outcome (a second call does nothing).
    fn __call__(&self, py: Python<'_>, o: &Bound<'_, PyAny>) {
        let r = outcome(py, o);
        if let Some(tx) = self.tx.lock().ok().and_then(|mut g| g.take()) {
            // The call may be gone (cancelled): then nobody waits for its answer.
            let _ = tx.send(r);
        }
    }
}

/// `Context::keep`'s answer: the reference's JSON, or the error's code, message and data.
type KeepOutcome = (Option<String>, Option<(i64, String, Option<String>)>);

/// What a handler gets besides its params: cancellation, result tensors, the caller.
#[pyclass(frozen, module = "ferry._native")]
pub struct Context {
    ctx: CallContext,
}

#[pymethods]
impl Context {
    /// True once the call is cancelled (by the client, a timeout, `ferry.task.cancel`, or
    /// its connection closing). Long sync handlers should check it in their loops.
    #[getter]
    fn cancelled(&self) -> bool {
        self.ctx.is_cancelled()
    }

    /// Blocks up to `timeout` seconds (forever if None) for cancellation, the GIL released;
    /// returns whether the call is cancelled.
    #[pyo3(signature = (timeout=None))]
    fn wait_cancelled(&self, py: Python<'_>, timeout: Option<f64>) -> bool {
        let ctx = self.ctx.clone();
        py.detach(|| {
            runtime().block_on(async {
                match timeout {
                    Some(s) => tokio::time::timeout(Duration::from_secs_f64(s.max(0.0)), ctx.cancelled()).await.is_ok(),
                    None => {
                        ctx.cancelled().await;
                        true
                    }
                }
            })
        })
    }

    /// A writable tensor for the result in the connection's memory (shm for a ferry client
    /// on the same host: it goes back without a copy). Waits, the GIL released, while the
    /// connection's pool is full, until the call is cancelled.
    fn alloc(&self, py: Python<'_>, shape: Vec<u64>, dtype: &str) -> PyResult<OutTensor> {
        let meta = meta_of(shape, dtype)?;
        let ctx = self.ctx.clone();
        // A full pool makes this wait; a cancelled call stops waiting.
        let t = py
            .detach(|| {
                runtime().block_on(async {
                    tokio::select! {
                        r = ctx.alloc(meta) => r,
                        () = ctx.cancelled() => Err(ErrorObject::cancelled("the call was cancelled while allocating")),
                    }
                })
            })
            .map_err(|e| PyRuntimeError::new_err(format!("allocating a result tensor: {}", e.message)))?;
        Ok(OutTensor::new(t))
    }

    /// A writable tensor to keep as a reference ([`Context::keep`]): a shared segment of
    /// its own (lent without a copy to every ferry client on this host that fetches it),
    /// not the connection's memory, which it would hold while it lives.
    fn keep_alloc(&self, shape: Vec<u64>, dtype: &str) -> PyResult<OutTensor> {
        let meta = meta_of(shape, dtype)?;
        ferry_store::shared_tensor_mut(meta)
            .map(OutTensor::new)
            .map_err(|e| PyRuntimeError::new_err(format!("allocating a tensor to keep: {e}")))
    }

    /// Keeps `out` (from `keep_alloc`, filled) on the server as a reference owned by the
    /// caller, freed after `ttl` seconds if given. Returns `(info_json, None)`, the inside
    /// of its wire form (`RefInfo`), or `(None, (code, message, data_json))` past the
    /// server's reference limits (LIMIT_EXCEEDED naming the limit), for `RpcError`.
    #[pyo3(signature = (out, ttl=None))]
    fn keep(&self, out: &Bound<'_, OutTensor>, ttl: Option<f64>) -> PyResult<KeepOutcome> {
        let ttl = match ttl {
            Some(s) if !(s.is_finite() && s >= 0.0) => {
                return Err(PyValueError::new_err(format!("ttl={s}: seconds, finite and not negative")));
            }
            Some(s) => Some(Duration::from_secs_f64(s)),
            None => None,
        };
        let tensor = out.get().take()?;
        Ok(match self.ctx.keep(tensor, ttl) {
            Ok(r) => (
                Some(
                    serde_json::to_string(&r.0)
                        .map_err(|e| PyRuntimeError::new_err(format!("a reference's JSON: {e}")))?,
                ),
                None,
            ),
            Err(e) => (None, Some((e.code, e.message, e.data.map(|d| d.to_string())))),
        })
    }

    /// The caller: `{"kind", "addr", "pid", "uid", "agent", "channel"}`.
    #[getter]
    fn peer(&self) -> PyResult<String> {
        let p = self.ctx.peer();
        let v = serde_json::json!({
            "kind": format!("{:?}", p.kind).to_lowercase(),
            "addr": p.addr,
            "pid": p.pid,
            "uid": p.uid,
            "agent": p.agent,
            "channel": p.channel,
        });
        Ok(v.to_string())
    }
}

/// A method table with Python handlers, and its server once built.
#[pyclass(frozen, module = "ferry._native")]
pub struct Server {
    methods: Mutex<Option<Methods>>,
    title: String,
    version: String,
    description: Option<String>,
    limits: RpcLimits,
    built: std::sync::OnceLock<ferry_rpc::Server>,
    stop: CancellationToken,
}

impl Server {
    fn built(&self) -> &ferry_rpc::Server {
        self.built.get_or_init(|| {
            let methods = self.methods.lock().ok().and_then(|mut m| m.take());
            let mut b = ferry_rpc::Server::builder(methods.unwrap_or_default())
                .limits(self.limits)
                .title(self.title.clone())
                .version(self.version.clone())
                .spawner(crate::answer::spawner())
                // References kept by `ferry.ref.keep` in shared segments of their own, as
                // `ferry serve` keeps them: fetches over shm map them without a copy.
                .ref_copy(Arc::new(ferry_store::shared_copy));
            if let Some(d) = &self.description {
                b = b.description(d.clone());
            }
            b.build()
        })
    }
}

/// A positive, finite number of seconds as a duration, or an error naming the option.
fn seconds(option: &str, s: f64) -> PyResult<Duration> {
    if !(s.is_finite() && s > 0.0) {
        return Err(PyValueError::new_err(format!("{option} {s}: give a positive number of seconds")));
    }
    Ok(Duration::from_secs_f64(s))
}

fn parse_json(what: &str, text: &str) -> PyResult<Value> {
    serde_json::from_str(text).map_err(|e| PyValueError::new_err(format!("{what}: {e}")))
}

#[pymethods]
impl Server {
    /// A server for the API `title` `version`. Limits as `ferry serve`'s (see
    /// `ferry_rpc::RpcLimits`); `None` keeps the default.
    #[new]
    #[pyo3(signature = (title, version, description=None, *, max_connections=None, max_in_flight=None,
        max_request_bytes=None, max_tasks=None, max_tasks_per_identity=None, idle_timeout=None,
        max_queued_answers=None, max_queued_answer_bytes=None, max_refs=None, max_refs_per_identity=None,
        max_ref_bytes=None, ref_ttl=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        title: String,
        version: String,
        description: Option<String>,
        max_connections: Option<usize>,
        max_in_flight: Option<usize>,
        max_request_bytes: Option<usize>,
        max_tasks: Option<usize>,
        max_tasks_per_identity: Option<usize>,
        idle_timeout: Option<f64>,
        max_queued_answers: Option<usize>,
        max_queued_answer_bytes: Option<u64>,
        max_refs: Option<usize>,
        max_refs_per_identity: Option<usize>,
        max_ref_bytes: Option<u64>,
        ref_ttl: Option<f64>,
    ) -> PyResult<Server> {
        let mut limits = RpcLimits::default();
        if let Some(n) = max_connections {
            limits = limits.max_connections(n);
        }
        if let Some(n) = max_in_flight {
            limits = limits.max_in_flight(n);
        }
        if let Some(n) = max_request_bytes {
            limits = limits.max_request_bytes(n);
        }
        if let Some(n) = max_tasks {
            limits = limits.max_tasks(n);
        }
        if let Some(n) = max_tasks_per_identity {
            limits = limits.max_tasks_per_identity(n);
        }
        if let Some(n) = max_queued_answers {
            limits = limits.max_queued_answers(n);
        }
        if let Some(n) = max_queued_answer_bytes {
            limits = limits.max_queued_answer_bytes(n);
        }
        if let Some(n) = max_refs {
            limits = limits.max_refs(n);
        }
        if let Some(n) = max_refs_per_identity {
            limits = limits.max_refs_per_identity(n);
        }
        if let Some(n) = max_ref_bytes {
            limits = limits.max_ref_bytes(n);
        }
        if let Some(s) = idle_timeout {
            limits = limits.idle_timeout(seconds("idle_timeout", s)?);
        }
        if let Some(s) = ref_ttl {
            limits = limits.ref_ttl(seconds("ref_ttl", s)?);
        }
        Ok(Server {
            methods: Mutex::new(Some(Methods::new())),
            title,
            version,
            description,
            limits,
            built: std::sync::OnceLock::new(),
            stop: CancellationToken::new(),
        })
    }

    /// Registers a method. `params_schema` (an object schema whose properties are the
    /// params, in `param_names` order), `result_schema` and `defs` (schemas they refer to
    /// as `#/components/schemas/NAME`) are JSON texts.
    #[pyo3(signature = (name, call, *, is_async, params_schema, result_schema, defs, param_names,
        summary=None, description=None, deprecated=false, concurrency=None, allow_unknown_params=false))]
    #[allow(clippy::too_many_arguments)]
    fn add(
        &self,
        name: &str,
        call: Py<PyAny>,
        is_async: bool,
        params_schema: &str,
        result_schema: &str,
        defs: &str,
        param_names: Vec<String>,
        summary: Option<String>,
        description: Option<String>,
        deprecated: bool,
        concurrency: Option<usize>,
        allow_unknown_params: bool,
    ) -> PyResult<()> {
        let mut guard =
            self.methods.lock().map_err(|_| PyRuntimeError::new_err("the method table's lock was poisoned"))?;
        let Some(methods) = guard.as_mut() else {
            return Err(PyRuntimeError::new_err(
                "methods cannot be added once the server is built (served or discovered)",
            ));
        };
        let defs = match parse_json("defs", defs)? {
            Value::Object(m) => m,
            Value::Null => Default::default(),
            _ => return Err(PyValueError::new_err("defs: not a JSON object")),
        };
        let given = GivenSchemas {
            params: parse_json("params_schema", params_schema)?,
            result: parse_json("result_schema", result_schema)?,
            defs,
            param_names: param_names.clone(),
        };
        let info = MethodInfo {
            name: name.to_owned(),
            summary,
            description,
            deprecated,
            params: |_| schemars::Schema::from(true),
            result: |_| schemars::Schema::from(true),
            param_names: || None,
            additional_params: allow_unknown_params,
            given: Some(Arc::new(given)),
        };
        let handler = Arc::new(PyHandler { call: Arc::new(call), is_async, names: param_names });
        let doc = methods.register_erased(handler, info).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let doc = if allow_unknown_params { doc.allow_unknown_params() } else { doc };
        if let Some(n) = concurrency {
            if n == 0 {
                return Err(PyValueError::new_err("concurrency must be at least 1"));
            }
            doc.concurrency(n);
        }
        Ok(())
    }

    /// The OpenRPC document (`rpc.discover`'s answer), as JSON text. Builds the server:
    /// no method can be added afterwards.
    fn discover(&self) -> String {
        self.built().discover().to_string()
    }

    /// Serves on `addrs` (and `http`) until `stop()` or, in the main thread, a signal
    /// (Ctrl-C raises `KeyboardInterrupt` here after a clean shutdown). Calls
    /// `ready(addresses)` once everything listens; prints `listening on ...` if `announce`.
    #[pyo3(signature = (addrs, *, http=None, token=None, allow_unauthenticated=false, http_allow_origin=Vec::new(),
        http_allow_host=Vec::new(), shm_pool_mib=None, busy_poll_us=None, announce=true, ready=None))]
    #[allow(clippy::too_many_arguments)]
    fn serve(
        &self,
        py: Python<'_>,
        addrs: Vec<String>,
        http: Option<String>,
        token: Option<String>,
        allow_unauthenticated: bool,
        http_allow_origin: Vec<String>,
        http_allow_host: Vec<String>,
        shm_pool_mib: Option<u64>,
        busy_poll_us: Option<u64>,
        announce: bool,
        ready: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let server = self.built().clone();
        let busy_poll = match busy_poll_us {
            Some(us) if us > ferry_cli::cli_rpc::MAX_BUSY_POLL_US => {
                return Err(PyValueError::new_err(format!(
                    "busy_poll_us {us}: at most {}",
                    ferry_cli::cli_rpc::MAX_BUSY_POLL_US
                )));
            }
            Some(us) => Duration::from_micros(us),
            None => crate::busy_poll(),
        };
        crate::pool::set_spin(busy_poll);
        let opts = ServeOptions {
            addrs,
            http,
            busy_poll,
            shm_pool: shm_pool_mib.map(|m| m.saturating_mul(1 << 20)),
            access: Access {
                token,
                allow_unauthenticated,
                http_allow_origins: http_allow_origin,
                http_allow_hosts: http_allow_host,
                max_connections: self.limits.max_connections,
                max_queued_answers: self.limits.max_queued_answers,
                max_queued_answer_bytes: self.limits.max_queued_answer_bytes,
            },
        };
        let bound = py
            .detach(|| runtime().block_on(ferry_cli::cli_rpc::bind(&opts)))
            .map_err(|e| PyRuntimeError::new_err(format!("{e:#}")))?;
        let addresses = bound.addresses();
        if announce {
            bound.announce().map_err(|e| PyRuntimeError::new_err(format!("{e:#}")))?;
        }
        let stop = self.stop.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        // Waited on with the GIL released, so shared with that closure.
        let rx = Mutex::new(rx);
        let wait = |d: Duration| match rx.lock() {
            Ok(rx) => rx.recv_timeout(d),
            Err(_) => Err(std::sync::mpsc::RecvTimeoutError::Disconnected),
        };
        let s = server.clone();
        runtime().spawn(async move {
            let r = ferry_cli::cli_rpc::run(bound, &s, async move {
                stop.cancelled().await;
                Ok(())
            })
            .await;
            let _ = tx.send(r);
        });
        if let Some(cb) = ready
            && let Err(e) = cb.call1(py, (addresses,))
        {
            self.stop.cancel();
            let _ = py.detach(|| wait(Duration::from_secs(10)));
            return Err(e);
        }
        loop {
            match py.detach(|| wait(Duration::from_millis(50))) {
                Ok(r) => return r.map_err(|e| PyRuntimeError::new_err(format!("{e:#}"))),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(PyRuntimeError::new_err("the server task ended without a result"));
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            }
            if let Err(e) = py.check_signals() {
                // Stop serving first, then let the signal's exception through.
                self.stop.cancel();
                let _ = py.detach(|| wait(Duration::from_secs(10)));
                return Err(e);
            }
        }
    }

    /// Stops `serve` (from another thread or a signal handler): listeners close, calls
    /// in flight are cancelled.
    fn stop(&self) {
        self.stop.cancel();
    }
}
