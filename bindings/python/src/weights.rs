//! `ferry.weights`' native half: a subscriber to one bundle of a tensor store, keeping a
//! verified copy of the version it holds and moving to the next one by `store.delta`
//! (PROTOCOL.md §23), all or nothing ([`ferry_store::replica::apply`]).
//!
//! The copy is copy-on-write per tensor: a tensor Python still holds a view of (a
//! `state_dict` of version N) is copied before the next version is written into it, so
//! readers of N keep N while they hold it; tensors nobody holds are patched in place. The
//! views themselves are private mappings ([`ferry::ferry_shm::CowBuf`]): a reader that
//! writes into one (torch has no read-only tensors) changes only its own pages.
//! `apply_to(model)` (Python, `python/ferry/weights.py`) writes the last delta's changes,
//! already checked here, into a model's parameters.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_core::{AlignedBuf, DType, PipeError, Tensor, TensorMeta};
use ferry_store::delta::{Change, Delta};
use ferry_store::replica::{DeltaTarget, Held, apply};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::client::errors::{call_error, connect_error};
use crate::runtime;
use crate::tensors::TensorRef;

/// One tensor's bytes: on the heap as they arrived, or, once Python asked for a view, in a
/// memfd that views map copy-on-write ([`ferry::ferry_shm::CowBuf`], Linux), so that a
/// write into a torch view (torch has no read-only tensors) stays in that view and never
/// reaches the verified copy the next version is built on.
enum Data {
    Heap(Arc<AlignedBuf>),
    #[cfg(target_os = "linux")]
    Cow(Arc<ferry::ferry_shm::CowBuf>),
}

/// A heap buffer's bytes, shared with the views made of it (off Linux, and empty tensors).
#[derive(Clone)]
struct Buf(Arc<AlignedBuf>);

impl AsRef<[u8]> for Buf {
    fn as_ref(&self) -> &[u8] {
        self.0.as_ref().as_ref()
    }
}

impl Data {
    fn bytes(&self) -> &[u8] {
        match self {
            Data::Heap(b) => b.as_ref().as_ref(),
            #[cfg(target_os = "linux")]
            Data::Cow(b) => b.as_slice(),
        }
    }

    /// The bytes to write version N+1 into: in place when no view of N lives, else a new
    /// buffer (a reader of N keeps N while it holds it).
    fn bytes_mut(&mut self) -> &mut [u8] {
        let shared = match self {
            Data::Heap(b) => Arc::get_mut(b).is_none(),
            #[cfg(target_os = "linux")]
            Data::Cow(b) => Arc::get_mut(b).is_none(),
        };
        if shared {
            *self = Data::Heap(Arc::new(AlignedBuf::copy_from(self.bytes())));
        }
        match self {
            Data::Heap(b) => Arc::get_mut(b).map_or(&mut [], AsMut::as_mut),
            #[cfg(target_os = "linux")]
            Data::Cow(b) => Arc::get_mut(b).map_or(&mut [], |b| b.as_mut_slice()),
        }
    }

    /// A view for Python: copy-on-write on Linux (the bytes move into a memfd once, on the
    /// first view of this version), the shared heap buffer elsewhere.
    fn view(&mut self) -> std::io::Result<Bytes> {
        #[cfg(target_os = "linux")]
        if let Data::Heap(b) = self
            && !b.is_empty()
        {
            *self = Data::Cow(Arc::new(ferry::ferry_shm::CowBuf::copy_from(b.as_ref().as_ref())?));
        }
        match self {
            Data::Heap(b) => Ok(Bytes::from_owner(Buf(b.clone()))),
            #[cfg(target_os = "linux")]
            Data::Cow(b) => b.view(),
        }
    }
}

/// The verified copy of the version held: a [`DeltaTarget`], copy-on-write per tensor.
#[derive(Default)]
struct Copy {
    held: Held,
    data: HashMap<String, Data>,
}

