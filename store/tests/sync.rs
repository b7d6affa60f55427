//! What makes a publish reach its readers fast (issue 47 point 6): a version's tensor
//! digests are taken from the version before for the storage it shares and never go stale;
//! a version built from the latest one keeps the tensors it names without a copy; and a
//! reader waiting on `store.delta` (`wait_ms`) is answered when the next version is
//! published, over a real connection. Linux only (buckets are ferry-shm's segments there).
#![cfg(target_os = "linux")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use ferry_core::{DType, InlineChannel, Tensor, TensorMeta};
use ferry_rpc::{Client, Server};
use ferry_store::delta::{Change, Delta, DeltaParams};
use ferry_store::replica::Replica;
use ferry_store::{Store, StoreError, StoreOptions, Version};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(30);
/// f32 elements per tensor (16 KiB).
const N: usize = 4096;

fn store(digest: bool) -> Arc<Store> {
    Store::new(StoreOptions { budget_bytes: 1 << 30, bucket_bytes: 1 << 20, digest, ..StoreOptions::default() })
}

fn tensor(fill: f32) -> Tensor {
    Tensor::from_slice(vec![N as u64], &vec![fill; N]).unwrap()
}

/// Eight tensors, tensor i filled with `i + fill(i)`.
fn state(fill: &dyn Fn(usize) -> f32) -> Vec<(String, Tensor)> {
    (0..8).map(|i| (format!("t{i}"), tensor(i as f32 + fill(i)))).collect()
}

/// The version's digests are BLAKE3 of the bytes it holds now.
fn digests_true(v: &Version) {
    let d = v.tensor_digests().unwrap();
    for (i, (n, t)) in v.tensors().iter().enumerate() {
        assert_eq!(d[i], *blake3::hash(t.as_bytes()).as_bytes(), "digest of {n} in version {}", v.manifest().version);
    }
}

