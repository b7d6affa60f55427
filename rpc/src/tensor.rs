//! Tensors inside JSON-RPC params and results.
//!
//! A field of type [`RpcTensor`] (or a [`TensorMap`], a named map of them) may appear
//! anywhere in a params or result type. How it is written depends on the connection:
//!
//! - On a ferry pipe, `{"$tensor": i}`: an index into the [`ferry_core::Message`]'s tensors,
//!   which travel over the negotiated channel (inline, shm, ...), zero-copy where it allows.
//! - On plain JSON (newline-delimited on the socket) and HTTP, the tensor is inline:
//!   `{"$tensor": {"dtype": "f32", "shape": [2, 2], "data": "<base64>"}}` (standard base64
//!   with padding of the little-endian, row-major bytes; `strides` in elements if the
//!   tensor is strided, `data` then holds its whole span). A ferry pipe accepts this form
//!   in params too.
//!
//! An object whose only key is `"$tensor"` is therefore reserved: do not use that shape for
//! anything else.
//!
//! The inline form is [`InlineCodec`]'s, core's [`ferry_core::TensorCodec`] for plain JSON
//! and HTTP ([`crate::inline`]): every inline tensor is written and read by its
//! per-tensor halves, and a [`TensorMap`] on those connections is exactly the text its
//! `encode` writes.
//!
//! How it works: [`to_value`] and [`from_value`] install a tensor table for the current
//! thread, run serde synchronously, and take the table back; `RpcTensor`'s `Serialize` and
//! `Deserialize` read and write that table. Serialized any other way (plain
//! `serde_json::to_value`, `json!`), an `RpcTensor` takes the inline form, which every
//! connection accepts, so nothing is lost (only speed); a `{"$tensor": i}` reference
//! cannot be resolved outside the RPC layer and is an error there.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Deref;

use ferry_core::Tensor;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{DeserializeOwned, Error as _};
use serde::ser::{Error as _, SerializeMap as _};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

pub use crate::inline::{InlineCodec, InlineTensor};

/// The reserved key of a tensor reference.
pub const TENSOR_KEY: &str = "$tensor";

/// How tensors are written by [`to_value`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorMode {
    /// `{"$tensor": i}`, the tensor itself appended to the returned list (ferry pipes).
    Refs,
    /// `{"$tensor": {"dtype", "shape", "data": base64}}` (plain JSON and HTTP).
    Inline,
}

/// A tensor as a JSON-RPC param or result field. Derefs to [`ferry_core::Tensor`].
#[derive(Clone, PartialEq)]
pub struct RpcTensor(pub Tensor);

/// A named tensor map (a model's weights): a JSON object whose values are tensors.
pub type TensorMap = BTreeMap<String, RpcTensor>;

impl RpcTensor {
    /// The tensor.
    pub fn into_inner(self) -> Tensor {
        self.0
    }
}

impl Deref for RpcTensor {
    type Target = Tensor;
    fn deref(&self) -> &Tensor {
        &self.0
    }
}

impl From<Tensor> for RpcTensor {
    fn from(t: Tensor) -> Self {
        RpcTensor(t)
    }
}

impl From<RpcTensor> for Tensor {
    fn from(t: RpcTensor) -> Self {
        t.0
    }
}

impl fmt::Debug for RpcTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

enum Table {
    Encode { mode: TensorMode, out: Vec<Tensor> },
    Decode { tensors: Vec<Tensor> },
}

thread_local! {
    static TABLE: RefCell<Option<Table>> = const { RefCell::new(None) };
}

/// Installs a table for the current thread and restores the previous one when dropped
/// (also on panic), so nested use is safe.
struct Installed(Option<Table>);

impl Installed {
    fn new(t: Table) -> Installed {
        Installed(TABLE.with(|c| c.replace(Some(t))))
    }

    fn take(mut self) -> Option<Table> {
        TABLE.with(|c| c.replace(self.0.take()))
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        let prev = self.0.take();
        TABLE.with(|c| *c.borrow_mut() = prev);
    }
}