impl DeltaTarget for Copy {
    fn held(&self) -> &Held {
        &self.held
    }
    fn bytes(&self, name: &str) -> Option<&[u8]> {
        self.data.get(name).map(Data::bytes)
    }
    fn bytes_mut(&mut self, name: &str) -> Option<&mut [u8]> {
        self.data.get_mut(name).map(Data::bytes_mut)
    }
    fn can_replace(&self) -> bool {
        true
    }
    fn replace(&mut self, name: &str, _: DType, _: &[u64], data: AlignedBuf) {
        self.data.insert(name.to_owned(), Data::Heap(Arc::new(data)));
    }
    fn remove(&mut self, name: &str) {
        self.data.remove(name);
    }
    fn set_held(&mut self, held: Held) {
        self.held = held;
    }
}

/// What the subscriber holds and the delta that brought it.
struct State {
    copy: Copy,
    /// The delta applied last (its changes are what `apply_to` writes into a model at its
    /// base).
    last: Option<Arc<Delta>>,
}

/// A subscriber to bundle `name` of the store at `addr`.
#[pyclass(frozen, module = "ferry._native")]
pub struct WeightsSubscriber {
    rpc: ferry_rpc::Client,
    addr: String,
    name: String,
    state: Mutex<State>,
}

/// Seconds since the Unix epoch.
fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

fn seconds(what: &str, s: Option<f64>) -> PyResult<Option<Duration>> {
    crate::pipe::wait_limit(what, s)
}

impl WeightsSubscriber {
    fn state(&self) -> PyResult<std::sync::MutexGuard<'_, State>> {
        self.state.lock().map_err(|_| PyRuntimeError::new_err("a weights subscriber's lock was poisoned"))
    }
}

