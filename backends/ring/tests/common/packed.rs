//! What the packed-message tests share (`tests/packed.rs`, `tests/packed_wire.rs`).

use std::sync::Arc;
use std::time::Duration;

use ferry_core::wire::FEATURE_RING_MESSAGES;
use ferry_core::{
    ALIGN, AlignedBuf, DType, Endpoint, InlineChannel, Limits, Message, Pipe, PipeError, Tensor, TensorMeta,
};
use ferry_local::LocalTransport;
use ferry_ring::{RingExt, RingOptions};
use serde_json::{Value, json};

use super::bytes_tensor;

pub const LONG: Option<Duration> = Some(Duration::from_secs(20));

/// The ring record tag of a packed message.
pub const TAG_MESSAGE: u32 = 2;

/// The bound on any one wait of these tests (nothing here should come near it).
pub const BOUND: Duration = Duration::from_secs(30);

/// Whether the pipe agreed on packed messages.
pub fn packs(p: &Pipe) -> bool {
    p.info().features.iter().any(|f| f == FEATURE_RING_MESSAGES)
}

/// A connected pair, shared with plain threads: (server side, client side).
pub async fn arc_pair(server: &Endpoint, client: &Endpoint, tag: &str) -> (Arc<Pipe>, Arc<Pipe>) {
    let (s, c) = super::pair(server, client, tag).await;
    (Arc::new(s), Arc::new(c))
}

/// Waits (bounded) for a plain thread to end, without holding a runtime worker; its panic
/// is this test's panic.
pub async fn join<T: Send + 'static>(h: std::thread::JoinHandle<T>) -> T {
    let r = tokio::time::timeout(BOUND, tokio::task::spawn_blocking(move || h.join()))
        .await
        .expect("the thread ends within the bound")
        .expect("the joining task runs");
    r.unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// `recv` with the bound.
pub async fn recv(p: &Pipe) -> Result<Message, PipeError> {
    tokio::time::timeout(BOUND, p.recv()).await.expect("a message or an error comes within the bound")
}

/// A host tensor of `dtype` and `shape` over patterned bytes (any dtype, bf16 included).
pub fn patterned(dtype: DType, shape: &[u64], seed: u8) -> Tensor {
    let meta = TensorMeta::new(dtype, shape.to_vec());
    let n = meta.byte_span().unwrap() as usize;
    let v: Vec<u8> = (0..n).map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed)).collect();
    Tensor::new(meta, AlignedBuf::copy_from(&v).into_bytes()).unwrap()
}

/// A host tensor over exactly `bytes`.
pub fn raw_tensor(meta: TensorMeta, bytes: &[u8]) -> Tensor {
    Tensor::new(meta, AlignedBuf::copy_from(bytes).into_bytes()).unwrap()
}

/// Equal to what was sent, and every non-empty tensor starts on an [`ALIGN`] boundary.
pub fn assert_same(got: &Message, want: &Message, what: &str) {
    assert_eq!(got, want, "{what}");
    for (i, t) in got.tensors.iter().enumerate() {
        if t.nbytes() > 0 {
            let at = t.as_bytes().as_ptr() as usize;
            assert_eq!(at % ALIGN, 0, "{what}: tensor {i} ({:?}) at {at:#x} is not {ALIGN}-byte aligned", t.meta());
        }
    }
}

/// Messages that qualify for packing (every tensor a small contiguous host tensor): headers
/// of every shape, tensors of several dtypes and ranks, several per message.
pub fn packable_messages() -> Vec<Message> {
    let f32s = Tensor::from_slice(vec![2, 3], &[1.0f32, -2.5, 3.25, f32::MAX, f32::MIN_POSITIVE, -0.0]).unwrap();
    let scalar = Tensor::from_slice(Vec::<u64>::new(), &[std::f64::consts::PI]).unwrap();
    let i64s = Tensor::from_slice(vec![2, 3], &[i64::MIN, -1, 0, 1, 42, i64::MAX]).unwrap();
    let empty = Tensor::zeros(TensorMeta::new(DType::F32, vec![0, 4])).unwrap();
    let bf16 = patterned(DType::Bf16, &[7], 5);
    let many: Vec<Tensor> = (0..40u8).map(|i| bytes_tensor(i as usize * 3, i)).collect();
    vec![
        Message::new(Value::Null),
        Message::new(json!({})),
        Message::with_tensors(
            json!({"a": {"b": {"c": [1, 2, {"d": null, "e": [true, false]}]}}, "list": [[], {}, [[]]]}),
            vec![bytes_tensor(1000, 3), f32s.clone()],
        ),
        Message::with_tensors(
            json!({"s": "héllo wörld ✓ 🚀 日本語", "esc": "quote \" backslash \\ nl \n tab \t nul \u{0}"}),
            vec![scalar.clone(), bf16.clone(), empty.clone(), i64s.clone()],
        ),
        Message::with_tensors(
            json!({"u": u64::MAX, "i": i64::MIN, "f": 1.5e300, "tiny": 2.5e-300, "neg": -123456789.25}),
            vec![i64s, scalar, f32s, empty.clone(), bytes_tensor(1, 9)],
        ),
        Message::with_tensors(json!("only an empty tensor"), vec![empty]),
        Message::with_tensors(json!({"pad": "x".repeat(3000), "n": 7}), vec![bytes_tensor(64, 1), bytes_tensor(63, 2)]),
        Message::with_tensors(json!([1, "many"]), many),
        Message::with_tensors(
            json!(12),
            vec![
                raw_tensor(TensorMeta::new(DType::Bool, vec![3]), &[1, 0, 1]),
                patterned(DType::U16, &[5], 1),
                patterned(DType::C64, &[2, 2], 2),
                patterned(DType::F8E5M2, &[9], 3),
                patterned(DType::C128, &[1], 4),
            ],
        ),
        Message::with_tensors(Value::Null, vec![bytes_tensor(16 * 1024 - 1, 77)]),
    ]
}

/// A ring endpoint (inline channel, local transport) with these receive limits.
pub fn limited_endpoint(limits: Limits) -> Endpoint {
    Endpoint::builder()
        .transport(Arc::new(LocalTransport::new()))
        .channel(Arc::new(InlineChannel))
        .limits(limits)
        .ring(Some(RingOptions::default()))
        .build()
}
