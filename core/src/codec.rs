//! [`TensorCodec`]: named tensor maps to and from bytes. Two codecs: [`RawCodec`] (ferry's
//! own container, 64-byte aligned, strides kept) and [`SafetensorsCodec`] (the
//! `safetensors` format, readable by Python's `safetensors.numpy.load`).

use std::collections::HashMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::dtype::{DType, Device};
use crate::error::CodecError;
use crate::meta::TensorMeta;
use crate::tensor::{ALIGN, Tensor};

/// Tensor metadata <-> bytes for named tensor maps. Pure and synchronous.
pub trait TensorCodec: Send + Sync + 'static {
    /// The codec's name.
    fn name(&self) -> &'static str;
    /// Appends the encoding of `tensors` to `dst`.
    fn encode(&self, tensors: &[(String, Tensor)], dst: &mut Vec<u8>) -> Result<(), CodecError>;
    /// Decodes `src`; tensors are slices of `src` where alignment allows (no copy).
    fn decode(&self, src: Bytes) -> Result<Vec<(String, Tensor)>, CodecError>;
}

/// The most tensors a container may hold when decoding.
pub const MAX_CODEC_TENSORS: usize = 1 << 20;

/// Raw container: `u64 LE header length`, a JSON header
/// `{"tensors":[{"name","meta","offset","len"}]}` padded with spaces to a multiple of 64
/// bytes, then the data, each tensor at a 64-byte aligned offset from the data start.
#[derive(Debug, Default, Clone, Copy)]
pub struct RawCodec;

#[derive(Serialize, Deserialize)]
struct RawHeader {
    tensors: Vec<RawEntry>,
}

#[derive(Serialize, Deserialize)]
struct RawEntry {
    name: String,
    meta: TensorMeta,
    offset: u64,
    len: u64,
}

fn malformed(codec: &'static str, reason: impl Into<String>) -> CodecError {
    CodecError::Malformed { codec, reason: reason.into() }
}

fn host_only(codec: &'static str, name: &str, t: &Tensor) -> Result<(), CodecError> {
    if t.device() != Device::Cpu {
        return Err(CodecError::Unsupported {
            codec,
            name: name.into(),
            reason: format!("tensor is on {}", t.device()),
        });
    }
    Ok(())
}

impl TensorCodec for RawCodec {
    fn name(&self) -> &'static str {
        "raw"
    }

    fn encode(&self, tensors: &[(String, Tensor)], dst: &mut Vec<u8>) -> Result<(), CodecError> {
        let mut entries = Vec::with_capacity(tensors.len());
        let mut off = 0u64;
        for (name, t) in tensors {
            host_only("raw", name, t)?;
            off = off.next_multiple_of(ALIGN as u64);
            entries.push(RawEntry { name: name.clone(), meta: t.meta().clone(), offset: off, len: t.nbytes() as u64 });
            off += t.nbytes() as u64;
        }
        let mut header =
            serde_json::to_vec(&RawHeader { tensors: entries }).map_err(|e| malformed("raw", e.to_string()))?;
        // 8 + header is padded to a multiple of ALIGN so the data starts aligned.
        let padded = (8 + header.len()).next_multiple_of(ALIGN) - 8;
        header.resize(padded, b' ');
        dst.extend_from_slice(&(header.len() as u64).to_le_bytes());
        dst.extend_from_slice(&header);
        let data_start = dst.len();
        for (_, t) in tensors {
            let pad = (dst.len() - data_start).next_multiple_of(ALIGN) - (dst.len() - data_start);
            dst.resize(dst.len() + pad, 0);
            dst.extend_from_slice(t.as_bytes());
        }
        debug_assert_eq!((dst.len() - data_start) as u64, off);
        Ok(())
    }

    fn decode(&self, src: Bytes) -> Result<Vec<(String, Tensor)>, CodecError> {
        let n = src.get(..8).ok_or_else(|| malformed("raw", "shorter than 8 bytes"))?;
        let hlen = u64::from_le_bytes(n.try_into().unwrap_or_default());
        let data_start = 8u64
            .checked_add(hlen)
            .filter(|&e| e <= src.len() as u64)
            .ok_or_else(|| malformed("raw", format!("header length {hlen} exceeds the {} bytes present", src.len())))?;
        let header: RawHeader = serde_json::from_slice(&src[8..data_start as usize])
            .map_err(|e| malformed("raw", format!("header: {e}")))?;
        if header.tensors.len() > MAX_CODEC_TENSORS {
            return Err(malformed("raw", format!("{} tensors, more than {MAX_CODEC_TENSORS}", header.tensors.len())));
        }
        let mut names = std::collections::HashSet::with_capacity(header.tensors.len());
        if let Some(e) = header.tensors.iter().find(|e| !names.insert(e.name.as_str())) {
            return Err(CodecError::DuplicateName { codec: "raw", name: e.name.clone() });
        }
        let data = src.slice(data_start as usize..);
        let mut out = Vec::with_capacity(header.tensors.len());
        for e in header.tensors {
            let end = e.offset.checked_add(e.len).filter(|&end| end <= data.len() as u64).ok_or_else(|| {
                malformed("raw", format!("tensor {:?} range {}+{} is outside the data", e.name, e.offset, e.len))
            })?;
            let bytes = data.slice(e.offset as usize..end as usize);
            let t = Tensor::new(e.meta, bytes).map_err(|source| CodecError::Meta { name: e.name.clone(), source })?;
            let t = if is_aligned(&t) { t } else { t.to_aligned() };
            out.push((e.name, t));
        }
        Ok(out)
    }
}

