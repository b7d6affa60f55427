//! JSON values as Python objects: a call's params reach the app already parsed, so a
//! handler with plain params is called without a second parse in Python.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde_json::Value;

/// `v` as the object `json.loads` would make of its text: `None`, `bool`, `int`, `float`,
/// `str`, `list`, `dict` (keys in their order).
pub fn to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else {
                // serde_json (without arbitrary precision) holds every other number as f64.
                n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any()
            }
        }
        Value::String(s) => s.into_pyobject(py)?.into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_py(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (k, item) in map {
                dict.set_item(k, to_py(py, item)?)?;
            }
            dict.into_any()
        }
    })
}

/// About how many bytes `v` takes as JSON text (strings and keys by their length, other
/// values by a small constant), without writing it.
pub fn approx_size(v: &Value) -> usize {
    match v {
        Value::Null | Value::Bool(_) | Value::Number(_) => 8,
        Value::String(s) => s.len() + 2,
        Value::Array(items) => 2 + items.iter().map(|i| approx_size(i) + 1).sum::<usize>(),
        Value::Object(map) => 2 + map.iter().map(|(k, i)| k.len() + 4 + approx_size(i)).sum::<usize>(),
    }
}