#[pymethods]
impl WeightsSubscriber {
    /// Connects to the store at `addr` (`unix:…`, `quic://host:port#sha256=PIN`) for
    /// bundle `name`; `connect_timeout`: seconds to wait for a store that is starting.
    #[new]
    #[pyo3(signature = (addr, name, *, token=None, connect_timeout=None))]
    fn new(
        py: Python<'_>,
        addr: String,
        name: String,
        token: Option<String>,
        connect_timeout: Option<f64>,
    ) -> PyResult<WeightsSubscriber> {
        let endpoint = crate::pipe::endpoint(token, None)?;
        let wait = seconds("subscribe(connect_timeout=...)", connect_timeout)?;
        let deadline = wait.and_then(|w| Instant::now().checked_add(w));
        let r = py.detach(|| {
            runtime().block_on(async {
                loop {
                    match endpoint.connect(&addr).await {
                        Ok(p) => return Ok(p),
                        Err(e)
                            if deadline.is_some_and(|d| Instant::now() < d) && !matches!(e, PipeError::Refused(_)) =>
                        {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Err(e) => return Err(e),
                    }
                }
            })
        });
        let pipe = r.map_err(|e| connect_error(py, &addr, &e, connect_timeout, None))?;
        let copy = Copy { held: Held::empty(&name), data: HashMap::new() };
        let _rt = runtime().enter();
        Ok(WeightsSubscriber {
            rpc: ferry_rpc::Client::new(pipe),
            addr,
            name,
            state: Mutex::new(State { copy, last: None }),
        })
    }

    /// The bundle's latest version in the store and its metadata (JSON text), or `None`
    /// when it has none.
    #[pyo3(signature = (timeout=None))]
    fn latest(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<(u64, String)>> {
        let limit = seconds("latest(timeout=...)", timeout)?;
        let rpc = self.rpc.clone();
        let r = py.detach(|| {
            runtime().block_on(async move {
                rpc.call_raw("store.list", Some(serde_json::json!({})), Vec::new(), limit).await
            })
        });
        let (v, _) = r.map_err(|e| call_error(py, &self.addr, e))?;
        let found = v.as_array().into_iter().flatten().find(|b| b["name"] == self.name.as_str());
        Ok(found.and_then(|b| Some((b["version"].as_u64()?, b["metadata"].to_string()))))
    }

    /// Fetches what the copy needs to become version `to` (default the latest) and applies
    /// it, all or nothing: on any error (the connection lost, a digest that does not match)
    /// the copy still holds the version it held. With `wait` (seconds) and no `to`, the
    /// store answers when a version other than the one held is published, or after `wait`
    /// (a long poll: no polling). Returns what was done: `version`, `same`, `sparse`,
    /// `dense`, `elements`, `sent_bytes`, `full_bytes`, and where the time went: `fetch_s`
    /// (asking and receiving, the store's wait and computation included), `apply_s`
    /// (checking and writing), `received_at` (the Unix time the answer was in).
    #[pyo3(signature = (to=None, timeout=None, wait=None))]
    fn update<'py>(
        &self,
        py: Python<'py>,
        to: Option<u64>,
        timeout: Option<f64>,
        wait: Option<f64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let limit = seconds("update(timeout=...)", timeout)?;
        let wait = seconds("update(wait=...)", wait)?;
        let mut params = self.state()?.copy.held.params(to);
        params.wait_ms = wait.map(|w| u64::try_from(w.as_millis()).unwrap_or(u64::MAX));
        let rpc = self.rpc.clone();
        let t0 = Instant::now();
        let r = py.detach(|| {
            runtime().block_on(async move {
                match limit {
                    Some(d) => rpc.call_timeout::<_, Delta>("store.delta", &params, d).await,
                    None => rpc.call::<_, Delta>("store.delta", &params).await,
                }
            })
        });
        let delta = Arc::new(r.map_err(|e| call_error(py, &self.addr, e))?);
        let (fetched, received_at) = (t0.elapsed(), unix_now());
        let applied = py.detach(|| -> Result<_, String> {
            let mut st = self.state.lock().map_err(|_| "a weights subscriber's lock was poisoned".to_owned())?;
            let a = apply(&delta, &mut st.copy).map_err(|e| e.to_string())?;
            // Only a delta from a version is written into models (`apply_to` at its base);
            // one from nothing would keep a second copy of every tensor alive.
            st.last = delta.base.is_some().then(|| delta.clone());
            Ok(a)
        });
        let a = applied.map_err(|e| PyValueError::new_err(format!("{}: {e}", self.addr)))?;
        let d = PyDict::new(py);
        d.set_item("version", a.version)?;
        d.set_item("same", a.same)?;
        d.set_item("sparse", a.sparse)?;
        d.set_item("dense", a.dense)?;
        d.set_item("elements", a.elements)?;
        d.set_item("sent_bytes", delta.sent_bytes)?;
        d.set_item("full_bytes", delta.full_bytes)?;
        d.set_item("fetch_s", fetched.as_secs_f64())?;
        d.set_item("apply_s", (t0.elapsed() - fetched).as_secs_f64())?;
        d.set_item("received_at", received_at)?;
        Ok(d)
    }

    /// The last deltas the store computed and what their parts took
    /// (`store.delta.timings`): a list of dicts `name`, `from`, `to`, `published_ms`,
    /// `started_ms`, `times` (`digests_ms`, `diff_ms`), `sent_bytes`.
    #[pyo3(signature = (timeout=None))]
    fn store_timings<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Bound<'py, PyAny>> {
        let limit = seconds("store_timings(timeout=...)", timeout)?;
        let rpc = self.rpc.clone();
        let r = py.detach(|| {
            runtime().block_on(async move {
                rpc.call_raw("store.delta.timings", Some(serde_json::json!({})), Vec::new(), limit).await
            })
        });
        let (v, _) = r.map_err(|e| call_error(py, &self.addr, e))?;
        crate::json::to_py(py, &v)
    }

    /// The version held (`None`: none yet).
    #[getter]
    fn version(&self) -> PyResult<Option<u64>> {
        Ok(self.state()?.copy.held.version)
    }

    /// The held version's tree digest (`None`: none yet).
    #[getter]
    fn tree(&self) -> PyResult<Option<String>> {
        Ok(self.state()?.copy.held.tree.clone())
    }

