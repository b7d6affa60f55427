//! `ferry.Client` / `ferry.AsyncClient`: the JSON-RPC client of the Rust core
//! ([`ferry_rpc::Client`]) for Python. `python/ferry/_client.py` is the thin, typed face;
//! this module does the work.
//!
//! - Connecting (`Client.connect`, `Client.connect_async`): every address the
//!   endpoint knows (`unix:NAME`, `unix:/path.sock`, `quic://host:port#sha256=PIN`), a
//!   bearer token, and `connect_timeout`: connecting again (backing off up to 0.2 s) until a
//!   server that is starting listens, for at most that long.
//! - Calls (`call`, `notify`, `batch`, `discover`): params turned into JSON and
//!   tensors in one walk ([`convert`]), tensors sent from the connection's memory (shm:
//!   zero-copy), results' tensors handed to Python as read-only views. A blocking call
//!   releases the GIL while it waits; an asyncio one is a task on the runtime whose future
//!   is resolved from it ([`settle`]).
//! - Lifecycle: `closed` is true as soon as the server closed the connection (the Rust
//!   client reads all the time), `close_reason` says why; `keepalive` sends a notification
//!   that does nothing (`ferry.cancel` of id 0, which no call has) every so often, so a
//!   server's `idle_timeout` does not close a connection its client still holds.
//! - Errors ([`errors`]): the classes of `ferry.errors`, each message naming the address.

pub mod convert;
pub mod errors;
pub mod settle;

use std::time::{Duration, Instant};

use ferry_core::{Pipe, PipeError, Tensor};
use ferry_rpc::CallError;
use pyo3::prelude::*;
use pyo3::types::PyList;
use serde_json::Value;

use crate::pipe::wait_limit;
use crate::runtime;
use crate::tensors::{OutTensor, meta_of};
use convert::{Decoder, Encoder};
use settle::Pending;

/// The Python functions a client's params and results go through (`ferry._client`).
struct Hooks {
    /// Anything not plain JSON in params: a tensor to send, a stand-in, or `None`.
    encode: Py<PyAny>,
    /// A received `TensorRef` as a numpy array.
    numpy: Py<PyAny>,
    /// A received `TensorRef` as a torch tensor.
    torch: Py<PyAny>,
    /// The inside of `{"$tensor_ref": ..}` as a reference object.
    tensor_ref: Py<PyAny>,
}

/// Stops the keep-alive task with the client.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A connection to a ferry JSON-RPC server.
#[pyclass(frozen, module = "ferry._native")]
pub struct Client {
    rpc: ferry_rpc::Client,
    addr: String,
    hooks: Hooks,
    _keepalive: Option<AbortOnDrop>,
}

/// An endpoint without shared memory (neither the shm channel nor the ring): tensors travel
/// inline in the socket's bytes (`connect(shm=False)`).
fn no_shm_endpoint(token: Option<String>) -> ferry_core::Endpoint {
    let mut b = ferry_core::Endpoint::builder();
    for t in ferry::transports() {
        b = b.transport(t);
    }
    for c in ferry::channels().into_iter().filter(|c| c.name() != "shm") {
        b = b.channel(c);
    }
    if let Some(t) = token {
        b = b.token(t.clone()).require_token(t);
    }
    b.build()
}

/// What a connect is given, checked.
struct Target {
    addr: String,
    endpoint: ferry_core::Endpoint,
    wait: Option<Duration>,
    waited: Option<f64>,
    keepalive: Option<Duration>,
    /// The last failure of the attempts that `connect_timeout` ran out on.
    last: Option<String>,
}

impl Target {
    fn new(
        addr: &str,
        token: Option<String>,
        connect_timeout: Option<f64>,
        shm_pool_mib: Option<u64>,
        keepalive: Option<f64>,
        shm: bool,
    ) -> PyResult<Target> {
        let wait = wait_limit("connect(connect_timeout=...)", connect_timeout)?;
        let keepalive = wait_limit("connect(keepalive=...)", keepalive)?.filter(|d| !d.is_zero());
        Ok(Target {
            addr: addr.to_owned(),
            endpoint: if shm { crate::pipe::endpoint(token, shm_pool_mib)? } else { no_shm_endpoint(token) },
            wait: wait.or(connect_timeout.map(|_| Duration::MAX)),
            waited: connect_timeout,
            keepalive,
            last: None,
        })
    }

