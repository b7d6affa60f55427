//! The compact form of a tensor descriptor (PROTOCOL.md §7.3): a JSON array instead of the
//! `{"meta": .., "data": ..}` object, for the tensors nearly every message carries (on the
//! CPU, without strides, inline, in shared memory or sent back into it):
//!
//! ```json
//! ["f32", [1920, 1080, 3], "shm_return", 4, 0, 24883200]
//! ```
//!
//! A sender writes it only to a peer that announced [`crate::wire::FEATURE_COMPACT_TENSORS`] in the
//! handshake; every other descriptor, and every descriptor to any other peer, goes as an
//! object. A receiver takes both forms. The object has four maps and eleven keys that
//! each side builds, parses and frees per tensor; the array has none, which is most of what
//! a tensor costs a Python client per call.

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::dtype::{DType, Device};
use crate::meta::TensorMeta;
use crate::wire::{InlineRef, Location, ShmRef, ShmReturnRef, TensorDesc, WireInt};

/// A message's descriptors as they go on the wire: each as the compact array when
/// `compact` (the peer takes it) and the descriptor has one, else as the object. (The
/// Pipe's writer serializes them so; the shared test vectors of `conformance/vectors` too.)
pub struct DescsOut<'a> {
    /// The descriptors, in message order.
    pub descs: &'a [TensorDesc],
    /// Whether the peer agreed to [`crate::wire::FEATURE_COMPACT_TENSORS`].
    pub compact: bool,
}

impl Serialize for DescsOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.descs.iter().map(|desc| DescOut { desc, compact: self.compact }))
    }
}

/// One descriptor of [`DescsOut`].
struct DescOut<'a> {
    desc: &'a TensorDesc,
    compact: bool,
}

impl Serialize for DescOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let TensorDesc { meta, data } = self.desc;
        if self.compact && meta.strides.is_none() && meta.device == Device::Cpu {
            let (dtype, shape) = (meta.dtype, &meta.shape);
            match data {
                Location::Inline(r) => return (dtype, shape, "inline", r.offset, r.len).serialize(s),
                Location::Shm(r) if r.announce.is_none() => {
                    let ShmRef { segment, offset, len, lease, .. } = *r;
                    return if r.lazy_release {
                        (dtype, shape, "shm", segment, offset, len, lease, true).serialize(s)
                    } else {
                        (dtype, shape, "shm", segment, offset, len, lease).serialize(s)
                    };
                }
                Location::ShmReturn(r) => return (dtype, shape, "shm_return", r.lease, r.offset, r.len).serialize(s),
                _ => {}
            }
        }
        self.desc.serialize(s)
    }
}

/// The object form, as derived (the compact form is read by [`DescVisitor`]).
#[derive(Deserialize, JsonSchema)]
#[schemars(rename = "TensorDescObject")]
struct ObjectForm {
    /// dtype, shape, strides, device.
    meta: TensorMeta,
    /// Where the bytes are; the variant names the channel.
    data: Location,
}

/// The locations a compact descriptor can name.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum CompactKind {
    Inline,
    Shm,
    ShmReturn,
}

impl<'de> Deserialize<'de> for TensorDesc {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DescVisitor)
    }
}

struct DescVisitor;

const EXPECTED: &str = "a tensor descriptor: an object {\"meta\", \"data\"} or a compact array \
                        [dtype, shape, \"inline\" | \"shm\" | \"shm_return\", ..]";

