//! `Listener.accept`'s wait: the next peer whose handshake succeeds. A connection whose
//! handshake fails (a same-user process that sends junk, a wrong token, a client that hangs
//! up) is logged on the `ferry` logger and skipped, so an accept loop survives it; only a
//! listener that stopped, or the timeout, ends the wait.

use std::time::{Duration, Instant};

use ferry_core::{PipeError, PipeListener};
use pyo3::exceptions::{PyConnectionError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use tokio::sync::Mutex as AsyncMutex;

use crate::runtime;

/// The deadline of a wait of `timeout` seconds: `None` waits for ever (no timeout, or one
/// too long to count); a negative one is zero; NaN is a `ValueError` naming `timeout`.
fn deadline(timeout: Option<f64>) -> PyResult<Option<Instant>> {
    match timeout {
        None => Ok(None),
        Some(s) if s.is_nan() => Err(PyValueError::new_err("accept(timeout=nan): give seconds or None")),
        Some(s) => Ok(Duration::try_from_secs_f64(s.max(0.0)).ok().and_then(|d| Instant::now().checked_add(d))),
    }
}

/// Waits (GIL released) for the next pipe on `listener` until `timeout` seconds pass
/// (`TimeoutError`); a failed handshake is logged (`logging.getLogger("ferry").warning`)
/// and the wait goes on.
pub(crate) fn accept_next(
    py: Python<'_>,
    listener: &AsyncMutex<PipeListener>,
    addr: &str,
    timeout: Option<f64>,
) -> PyResult<ferry_core::Pipe> {
    let until = deadline(timeout)?;
    loop {
        let r = py.detach(|| {
            runtime().block_on(async {
                let wait = async { listener.lock().await.accept().await };
                match until {
                    Some(t) => tokio::time::timeout_at(t.into(), wait).await.ok(),
                    None => Some(wait.await),
                }
            })
        });
        match r {
            None => {
                let s = timeout.unwrap_or_default();
                return Err(PyTimeoutError::new_err(format!(
                    "accept(timeout={s}): no peer connected to {addr} within {s} s"
                )));
            }
            Some(Ok(p)) => return Ok(p),
            Some(Err(PipeError::Closed)) => {
                return Err(PyConnectionError::new_err(format!("accepting on {addr}: the listener stopped")));
            }
            Some(Err(e)) => {
                let why = ferry_core::logsafe::peer_text(&e.to_string()).to_string();
                py.import("logging")?
                    .call_method1("getLogger", ("ferry",))?
                    .call_method1("warning", ("%s: skipped a connection whose handshake failed: %s", addr, why))?;
                py.check_signals()?;
            }
        }
    }
}