fn is_aligned(t: &Tensor) -> bool {
    (t.as_bytes().as_ptr() as usize).is_multiple_of(t.dtype().itemsize())
}

/// Refuses a safetensors header that names a tensor (or `__metadata__`) twice: the
/// safetensors crate reads the header into a map, where the last of two entries silently
/// wins. A header that is not a JSON object is left for the crate to report.
fn refuse_duplicate_names(src: &[u8]) -> Result<(), CodecError> {
    use serde::de::{DeserializeSeed, Error as _, IgnoredAny, MapAccess, Visitor};

    /// Reads the header's keys; a repeated one is put in `.0` (and stops the parse).
    struct Keys<'a>(&'a mut Option<String>);

    impl<'de> DeserializeSeed<'de> for Keys<'_> {
        type Value = ();
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_map(self)
        }
    }

    impl<'de> Visitor<'de> for Keys<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            let mut seen = std::collections::HashSet::new();
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if !seen.insert(key.clone()) {
                    *self.0 = Some(key.into_owned());
                    return Err(A::Error::custom("duplicate key"));
                }
                map.next_value::<IgnoredAny>()?;
            }
            Ok(())
        }
    }

    let header = src
        .get(..8)
        .map(|n| u64::from_le_bytes(n.try_into().unwrap_or_default()))
        .and_then(|n| usize::try_from(n).ok()?.checked_add(8))
        .and_then(|end| src.get(8..end));
    let Some(header) = header else { return Ok(()) };
    let mut dup = None;
    let _ = Keys(&mut dup).deserialize(&mut serde_json::Deserializer::from_slice(header));
    match dup {
        Some(name) => Err(CodecError::DuplicateName { codec: "safetensors", name }),
        None => Ok(()),
    }
}

/// The safetensors format (contiguous row-major tensors only).
#[derive(Debug, Default, Clone, Copy)]
pub struct SafetensorsCodec;

