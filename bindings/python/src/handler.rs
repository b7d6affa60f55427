//! Python handlers behind the JSON-RPC server ([`crate::server`]).
//!
//! A handler is a Python callable made by `ferry.App` (it validates params with pydantic,
//! calls the user's function, encodes the result):
//!
//! - sync: `call(params | None, [TensorRef], Context) -> outcome`, run on a thread of
//!   [`crate::pool`] with the GIL, once [`crate::gate`] admits it (`params`: the params by
//!   name, as a `dict` like `json.loads` makes it (see [`crate::json`]) for a method whose
//!   params are all plain types (`fast_params`), else as compact JSON `bytes`, written
//!   without the GIL, for pydantic's `model_validate_json`);
//! - async: `call(params | None, [TensorRef], Context, Done) -> handle`: it schedules
//!   the coroutine on the app's asyncio loop and returns at once; the loop calls
//!   `Done(outcome)` when it ends; dropping the call (cancelled, timed out, connection
//!   gone) calls `handle.cancel()`, which raises `CancelledError` in the coroutine.
//!
//! A call whose call is gone (cancelled, its connection closed) before its job starts never
//! calls Python.
//!
//! An outcome is `(result_json, [OutTensor | TensorRef])` or `(code, message, data_json | None)`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_core::Tensor;
use ferry_rpc::method::{ErasedHandler, HandlerFuture};
use ferry_rpc::{CallContext, ErrorObject, Reply};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use serde_json::Value;

use crate::device::DeviceTensor;
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
                } else if let Ok(d) = o.cast::<DeviceTensor>() {
                    tensors.push(d.get().tensor.clone());
                } else {
                    return Err(ErrorObject::internal(
                        "result tensor: neither an OutTensor, a TensorRef nor a DeviceTensor",
                    ));
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

/// The received tensors as a Python list of [`TensorRef`] (host) and [`DeviceTensor`].
fn refs<'py>(py: Python<'py>, tensors: Vec<Tensor>) -> PyResult<Bound<'py, PyList>> {
    let items: Vec<Py<PyAny>> = tensors.into_iter().map(|t| crate::device::received(py, t)).collect::<PyResult<_>>()?;
    PyList::new(py, items)
}

/// A call's params as they go to Python (see the module docs).
enum Params {
    None,
    /// For `fast_params` methods: converted to a `dict` on the handler's thread.
    Value(Value),
    /// Compact JSON, for pydantic to parse and validate in one pass.
    Json(Vec<u8>),
}

impl Params {
    fn to_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self {
            Params::None => Ok(py.None().into_bound(py)),
            Params::Value(v) => crate::json::to_py(py, v),
            Params::Json(b) => Ok(PyBytes::new(py, b).into_any()),
        }
    }

    /// About how many bytes of JSON they are (exact for [`Params::Json`]).
    fn size(&self) -> usize {
        match self {
            Params::None => 0,
            Params::Value(v) => crate::json::approx_size(v),
            Params::Json(b) => b.len(),
        }
    }
}

