//! [`TensorMeta`]: dtype, shape, strides and device, with checked size arithmetic.
//!
//! Every number here may come from a hostile peer. Nothing in this module panics or
//! overflows: [`TensorMeta::validate`] checks a description against the bytes really
//! present before any slice is made.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::dtype::{DType, Device};
use crate::error::MetaError;

/// The most dimensions a tensor may have (PyTorch allows 25, numpy 64).
pub const MAX_DIMS: usize = 64;

/// What a tensor is, without its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub struct TensorMeta {
    /// Element type.
    pub dtype: DType,
    /// Size of each dimension; `[]` is a 0-d (scalar) tensor.
    pub shape: Vec<u64>,
    /// Strides in elements, one per dimension; absent means contiguous row-major.
    /// Negative strides are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strides: Option<Vec<i64>>,
    /// Where the bytes live.
    #[serde(default)]
    pub device: Device,
}

impl TensorMeta {
    /// A contiguous CPU tensor of `dtype` and `shape`.
    pub fn new(dtype: DType, shape: impl Into<Vec<u64>>) -> Self {
        TensorMeta { dtype, shape: shape.into(), strides: None, device: Device::Cpu }
    }

    /// Sets the strides (in elements).
    pub fn with_strides(mut self, strides: impl Into<Vec<i64>>) -> Self {
        self.strides = Some(strides.into());
        self
    }

    /// Sets the device.
    pub fn with_device(mut self, device: Device) -> Self {
        self.device = device;
        self
    }

