//! References kept from a GPU, placed on the store's device tier over real pipes, on a GPU
//! simulated in memory (`ferry_cuda_ipc::fake`, two simulated processes): a server keeps
//! tensors it made on its GPU as references, the tier keeps what its budget holds and copies the
//! rest down to the cpu and disk tiers; a call using one gets it on the device, intact; a
//! fetch lends it over cuda-ipc; a client's own device tensor kept with `ferry.ref.keep` is
//! copied on the device and placed the same way; placement by hand and the device budget go through
//! `store.ref.place` and `store.placement.set`, and `store.placement.get` reports the tier.

use std::sync::Arc;
use std::time::Duration;

use ferry_core::{DType, Device, TensorMeta};
use ferry_cuda_ipc::fake::FakeGpu;
use ferry_cuda_ipc::{CudaIpcChannel, CudaIpcOptions};
use ferry_rpc::codes::{INVALID_PARAMS, LIMIT_EXCEEDED};
use ferry_rpc::remote::TensorRef;
use ferry_rpc::{CallContext, CallError, Client, ErrorObject, RpcTensor, Server};
use ferry_store::placement::CudaMemory;
use ferry_store::rpc::placement::{PlacementInfo, RefPlacement};
use ferry_store::{DeviceTierOptions, PlacementOptions, Store, StoreOptions};
use serde_json::json;

mod common;
use common::{endpoint, until};

const T: Duration = Duration::from_secs(30);
const LEN: usize = 256 << 10;

fn chan(gpu: &Arc<FakeGpu>, pid: u32) -> CudaIpcChannel {
    let opts = CudaIpcOptions { slab_bytes: 1 << 20, ..CudaIpcOptions::default() };
    CudaIpcChannel::with_driver(gpu.process(pid), opts)
}

