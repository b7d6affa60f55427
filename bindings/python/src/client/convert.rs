//! Params and results between Python objects and JSON values, tensors beside them: one walk
//! each way, no JSON text in between.
//!
//! - Out (`Encoder::value`): `None`, `bool`, `int`, `float`, `str`, `list`, `tuple` and
//!   `dict` (string keys) become JSON; anything else is given to the Python `encode` hook
//!   (`ferry._client._encode`, with the client to allocate from), which answers with a tensor to send (an `OutTensor` in the
//!   connection's memory, a `DeviceTensor`, or a received `TensorRef` sent back as it is), a JSON-able
//!   stand-in (a numpy scalar's value, a tensor reference's wire form), or `None` for a
//!   value ferry cannot send: a `ParamsError` naming where in the params it is.
//! - In (`Decoder::decode`): JSON as `json.loads` makes it, except `{"$tensor": i}` (the message's
//!   tensor `i`) and the inline `{"$tensor": {"dtype", "shape", "data"}}`, given to the
//!   `tensor` hook as a `TensorRef` (a numpy or torch view; a `DeviceTensor` for a device
//!   tensor), and `{"$tensor_ref": {..}}`,
//!   given to the `tensor_ref` hook.

use ferry_core::Tensor;
use ferry_rpc::tensor::{RpcTensor, TENSOR_KEY};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Value};

use super::errors::{params_error, result_error};
use crate::device::DeviceTensor;
use crate::tensors::{OutTensor, TensorRef, Whole};

/// How deep params may nest (as the server's parser allows).
const MAX_DEPTH: usize = 128;

/// The key of a remote tensor reference (PROTOCOL.md section 21).
const REF_KEY: &str = "$tensor_ref";

/// Turns Python params into JSON, collecting their tensors.
pub(crate) struct Encoder<'a, 'py> {
    /// `ferry._client._encode`, called with a value and the client (for `alloc`).
    pub hook: &'a Bound<'py, PyAny>,
    /// The native client.
    pub client: &'a Bound<'py, PyAny>,
    /// The tensors, in `{"$tensor": i}` order.
    pub tensors: Vec<Tensor>,
}

impl<'py> Encoder<'_, 'py> {
    /// `obj` as JSON; `path` names it in errors (`params["x"][0]`).
    pub fn value(&mut self, obj: &Bound<'py, PyAny>, path: &mut String, depth: usize) -> PyResult<Value> {
        if depth > MAX_DEPTH {
            return Err(params_error(obj.py(), format!("{path} is nested deeper than {MAX_DEPTH} levels")));
        }
        if obj.is_none() {
            return Ok(Value::Null);
        }
        if let Ok(b) = obj.cast::<PyBool>() {
            return Ok(Value::Bool(b.is_true()));
        }
        if obj.is_instance_of::<PyInt>() {
            if let Ok(i) = obj.extract::<i64>() {
                return Ok(Value::from(i));
            }
            if let Ok(u) = obj.extract::<u64>() {
                return Ok(Value::from(u));
            }
            return Err(params_error(
                obj.py(),
                format!("{path} is an int outside the 64-bit range JSON-RPC carries ({obj:.60}); send it as a str"),
            ));
        }
        if let Ok(f) = obj.cast::<PyFloat>() {
            let v = f.value();
            return serde_json::Number::from_f64(v).map(Value::Number).ok_or_else(|| {
                params_error(obj.py(), format!("{path} is {v}, which JSON cannot carry (only finite floats)"))
            });
        }
        if let Ok(s) = obj.cast::<PyString>() {
            return Ok(Value::String(s.to_str()?.to_owned()));
        }
        if let Ok(d) = obj.cast::<PyDict>() {
            let mut map = Map::with_capacity(d.len());
            let len = path.len();
            for (k, v) in d.iter() {
                let Ok(k) = k.cast::<PyString>() else {
                    return Err(params_error(
                        obj.py(),
                        format!(
                            "{path} has the key {k:.60} ({}): JSON objects have string keys; convert it with str()",
                            k.get_type().qualname()?
                        ),
                    ));
                };
                let k = k.to_str()?;
                path.push_str(&format!("[{k:?}]"));
                let item = self.value(&v, path, depth + 1)?;
                path.truncate(len);
                map.insert(k.to_owned(), item);
            }
            return Ok(Value::Object(map));
        }
        if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
            let mut items = Vec::with_capacity(obj.len()?);
            let len = path.len();
            for (i, v) in obj.try_iter()?.enumerate() {
                path.push_str(&format!("[{i}]"));
                items.push(self.value(&v?, path, depth + 1)?);
                path.truncate(len);
            }
            return Ok(Value::Array(items));
        }
        self.other(obj, path, depth)
    }

    /// A value that is not plain JSON: a tensor, or what the hook stands in for it.
    fn other(&mut self, obj: &Bound<'py, PyAny>, path: &mut String, depth: usize) -> PyResult<Value> {
        // The common tensors without the hook: a numpy array viewing a received or an
        // allocated tensor whole (sent as it is), a small array (its bytes copied here,
        // sent inline).
        let native = match crate::tensors::whole_view(obj)? {
            Some(Whole::Received(r)) => Some(r.get().tensor.clone()),
            Some(Whole::Allocated(o)) => Some(o.get().take()?),
            None => crate::tensors::small_copy(obj)?,
        };
        if let Some(t) = native {
            self.tensors.push(t);
            return Ok(serde_json::json!({ TENSOR_KEY: self.tensors.len() - 1 }));
        }
        let got = self.hook.call1((obj, self.client))?;
        let tensor = if let Ok(o) = got.cast::<OutTensor>() {
            Some(o.get().take()?)
        } else if let Ok(d) = got.cast::<DeviceTensor>() {
            Some(d.get().tensor.clone())
        } else {
            got.cast::<TensorRef>().ok().map(|r| r.get().tensor.clone())
        };
        if let Some(t) = tensor {
            self.tensors.push(t);
            return Ok(serde_json::json!({ TENSOR_KEY: self.tensors.len() - 1 }));
        }
        if got.is_none() {
            let t = obj.get_type();
            return Err(params_error(
                obj.py(),
                format!(
                    "{path} is of type {}.{} ({obj:.60}), which ferry cannot send: pass JSON values (None, bool, \
                     int, float, str, lists, tuples, dicts with str keys), numpy arrays, torch tensors, CUDA arrays \
                     (`__cuda_array_interface__`) or tensor references; convert it to one of those first",
                    t.module()?,
                    t.qualname()?
                ),
            ));
        }
        if got.is(obj) {
            return Err(params_error(obj.py(), format!("{path}: the encode hook returned its input")));
        }
        self.value(&got, path, depth + 1)
    }
}