    /// Number of elements (1 for a 0-d tensor), checked.
    pub fn numel(&self) -> Result<u64, MetaError> {
        self.check_dims()?;
        self.shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d).ok_or(MetaError::Overflow))
    }

    /// Number of bytes the tensor's storage must hold, checked. For a contiguous tensor this
    /// is `numel * itemsize`; with strides it is the span from the first to the last element.
    pub fn byte_span(&self) -> Result<u64, MetaError> {
        let numel = self.numel()?;
        let item = self.dtype.itemsize() as u64;
        let Some(strides) = &self.strides else {
            return numel.checked_mul(item).ok_or(MetaError::Overflow);
        };
        if strides.len() != self.shape.len() {
            return Err(MetaError::StridesMismatch { dims: self.shape.len(), strides: strides.len() });
        }
        for (dim, &s) in strides.iter().enumerate() {
            if s < 0 {
                return Err(MetaError::NegativeStride { dim, stride: s });
            }
        }
        if numel == 0 {
            return Ok(0);
        }
        let mut last = 0u64;
        for (&d, &s) in self.shape.iter().zip(strides) {
            // d >= 1 here because numel > 0; s >= 0 checked above.
            let step = (d - 1).checked_mul(s as u64).ok_or(MetaError::Overflow)?;
            last = last.checked_add(step).ok_or(MetaError::Overflow)?;
        }
        last.checked_add(1).and_then(|n| n.checked_mul(item)).ok_or(MetaError::Overflow)
    }

    /// True when the tensor is row-major contiguous (no strides, or strides equal to the
    /// row-major ones).
    pub fn is_contiguous(&self) -> bool {
        let Some(strides) = &self.strides else { return true };
        if strides.len() != self.shape.len() {
            return false;
        }
        let mut expect = 1i64;
        for (&d, &s) in self.shape.iter().zip(strides).rev() {
            if d != 1 && s != expect {
                return false;
            }
            let Ok(d) = i64::try_from(d) else { return false };
            expect = match expect.checked_mul(d) {
                Some(e) => e,
                None => return false,
            };
        }
        true
    }

    /// Checks this description against `available` bytes of storage: dims, overflow,
    /// strides, and length. A contiguous tensor (no strides, or row-major strides) must
    /// match exactly; another strided one must fit.
    /// Returns the byte span on success.
    pub fn validate(&self, available: u64) -> Result<u64, MetaError> {
        let span = self.byte_span()?;
        // Row-major strides are the same tensor as no strides: exact match. Other strided
        // tensors (views) must fit.
        let fits = if self.is_contiguous() { span == available } else { span <= available };
        if !fits {
            return Err(MetaError::LengthMismatch { expected: span, actual: available });
        }
        Ok(span)
    }

    fn check_dims(&self) -> Result<(), MetaError> {
        if self.shape.len() > MAX_DIMS {
            return Err(MetaError::TooManyDims { dims: self.shape.len(), max: MAX_DIMS });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn contiguous_sizes() {
        let m = TensorMeta::new(DType::F32, vec![1920, 1080, 3]);
        assert_eq!(m.byte_span().unwrap(), 1920 * 1080 * 3 * 4);
        assert_eq!(TensorMeta::new(DType::F64, vec![]).byte_span().unwrap(), 8);
        assert_eq!(TensorMeta::new(DType::F64, vec![4, 0, 2]).byte_span().unwrap(), 0);
        assert!(m.validate(1920 * 1080 * 3 * 4).is_ok());
        assert_eq!(m.validate(5), Err(MetaError::LengthMismatch { expected: 1920 * 1080 * 3 * 4, actual: 5 }));
    }

    #[test]
    fn strided_sizes() {
        // A transposed 2x3 f32 view of 6 elements.
        let m = TensorMeta::new(DType::F32, vec![3, 2]).with_strides(vec![1, 3]);
        assert_eq!(m.byte_span().unwrap(), 24);
        assert!(!m.is_contiguous());
        assert!(TensorMeta::new(DType::F32, vec![2, 3]).with_strides(vec![3, 1]).is_contiguous());
        assert_eq!(m.validate(16), Err(MetaError::LengthMismatch { expected: 24, actual: 16 }));
        // Row-major strides must match exactly, like no strides (else typed views overrun).
        let rm = TensorMeta::new(DType::F32, vec![2]).with_strides(vec![1]);
        assert_eq!(rm.validate(16), Err(MetaError::LengthMismatch { expected: 8, actual: 16 }));
        assert!(matches!(
            TensorMeta::new(DType::U8, vec![2]).with_strides(vec![-1]).validate(2),
            Err(MetaError::NegativeStride { dim: 0, stride: -1 })
        ));
        assert!(matches!(
            TensorMeta::new(DType::U8, vec![2]).with_strides(vec![1, 1]).validate(2),
            Err(MetaError::StridesMismatch { .. })
        ));
    }

    #[test]
    fn hostile_sizes() {
        let m = TensorMeta::new(DType::F64, vec![u64::MAX, 2]);
        assert_eq!(m.validate(0), Err(MetaError::Overflow));
        let m = TensorMeta::new(DType::F64, vec![u64::MAX / 4]);
        assert_eq!(m.validate(0), Err(MetaError::Overflow));
        let m = TensorMeta::new(DType::U8, vec![3, 3]).with_strides(vec![i64::MAX, i64::MAX]);
        assert_eq!(m.validate(0), Err(MetaError::Overflow));
        let m = TensorMeta::new(DType::U8, vec![1; MAX_DIMS + 1]);
        assert!(matches!(m.validate(1), Err(MetaError::TooManyDims { .. })));
    }

    proptest! {
        #[test]
        fn no_metadata_panics(
            dtype in prop::sample::select(DType::ALL.to_vec()),
            shape in prop::collection::vec(any::<u64>(), 0..70),
            strides in prop::option::of(prop::collection::vec(any::<i64>(), 0..70)),
            available in any::<u64>(),
        ) {
            let m = TensorMeta { dtype, shape, strides, device: Device::Cpu };
            let _ = m.numel();
            let _ = m.is_contiguous();
            if let Ok(span) = m.validate(available) {
                prop_assert!(span <= available);
            }
        }

        #[test]
        fn small_shapes_agree(shape in prop::collection::vec(0u64..8, 0..5)) {
            let m = TensorMeta::new(DType::I16, shape.clone());
            let n: u64 = shape.iter().product();
            prop_assert_eq!(m.byte_span().unwrap(), n * 2);
            prop_assert!(m.validate(n * 2).is_ok());
        }
    }
}

/// Peer JSON through the real receiving path: a MESSAGE frame's header parsed as the
/// Pipe's reader parses it ([`crate::frame::parse_header`]), then each descriptor decoded
/// and checked against the payload's bytes by the inline channel ([`decode_inline`], which
/// ends in [`Tensor::new`] and [`TensorMeta::validate`]). Every hostile input must come back
/// as a typed error, never a panic, and the valid controls as tensors.
///
/// [`decode_inline`]: crate::inline::decode_inline
/// [`Tensor::new`]: crate::Tensor::new
#[cfg(test)]
mod hostile {
    use bytes::Bytes;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::MAX_DIMS;
    use crate::error::{ChannelError, MetaError, ProtocolError};
    use crate::wire::MessageHeader;
    use crate::{DType, Incoming, Tensor};

    /// Why [`receive`] refused a frame.
    #[derive(Debug)]
    enum Refused {
        /// The header is not a message header (JSON, types, the wire-int rule).
        Header(ProtocolError),
        /// A descriptor does not fit the frame, or its metadata its bytes.
        Channel(ChannelError),
    }

    /// What a receiver does with a MESSAGE frame's `header` and `payload` on the inline
    /// channel: the steps of `pipe::read::decode_message` for CPU tensors.
    fn receive(header: &[u8], payload: &[u8]) -> Result<Vec<Tensor>, Refused> {
        let h: MessageHeader = crate::frame::parse_header(header).map_err(Refused::Header)?;
        let mut incoming = Incoming::new(
            Bytes::copy_from_slice(payload),
            #[cfg(unix)]
            Vec::new(),
        );
        h.tensors
            .into_iter()
            .map(|d| crate::inline::decode_inline(d.meta, &d.data, &mut incoming).map_err(Refused::Channel))
            .collect()
    }

    fn message(tensors: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({"header": {"op": "x"}, "tensors": tensors})).unwrap()
    }

    fn inline(meta: Value, offset: u64, len: u64) -> Value {
        json!([{"meta": meta, "data": {"inline": {"offset": offset, "len": len}}}])
    }

    /// `depth` nested arrays around `inner`, as text (deeper than serde_json builds).
    fn nested(depth: usize, inner: &str) -> String {
        format!("{}{inner}{}", "[".repeat(depth), "]".repeat(depth))
    }

    fn bad_header(r: &Result<Vec<Tensor>, Refused>) -> bool {
        matches!(r, Err(Refused::Header(ProtocolError::BadHeader(m))) if !m.is_empty())
    }

    fn bad_descriptor(r: &Result<Vec<Tensor>, Refused>) -> bool {
        matches!(r, Err(Refused::Channel(ChannelError::BadDescriptor { channel: "inline", .. })))
    }

    fn meta_error(r: &Result<Vec<Tensor>, Refused>) -> Option<&MetaError> {
        match r {
            Err(Refused::Channel(ChannelError::Meta(e))) => Some(e),
            _ => None,
        }
    }

    const PAYLOAD: [u8; 64] = [0; 64];

    /// The shapes of a message's tensors.
    type Shapes = &'static [&'static [u64]];

    #[test]
    fn valid_descriptors_are_received_as_tensors() {
        let cases: [(&str, Vec<u8>, Shapes); 7] = [
            ("object form", message(inline(json!({"dtype": "f32", "shape": [2, 3]}), 0, 24)), &[&[2, 3]]),
            ("compact form", message(json!([["f32", [2, 3], "inline", 0, 24]])), &[&[2, 3]]),
            ("0-d scalar", message(inline(json!({"dtype": "f64", "shape": []}), 8, 8)), &[&[]]),
            ("no elements", message(json!([["u8", [4, 0], "inline", 64, 0]])), &[&[4, 0]]),
            (
                "strided view that fits",
                message(inline(json!({"dtype": "f32", "shape": [3, 2], "strides": [1, 3]}), 0, 32)),
                &[&[3, 2]],
            ),
            (
                "device cpu named",
                message(inline(json!({"dtype": "bf16", "shape": [4], "device": "cpu"}), 0, 8)),
                &[&[4]],
            ),
            (
                "two tensors over one payload",
                message(
                    json!([["u8", [64], "inline", 0, 64], {"meta": {"dtype": "i32", "shape": [16]}, "data": {"inline": {"offset": 0, "len": 64}}}]),
                ),
                &[&[64], &[16]],
            ),
        ];
        for (name, header, shapes) in cases {
            let got = receive(&header, &PAYLOAD).unwrap_or_else(|e| panic!("{name}: refused: {e:?}"));
            let got: Vec<&[u64]> = got.iter().map(Tensor::shape).collect();
            assert_eq!(got, shapes, "{name}");
        }
    }

    #[test]
    fn hostile_json_is_a_typed_header_error() {
        let f32_2 = |meta_key: &str, v: Value| {
            let mut meta = json!({"dtype": "f32", "shape": [2]});
            meta[meta_key] = v;
            message(inline(meta, 0, 8))
        };
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("not JSON", br#"{"header": null, "tensors": ["#.to_vec()),
            ("not an object", b"[1, 2, 3]".to_vec()),
            ("tensors is an object", br#"{"header": 0, "tensors": {}}"#.to_vec()),
            ("unknown dtype", f32_2("dtype", json!("f33"))),
            ("dtype is a number", f32_2("dtype", json!(7))),
            ("shape is a string", f32_2("shape", json!("2x3"))),
            ("negative size", f32_2("shape", json!([-1]))),
            ("fractional size", f32_2("shape", json!([1.5]))),
            ("size past u64", br#"{"header":0,"tensors":[["u8",[18446744073709551616],"inline",0,1]]}"#.to_vec()),
            ("size 1e300", br#"{"header":0,"tensors":[["u8",[1e300],"inline",0,1]]}"#.to_vec()),
            ("nested shape", f32_2("shape", json!([[2]]))),
            ("strides is a string", f32_2("strides", json!("1"))),
            ("stride past i64", f32_2("strides", json!([9_223_372_036_854_775_808u64]))),
            ("unknown device", f32_2("device", json!("tpu:0"))),
            ("negative device ordinal", f32_2("device", json!("cuda:-1"))),
            ("device ordinal past u32", f32_2("device", json!("cuda:4294967296"))),
            ("offset past 2^53", message(inline(json!({"dtype": "u8", "shape": [1]}), 1 << 53, 1))),
            (
                "negative len",
                message(json!([{"meta": {"dtype": "u8", "shape": [1]}, "data": {"inline": {"offset": 0, "len": -1}}}])),
            ),
            ("meta missing", message(json!([{"data": {"inline": {"offset": 0, "len": 1}}}]))),
            ("data missing", message(json!([{"meta": {"dtype": "u8", "shape": [1]}}]))),
            (
                "two locations",
                message(
                    json!([{"meta": {"dtype": "u8", "shape": [1]}, "data": {"inline": {"offset": 0, "len": 1}, "shm_return": {"lease": 1, "offset": 0, "len": 1}}}]),
                ),
            ),
            (
                "unknown location",
                message(json!([{"meta": {"dtype": "u8", "shape": [1]}, "data": {"carrier_pigeon": {}}}])),
            ),
            ("compact too short", message(json!([["f32", [2]]]))),
            ("compact too long", message(json!([["f32", [2], "inline", 0, 8, 9]]))),
            ("compact unknown location", message(json!([["f32", [2], "cuda_ipc", 0, 8]]))),
            ("compact offset is a string", message(json!([["f32", [2], "inline", "0", 8]]))),
            ("descriptor is a number", message(json!([7]))),
            (
                "header nested 100k deep",
                format!(r#"{{"header": {}, "tensors": []}}"#, nested(100_000, "0")).into_bytes(),
            ),
            (
                "shape nested 300 deep",
                format!(r#"{{"header": 0, "tensors": [["u8", {}, "inline", 0, 1]]}}"#, nested(300, "1")).into_bytes(),
            ),
            ("descriptors nested 300 deep", format!(r#"{{"header": 0, "tensors": {}}}"#, nested(300, "")).into_bytes()),
        ];
        for (name, header) in cases {
            let r = receive(&header, &PAYLOAD);
            assert!(bad_header(&r), "{name}: {r:?}");
        }
    }

    #[test]
    fn descriptors_that_do_not_fit_their_bytes_are_typed_errors() {
        let meta = |dtype: &str, shape: Value, strides: Option<Value>| {
            let mut m = json!({"dtype": dtype, "shape": shape});
            if let Some(s) = strides {
                m["strides"] = s;
            }
            m
        };
        let big = u64::MAX;
        let cases: Vec<(&str, Vec<u8>, MetaError)> = vec![
            ("sizes overflow", message(json!([["u8", [big, 2], "inline", 0, 1]])), MetaError::Overflow),
            ("bytes overflow", message(json!([["f64", [big / 4], "inline", 0, 1]])), MetaError::Overflow),
            (
                "strides overflow",
                message(inline(meta("u8", json!([3, 3]), Some(json!([i64::MAX, i64::MAX]))), 0, 1)),
                MetaError::Overflow,
            ),
            (
                "negative stride",
                message(inline(meta("u8", json!([2, 2]), Some(json!([2, -1]))), 0, 4)),
                MetaError::NegativeStride { dim: 1, stride: -1 },
            ),
            (
                "strides for other dims",
                message(inline(meta("u8", json!([2, 2]), Some(json!([1]))), 0, 4)),
                MetaError::StridesMismatch { dims: 2, strides: 1 },
            ),
            (
                "too many dims",
                message(json!([["u8", vec![1; MAX_DIMS + 1], "inline", 0, 1]])),
                MetaError::TooManyDims { dims: MAX_DIMS + 1, max: MAX_DIMS },
            ),
            (
                "fewer bytes than the shape",
                message(json!([["f32", [4], "inline", 0, 8]])),
                MetaError::LengthMismatch { expected: 16, actual: 8 },
            ),
            (
                "more bytes than a contiguous shape",
                message(json!([["f32", [2], "inline", 0, 16]])),
                MetaError::LengthMismatch { expected: 8, actual: 16 },
            ),
            (
                "a strided view past its bytes",
                message(inline(meta("f32", json!([3, 2]), Some(json!([1, 3]))), 0, 16)),
                MetaError::LengthMismatch { expected: 24, actual: 16 },
            ),
        ];
        for (name, header, want) in cases {
            let r = receive(&header, &PAYLOAD);
            assert_eq!(meta_error(&r), Some(&want), "{name}: {r:?}");
        }

        let cases: [(&str, Vec<u8>); 4] = [
            ("range past the payload", message(json!([["u8", [8], "inline", 60, 8]]))),
            (
                "offset and len at the wire-int maximum",
                message(json!([["u8", [1], "inline", (1u64 << 53) - 1, (1u64 << 53) - 1]])),
            ),
            ("inline tensor on a GPU", message(inline(json!({"dtype": "u8", "shape": [1], "device": "cuda:0"}), 0, 1))),
            ("another channel's location", message(json!([["u8", [1], "shm_return", 1, 0, 1]]))),
        ];
        for (name, header) in cases {
            let r = receive(&header, &PAYLOAD);
            assert!(bad_descriptor(&r), "{name}: {r:?}");
        }
    }

    /// A JSON value of any type, for where a number or string belongs.
    fn junk() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
            ".{0,8}".prop_map(Value::String),
            Just(json!([[1]])),
            Just(json!({"a": 1})),
        ]
    }

    /// A size: mostly small, sometimes huge or not a size at all.
    fn size() -> impl Strategy<Value = Value> {
        prop_oneof![
            6 => (0u64..6).prop_map(Value::from),
            2 => any::<u64>().prop_map(Value::from),
            1 => junk(),
        ]
    }

    /// A descriptor built from valid and hostile parts, in either form.
    fn descriptor() -> impl Strategy<Value = Value> {
        let dtype = prop_oneof![
            4 => prop::sample::select(DType::ALL.to_vec()).prop_map(|d| serde_json::to_value(d).unwrap()),
            1 => junk(),
        ];
        let shape = prop_oneof![8 => prop::collection::vec(size(), 0..5).prop_map(Value::Array), 1 => prop::collection::vec(Just(json!(1)), 60..70).prop_map(Value::Array), 1 => junk()];
        let stride =
            prop_oneof![4 => (-2i64..8).prop_map(Value::from), 1 => any::<i64>().prop_map(Value::from), 1 => junk()];
        let strides =
            prop::option::of(prop_oneof![4 => prop::collection::vec(stride, 0..5).prop_map(Value::Array), 1 => junk()]);
        let device = prop::option::of(prop_oneof![Just(json!("cpu")), Just(json!("cuda:0")), junk()]);
        let at =
            prop_oneof![6 => (0u64..80).prop_map(Value::from), 1 => any::<u64>().prop_map(Value::from), 1 => junk()];
        let compact = any::<bool>();
        (dtype, shape, strides, device, at.clone(), at, compact).prop_map(
            |(dtype, shape, strides, device, offset, len, compact)| {
                if compact {
                    return json!([dtype, shape, "inline", offset, len]);
                }
                let mut meta = json!({"dtype": dtype, "shape": shape});
                if let Some(s) = strides {
                    meta["strides"] = s;
                }
                if let Some(d) = device {
                    meta["device"] = d;
                }
                json!({"meta": meta, "data": {"inline": {"offset": offset, "len": len}}})
            },
        )
    }

    proptest! {
        /// Structured hostile descriptors: each is refused with a typed error, or received
        /// as tensors that describe exactly the bytes their descriptor names.
        #[test]
        fn hostile_descriptors_are_refused_typed_or_fit_their_bytes(
            descs in prop::collection::vec(descriptor(), 0..4),
            payload_len in 0usize..128,
        ) {
            let header = message(Value::Array(descs.clone()));
            let payload = vec![7u8; payload_len];
            match receive(&header, &payload) {
                Ok(tensors) => {
                    prop_assert_eq!(tensors.len(), descs.len());
                    for (t, d) in tensors.iter().zip(&descs) {
                        let len = if d.is_array() { &d[4] } else { &d["data"]["inline"]["len"] };
                        prop_assert_eq!(Some(t.nbytes() as u64), len.as_u64());
                        prop_assert!(t.as_bytes().iter().all(|&b| b == 7), "bytes not from the payload");
                        let span = t.meta().validate(t.nbytes() as u64);
                        prop_assert!(span.is_ok(), "{:?}", span);
                    }
                }
                Err(Refused::Header(ProtocolError::BadHeader(m))) => prop_assert!(!m.is_empty()),
                Err(Refused::Channel(ChannelError::BadDescriptor { channel: "inline", reason })) => {
                    prop_assert!(!reason.is_empty())
                }
                Err(Refused::Channel(ChannelError::Meta(e))) => prop_assert!(!e.to_string().is_empty()),
                Err(e) => prop_assert!(false, "untyped refusal {:?}", e),
            }
        }

        /// Any text at all: a typed header error or a message.
        #[test]
        fn hostile_text_is_a_typed_header_error(s in ".{0,200}") {
            match receive(s.as_bytes(), &PAYLOAD) {
                Ok(_) | Err(Refused::Header(ProtocolError::BadHeader(_))) => {}
                Err(e) => prop_assert!(false, "{:?}", e),
            }
        }
    }
}
