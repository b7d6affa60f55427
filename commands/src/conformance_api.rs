//! The conformance API (`ferry serve --api conformance`): what every SDK's conformance
//! scenario calls, so that the SDKs are checked against one real server.
//!
//! | Method | Params | Result |
//! |---|---|---|
//! | `make` | `dtype, shape` | a tensor whose element `i` (row-major) is [`pattern`]`(dtype, i)` |
//! | `echo` | `tensor` | the same tensor |
//! | `inspect` | `tensor` | [`TensorInfo`]: dtype, shape, strides, bytes and [`checksum`] |
//! | `make_map` | `names, dtype, shape` | a named tensor map, one [`pattern`] tensor per name |
//! | `echo_map` | `tensors` (a named map) | the same map |
//! | `inspect_map` | `tensors` (a named map) | a [`TensorInfo`] per name |
//! | `echo_nested` | `value` ([`Nested`]) | the same value (tensors inside lists, maps and objects) |
//! | `roundtrip` | `value` ([`Shapes`]) | the same value (enums, optionals, tuples, maps, recursion) |
//! | `fail` | `code, message, data?` | always the error `{code, message, data}` |
//! | `slow` | `ms` | `ms`, after sleeping (cancellable: tasks, timeouts, a server killed mid-call) |
//! | `whoami` | — | how the caller is connected |
//!
//! Every SDK computes [`pattern`] and [`checksum`] the same way (they are defined in the
//! method docs, so they travel with `rpc.discover`).

use std::collections::BTreeMap;
use std::time::Duration;

use ferry_core::{DType, Element, Tensor, TensorMeta, TensorMut, float8};
use ferry_rpc::{CallContext, ErrorObject, Methods, RpcTensor, Server, TensorMap};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The largest tensor `make` and `make_map` build (bytes, per tensor).
pub const MAX_MAKE_BYTES: u64 = 1 << 30;
/// The most tensors `make_map` builds.
pub const MAX_MAP_ENTRIES: usize = 4096;
/// The longest `slow` sleeps (milliseconds).
pub const MAX_SLOW_MS: u64 = 600_000;

/// The documented text of [`pattern`] (in `make`'s description).
const PATTERN_DOC: &str = "Element i (row-major) is: bool: i % 3 == 0; unsigned ints: i % 251; signed ints: \
                           i % 251 - 125; floats (f16, bf16, f32, f64): (i % 251 - 125) * 0.5 (exact in every \
                           float type); float8 (f8e4m3fn, f8e5m2): that value rounded to nearest, ties to even; \
                           complex (c64, c128): that value as the real part, imaginary part 0.";
/// The documented text of [`checksum`] (in `inspect`'s description).
const CHECKSUM_DOC: &str = "checksum: the sum over the tensor's bytes b_j (row-major, little-endian elements) of \
                            b_j * (j % 251 + 1), modulo 2^64, as a decimal string.";

/// Params of `make`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct MakeParams {
    /// Element type.
    pub dtype: DType,
    /// Dimensions (`[]` for a scalar).
    pub shape: Vec<u64>,
}

/// Params of `make_cuda`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct MakeCudaParams {
    /// Element type.
    pub dtype: DType,
    /// Dimensions (`[]` for a scalar).
    pub shape: Vec<u64>,
    /// The server's CUDA device ordinal.
    #[serde(default)]
    pub device: u32,
}

/// Params of `echo` and `inspect`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct TensorParams {
    /// Any tensor.
    pub tensor: RpcTensor,
}

/// What the server saw of a tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TensorInfo {
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: Vec<u64>,
    /// Strides in elements, if the tensor arrived with any.
    pub strides: Option<Vec<i64>>,
    /// Bytes of the tensor (its span).
    pub nbytes: u64,
    /// The checksum of its bytes (see `inspect`), a decimal string: it may not fit in 53 bits.
    pub checksum: String,
}

/// Params of `make_map`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct MakeMapParams {
    /// The names, one tensor each.
    pub names: Vec<String>,
    /// Element type of every tensor.
    pub dtype: DType,
    /// Dimensions of every tensor.
    pub shape: Vec<u64>,
}

/// Params of `echo_map` and `inspect_map`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct MapParams {
    /// A named tensor map.
    pub tensors: TensorMap,
}

/// Tensors inside lists, maps and objects.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Nested {
    /// A label.
    pub name: String,
    /// A list of tensors.
    pub list: Vec<RpcTensor>,
    /// A named tensor map.
    pub map: TensorMap,
    /// A tensor, or nothing.
    pub maybe: Option<RpcTensor>,
}

