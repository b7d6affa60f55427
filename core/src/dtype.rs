//! Element types ([`DType`]), devices ([`Device`]) and the [`Element`] trait for typed views.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The element type of a tensor. The wire name is the lowercase variant name (`"f32"`, `"bf16"`, `"c64"`).
//
// Naming: the kind (`u`, `i`, `f`, `bf`, `c`) and the bits of one element, so `c64` is two
// f32 (numpy's `complex64`); the float8 formats add their layout as torch, ml_dtypes and ONNX
// spell it (`f8e4m3fn`, `f8e5m2`). New dtypes go last (`ALL`'s order is the wire order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// One byte per element, 0 or 1.
    Bool,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 16-bit integer.
    U16,
    /// Signed 16-bit integer.
    I16,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 64-bit integer.
    U64,
    /// Signed 64-bit integer.
    I64,
    /// IEEE 754 half precision.
    F16,
    /// bfloat16 (the upper 16 bits of an f32).
    Bf16,
    /// IEEE 754 single precision.
    F32,
    /// IEEE 754 double precision.
    F64,
    /// float8 e4m3fn: 4 exponent, 3 mantissa bits, no infinity, max 448 (torch/ml_dtypes `float8_e4m3fn`).
    // Bias 7; NaN is S.1111.111 (the only special value). `crate::float8` converts.
    F8E4M3Fn,
    /// float8 e5m2: 5 exponent, 2 mantissa bits, IEEE-like (the upper byte of an f16; `float8_e5m2`).
    F8E5M2,
    /// Complex of two f32, real part first (numpy/torch `complex64`).
    C64,
    /// Complex of two f64, real part first (numpy/torch `complex128`).
    C128,
}

impl DType {
    /// Every dtype, in wire order (the order of PROTOCOL.md §5.1).
    pub const ALL: [DType; 17] = [
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::U16,
        DType::I16,
        DType::U32,
        DType::I32,
        DType::U64,
        DType::I64,
        DType::F16,
        DType::Bf16,
        DType::F32,
        DType::F64,
        DType::F8E4M3Fn,
        DType::F8E5M2,
        DType::C64,
        DType::C128,
    ];

    /// Size of one element in bytes.
    pub const fn itemsize(self) -> usize {
        match self {
            DType::Bool | DType::U8 | DType::I8 | DType::F8E4M3Fn | DType::F8E5M2 => 1,
            DType::U16 | DType::I16 | DType::F16 | DType::Bf16 => 2,
            DType::U32 | DType::I32 | DType::F32 => 4,
            DType::U64 | DType::I64 | DType::F64 | DType::C64 => 8,
            DType::C128 => 16,
        }
    }

    /// The wire name (`"f32"`).
    pub const fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::U16 => "u16",
            DType::I16 => "i16",
            DType::U32 => "u32",
            DType::I32 => "i32",
            DType::U64 => "u64",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F8E4M3Fn => "f8e4m3fn",
            DType::F8E5M2 => "f8e5m2",
            DType::C64 => "c64",
            DType::C128 => "c128",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DType::ALL.into_iter().find(|d| d.name() == s).ok_or_else(|| {
            let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
            format!("unknown dtype {s:?} (expected one of {})", names.join(", "))
        })
    }
}

/// A Rust type that can view a tensor's bytes (see [`crate::Tensor::as_slice`]).
///
/// `bool` is not an `Element`: not every byte is a valid `bool`. View bool tensors as bytes.
/// Neither are the float8 dtypes (Rust has no such type): view them as bytes and convert
/// with [`crate::float8`]. A complex element is `[re, im]`: `[f32; 2]` for `c64`, `[f64; 2]`
/// for `c128`.
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    /// The dtype this Rust type stands for.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => { $(impl Element for $t { const DTYPE: DType = DType::$d; })* };
}
element!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, u64 => U64,
    i64 => I64, half::f16 => F16, half::bf16 => Bf16, f32 => F32, f64 => F64, [f32; 2] => C64,
    [f64; 2] => C128);

/// Where a tensor's bytes live. On the wire: `"cpu"` or `"cuda:N"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Device {
    /// Host memory.
    #[default]
    Cpu,
    /// A CUDA device, by ordinal in the sender's process.
    Cuda(u32),
}

impl Device {
    /// The kind of device, which the handshake maps to a channel.
    pub const fn kind(self) -> DeviceKind {
        match self {
            Device::Cpu => DeviceKind::Cpu,
            Device::Cuda(_) => DeviceKind::Cuda,
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "cpu" {
            return Ok(Device::Cpu);
        }
        if let Some(n) = s.strip_prefix("cuda:")
            && !n.is_empty()
            && n.bytes().all(|b| b.is_ascii_digit())
            && let Ok(n) = n.parse()
        {
            return Ok(Device::Cuda(n));
        }
        Err(format!("unknown device {s:?} (expected \"cpu\" or \"cuda:N\")"))
    }
}

impl Serialize for Device {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            // (the common case without the formatting machinery of `collect_str`)
            Device::Cpu => s.serialize_str("cpu"),
            Device::Cuda(_) => s.collect_str(self),
        }
    }
}

impl<'de> Deserialize<'de> for Device {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = Cow::<'de, str>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Device {
    fn schema_name() -> Cow<'static, str> {
        "Device".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "Where a tensor's bytes live: \"cpu\" or \"cuda:N\".",
            "type": "string",
            "pattern": "^(cpu|cuda:[0-9]+)$"
        })
    }
}

/// A kind of device, without the ordinal: what a channel serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// Host memory.
    Cpu,
    /// CUDA device memory.
    Cuda,
    /// A kind this build does not know (offered by a newer peer); never chosen.
    #[serde(other)]
    Other,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>().unwrap(), d);
            assert_eq!(serde_json::to_string(&d).unwrap(), format!("\"{}\"", d.name()));
        }
        assert!("f128".parse::<DType>().is_err());
        let err = "f8".parse::<DType>().unwrap_err();
        assert!(err.contains("f64, f8e4m3fn, f8e5m2, c64, c128)"), "{err}");
        // Every name is listed once, and the serde names are those of `name()`.
        let mut names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), DType::ALL.len());
        for (d, want) in
            [(DType::F8E4M3Fn, "f8e4m3fn"), (DType::F8E5M2, "f8e5m2"), (DType::C64, "c64"), (DType::C128, "c128")]
        {
            assert_eq!(serde_json::from_str::<DType>(&format!("\"{want}\"")).unwrap(), d);
        }
    }

    #[test]
    fn itemsizes() {
        let sizes: Vec<usize> = DType::ALL.iter().map(|d| d.itemsize()).collect();
        assert_eq!(sizes, [1, 1, 1, 2, 2, 4, 4, 8, 8, 2, 2, 4, 8, 1, 1, 8, 16]);
        assert_eq!(<[f32; 2] as Element>::DTYPE.itemsize(), std::mem::size_of::<[f32; 2]>());
        assert_eq!(<[f64; 2] as Element>::DTYPE.itemsize(), std::mem::size_of::<[f64; 2]>());
    }

    #[test]
    fn device_strings() {
        assert_eq!("cpu".parse::<Device>().unwrap(), Device::Cpu);
        assert_eq!("cuda:3".parse::<Device>().unwrap(), Device::Cuda(3));
        for bad in ["cuda:", "cuda:-1", "cuda:+1", "gpu", "cuda:99999999999"] {
            assert!(bad.parse::<Device>().is_err(), "{bad}");
        }
        assert_eq!(serde_json::to_string(&Device::Cuda(1)).unwrap(), "\"cuda:1\"");
    }
}