impl<'de> Visitor<'de> for DescVisitor {
    type Value = TensorDesc;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(EXPECTED)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<TensorDesc, A::Error> {
        let o = ObjectForm::deserialize(de::value::MapAccessDeserializer::new(map))?;
        Ok(TensorDesc { meta: o.meta, data: o.data })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TensorDesc, A::Error> {
        let dtype: DType = element(&mut seq, 0)?;
        let shape: Vec<u64> = element(&mut seq, 1)?;
        let data = match element::<CompactKind, A>(&mut seq, 2)? {
            CompactKind::Inline => Location::Inline(InlineRef { offset: int(&mut seq, 3)?, len: int(&mut seq, 4)? }),
            CompactKind::Shm => Location::Shm(ShmRef {
                segment: int(&mut seq, 3)?,
                offset: int(&mut seq, 4)?,
                len: int(&mut seq, 5)?,
                lease: int(&mut seq, 6)?,
                announce: None,
                lazy_release: seq.next_element::<bool>()?.unwrap_or(false),
            }),
            CompactKind::ShmReturn => Location::ShmReturn(ShmReturnRef {
                lease: int(&mut seq, 3)?,
                offset: int(&mut seq, 4)?,
                len: int(&mut seq, 5)?,
            }),
        };
        if seq.next_element::<IgnoredAny>()?.is_some() {
            return Err(de::Error::custom("compact tensor descriptor has more elements than its location takes"));
        }
        Ok(TensorDesc { meta: TensorMeta::new(dtype, shape), data })
    }
}

/// Integer element `i` of a compact descriptor, under the [`crate::wire::MAX_WIRE_INT`] rule.
fn int<'de, A: SeqAccess<'de>>(seq: &mut A, i: usize) -> Result<u64, A::Error> {
    element::<WireInt, A>(seq, i).map(|v| v.0)
}

/// Element `i` of a compact descriptor, which must be there.
fn element<'de, T: Deserialize<'de>, A: SeqAccess<'de>>(seq: &mut A, i: usize) -> Result<T, A::Error> {
    seq.next_element()?.ok_or_else(|| de::Error::invalid_length(i, &EXPECTED))
}

