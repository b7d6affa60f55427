//! The demo API that `ferry serve` serves: small calls, tensors in and out, a named tensor
//! map (a small model's weights), and a sleep for tasks and cancellation.
//!
//! | Method | Params | Result |
//! |---|---|---|
//! | `add` | `a, b` (numbers) | `a + b` |
//! | `echo` | `tensor` | the same tensor |
//! | `create_tensor` | `shape, dtype, fill?` | a tensor of `fill` (allocated in the channel's memory; complex: `fill + 0i`) |
//! | `sum` | `tensor` | the sum of its elements (f64; not for complex dtypes) |
//! | `matmul` | `a [m,k], b [k,n]` (f32) | `a @ b`, f32 `[m,n]` |
//! | `sleep` | `ms` | `ms`, after sleeping (cancellable; use it as a task) |
//! | `weights` | — | a named map of a small MLP's tensors |
//! | `describe` | `weights` (a named map) | per name: dtype, shape, sum |
//! | `whoami` | — | how the caller is connected (kind, channel, pid) |

use std::collections::BTreeMap;
use std::time::Duration;

use ferry_core::{DType, Element, Tensor, TensorMeta, TensorMut, float8};
use ferry_rpc::{CallContext, ErrorObject, Methods, RpcTensor, Server, TensorMap};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The largest tensor `create_tensor` makes (bytes).
pub const MAX_CREATE_BYTES: u64 = 1 << 32;
/// The most multiply-adds `matmul` does.
pub const MAX_MATMUL_OPS: u64 = 1 << 32;

/// Params of `add`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct AddParams {
    /// First addend.
    pub a: f64,
    /// Second addend.
    pub b: f64,
}

/// Params of `echo` and `sum`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct TensorParams {
    /// Any tensor.
    pub tensor: RpcTensor,
}

/// Params of `create_tensor`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct CreateParams {
    /// Dimensions.
    pub shape: Vec<u64>,
    /// Element type.
    pub dtype: DType,
    /// The value of every element (default 0).
    #[serde(default)]
    pub fill: f64,
}

/// Params of `matmul`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct MatmulParams {
    /// Left matrix, f32 `[m, k]`.
    pub a: RpcTensor,
    /// Right matrix, f32 `[k, n]`.
    pub b: RpcTensor,
}

/// Params of `sleep`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct SleepParams {
    /// Milliseconds to sleep.
    pub ms: u64,
}

/// Params of `describe`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct DescribeParams {
    /// A named tensor map.
    pub weights: TensorMap,
}

/// One entry of `describe`'s result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TensorSummary {
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: Vec<u64>,
    /// Sum of the elements.
    pub sum: f64,
}

/// Result of `whoami`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Whoami {
    /// `pipe`, `json` or `http`.
    pub kind: String,
    /// The channel carrying CPU tensors (`shm`, `inline`) or `json`.
    pub channel: String,
    /// The caller's process id, where known.
    pub pid: Option<u32>,
}

fn invalid(path: &str, reason: impl Into<String>) -> ErrorObject {
    ErrorObject::invalid_params(path, reason)
}

/// The demo API's server (title, version and description set), as `ferry serve` serves it.
pub fn server() -> Server {
    server_with(ferry_rpc::RpcLimits::default())
}

/// [`server`] with these limits (`ferry serve --max-connections`).
pub fn server_with(limits: ferry_rpc::RpcLimits) -> Server {
    Server::builder(methods())
        .limits(limits)
        // (kept tensors in shared segments: ferry.ref.fetch lends them over shm)
        .ref_copy(std::sync::Arc::new(ferry_store::shared_copy))
        .title("ferry demo")
        .version(env!("CARGO_PKG_VERSION"))
        .description(
            "The demo API of `ferry serve`. Tensors are {\"$tensor\": i} references into the ferry message on \
             ferry pipes, and inline {\"$tensor\": {\"dtype\", \"shape\", \"data\": base64}} on plain JSON and HTTP.",
        )
        .build()
}

