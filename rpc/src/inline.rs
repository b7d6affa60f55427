//! The inline tensor encoding of plain JSON and HTTP connections, as a [`TensorCodec`]:
//! [`InlineCodec`].
//!
//! One tensor is an [`InlineTensor`], `{"dtype", "shape", "strides"?, "data"}` with the
//! bytes in standard base64, wrapped as `{"$tensor": ..}` wherever it appears in params or
//! results ([`crate::tensor`]). A named tensor map is a JSON object of such tensors: what a
//! [`crate::TensorMap`] is on a plain JSON or HTTP connection, and the bytes of
//! [`InlineCodec`]'s `encode` and `decode`.
//!
//! The per-tensor halves ([`InlineCodec::encode_tensor`], [`InlineCodec::decode_tensor`])
//! are what serde calls while it writes or reads a params or result value, one tensor at a
//! time inside a larger JSON document; [`TensorCodec::encode`] and [`TensorCodec::decode`]
//! use the same two for a whole map.

use std::collections::HashSet;
use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use ferry_core::codec::MAX_CODEC_TENSORS;
use ferry_core::{AlignedBuf, CodecError, DType, Device, Tensor, TensorCodec, TensorMeta};
use schemars::JsonSchema;
use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The codec's name.
const NAME: &str = "inline-json";

/// The inline form of a tensor (plain JSON and HTTP connections).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InlineTensor {
    /// Element type.
    pub dtype: DType,
    /// Dimensions (`[]` for a scalar).
    pub shape: Vec<u64>,
    /// Strides in elements; absent for contiguous row-major tensors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strides: Option<Vec<i64>>,
    /// The bytes (little-endian, standard base64 with padding).
    pub data: String,
}

impl InlineTensor {
    /// The inline form of a host tensor ([`InlineCodec::encode_tensor`]).
    pub fn encode(t: &Tensor) -> Result<InlineTensor, String> {
        InlineCodec::encode_tensor("", t).map_err(reason)
    }

    /// The tensor, its bytes checked against dtype, shape and strides
    /// ([`InlineCodec::decode_tensor`]).
    pub fn decode(&self) -> Result<Tensor, String> {
        InlineCodec::decode_tensor("", self).map_err(reason)
    }
}

/// What went wrong, without the codec's and the tensor's name (the RPC layer's messages
/// name the field instead).
fn reason(e: CodecError) -> String {
    match e {
        CodecError::Malformed { reason, .. } | CodecError::Unsupported { reason, .. } => reason,
        CodecError::Meta { source, .. } => source.to_string(),
        other => other.to_string(),
    }
}

/// Named tensor maps as the JSON text of plain JSON and HTTP connections:
/// `{"name": {"$tensor": {"dtype", "shape", "data": base64}}, ..}`, the form a
/// [`crate::TensorMap`] takes there. Host tensors only; strides are kept. `decode` copies
/// each tensor's bytes once (out of base64, into 64-byte aligned memory) and returns the
/// tensors in the text's order; a name given twice is an error both ways.
#[derive(Debug, Default, Clone, Copy)]
pub struct InlineCodec;

impl InlineCodec {
    /// The inline form of the host tensor `t` (`name` only for errors).
    pub fn encode_tensor(name: &str, t: &Tensor) -> Result<InlineTensor, CodecError> {
        if t.device() != Device::Cpu {
            return Err(CodecError::Unsupported {
                codec: NAME,
                name: name.into(),
                reason: format!("a tensor on {} cannot be sent inline; copy it to the cpu first", t.device()),
            });
        }
        Ok(InlineTensor {
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            strides: t.meta().strides.clone(),
            data: B64.encode(t.as_bytes()),
        })
    }