impl JsonSchema for TensorDesc {
    fn schema_name() -> Cow<'static, str> {
        "TensorDesc".into()
    }

    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        let object = g.subschema_for::<ObjectForm>();
        let dtype = g.subschema_for::<DType>();
        let u64 = json_schema!({"type": "integer", "format": "uint64", "minimum": 0});
        let shape = json_schema!({"type": "array", "items": u64});
        let int = g.subschema_for::<WireInt>();
        let compact = |kind: &str, fields: &[&str], flag: Option<&str>| {
            let mut items = vec![dtype.clone(), shape.clone(), json_schema!({"const": kind})];
            items.extend(fields.iter().map(|_| int.clone()));
            let min = items.len();
            let mut names = fields.join(", ");
            if let Some(f) = flag {
                items.push(json_schema!({"type": "boolean"}));
                names += &format!(", optional boolean {f}");
            }
            let max = items.len();
            json_schema!({
                "type": "array",
                "description": format!("compact {kind}: [dtype, shape, \"{kind}\", {names}]"),
                "prefixItems": items,
                "items": false,
                "minItems": min,
                "maxItems": max,
            })
        };
        json_schema!({
            "description": "Describes one tensor of a message: what it is and where its bytes are. \
                            An object, or (to a peer that announced the `compact_tensors` feature) a compact \
                            array for a CPU tensor without strides (PROTOCOL.md 7.3).",
            "oneOf": [
                object,
                compact("inline", &["offset", "len"], None),
                compact("shm", &["segment", "offset", "len", "lease"], Some("lazy_release")),
                compact("shm_return", &["lease", "offset", "len"], None),
            ],
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::wire::SegmentAnnounce;

    fn desc(data: Location) -> TensorDesc {
        TensorDesc { meta: TensorMeta::new(DType::F32, vec![1920, 1080, 3]), data }
    }

    fn out(d: &TensorDesc, compact: bool) -> serde_json::Value {
        serde_json::to_value(DescOut { desc: d, compact }).unwrap()
    }

    #[test]
    fn the_common_locations_go_compact_and_read_back_the_same() {
        let shm = ShmRef { segment: 2, offset: 64, len: 24_883_200, lease: 9, announce: None, lazy_release: false };
        let cases = [
            (Location::Inline(InlineRef { offset: 0, len: 12 }), json!(["f32", [1920, 1080, 3], "inline", 0, 12])),
            (Location::Shm(shm), json!(["f32", [1920, 1080, 3], "shm", 2, 64, 24_883_200u64, 9])),
            (
                Location::Shm(ShmRef { lazy_release: true, ..shm }),
                json!(["f32", [1920, 1080, 3], "shm", 2, 64, 24_883_200u64, 9, true]),
            ),
            (
                Location::ShmReturn(ShmReturnRef { lease: 4, offset: 0, len: 24_883_200 }),
                json!(["f32", [1920, 1080, 3], "shm_return", 4, 0, 24_883_200u64]),
            ),
        ];
        for (loc, want) in cases {
            let d = desc(loc);
            let v = out(&d, true);
            assert_eq!(v, want);
            assert_eq!(serde_json::from_value::<TensorDesc>(v).unwrap(), d);
            // Not negotiated: the object, which reads back the same too.
            let v = out(&d, false);
            assert!(v.is_object(), "{v}");
            assert_eq!(serde_json::from_value::<TensorDesc>(v).unwrap(), d);
        }
    }

    #[test]
    fn what_the_compact_form_cannot_say_goes_as_an_object() {
        let announce = Some(SegmentAnnounce { fd: 0, size: 64 << 20 });
        let shm = ShmRef { segment: 1, offset: 0, len: 4, lease: 1, announce, lazy_release: false };
        let strided = TensorDesc {
            meta: TensorMeta::new(DType::U8, vec![2, 2]).with_strides(vec![1, 2]),
            data: Location::Inline(InlineRef { offset: 0, len: 4 }),
        };
        let cuda = TensorDesc {
            meta: TensorMeta::new(DType::U8, vec![4]).with_device(Device::Cuda(0)),
            data: Location::ShmReturn(ShmReturnRef { lease: 1, offset: 0, len: 4 }),
        };
        for d in [desc(Location::Shm(shm)), strided, cuda] {
            let v = out(&d, true);
            assert!(v.is_object(), "{v}");
            assert_eq!(serde_json::from_value::<TensorDesc>(v).unwrap(), d);
        }
    }

    #[test]
    fn malformed_compact_descriptors_are_errors_that_say_what_is_wrong() {
        for (v, needle) in [
            (json!([]), "invalid length 0"),
            (json!(["f32", [2]]), "invalid length 2"),
            (json!(["f32", [2], "inline", 0]), "invalid length 4"),
            (json!(["f32", [2], "inline", 0, 8, 1]), "more elements than its location takes"),
            (json!(["f32", [2], "shm", 0, 0, 8, 1, true, 5]), "more elements than its location takes"),
            (json!(["f32", [2], "shm", 0, 0, 8, 1, 1]), "expected a boolean"),
            (json!(["f32", [2], "quic_stream", 0]), "unknown variant `quic_stream`"),
            (json!(["f31", [2], "inline", 0, 8]), "unknown variant `f31`"),
            (json!(["f32", [-2], "inline", 0, 8]), "invalid value: integer `-2`"),
            (json!(["f32", [2], "shm_return", -1, 0, 8]), "invalid value: integer `-1`"),
            (json!(["f32", [2], "inline", 0, 18_446_744_073_709_551_616.0]), "invalid type: floating point"),
            (json!("f32"), "a tensor descriptor"),
            // Integers over 2^53 - 1 are refused in both forms (PROTOCOL.md 5.5).
            (json!(["f32", [2], "inline", 9_007_199_254_740_992u64, 8]), "0..=9007199254740991"),
            (json!(["f32", [2], "shm", 0, 0, 8, u64::MAX]), "invalid value: integer `18446744073709551615`"),
            (json!(["f32", [2], "shm_return", 1, 0, 9_007_199_254_740_992u64]), "2^53 - 1"),
            (
                json!({"meta": {"dtype": "u8", "shape": [2]}, "data": {"shm": {"segment": 9_007_199_254_740_992u64,
                "offset": 0, "len": 2, "lease": 1}}}),
                "0..=9007199254740991",
            ),
        ] {
            let e = serde_json::from_value::<TensorDesc>(v.clone()).unwrap_err().to_string();
            assert!(e.contains(needle), "{v}: {e}");
        }
    }

    #[test]
    fn the_largest_wire_integer_reads_back() {
        let max = crate::wire::MAX_WIRE_INT;
        let v = json!(["u8", [0], "shm", max, max, 0, max, true]);
        let d: TensorDesc = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(
            d.data,
            Location::Shm(ShmRef { segment: max, offset: max, len: 0, lease: max, announce: None, lazy_release: true })
        );
        assert_eq!(out(&d, true), v);
    }

    #[test]
    fn a_message_header_reads_both_forms_side_by_side() {
        let text = r#"{"header":{"id":1},"tensors":[["u8",[4],"inline",0,4],
            {"meta":{"dtype":"u8","shape":[4]},"data":{"inline":{"offset":64,"len":4}}}]}"#;
        let h: crate::wire::MessageHeader = serde_json::from_str(text).unwrap();
        assert_eq!(h.tensors.len(), 2);
        assert_eq!(h.tensors[0].data, Location::Inline(InlineRef { offset: 0, len: 4 }));
        assert_eq!(h.tensors[1].data, Location::Inline(InlineRef { offset: 64, len: 4 }));
    }
}