/// Serializes `value`, writing each [`RpcTensor`] as `mode` says. With
/// [`TensorMode::Refs`] the tensors are returned in reference order.
pub fn to_value<T: Serialize + ?Sized>(value: &T, mode: TensorMode) -> Result<(Value, Vec<Tensor>), serde_json::Error> {
    let guard = Installed::new(Table::Encode { mode, out: Vec::new() });
    let v = serde_json::to_value(value);
    let out = match guard.take() {
        Some(Table::Encode { out, .. }) => out,
        _ => Vec::new(),
    };
    let v = v?;
    // serde_json writes a non-finite float as null: where a null appears, make sure it was
    // meant (the walk is paid only then; tensors are not encoded by it).
    if has_null(&v) {
        let _walk = Installed::new(Table::Encode { mode: TensorMode::Refs, out: Vec::new() });
        crate::finite::check(value).map_err(<serde_json::Error as serde::ser::Error>::custom)?;
    }
    Ok((v, out))
}

fn has_null(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.iter().any(has_null),
        Value::Object(o) => o.values().any(has_null),
        _ => false,
    }
}

/// Deserializes `value`, resolving `{"$tensor": i}` against `tensors` (cheap clones) and
/// decoding inline tensors. The error carries the path of the offending field.
pub fn from_value<T: DeserializeOwned>(
    value: Value,
    tensors: &[Tensor],
) -> Result<T, serde_path_to_error::Error<serde_json::Error>> {
    let guard = Installed::new(Table::Decode { tensors: tensors.to_vec() });
    // Most params decode: try without tracking the path (a third of the cost), and only
    // on failure again with it, for the error's path.
    let r = match T::deserialize(&value) {
        Ok(t) => Ok(t),
        Err(_) => serde_path_to_error::deserialize(value),
    };
    drop(guard);
    r
}

impl Serialize for RpcTensor {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        enum Out {
            Index(usize),
            Inline(InlineTensor),
        }
        let out = TABLE.with(|c| match &mut *c.borrow_mut() {
            Some(Table::Encode { mode: TensorMode::Refs, out }) => {
                out.push(self.0.clone());
                Ok(Out::Index(out.len() - 1))
            }
            // Outside the RPC layer (e.g. `serde_json::json!`), the inline form: lossless.
            _ => InlineTensor::encode(&self.0).map(Out::Inline),
        });
        let mut map = s.serialize_map(Some(1))?;
        match out.map_err(S::Error::custom)? {
            Out::Index(i) => map.serialize_entry(TENSOR_KEY, &i)?,
            Out::Inline(t) => map.serialize_entry(TENSOR_KEY, &t)?,
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for RpcTensor {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        let Value::Object(mut obj) = v else {
            return Err(D::Error::custom(format!(
                "expected a tensor ({{\"$tensor\": index}} or {{\"$tensor\": {{dtype, shape, data}}}}), got {}",
                kind(&v)
            )));
        };
        let inner = obj.remove(TENSOR_KEY).ok_or_else(|| D::Error::custom("expected a tensor: no \"$tensor\" key"))?;
        if let Some(k) = obj.keys().next() {
            return Err(D::Error::custom(format!("unexpected key {k:?} beside \"$tensor\"")));
        }
        match inner {
            Value::Number(n) => {
                let i = n
                    .as_u64()
                    .ok_or_else(|| D::Error::custom(format!("tensor index must be a non-negative integer, got {n}")))?;
                TABLE.with(|c| match &*c.borrow() {
                    Some(Table::Decode { tensors }) => {
                        usize::try_from(i).ok().and_then(|i| tensors.get(i)).cloned().map(RpcTensor).ok_or_else(|| {
                            D::Error::custom(format!(
                                "tensor index {i} is out of range: the message carries {} tensor(s)",
                                tensors.len()
                            ))
                        })
                    }
                    _ => Err(D::Error::custom(
                        "a {\"$tensor\": index} reference can only be resolved through ferry_rpc::tensor::from_value",
                    )),
                })
            }
            inline @ Value::Object(_) => {
                let t: InlineTensor = serde_json::from_value(inline)
                    .map_err(|e| D::Error::custom(format!("invalid inline tensor: {e}")))?;
                t.decode().map(RpcTensor).map_err(|e| D::Error::custom(format!("invalid inline tensor: {e}")))
            }
            other => Err(D::Error::custom(format!(
                "\"$tensor\" must be an index or an inline tensor object, got {}",
                kind(&other)
            ))),
        }
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl JsonSchema for RpcTensor {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Tensor".into()
    }

    fn schema_id() -> std::borrow::Cow<'static, str> {
        "ferry_rpc::Tensor".into()
    }

    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        let inline = g.subschema_for::<InlineTensor>();
        json_schema!({
            "description": "A tensor. On ferry pipes {\"$tensor\": i}, an index into the message's tensors; \
                            on plain JSON and HTTP connections {\"$tensor\": {dtype, shape, data}} with the bytes \
                            in base64.",
            "type": "object",
            "required": [TENSOR_KEY],
            "additionalProperties": false,
            "properties": {
                TENSOR_KEY: {
                    "oneOf": [
                        { "type": "integer", "minimum": 0 },
                        inline,
                    ]
                }
            }
        })
    }
}

