//! Tensor references placed in the store's tiers, over real pipes with the shm channel: a
//! reference lands in the cpu tier or on disk (real files) by the policy, comes back intact
//! and zero-copy when fetched, is never moved under a reader mapping it (its move down waits
//! for the reader to let go), can be placed by
//! hand, is prefetched by a declared schedule; the policy and budgets change at run time
//! and errors name the option; a store without placement keeps today's behaviour.

use std::sync::Arc;
use std::time::Duration;

use ferry_core::{Endpoint, Tensor};
use ferry_rpc::codes::{INVALID_PARAMS, LIMIT_EXCEEDED, NOT_FOUND};
use ferry_rpc::remote::TensorRef;
use ferry_rpc::{CallError, Client, ErrorObject, RpcTensor, Server};
use ferry_shm::ShmChannel;
use ferry_store::rpc::placement::{PlacementInfo, RefPlacement, Scheduled};
use ferry_store::{PlacementOptions, Store, StoreOptions};
use serde_json::json;

mod common;
use common::{endpoint, until, where_is};

const T: Duration = Duration::from_secs(30);
const MB: usize = 1 << 20;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct First {
    x: RpcTensor,
}

/// A server of a store whose references are placed by `policy` in a cpu tier of `cpu_mb`
/// MB above a disk tier in `dir` (no placement when `policy` is `None`).
async fn serve(policy: Option<&str>, cpu_mb: u64, dir: &std::path::Path, tag: &str) -> (String, Endpoint) {
    let store = Store::new(StoreOptions::default());
    let placed = policy.map(|p| {
        let opts = PlacementOptions {
            policy: p.into(),
            cpu_budget_bytes: cpu_mb * MB as u64,
            disk_budget_bytes: Some(64 * MB as u64),
            disk_dir: Some(dir.to_owned()),
            ..PlacementOptions::default()
        };
        store.enable_placement(&opts).unwrap()
    });
    let mut m = ferry_store::rpc::methods(store).unwrap();
    // A call that uses a tensor: its first f32.
    m.register("first", |p: First| async move {
        Ok::<_, ErrorObject>(p.x.as_slice::<f32>().map_err(ErrorObject::internal)?.first().copied())
    })
    .unwrap();
    let mut b = Server::builder(m).ref_copy(Arc::new(ferry_store::shared_copy));
    if let Some(p) = placed {
        b = b.ref_backing(p);
    }
    let server = b.build();
    let ep = endpoint(Arc::new(ShmChannel::new()));
    let addr = format!("unix:ferry-placed-test-{}", ferry_conformance::unique(tag));
    let listener = ep.listen(&addr).await.unwrap();
    tokio::spawn(async move {
        let _ = server.serve(listener).await;
    });
    (addr, ep)
}

fn code(e: CallError) -> (i64, String) {
    match e {
        CallError::Rpc(o) => (o.code, o.message),
        other => panic!("not an RPC error: {other}"),
    }
}

/// A 1 MB f32 tensor of `v`.
fn mb(v: f32) -> RpcTensor {
    RpcTensor(Tensor::from_slice(vec![(MB / 4) as u64], &vec![v; MB / 4]).unwrap())
}