/// The safetensors dtype of `d`; `None` for `c128`, which safetensors has no name for.
fn to_st(d: DType) -> Option<safetensors::Dtype> {
    use safetensors::Dtype as S;
    Some(match d {
        DType::Bool => S::BOOL,
        DType::U8 => S::U8,
        DType::I8 => S::I8,
        DType::U16 => S::U16,
        DType::I16 => S::I16,
        DType::U32 => S::U32,
        DType::I32 => S::I32,
        DType::U64 => S::U64,
        DType::I64 => S::I64,
        DType::F16 => S::F16,
        DType::Bf16 => S::BF16,
        DType::F32 => S::F32,
        DType::F64 => S::F64,
        // safetensors' `F8_E4M3` is the "fn" variant (torch.float8_e4m3fn writes it).
        DType::F8E4M3Fn => S::F8_E4M3,
        DType::F8E5M2 => S::F8_E5M2,
        DType::C64 => S::C64,
        DType::C128 => return None,
    })
}

fn from_st(d: safetensors::Dtype) -> Option<DType> {
    use safetensors::Dtype as S;
    Some(match d {
        S::BOOL => DType::Bool,
        S::U8 => DType::U8,
        S::I8 => DType::I8,
        S::U16 => DType::U16,
        S::I16 => DType::I16,
        S::U32 => DType::U32,
        S::I32 => DType::I32,
        S::U64 => DType::U64,
        S::I64 => DType::I64,
        S::F16 => DType::F16,
        S::BF16 => DType::Bf16,
        S::F32 => DType::F32,
        S::F64 => DType::F64,
        S::F8_E4M3 => DType::F8E4M3Fn,
        S::F8_E5M2 => DType::F8E5M2,
        S::C64 => DType::C64,
        _ => return None,
    })
}

struct OwnedView<'a> {
    tensor: &'a Tensor,
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
}

impl safetensors::View for &OwnedView<'_> {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        self.tensor.as_bytes().into()
    }
    fn data_len(&self) -> usize {
        self.tensor.nbytes()
    }
}