/// The demo's method table.
pub fn methods() -> Methods {
    let mut m = Methods::new();
    let reg = |r: Result<ferry_rpc::method::MethodDoc<'_>, ferry_rpc::RegisterError>, summary: &str| {
        r.expect("demo method names are unique and not reserved").summary(summary);
    };
    // Cheap handlers are answered from the connection's task (`inline`), saving a task per call.
    reg(m.register("add", |p: AddParams| async move { Ok::<_, ErrorObject>(p.a + p.b) }).map(|d| d.inline()), "a + b");
    reg(
        m.register("echo", |p: TensorParams| async move { Ok::<_, ErrorObject>(p.tensor) }).map(|d| d.inline()),
        "Returns the tensor",
    );
    reg(m.register_ctx("create_tensor", create_tensor), "A tensor of shape and dtype, every element = fill");
    reg(m.register("sum", |p: TensorParams| async move { sum(&p.tensor, "tensor") }), "Sum of a tensor's elements");
    reg(m.register_blocking("matmul", matmul), "a @ b for f32 matrices (computed on the blocking pool)");
    reg(
        m.register("sleep", |p: SleepParams| async move {
            tokio::time::sleep(Duration::from_millis(p.ms)).await;
            Ok::<_, ErrorObject>(p.ms)
        })
        .map(|d| d.task()),
        "Sleeps ms milliseconds (cancellable); for tasks",
    );
    reg(m.register("weights", |(): ()| async move { weights() }), "A small MLP's weights, as a named tensor map");
    reg(
        m.register("describe", |p: DescribeParams| async move {
            let mut out = BTreeMap::new();
            for (name, t) in &p.weights {
                let s = TensorSummary { dtype: t.dtype(), shape: t.shape().to_vec(), sum: sum(t, name)? };
                out.insert(name.clone(), s);
            }
            Ok::<_, ErrorObject>(out)
        }),
        "dtype, shape and sum of each tensor of a named map",
    );
    reg(
        m.register_ctx("whoami", |(): (), ctx: CallContext| async move {
            let p = ctx.peer();
            let kind = format!("{:?}", p.kind).to_lowercase();
            Ok::<_, ErrorObject>(Whoami { kind, channel: p.channel.clone(), pid: p.pid })
        }),
        "How the caller is connected",
    );
    m
}

async fn create_tensor(p: CreateParams, ctx: CallContext) -> Result<RpcTensor, ErrorObject> {
    let meta = TensorMeta::new(p.dtype, p.shape);
    let bytes = meta.byte_span().map_err(|e| invalid("shape", e.to_string()))?;
    if bytes > MAX_CREATE_BYTES {
        return Err(invalid("shape", format!("{bytes} bytes is over the demo's limit of {MAX_CREATE_BYTES}")));
    }
    let mut t = ctx.alloc(meta).await?;
    fill(&mut t, p.fill)?;
    Ok(RpcTensor(t.freeze()))
}

fn fill_as<T: Element>(t: &mut TensorMut, v: T) -> Result<(), ErrorObject> {
    t.as_mut_slice::<T>().map_err(ErrorObject::tensor)?.fill(v);
    Ok(())
}

fn fill(t: &mut TensorMut, v: f64) -> Result<(), ErrorObject> {
    match t.meta().dtype {
        DType::Bool => {
            t.as_bytes_mut().fill(u8::from(v != 0.0));
            Ok(())
        }
        DType::U8 => fill_as(t, v as u8),
        DType::I8 => fill_as(t, v as i8),
        DType::U16 => fill_as(t, v as u16),
        DType::I16 => fill_as(t, v as i16),
        DType::U32 => fill_as(t, v as u32),
        DType::I32 => fill_as(t, v as i32),
        DType::U64 => fill_as(t, v as u64),
        DType::I64 => fill_as(t, v as i64),
        DType::F16 => fill_as(t, half::f16::from_f64(v)),
        DType::Bf16 => fill_as(t, half::bf16::from_f64(v)),
        DType::F32 => fill_as(t, v as f32),
        DType::F64 => fill_as(t, v),
        DType::F8E4M3Fn => {
            t.as_bytes_mut().fill(float8::f64_to_e4m3fn(v));
            Ok(())
        }
        DType::F8E5M2 => {
            t.as_bytes_mut().fill(float8::f64_to_e5m2(v));
            Ok(())
        }
        DType::C64 => fill_as(t, [v as f32, 0.0]),
        DType::C128 => fill_as(t, [v, 0.0]),
    }
}

