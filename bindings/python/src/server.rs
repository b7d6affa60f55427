//! The JSON-RPC server with Python handlers: a method table of [`crate::handler`]s,
//! served on addresses with `ferry serve`'s options.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_commands::cli_rpc::{Access, ServeOptions};
use ferry_rpc::{GivenSchemas, MethodInfo, Methods, RpcLimits};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::runtime;

use crate::gate::{self, Gate, GateLimits};
use crate::handler::PyHandler;

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
    /// What its Python handlers may hold at once.
    gate: Arc<Gate>,
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
    Duration::try_from_secs_f64(s).map_err(|_| PyValueError::new_err(format!("{option} {s}: too many seconds")))
}

fn parse_json(what: &str, text: &str) -> PyResult<Value> {
    serde_json::from_str(text).map_err(|e| PyValueError::new_err(format!("{what}: {e}")))
}

#[pymethods]
impl Server {
    /// A server for the API `title` `version`. Limits as `ferry serve`'s (see
    /// `ferry_rpc::RpcLimits`); `None` keeps the default. The Python handlers' own limits
    /// ([`crate::gate`]): `max_running_handlers` sync handlers running at once (default
    /// 256, at most the pool's 512 threads), `max_queued_handlers` calls waiting for one
    /// (1024), `max_param_bytes_in_flight` bytes of JSON params being converted or held
    /// by handlers (16 MiB; for big plain-JSON and HTTP requests, from their parsing on:
    /// `RpcLimits::max_parse_bytes_in_flight`); `max_in_flight` also bounds a connection's
    /// handler runs.
    #[new]
    #[pyo3(signature = (title, version, description=None, *, max_connections=None, max_in_flight=None,
        max_request_bytes=None, max_tasks=None, max_tasks_per_identity=None, idle_timeout=None,
        max_queued_answers=None, max_queued_answer_bytes=None, max_refs=None, max_refs_per_identity=None,
        max_ref_bytes=None, ref_ttl=None, max_running_handlers=None, max_queued_handlers=None,
        max_param_bytes_in_flight=None))]
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
        max_running_handlers: Option<usize>,
        max_queued_handlers: Option<usize>,
        max_param_bytes_in_flight: Option<u64>,
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
            let max = ferry_rpc::remote::MAX_REF_TTL;
            let d = seconds("ref_ttl", s)?;
            if d > max {
                let days = max.as_secs() / 86_400;
                return Err(PyValueError::new_err(format!(
                    "ref_ttl {s}: at most {} seconds ({days} days)",
                    max.as_secs()
                )));
            }
            limits = limits.ref_ttl(d);
        }
        let max_running = max_running_handlers.unwrap_or(gate::DEFAULT_RUNNING);
        if max_running == 0 || max_running > crate::pool::MAX_THREADS {
            return Err(PyValueError::new_err(format!(
                "max_running_handlers {max_running}: from 1 to {} (the handler threads)",
                crate::pool::MAX_THREADS
            )));
        }
        let max_queued = max_queued_handlers.unwrap_or(gate::DEFAULT_QUEUED);
        let max_param_bytes = max_param_bytes_in_flight.unwrap_or(gate::DEFAULT_PARAM_BYTES);
        if max_param_bytes == 0 {
            return Err(PyValueError::new_err("max_param_bytes_in_flight 0: give at least 1"));
        }
        // The same budget bounds big plain-JSON and HTTP requests while the RPC layer
        // parses them and until their calls end (`RpcLimits::max_parse_bytes_in_flight`).
        limits = limits.max_parse_bytes_in_flight(usize::try_from(max_param_bytes).unwrap_or(usize::MAX));
        let gate =
            Gate::new(GateLimits { max_in_flight: limits.max_in_flight, max_running, max_queued, max_param_bytes });
        Ok(Server {
            gate,
            methods: Mutex::new(Some(Methods::new())),
            title,
            version,
            description,
            limits,
            built: std::sync::OnceLock::new(),
            stop: CancellationToken::new(),
        })
    }

    /// Registers a method. `fast_params`: its params are all plain types, validated from a
    /// `dict` (others get their params as JSON `bytes`). `params_schema` (an object schema whose properties are the
    /// params, in `param_names` order), `result_schema` and `defs` (schemas they refer to
    /// as `#/components/schemas/NAME`) are JSON texts. `task`: a long-running function
    /// (`@app.function(task=True)`), which `rpc.discover` marks `x-ferry-task: true`.
    #[pyo3(signature = (name, call, *, is_async, params_schema, result_schema, defs, param_names,
        summary=None, description=None, deprecated=false, concurrency=None, allow_unknown_params=false,
        fast_params=false, task=false))]
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
        fast_params: bool,
        task: bool,
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
            task,
        };
        let handler = Arc::new(PyHandler {
            call: Arc::new(call),
            is_async,
            names: param_names,
            fast_params,
            gate: self.gate.clone(),
        });
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
            Some(us) if us > ferry_commands::cli_rpc::MAX_BUSY_POLL_US => {
                return Err(PyValueError::new_err(format!(
                    "busy_poll_us {us}: at most {}",
                    ferry_commands::cli_rpc::MAX_BUSY_POLL_US
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
            .detach(|| runtime().block_on(ferry_commands::cli_rpc::bind(&opts)))
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
            let r = ferry_commands::cli_rpc::run(bound, &s, async move {
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