/// The hooks a result's tensors are given to.
pub(crate) struct Decoder<'a, 'py> {
    /// Takes a `TensorRef`, returns the array (numpy or torch).
    pub tensor: &'a Bound<'py, PyAny>,
    /// Takes the inside of `{"$tensor_ref": ..}`, returns the reference object.
    pub tensor_ref: &'a Bound<'py, PyAny>,
    /// The message's tensors.
    pub tensors: &'a [Tensor],
    /// Whether `tensor` makes numpy arrays (those of numpy's own dtypes are then made
    /// here, as it would).
    pub numpy: bool,
}

impl<'py> Decoder<'_, 'py> {
    /// `v` as Python objects, tensors given to the hooks.
    pub fn decode(&self, py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
        Ok(match v {
            Value::Array(items) => {
                let list = PyList::empty(py);
                for item in items {
                    list.append(self.decode(py, item)?)?;
                }
                list.into_any()
            }
            Value::Object(map) => {
                if map.len() == 1
                    && let Some(t) = self.special(py, v)?
                {
                    return Ok(t);
                }
                let dict = PyDict::new(py);
                for (k, item) in map {
                    dict.set_item(k, self.decode(py, item)?)?;
                }
                dict.into_any()
            }
            v => crate::json::to_py(py, v)?,
        })
    }

    /// A one-key object that stands for a tensor or a tensor reference, as its object.
    fn special(&self, py: Python<'py>, v: &Value) -> PyResult<Option<Bound<'py, PyAny>>> {
        if let Some(inner) = v.get(REF_KEY) {
            if inner.get("id").is_some_and(Value::is_string) {
                return Ok(Some(self.tensor_ref.call1((crate::json::to_py(py, inner)?,))?));
            }
            return Ok(None);
        }
        let Some(inner) = v.get(TENSOR_KEY) else { return Ok(None) };
        let t = match inner {
            Value::Number(n) => {
                let i = n.as_u64().and_then(|i| usize::try_from(i).ok());
                match i.and_then(|i| self.tensors.get(i)) {
                    Some(t) => t.clone(),
                    None => {
                        return Err(result_error(
                            py,
                            format!(
                                "the result refers to tensor {n}, but its message has {} tensors",
                                self.tensors.len()
                            ),
                        ));
                    }
                }
            }
            Value::Object(o) if o.contains_key("dtype") && o.contains_key("data") => {
                ferry_rpc::tensor::from_value::<RpcTensor>(v.clone(), &[])
                    .map_err(|e| result_error(py, format!("malformed inline tensor: {e}")))?
                    .into_inner()
            }
            // Another object whose only key is `$tensor` (an OpenRPC schema has one).
            _ => return Ok(None),
        };
        let obj = crate::device::received(py, t)?.into_bound(py);
        if self.numpy
            && let Ok(r) = obj.cast::<TensorRef>()
            && let Some(a) = crate::tensors::numpy_view(r)?
        {
            return Ok(Some(a));
        }
        Ok(Some(self.tensor.call1((obj,))?))
    }
}
