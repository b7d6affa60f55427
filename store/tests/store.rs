//! The store in-process and over real pipes (shm): versions, in-place building, digests,
//! the budget, owners, readers holding versions, and publishers racing readers. Linux only:
//! buckets are ferry-shm's shared segments there (the only place ferry-shm exists).
#![cfg(target_os = "linux")]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferry_core::{DType, Endpoint, InlineChannel, Tensor, TensorMeta};
use ferry_local::LocalTransport;
use ferry_rpc::codes::{FORBIDDEN, INVALID_PARAMS, LIMIT_EXCEEDED, NOT_FOUND};
use ferry_rpc::{CallError, Client, Identity, RpcTensor, Server, TensorMap};
use ferry_shm::{SharedSegment, ShmChannel};
use ferry_store::rpc::{Opened, Published};
use ferry_store::{Store, StoreError, StoreOptions};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(20);

fn opts() -> StoreOptions {
    StoreOptions { budget_bytes: 1 << 30, bucket_bytes: 1 << 20, ..StoreOptions::default() }
}

/// `n` f32 tensors of `len` elements, tensor i filled with `i + fill`.
fn state_dict(n: usize, len: usize, fill: f32) -> Vec<(String, Tensor)> {
    (0..n)
        .map(|i| {
            (format!("layer.{i}.weight"), Tensor::from_slice(vec![len as u64], &vec![i as f32 + fill; len]).unwrap())
        })
        .collect()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.as_bytes().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn versions_publish_open_and_digest() {
    let store = Store::new(opts());
    let v1 = store.publish("m", state_dict(40, 10_000, 0.0), json!({"step": 1}), None).unwrap();
    assert_eq!(v1.manifest().version, 1);
    assert!(v1.bucket_tensors().len() > 1, "40 x 40 KB in 1 MiB buckets needs several");
    let v2 = store.publish("m", state_dict(40, 10_000, 0.5), json!({"step": 2}), None).unwrap();
    assert_eq!(v2.manifest().version, 2);
    let latest = store.open("m", None).unwrap();
    assert_eq!(latest.manifest().metadata, json!({"step": 2}));
    let ts = latest.tensors();
    assert_eq!(ts.len(), 40);
    assert_eq!(ts[3].0, "layer.3.weight");
    assert!(values(&ts[3].1).iter().all(|&x| x == 3.5));
    // The digest depends on the content, not the layout.
    let other = Store::new(StoreOptions { bucket_bytes: 64 << 20, ..opts() });
    let same = other.publish("x", state_dict(40, 10_000, 0.5), Value::Null, None).unwrap();
    let d = latest.manifest().wait_digest().unwrap();
    assert!(d.starts_with("blake3:") && d.len() == 7 + 64, "{d}");
    assert_eq!(same.manifest().wait_digest().unwrap(), d);
    assert_ne!(v1.manifest().wait_digest().unwrap(), d);
    assert!(matches!(store.open("nope", None), Err(StoreError::NotFound(_))));
}

#[test]
fn a_version_built_in_place_is_published_without_a_copy() {
    let store = Store::new(opts());
    let specs = vec![
        ("a".to_string(), TensorMeta::new(DType::F32, vec![256, 256])),
        ("b".to_string(), TensorMeta::new(DType::U8, vec![10])),
    ];
    let mut b = store.builder("live", specs, None).unwrap();
    b.tensor_mut("a").unwrap().fill(1);
    b.tensor_mut("b").unwrap().copy_from_slice(b"0123456789");
    let ptr = b.tensor_mut("a").unwrap().as_ptr();
    assert!(b.tensor_mut("c").is_none());
    let v = b.commit(json!({"in_place": true})).unwrap();
    let ts = v.tensors();
    assert_eq!(ts[0].1.as_bytes().as_ptr(), ptr, "the committed tensor is the memory the producer filled");
    assert_eq!(ts[1].1.as_bytes(), b"0123456789");
    // Published again (a reader's tensors, say), the bytes are referenced where they are.
    let again = store.publish("copy", ts.clone(), Value::Null, None).unwrap();
    assert_eq!(again.tensors()[0].1.as_bytes().as_ptr(), ptr);
    assert!(SharedSegment::containing(ts[0].1.as_bytes()).is_some());
    // A builder dropped without a commit publishes nothing and gives its budget back.
    let before = store.used_bytes();
    let dropped = store.builder("never", vec![("z".into(), TensorMeta::new(DType::U8, vec![1 << 20]))], None).unwrap();
    assert!(store.used_bytes() > before);
    drop(dropped);
    assert_eq!(store.used_bytes(), before);
    assert!(matches!(store.open("never", None), Err(StoreError::NotFound(_))));
}

#[test]
fn a_superseded_version_lives_while_a_reader_holds_it() {
    let store = Store::new(opts());
    let v1 = store.publish("m", state_dict(4, 100_000, 0.0), Value::Null, None).unwrap();
    let bytes1 = v1.manifest().bytes;
    v1.manifest().wait_digest(); // (the digest's thread holds the version until then)
    assert_eq!(v1.bucket_tensors().len(), 2, "two tensors of 400 KB per 1 MiB bucket");
    let mut held = v1.tensors();
    drop(v1);
    let v2 = store.publish("m", state_dict(4, 100_000, 9.0), Value::Null, None).unwrap();
    v2.manifest().wait_digest();
    assert_eq!(store.used_bytes(), bytes1 + v2.manifest().bytes, "v1's buckets are held");
    assert_eq!(store.list()["m"].held.iter().map(|m| m.version).collect::<Vec<_>>(), vec![1]);
    let again = store.open("m", Some(1)).unwrap();
    assert!(values(&again.tensors()[2].1).iter().all(|&x| x == 2.0));
    drop(again);
    // Holding one tensor keeps its bucket, not the whole version.
    let one = held.remove(2).1;
    drop(held);
    let bucket = one.as_bytes().len() as u64 * 2 + 4096 - (one.as_bytes().len() as u64 % 4096);
    assert_eq!(store.used_bytes(), v2.manifest().bytes + bucket);
    assert!(matches!(store.open("m", Some(1)), Err(StoreError::NotFound(_))), "no longer whole");
    assert!(values(&one).iter().all(|&x| x == 2.0), "a reader's version never changes");
    drop(one);
    assert_eq!(store.used_bytes(), v2.manifest().bytes, "v1 is freed once its last reader lets go");
    assert!(matches!(store.open("m", Some(1)), Err(StoreError::NotFound(_))));
    store.unpublish("m", &None).unwrap();
    assert!(matches!(store.open("m", None), Err(StoreError::NotFound(_))));
}

#[test]
fn budget_and_owners_are_enforced() {
    let store = Store::new(StoreOptions { budget_bytes: 1 << 20, ..opts() });
    let e = store.publish("big", state_dict(1, 300_000, 0.0), Value::Null, None).unwrap_err();
    assert!(matches!(e, StoreError::Budget { .. }), "{e}");
    assert!(e.to_string().contains("budget_bytes"), "{e}");
    let alice = Some(Identity::Uid(1001));
    let bob = Some(Identity::Uid(1002));
    store.publish("hers", state_dict(1, 10, 0.0), Value::Null, alice.clone()).unwrap();
    store.publish("hers", state_dict(1, 10, 1.0), Value::Null, alice.clone()).unwrap();
    let e = store.publish("hers", state_dict(1, 10, 2.0), Value::Null, bob.clone()).unwrap_err();
    assert!(matches!(e, StoreError::Forbidden(_)), "{e}");
    assert!(matches!(store.unpublish("hers", &bob), Err(StoreError::Forbidden(_))));
    assert_eq!(store.open("hers", None).unwrap().manifest().version, 2);
}

#[test]
fn readers_racing_a_publisher_always_see_one_whole_version() {
    let store = Store::new(opts());
    store.publish("m", state_dict(8, 20_000, 0.0), json!(0), None).unwrap();
    let writer = {
        let store = store.clone();
        std::thread::spawn(move || {
            for step in 1..=60u32 {
                // Every tensor of version k holds k + its index.
                let v = store.publish("m", state_dict(8, 20_000, step as f32), json!(step), None).unwrap();
                assert_eq!(v.manifest().version, u64::from(step) + 1);
            }
        })
    };
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut seen = 0;
                for _ in 0..300 {
                    let v = store.open("m", None).unwrap();
                    let step = v.manifest().metadata.as_u64().unwrap() as f32;
                    for (i, (_, t)) in v.tensors().iter().enumerate() {
                        assert!(values(t).iter().all(|&x| x == i as f32 + step), "a torn version");
                    }
                    seen += 1;
                }
                seen
            })
        })
        .collect();
    writer.join().unwrap();
    for r in readers {
        assert_eq!(r.join().unwrap(), 300);
    }
}