async fn info(c: &Client) -> PlacementInfo {
    c.call("store.placement.get", &json!({})).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn references_are_placed_by_the_policy_and_never_moved_under_a_reader() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, ep) = serve(Some("lru"), 3, dir.path(), "lru").await;
    let c = Client::new(ep.connect(&addr).await.unwrap()).with_timeout(Some(T));
    assert_eq!(c.pipe().channel(), "shm");
    let mut refs = Vec::new();
    for i in 0..6 {
        let r: TensorRef = c.call("ferry.ref.keep", &json!({ "tensor": mb(i as f32) })).await.unwrap();
        refs.push(r);
    }
    // LRU keeps the last three in the 3 MB cpu tier; the others go to disk, in the background.
    for (i, r) in refs.iter().enumerate() {
        let want = if i < 3 { "disk" } else { "cpu" };
        let p = until(&c, r, "placed", |p| !p.moving).await;
        assert_eq!((p.placement.as_str(), p.pinned.as_str(), p.bytes), (want, "auto", MB as u64), "ref {i}");
    }
    let i = info(&c).await;
    assert_eq!((i.tiers, i.policy.as_str(), i.cpu_budget_bytes), (true, "lru", Some(3 * MB as u64)));
    assert_eq!((i.cpu_used_bytes, i.disk_used_bytes), (3 * MB as u64, 6 * MB as u64));
    assert_eq!(i.stats.as_ref().unwrap().bytes_written, 3 * MB as u64, "the three demoted ones, written once");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3, "one file each");
    // A call using one on disk: read in for the call, then kept (LRU).
    let v: Option<f32> = c.call("first", &json!({ "x": refs[0] })).await.unwrap();
    assert_eq!(v, Some(0.0));
    assert_eq!(where_is(&c, &refs[0]).await.placement, "cpu");
    // A reader maps one (a lease on the server's memory: lent over shm, not copied).
    let held: RpcTensor = c.call("ferry.ref.fetch", &json!({ "ref": refs[1] })).await.unwrap();
    let again: RpcTensor = c.call("ferry.ref.fetch", &json!({ "ref": refs[1] })).await.unwrap();
    assert_eq!(held.as_bytes().as_ptr(), again.as_bytes().as_ptr(), "lent, not copied");
    drop(again);
    let ptr = held.as_bytes().as_ptr();
    // Other uses make the policy let it go: it stays in the cpu tier while the reader maps
    // it (its file is written meanwhile), the move deferred.
    for r in &refs[3..6] {
        let _: Option<f32> = c.call("first", &json!({ "x": r })).await.unwrap();
    }
    let p = until(&c, &refs[1], "deferred", |p| p.deferred && !p.moving).await;
    assert_eq!((p.placement.as_str(), p.in_use), ("cpu", true));
    let s = info(&c).await.stats.unwrap();
    assert!(s.deferred >= 1 && s.held_over_bytes == MB as u64, "{s:?}");
    assert_eq!(info(&c).await.cpu_used_bytes, 3 * MB as u64, "the policy's tier keeps its budget");
    assert_eq!(held.as_bytes().as_ptr(), ptr, "the reader's mapping stays");
    assert!(held.as_slice::<f32>().unwrap().iter().all(|&v| v == 1.0), "and its bytes unchanged");
    // Let go (the lease's release reaches the server): it goes down.
    drop(held);
    let p = until(&c, &refs[1], "moved down once let go", |p| !p.in_use && p.placement == "disk").await;
    assert!(!p.deferred && !p.moving);
    assert_eq!(info(&c).await.stats.unwrap().held_over_bytes, 0);
    // Every one comes back intact.
    for (i, r) in refs.iter().enumerate() {
        let t: RpcTensor = c.call("ferry.ref.fetch", &json!({ "ref": r })).await.unwrap();
        assert!(t.as_slice::<f32>().unwrap().iter().all(|&v| v == i as f32), "ref {i}");
    }
    // Freed: its file goes.
    let files = std::fs::read_dir(dir.path()).unwrap().count();
    let _: serde_json::Value = c.call("ferry.ref.free", &json!({ "ids": [refs[0].0.id] })).await.unwrap();
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), files - 1);
    assert_eq!(info(&c).await.disk_used_bytes, 5 * MB as u64);
    let (c0, _) =
        code(c.call::<_, RefPlacement>("store.ref.placement", &json!({ "id": refs[0].0.id })).await.unwrap_err());
    assert_eq!(c0, NOT_FOUND);
    // Closing the connection frees the rest, and their files.
    drop(c);
    for _ in 0..1000 {
        if std::fs::read_dir(dir.path()).unwrap().count() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "no file outlives its reference");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placed_by_hand_scheduled_and_reconfigured_with_errors_naming_options() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, ep) = serve(Some("flow"), 3, dir.path(), "flow").await;
    let c = Client::new(ep.connect(&addr).await.unwrap()).with_timeout(Some(T));
    let mut refs = Vec::new();
    for i in 0..8 {
        let r: TensorRef = c.call("ferry.ref.keep", &json!({ "tensor": mb(i as f32) })).await.unwrap();
        refs.push(r);
    }
    // A declared schedule (two passes over eight 1 MB layers, 3 MB of cpu tier): flow
    // prefetches the next layers, so every use after the first finds its layer there.
    let order: Vec<&str> = refs.iter().chain(refs.iter()).map(|r| r.0.id.as_str()).collect();
    let s: Scheduled = c.call("store.ref.schedule", &json!({ "ids": order })).await.unwrap();
    assert_eq!(s.scheduled, 16);
    let before = info(&c).await.stats.unwrap();
    for (n, id) in order.iter().enumerate() {
        let v: Option<f32> = c.call("first", &json!({ "x": {"$tensor_ref": {"id": id}} })).await.unwrap();
        let i = refs.iter().position(|r| r.0.id == *id).unwrap();
        assert_eq!(v, Some(i as f32), "use {n}");
    }
    let after = info(&c).await.stats.unwrap();
    assert_eq!(after.uses - before.uses, 16);
    assert!(
        after.hits - before.hits >= 15,
        "{} of 16 uses found their layer in the cpu tier",
        after.hits - before.hits
    );
    assert!(after.prefetches > before.prefetches);
    // Placed by hand: pinned in the cpu tier, or on disk; the move is asynchronous.
    let p: RefPlacement = c.call("store.ref.place", &json!({ "id": refs[0].0.id, "placement": "cpu" })).await.unwrap();
    assert_eq!((p.placement.as_str(), p.pinned.as_str()), ("cpu", "cpu"));
    let p: RefPlacement = c.call("store.ref.place", &json!({ "id": refs[1].0.id, "placement": "disk" })).await.unwrap();
    assert_eq!((p.placement.as_str(), p.pinned.as_str()), ("disk", "disk"));
    until(&c, &refs[0], "pinned in", |p| !p.moving).await;
    for r in &refs[2..] {
        let _: Option<f32> = c.call("first", &json!({ "x": r })).await.unwrap();
    }
    assert_eq!(where_is(&c, &refs[0]).await.placement, "cpu", "the policy never moves a pinned reference");
    let _: Option<f32> = c.call("first", &json!({ "x": refs[1] })).await.unwrap();
    assert_eq!(until(&c, &refs[1], "used from disk", |p| !p.moving).await.placement, "disk");
    // Errors name the option.
    for r in &refs[2..4] {
        let _: RefPlacement = c.call("store.ref.place", &json!({ "id": r.0.id, "placement": "cpu" })).await.unwrap();
    }
    let e = c.call::<_, RefPlacement>("store.ref.place", &json!({ "id": refs[4].0.id, "placement": "cpu" })).await;
    let (k, msg) = code(e.unwrap_err());
    assert!(k == LIMIT_EXCEEDED && msg.contains("cpu_budget_bytes"), "{k} {msg}");
    let e = c.call::<_, RefPlacement>("store.ref.place", &json!({ "id": refs[4].0.id, "placement": "gpu" })).await;
    assert_eq!(code(e.unwrap_err()).0, INVALID_PARAMS);
    let (k, msg) =
        code(c.call::<_, PlacementInfo>("store.placement.set", &json!({"policy": "nope"})).await.unwrap_err());
    assert!(k == INVALID_PARAMS && msg.contains("policy"), "{k} {msg}");
    let e = c.call::<_, PlacementInfo>("store.placement.set", &json!({"disk_budget_bytes": 1})).await;
    let (k, msg) = code(e.unwrap_err());
    assert!(k == LIMIT_EXCEEDED && msg.contains("disk_budget_bytes"), "{k} {msg}");
    let e = c.call::<_, PlacementInfo>("store.placement.set", &json!({"cpu_budget_bytes": MB})).await;
    let (k, msg) = code(e.unwrap_err());
    assert!(k == LIMIT_EXCEEDED && msg.contains("cpu_budget_bytes"), "{k} {msg}");
    // Reconfigured: back to the policy, a new policy, a larger cpu tier.
    for r in &refs[..4] {
        let _: RefPlacement = c.call("store.ref.place", &json!({ "id": r.0.id, "placement": "auto" })).await.unwrap();
    }
    let set = json!({"policy": "genoa", "cpu_budget_bytes": 4 * MB});
    let i: PlacementInfo = c.call("store.placement.set", &set).await.unwrap();
    assert_eq!((i.policy.as_str(), i.cpu_budget_bytes), ("genoa", Some(4 * MB as u64)));
    let _: Option<f32> = c.call("first", &json!({ "x": refs[5] })).await.unwrap();
    assert_eq!(until(&c, &refs[5], "genoa", |p| !p.moving).await.placement, "disk", "genoa keeps nothing");
    // Another identity's view: none of these exist (a fresh server: the same uid here, so
    // an unknown id stands for it).
    let e = c.call::<_, RefPlacement>("store.ref.placement", &json!({ "id": "r0123" })).await;
    assert_eq!(code(e.unwrap_err()).0, NOT_FOUND);
    let e = c.call::<_, Scheduled>("store.ref.schedule", &json!({ "ids": ["r0123"] })).await;
    assert_eq!(code(e.unwrap_err()).0, NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_without_placement_keeps_references_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, ep) = serve(None, 0, dir.path(), "none").await;
    let c = Client::new(ep.connect(&addr).await.unwrap()).with_timeout(Some(T));
    let r: TensorRef = c.call("ferry.ref.keep", &json!({ "tensor": mb(2.0) })).await.unwrap();
    let i = info(&c).await;
    assert_eq!((i.tiers, i.policy.as_str(), i.stats.is_none()), (false, "pinned", true));
    let p = where_is(&c, &r).await;
    assert_eq!((p.placement.as_str(), p.moving), ("cpu", false));
    let e = c.call::<_, RefPlacement>("store.ref.place", &json!({ "id": r.0.id, "placement": "disk" })).await;
    let (k, msg) = code(e.unwrap_err());
    assert!(k == INVALID_PARAMS && msg.contains("--placement"), "{k} {msg}");
    let e = c.call::<_, PlacementInfo>("store.placement.set", &json!({"policy": "lru"})).await;
    assert_eq!(code(e.unwrap_err()).0, INVALID_PARAMS);
    let v: Option<f32> = c.call("first", &json!({ "x": r })).await.unwrap();
    assert_eq!(v, Some(2.0));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing on disk");
}
