//! Checkpoints from files: `.safetensors` files (or any container a [`TensorCodec`]
//! decodes, such as ferry's [`ferry_core::RawCodec`]) read into buckets and published.
//!
//! Each file is read once into a bucket of its own size (a sealed memfd on Linux) and
//! decoded by the codec ([`SafetensorsCodec`] for [`publish_safetensors`]), which slices
//! its tensors out of the bucket's bytes: they stay where they are in the file image, so
//! the version references them in place (no second copy), and the file's pages are dropped
//! from the page cache afterwards, leaving one copy in memory.
//!
//! Why not map the file itself and pass its descriptor to readers: a regular file cannot be
//! sealed, so anyone who truncates or rewrites it (a new checkpoint copied over the old one)
//! would kill every reader with SIGBUS or change the weights under it. A sealed memfd cannot
//! change size, and the version's digest covers what readers map.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferry_core::{SafetensorsCodec, Tensor, TensorCodec};
use serde_json::{Value, json};

use crate::bucket::BucketMut;
use crate::{Owner, Store, StoreError, Version};

/// Bytes read between two progress reports.
const CHUNK: usize = 64 << 20;

/// Reads the `.safetensors` `files` and publishes their tensors together as the next version
/// of `name`, with `metadata` (an object; the file names are added under `"files"`).
/// `progress(done, total)` is called as bytes are read. Two files holding the same tensor
/// name are refused. [`publish_files`] with [`SafetensorsCodec`].
pub fn publish_safetensors(
    store: &Arc<Store>,
    name: &str,
    files: &[PathBuf],
    metadata: Value,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Version, StoreError> {
    publish_files(store, name, files, &SafetensorsCodec, metadata, progress)
}

/// Reads `files`, each a container `codec` decodes, and publishes their tensors together
/// as the next version of `name`, with `metadata` (an object; the file names are added
/// under `"files"` and the codec's name under `"format"`). `progress(done, total)` is
/// called as bytes are read. Two files holding the same tensor name are refused. The codec
/// should slice its tensors out of the bytes it is given (as [`SafetensorsCodec`] and
/// [`ferry_core::RawCodec`] do where the data is aligned): those are the bucket's, and
/// slicing them is what keeps one copy in memory.
pub fn publish_files(
    store: &Arc<Store>,
    name: &str,
    files: &[PathBuf],
    codec: &dyn TensorCodec,
    metadata: Value,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Version, StoreError> {
    if files.is_empty() {
        return Err(StoreError::Invalid("no checkpoint files given".into()));
    }
    let mut sizes = Vec::with_capacity(files.len());
    for f in files {
        let len = std::fs::metadata(f).map_err(|e| io_at(f, e))?.len();
        if len == 0 {
            return Err(StoreError::Invalid(format!("{}: empty file", f.display())));
        }
        sizes.push(len);
    }
    let total: u64 = sizes.iter().sum();
    let owner: Owner = None;
    let reservation = store.reservation(name, &owner, total)?;
    let mut done = 0u64;
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    let mut seen = std::collections::HashMap::new();
    for (f, &len) in files.iter().zip(&sizes) {
        let bucket = read_into_bucket(f, len, &mut |n| {
            done += n;
            progress(done, total);
        })?;
        let decoded = codec
            .decode(bucket.bytes(0, bucket.len()).unwrap_or_default())
            .map_err(|e| StoreError::Invalid(format!("{}: {e}", f.display())))?;
        for (n, t) in decoded {
            if let Some(other) = seen.insert(n.clone(), f.clone()) {
                return Err(StoreError::Invalid(format!(
                    "tensor {n:?} is in both {} and {}",
                    other.display(),
                    f.display()
                )));
            }
            tensors.push((n, t));
        }
    }
    let mut meta = match metadata {
        Value::Object(m) => m,
        Value::Null => serde_json::Map::new(),
        other => return Err(StoreError::Invalid(format!("metadata must be an object, got {other}"))),
    };
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_name().map_or_else(|| f.display().to_string(), |n| n.to_string_lossy().into_owned()))
        .collect();
    meta.insert("files".into(), json!(names));
    meta.insert("format".into(), json!(codec.name()));
    // The buckets are held by the tensors until published; the reservation ends after.
    let v = store.publish(name, tensors, Value::Object(meta), owner);
    drop(reservation);
    v
}

fn io_at(f: &Path, e: std::io::Error) -> StoreError {
    StoreError::Io(std::io::Error::new(e.kind(), format!("{}: {e}", f.display())))
}

/// Reads all `len` bytes of `f` into a new bucket, then drops the file's pages from the
/// page cache (the bucket is now the copy in memory).
fn read_into_bucket(f: &Path, len: u64, progress: &mut dyn FnMut(u64)) -> Result<crate::bucket::Bucket, StoreError> {
    let ulen = usize::try_from(len).map_err(|_| StoreError::Invalid(format!("{}: too large", f.display())))?;
    let mut file = std::fs::File::open(f).map_err(|e| io_at(f, e))?;
    let mut bucket = BucketMut::create(ulen).map_err(|e| io_at(f, e))?;
    let dst = bucket.as_mut_slice();
    let mut at = 0;
    while at < ulen {
        let end = (at + CHUNK).min(ulen);
        file.read_exact(&mut dst[at..end]).map_err(|e| io_at(f, e))?;
        progress((end - at) as u64);
        at = end;
    }
    let mut extra = [0u8; 1];
    if file.read(&mut extra).map_err(|e| io_at(f, e))? != 0 {
        return Err(StoreError::Invalid(format!("{}: the file grew while it was read", f.display())));
    }
    #[cfg(target_os = "linux")]
    {
        // Advice only: failing to drop the cached pages costs memory, not correctness.
        let _ = rustix::fs::fadvise(&file, 0, std::num::NonZeroU64::new(len), rustix::fs::Advice::DontNeed);
    }
    Ok(bucket.freeze().into())
}
