//! `store.delta` and the reader's apply: per tensor the smaller of nothing, the changed
//! elements and the whole tensor; bit-identical results for bf16, f16, f32 and the float8s
//! (NaN payloads and -0.0 included), checked by digest; readers several versions behind,
//! new readers, and a corrupted delta refused with the copy of N intact. In-process and
//! over real connections (local sockets and QUIC on loopback).
#![cfg(target_os = "linux")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferry_core::{DType, Endpoint, InlineChannel, Tensor, TensorMeta};
use ferry_quic::{IdentitySource, QuicChannel, QuicOptions, QuicTransport};
use ferry_rpc::{Client, RpcTensor, Server};
use ferry_store::delta::{Change, Delta, DeltaParams};
use ferry_store::replica::{DeltaError, Replica, fetch};
use ferry_store::{Store, StoreOptions};
use serde_json::Value;

const T: Duration = Duration::from_secs(30);

fn store(bases: usize) -> Arc<Store> {
    Store::new(StoreOptions {
        budget_bytes: 1 << 30,
        bucket_bytes: 1 << 20,
        delta_bases: bases,
        ..StoreOptions::default()
    })
}

fn raw(dtype: DType, bytes: Vec<u8>) -> Tensor {
    let n = (bytes.len() / dtype.itemsize()) as u64;
    Tensor::new(TensorMeta::new(dtype, vec![n]), Bytes::from(bytes)).unwrap()
}

fn params(from: Option<u64>, tree: Option<String>) -> DeltaParams {
    DeltaParams { name: "m".into(), from, from_tree: tree, to: None, sparse: true, wait_ms: None }
}

/// The store's bytes of the latest version, by name.
fn latest(store: &Store) -> Vec<(String, Vec<u8>)> {
    store.open("m", None).unwrap().tensors().into_iter().map(|(n, t)| (n, t.as_bytes().to_vec())).collect()
}

fn same_as_store(r: &Replica, store: &Store) {
    let v = store.open("m", None).unwrap();
    assert_eq!(r.version(), Some(v.manifest().version));
    let mine: Vec<(String, Vec<u8>)> = r.tensors().map(|(n, _, _, b)| (n.to_owned(), b.to_vec())).collect();
    assert_eq!(mine, latest(store), "bit-identical");
    assert_eq!(Some(r.bundle_digest()), v.manifest().wait_digest(), "the store's own bundle digest");
}

