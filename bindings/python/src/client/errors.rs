//! The client's failures as the exceptions of `ferry.errors` (one tree for the package:
//! `ferry.errors` and the generated `ferry.rpc_errors`). Every message
//! names the server's address.

use ferry_core::PipeError;
use ferry_rpc::CallError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// An exception class of `ferry.errors`.
fn class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyType>> {
    static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    let m = MODULE.get_or_try_init(py, || py.import("ferry.errors").map(Bound::unbind))?;
    Ok(m.bind(py).getattr(name)?.cast_into::<PyType>()?)
}

/// `ferry.errors.NAME(args)`, or the error met while making it.
fn make<'py>(py: Python<'py>, name: &str, args: impl pyo3::call::PyCallArgs<'py>) -> PyErr {
    match class(py, name).and_then(|c| c.call1(args)) {
        Ok(e) => PyErr::from_value(e),
        Err(e) => e,
    }
}

/// `ferry.errors.NAME(args)` for other modules of the binding.
pub(crate) fn make_error<'py>(py: Python<'py>, name: &str, args: impl pyo3::call::PyCallArgs<'py>) -> PyErr {
    make(py, name, args)
}

/// `ParamsError(message)`.
pub(crate) fn params_error(py: Python<'_>, message: String) -> PyErr {
    make(py, "ParamsError", (message,))
}

/// `ResultError(message)`.
pub(crate) fn result_error(py: Python<'_>, message: String) -> PyErr {
    make(py, "ResultError", (message,))
}

/// The CLOSE code a pipe error carries, as `ConnectionClosed.code` (`None`: the stream
/// simply ended).
fn close_code(e: &PipeError) -> Option<String> {
    match e {
        PipeError::ClosedByPeer(why) => Some(why.split(':').next().unwrap_or(why).trim().to_owned()),
        PipeError::Protocol(_) => Some("protocol_error".into()),
        PipeError::Limit(_) => Some("limit".into()),
        _ => None,
    }
}

/// `ConnectionClosed` for a connection to `addr` that ended with `e`.
pub(crate) fn closed(py: Python<'_>, addr: &str, e: &PipeError) -> PyErr {
    make(py, "ConnectionClosed", (format!("{addr}: the connection is closed: {e}"), close_code(e)))
}

/// A failed call (or notify, batch, discover) on the connection to `addr`.
pub(crate) fn call_error(py: Python<'_>, addr: &str, e: CallError) -> PyErr {
    match e {
        CallError::Rpc(o) => {
            let data = match &o.data {
                Some(d) => match crate::json::to_py(py, d) {
                    Ok(d) => d.unbind(),
                    Err(e) => return e,
                },
                None => py.None(),
            };
            let made = py
                .import("ferry.rpc_errors")
                .and_then(|m| m.getattr("error_from_code"))
                .and_then(|f| f.call1((o.code, o.message.clone(), data)));
            match made {
                Ok(e) => PyErr::from_value(e),
                Err(e) => e,
            }
        }
        CallError::Closed(e) => closed(py, addr, &e),
        CallError::Timeout(d) => make(
            py,
            "CallTimeout",
            (format!("{addr}: no answer within {} s; the call was cancelled on the server", d.as_secs_f64()),),
        ),
        CallError::Params(m) => params_error(py, format!("{addr}: {m}")),
        CallError::Result(m) => result_error(py, format!("{addr}: {m}")),
        CallError::Pipe(e) => pipe_error(py, addr, "sending", &e),
        e => make(py, "FerryError", (format!("{addr}: {e}"),)),
    }
}

/// A pipe error while `doing` something on the connection to `addr`.
pub(crate) fn pipe_error(py: Python<'_>, addr: &str, doing: &str, e: &PipeError) -> PyErr {
    match e {
        PipeError::Limit(_) => make(py, "LimitError", (format!("{addr}: {doing}: {e}"),)),
        PipeError::Timeout(..) => make(py, "CallTimeout", (format!("{addr}: {doing}: {e}"),)),
        e if e.is_closed() => closed(py, addr, e),
        PipeError::Protocol(_) => make(py, "ProtocolError", (format!("{addr}: {doing}: {e}"), "protocol_error")),
        e => make(py, "FerryError", (format!("{addr}: {doing}: {e}"),)),
    }
}

/// Why connecting to `addr` failed: `Refused` for a refused handshake (its JSON kept),
/// `CallTimeout` when it took longer than `connect_timeout`, else `ConnectionClosed`.
pub(crate) fn connect_error(
    py: Python<'_>,
    addr: &str,
    e: &PipeError,
    waited: Option<f64>,
    last: Option<&str>,
) -> PyErr {
    match e {
        PipeError::Refused(r) => {
            let json = serde_json::to_value(r).unwrap_or_default();
            let refusal = match crate::json::to_py(py, &json) {
                Ok(r) => r,
                Err(e) => return e,
            };
            make(py, "Refused", (refusal, addr))
        }
        PipeError::Timeout(..) => {
            let what = match waited {
                Some(s) => format!("within connect_timeout={s} s"),
                None => "in time".to_owned(),
            };
            make(
                py,
                "CallTimeout",
                (format!(
                    "{addr}: no connection and handshake {what} ({}): is a ferry server listening there, and is \
                     it overloaded? Pass a longer connect_timeout= to wait for a server that is starting",
                    last.map_or_else(|| e.to_string(), |l| format!("last attempt: {l}"))
                ),),
            )
        }
        e => {
            let hint = match waited {
                Some(_) => String::new(),
                None => " (pass connect_timeout=SECONDS to wait for a server that is starting)".to_owned(),
            };
            make(py, "ConnectionClosed", (format!("cannot connect to {addr}: {e}{hint}"), close_code(e)))
        }
    }
}
