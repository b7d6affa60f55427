//! Bundles on a GPU without one: buckets allocated in the cuda-ipc pool of one simulated
//! process (`ferry_cuda_ipc::fake`), published with `Store::publish_device`, opened over a
//! real pipe by another simulated process of the same simulated machine: each bucket
//! arrives as an IPC mapping (no copy), the reader slices its tensors out of it, the digest
//! is computed from the device bytes, and a superseded version's device memory is freed
//! once the reader lets go.

use std::sync::Arc;
use std::time::Duration;

use ferry_core::{DType, Device, TensorMeta};
use ferry_cuda_ipc::fake::{FakeDriver, FakeGpu};
use ferry_cuda_ipc::{CudaIpcChannel, CudaIpcOptions};
use ferry_rpc::{Client, Server};
use ferry_store::{Entry, Store, StoreOptions, plan_layout};
use serde_json::json;

mod common;
use common::endpoint;

const T: Duration = Duration::from_secs(20);

fn chan(drv: Arc<FakeDriver>) -> CudaIpcChannel {
    CudaIpcChannel::with_driver(drv, CudaIpcOptions::default())
}

/// Publishes `n` f32 tensors of `len` elements on cuda:0, tensor i filled with `i + fill`,
/// in buckets of 64 KiB.
async fn publish(store: &Arc<Store>, sc: &CudaIpcChannel, n: usize, len: usize, fill: f32) -> ferry_store::Version {
    let lens = vec![(len * 4) as u64; n];
    let (places, bucket_lens) = plan_layout(&lens, 64 << 10);
    let mut host: Vec<Vec<u8>> = bucket_lens.iter().map(|&l| vec![0u8; l as usize]).collect();
    let mut entries = Vec::new();
    for (i, &(b, off)) in places.iter().enumerate() {
        let v = (i as f32 + fill).to_le_bytes();
        for k in 0..len {
            host[b as usize][off as usize + 4 * k..][..4].copy_from_slice(&v);
        }
        entries.push(Entry(format!("layer.{i}.weight"), DType::F32, vec![len as u64], b, off));
    }
    let mut buckets = Vec::new();
    for bytes in &host {
        let meta = TensorMeta::new(DType::U8, vec![bytes.len() as u64]).with_device(Device::Cuda(0));
        let t = sc.alloc_device(meta).await.unwrap();
        sc.copy_from_host(&t, bytes).unwrap();
        buckets.push(t);
    }
    let reader = sc.clone();
    let read: ferry_store::HostRead = Arc::new(move |t| reader.copy_to_host(t).map_err(|e| e.to_string()));
    store.publish_device("gpu", buckets, entries, json!({"fill": fill}), Some(read), None).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_bundle_is_opened_through_cuda_ipc_without_a_copy() {
    let gpu = FakeGpu::new(1);
    let (sd, cd) = (gpu.process(1), gpu.process(2));
    let (sc, cc) = (chan(sd.clone()), chan(cd.clone()));
    let store = Store::new(StoreOptions { budget_bytes: 1 << 30, bucket_bytes: 64 << 10, ..StoreOptions::default() });
    let v1 = publish(&store, &sc, 20, 4096, 0.0).await; // 16 KiB each: 5 buckets of 64 KiB
    assert_eq!(v1.bucket_tensors().len(), 5);
    assert!(v1.bucket_tensors().iter().all(|b| b.device() == Device::Cuda(0)));
    let d1 = v1.manifest().wait_digest().expect("a digest from the device bytes");
    // The same tensors on the host give the same digest (it does not depend on placement).
    let host: Vec<_> = v1.tensors().into_iter().map(|(n, t)| (n, host_copy(&sc, &t))).collect();
    let on_host = store.publish("host", host, json!(null), None).unwrap();
    assert_eq!(on_host.manifest().wait_digest().unwrap(), d1);

    let addr = format!("unix:ferry-store-gpu-{}", ferry_conformance::unique("gpu"));
    let listener = endpoint(Arc::new(sc.clone())).listen(&addr).await.unwrap();
    let server = Server::builder(ferry_store::rpc::methods(store.clone()).unwrap()).build();
    tokio::spawn(async move {
        let _ = server.serve(listener).await;
    });
    let client = Client::new(endpoint(Arc::new(cc.clone())).connect(&addr).await.unwrap()).with_timeout(Some(T));
    let imports_before = cd.open_imports();
    let copies_before = sd.calls("cuMemcpyDtoDAsync");
    let opened = ferry_store::rpc::open(&client, "gpu", None, Some(&d1)).await.unwrap();
    assert_eq!(opened.buckets.len(), 5);
    assert!(opened.buckets.iter().all(|b| b.device() == Device::Cuda(0)), "buckets stay on the device");
    assert_eq!(sd.calls("cuMemcpyDtoDAsync"), copies_before, "no device copy: pool buckets are lent");
    let imported = cd.open_imports() - imports_before;
    assert!((1..=5).contains(&imported), "at most one IPC handle per bucket, got {imported}");
    let tensors = opened.tensors().unwrap();
    assert_eq!(tensors.len(), 20);
    for (i, (name, t)) in tensors.iter().enumerate() {
        assert_eq!(name, &format!("layer.{i}.weight"));
        assert_eq!((t.device(), t.shape()), (Device::Cuda(0), &[4096u64][..]));
        let bytes = cc.copy_to_host(t).unwrap();
        let want = (i as f32).to_le_bytes();
        assert!(bytes.chunks(4).all(|c| c == want), "tensor {i}");
    }

    // A new version while the reader holds v1: v1 stays (it can be opened again by number)
    // and is gone once the reader lets go (its lease released over the pipe).
    drop(v1);
    let _v2 = publish(&store, &sc, 20, 4096, 100.0).await;
    let again = ferry_store::rpc::open(&client, "gpu", Some(1), None).await.unwrap();
    assert_eq!(again.version, 1, "a held superseded version can be opened again");
    assert!(store.open("gpu", Some(1)).is_ok());
    drop((again, tensors, opened));
    // Its five buckets' leases may come back in more than one release message:
    // v1 can no longer be opened once the first is gone, and is no longer held once the
    // last is.
    let mut freed = false;
    for _ in 0..400 {
        if store.open("gpu", Some(1)).is_err() && store.list()["gpu"].held.is_empty() {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(freed, "v1 outlived its last reader: {:?}", store.list()["gpu"].held);
    let bad = store.publish_device(
        "gpu",
        vec![],
        vec![Entry("x".into(), DType::F32, vec![4], 0, 0)],
        json!(null),
        None,
        None,
    );
    assert!(bad.is_err(), "an entry outside the buckets is refused");
}

fn host_copy(c: &CudaIpcChannel, t: &ferry_core::Tensor) -> ferry_core::Tensor {
    let bytes = c.copy_to_host(t).unwrap();
    ferry_core::Tensor::new(TensorMeta::new(t.dtype(), t.shape().to_vec()), bytes.into()).unwrap()
}