fn slice_of<'a, T: Element>(t: &'a Tensor, path: &str) -> Result<std::borrow::Cow<'a, [T]>, ErrorObject> {
    match t.as_slice::<T>() {
        Ok(s) => Ok(std::borrow::Cow::Borrowed(s)),
        // Inline tensors decoded from base64 or sliced from a frame may be misaligned.
        Err(ferry_core::ViewError::Misaligned { .. }) => {
            let a = t.to_aligned();
            Ok(std::borrow::Cow::Owned(a.as_slice::<T>().map_err(|e| invalid(path, e.to_string()))?.to_vec()))
        }
        Err(e) => Err(invalid(path, e.to_string())),
    }
}

fn sum_as<T: Element>(t: &Tensor, path: &str, f: impl Fn(T) -> f64) -> Result<f64, ErrorObject> {
    Ok(slice_of::<T>(t, path)?.iter().map(|x| f(*x)).sum())
}

/// The sum of a tensor's elements as f64 (contiguous CPU tensors of any dtype).
pub fn sum(t: &Tensor, path: &str) -> Result<f64, ErrorObject> {
    if !t.meta().is_contiguous() {
        return Err(invalid(path, "sum needs a contiguous tensor"));
    }
    match t.dtype() {
        DType::Bool => Ok(t.as_bytes().iter().map(|&b| f64::from(u8::from(b != 0))).sum()),
        DType::U8 => sum_as(t, path, |x: u8| f64::from(x)),
        DType::I8 => sum_as(t, path, |x: i8| f64::from(x)),
        DType::U16 => sum_as(t, path, |x: u16| f64::from(x)),
        DType::I16 => sum_as(t, path, |x: i16| f64::from(x)),
        DType::U32 => sum_as(t, path, |x: u32| f64::from(x)),
        DType::I32 => sum_as(t, path, |x: i32| f64::from(x)),
        DType::U64 => sum_as(t, path, |x: u64| x as f64),
        DType::I64 => sum_as(t, path, |x: i64| x as f64),
        DType::F16 => sum_as(t, path, |x: half::f16| x.to_f64()),
        DType::Bf16 => sum_as(t, path, |x: half::bf16| x.to_f64()),
        DType::F32 => sum_as(t, path, |x: f32| f64::from(x)),
        DType::F64 => sum_as(t, path, |x: f64| x),
        DType::F8E4M3Fn | DType::F8E5M2 => {
            let bytes = t.host_bytes().ok_or_else(|| invalid(path, "sum needs a CPU tensor"))?;
            let decode = if t.dtype() == DType::F8E4M3Fn { float8::e4m3fn_to_f32 } else { float8::e5m2_to_f32 };
            Ok(bytes.iter().map(|&b| f64::from(decode(b))).sum())
        }
        DType::C64 | DType::C128 => {
            Err(invalid(path, format!("the sum of a {} tensor is complex: sum takes real dtypes only", t.dtype())))
        }
    }
}

