//! `ferry.listen` / `ferry.connect`: pipes between two processes without JSON-RPC, as
//! TensorPipe offers them: a message is a JSON header and tensors, zero-copy over shm in
//! both directions. Every wait releases the GIL.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_core::spin::{self, Spin, SpinHistory, Waited};
use ferry_core::{Endpoint, Tensor};
use pyo3::exceptions::{PyBrokenPipeError, PyConnectionError, PyTimeoutError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyList;
use tokio::sync::Mutex as AsyncMutex;

use crate::device::{DeviceTensor, check_channels, device_meta};
use crate::runtime;
use crate::tensors::{OutTensor, TensorRef, Whole, meta_of};

/// The shm channel's options for `ferry.listen` / `ferry.connect`: its errors name what
/// Python sets (`shm_pool_mib=`), not Rust fields.
fn shm_options(shm_pool_mib: Option<u64>) -> PyResult<ferry::ferry_shm::ShmOptions> {
    let mut o = ferry::ferry_shm::ShmOptions::default();
    if let Some(m) = shm_pool_mib {
        if m < 2 {
            return Err(PyValueError::new_err(format!(
                "shm_pool_mib={m}: the pool needs at least 2 MiB (segments grow in 2 MiB steps)"
            )));
        }
        o.pool_limit = m.saturating_mul(1 << 20);
    }
    o.names = ferry::ferry_shm::ShmOptionNames {
        pool_limit: "shm_pool_mib=N of ferry.connect / ferry.listen (default 2048)".into(),
        full_wait: None,
    };
    Ok(o)
}

/// The endpoint pipes use: every transport and channel this build has.
pub(crate) fn endpoint(token: Option<String>, shm_pool_mib: Option<u64>) -> PyResult<Endpoint> {
    let mut b = ferry::endpoint_with_shm(shm_options(shm_pool_mib)?);
    // The same-host ring wherever the peer has one too (unix sockets on Linux): `recv`
    // then waits on the ring itself (`Pipe::recv_blocking`).
    #[cfg(target_os = "linux")]
    {
        b = ferry::RingExt::ring(b, Some(ferry::RingOptions::default()));
    }
    if let Some(t) = token {
        b = b.token(t.clone()).require_token(t);
    }
    Ok(b.build())
}

fn io_err(what: &str, e: impl std::fmt::Display) -> PyErr {
    PyConnectionError::new_err(format!("{what}: {e}"))
}

/// A failed send in Python's words: a dead peer is `BrokenPipeError` (a `ConnectionError`),
/// a deadline passed is `TimeoutError`, the rest `ConnectionError`.
fn send_err(e: ferry_core::PipeError, timeout: Option<f64>, closed: bool) -> PyErr {
    match e {
        ferry_core::PipeError::PeerGone => PyBrokenPipeError::new_err(
            "sending: the peer is gone (its process exited, crashed or was killed while this send waited for it \
             to read); the pipe is closed: connect again",
        ),
        ferry_core::PipeError::Timeout(..) => {
            let s = timeout.unwrap_or_default();
            let what = if closed {
                "the message was cut off part-way, so the pipe is closed"
            } else {
                "nothing was sent and the pipe is still open"
            };
            PyTimeoutError::new_err(format!(
                "send(timeout={s}): the peer did not take the message within {s} s (it is not reading); {what}. \
                 Pass a longer timeout, or timeout=None to wait until it reads"
            ))
        }
        e => io_err("sending", e),
    }
}

/// A Python `timeout` in seconds as a wait limit: `None` (or one too long to be a
/// deadline, `inf` included) waits for ever; NaN and negative numbers are a `ValueError`
/// naming `call` and what to pass.
pub(crate) fn wait_limit(call: &str, timeout: Option<f64>) -> PyResult<Option<Duration>> {
    match timeout {
        None => Ok(None),
        Some(s) if s.is_nan() || s < 0.0 => Err(PyValueError::new_err(format!(
            "{call}(timeout={s}): timeout is a number of seconds >= 0, or None to wait for ever"
        ))),
        Some(s) => {
            Ok(Duration::try_from_secs_f64(s).ok().filter(|d| std::time::Instant::now().checked_add(*d).is_some()))
        }
    }
}

/// Whether the pipe agreed on the same-host ring.
fn uses_ring(p: &ferry_core::Pipe) -> bool {
    p.info().features.iter().any(|f| f == "ring")
}

/// The next message if it comes within the spin the wait policy allows
/// ([`ferry_core::spin::decide`]: `ferry serve`'s busy-poll window, unless the machine is
/// overloaded or this pipe's last spin missed and its answer then took long): looked for
/// without parking this thread, so that a reply arriving soon costs no thread wake-up (a
/// peer answering at once is the common case of a request/response pipe).
fn spin_recv(
    p: &ferry_core::Pipe,
    history: &Mutex<SpinHistory>,
) -> Option<Result<ferry_core::Message, ferry_core::PipeError>> {
    let start = std::time::Instant::now();
    let h = *history.lock().unwrap_or_else(|e| e.into_inner());
    let Spin::Poll(window) = spin::decide_alone(h.window(), &h, start) else { return None };
    let _rt = runtime().enter();
    let until = start + window;
    loop {
        // `recv` is cancel-safe: a future dropped unfinished takes nothing.
        let mut recv = std::pin::pin!(p.recv());
        if let std::task::Poll::Ready(r) =
            recv.as_mut().poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
        {
            history.lock().unwrap_or_else(|e| e.into_inner()).record(Waited::Spun(start.elapsed()));
            return Some(r);
        }
        if std::time::Instant::now() >= until {
            return None;
        }
        // Not `spin_loop`: the runtime worker that reads the message may share this CPU.
        std::thread::yield_now();
    }
}

/// A listening address.
#[pyclass(frozen, module = "ferry._native")]
pub struct Listener {
    inner: AsyncMutex<ferry_core::PipeListener>,
    addr: String,
}

#[pymethods]
impl Listener {
    /// The address peers connect to.
    #[getter]
    fn address(&self) -> String {
        self.addr.clone()
    }

    /// Waits (GIL released; up to `timeout` seconds, forever if None) for the next peer;
    /// a connection whose handshake fails is logged and skipped ([`crate::accept`]).
    #[pyo3(signature = (timeout=None))]
    fn accept(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Pipe> {
        let p = crate::accept::accept_next(py, &self.inner, &self.addr, timeout)?;
        Ok(Pipe::new(p))
    }
}

/// A received message: the header as JSON text and the tensors as read-only views
/// ([`TensorRef`] on the host, [`DeviceTensor`] on a device).
#[pyclass(frozen, module = "ferry._native")]
pub struct Message {
    /// The header, JSON text.
    #[pyo3(get)]
    header: String,
    tensors: Vec<Py<PyAny>>,
}

#[pymethods]
impl Message {
    /// The tensors.
    #[getter]
    fn tensors<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.tensors.iter().map(|t| t.clone_ref(py)))
    }
}