/// Params of `echo_nested`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct NestedParams {
    /// The value to send back.
    pub value: Nested,
}

/// A color (an enum of strings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Color {
    /// Red.
    Red,
    /// Green.
    Green,
    /// Blue.
    Blue,
}

/// A point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Point {
    /// Horizontal.
    pub x: f64,
    /// Vertical.
    pub y: f64,
    /// A label, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

/// Every kind of JSON type a generator must handle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Shapes {
    /// A list of objects.
    pub points: Vec<Point>,
    /// An enum.
    pub color: Color,
    /// A map of integers.
    pub counts: BTreeMap<String, u32>,
    /// A tuple.
    pub pair: (i64, String),
    /// A flag.
    pub flag: bool,
    /// A signed 64-bit integer (exact within 2^53 in every language).
    pub big: i64,
    /// The same type again (recursion), or null.
    pub child: Option<Box<Shapes>>,
}

/// Params of `roundtrip`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RoundtripParams {
    /// The value to send back.
    pub value: Shapes,
}

/// Params of `fail`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct FailParams {
    /// The error code to answer with.
    pub code: i64,
    /// The error message.
    pub message: String,
    /// The error data, if any.
    #[serde(default)]
    pub data: Option<Value>,
}

/// Params of `slow`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct SlowParams {
    /// Milliseconds to sleep.
    pub ms: u64,
}

/// Result of `whoami`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Caller {
    /// `pipe`, `json` or `http`.
    pub kind: String,
    /// The channel carrying CPU tensors (`shm`, `inline`) or `json`.
    pub channel: String,
    /// The server's process id.
    pub server_pid: u32,
}

fn invalid(path: &str, reason: impl Into<String>) -> ErrorObject {
    ErrorObject::invalid_params(path, reason)
}

/// The conformance API's server (title, version and description set).
pub fn server() -> Server {
    server_with(ferry_rpc::RpcLimits::default())
}

/// [`server`] with these limits (`ferry serve --max-connections`).
pub fn server_with(limits: ferry_rpc::RpcLimits) -> Server {
    Server::builder(methods())
        .limits(limits)
        // (kept tensors in shared segments: ferry.ref.fetch lends them over shm)
        .ref_copy(std::sync::Arc::new(ferry_store::shared_copy))
        .title("ferry conformance")
        .version(env!("CARGO_PKG_VERSION"))
        .description(
            "The API every ferry SDK's conformance scenario runs against (`ferry serve --api conformance`): \
             tensors of every dtype, empty and large tensors, named maps, nested values, errors, slow calls and \
             tasks.",
        )
        .build()
}