    /// Connects, again and again while nothing listens yet, until `wait` is over.
    async fn open(mut self) -> (Target, Result<Pipe, PipeError>) {
        let Some(wait) = self.wait else {
            let r = self.endpoint.connect(&self.addr).await;
            return (self, r);
        };
        let deadline = Instant::now().checked_add(wait);
        let mut backoff = Duration::from_millis(10);
        let r = loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let attempt = self.endpoint.connect(&self.addr);
            let r = match left {
                Some(left) => match tokio::time::timeout(left, attempt).await {
                    Ok(r) => r,
                    Err(_) => break Err(PipeError::Timeout(wait, "connect_timeout")),
                },
                None => attempt.await,
            };
            match r {
                Err(e @ (PipeError::Transport(_) | PipeError::Closed | PipeError::PeerGone)) => {
                    if deadline.is_some_and(|d| Instant::now() + backoff >= d) {
                        self.last = Some(e.to_string());
                        break Err(PipeError::Timeout(wait, "connect_timeout"));
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                }
                r => break r,
            }
        };
        (self, r)
    }

    /// The client over `pipe`, with its keep-alive task.
    fn client(self, pipe: Pipe, hooks: Hooks) -> Client {
        let rpc = ferry_rpc::Client::new(pipe);
        let keepalive = self.keepalive.map(|every| {
            let c = rpc.clone();
            AbortOnDrop(runtime().spawn(async move {
                let ping = serde_json::json!({ "id": 0 });
                loop {
                    tokio::time::sleep(every).await;
                    if c.pipe().is_closed() || c.notify("ferry.cancel", &ping).await.is_err() {
                        return;
                    }
                }
            }))
        });
        Client { rpc, addr: self.addr, hooks, _keepalive: keepalive }
    }
}

fn hooks(h: (Py<PyAny>, Py<PyAny>, Py<PyAny>, Py<PyAny>)) -> Hooks {
    Hooks { encode: h.0, numpy: h.1, torch: h.2, tensor_ref: h.3 }
}

/// One thing the client does on the runtime, and what it gives back.
enum Op {
    Call { method: String, params: Option<Value>, tensors: Vec<Tensor> },
    Notify { method: String, params: Option<Value>, tensors: Vec<Tensor> },
    Batch { calls: Vec<(String, Option<Value>)>, tensors: Vec<Tensor> },
}

enum Outcome {
    Value(Value, Vec<Tensor>),
    Batch(Vec<Result<(Value, Vec<Tensor>), ferry_rpc::ErrorObject>>),
    Unit,
}

impl Op {
    async fn run(self, rpc: ferry_rpc::Client, limit: Option<Duration>) -> Result<Outcome, CallError> {
        match self {
            Op::Call { method, params, tensors } => {
                rpc.call_raw(&method, params, tensors, limit).await.map(|(v, t)| Outcome::Value(v, t))
            }
            Op::Notify { method, params, tensors } => {
                let req = ferry_rpc::jsonrpc::request(None, &method, params);
                let r = rpc.pipe().send(ferry_core::Message::with_tensors(req, tensors)).await;
                r.map(|()| Outcome::Unit)
                    .map_err(|e| if e.is_closed() { CallError::Closed(e) } else { CallError::Pipe(e) })
            }
            Op::Batch { calls, tensors } => {
                let calls: Vec<(&str, Option<Value>)> = calls.iter().map(|(m, p)| (m.as_str(), p.clone())).collect();
                let all = rpc.batch(&calls, tensors);
                let r = match limit {
                    Some(d) => tokio::time::timeout(d, all).await.map_err(|_| CallError::Timeout(d))?,
                    None => all.await,
                };
                r.map(Outcome::Batch)
            }
        }
    }
}