async fn serve(store: Arc<Store>, tag: &str) -> (String, Endpoint) {
    let ep = Endpoint::builder()
        .transport(Arc::new(LocalTransport::new()))
        .channel(Arc::new(ShmChannel::new()))
        .channel(Arc::new(InlineChannel))
        .build();
    let addr = format!("unix:ferry-store-test-{}", ferry_conformance::unique(tag));
    let server = Server::builder(ferry_store::rpc::methods(store).unwrap()).build();
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

async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..400 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not after 4 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a_pipe_buckets_are_lent_and_a_reader_holds_its_version() {
    let store = Store::new(opts());
    let (addr, ep) = serve(store.clone(), "rpc").await;
    let client = Client::new(ep.connect(&addr).await.unwrap()).with_timeout(Some(T));
    assert_eq!(client.pipe().channel(), "shm");
    let tensors: TensorMap = state_dict(100, 5_000, 0.0).into_iter().map(|(n, t)| (n, RpcTensor(t))).collect();
    let p: Published =
        client.call("store.publish", &json!({"name": "m", "tensors": tensors, "metadata": {"step": 1}})).await.unwrap();
    assert_eq!((p.version, p.tensors), (1, 100));

    let opened = ferry_store::rpc::open(&client, "m", None, None).await.unwrap();
    let buckets = opened.buckets.len();
    assert!(buckets > 1 && buckets < 100, "{buckets} buckets");
    let ts = opened.tensors().unwrap();
    assert_eq!(ts.len(), 100);
    let t7 = ts.iter().find(|(n, _)| n == "layer.7.weight").unwrap().clone();
    assert!(values(&t7.1).iter().all(|&x| x == 7.0));
    let stats = client.pipe().stats();
    assert_eq!(stats["shm"]["peer_segments"], buckets as u64, "one mapping per bucket: {stats}");
    // The digest, once asked for, is checked.
    let d = store.open("m", None).unwrap().manifest().wait_digest().unwrap();
    let checked = ferry_store::rpc::open(&client, "m", None, Some(&d)).await.unwrap();
    assert_eq!(checked.digest.as_deref(), Some(d.as_str()));
    drop(checked);
    let wrong = ferry_store::rpc::open(&client, "m", None, Some("blake3:00")).await.unwrap_err();
    assert_eq!(code(wrong), INVALID_PARAMS);
    assert_eq!(code(ferry_store::rpc::open(&client, "nope", None, None).await.unwrap_err()), NOT_FOUND);
    assert_eq!(code(ferry_store::rpc::open(&client, "m", Some(9), None).await.unwrap_err()), NOT_FOUND);

    // A new version: the reader still holds version 1 (its buckets stay), until it drops it.
    let tensors: TensorMap = state_dict(100, 5_000, 1.0).into_iter().map(|(n, t)| (n, RpcTensor(t))).collect();
    let p2: Published = client.call("store.publish", &json!({"name": "m", "tensors": tensors})).await.unwrap();
    assert_eq!(p2.version, 2);
    let v1_bytes = opened.bytes;
    assert_eq!(store.used_bytes(), v1_bytes + p2.bytes);
    let held: Opened = client.call("store.open", &json!({"name": "m", "version": 1})).await.unwrap();
    assert_eq!(held.version, 1, "a held superseded version can be opened again");
    assert!(values(&t7.1).iter().all(|&x| x == 7.0));
    drop((ts, t7, opened, held));
    eventually("the server frees version 1", || store.used_bytes() == p2.bytes).await;
    eventually("the reader unmaps version 1", || client.pipe().stats()["shm"]["peer_segments"] == 0).await;
    let list: Value = client.call("store.list", &json!({})).await.unwrap();
    assert_eq!(list[0]["version"], 2);
    assert_eq!(list[0]["held_versions"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a_pipe_errors_are_typed() {
    let store = Store::new(StoreOptions { budget_bytes: 1 << 20, ..opts() });
    store.publish("theirs", state_dict(1, 10, 0.0), Value::Null, Some(Identity::Uid(u32::MAX - 7))).unwrap();
    let (addr, ep) = serve(store, "errors").await;
    let client = Client::new(ep.connect(&addr).await.unwrap()).with_timeout(Some(T));
    let small: TensorMap = state_dict(1, 10, 0.0).into_iter().map(|(n, t)| (n, RpcTensor(t))).collect();
    let e =
        client.call::<_, Published>("store.publish", &json!({"name": "theirs", "tensors": small})).await.unwrap_err();
    assert_eq!(code(e), FORBIDDEN);
    let e = client.call::<_, bool>("store.unpublish", &json!({"name": "theirs"})).await.unwrap_err();
    assert_eq!(code(e), FORBIDDEN);
    let big: TensorMap = state_dict(1, 1 << 20, 0.0).into_iter().map(|(n, t)| (n, RpcTensor(t))).collect();
    let e = client.call::<_, Published>("store.publish", &json!({"name": "mine", "tensors": big})).await.unwrap_err();
    let CallError::Rpc(o) = e else { panic!("{e}") };
    assert_eq!(o.code, LIMIT_EXCEEDED);
    assert!(o.message.contains("budget_bytes"), "{}", o.message);
    let strided = Tensor::new(TensorMeta::new(DType::U8, vec![4]), Bytes::from_static(b"abcd")).unwrap();
    let ok: Published =
        client.call("store.publish", &json!({"name": "mine", "tensors": {"x": RpcTensor(strided)}})).await.unwrap();
    assert_eq!(ok.version, 1);
}
