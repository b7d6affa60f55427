//! Structural sharing on one host: a new version shares every unchanged tensor's storage
//! with the version before, publishing costs the changed tensors' bytes, the store's
//! memory counts shared storage once, and superseded storage is freed once no reader and
//! no later version holds it. Linux only (buckets are ferry-shm's shared segments there).
#![cfg(target_os = "linux")]

use std::sync::Arc;

use ferry_core::Tensor;
use ferry_store::{Store, StoreError, StoreOptions, Version};
use serde_json::Value;

/// Tensors of 4 KiB (1024 f32).
const LEN: usize = 1024;
const BYTES: u64 = 4096;

fn store() -> Arc<Store> {
    // 64 tensors per 256 KiB bucket: 256 tensors in four buckets.
    Store::new(StoreOptions { budget_bytes: 1 << 30, bucket_bytes: 256 << 10, ..StoreOptions::default() })
}

/// 256 tensors, tensor i filled with `i + fill[i]`.
fn state(fill: &dyn Fn(usize) -> f32) -> Vec<(String, Tensor)> {
    (0..256)
        .map(|i| {
            (format!("layer.{i:03}.w"), Tensor::from_slice(vec![LEN as u64], &vec![i as f32 + fill(i); LEN]).unwrap())
        })
        .collect()
}

fn first(v: &Version, i: usize) -> f32 {
    let t = &v.tensors()[i].1;
    f32::from_le_bytes(t.as_bytes()[..4].try_into().unwrap())
}

/// Waits for the digest thread, which holds a version until it is done.
fn settle(v: &Version) {
    v.manifest().wait_digest();
}

#[test]
fn a_new_version_costs_the_changed_tensors_bytes_and_memory_counts_shared_storage_once() {
    let store = store();
    let v1 = store.publish("m", state(&|_| 0.0), Value::Null, None).unwrap();
    settle(&v1);
    let full = v1.manifest().bytes;
    assert_eq!(full, 256 * BYTES, "four full buckets");
    assert_eq!(v1.manifest().new_bytes, full);
    // 1% of the tensors change (3 of 256): the whole state is published, the store compares.
    let changed = [7usize, 100, 201];
    let v2 = store.publish("m", state(&|i| if changed.contains(&i) { 0.5 } else { 0.0 }), Value::Null, None).unwrap();
    settle(&v2);
    assert_eq!(v2.manifest().new_bytes, 3 * BYTES, "only the changed tensors' bytes are new");
    assert_eq!(store.used_bytes(), full + 3 * BYTES, "v1's buckets are counted once, though both versions use them");
    assert_eq!(first(&v2, 100), 100.5);
    assert_eq!(first(&v2, 101), 101.0);
    assert_eq!(first(&v1, 100), 100.0, "the version before never changes");
    // A publisher that knows what changed: nothing else is read.
    let t = Tensor::from_slice(vec![LEN as u64], &vec![-1.0f32; LEN]).unwrap();
    let v3 = store.publish_delta("m", 2, vec![("layer.050.w".into(), t)], &[], Value::Null, None).unwrap();
    settle(&v3);
    assert_eq!(v3.manifest().new_bytes, BYTES);
    assert_eq!(store.used_bytes(), full + 4 * BYTES);
    assert_eq!(first(&v3, 50), -1.0);
    assert_eq!(first(&v3, 7), 7.5, "v2's changes are kept");
    // Against a version that is no longer the latest: refused, nothing published.
    let t = Tensor::from_slice(vec![LEN as u64], &vec![0.0f32; LEN]).unwrap();
    let e = store.publish_delta("m", 2, vec![("layer.050.w".into(), t)], &[], Value::Null, None).unwrap_err();
    assert!(matches!(e, StoreError::Stale { base: 2, latest: Some(3), .. }), "{e}");
    assert_eq!(store.open("m", None).unwrap().manifest().version, 3);
    // The same state again: nothing new at all.
    let same: Vec<_> = v3
        .tensors()
        .into_iter()
        .map(|(n, t)| (n, Tensor::from_slice(vec![LEN as u64], &bytes_f32(&t)).unwrap()))
        .collect();
    let v4 = store.publish("m", same, Value::Null, None).unwrap();
    settle(&v4);
    assert_eq!(v4.manifest().new_bytes, 0);
    assert_eq!(store.used_bytes(), full + 4 * BYTES);
    drop((v1, v2, v3));
    // Every tensor changes: the old storage is freed, no version and no reader holds it.
    let v5 = store.publish("m", state(&|_| 9.0), Value::Null, None).unwrap();
    settle(&v5);
    drop(v4);
    assert_eq!(v5.manifest().new_bytes, full);
    assert_eq!(store.used_bytes(), full, "superseded storage is freed when nothing holds it");
    assert!(store.list()["m"].held.is_empty());
}

fn bytes_f32(t: &Tensor) -> Vec<f32> {
    t.as_bytes().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn a_reader_holds_shared_storage_and_a_bucket_kept_under_half_is_copied_not_shared() {
    let store = store();
    let v1 = store.publish("m", state(&|_| 0.0), Value::Null, None).unwrap();
    settle(&v1);
    let held = v1.tensors().remove(3).1; // a reader holds one tensor of bucket 0
    drop(v1);
    // 40 of bucket 0's 64 tensors change: the 24 kept are copied with them, so bucket 0 is
    // not kept alive by the new version for a quarter of its bytes.
    let v2 = store.publish("m", state(&|i| if (10..50).contains(&i) { 1.0 } else { 0.0 }), Value::Null, None).unwrap();
    settle(&v2);
    assert_eq!(v2.manifest().new_bytes, 64 * BYTES, "bucket 0's 64 tensors: 40 changed, 24 copied");
    // Bucket 0 lives (the reader), counted once; v2 shares buckets 1..3.
    assert_eq!(store.used_bytes(), 256 * BYTES + 64 * BYTES);
    assert_eq!(bytes_f32(&held)[0], 3.0);
    drop(held);
    assert_eq!(store.used_bytes(), 256 * BYTES, "bucket 0 is freed once its reader lets go");
    assert_eq!(first(&v2, 3), 3.0);
    assert_eq!(first(&v2, 10), 11.0);
}