/// One end of a pipe.
#[pyclass(frozen, module = "ferry._native")]
pub struct Pipe {
    pipe: Arc<ferry_core::Pipe>,
    /// What `recv`'s waits taught the wait policy (off the ring: the ring's reader keeps
    /// its own).
    history: Arc<Mutex<SpinHistory>>,
    /// This pipe's number in the process: the [`OutTensor`]s it allocates carry it
    /// ([`OutTensor::owned_by`]), so an array over one goes out without a copy here only.
    id: u64,
}

impl Pipe {
    fn new(p: ferry_core::Pipe) -> Pipe {
        static IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Pipe {
            pipe: Arc::new(p),
            history: Arc::new(Mutex::new(SpinHistory::new(crate::busy_poll()))),
            id: IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// Waits (GIL released; up to `timeout` seconds, forever if None) for the next message.
    fn recv_message(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<ferry_core::Message> {
        let limit = wait_limit("recv", timeout)?;
        let (p, history) = (self.pipe.clone(), self.history.clone());
        let r = py.detach(|| {
            if uses_ring(&p) {
                // Waits on this thread: the ring's spin, then its futex (no runtime wake-up).
                return match p.recv_blocking(limit) {
                    Err(ferry_core::PipeError::Timeout(_, "recv_blocking")) => None,
                    r => Some(r),
                };
            }
            let start = std::time::Instant::now();
            if let Some(r) = spin_recv(&p, &history) {
                return Some(r);
            }
            let r = runtime().block_on(async {
                match timeout {
                    Some(_) => match limit {
                        Some(d) => tokio::time::timeout(d, p.recv()).await.ok(),
                        None => Some(p.recv().await),
                    },
                    None => Some(p.recv().await),
                }
            });
            history.lock().unwrap_or_else(|e| e.into_inner()).record(Waited::Slept(start.elapsed()));
            r
        });
        match r {
            None => Err(PyTimeoutError::new_err(format!(
                "recv(timeout={}): no message arrived within {0} s; pass a longer timeout, or timeout=None to wait until one comes",
                timeout.unwrap_or_default()
            ))),
            Some(r) => r.map_err(|e| io_err("receiving", e)),
        }
    }

    /// Sends `header` and `tensors` on this thread (GIL released).
    fn send_message(
        &self,
        py: Python<'_>,
        header: serde_json::Value,
        tensors: Vec<Tensor>,
        limit: Option<Duration>,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        check_channels(py, self.pipe.info(), &tensors, "the message's tensors")?;
        let p = self.pipe.clone();
        // On this thread (a Python thread, never a runtime worker): a packed message goes
        // into the ring with no runtime wake-up (`Pipe::send_blocking`).
        py.detach(|| p.send_blocking_timeout(ferry_core::Message::with_tensors(header, tensors), limit))
            .map_err(|e| send_err(e, timeout, self.pipe.is_closed()))
    }

    /// What sends `x` (see [`Pipe::send_objects`]).
    fn out_tensor(&self, x: &Bound<'_, PyAny>, to_out: &Bound<'_, PyAny>) -> PyResult<Tensor> {
        if let Ok(o) = x.cast::<OutTensor>() {
            return o.get().take();
        }
        if let Ok(r) = x.cast::<TensorRef>() {
            return Ok(r.get().tensor.clone());
        }
        if let Ok(d) = x.cast::<DeviceTensor>() {
            return Ok(d.get().tensor.clone());
        }
        match crate::tensors::whole_view(x)? {
            Some(Whole::Received(r)) => return Ok(r.get().tensor.clone()),
            Some(Whole::Allocated(o)) if o.get().owner() == self.id => return o.get().take(),
            _ => {}
        }
        if let Some(t) = crate::tensors::small_copy(x)? {
            return Ok(t);
        }
        let out = to_out.call1((x,))?;
        if let Ok(o) = out.cast::<OutTensor>() {
            return o.get().take();
        }
        if let Ok(r) = out.cast::<TensorRef>() {
            return Ok(r.get().tensor.clone());
        }
        if let Ok(d) = out.cast::<DeviceTensor>() {
            return Ok(d.get().tensor.clone());
        }
        Err(PyTypeError::new_err(format!(
            "send takes OutTensor, TensorRef or DeviceTensor, not {}",
            out.get_type().qualname()?
        )))
    }
}

/// `f`'s output: polled once here (in the runtime's context), and when it is not ready at
/// once (a full pool waiting for room), waited for on the runtime. Most allocations are
/// ready at the first poll: they then cost no `block_on`.
pub(crate) fn now_or_block<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let first = {
        let _rt = runtime().enter();
        f.as_mut().poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
    };
    match first {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => runtime().block_on(f),
    }
}

#[pymethods]
impl Pipe {
    /// The negotiated channel (`shm`, `inline`, ...).
    #[getter]
    fn channel(&self) -> String {
        self.pipe.channel().to_owned()
    }

    /// The transport (`unix`, `quic`).
    #[getter]
    fn transport(&self) -> &'static str {
        self.pipe.transport()
    }

    /// True when the pipe uses the same-host ring (both ends on one Linux host, over a
    /// unix socket): frames go through shared memory, and `recv` waits on it directly.
    #[getter]
    fn ring(&self) -> bool {
        uses_ring(&self.pipe)
    }

    /// The channel negotiated for CUDA tensors (`"cuda-ipc"`), or `None`: CUDA tensors
    /// cannot be sent on this pipe.
    #[getter]
    fn device_channel(&self) -> Option<String> {
        self.pipe.info().channels.get(&ferry_core::DeviceKind::Cuda).cloned()
    }

    /// Each negotiated channel's counters, as JSON text (`{"cuda-ipc": {"copies_in": ..}}`).
    fn stats(&self) -> String {
        self.pipe.stats().to_string()
    }

    /// A device tensor on `cuda:device` in the cuda-ipc channel's exportable memory
    /// (sending it costs no copy); its contents are unspecified until written.
    #[pyo3(signature = (shape, dtype, device=0))]
    fn alloc_device(&self, py: Python<'_>, shape: Vec<u64>, dtype: &str, device: u32) -> PyResult<DeviceTensor> {
        let meta = device_meta(shape, dtype, device)?;
        if self.device_channel().is_none() {
            return Err(crate::device::device_error(
                py,
                format!(
                    "alloc_device({:?}, {:?}, device={device}): this pipe negotiated no channel for CUDA tensors \
                     ({}); allocate on the host (alloc) instead",
                    meta.shape,
                    meta.dtype.name(),
                    crate::device::why_no_channel()
                ),
            ));
        }
        let p = self.pipe.clone();
        let t = py
            .detach(|| runtime().block_on(p.alloc_device(meta)))
            .map_err(|e| crate::device::device_error(py, format!("allocating a device tensor: {e}")))?;
        Ok(DeviceTensor::allocated(t))
    }

    /// A writable tensor in this pipe's memory (shm: sending it costs no copy).
    fn alloc(&self, py: Python<'_>, shape: Vec<u64>, dtype: &str) -> PyResult<OutTensor> {
        let meta = meta_of(shape, dtype)?;
        let p = self.pipe.clone();
        let t = py.detach(|| now_or_block(p.alloc(meta))).map_err(|e| io_err("allocating", e))?;
        Ok(OutTensor::new(t).owned_by(self.id))
    }

    /// Sends a header (JSON text) and tensors ([`OutTensor`] from `alloc`, or received
    /// [`TensorRef`]s to forward); waits (GIL released; up to `timeout` seconds, forever if
    /// None) while the peer does not read.
    #[pyo3(signature = (header, tensors, timeout=None))]
    fn send(&self, py: Python<'_>, header: &str, tensors: Vec<Bound<'_, PyAny>>, timeout: Option<f64>) -> PyResult<()> {
        let limit = wait_limit("send", timeout)?;
        let header: serde_json::Value =
            serde_json::from_str(header).map_err(|e| PyValueError::new_err(format!("header JSON: {e}")))?;
        let mut ts: Vec<Tensor> = Vec::with_capacity(tensors.len());
        for t in tensors {
            if let Ok(o) = t.cast::<OutTensor>() {
                ts.push(o.get().take()?);
            } else if let Ok(r) = t.cast::<TensorRef>() {
                ts.push(r.get().tensor.clone());
            } else if let Ok(d) = t.cast::<DeviceTensor>() {
                ts.push(d.get().tensor.clone());
            } else {
                return Err(PyTypeError::new_err(format!(
                    "send takes OutTensor, TensorRef or DeviceTensor, not {}",
                    t.get_type().qualname()?
                )));
            }
        }
        self.send_message(py, header, ts, limit, timeout)
    }

    /// `ferry.Pipe.send`'s work in one call: `header` (any JSON value, turned into JSON
    /// here, or by `json.dumps` when it holds more than the plain types), and `tensors`:
    /// [`OutTensor`]s, [`TensorRef`]s and numpy arrays viewing one of them whole go out as
    /// they are (no copy: a received tensor sent back, an array from `alloc`); anything
    /// else is given to `to_out` (Python: it copies it into this pipe's memory).
    #[pyo3(signature = (header, tensors, timeout, to_out))]
    fn send_objects(
        &self,
        py: Python<'_>,
        header: &Bound<'_, PyAny>,
        tensors: &Bound<'_, PyAny>,
        timeout: Option<f64>,
        to_out: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let limit = wait_limit("send", timeout)?;
        let header = match crate::json::from_py_plain(header) {
            Some(v) => v,
            None => {
                // What `json.dumps` makes of it, or its error (TypeError, ValueError).
                static DUMPS: pyo3::sync::PyOnceLock<Py<PyAny>> = pyo3::sync::PyOnceLock::new();
                let dumps = DUMPS.import(py, "json", "dumps")?;
                let kw = pyo3::types::PyDict::new(py);
                kw.set_item(pyo3::intern!(py, "allow_nan"), false)?;
                let text: String = dumps.call((header,), Some(&kw))?.extract()?;
                serde_json::from_str(&text).map_err(|e| PyValueError::new_err(format!("header JSON: {e}")))?
            }
        };
        let mut ts: Vec<Tensor> = Vec::new();
        for t in tensors.try_iter()? {
            let t = t?;
            ts.push(self.out_tensor(&t, to_out)?);
        }
        self.send_message(py, header, ts, limit, timeout)
    }

    /// `ferry.Pipe.recv`'s work in one call: the next message as `(header, arrays)`, the
    /// header as `json.loads` would make it, each tensor a read-only numpy view (made here
    /// for numpy's own dtypes, by `to_numpy` for the others).
    #[pyo3(signature = (timeout, to_numpy))]
    fn recv_objects<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
        to_numpy: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyList>)> {
        let msg = self.recv_message(py, timeout)?;
        let header = crate::json::to_py(py, &msg.header)?;
        let arrays = PyList::empty(py);
        for t in msg.tensors {
            let obj = crate::device::received(py, t)?.into_bound(py);
            // Device tensors (and dtypes numpy lacks) are `to_numpy`'s.
            let view = match obj.cast::<TensorRef>() {
                Ok(r) => crate::tensors::numpy_view(r)?,
                Err(_) => None,
            };
            arrays.append(match view {
                Some(a) => a,
                None => to_numpy.call1((obj,))?,
            })?;
        }
        Ok((header, arrays))
    }