#[test]
fn each_tensor_goes_as_the_smallest_of_nothing_its_changes_and_the_whole() {
    let store = store(1);
    let n = 4096usize; // f32 elements: 16 KiB per tensor
    let base: Vec<u8> = (0..n as u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let v1 = vec![
        ("same".to_string(), raw(DType::F32, base.clone())),
        ("few".to_string(), raw(DType::F32, base.clone())),
        ("all".to_string(), raw(DType::F32, base.clone())),
    ];
    store.publish("m", v1, Value::Null, None).unwrap();
    let mut r = Replica::new("m");
    let d = store.delta(&params(None, None)).unwrap();
    assert_eq!(d.base, None);
    assert!(d.tensors.iter().all(|t| t.change == Change::Dense), "a new reader gets every tensor whole");
    r.apply(&d).unwrap();
    same_as_store(&r, &store);

    let mut few = base.clone();
    for i in [3usize, 77, 4000] {
        few[i * 4] ^= 1;
    }
    let all: Vec<u8> = base.iter().map(|b| b ^ 0xff).collect();
    let v2 = vec![
        ("same".to_string(), raw(DType::F32, base.clone())),
        ("few".to_string(), raw(DType::F32, few)),
        ("all".to_string(), raw(DType::F32, all)),
    ];
    store.publish("m", v2, Value::Null, None).unwrap();
    let d = store.delta(&r.held().params(None)).unwrap();
    assert_eq!(d.base, Some(1));
    let kinds: Vec<Change> = d.tensors.iter().map(|t| t.change).collect();
    assert_eq!(kinds, [Change::Same, Change::Sparse, Change::Dense]);
    let few = &d.tensors[1];
    assert_eq!(few.index.as_ref().unwrap().dtype(), DType::U32);
    assert_eq!(few.index.as_ref().unwrap().shape(), [3]);
    assert_eq!(d.sent_bytes, 3 * (4 + 4) + 16384, "three (u32, f32) pairs and one whole tensor");
    assert_eq!(d.full_bytes, 3 * 16384);
    let a = r.apply(&d).unwrap();
    assert_eq!((a.same, a.sparse, a.dense, a.elements), (1, 1, 1, 3));
    same_as_store(&r, &store);
    // Sparse is off on request: the changed tensors go whole.
    let d = store.delta(&DeltaParams { sparse: false, ..params(Some(1), None) }).unwrap();
    assert_eq!(d.tensors.iter().map(|t| t.change).collect::<Vec<_>>(), [Change::Same, Change::Dense, Change::Dense]);
}

/// Element bit patterns of `dtype` that float comparison would get wrong: +0/-0, NaNs with
/// different payloads and signs, infinities where the type has them.
fn tricky(dtype: DType) -> Vec<Vec<u8>> {
    match dtype.itemsize() {
        1 => [0x00u8, 0x80, 0x7f, 0xff, 0x7e, 0x7d, 0xfe, 0x01].iter().map(|b| vec![*b]).collect(),
        2 => [0x0000u16, 0x8000, 0x7fc0, 0x7fc1, 0xffc1, 0x7e01, 0xfe00, 0x7c00, 0xfc00, 0x7f80]
            .iter()
            .map(|v| v.to_le_bytes().to_vec())
            .collect(),
        _ => [0x0000_0000u32, 0x8000_0000, 0x7fc0_0000, 0x7fc0_0001, 0xffc0_0001, 0x7f80_0001, 0x7f80_0000]
            .iter()
            .map(|v| v.to_le_bytes().to_vec())
            .collect(),
    }
}

#[test]
fn bf16_f16_f32_and_float8_come_out_bit_identical_nans_and_negative_zero_included() {
    for dtype in [DType::Bf16, DType::F16, DType::F32, DType::F8E4M3Fn, DType::F8E5M2] {
        let store = store(1);
        let size = dtype.itemsize();
        let n = 2048usize;
        let pats = tricky(dtype);
        let mut rng = fastrand::Rng::with_seed(7);
        let v1: Vec<u8> = (0..n).flat_map(|i| pats[i % pats.len()].clone()).collect();
        store.publish("m", vec![("w".into(), raw(dtype, v1.clone()))], Value::Null, None).unwrap();
        let mut r = Replica::new("m");
        r.apply(&store.delta(&params(None, None)).unwrap()).unwrap();
        // Change a few elements to another tricky pattern (+0 <-> -0, one NaN to another).
        let mut v2 = v1.clone();
        let mut changed = 0;
        for _ in 0..20 {
            let i = rng.usize(..n);
            let now = &v2[i * size..(i + 1) * size];
            let next = pats.iter().position(|p| p == now).map_or(0, |k| (k + 1) % pats.len());
            v2[i * size..(i + 1) * size].copy_from_slice(&pats[next]);
            changed += 1;
        }
        store.publish("m", vec![("w".into(), raw(dtype, v2.clone()))], Value::Null, None).unwrap();
        let d = store.delta(&r.held().params(None)).unwrap();
        assert_eq!(d.tensors[0].change, Change::Sparse, "{dtype}: {changed} changes of {n}");
        r.apply(&d).unwrap();
        assert_eq!(r.tensor("w").unwrap(), v2.as_slice(), "{dtype}: bit-identical");
        same_as_store(&r, &store);
    }
}

fn corrupt_sparse_value(d: &mut Delta) -> String {
    let t = d.tensors.iter_mut().find(|t| t.change == Change::Sparse).expect("a sparse tensor");
    let v = t.values.take().unwrap();
    let mut bytes = v.as_bytes().to_vec();
    bytes[0] ^= 0x40;
    t.values = Some(RpcTensor(Tensor::new(v.meta().clone(), Bytes::from(bytes)).unwrap()));
    t.name.clone()
}

/// Publishes version k (k = 1, 2, ...) of a 16-tensor bf16 state: tensor j's element i is
/// `i + j`, then in each version after the first, tensor k % 16 changes in 8 elements and
/// tensor 15 everywhere.
fn publish_step(store: &Arc<Store>, k: u16) {
    let mut out = Vec::new();
    for j in 0..16u16 {
        let mut v: Vec<u16> = (0..8192u16).map(|i| i.wrapping_add(j)).collect();
        for s in 2..=k {
            if j == s % 16 {
                for e in 0..8 {
                    v[usize::from(e) * 1000] = s.wrapping_mul(31).wrapping_add(e);
                }
            }
            if j == 15 {
                v.iter_mut().for_each(|x| *x = x.wrapping_add(s));
            }
        }
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        out.push((format!("t{j:02}"), raw(DType::Bf16, bytes)));
    }
    // (Waits for the digest thread, which holds the version until it is done.)
    store.publish("m", out, Value::Null, None).unwrap().manifest().wait_digest();
}

async fn serve(store: Arc<Store>, ep: Endpoint, addr: &str) -> String {
    let server = Server::builder(ferry_store::rpc::methods(store).unwrap()).build();
    let listener = ep.listen(addr).await.unwrap();
    let addr = listener.local_addr().to_string();
    tokio::spawn(async move {
        let _ = server.serve(listener).await;
    });
    addr
}

fn quic() -> Endpoint {
    let opts = QuicOptions { identity: IdentitySource::Ephemeral, ..QuicOptions::default() };
    Endpoint::builder()
        .transport(Arc::new(QuicTransport::with_options(opts)))
        .channel(Arc::new(QuicChannel::new()))
        .channel(Arc::new(InlineChannel))
        .build()
}

/// Readers new, one and several versions behind, and a corrupted delta, over `client`.
async fn readers_over(store: Arc<Store>, client: Client) {
    publish_step(&store, 1);
    let mut behind = Replica::new("m");
    let d = tokio::time::timeout(T, fetch(&client, behind.held(), None)).await.unwrap().unwrap();
    assert_eq!(d.base, None);
    behind.apply(&d).unwrap();
    same_as_store(&behind, &store);
    for k in 2..=5 {
        publish_step(&store, k);
    }
    // A new reader: every tensor whole.
    let mut new = Replica::new("m");
    let d = fetch(&client, new.held(), None).await.unwrap();
    assert!(d.tensors.iter().all(|t| t.change == Change::Dense));
    assert_eq!(d.sent_bytes, d.full_bytes);
    new.apply(&d).unwrap();
    same_as_store(&new, &store);
    // Four versions behind (the store keeps them: delta_bases 4): the four tensors that
    // changed by a few elements go sparse, the one that changed everywhere whole.
    let mut d = fetch(&client, behind.held(), None).await.unwrap();
    assert_eq!((d.base, d.version), (Some(1), 5));
    let count = |c: Change| d.tensors.iter().filter(|t| t.change == c).count();
    assert_eq!((count(Change::Same), count(Change::Sparse), count(Change::Dense)), (11, 4, 1));
    assert!(d.sent_bytes < d.full_bytes / 10, "{} of {}", d.sent_bytes, d.full_bytes);
    // Corrupted in a value: refused by the tensor's digest, the copy of version 1 intact.
    let before = behind.bundle_digest();
    let name = corrupt_sparse_value(&mut d);
    match behind.apply(&d) {
        Err(DeltaError::Digest { what, .. }) => assert_eq!(what, name),
        other => panic!("a corrupted delta: {other:?}"),
    }
    assert_eq!((behind.version(), behind.bundle_digest()), (Some(1), before.clone()), "version 1 is intact");
    // A delta with a wrong version digest is refused too.
    let mut d = fetch(&client, behind.held(), None).await.unwrap();
    d.tree = format!("blake3:{}", "0".repeat(64));
    assert!(matches!(behind.apply(&d), Err(DeltaError::Digest { what, .. }) if what == "version"));
    assert_eq!((behind.version(), behind.bundle_digest()), (Some(1), before));
    // A delta from a version the copy does not hold is refused before anything is checked.
    let from_new = fetch(&client, new.held(), None).await.unwrap();
    assert!(matches!(behind.apply(&from_new), Err(DeltaError::Base { .. })));
    // The real one applies; the copy is version 5, bit for bit.
    let d = fetch(&client, behind.held(), None).await.unwrap();
    behind.apply(&d).unwrap();
    same_as_store(&behind, &store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_behind_new_and_corrupted_over_local_sockets() {
    let store = store(4);
    let ep = common::endpoint(Arc::new(InlineChannel));
    let addr = format!("unix:ferry-delta-test-{}", ferry_conformance::unique("delta"));
    let addr = serve(store.clone(), ep.clone(), &addr).await;
    let client = Client::new(ep.connect(&addr).await.unwrap()).with_timeout(Some(T));
    readers_over(store, client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_behind_new_and_corrupted_over_quic() {
    let store = store(4);
    let addr = serve(store.clone(), quic(), "quic://127.0.0.1:0").await;
    let client =
        Client::new(tokio::time::timeout(T, quic().connect(&addr)).await.unwrap().unwrap()).with_timeout(Some(T));
    assert_eq!(client.pipe().transport(), "quic");
    readers_over(store, client).await;
}

#[test]
fn without_the_old_version_only_the_changed_tensors_go_and_they_go_whole() {
    // No base kept and a bucket per tensor: version 1's changed tensors are freed once
    // superseded; its manifest is remembered.
    let store = Store::new(StoreOptions { bucket_bytes: 16 << 10, ..StoreOptions::default() });
    publish_step(&store, 1);
    let mut r = Replica::new("m");
    r.apply(&store.delta(&params(None, None)).unwrap()).unwrap();
    publish_step(&store, 2);
    publish_step(&store, 3);
    let d = store.delta(&r.held().params(None)).unwrap();
    assert_eq!(d.base, Some(1));
    let kinds: Vec<Change> = d.tensors.iter().map(|t| t.change).collect();
    assert_eq!(kinds.iter().filter(|c| **c == Change::Same).count(), 13);
    assert_eq!(kinds.iter().filter(|c| **c == Change::Dense).count(), 3);
    r.apply(&d).unwrap();
    same_as_store(&r, &store);
    // A store whose version 1 is not the reader's (another tree digest): everything whole.
    let other = self::store(0);
    publish_step(&other, 2);
    let d = other.delta(&r.held().params(None)).unwrap();
    assert_eq!(d.base, None);
}