#[test]
fn a_version_hashes_only_the_tensors_it_does_not_share_and_its_digests_are_never_stale() {
    let store = store(true);
    let v1 = store.publish("m", state(&|_| 0.0), Value::Null, None).unwrap();
    v1.manifest().wait_digest();
    assert_eq!(v1.manifest().digested_bytes(), 8 * 4 * N as u64, "the first version hashes everything");
    // Publish the whole state with two tensors changed: the six equal ones are shared, so
    // their digests come from version 1.
    let v2 = store.publish("m", state(&|i| if i == 2 || i == 5 { 0.5 } else { 0.0 }), Value::Null, None).unwrap();
    v2.manifest().wait_digest();
    assert_eq!(v2.manifest().digested_bytes(), 2 * 4 * N as u64);
    digests_true(&v2);
    // A publisher that names what changed: one tensor hashed; the others are version 2's.
    let v3 = store.publish_delta("m", 2, vec![("t7".into(), tensor(-1.0))], &[], Value::Null, None).unwrap();
    v3.manifest().wait_digest();
    assert_eq!(v3.manifest().digested_bytes(), 4 * N as u64);
    digests_true(&v3);
    // Every version still held keeps its own, true digests.
    for v in [&v1, &v2, &v3] {
        digests_true(v);
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn digests_asked_for_without_a_digest_thread_are_computed_once_and_inherited_too() {
    let store = store(false);
    let v1 = store.publish("m", state(&|_| 0.0), Value::Null, None).unwrap();
    let (a, b) = std::thread::scope(|s| {
        let x = s.spawn(|| v1.tensor_digests().unwrap());
        let y = s.spawn(|| v1.tensor_digests().unwrap());
        (x.join().unwrap(), y.join().unwrap())
    });
    assert!(Arc::ptr_eq(&a, &b), "both callers got the one computation");
    assert_eq!(v1.manifest().digested_bytes(), 8 * 4 * N as u64);
    let v2 = store.publish("m", state(&|i| if i == 3 { 1.0 } else { 0.0 }), Value::Null, None).unwrap();
    digests_true(&v2);
    assert_eq!(v2.manifest().digested_bytes(), 4 * N as u64);
}

#[test]
fn a_version_built_from_the_latest_keeps_what_it_names_and_holds_what_was_written() {
    let store = store(true);
    let v1 = store.publish("m", state(&|_| 0.0), Value::Null, None).unwrap();
    v1.manifest().wait_digest();
    let meta = TensorMeta::new(DType::F32, vec![N as u64]);
    let specs = (0..8).map(|i| (format!("t{i}"), meta.clone(), i != 4)).collect();
    let mut b = store.builder_from("m", Some(1), specs, None).unwrap();
    assert!(b.tensor_mut(0).is_none(), "a kept tensor is not written");
    b.tensor_mut(4).unwrap().copy_from_slice(&f32_bytes(&[9.0; N]));
    let v2 = b.commit(json!({"step": 2})).unwrap();
    v2.manifest().wait_digest();
    assert_eq!(v2.manifest().new_bytes, 4 * N as u64, "one tensor's bytes are new");
    assert_eq!(v2.manifest().digested_bytes(), 4 * N as u64);
    let got: Vec<f32> =
        v2.tensors().iter().map(|(_, t)| f32::from_le_bytes(t.as_bytes()[..4].try_into().unwrap())).collect();
    assert_eq!(got, vec![0.0, 1.0, 2.0, 3.0, 9.0, 5.0, 6.0, 7.0]);
    digests_true(&v2);
    // Against a base that is no longer the latest: refused at the commit.
    let specs = vec![("t0".to_owned(), meta.clone(), true)];
    let stale = store.builder_from("m", Some(2), specs.clone(), None).unwrap();
    store.publish_delta("m", 2, vec![("t1".into(), tensor(0.0))], &[], Value::Null, None).unwrap();
    assert!(matches!(stale.commit(Value::Null), Err(StoreError::Stale { base: 2, .. })));
    // Keeping a tensor the base does not have, or with another shape: refused.
    let other = TensorMeta::new(DType::F32, vec![2]);
    assert!(store.builder_from("m", Some(3), vec![("nope".into(), meta, true)], None).is_err());
    assert!(store.builder_from("m", Some(3), vec![("t0".into(), other, true)], None).is_err());
}

async fn serve(store: Arc<Store>) -> Client {
    let ep = common::endpoint(Arc::new(InlineChannel));
    let addr = format!("unix:ferry-sync-test-{}", ferry_conformance::unique("sync"));
    let server = Server::builder(ferry_store::rpc::methods(store).unwrap()).build();
    let listener = ep.listen(&addr).await.unwrap();
    let addr = listener.local_addr().to_string();
    tokio::spawn(async move {
        let _ = server.serve(listener).await;
    });
    Client::new(ep.connect(&addr).await.unwrap()).with_timeout(Some(T))
}

fn waiting(from: Option<u64>, tree: Option<String>, ms: u64) -> DeltaParams {
    DeltaParams { name: "m".into(), from, from_tree: tree, to: None, sparse: true, wait_ms: Some(ms) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_waiting_on_store_delta_is_answered_with_the_version_published_meanwhile() {
    let store = store(true);
    let client = serve(store.clone()).await;
    // Waiting for a bundle that does not exist yet: answered once it is published.
    let c = client.clone();
    let first = tokio::spawn(async move { c.call::<_, Delta>("store.delta", &waiting(None, None, 30_000)).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    store.publish("m", state(&|_| 0.0), Value::Null, None).unwrap().manifest().wait_digest();
    let d = tokio::time::timeout(T, first).await.unwrap().unwrap().unwrap();
    assert_eq!(d.version, 1);
    let mut r = Replica::new("m");
    r.apply(&d).unwrap();
    // Holding version 1: a wait that runs out answers version 1 again, nothing sent.
    let d: Delta = client.call("store.delta", &waiting(Some(1), r.held().tree.clone(), 20)).await.unwrap();
    assert_eq!((d.version, d.sent_bytes), (1, 0));
    assert!(d.tensors.iter().all(|t| t.change == Change::Same));
    r.apply(&d).unwrap();
    // Waiting at version 1: answered with version 2 when it is published.
    let c = client.clone();
    let p = waiting(Some(1), r.held().tree.clone(), 30_000);
    let next = tokio::spawn(async move { c.call::<_, Delta>("store.delta", &p).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    store.publish("m", state(&|i| if i == 6 { 0.25 } else { 0.0 }), Value::Null, None).unwrap();
    let d = tokio::time::timeout(T, next).await.unwrap().unwrap().unwrap();
    assert_eq!((d.version, d.base), (2, Some(1)));
    r.apply(&d).unwrap();
    assert_eq!(r.tensor("t6").unwrap(), Tensor::from_slice(vec![N as u64], &vec![6.25f32; N]).unwrap().as_bytes());
    // Without a bundle and with a wait that runs out: NOT_FOUND.
    let p = DeltaParams { name: "none".into(), ..waiting(None, None, 20) };
    assert!(client.call::<_, Delta>("store.delta", &p).await.is_err());
    // The store says what computing its deltas took.
    let t: Value = client.call("store.delta.timings", &json!({})).await.unwrap();
    let last = t.as_array().unwrap().last().unwrap().clone();
    assert_eq!((last["from"].clone(), last["to"].clone()), (json!(1), json!(2)));
    assert!(last["times"]["diff_ms"].as_f64().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_latest_returns_the_next_version_or_the_held_one_when_the_time_runs_out() {
    let store = store(true);
    assert_eq!(store.wait_latest("m", None, Duration::from_millis(10)).await, None);
    store.publish("m", state(&|_| 0.0), Value::Null, None).unwrap();
    assert_eq!(store.wait_latest("m", None, T).await, Some(1), "a version exists: no wait");
    assert_eq!(store.wait_latest("m", Some(1), Duration::from_millis(10)).await, Some(1));
    let s = store.clone();
    let waiter = tokio::spawn(async move { s.wait_latest("m", Some(1), T).await });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let v2 = store.publish("m", state(&|_| 1.0), Value::Null, None).unwrap();
    assert_eq!(tokio::time::timeout(T, waiter).await.unwrap().unwrap(), Some(v2.manifest().version));
}

#[test]
fn spare_buckets_are_made_after_a_publish_filled_by_the_next_and_let_go_under_the_budget() {
    let v = 8 * 4 * N as u64; // one version: eight 16 KiB tensors in one bucket
    let store = Store::new(StoreOptions {
        budget_bytes: 2 * v + 4096,
        bucket_bytes: 1 << 20,
        spare_buckets: true,
        ..StoreOptions::default()
    });
    let v1 = store.publish("m", state(&|_| 0.0), Value::Null, None).unwrap();
    v1.manifest().wait_digest();
    // The spare is made in the background (bounded wait).
    let mut waited = 0;
    while store.used_bytes() < 2 * v && waited < 3000 {
        std::thread::sleep(Duration::from_millis(1));
        waited += 1;
    }
    assert_eq!(store.used_bytes(), 2 * v, "version 1 and a spare bucket of its size");
    // Version 1 still held, version 2 needs a bucket: the spare is it (within the budget).
    let v2 = store.publish("m", state(&|_| 0.5), Value::Null, None).unwrap();
    v2.manifest().wait_digest();
    digests_true(&v2);
    let got: Vec<f32> =
        v2.tensors().iter().map(|(_, t)| f32::from_le_bytes(t.as_bytes()[..4].try_into().unwrap())).collect();
    assert_eq!(got, (0..8).map(|i| i as f32 + 0.5).collect::<Vec<_>>());
    // Version 2 held as well: a third needs room the spare (if any was made again) gives up.
    let v3 = store.publish("m", state(&|_| 0.25), Value::Null, None);
    assert!(matches!(v3, Err(StoreError::Budget { .. })), "three versions do not fit: {v3:?}");
    drop(v1);
    let v3 = store.publish("m", state(&|_| 0.25), Value::Null, None).unwrap();
    digests_true(&v3);
}

/// Publishes at once each make spares in the background; together they keep at most one
/// publish's worth (the soak's "tokenless QUIC conns close" phase once found two where one
/// publish's worth was due).
#[test]
fn concurrent_publishes_keep_at_most_one_publish_worth_of_spares() {
    let v = 8 * 4 * N as u64; // one version: eight 16 KiB tensors in one bucket
    let n = 16u64;
    let store = Arc::new(Store::new(StoreOptions {
        budget_bytes: 4 * n * v,
        bucket_bytes: 1 << 20,
        spare_buckets: true,
        ..StoreOptions::default()
    }));
    let threads: Vec<_> = (0..n)
        .map(|i| {
            let store = store.clone();
            std::thread::spawn(move || {
                store.publish(&format!("m{i}"), state(&|_| i as f32), Value::Null, None).unwrap()
            })
        })
        .collect();
    let versions: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    // The spares are made in the background: wait until the figure holds still (bounded).
    let (mut last, mut still) = (store.used_bytes(), 0);
    for _ in 0..3000 {
        std::thread::sleep(Duration::from_millis(1));
        let now = store.used_bytes();
        still = if now == last { still + 1 } else { 0 };
        last = now;
        if still >= 200 {
            break;
        }
    }
    assert!(still >= 200, "the spares settled");
    let spare = store.used_bytes() - n * v;
    assert!(spare <= v, "{spare} spare bytes kept by {n} publishes at once; one publish is {v}");
    drop(versions);
}