#[derive(serde::Serialize)]
struct Keep {
    tensor: RpcTensor,
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Make {
    fill: u8,
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Check {
    x: RpcTensor,
    fill: u8,
}

/// Device tensor `fill` of `LEN` bytes in `c`'s pool.
async fn on_device(c: &CudaIpcChannel, fill: u8) -> RpcTensor {
    let meta = TensorMeta::new(DType::U8, vec![LEN as u64]).with_device(Device::Cuda(0));
    let t = c.alloc_device(meta).await.unwrap();
    c.copy_from_host(&t, &vec![fill; LEN]).unwrap();
    RpcTensor(t)
}

fn code(e: CallError) -> (i64, String) {
    match e {
        CallError::Rpc(o) => (o.code, o.message),
        other => panic!("not an RPC error: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_references_live_on_the_device_tier_and_each_use_gets_them_there() {
    let gpu = FakeGpu::new(1);
    let (sc, cc) = (chan(&gpu, 1), chan(&gpu, 2));
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(StoreOptions::default());
    let opts = PlacementOptions {
        policy: "lru".into(),
        cpu_budget_bytes: LEN as u64,
        disk_budget_bytes: Some(64 << 20),
        disk_dir: Some(dir.path().to_owned()),
        device: Some(DeviceTierOptions {
            memory: Arc::new(CudaMemory::new(sc.clone(), 0).unwrap()),
            budget_bytes: 2 * LEN as u64,
        }),
        ..PlacementOptions::default()
    };
    let placed = store.enable_placement(&opts).unwrap();
    let mut m = ferry_store::rpc::methods(store).unwrap();
    let reader = sc.clone();
    // A call that uses a device tensor: whether it is on cuda:0 holding `fill`.
    m.register("check", move |p: Check| {
        let reader = reader.clone();
        async move {
            let on = p.x.0.device() == Device::Cuda(0);
            let bytes = reader.copy_to_host(&p.x.0).map_err(ErrorObject::internal)?;
            Ok::<_, ErrorObject>(on && bytes.iter().all(|&b| b == p.fill))
        }
    })
    .unwrap();
    // A call that makes a device tensor on the server's GPU and keeps it as a reference
    // (weights loaded onto the GPU, shared by reference).
    let maker = sc.clone();
    m.register_ctx("make", move |p: Make, ctx: CallContext| {
        let maker = maker.clone();
        async move {
            let t = on_device(&maker, p.fill).await;
            ctx.keep(t.0, None)
        }
    })
    .unwrap();
    let server =
        Server::builder(m).ref_backing(placed).ref_copy(ferry_store::device_or_shared_copy(sc.clone())).build();
    let addr = format!("unix:ferry-placed-device-{}", ferry_conformance::unique("dev"));
    let listener = endpoint(Arc::new(sc.clone())).listen(&addr).await.unwrap();
    tokio::spawn(async move {
        let _ = server.serve(listener).await;
    });
    let c = Client::new(endpoint(Arc::new(cc.clone())).connect(&addr).await.unwrap()).with_timeout(Some(T));

    let mut refs = Vec::new();
    for i in 0..4u8 {
        let r: TensorRef = c.call("make", &json!({ "fill": i })).await.unwrap();
        refs.push(r);
    }
    // LRU keeps the last two on the device (its budget); the first two are copied down:
    // one in the cpu tier (its budget), one on disk (once both moves ran).
    for _ in 0..1000 {
        let i: PlacementInfo = c.call("store.placement.get", &json!({})).await.unwrap();
        if i.stats.unwrap().bytes_written == LEN as u64 && i.device.unwrap().stats.bytes_down == 2 * LEN as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut below = Vec::new();
    for (i, r) in refs.iter().enumerate() {
        let p = until(&c, r, "placed", |p| !p.moving).await;
        assert_eq!(p.bytes, LEN as u64);
        if i >= 2 {
            assert_eq!(p.placement, "cuda:0", "ref {i}");
        }
        below.push(p.placement);
    }
    below.sort();
    assert_eq!(below, ["cpu", "cuda:0", "cuda:0", "disk"]);
    let info: PlacementInfo = c.call("store.placement.get", &json!({})).await.unwrap();
    let d = info.device.expect("the device tier is reported");
    assert_eq!((d.device.as_str(), d.policy.as_str(), d.budget_bytes), ("cuda:0", "lru", 2 * LEN as u64));
    assert_eq!(d.used_bytes, 2 * LEN as u64);
    assert_eq!(d.stats.bytes_down, 2 * LEN as u64);

    // Every use gets its tensor on the device, intact, wherever it was kept.
    for round in 0..2 {
        for (i, r) in refs.iter().enumerate() {
            let ok: bool = c.call("check", &json!({ "x": r, "fill": i })).await.unwrap();
            assert!(ok, "round {round}: ref {i} was not on cuda:0 with its bytes");
        }
    }
    // A fetch lends it over cuda-ipc: a device tensor on the client's side.
    let fetched: RpcTensor = c.call("ferry.ref.fetch", &json!({ "ref": refs[0] })).await.unwrap();
    assert_eq!(fetched.0.device(), Device::Cuda(0));
    assert_eq!(cc.copy_to_host(&fetched.0).unwrap(), vec![0u8; LEN]);
    drop(fetched);

    // By hand: pinned on the device, then on disk; a device budget below the pinned bytes
    // names its option; a host placement for a host-only name is refused clearly.
    let p: RefPlacement =
        c.call("store.ref.place", &json!({ "id": refs[0].0.id, "placement": "cuda:0" })).await.unwrap();
    assert_eq!(p.pinned, "cuda:0");
    until(&c, &refs[0], "pinned on the device", |p| p.placement == "cuda:0" && !p.moving).await;
    let e = c.call::<_, PlacementInfo>("store.placement.set", &json!({ "device_budget_bytes": 0 })).await.unwrap_err();
    let (code_, msg) = code(e);
    assert_eq!(code_, LIMIT_EXCEEDED);
    assert!(msg.contains("device_budget_bytes"), "{msg}");
    let p: RefPlacement = c.call("store.ref.place", &json!({ "id": refs[0].0.id, "placement": "disk" })).await.unwrap();
    assert_eq!(p.pinned, "disk");
    until(&c, &refs[0], "pinned on disk", |p| p.placement == "disk" && !p.moving).await;
    let ok: bool = c.call("check", &json!({ "x": refs[0], "fill": 0 })).await.unwrap();
    assert!(ok, "a use of a reference pinned on disk uploads it");
    let e = c
        .call::<_, RefPlacement>("store.ref.place", &json!({ "id": refs[1].0.id, "placement": "cuda:1" }))
        .await
        .unwrap_err();
    let (code_, msg) = code(e);
    assert_eq!(code_, INVALID_PARAMS);
    assert!(msg.contains("cpu, disk, auto or cuda:0"), "{msg}");
    // The budget shrinks to nothing: everything leaves the device (in the background).
    let _: RefPlacement = c.call("store.ref.place", &json!({ "id": refs[0].0.id, "placement": "auto" })).await.unwrap();
    let info: PlacementInfo = c.call("store.placement.set", &json!({ "device_budget_bytes": 0 })).await.unwrap();
    assert_eq!(info.device.unwrap().budget_bytes, 0);
    for (i, r) in refs.iter().enumerate() {
        let p = until(&c, r, "off the device", |p| p.placement != "cuda:0" && !p.moving).await;
        assert!(p.placement == "cpu" || p.placement == "disk", "ref {i}: {p:?}");
    }
    // A client keeps a tensor of its own GPU: copied on the device into the server's pool
    // (the client's memory is its own again at once), then placed like the others: with
    // the device budget now 0, below the device; a use uploads it.
    let mine = on_device(&cc, 42).await;
    let kept: TensorRef = c.call("ferry.ref.keep", &Keep { tensor: mine.clone() }).await.unwrap();
    drop(mine);
    let p = until(&c, &kept, "kept", |p| !p.moving).await;
    assert!(p.placement == "cpu" || p.placement == "disk", "{p:?}");
    let ok: bool = c.call("check", &json!({ "x": kept, "fill": 42 })).await.unwrap();
    assert!(ok, "a kept client tensor comes back intact on the device");
    refs.push(kept);
    // Freed references leave nothing below.
    for r in &refs {
        let _: serde_json::Value = c.call("ferry.ref.free", &json!({ "ids": [r.0.id] })).await.unwrap();
    }
    let info: PlacementInfo = c.call("store.placement.get", &json!({})).await.unwrap();
    assert_eq!((info.cpu_used_bytes, info.disk_used_bytes), (0, 0));
}