/// `params` as JSON (`None` stays absent), its tensors beside.
fn encode(slf: &Bound<'_, Client>, params: &Bound<'_, PyAny>, tensors: &mut Vec<Tensor>) -> PyResult<Option<Value>> {
    let py = slf.py();
    if params.is_none() {
        return Ok(None);
    }
    let hook = slf.get().hooks.encode.bind(py);
    let mut enc = Encoder { hook, client: slf.as_any(), tensors: std::mem::take(tensors) };
    let r = enc.value(params, &mut "params".to_owned(), 0);
    *tensors = enc.tensors;
    let r = r?;
    crate::device::check_channels(py, slf.get().rpc.pipe().info(), tensors, "the params")?;
    match r {
        v @ (Value::Object(_) | Value::Array(_)) => Ok(Some(v)),
        other => Err(errors::params_error(
            py,
            format!("params must be a dict (by name), a list or tuple (by position) or None, not {other:.60}"),
        )),
    }
}

fn op(slf: &Bound<'_, Client>, kind: &str, method: String, params: &Bound<'_, PyAny>) -> PyResult<Op> {
    let mut tensors = Vec::new();
    let params = encode(slf, params, &mut tensors)?;
    Ok(match kind {
        "notify" => Op::Notify { method, params, tensors },
        _ => Op::Call { method, params, tensors },
    })
}

fn batch_op(slf: &Bound<'_, Client>, calls: &Bound<'_, PyAny>) -> PyResult<Op> {
    let mut tensors = Vec::new();
    let mut out = Vec::new();
    for c in calls.try_iter()? {
        let (method, params): (String, Bound<'_, PyAny>) = c?.extract()?;
        let params = encode(slf, &params, &mut tensors)?;
        out.push((method, params));
    }
    Ok(Op::Batch { calls: out, tensors })
}

impl Client {
    /// An outcome as Python objects (`as_torch`: tensors as torch tensors).
    fn finish(&self, py: Python<'_>, r: Result<Outcome, CallError>, as_torch: bool) -> PyResult<Py<PyAny>> {
        finish(py, &self.addr, &self.hooks, r, as_torch)
    }
}

fn finish(
    py: Python<'_>,
    addr: &str,
    hooks: &Hooks,
    r: Result<Outcome, CallError>,
    as_torch: bool,
) -> PyResult<Py<PyAny>> {
    let tensor = if as_torch { hooks.torch.bind(py) } else { hooks.numpy.bind(py) };
    let tensor_ref = hooks.tensor_ref.bind(py);
    match r.map_err(|e| errors::call_error(py, addr, e))? {
        Outcome::Unit => Ok(py.None()),
        Outcome::Value(v, tensors) => {
            Ok(Decoder { tensor, tensor_ref, tensors: &tensors, numpy: !as_torch }.decode(py, &v)?.unbind())
        }
        Outcome::Batch(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(match item {
                    Ok((v, tensors)) => {
                        Decoder { tensor, tensor_ref, tensors: &tensors, numpy: !as_torch }.decode(py, &v)?
                    }
                    Err(e) => errors::call_error(py, addr, CallError::Rpc(e)).into_value(py).into_bound(py).into_any(),
                })?;
            }
            Ok(list.into_any().unbind())
        }
    }
}

#[pymethods]
impl Client {
    /// Connects to `addr` (GIL released). `hooks`: `(encode, numpy, torch, tensor_ref)`
    /// of `ferry._client`.
    #[staticmethod]
    #[pyo3(signature = (addr, hooks, *, token=None, connect_timeout=None, shm_pool_mib=None, keepalive=None, shm=true))]
    #[allow(clippy::too_many_arguments)]
    fn connect(
        py: Python<'_>,
        addr: &str,
        hooks: (Py<PyAny>, Py<PyAny>, Py<PyAny>, Py<PyAny>),
        token: Option<String>,
        connect_timeout: Option<f64>,
        shm_pool_mib: Option<u64>,
        keepalive: Option<f64>,
        shm: bool,
    ) -> PyResult<Client> {
        let target = Target::new(addr, token, connect_timeout, shm_pool_mib, keepalive, shm)?;
        let (target, r) = py.detach(|| runtime().block_on(target.open()));
        let pipe = r.map_err(|e| errors::connect_error(py, addr, &e, target.waited, target.last.as_deref()))?;
        let _rt = runtime().enter();
        Ok(target.client(pipe, self::hooks(hooks)))
    }