/// Computes on the blocking pool (`register_blocking`): other calls go on meanwhile, and a
/// cancelled call stops at the next row.
fn matmul(p: MatmulParams, ctx: CallContext) -> Result<RpcTensor, ErrorObject> {
    let dims = |t: &Tensor, name: &str| -> Result<(u64, u64), ErrorObject> {
        if t.dtype() != DType::F32 {
            return Err(invalid(name, format!("expected an f32 matrix, got dtype {}", t.dtype())));
        }
        match *t.shape() {
            [r, c] => Ok((r, c)),
            ref s => Err(invalid(name, format!("expected a 2-d matrix, got shape {s:?}"))),
        }
    };
    let (m, k) = dims(&p.a, "a")?;
    let (k2, n) = dims(&p.b, "b")?;
    if k != k2 {
        return Err(invalid("b", format!("inner dimensions differ: a is [{m},{k}], b is [{k2},{n}]")));
    }
    let ops = m.checked_mul(k).and_then(|x| x.checked_mul(n)).unwrap_or(u64::MAX);
    if ops > MAX_MATMUL_OPS {
        return Err(invalid("", format!("{ops} multiply-adds is over the demo's limit of {MAX_MATMUL_OPS}")));
    }
    let a = slice_of::<f32>(&p.a, "a")?;
    let b = slice_of::<f32>(&p.b, "b")?;
    let mut out = ctx.alloc_blocking(TensorMeta::new(DType::F32, vec![m, n]))?;
    let o = out.as_mut_slice::<f32>().map_err(ErrorObject::tensor)?;
    // A recycled pool slot holds an earlier result's bytes: start from zero.
    o.fill(0.0);
    let (m, k, n) = (m as usize, k as usize, n as usize);
    for i in 0..m {
        if ctx.is_cancelled() {
            return Err(ErrorObject::cancelled("matmul"));
        }
        let row = &mut o[i * n..(i + 1) * n];
        for (kk, &av) in a[i * k..(i + 1) * k].iter().enumerate() {
            for (x, &bv) in row.iter_mut().zip(&b[kk * n..(kk + 1) * n]) {
                *x += av * bv;
            }
        }
    }
    Ok(RpcTensor(out.freeze()))
}

/// A small MLP's weights (deterministic): `fc1.weight [4,8]`, `fc1.bias [8]`,
/// `fc2.weight [8,2]`, `fc2.bias [2]`, all f32.
pub fn weights() -> Result<TensorMap, ErrorObject> {
    let make = |shape: Vec<u64>, seed: u32| -> Result<RpcTensor, ErrorObject> {
        let n: u64 = shape.iter().product();
        let data: Vec<f32> = (0..n as u32).map(|i| ((i * 7 + seed) % 13) as f32 / 13.0 - 0.5).collect();
        Ok(RpcTensor(Tensor::from_slice(shape, &data).map_err(ErrorObject::tensor)?))
    };
    let mut w = TensorMap::new();
    w.insert("fc1.weight".into(), make(vec![4, 8], 1)?);
    w.insert("fc1.bias".into(), make(vec![8], 2)?);
    w.insert("fc2.weight".into(), make(vec![8, 2], 3)?);
    w.insert("fc2.bias".into(), make(vec![2], 4)?);
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_dtype() {
        for dtype in DType::ALL {
            let mut t = TensorMut::zeros(TensorMeta::new(dtype, vec![3])).unwrap();
            fill(&mut t, 1.0).unwrap();
            let t = t.freeze();
            match dtype {
                // A complex sum is no f64: refused. The fill is `1 + 0i`.
                DType::C64 => {
                    assert!(sum(&t, "t").is_err());
                    assert_eq!(t.as_slice::<[f32; 2]>().unwrap(), &[[1.0, 0.0]; 3]);
                }
                DType::C128 => {
                    assert!(sum(&t, "t").is_err());
                    assert_eq!(t.as_slice::<[f64; 2]>().unwrap(), &[[1.0, 0.0]; 3]);
                }
                _ => assert_eq!(sum(&t, "t").unwrap(), 3.0, "{dtype}"),
            }
        }
        // float8 fills round (ties to even) and sums decode.
        let mut t = TensorMut::zeros(TensorMeta::new(DType::F8E4M3Fn, vec![2])).unwrap();
        fill(&mut t, 17.0).unwrap();
        assert_eq!(sum(&t.freeze(), "t").unwrap(), 32.0);
    }

    #[test]
    fn weights_are_a_small_mlp() {
        let w = weights().unwrap();
        assert_eq!(w.keys().collect::<Vec<_>>(), ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]);
        assert_eq!(w["fc1.weight"].shape(), &[4, 8]);
    }
}