/// A Python handler.
pub(crate) struct PyHandler {
    /// The app's wrapper of the user's function (see the module docs).
    pub(crate) call: Arc<Py<PyAny>>,
    /// Whether it schedules a coroutine (else it runs on a pool thread).
    pub(crate) is_async: bool,
    /// Its params in positional order.
    pub(crate) names: Vec<String>,
    /// Whether its params are all plain types (validated from a `dict` without pydantic).
    pub(crate) fast_params: bool,
    /// Its server's admission of handler runs.
    pub(crate) gate: Arc<crate::gate::Gate>,
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
                let v = self.named_params(v)?;
                if self.fast_params {
                    Params::Value(v)
                } else {
                    // Written here, without the GIL, and the parsed tree freed at once (it
                    // takes several times the text's size while the call waits).
                    Params::Json(
                        serde_json::to_vec(&v).map_err(|e| ErrorObject::internal(format!("params JSON: {e}")))?,
                    )
                }
            }
            None => Params::None,
        };
        let call = self.call.clone();
        if !self.is_async {
            let mut admission = self.gate.admit(&ctx)?;
            let follower = ctx.follower();
            return Ok(Box::pin(async move {
                let room = admission.params(params.size()).await;
                let Some(slot) = admission.run_slot().await else {
                    return Err(ErrorObject::internal("the server's handler slots are closed"));
                };
                let (tx, rx) = tokio::sync::oneshot::channel();
                crate::pool::run(move |py| {
                    // Held until the handler returns, cancelled or not.
                    let held = (admission, room, slot);
                    if tx.is_closed() || ctx.is_cancelled() {
                        // The call is gone (cancelled, its connection closed): never start it.
                        return;
                    }
                    let r = match params.to_py(py).and_then(|p| Ok((p, refs(py, tensors)?))) {
                        Ok((params, refs)) => match call.call1(py, (params, refs, Context { ctx })) {
                            Ok(o) => outcome(py, o.bind(py)),
                            Err(e) => Err(internal_from(py, &e)),
                        },
                        Err(e) => Err(internal_from(py, &e)),
                    };
                    // Freed before the answer goes: a client that waits for it and calls
                    // again finds its place.
                    drop(held);
                    // The call may be gone (cancelled): then nobody waits for its answer.
                    let _ = crate::answer::delivering(|| tx.send(r));
                    // Once the answer is out, this thread reads the connection's next request.
                    if let Some(f) = follower {
                        crate::pool::follow_after(f);
                    }
                });
                rx.await.unwrap_or_else(|_| Err(ErrorObject::internal("the handler's thread ended without an answer")))
            }));
        }
        // Async handlers hold no thread while they run (a cancelled one gets
        // `CancelledError`): only their params' room is bounded.
        let gate = self.gate.clone();
        Ok(Box::pin(async move {
            let room = gate.param_room(params.size()).await;
            let (tx, rx) = tokio::sync::oneshot::channel();
            let (started_tx, started) = tokio::sync::oneshot::channel();
            crate::pool::run(move |py| {
                if started_tx.is_closed() || ctx.is_cancelled() {
                    return;
                }
                let done = Done { tx: Mutex::new(Some(tx)) };
                let r = match params.to_py(py).and_then(|p| Ok((p, refs(py, tensors)?))) {
                    Ok((params, refs)) => {
                        call.call1(py, (params, refs, Context { ctx }, done)).map_err(|e| internal_from(py, &e))
                    }
                    Err(e) => Err(internal_from(py, &e)),
                };
                // The handle travels armed: a call dropped (cancelled) before it took the
                // handle out of the channel drops it there, or here when the channel is
                // gone, and either drop cancels the task. A bare handle would be dropped
                // unseen, and the coroutine would run on though its call was answered
                // `cancelled`.
                let r = r.map(|h| CancelOnDrop(Some(h)));
                let _ = crate::answer::delivering(|| started_tx.send(r));
            });
            let mut guard = started
                .await
                .unwrap_or_else(|_| Err(ErrorObject::internal("the handler's thread ended without starting it")))?;
            let r = rx
                .await
                .unwrap_or_else(|_| Err(ErrorObject::internal("the app's event loop stopped before the call ended")));
            guard.0 = None;
            drop(room);
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
    fn wait_cancelled(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let limit = crate::pipe::wait_limit("wait_cancelled", timeout)?;
        let ctx = self.ctx.clone();
        Ok(py.detach(|| {
            runtime().block_on(async {
                match limit {
                    Some(d) => tokio::time::timeout(d, ctx.cancelled()).await.is_ok(),
                    None => {
                        ctx.cancelled().await;
                        true
                    }
                }
            })
        }))
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
                crate::pipe::now_or_block(async {
                    tokio::select! {
                        biased;
                        () = ctx.cancelled() => Err(ErrorObject::cancelled("the call was cancelled while allocating")),
                        r = ctx.alloc(meta) => r,
                    }
                })
            })
            .map_err(|e| PyRuntimeError::new_err(format!("allocating a result tensor: {}", e.message)))?;
        Ok(OutTensor::new(t))
    }

    /// A device tensor on `cuda:device` for the result, in the memory of the caller's
    /// cuda-ipc channel (it goes back without a copy); contents unspecified until written.
    /// `DeviceTensorError` when the caller has no channel for CUDA tensors.
    #[pyo3(signature = (shape, dtype, device=0))]
    fn alloc_device(&self, py: Python<'_>, shape: Vec<u64>, dtype: &str, device: u32) -> PyResult<DeviceTensor> {
        let meta = crate::device::device_meta(shape, dtype, device)?;
        let ctx = self.ctx.clone();
        let t = py
            .detach(|| {
                runtime().block_on(async {
                    tokio::select! {
                        r = ctx.alloc_device(meta) => r,
                        () = ctx.cancelled() => Err(ErrorObject::cancelled("the call was cancelled while allocating")),
                    }
                })
            })
            .map_err(|e| crate::device::device_error(py, format!("allocating a device tensor: {}", e.message)))?;
        Ok(DeviceTensor::allocated(t))
    }

    /// The channel the caller's connection negotiated for CUDA tensors (`"cuda-ipc"`), or
    /// `None` (CUDA results cannot go back to it).
    #[getter]
    fn device_channel(&self) -> Option<String> {
        self.ctx.device_channel(ferry_core::DeviceKind::Cuda).map(str::to_owned)
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
    /// caller, freed after `ttl` seconds if given (at most 365 days). Returns `(info_json, None)`, the inside
    /// of its wire form (`RefInfo`), or `(None, (code, message, data_json))` past the
    /// server's reference limits (LIMIT_EXCEEDED naming the limit), for `RpcError`.
    #[pyo3(signature = (out, ttl=None))]
    fn keep(&self, out: &Bound<'_, OutTensor>, ttl: Option<f64>) -> PyResult<KeepOutcome> {
        use ferry_rpc::remote::MAX_REF_TTL;
        let ttl = match ttl {
            Some(s) if !(s.is_finite() && s >= 0.0 && s <= MAX_REF_TTL.as_secs_f64()) => {
                return Err(PyValueError::new_err(format!(
                    "ttl={s}: seconds, finite, not negative and at most {} (365 days, MAX_REF_TTL)",
                    MAX_REF_TTL.as_secs()
                )));
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
