//! JSON values as Python objects and back: a call's params reach the app already parsed,
//! so a handler with plain params is called without a second parse in Python, and a pipe's
//! header goes between Python objects and [`Value`]s with no JSON text in between.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::Value;

/// How deep [`from_py_plain`] follows nested lists and dicts before it leaves the value to
/// `json.dumps` (which has its own limit).
const PLAIN_DEPTH: usize = 64;

/// `obj` as the JSON value `json.dumps(obj, allow_nan=False)` writes, when it is made of
/// the exact plain types only (`None`, `bool`, `int` within 64 bits, finite `float`, `str`,
/// `list`, `tuple`, `dict` with `str` keys); `None` for anything else (a subclass, a
/// non-`str` key, NaN, a big int, another type, deep nesting): the caller then takes
/// `json.dumps`'s way, which converts or refuses it as it always did.
pub fn from_py_plain(obj: &Bound<'_, PyAny>) -> Option<Value> {
    plain(obj, 0)
}

fn plain(obj: &Bound<'_, PyAny>, depth: usize) -> Option<Value> {
    if depth > PLAIN_DEPTH {
        return None;
    }
    if obj.is_none() {
        return Some(Value::Null);
    }
    if let Ok(s) = obj.cast_exact::<PyString>() {
        return s.to_str().ok().map(|s| Value::String(s.to_owned()));
    }
    if let Ok(d) = obj.cast_exact::<PyDict>() {
        let mut map = serde_json::Map::with_capacity(d.len());
        for (k, v) in d.iter() {
            let k = k.cast_exact::<PyString>().ok()?.to_str().ok()?;
            map.insert(k.to_owned(), plain(&v, depth + 1)?);
        }
        return Some(Value::Object(map));
    }
    if let Ok(b) = obj.cast_exact::<PyBool>() {
        return Some(Value::Bool(b.is_true()));
    }
    if obj.is_exact_instance_of::<PyInt>() {
        if let Ok(i) = obj.extract::<i64>() {
            return Some(Value::from(i));
        }
        return obj.extract::<u64>().ok().map(Value::from);
    }
    if let Ok(f) = obj.cast_exact::<PyFloat>() {
        return serde_json::Number::from_f64(f.value()).map(Value::Number);
    }
    if let Ok(l) = obj.cast_exact::<PyList>() {
        return l.iter().map(|v| plain(&v, depth + 1)).collect::<Option<Vec<_>>>().map(Value::Array);
    }
    if let Ok(t) = obj.cast_exact::<PyTuple>() {
        return t.iter().map(|v| plain(&v, depth + 1)).collect::<Option<Vec<_>>>().map(Value::Array);
    }
    None
}

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