/// The conformance API's method table.
pub fn methods() -> Methods {
    let mut m = Methods::new();
    let reg = |r: Result<ferry_rpc::method::MethodDoc<'_>, ferry_rpc::RegisterError>, summary: &str, desc: &str| {
        let doc = r.expect("conformance method names are unique and not reserved").summary(summary);
        if !desc.is_empty() {
            doc.description(desc);
        }
    };
    reg(
        m.register_ctx("make", |p: MakeParams, ctx: CallContext| async move { make(&p.dtype, p.shape, &ctx).await }),
        "A tensor of the pattern",
        PATTERN_DOC,
    );
    reg(
        m.register_ctx("make_cuda", |p: MakeCudaParams, ctx: CallContext| async move { make_cuda(p, &ctx).await }),
        "The tensor of make, in the server's CUDA memory (a cuda-ipc pipe only)",
        "Needs a server built with the `cuda-ipc` feature and a caller whose pipe negotiated the cuda-ipc \
         channel; the answer is a cuda:N tensor of the server's pool, leased to the caller.",
    );
    reg(m.register("echo", |p: TensorParams| async move { Ok::<_, ErrorObject>(p.tensor) }), "Returns the tensor", "");
    reg(
        m.register("inspect", |p: TensorParams| async move { info(&p.tensor, "tensor") }),
        "What the server received",
        CHECKSUM_DOC,
    );
    reg(
        m.register_ctx("make_map", |p: MakeMapParams, ctx: CallContext| async move {
            if p.names.len() > MAX_MAP_ENTRIES {
                return Err(invalid("names", format!("at most {MAX_MAP_ENTRIES} names")));
            }
            let mut out = TensorMap::new();
            for name in p.names {
                let t = make(&p.dtype, p.shape.clone(), &ctx).await?;
                out.insert(name, t);
            }
            Ok(out)
        }),
        "A named tensor map, one pattern tensor per name",
        PATTERN_DOC,
    );
    reg(m.register("echo_map", |p: MapParams| async move { Ok::<_, ErrorObject>(p.tensors) }), "Returns the map", "");
    reg(
        m.register("inspect_map", |p: MapParams| async move {
            let mut out = BTreeMap::new();
            for (name, t) in &p.tensors {
                out.insert(name.clone(), info(t, name)?);
            }
            Ok::<_, ErrorObject>(out)
        }),
        "What the server received, per name",
        CHECKSUM_DOC,
    );
    reg(
        m.register("echo_nested", |p: NestedParams| async move { Ok::<_, ErrorObject>(p.value) }),
        "Returns the nested value",
        "",
    );
    reg(
        m.register("roundtrip", |p: RoundtripParams| async move { Ok::<_, ErrorObject>(p.value) }),
        "Returns the value",
        "",
    );
    reg(
        m.register("fail", |p: FailParams| async move {
            let mut e = ErrorObject::new(p.code, p.message);
            e.data = p.data;
            Err::<(), _>(e)
        }),
        "Always fails with the error given",
        "",
    );
    reg(
        m.register("slow", |p: SlowParams| async move {
            if p.ms > MAX_SLOW_MS {
                return Err(invalid("ms", format!("at most {MAX_SLOW_MS}")));
            }
            tokio::time::sleep(Duration::from_millis(p.ms)).await;
            Ok::<_, ErrorObject>(p.ms)
        }),
        "Sleeps ms milliseconds (cancellable)",
        "",
    );
    reg(
        m.register_ctx("whoami", |(): (), ctx: CallContext| async move {
            let p = ctx.peer();
            let kind = format!("{:?}", p.kind).to_lowercase();
            Ok::<_, ErrorObject>(Caller { kind, channel: p.channel.clone(), server_pid: std::process::id() })
        }),
        "How the caller is connected",
        "",
    );
    m
}

/// `make`'s tensor copied into the server's CUDA memory (cuda-ipc pool of the caller's pipe).
async fn make_cuda(p: MakeCudaParams, ctx: &CallContext) -> Result<RpcTensor, ErrorObject> {
    let host = make(&p.dtype, p.shape, ctx).await?.0;
    let meta = host.meta().clone().with_device(ferry_core::Device::Cuda(p.device));
    let dev = ctx.alloc_device(meta).await?;
    copy_to_device(&dev, host.as_bytes())?;
    Ok(RpcTensor(dev))
}

#[cfg(feature = "cuda-ipc")]
fn copy_to_device(t: &ferry_core::Tensor, bytes: &[u8]) -> Result<(), ErrorObject> {
    ferry_cuda_ipc::CudaIpcChannel::new().copy_from_host(t, bytes).map_err(ErrorObject::tensor)
}

#[cfg(not(feature = "cuda-ipc"))]
fn copy_to_device(_: &ferry_core::Tensor, _: &[u8]) -> Result<(), ErrorObject> {
    Err(ErrorObject::tensor("this server was built without the cuda-ipc feature"))
}

/// The value of element `i` of `make`'s tensors, as an f64 (bool: 0 or 1; float8: before
/// rounding; complex: the real part, the imaginary part is 0).
pub fn pattern(dtype: DType, i: u64) -> f64 {
    let r = (i % 251) as f64;
    match dtype {
        DType::Bool => f64::from(u8::from(i.is_multiple_of(3))),
        DType::U8 | DType::U16 | DType::U32 | DType::U64 => r,
        DType::I8 | DType::I16 | DType::I32 | DType::I64 => r - 125.0,
        DType::F16
        | DType::Bf16
        | DType::F32
        | DType::F64
        | DType::F8E4M3Fn
        | DType::F8E5M2
        | DType::C64
        | DType::C128 => (r - 125.0) * 0.5,
    }
}

/// The checksum of `bytes`: `sum(b_j * (j % 251 + 1)) mod 2^64`.
pub fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().enumerate().fold(0u64, |acc, (j, &b)| acc.wrapping_add(u64::from(b) * (j as u64 % 251 + 1)))
}

fn fill_with<T: Element>(t: &mut TensorMut, f: impl Fn(f64) -> T) -> Result<(), ErrorObject> {
    let dtype = t.meta().dtype;
    for (i, x) in t.as_mut_slice::<T>().map_err(ErrorObject::tensor)?.iter_mut().enumerate() {
        *x = f(pattern(dtype, i as u64));
    }
    Ok(())
}

