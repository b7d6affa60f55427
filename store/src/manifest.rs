//! A version's manifest (where each tensor lies) and its digest.

use std::sync::{Condvar, Mutex};

use ferry_core::{DType, TensorMeta};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where one tensor of a bundle lies: `[name, dtype, shape, bucket, offset]` on the wire (an
/// array, so that a thousand-tensor manifest stays small and quick to parse). The tensor's
/// bytes are `numel(shape) * size(dtype)` bytes at `offset` of bucket `bucket`, row-major.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Entry(
    /// The tensor's name (a state_dict key).
    pub String,
    /// Element type.
    pub DType,
    /// Dimensions.
    pub Vec<u64>,
    /// Index of its bucket in the version's buckets.
    pub u32,
    /// Offset of its first byte in the bucket.
    pub u64,
);

impl Entry {
    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// Its metadata (device `cpu`, row-major).
    pub fn meta(&self) -> TensorMeta {
        TensorMeta::new(self.1, self.2.clone())
    }

    /// Its length in bytes (`None` on overflow).
    pub fn byte_len(&self) -> Option<u64> {
        self.meta().byte_span().ok()
    }
}

/// A digest computed after the version is published (hashing a large bundle takes far
/// longer than publishing it): readers that ask for it wait.
#[derive(Debug, Default)]
pub(crate) struct DigestCell {
    value: Mutex<Option<Option<String>>>,
    ready: Condvar,
}

impl DigestCell {
    /// Sets the digest (`None`: digests are off for this store).
    pub(crate) fn set(&self, d: Option<String>) {
        *self.value.lock().unwrap_or_else(|e| e.into_inner()) = Some(d);
        self.ready.notify_all();
    }

    /// The digest if computed (`Some(None)`: digests are off).
    pub(crate) fn get(&self) -> Option<Option<String>> {
        self.value.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits for the digest.
    pub(crate) fn wait(&self) -> Option<String> {
        let mut v = self.value.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(d) = v.as_ref() {
                return d.clone();
            }
            v = self.ready.wait(v).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// The digest of a bundle's content: BLAKE3 over every tensor in name order, each as its
/// name, dtype, shape and bytes (lengths prefixed), so that the same state_dict has the same
/// digest however it is laid out in buckets. Written `blake3:<64 hex digits>`.
pub(crate) fn digest<'a>(tensors: impl Iterator<Item = (&'a Entry, &'a [u8])>) -> String {
    let mut sorted: Vec<_> = tensors.collect();
    sorted.sort_by(|a, b| a.0.0.cmp(&b.0.0));
    let mut h = blake3::Hasher::new();
    h.update(b"ferry-bundle-v1");
    for (e, bytes) in sorted {
        h.update(&(e.0.len() as u64).to_le_bytes());
        h.update(e.0.as_bytes());
        let dtype = e.1.to_string();
        h.update(&(dtype.len() as u64).to_le_bytes());
        h.update(dtype.as_bytes());
        h.update(&(e.2.len() as u64).to_le_bytes());
        for d in &e.2 {
            h.update(&d.to_le_bytes());
        }
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    }
    format!("blake3:{}", h.finalize().to_hex())
}
