//! What a per-connection identity makes dies with its connection (SECURITY.md, "What
//! belongs to whom"), over real QUIC on loopback: without a token each connection is its
//! own identity, so its references (publishing one is refused) and its bundles are freed
//! when it closes, and `max_refs`, the store's budget and the bundle's name are free again
//! for the next connection. With a token (a durable identity) a published reference and a
//! bundle outlive the connection, and another holder of the token reaches both.

use std::sync::Arc;
use std::time::Duration;

use ferry_core::{Endpoint, InlineChannel, Tensor};
use ferry_quic::{IdentitySource, QuicChannel, QuicOptions, QuicTransport};
use ferry_rpc::codes::{FORBIDDEN, LIMIT_EXCEEDED};
use ferry_rpc::remote::TensorRef;
use ferry_rpc::{CallError, Client, RpcLimits, RpcTensor, Server};
use ferry_store::rpc::{BundleInfo, Published};
use ferry_store::{Store, StoreOptions};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(30);
const KB: usize = 1 << 10;
const MAX_REFS: usize = 4;
/// The store's budget: one bundle of [`BIG`] fits, two do not.
const BUDGET: u64 = 1 << 20;
const BIG: usize = 768 * KB;

async fn t<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(T, f).await.expect("timed out")
}

fn endpoint() -> ferry_core::EndpointBuilder {
    let opts = QuicOptions { identity: IdentitySource::Ephemeral, ..QuicOptions::default() };
    Endpoint::builder()
        .transport(Arc::new(QuicTransport::with_options(opts)))
        .channel(Arc::new(QuicChannel::new()))
        .channel(Arc::new(InlineChannel))
}

