//! asyncio futures resolved from the runtime, without a thread per call.
//!
//! An `AsyncClient` call runs as a task on the runtime (`start`). When it ends, its
//! outcome goes to the one settling thread of the process, which takes the GIL, turns the
//! outcome into Python objects and hands them to the call's event loop with
//! `loop.call_soon_threadsafe(settle, future, ok, value)` (`ferry._client._settle`, which
//! leaves a future that was cancelled meanwhile alone). The runtime's workers never wait
//! for the GIL (Python code never runs on them, as on the server side).
//!
//! A call whose future is cancelled (its task cancelled, `asyncio.wait_for` expired) is
//! dropped on the runtime through its [`Pending`] handle: the Rust client then cancels it
//! on the server (`ferry.cancel`).

use std::sync::OnceLock;
use std::sync::mpsc;

use pyo3::prelude::*;
use tokio_util::sync::CancellationToken;

use crate::runtime;

/// Makes a call's Python result (or its exception) once the GIL is held.
pub(crate) type Finish = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

/// A finished call on its way to its event loop.
struct Done {
    event_loop: Py<PyAny>,
    future: Py<PyAny>,
    finish: Finish,
}

/// The settling thread's queue (started on first use).
fn queue() -> &'static mpsc::Sender<Done> {
    static TX: OnceLock<mpsc::Sender<Done>> = OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Done>();
        std::thread::Builder::new()
            .name("ferry-settle".into())
            .spawn(move || {
                for d in rx {
                    // `None` once the interpreter is shutting down: nothing is left to tell.
                    if Python::try_attach(|py| settle(py, d)).is_none() {
                        return;
                    }
                }
            })
            .expect("the ferry settling thread could not start (no threads?)");
        tx
    })
}

fn settle(py: Python<'_>, d: Done) {
    let (ok, value) = match (d.finish)(py) {
        Ok(v) => (true, v),
        Err(e) => (false, e.into_value(py).into_any()),
    };
    let r = py
        .import("ferry._client")
        .and_then(|m| m.getattr("_settle"))
        .and_then(|s| d.event_loop.bind(py).call_method1("call_soon_threadsafe", (s, d.future, ok, value)));
    if let Err(e) = r {
        // The loop is closed: its awaiting task is gone with it.
        tracing::debug!("an AsyncClient call finished after its event loop closed: {e}");
    }
}

/// Cancels a call started by `start` (dropping it on the runtime).
#[pyclass(frozen, module = "ferry._native")]
pub struct Pending {
    token: CancellationToken,
}

#[pymethods]
impl Pending {
    /// Drops the call (the Rust client cancels it on the server); no effect once it ended.
    fn cancel(&self) {
        self.token.cancel();
    }
}

/// Runs `work` on the runtime; its outcome, made into Python objects by `finish`, resolves
/// `future` on `event_loop`.
pub(crate) fn start<W, T>(
    event_loop: Py<PyAny>,
    future: Py<PyAny>,
    work: W,
    finish: impl FnOnce(Python<'_>, T) -> PyResult<Py<PyAny>> + Send + 'static,
) -> Pending
where
    W: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let token = CancellationToken::new();
    let cancelled = token.clone();
    runtime().spawn(async move {
        let out = tokio::select! {
            () = cancelled.cancelled() => return,
            out = work => out,
        };
        let finish: Finish = Box::new(move |py| finish(py, out));
        let _ = queue().send(Done { event_loop, future, finish });
    });
    Pending { token }
}
