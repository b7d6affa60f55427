//! `ferry.StoreServer`: a tensor store (`ferry serve-weights`) hosted by a Python program,
//! served in the background on this process's runtime: the same code as the command
//! ([`ferry_commands::weights`]: `open_store`, `bind_store`, `BoundStore::run`).

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use ferry_commands::weights::{PlacementArgs, WeightsOptions};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use tokio_util::sync::CancellationToken;

use crate::runtime;

/// How a server's run ended, once known.
enum Ended {
    /// Still serving: its result comes on this channel.
    Running(Receiver<anyhow::Result<()>>),
    /// Ended with this error text (`None`: stopped cleanly).
    Done(Option<String>),
}

/// A tensor store served in the background: made (and `files` published as bundle `name`)
/// and bound by the constructor, served until its `stop` (or until it is
/// garbage collected).
#[pyclass(frozen, module = "ferry._native")]
pub struct StoreServer {
    store: std::sync::Arc<ferry_store::Store>,
    addresses: Vec<String>,
    stop: CancellationToken,
    ended: Mutex<Ended>,
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl StoreServer {
    /// Waits up to `timeout` (forever: `None`) for the run to end, the GIL released, Python
    /// signals checked every 50 ms. `Ok(true)`: it ended (its error raised, once).
    fn wait_for(&self, py: Python<'_>, timeout: Option<Duration>) -> PyResult<bool> {
        let start = Instant::now();
        loop {
            let tick = match timeout {
                Some(t) => match t.checked_sub(start.elapsed()) {
                    Some(left) => left.min(Duration::from_millis(50)),
                    None => return Ok(false),
                },
                None => Duration::from_millis(50),
            };
            let got: Result<Option<Option<String>>, String> = py.detach(|| {
                let mut ended = self.ended.lock().map_err(|_| "the store server's state is poisoned".to_owned())?;
                let r = match &*ended {
                    Ended::Done(e) => return Ok(Some(e.clone())),
                    Ended::Running(rx) => rx.recv_timeout(tick),
                };
                let done = match r {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(format!("{e:#}")),
                    Err(RecvTimeoutError::Timeout) => return Ok(None),
                    Err(RecvTimeoutError::Disconnected) => {
                        Some("the store server's task ended without a result".into())
                    }
                };
                *ended = Ended::Done(done.clone());
                Ok(Some(done))
            });
            match got {
                Err(e) => return Err(PyRuntimeError::new_err(e)),
                Ok(Some(None)) => return Ok(true),
                Ok(Some(Some(e))) => return Err(PyRuntimeError::new_err(e)),
                Ok(None) => {}
            }
            py.check_signals()?;
        }
    }
}

/// A number of seconds (>= 0, finite) as a duration, or an error naming `what`.
fn seconds(what: &str, s: f64) -> PyResult<Duration> {
    if !(s.is_finite() && s >= 0.0) {
        return Err(PyValueError::new_err(format!("{what} {s}: give a number of seconds >= 0")));
    }
    Duration::try_from_secs_f64(s).map_err(|_| PyValueError::new_err(format!("{what} {s}: too many seconds")))
}

#[pymethods]
impl StoreServer {
    /// Makes the store, publishes `files` (`.safetensors`, one bundle named `name`), binds
    /// `addr` and serves in the background. The options are `ferry serve-weights`' (MiB
    /// where it says MiB); `token`: required from every client (no default from
    /// `FERRY_TOKEN` here). `announce` prints `listening on ADDR` to stdout, as the command.
    /// `delta_bases`: superseded versions of each bundle the store keeps so that readers
    /// one step behind get sparse deltas (default 1; each costs the memory its version
    /// does not share with the next).
    #[new]
    #[pyo3(signature = (addr="unix:ferry-weights".to_owned(), files=Vec::new(), *, name=None, budget_mib=None,
        bucket_mib=512, digest=true, placement=None, cpu_budget_mib=None, disk_budget_mib=None, disk_dir=None,
        token=None, max_connections=512, announce=false, delta_bases=1))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        addr: String,
        files: Vec<PathBuf>,
        name: Option<String>,
        budget_mib: Option<u64>,
        bucket_mib: usize,
        digest: bool,
        placement: Option<String>,
        cpu_budget_mib: Option<u64>,
        disk_budget_mib: Option<u64>,
        disk_dir: Option<PathBuf>,
        token: Option<String>,
        max_connections: usize,
        announce: bool,
        delta_bases: usize,
    ) -> PyResult<StoreServer> {
        let name = match (name, files.is_empty()) {
            (Some(n), _) => n,
            (None, true) => String::new(),
            (None, false) => return Err(PyValueError::new_err("files given without name: name the bundle (name=...)")),
        };
        let err = |e: anyhow::Error| PyValueError::new_err(format!("{e:#}"));
        let (placement, device_copy) = ferry_commands::weights::placement(PlacementArgs {
            policy: placement,
            cpu_budget_mib,
            disk_budget_mib,
            disk_dir,
            record_trace_limit: ferry_store::placement::DEFAULT_TRACE_LIMIT,
            ..Default::default()
        })
        .map_err(err)?;
        let mut store = ferry_commands::weights::store_options(budget_mib, bucket_mib, digest).map_err(err)?;
        store.delta_bases = delta_bases;
        // A store served for weight sync gets a version per training step: its next buckets
        // are made ready between publishes.
        store.spare_buckets = true;
        let o = WeightsOptions {
            files,
            name,
            addr,
            store,
            placement,
            device_copy,
            busy_poll: crate::busy_poll(),
            access: ferry_commands::weights::access(token, max_connections),
        };
        let bound = py
            .detach(|| {
                runtime().block_on(async {
                    let store = ferry_commands::weights::open_store(&o).await?;
                    ferry_commands::weights::bind_store(store, &o).await
                })
            })
            .map_err(|e| PyRuntimeError::new_err(format!("{e:#}")))?;
        let addresses = bound.bound.addresses();
        let store = bound.store().clone();
        if announce {
            bound.bound.announce().map_err(|e| PyRuntimeError::new_err(format!("{e:#}")))?;
        }
        let stop = CancellationToken::new();
        let (tx, rx) = std::sync::mpsc::channel();
        let s = stop.clone();
        runtime().spawn(async move {
            let r = bound
                .run(async move {
                    s.cancelled().await;
                    Ok(())
                })
                .await;
            let _ = tx.send(r);
        });
        Ok(StoreServer { store, addresses, stop, ended: Mutex::new(Ended::Running(rx)) })
    }

    /// The addresses served (a port the OS chose; for QUIC the fingerprint clients pin).
    #[getter]
    fn addresses(&self) -> Vec<String> {
        self.addresses.clone()
    }

    /// The first address served: what clients connect to.
    #[getter]
    fn addr(&self) -> String {
        self.addresses.first().cloned().unwrap_or_default()
    }

    /// Waits until the server ends (`timeout` seconds at most; `None`: until then, or
    /// until a signal's exception such as KeyboardInterrupt). True when it ended; its error
    /// is raised.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let timeout = timeout.map(|t| seconds("timeout", t)).transpose()?;
        self.wait_for(py, timeout)
    }

    /// Stops serving (the listener closes, calls in flight are cancelled) and waits up to
    /// `timeout` seconds for the server to end. True when it ended.
    #[pyo3(signature = (timeout=10.0))]
    fn stop(&self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        let timeout = seconds("timeout", timeout)?;
        self.stop.cancel();
        self.wait_for(py, Some(timeout))
    }

    /// The latest version of bundle `name` (`ferry.weights.Publisher`'s in-process path):
    /// `(number, [(name, TensorRef)])`, read-only views of the store's memory; `None`: none.
    fn _latest(&self, name: &str) -> Option<(u64, Vec<(String, crate::tensors::TensorRef)>)> {
        crate::store_local::latest(&self.store, name)
    }

    /// Starts the next version of bundle `name` in this store (`ferry.weights.Publisher`'s
    /// in-process path): `tensors` as `(name, dtype, shape, keep)`, a kept one taken from
    /// version `base` without a copy, the others filled through the builder's slots.
    #[pyo3(signature = (name, base, tensors))]
    fn _build(
        &self,
        name: &str,
        base: Option<u64>,
        tensors: Vec<(String, String, Vec<u64>, bool)>,
    ) -> PyResult<crate::store_local::VersionBuilder> {
        crate::store_local::VersionBuilder::start(&self.store, name, base, tensors)
    }

    /// Whether it still serves.
    #[getter]
    fn serving(&self) -> bool {
        !self.stop.is_cancelled() && self.ended.lock().is_ok_and(|e| matches!(*e, Ended::Running(_)))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.stop(py, 10.0)?;
        Ok(false)
    }
}