/// The index of a reference object `{"$tensor": i}` (and nothing else), if `v` is one.
pub fn ref_index(v: &Value) -> Option<u64> {
    match v {
        Value::Object(o) if o.len() == 1 => o.get(TENSOR_KEY)?.as_u64(),
        _ => None,
    }
}

/// Replaces every `{"$tensor": i}` in `v` by `f(i)`, depth first. Stops at the first error.
pub fn map_refs<E>(v: &mut Value, f: &mut impl FnMut(u64) -> Result<Value, E>) -> Result<(), E> {
    if let Some(i) = ref_index(v) {
        *v = f(i)?;
        return Ok(());
    }
    match v {
        Value::Array(a) => a.iter_mut().try_for_each(|x| map_refs(x, f)),
        Value::Object(o) => o.values_mut().try_for_each(|x| map_refs(x, f)),
        _ => Ok(()),
    }
}

/// Rewrites the references of `v` (into `tensors`) as inline tensors.
pub fn refs_to_inline(v: &mut Value, tensors: &[Tensor]) -> Result<(), String> {
    map_refs(v, &mut |i| {
        let t = usize::try_from(i)
            .ok()
            .and_then(|i| tensors.get(i))
            .ok_or_else(|| format!("tensor index {i} out of range"))?;
        let inline = InlineTensor::encode(t)?;
        Ok(serde_json::json!({ TENSOR_KEY: serde_json::to_value(inline).map_err(|e| e.to_string())? }))
    })
}

/// Rewrites the inline tensors of `v` (`{"$tensor": {"dtype", "shape", "data"}}`, what
/// plain JSON and HTTP callers send) as references, appending the decoded tensors to
/// `tensors`: afterwards every tensor of `v` is a reference into `tensors`. For handlers
/// that read params without serde (another language's).
pub fn inline_to_refs(v: &mut Value, tensors: &mut Vec<Tensor>) -> Result<(), String> {
    if let Value::Object(o) = v
        && o.len() == 1
        && let Some(inner @ Value::Object(_)) = o.get(TENSOR_KEY)
    {
        let inline: InlineTensor = serde_json::from_value(inner.clone()).map_err(|e| format!("inline tensor: {e}"))?;
        tensors.push(inline.decode()?);
        *v = serde_json::json!({ TENSOR_KEY: tensors.len() - 1 });
        return Ok(());
    }
    match v {
        Value::Array(a) => a.iter_mut().try_for_each(|x| inline_to_refs(x, tensors)),
        Value::Object(o) => o.values_mut().try_for_each(|x| inline_to_refs(x, tensors)),
        _ => Ok(()),
    }
}