    /// [`Client::connect`] for asyncio: resolves `future` on `event_loop` with the client.
    #[staticmethod]
    #[pyo3(signature = (event_loop, future, addr, hooks, *, token=None, connect_timeout=None, shm_pool_mib=None, keepalive=None, shm=true))]
    #[allow(clippy::too_many_arguments)]
    fn connect_async(
        event_loop: Py<PyAny>,
        future: Py<PyAny>,
        addr: &str,
        hooks: (Py<PyAny>, Py<PyAny>, Py<PyAny>, Py<PyAny>),
        token: Option<String>,
        connect_timeout: Option<f64>,
        shm_pool_mib: Option<u64>,
        keepalive: Option<f64>,
        shm: bool,
    ) -> PyResult<Pending> {
        let target = Target::new(addr, token, connect_timeout, shm_pool_mib, keepalive, shm)?;
        let addr = addr.to_owned();
        let work = async move {
            let (target, r) = target.open().await;
            match r {
                Ok(p) => Ok(target.client(p, self::hooks(hooks))),
                Err(e) => Err((e, target.waited, target.last)),
            }
        };
        Ok(settle::start(event_loop, future, work, move |py, r| match r {
            Ok(c) => Ok(Py::new(py, c)?.into_any()),
            Err((e, waited, last)) => Err(errors::connect_error(py, &addr, &e, waited, last.as_deref())),
        }))
    }

    /// The address connected to.
    #[getter]
    fn address(&self) -> &str {
        &self.addr
    }

    /// The negotiated channel (`shm`, `inline`, `quic`, ...).
    #[getter]
    fn channel(&self) -> String {
        self.rpc.pipe().channel().to_owned()
    }