/// A store's server on `quic://127.0.0.1:0` (requiring `token` if any); its address.
async fn serve(token: Option<&str>) -> (String, Arc<Store>) {
    // (No digest: its thread holds a version for a while after it is unpublished.)
    let store = Store::new(StoreOptions { budget_bytes: BUDGET, digest: false, ..StoreOptions::default() });
    let m = ferry_store::rpc::methods(store.clone()).unwrap();
    let server = Server::builder(m).limits(RpcLimits::default().max_refs(MAX_REFS)).build();
    let mut ep = endpoint();
    if let Some(tk) = token {
        ep = ep.require_token(tk);
    }
    let listener = ep.build().listen("quic://127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().to_string();
    tokio::spawn(async move {
        let _ = server.serve(listener).await;
    });
    (addr, store)
}

async fn client(addr: &str, token: Option<&str>) -> Client {
    let mut ep = endpoint();
    if let Some(tk) = token {
        ep = ep.token(tk);
    }
    let c = Client::new(t(ep.build().connect(addr)).await.unwrap());
    assert_eq!(c.pipe().transport(), "quic");
    c
}

fn tensor(bytes: usize, v: u8) -> RpcTensor {
    RpcTensor(Tensor::from_slice(vec![bytes as u64], &vec![v; bytes]).unwrap())
}

async fn keep(c: &Client, v: u8) -> Result<TensorRef, CallError> {
    t(c.call("ferry.ref.keep", &json!({ "tensor": tensor(KB, v) }))).await
}

async fn publish(c: &Client, name: &str, v: u8) -> Result<Published, CallError> {
    t(c.call("store.publish", &json!({ "name": name, "tensors": { "w": tensor(BIG, v) } }))).await
}

async fn bundles(c: &Client) -> Vec<String> {
    let l: Vec<BundleInfo> = t(c.call("store.list", &json!({}))).await.unwrap();
    l.into_iter().map(|b| b.name).collect()
}

fn code(e: &CallError) -> Option<i64> {
    e.code()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tokenless_quic_connections_references_and_bundles_die_with_it() {
    let (addr, store) = serve(None).await;
    let a = client(&addr, None).await;
    let b = client(&addr, None).await;
    publish(&a, "w", 1).await.unwrap();
    let mut refs = Vec::new();
    for i in 0..MAX_REFS {
        refs.push(keep(&a, i as u8).await.unwrap());
    }
    // Publishing a reference needs a durable identity.
    let e = t(a.call::<_, TensorRef>("ferry.ref.publish", &json!({ "id": refs[0].0.id }))).await.unwrap_err();
    assert_eq!(code(&e), Some(FORBIDDEN), "{e}");
    assert!(e.to_string().contains("token"), "{e}");
    // While A lives: the table is full for everyone, the budget too, and A's name is A's.
    let e = keep(&b, 9).await.unwrap_err();
    assert_eq!(code(&e), Some(LIMIT_EXCEEDED), "{e}");
    assert!(e.to_string().contains("max_refs"), "{e}");
    let e = publish(&b, "v", 2).await.unwrap_err();
    assert!(code(&e) == Some(LIMIT_EXCEEDED) && e.to_string().contains("budget_bytes"), "{e}");
    assert_eq!(code(&publish(&b, "w", 2).await.unwrap_err()), Some(FORBIDDEN));
    let e = t(b.call::<_, bool>("store.unpublish", &json!({ "name": "w" }))).await.unwrap_err();
    assert_eq!(code(&e), Some(FORBIDDEN));
    assert_eq!(bundles(&b).await, ["w"]);

    t(a.close()).await;
    drop(a);
    // The server learns of the close asynchronously: wait for it (bounded).
    let mut gone = false;
    for _ in 0..300 {
        if bundles(&b).await.is_empty() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "A's bundle outlived its connection");
    assert_eq!(store.used_bytes(), 0, "A's bundle still holds the budget");
    // Every reference slot is free again (A's were freed before its bundles), and so are
    // the budget and the name.
    for i in 0..MAX_REFS {
        keep(&b, i as u8).await.unwrap();
    }
    publish(&b, "w", 3).await.expect("A's name is free again");
    let e = publish(&b, "v", 4).await.unwrap_err();
    assert!(e.to_string().contains("budget_bytes"), "B's own bundle counts: {e}");
    t(b.call::<_, bool>("store.unpublish", &json!({ "name": "w" }))).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_published_references_and_bundles_outlive_the_connection() {
    let (addr, store) = serve(Some("durable")).await;
    let a = client(&addr, Some("durable")).await;
    publish(&a, "w", 1).await.unwrap();
    let r = keep(&a, 7).await.unwrap();
    let p: TensorRef = t(a.call("ferry.ref.publish", &json!({ "id": r.0.id }))).await.unwrap();
    assert!(p.0.published);
    let unpublished = keep(&a, 8).await.unwrap();
    t(a.close()).await;
    drop(a);
    let b = client(&addr, Some("durable")).await;
    // The unpublished one dies with its connection (bounded wait: the close is seen
    // asynchronously); the published one and the bundle do not.
    let mut freed = false;
    for _ in 0..300 {
        let mine: Vec<TensorRef> = t(b.call("ferry.ref.list", &json!({}))).await.unwrap();
        if mine.len() == 1 {
            assert_eq!(mine[0].0.id, r.0.id);
            freed = true;
            break;
        }
        assert!(mine.iter().any(|m| m.0.id == unpublished.0.id), "{mine:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(freed, "the unpublished reference outlived its connection");
    let back: RpcTensor = t(b.call("ferry.ref.fetch", &json!({ "ref": r }))).await.unwrap();
    assert_eq!(back.0.as_bytes(), &[7u8; KB][..]);
    assert_eq!(bundles(&b).await, ["w"]);
    assert!(store.used_bytes() >= BIG as u64);
    // Another holder of the token is the same identity: it may unpublish A's bundle.
    t(b.call::<_, Value>("store.unpublish", &json!({ "name": "w" }))).await.unwrap();
    assert!(bundles(&b).await.is_empty());
}