    /// The tensor `t` describes, its bytes checked against dtype, shape and strides (`name`
    /// only for errors).
    pub fn decode_tensor(name: &str, t: &InlineTensor) -> Result<Tensor, CodecError> {
        let bytes = B64
            .decode(t.data.as_bytes())
            .map_err(|e| CodecError::Malformed { codec: NAME, reason: format!("data is not valid base64: {e}") })?;
        let mut meta = TensorMeta::new(t.dtype, t.shape.clone());
        meta.strides = t.strides.clone();
        Tensor::new(meta, AlignedBuf::copy_from(&bytes).into_bytes())
            .map_err(|source| CodecError::Meta { name: name.into(), source })
    }
}

/// `{"$tensor": inline}` (the key is [`crate::tensor::TENSOR_KEY`]), one value of the map.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wrapped {
    #[serde(rename = "$tensor")]
    tensor: InlineTensor,
}

/// The map as written: entries in the given order.
struct MapOut<'a>(&'a [(&'a str, InlineTensor)]);

impl Serialize for MapOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct WrappedRef<'a> {
            #[serde(rename = "$tensor")]
            tensor: &'a InlineTensor,
        }
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (name, tensor) in self.0 {
            map.serialize_entry(name, &WrappedRef { tensor })?;
        }
        map.end()
    }
}

/// The map as read: entries in the text's order, each name once, at most
/// [`MAX_CODEC_TENSORS`].
struct MapIn(Vec<(String, InlineTensor)>);

impl<'de> Deserialize<'de> for MapIn {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = MapIn;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of named tensors, each {\"$tensor\": {dtype, shape, data}}")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<MapIn, A::Error> {
                let mut out = Vec::new();
                let mut seen = HashSet::new();
                while let Some(name) = map.next_key::<String>()? {
                    if out.len() == MAX_CODEC_TENSORS {
                        return Err(serde::de::Error::custom(format!("more than {MAX_CODEC_TENSORS} tensors")));
                    }
                    if !seen.insert(name.clone()) {
                        return Err(serde::de::Error::custom(format!("tensor {name:?} is given twice")));
                    }
                    let w: Wrapped = map.next_value()?;
                    out.push((name, w.tensor));
                }
                Ok(MapIn(out))
            }
        }
        d.deserialize_map(V)
    }
}