    /// The transport (`unix`, `quic`).
    #[getter]
    fn transport(&self) -> &'static str {
        self.rpc.pipe().transport()
    }

    /// True once the connection ended (the server closed it or went away, or `close`).
    #[getter]
    fn closed(&self) -> bool {
        self.rpc.pipe().is_closed() || self.rpc.close_reason().is_some()
    }

    /// Why the connection ended, in words (`None` while open).
    #[getter]
    fn close_reason(&self) -> Option<String> {
        match self.rpc.close_reason() {
            Some(e) => Some(e.to_string()),
            None if self.rpc.pipe().is_closed() => Some(PipeError::Closed.to_string()),
            None => None,
        }
    }

    /// A writable tensor in this connection's memory (shm: sent without a copy).
    fn alloc(&self, py: Python<'_>, shape: Vec<u64>, dtype: &str) -> PyResult<OutTensor> {
        let meta = meta_of(shape, dtype)?;
        let p = self.rpc.clone();
        let t = py
            .detach(|| crate::pipe::now_or_block(async move { p.pipe().alloc(meta).await }))
            .map_err(|e| errors::pipe_error(py, &self.addr, "allocating a tensor", &e))?;
        Ok(OutTensor::new(t))
    }

    /// A device tensor on `cuda:device` in the connection's cuda-ipc memory (passed in
    /// params, it travels without a copy); its contents are unspecified until written.
    #[pyo3(signature = (shape, dtype, device=0))]
    fn alloc_device(
        &self,
        py: Python<'_>,
        shape: Vec<u64>,
        dtype: &str,
        device: u32,
    ) -> PyResult<crate::device::DeviceTensor> {
        let meta = crate::device::device_meta(shape, dtype, device)?;
        let p = self.rpc.clone();
        let t = py
            .detach(|| runtime().block_on(async move { p.pipe().alloc_device(meta).await }))
            .map_err(|e| crate::device::device_error(py, format!("{}: allocating a device tensor: {e}", self.addr)))?;
        Ok(crate::device::DeviceTensor::allocated(t))
    }

    /// The channel negotiated for CUDA tensors (`"cuda-ipc"`), or `None`.
    #[getter]
    fn device_channel(&self) -> Option<String> {
        self.rpc.pipe().info().channels.get(&ferry_core::DeviceKind::Cuda).cloned()
    }

    /// Calls `method` (GIL released while it waits, up to `timeout` seconds; `None`: no
    /// limit) and returns its result, tensors as numpy arrays (torch with `as_torch`).
    #[pyo3(signature = (method, params, timeout, as_torch))]
    fn call(
        slf: &Bound<'_, Self>,
        method: String,
        params: &Bound<'_, PyAny>,
        timeout: Option<f64>,
        as_torch: bool,
    ) -> PyResult<Py<PyAny>> {
        slf.get().run(slf.py(), op(slf, "call", method, params)?, timeout, as_torch)
    }

    /// Sends a notification (no answer).
    fn notify(slf: &Bound<'_, Self>, method: String, params: &Bound<'_, PyAny>) -> PyResult<()> {
        slf.get().run(slf.py(), op(slf, "notify", method, params)?, None, false).map(drop)
    }

    /// Calls `[(method, params)]` in one message; a list of results, an `RpcError` in
    /// place of each call that failed.
    #[pyo3(signature = (calls, timeout, as_torch))]
    fn batch(
        slf: &Bound<'_, Self>,
        calls: &Bound<'_, PyAny>,
        timeout: Option<f64>,
        as_torch: bool,
    ) -> PyResult<Py<PyAny>> {
        slf.get().run(slf.py(), batch_op(slf, calls)?, timeout, as_torch)
    }

    /// [`Client::call`] (`kind` `"call"`), `notify` (`"notify"`) or `batch` (`"batch"`,
    /// `params` the calls) for asyncio: resolves `future` on `event_loop`.
    #[pyo3(signature = (event_loop, future, kind, method, params, timeout, as_torch))]
    #[allow(clippy::too_many_arguments)]
    fn start(
        slf: &Bound<'_, Self>,
        event_loop: Py<PyAny>,
        future: Py<PyAny>,
        kind: &str,
        method: String,
        params: &Bound<'_, PyAny>,
        timeout: Option<f64>,
        as_torch: bool,
    ) -> PyResult<Pending> {
        let (py, this) = (slf.py(), slf.get());
        let limit = wait_limit(kind, timeout)?;
        let op = match kind {
            "batch" => batch_op(slf, params)?,
            _ => op(slf, kind, method, params)?,
        };
        let (rpc, addr) = (this.rpc.clone(), this.addr.clone());
        let hooks = Hooks {
            encode: this.hooks.encode.clone_ref(py),
            numpy: this.hooks.numpy.clone_ref(py),
            torch: this.hooks.torch.clone_ref(py),
            tensor_ref: this.hooks.tensor_ref.clone_ref(py),
        };
        Ok(settle::start(event_loop, future, op.run(rpc, limit), move |py, r| finish(py, &addr, &hooks, r, as_torch)))
    }

    /// Closes the connection; calls waiting fail with `ConnectionClosed`.
    fn close(&self, py: Python<'_>) {
        let rpc = self.rpc.clone();
        py.detach(|| runtime().block_on(async move { rpc.close().await }));
    }

    fn __repr__(&self) -> String {
        let state = if self.closed() { "closed" } else { "open" };
        format!("Client({} via {}, {state})", self.addr, self.rpc.pipe().channel())
    }
}

impl Client {
    fn run(&self, py: Python<'_>, op: Op, timeout: Option<f64>, as_torch: bool) -> PyResult<Py<PyAny>> {
        let limit = wait_limit("call", timeout)?;
        let rpc = self.rpc.clone();
        let r = py.detach(|| match op {
            // Sent and waited for on this thread, which reads the answer itself (the wait
            // policy's spin on a same-host ring, then its futex): no runtime wake-up.
            Op::Call { method, params, tensors } => {
                rpc.call_raw_blocking(&method, params, tensors, limit).map(|(v, t)| Outcome::Value(v, t))
            }
            op => runtime().block_on(op.run(rpc, limit)),
        });
        self.finish(py, r, as_torch)
    }
}
