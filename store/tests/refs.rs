//! Remote tensor references over real pipes with the shm channel: a handler keeps a tensor
//! and returns a reference; the reference passes as a param without moving bytes; fetching
//! lends the kept memory (zero-copy); freeing, a closed connection, a TTL and the limits.

use std::sync::Arc;
use std::time::Duration;

use ferry_core::{Endpoint, InlineChannel, Tensor};
use ferry_local::LocalTransport;
use ferry_rpc::codes::{LIMIT_EXCEEDED, NOT_FOUND};
use ferry_rpc::remote::{RefInfo, TensorRef};
use ferry_rpc::{CallContext, CallError, Client, ErrorObject, Methods, RpcLimits, RpcTensor, Server};
use ferry_shm::ShmChannel;
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(20);

fn endpoint() -> Endpoint {
    Endpoint::builder()
        .transport(Arc::new(LocalTransport::new()))
        .channel(Arc::new(ShmChannel::new()))
        .channel(Arc::new(InlineChannel))
        .build()
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Make {
    n: u64,
    value: f32,
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Sum {
    x: RpcTensor,
}

async fn serve(limits: RpcLimits, tag: &str) -> (String, Endpoint) {
    let mut m = Methods::new();
    m.register_ctx("make", |p: Make, ctx: CallContext| async move {
        let t = Tensor::from_slice(vec![p.n], &vec![p.value; p.n as usize]).map_err(ErrorObject::internal)?;
        // In shared memory: every fetch lends it.
        let t = ferry_store::shared_copy(&t).map_err(ErrorObject::internal)?;
        ctx.keep(t, None)
    })
    .unwrap();
    m.register("sum", |p: Sum| async move {
        let s: f64 = p.x.as_slice::<f32>().map_err(ErrorObject::internal)?.iter().map(|&v| f64::from(v)).sum();
        Ok::<_, ErrorObject>(s)
    })
    .unwrap();
    let server = Server::builder(m).limits(limits).ref_copy(Arc::new(ferry_store::shared_copy)).build();
    let ep = endpoint();
    let addr = format!("unix:ferry-refs-test-{}", ferry_conformance::unique(tag));
    let listener = ep.listen(&addr).await.unwrap();
    tokio::spawn(async move {
        let _ = server.serve(listener).await;
    });
    (addr, ep)
}

fn code(e: CallError) -> i64 {
    match e {
        CallError::Rpc(o) => o.code,
        other => panic!("not an RPC error: {other}"),
    }
}

async fn fetch(c: &Client, r: &TensorRef) -> Result<RpcTensor, CallError> {
    c.call("ferry.ref.fetch", &json!({ "ref": r })).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_stays_on_the_server_and_passes_as_a_param() {
    let (addr, ep) = serve(RpcLimits::default(), "param").await;
    let c = Client::new(ep.connect(&addr).await.unwrap()).with_timeout(Some(T));
    assert_eq!(c.pipe().channel(), "shm");
    let r: TensorRef = c.call("make", &json!({"n": 1000, "value": 0.5})).await.unwrap();
    let RefInfo { id, dtype, shape, bytes, published, .. } = r.0.clone();
    assert!(id.starts_with('r') && id.len() == 33, "{id}");
    assert_eq!((dtype, shape, bytes, published), (ferry_core::DType::F32, vec![1000], 4000, false));
    // As a param: the server uses the kept tensor (only the id is read).
    let s: f64 = c.call("sum", &json!({ "x": {"$tensor_ref": {"id": id}} })).await.unwrap();
    assert_eq!(s, 500.0);
    let s: f64 = c.call("sum", &json!({ "x": r })).await.unwrap();
    assert_eq!(s, 500.0);
    // Fetched twice: both are the server's one copy, lent (same mapping), not two copies.
    let (a, b) = (fetch(&c, &r).await.unwrap(), fetch(&c, &r).await.unwrap());
    assert_eq!(a.as_slice::<f32>().unwrap(), &[0.5; 1000][..]);
    assert_eq!(a.as_bytes().as_ptr(), b.as_bytes().as_ptr(), "lent, not copied");
    // A client's own tensor kept, then used by reference.
    let mine = RpcTensor(Tensor::from_slice(vec![3], &[1.0f32, 2.0, 3.0]).unwrap());
    let k: TensorRef = c.call("ferry.ref.keep", &json!({ "tensor": mine })).await.unwrap();
    let s: f64 = c.call("sum", &json!({ "x": k })).await.unwrap();
    assert_eq!(s, 6.0);
    let listed: Vec<TensorRef> = c.call("ferry.ref.list", &json!({})).await.unwrap();
    assert_eq!(listed.len(), 2);
    // Freed: not found, as an unknown id is; freeing again frees nothing.
    let freed: Value = c.call("ferry.ref.free", &json!({ "ids": [k.0.id] })).await.unwrap();
    assert_eq!(freed, json!({"freed": 1}));
    assert_eq!(code(c.call::<_, f64>("sum", &json!({ "x": k })).await.unwrap_err()), NOT_FOUND);
    let again: Value = c.call("ferry.ref.free", &json!({ "ids": [k.0.id] })).await.unwrap();
    assert_eq!(again, json!({"freed": 0}));
    let unknown = json!({"x": {"$tensor_ref": {"id": "r0123"}}});
    assert_eq!(code(c.call::<_, f64>("sum", &unknown).await.unwrap_err()), NOT_FOUND);
    // Malformed: a typed INVALID_PARAMS, not a crash.
    let bad = json!({"x": {"$tensor_ref": {"id": 7}}});
    assert_eq!(code(c.call::<_, f64>("sum", &bad).await.unwrap_err()), ferry_rpc::codes::INVALID_PARAMS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn references_die_with_their_connection_unless_published_and_with_their_ttl() {
    let (addr, ep) = serve(RpcLimits::default(), "life").await;
    let owner = Client::new(ep.connect(&addr).await.unwrap()).with_timeout(Some(T));
    let gone: TensorRef = owner.call("make", &json!({"n": 4, "value": 1.0})).await.unwrap();
    let kept: TensorRef = owner.call("make", &json!({"n": 4, "value": 2.0})).await.unwrap();
    let p: TensorRef = owner.call("ferry.ref.publish", &json!({ "id": kept.0.id })).await.unwrap();
    assert!(p.0.published);
    let short = RpcTensor(Tensor::from_slice(vec![1], &[1.0f32]).unwrap());
    let ttl: TensorRef = owner.call("ferry.ref.keep", &json!({ "tensor": short, "ttl_ms": 1 })).await.unwrap();
    assert!(ttl.0.expires_ms.is_some());
    drop(owner);
    // Another connection of the same user: the published one is there, the other is freed
    // once the server has seen the close (bounded wait), the one with a TTL has expired.
    let other = Client::new(ep.connect(&addr).await.unwrap()).with_timeout(Some(T));
    let mut freed = false;
    for _ in 0..400 {
        match fetch(&other, &gone).await {
            Err(e) => {
                assert_eq!(code(e), NOT_FOUND);
                freed = true;
                break;
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    assert!(freed, "a reference outlived its connection");
    assert_eq!(fetch(&other, &kept).await.unwrap().as_slice::<f32>().unwrap(), &[2.0; 4]);
    assert_eq!(code(fetch(&other, &ttl).await.unwrap_err()), NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_table_is_bounded_and_says_by_what() {
    let (addr, ep) = serve(RpcLimits::default().max_refs(2).max_ref_bytes(1 << 20), "limits").await;
    let c = Client::new(ep.connect(&addr).await.unwrap()).with_timeout(Some(T));
    let _a: TensorRef = c.call("make", &json!({"n": 4, "value": 1.0})).await.unwrap();
    let big = c.call::<_, TensorRef>("make", &json!({"n": 1 << 20, "value": 1.0})).await.unwrap_err();
    match big {
        CallError::Rpc(o) => assert!(o.code == LIMIT_EXCEEDED && o.message.contains("max_ref_bytes"), "{o:?}"),
        other => panic!("{other}"),
    }
    let _b: TensorRef = c.call("make", &json!({"n": 4, "value": 1.0})).await.unwrap();
    match c.call::<_, TensorRef>("make", &json!({"n": 4, "value": 1.0})).await.unwrap_err() {
        CallError::Rpc(o) => assert!(o.code == LIMIT_EXCEEDED && o.message.contains("max_refs"), "{o:?}"),
        other => panic!("{other}"),
    }
}

/// A pipe whose peer holds server memory lent over shm (a fetched reference, as a reader
/// of a weights bundle holds its buckets) stays open however long it idles; once the
/// lease is released, `idle_timeout` closes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipe_holding_lent_memory_outlives_the_idle_timeout() {
    let idle = Duration::from_millis(300);
    let (addr, ep) = serve(RpcLimits::default().idle_timeout(idle), "idle").await;
    let c = Client::new(ep.connect(&addr).await.unwrap()).with_timeout(Some(T));
    let r: TensorRef = c.call("make", &json!({"n": 100_000, "value": 1.0})).await.unwrap();
    let lent = fetch(&c, &r).await.unwrap();
    let freed: Value = c.call("ferry.ref.free", &json!({ "ids": [r.0.id] })).await.unwrap();
    assert_eq!(freed, json!({"freed": 1}), "no reference holds the pipe now, only the lease");
    let listed: Vec<TensorRef> = c.call("ferry.ref.list", &json!({})).await.unwrap();
    assert!(listed.is_empty());
    tokio::time::sleep(idle * 3).await;
    assert!(!c.pipe().is_closed(), "closed while its peer held lent memory");
    assert_eq!(lent.as_slice::<f32>().unwrap()[99_999], 1.0);
    drop(lent);
    // The release goes out by itself (the pipe's control task, no message needed); the
    // pipe has been quiet for longer than `idle_timeout`, so it closes once the server
    // has it. (A call made here raced that close: it failed once in CI.)
    let err = tokio::time::timeout(T, c.pipe().recv()).await.expect("not closed in time").unwrap_err();
    assert!(err.to_string().contains("idle_timeout"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_past_max_ref_ttl_is_refused_naming_ttl_ms_and_the_server_keeps_serving() {
    let (addr, ep) = serve(RpcLimits::default(), "max-ttl").await;
    let c = Client::new(ep.connect(&addr).await.unwrap()).with_timeout(Some(T));
    let one = || RpcTensor(Tensor::from_slice(vec![1], &[1.0f32]).unwrap());
    let max_ms = ferry_rpc::remote::MAX_REF_TTL.as_millis() as u64;
    for ttl_ms in [u64::MAX, max_ms + 1] {
        let e =
            c.call::<_, TensorRef>("ferry.ref.keep", &json!({ "tensor": one(), "ttl_ms": ttl_ms })).await.unwrap_err();
        let CallError::Rpc(e) = e else { panic!("ttl_ms {ttl_ms}: {e}") };
        assert_eq!(e.code, ferry_rpc::codes::INVALID_PARAMS, "{}", e.message);
        assert!(e.message.contains("ttl_ms"), "{}", e.message);
    }
    // The longest TTL is kept, and its expiry is a year from now, not a wrapped number.
    let year: TensorRef = c.call("ferry.ref.keep", &json!({ "tensor": one(), "ttl_ms": max_ms })).await.unwrap();
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let expires = year.0.expires_ms.unwrap();
    assert!(expires > now_ms + max_ms - 60_000 && expires <= now_ms + max_ms + 60_000, "{expires}");
    let sum: f64 = c.call("sum", &json!({ "x": year })).await.unwrap();
    assert_eq!(sum, 1.0);
}