/// Adds `offset` to every reference in `v` (to merge several results into one message).
pub fn shift_refs(v: &mut Value, offset: u64) {
    if offset == 0 {
        return;
    }
    let _ = map_refs::<()>(v, &mut |i| Ok(serde_json::json!({ TENSOR_KEY: i + offset })));
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Params {
        x: RpcTensor,
        weights: TensorMap,
        n: u32,
    }

    fn t(v: &[f32]) -> Tensor {
        Tensor::from_slice(vec![v.len() as u64], v).unwrap()
    }

    #[test]
    fn refs_round_trip() {
        let p = Params {
            x: t(&[1.0]).into(),
            weights: [("b".to_owned(), t(&[2.0]).into()), ("a".to_owned(), t(&[3.0, 4.0]).into())].into(),
            n: 7,
        };
        let (v, tensors) = to_value(&p, TensorMode::Refs).unwrap();
        assert_eq!(v, json!({"x": {"$tensor": 0}, "weights": {"a": {"$tensor": 1}, "b": {"$tensor": 2}}, "n": 7}));
        assert_eq!(tensors.len(), 3);
        let back: Params = from_value(v, &tensors).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn inline_round_trip_and_conversion() {
        let p = Params { x: t(&[1.5]).into(), weights: TensorMap::new(), n: 1 };
        let (v, tensors) = to_value(&p, TensorMode::Inline).unwrap();
        assert!(tensors.is_empty());
        assert_eq!(v["x"], json!({"$tensor": {"dtype": "f32", "shape": [1], "data": "AADAPw=="}}));
        let back: Params = from_value(v.clone(), &[]).unwrap();
        assert_eq!(back, p);
        let (mut r, tensors) = to_value(&p, TensorMode::Refs).unwrap();
        refs_to_inline(&mut r, &tensors).unwrap();
        assert_eq!(r, v);
    }

    #[test]
    fn bad_refs_name_the_field() {
        let e = from_value::<Params>(json!({"x": {"$tensor": 3}, "weights": {}, "n": 1}), &[t(&[1.0])]).unwrap_err();
        assert_eq!(e.path().to_string(), "x");
        assert!(e.to_string().contains("out of range"), "{e}");
        let e =
            from_value::<Params>(json!({"x": {"$tensor": 0}, "weights": {"w": 5}, "n": 1}), &[t(&[1.0])]).unwrap_err();
        assert_eq!(e.path().to_string(), "weights.w");
        let bad = json!({"$tensor": {"dtype": "f32", "shape": [2], "data": "AADAPw=="}});
        let e = from_value::<RpcTensor>(bad, &[]).unwrap_err();
        assert!(e.to_string().contains("needs 8 bytes"), "{e}");
        let e = from_value::<RpcTensor>(json!({"$tensor": -1}), &[]).unwrap_err();
        assert!(e.to_string().contains("non-negative"), "{e}");
        let e = from_value::<RpcTensor>(json!({"$tensor": 0, "x": 1}), &[t(&[1.0])]).unwrap_err();
        assert!(e.to_string().contains("beside"), "{e}");
    }

    #[test]
    fn outside_the_rpc_layer_tensors_are_inline() {
        let v = serde_json::to_value(RpcTensor(t(&[1.5]))).unwrap();
        assert_eq!(v, json!({"$tensor": {"dtype": "f32", "shape": [1], "data": "AADAPw=="}}));
        let back: RpcTensor = serde_json::from_value(v).unwrap();
        assert_eq!(back.as_slice::<f32>().unwrap(), &[1.5]);
        let e = serde_json::from_value::<RpcTensor>(json!({"$tensor": 0})).unwrap_err();
        assert!(e.to_string().contains("from_value"), "{e}");
    }

    #[test]
    fn shifting_refs() {
        let mut v = json!([{"$tensor": 0}, {"a": {"$tensor": 1}}, {"$tensor": 0, "other": 1}]);
        shift_refs(&mut v, 2);
        assert_eq!(v, json!([{"$tensor": 2}, {"a": {"$tensor": 3}}, {"$tensor": 0, "other": 1}]));
    }
}