    /// The held version's metadata, as JSON text.
    #[getter]
    fn metadata(&self) -> PyResult<String> {
        Ok(self.state()?.copy.held.metadata.to_string())
    }

    /// Every tensor held, in the order published: `(name, TensorRef)`, each a view of the
    /// copy that keeps this version's bytes. On Linux each call maps the copy anew,
    /// copy-on-write: no copy is made (the first view of a version moves each tensor into a
    /// memfd once), and a write into a view (torch) stays in that view, never reaching the
    /// copy, later views or later versions.
    fn tensors(&self) -> PyResult<Vec<(String, TensorRef)>> {
        let mut guard = self.state()?;
        let st = &mut *guard;
        let mut out = Vec::with_capacity(st.copy.held.tensors.len());
        for (n, d, s, _) in &st.copy.held.tensors {
            let data =
                st.copy.data.get_mut(n).ok_or_else(|| PyRuntimeError::new_err(format!("tensor {n:?} is missing")))?;
            let bytes =
                data.view().map_err(|e| PyRuntimeError::new_err(format!("tensor {n:?}: cannot map it: {e}")))?;
            let t = Tensor::new(TensorMeta::new(*d, s.clone()), bytes)
                .map_err(|e| PyRuntimeError::new_err(format!("tensor {n:?}: {e}")))?;
            out.push((n.clone(), TensorRef::new(t)));
        }
        Ok(out)
    }

    /// The last delta applied, for writing it into a model that held its base: `(base,
    /// base_tree, version, changes)` with `changes` a list of `(name, kind, index, values)`
    /// (`kind` `"sparse"`: `index` a u32/u64 vector, `values` the new elements; `"dense"`:
    /// `values` the whole tensor; unchanged tensors are left out). `None`: no delta yet, or
    /// the last one was from nothing (every tensor whole).
    #[allow(clippy::type_complexity)]
    fn last_delta(
        &self,
    ) -> PyResult<Option<(Option<u64>, Option<String>, u64, Vec<(String, &'static str, Option<TensorRef>, TensorRef)>)>>
    {
        let st = self.state()?;
        let Some(d) = st.last.as_ref() else { return Ok(None) };
        let mut changes = Vec::new();
        for t in &d.tensors {
            match t.change {
                Change::Same => {}
                Change::Sparse => {
                    let (Some(i), Some(v)) = (&t.index, &t.values) else { continue };
                    changes.push((
                        t.name.clone(),
                        "sparse",
                        Some(TensorRef::new(i.0.clone())),
                        TensorRef::new(v.0.clone()),
                    ));
                }
                Change::Dense => {
                    let Some(v) = &t.data else { continue };
                    changes.push((t.name.clone(), "dense", None, TensorRef::new(v.0.clone())));
                }
            }
        }
        Ok(Some((d.base, d.base_tree.clone(), d.version, changes)))
    }

    /// Delta bytes the store sent each of its connections (`store.delta.stats`): a list of
    /// dicts `conn`, `addr`, `deltas`, `sent_bytes`, `full_bytes`.
    #[pyo3(signature = (timeout=None))]
    fn store_stats<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Bound<'py, PyAny>> {
        let limit = seconds("store_stats(timeout=...)", timeout)?;
        let rpc = self.rpc.clone();
        let r = py.detach(|| {
            runtime().block_on(async move {
                rpc.call_raw("store.delta.stats", Some(serde_json::json!({})), Vec::new(), limit).await
            })
        });
        let (v, _) = r.map_err(|e| call_error(py, &self.addr, e))?;
        crate::json::to_py(py, &v)
    }

    /// Whether the connection to the store is closed.
    #[getter]
    fn closed(&self) -> bool {
        self.rpc.pipe().is_closed()
    }

    /// The store's address.
    #[getter]
    fn addr(&self) -> String {
        self.addr.clone()
    }

    /// The bundle's name.
    #[getter]
    fn name(&self) -> String {
        self.name.clone()
    }
}