impl TensorCodec for SafetensorsCodec {
    fn name(&self) -> &'static str {
        "safetensors"
    }

    fn encode(&self, tensors: &[(String, Tensor)], dst: &mut Vec<u8>) -> Result<(), CodecError> {
        let mut views = Vec::with_capacity(tensors.len());
        for (name, t) in tensors {
            host_only("safetensors", name, t)?;
            if !t.meta().is_contiguous() {
                return Err(CodecError::Unsupported {
                    codec: "safetensors",
                    name: name.clone(),
                    reason: "tensor is strided".into(),
                });
            }
            let shape = t.shape().iter().map(|&d| usize::try_from(d)).collect::<Result<Vec<_>, _>>().map_err(|_| {
                CodecError::Unsupported {
                    codec: "safetensors",
                    name: name.clone(),
                    reason: "dimension over usize".into(),
                }
            })?;
            let dtype = to_st(t.dtype()).ok_or_else(|| CodecError::Unsupported {
                codec: "safetensors",
                name: name.clone(),
                reason: format!("safetensors has no dtype for {}", t.dtype()),
            })?;
            views.push((name.as_str(), OwnedView { tensor: t, dtype, shape }));
        }
        let bytes = safetensors::serialize(views.iter().map(|(n, v)| (*n, v)), None)
            .map_err(|e| malformed("safetensors", e.to_string()))?;
        dst.extend_from_slice(&bytes);
        Ok(())
    }

    fn decode(&self, src: Bytes) -> Result<Vec<(String, Tensor)>, CodecError> {
        refuse_duplicate_names(&src)?;
        let st = safetensors::SafeTensors::deserialize(&src).map_err(|e| malformed("safetensors", e.to_string()))?;
        let mut names: Vec<String> = st.names().into_iter().map(str::to_owned).collect();
        if names.len() > MAX_CODEC_TENSORS {
            return Err(malformed("safetensors", format!("{} tensors, more than {MAX_CODEC_TENSORS}", names.len())));
        }
        // safetensors keeps no order; sort by offset so the output order is the file's.
        let mut out = Vec::with_capacity(names.len());
        let mut views = HashMap::new();
        for n in &names {
            let v = st.tensor(n).map_err(|e| malformed("safetensors", e.to_string()))?;
            views.insert(n.clone(), v);
        }
        names.sort_by_key(|n| views[n].data().as_ptr() as usize);
        for name in names {
            let v = &views[&name];
            let dtype = from_st(v.dtype()).ok_or_else(|| CodecError::Unsupported {
                codec: "safetensors",
                name: name.clone(),
                reason: format!("dtype {:?} is not supported by ferry", v.dtype()),
            })?;
            let meta = TensorMeta::new(dtype, v.shape().iter().map(|&d| d as u64).collect::<Vec<_>>());
            let bytes = src.slice_ref(v.data());
            let t = Tensor::new(meta, bytes).map_err(|source| CodecError::Meta { name: name.clone(), source })?;
            let t = if is_aligned(&t) { t } else { t.to_aligned() };
            out.push((name, t));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Vec<(String, Tensor)> {
        vec![
            ("w".into(), Tensor::from_slice(vec![2, 3], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap()),
            ("b".into(), Tensor::from_slice(vec![3], &[7i64, 8, 9]).unwrap()),
            ("s".into(), Tensor::from_slice(Vec::<u64>::new(), &[half::bf16::from_f32(1.5)]).unwrap()),
            ("e".into(), Tensor::from_slice(vec![0, 4], &[0u8; 0]).unwrap()),
        ]
    }

    #[test]
    fn round_trips() {
        for codec in [&RawCodec as &dyn TensorCodec, &SafetensorsCodec] {
            let mut buf = Vec::new();
            codec.encode(&sample(), &mut buf).unwrap();
            let back = codec.decode(Bytes::from(buf)).unwrap();
            let mut want = sample();
            let mut got = back;
            want.sort_by(|a, b| a.0.cmp(&b.0));
            got.sort_by(|a, b| a.0.cmp(&b.0));
            assert_eq!(got, want, "{}", codec.name());
            assert_eq!(got[3].1.as_slice::<f32>().unwrap(), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        }
    }

    #[test]
    fn checkpoint_dtypes() {
        let bytes = |d: DType, n: usize| {
            Tensor::new(TensorMeta::new(d, vec![n as u64]), Bytes::from(vec![0x3cu8; n * d.itemsize()])).unwrap()
        };
        let tensors: Vec<(String, Tensor)> = vec![
            ("a".into(), bytes(DType::F8E4M3Fn, 3)),
            ("b".into(), bytes(DType::F8E5M2, 5)),
            ("c".into(), Tensor::from_slice(vec![2], &[[1.0f32, -2.0], [0.5, 4.0]]).unwrap()),
            ("d".into(), Tensor::from_slice(vec![1], &[[1.0f64, -1.0]]).unwrap()),
        ];
        let mut raw = Vec::new();
        RawCodec.encode(&tensors, &mut raw).unwrap();
        assert_eq!(RawCodec.decode(Bytes::from(raw)).unwrap(), tensors);
        // safetensors has F8_E4M3, F8_E5M2 and C64 but no complex128.
        let st = &tensors[..3];
        let mut buf = Vec::new();
        SafetensorsCodec.encode(st, &mut buf).unwrap();
        let header = String::from_utf8_lossy(&buf[8..8 + u64::from_le_bytes(buf[..8].try_into().unwrap()) as usize])
            .into_owned();
        for name in ["\"F8_E4M3\"", "\"F8_E5M2\"", "\"C64\""] {
            assert!(header.contains(name), "{header}");
        }
        let mut back = SafetensorsCodec.decode(Bytes::from(buf)).unwrap();
        back.sort_by(|a, b| a.0.cmp(&b.0)); // (safetensors orders by alignment)
        assert_eq!(back, st);
        let err = SafetensorsCodec.encode(&tensors, &mut Vec::new()).unwrap_err();
        assert_eq!(err.to_string(), "safetensors cannot encode tensor \"d\": safetensors has no dtype for c128");
        // A dtype safetensors has and ferry lacks is refused by name, not by a panic.
        let mut odd = Vec::new();
        SafetensorsCodec.encode(&tensors[..1], &mut odd).unwrap();
        let odd = String::from_utf8_lossy(&odd).replace("F8_E4M3", "F8_E8M0").into_bytes();
        let err = SafetensorsCodec.decode(Bytes::from(odd)).unwrap_err();
        assert!(err.to_string().contains("F8_E8M0"), "{err}");
    }

    /// `buf` with the first `from` replaced by `to` (same length), bytes not text.
    fn replaced(buf: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
        assert_eq!(from.len(), to.len());
        let at = buf.windows(from.len()).position(|w| w == from).expect("pattern present");
        let mut out = buf.to_vec();
        out[at..at + to.len()].copy_from_slice(to);
        out
    }

    #[test]
    fn a_tensor_name_given_twice_is_refused_naming_it() {
        // safetensors: the header written by the crate, with one name repeated by hand.
        let two = [
            ("a".to_owned(), Tensor::from_slice(vec![1], &[1.0f32]).unwrap()),
            ("b".to_owned(), Tensor::from_slice(vec![1], &[2.0f32]).unwrap()),
        ];
        let mut buf = Vec::new();
        SafetensorsCodec.encode(&two, &mut buf).unwrap();
        let text = replaced(&buf, b"\"b\":", b"\"a\":");
        let err = SafetensorsCodec.decode(Bytes::from(text)).unwrap_err();
        assert!(matches!(&err, CodecError::DuplicateName { codec: "safetensors", name } if name == "a"), "{err:?}");
        assert_eq!(err.to_string(), "safetensors data names tensor \"a\" twice");
        // A header that names each tensor once still decodes; a broken one is still Malformed.
        assert_eq!(SafetensorsCodec.decode(Bytes::from(buf.clone())).unwrap().len(), 2);
        let mut broken = buf.clone();
        broken[9] = b'[';
        assert!(matches!(SafetensorsCodec.decode(Bytes::from(broken)), Err(CodecError::Malformed { .. })));
        // raw: the same.
        let mut raw = Vec::new();
        RawCodec.encode(&two, &mut raw).unwrap();
        let text = replaced(&raw, b"\"name\":\"b\"", b"\"name\":\"a\"");
        let err = RawCodec.decode(Bytes::from(text)).unwrap_err();
        assert!(matches!(&err, CodecError::DuplicateName { codec: "raw", name } if name == "a"), "{err:?}");
    }

    #[test]
    fn raw_keeps_strides_and_rejects_lies() {
        let t = Tensor::new(
            TensorMeta::new(DType::U8, vec![2, 2]).with_strides(vec![1, 2]),
            Bytes::from_static(&[1, 2, 3, 4]),
        )
        .unwrap();
        let mut buf = Vec::new();
        RawCodec.encode(&[("t".into(), t.clone())], &mut buf).unwrap();
        assert_eq!(RawCodec.decode(Bytes::from(buf.clone())).unwrap()[0].1, t);
        // Lie about the length in the header: the tensor no longer fits.
        let text = String::from_utf8_lossy(&buf).replace("\"len\":4", "\"len\":9");
        assert!(RawCodec.decode(Bytes::from(text.into_bytes())).is_err());
        assert!(SafetensorsCodec.encode(&[("t".into(), t)], &mut Vec::new()).is_err());
    }

    proptest! {
        #[test]
        fn hostile_input_never_panics(data in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = RawCodec.decode(Bytes::from(data.clone()));
            let _ = SafetensorsCodec.decode(Bytes::from(data));
        }

        #[test]
        fn hostile_raw_headers_never_panic(json in "\\{\"tensors\":\\[\\{\"name\":\"a\",\"meta\":\\{\"dtype\":\"f32\",\"shape\":\\[[0-9]{1,20}\\]\\},\"offset\":[0-9]{1,20},\"len\":[0-9]{1,20}\\}\\]\\}") {
            let mut buf = (json.len() as u64).to_le_bytes().to_vec();
            buf.extend_from_slice(json.as_bytes());
            buf.extend_from_slice(&[0u8; 64]);
            let _ = RawCodec.decode(Bytes::from(buf));
        }
    }
}