async fn make(dtype: &DType, shape: Vec<u64>, ctx: &CallContext) -> Result<RpcTensor, ErrorObject> {
    let meta = TensorMeta::new(*dtype, shape);
    let bytes = meta.byte_span().map_err(|e| invalid("shape", e.to_string()))?;
    if bytes > MAX_MAKE_BYTES {
        return Err(invalid("shape", format!("{bytes} bytes is over the limit of {MAX_MAKE_BYTES}")));
    }
    let mut t = ctx.alloc(meta).await?;
    match dtype {
        DType::Bool => {
            for (i, b) in t.as_bytes_mut().iter_mut().enumerate() {
                *b = u8::from(i.is_multiple_of(3));
            }
        }
        DType::U8 => fill_with(&mut t, |v| v as u8)?,
        DType::I8 => fill_with(&mut t, |v| v as i8)?,
        DType::U16 => fill_with(&mut t, |v| v as u16)?,
        DType::I16 => fill_with(&mut t, |v| v as i16)?,
        DType::U32 => fill_with(&mut t, |v| v as u32)?,
        DType::I32 => fill_with(&mut t, |v| v as i32)?,
        DType::U64 => fill_with(&mut t, |v| v as u64)?,
        DType::I64 => fill_with(&mut t, |v| v as i64)?,
        DType::F16 => fill_with(&mut t, half::f16::from_f64)?,
        DType::Bf16 => fill_with(&mut t, half::bf16::from_f64)?,
        DType::F32 => fill_with(&mut t, |v| v as f32)?,
        DType::F64 => fill_with(&mut t, |v| v)?,
        DType::F8E4M3Fn | DType::F8E5M2 => {
            let encode = if *dtype == DType::F8E4M3Fn { float8::f64_to_e4m3fn } else { float8::f64_to_e5m2 };
            for (i, b) in t.as_bytes_mut().iter_mut().enumerate() {
                *b = encode(pattern(*dtype, i as u64));
            }
        }
        DType::C64 => fill_with(&mut t, |v| [v as f32, 0.0])?,
        DType::C128 => fill_with(&mut t, |v| [v, 0.0])?,
    }
    Ok(RpcTensor(t.freeze()))
}

fn info(t: &Tensor, path: &str) -> Result<TensorInfo, ErrorObject> {
    let bytes = t.host_bytes().ok_or_else(|| invalid(path, "only CPU tensors can be inspected"))?;
    Ok(TensorInfo {
        dtype: t.dtype(),
        shape: t.shape().to_vec(),
        strides: t.meta().strides.clone(),
        nbytes: bytes.len() as u64,
        checksum: checksum(bytes).to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_and_checksum() {
        assert_eq!(pattern(DType::I8, 0), -125.0);
        assert_eq!(pattern(DType::U8, 252), 1.0);
        assert_eq!(pattern(DType::Bf16, 250), 62.5);
        assert_eq!(pattern(DType::Bool, 3), 1.0);
        assert_eq!(checksum(&[1, 2, 3]), 1 + 2 * 2 + 3 * 3);
        assert_eq!(checksum(&[]), 0);
        // Every float value of the pattern is exact in f16 and bf16.
        for i in 0..251 {
            let v = pattern(DType::F32, i);
            assert_eq!(half::f16::from_f64(v).to_f64(), v);
            assert_eq!(half::bf16::from_f64(v).to_f64(), v);
        }
        // float8 rounds: 62.5 is 64 in both; 17 is a tie in e4m3fn (16 or 18: even is 16).
        assert_eq!(float8::e4m3fn_to_f32(float8::f64_to_e4m3fn(pattern(DType::F8E4M3Fn, 250))), 64.0);
        assert_eq!(float8::e5m2_to_f32(float8::f64_to_e5m2(pattern(DType::F8E5M2, 250))), 64.0);
        assert_eq!(float8::e4m3fn_to_f32(float8::f64_to_e4m3fn(pattern(DType::F8E4M3Fn, 159))), 16.0);
    }

    #[test]
    fn document_names_every_method() {
        let doc = server().discover().clone();
        let names: Vec<&str> = doc["methods"].as_array().unwrap().iter().filter_map(|m| m["name"].as_str()).collect();
        for m in
            ["make", "make_cuda", "echo", "inspect", "make_map", "echo_map", "inspect_map", "roundtrip", "fail", "slow"]
        {
            assert!(names.contains(&m), "{m} missing from {names:?}");
        }
    }
}