    /// Waits (GIL released; up to `timeout` seconds, forever if None) for the next message.
    #[pyo3(signature = (timeout=None))]
    fn recv(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Message> {
        let msg = self.recv_message(py, timeout)?;
        let tensors = msg.tensors.into_iter().map(|t| crate::device::received(py, t)).collect::<PyResult<_>>()?;
        Ok(Message { header: msg.header.to_string(), tensors })
    }

    /// Closes the pipe (the peer's `recv` then fails). Never waits for a send stuck on a
    /// peer that does not read (that send fails with `ConnectionError`): the close notice
    /// gets at most 0.1 s.
    fn close(&self, py: Python<'_>) {
        let p = self.pipe.clone();
        py.detach(|| runtime().block_on(p.close()));
    }

    /// True once the peer is gone.
    #[getter]
    fn closed(&self) -> bool {
        self.pipe.is_closed()
    }
}

/// Listens on `addr` (`unix:NAME`, a socket path, `quic://HOST:PORT`) for pipes; each
/// pipe's shm pool holds at most `shm_pool_mib` MiB (default 2048).
#[pyfunction]
#[pyo3(signature = (addr, *, token=None, shm_pool_mib=None))]
pub fn listen(py: Python<'_>, addr: &str, token: Option<String>, shm_pool_mib: Option<u64>) -> PyResult<Listener> {
    let ep = endpoint(token, shm_pool_mib)?;
    let l =
        py.detach(|| runtime().block_on(ep.listen(addr))).map_err(|e| io_err(&format!("listening on {addr}"), e))?;
    let addr = l.local_addr().to_string();
    Ok(Listener { inner: AsyncMutex::new(l), addr })
}

/// Connects to a listener; the pipe's shm pool holds at most `shm_pool_mib` MiB (default
/// 2048).
#[pyfunction]
#[pyo3(signature = (addr, *, token=None, shm_pool_mib=None))]
pub fn connect(py: Python<'_>, addr: &str, token: Option<String>, shm_pool_mib: Option<u64>) -> PyResult<Pipe> {
    let ep = endpoint(token, shm_pool_mib)?;
    let p =
        py.detach(|| runtime().block_on(ep.connect(addr))).map_err(|e| io_err(&format!("connecting to {addr}"), e))?;
    Ok(Pipe::new(p))
}