impl TensorCodec for InlineCodec {
    fn name(&self) -> &'static str {
        NAME
    }

    fn encode(&self, tensors: &[(String, Tensor)], dst: &mut Vec<u8>) -> Result<(), CodecError> {
        let mut seen = HashSet::with_capacity(tensors.len());
        let mut entries = Vec::with_capacity(tensors.len());
        for (name, t) in tensors {
            if !seen.insert(name.as_str()) {
                return Err(CodecError::Unsupported {
                    codec: NAME,
                    name: name.clone(),
                    reason: "the name is given twice (a JSON object holds each name once)".into(),
                });
            }
            entries.push((name.as_str(), Self::encode_tensor(name, t)?));
        }
        serde_json::to_writer(dst, &MapOut(&entries))
            .map_err(|e| CodecError::Malformed { codec: NAME, reason: e.to_string() })
    }

    fn decode(&self, src: Bytes) -> Result<Vec<(String, Tensor)>, CodecError> {
        let MapIn(entries) =
            serde_json::from_slice(&src).map_err(|e| CodecError::Malformed { codec: NAME, reason: e.to_string() })?;
        entries.into_iter().map(|(name, t)| Ok((name.clone(), Self::decode_tensor(&name, &t)?))).collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{RpcTensor, TensorMap};

    fn sample() -> Vec<(String, Tensor)> {
        vec![
            ("w".into(), Tensor::from_slice(vec![2, 3], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap()),
            ("b".into(), Tensor::from_slice(vec![3], &[7i64, 8, 9]).unwrap()),
            ("e".into(), Tensor::from_slice(vec![0, 4], &[0u8; 0]).unwrap()),
            (
                "t".into(),
                Tensor::new(
                    TensorMeta::new(DType::U8, vec![2, 2]).with_strides(vec![1, 2]),
                    Bytes::from_static(&[1, 2, 3, 4]),
                )
                .unwrap(),
            ),
        ]
    }

    #[test]
    fn round_trips_through_the_trait_in_order() {
        let codec: &dyn TensorCodec = &InlineCodec;
        assert_eq!(codec.name(), "inline-json");
        let mut buf = Vec::new();
        codec.encode(&sample(), &mut buf).unwrap();
        assert_eq!(codec.decode(Bytes::from(buf)).unwrap(), sample());
    }

    #[test]
    fn the_bytes_are_a_tensor_map_as_plain_json_clients_send_it() {
        let map: TensorMap = sample().into_iter().map(|(n, t)| (n, RpcTensor(t))).collect();
        // Outside a pipe, serde writes every tensor inline: the same text, in name order.
        let text = serde_json::to_vec(&map).unwrap();
        let mut sorted = sample();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        let mut buf = Vec::new();
        InlineCodec.encode(&sorted, &mut buf).unwrap();
        assert_eq!(String::from_utf8(buf).unwrap(), String::from_utf8(text.clone()).unwrap());
        // And what a client sends decodes to the same tensors.
        let sent = json!({"x": {"$tensor": {"dtype": "f32", "shape": [1], "data": "AADAPw=="}}});
        let got = InlineCodec.decode(Bytes::from(sent.to_string())).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, "x");
        assert_eq!(got[0].1.as_slice::<f32>().unwrap(), &[1.5]);
        assert_eq!(InlineCodec.decode(Bytes::from(text)).unwrap(), sorted);
    }

    #[test]
    fn bad_input_is_a_codec_error_naming_the_tensor() {
        let dec = |v: serde_json::Value| InlineCodec.decode(Bytes::from(v.to_string())).unwrap_err().to_string();
        let e = dec(json!({"x": {"$tensor": {"dtype": "f32", "shape": [2], "data": "AADAPw=="}}}));
        assert_eq!(e, "tensor \"x\": tensor needs 8 bytes but 4 are present");
        let e = dec(json!({"x": {"$tensor": {"dtype": "f32", "shape": [1], "data": "%%%"}}}));
        assert!(e.starts_with("malformed inline-json data: data is not valid base64"), "{e}");
        assert!(dec(json!({"x": {"$tensor": 0}})).contains("malformed inline-json data"));
        assert!(dec(json!({"x": {"$tensor": {"dtype": "f32", "shape": [0], "data": ""}, "y": 1}})).contains("unknown"));
        assert!(dec(json!([1])).contains("an object of named tensors"));
        let twice = r#"{"a": {"$tensor": {"dtype": "u8", "shape": [0], "data": ""}},
                        "a": {"$tensor": {"dtype": "u8", "shape": [0], "data": ""}}}"#;
        let e = InlineCodec.decode(Bytes::from_static(twice.as_bytes())).unwrap_err().to_string();
        assert!(e.contains("\"a\" is given twice"), "{e}");
        let t = sample().remove(0).1;
        let e = InlineCodec.encode(&[("a".into(), t.clone()), ("a".into(), t)], &mut Vec::new()).unwrap_err();
        assert!(e.to_string().contains("given twice"), "{e}");
        for junk in [
            &b""[..],
            b"{",
            b"\xff",
            b"{\"a\":{\"$tensor\":{\"dtype\":\"f32\",\"shape\":[18446744073709551615],\"data\":\"\"}}}",
        ] {
            assert!(InlineCodec.decode(Bytes::copy_from_slice(junk)).is_err());
        }
    }

    #[test]
    fn the_per_tensor_halves_keep_the_rpc_messages() {
        let e = InlineTensor { dtype: DType::F32, shape: vec![2], strides: None, data: "AADAPw==".into() }.decode();
        assert_eq!(e.unwrap_err(), "tensor needs 8 bytes but 4 are present");
        let e = InlineTensor { dtype: DType::F32, shape: vec![1], strides: None, data: "!".into() }.decode();
        assert!(e.unwrap_err().starts_with("data is not valid base64: "));
    }
}
