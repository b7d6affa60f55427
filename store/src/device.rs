//! Bundles on a GPU: buckets that are device allocations (one `u8` vector tensor on
//! `cuda:N` each), which a producer allocates in the cuda-ipc channel's exportable pool
//! (`ferry_cuda_ipc::CudaIpcChannel::alloc_device`), fills, and publishes with
//! [`Store::publish_device`]. Over a cuda-ipc pipe each bucket then travels as one IPC
//! handle, mapped by the reader in place (devices matched by UUID); the reader slices its
//! tensors out of the buckets by the manifest ([`device_slice`]).

use std::sync::Arc;

use ferry_core::{DType, Device, DeviceBuffer, Storage, Tensor, TensorMeta};
use serde_json::Value;

use crate::bucket::Bucket;
use crate::store::{HostRead, Reservation};
use crate::{Entry, Owner, Store, StoreError, Version};

/// A range of another device buffer (a tensor inside a bucket). Holding it holds the
/// bucket.
pub struct DeviceView {
    whole: Arc<dyn DeviceBuffer>,
    offset: u64,
    len: usize,
}

impl DeviceBuffer for DeviceView {
    fn device(&self) -> Device {
        self.whole.device()
    }
    fn device_ptr(&self) -> u64 {
        self.whole.device_ptr() + self.offset
    }
    fn len(&self) -> usize {
        self.len
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The tensor `meta` at byte `offset` of device bucket `bucket` (no copy); `None` when it
/// does not fit or `bucket` is not in device memory.
pub fn device_slice(bucket: &Tensor, offset: u64, meta: TensorMeta) -> Option<Tensor> {
    let Storage::Device(whole) = bucket.storage() else { return None };
    let len = usize::try_from(meta.byte_span().ok()?).ok()?;
    let end = offset.checked_add(len as u64)?;
    if end > whole.len() as u64 {
        return None;
    }
    let meta = meta.with_device(whole.device());
    Tensor::from_device(meta, Arc::new(DeviceView { whole: whole.clone(), offset, len })).ok()
}

impl Store {
    /// Publishes a version whose buckets are device tensors the producer allocated (each a
    /// `u8` vector on one `cuda:N`; in the cuda-ipc pool for zero-copy reads) and filled,
    /// laid out as `entries` say ([`Entry`]: bucket index and byte offset; a producer can
    /// use [`plan_layout`]). `read` copies a bucket to the host for the digest (without it,
    /// or with digests off, the version has none). Buckets count toward `budget_bytes`.
    pub fn publish_device(
        self: &Arc<Self>,
        name: &str,
        buckets: Vec<Tensor>,
        entries: Vec<Entry>,
        metadata: Value,
        read: Option<HostRead>,
        by: Owner,
    ) -> Result<Version, StoreError> {
        let invalid = |m: String| Err(StoreError::Invalid(m));
        let mut device = None;
        for (i, b) in buckets.iter().enumerate() {
            if b.dtype() != DType::U8 || b.shape().len() != 1 || !matches!(b.storage(), Storage::Device(_)) {
                return invalid(format!("bucket {i} is not a u8 vector in device memory"));
            }
            if device.is_some_and(|d| d != b.device()) {
                return invalid(format!(
                    "bucket {i} is on {}, the others on {}",
                    b.device(),
                    device.unwrap_or_default()
                ));
            }
            device = Some(b.device());
        }
        let mut names = std::collections::HashSet::new();
        for e in &entries {
            let fits = buckets.get(e.3 as usize).and_then(|b| device_slice(b, e.4, e.meta())).is_some();
            if !fits {
                return invalid(format!("tensor {:?} does not lie inside bucket {}", e.0, e.3));
            }
            if !names.insert(e.0.as_str()) {
                return invalid(format!("tensor {:?} is named twice", e.0));
            }
        }
        let total = buckets.iter().map(|b| b.nbytes() as u64).sum();
        let reservation: Reservation = self.reservation(name, &by, total)?;
        let v =
            self.commit(name, &by, entries, buckets.into_iter().map(Bucket::Device).collect(), metadata, read, None);
        drop(reservation);
        v
    }
}

/// Where tensors of `lens` bytes go in buckets of at most `bucket_bytes` (larger tensors get
/// a bucket of their own; tensors of 4 KiB and more start on a 4096-byte boundary): each
/// tensor's (bucket, offset), and each bucket's length. The layout [`Store::builder`] uses.
pub fn plan_layout(lens: &[u64], bucket_bytes: u64) -> (Vec<(u32, u64)>, Vec<u64>) {
    crate::store::plan(lens, bucket_bytes)
}
