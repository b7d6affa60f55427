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

/// The tree digest of a version: BLAKE3 over `ferry-tree-v1`, then, for every tensor in
/// byte order of the names, its name, dtype name and dims (each preceded by its length or
/// count as a u64 little-endian, each dim a u64) and its 32-byte digest (BLAKE3 of its
/// bytes). Unlike the bundle digest (PROTOCOL.md §20) it is checked from the tensors' digests alone, so a reader
/// that applied a delta verifies the version by hashing only the tensors that changed,
/// and can hash them in parallel. Written `blake3:<64 hex digits>`.
pub fn tree_digest(entries: &[Entry], digests: &[[u8; 32]]) -> String {
    let mut sorted: Vec<_> = entries.iter().zip(digests).collect();
    sorted.sort_by(|a, b| a.0.0.cmp(&b.0.0));
    let mut h = blake3::Hasher::new();
    h.update(b"ferry-tree-v1");
    for (e, d) in sorted {
        h.update(&(e.0.len() as u64).to_le_bytes());
        h.update(e.0.as_bytes());
        let dtype = e.1.to_string();
        h.update(&(dtype.len() as u64).to_le_bytes());
        h.update(dtype.as_bytes());
        h.update(&(e.2.len() as u64).to_le_bytes());
        for x in &e.2 {
            h.update(&x.to_le_bytes());
        }
        h.update(d);
    }
    format!("blake3:{}", h.finalize().to_hex())
}

/// A manifest in columns, as `store.open` sends it: the names and the dtypes as UTF-8 text,
/// one per line, and the numbers as `u64`, all four as tensors a reader views without
/// parsing JSON (no JSON value per tensor on either side; PROTOCOL.md §20).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Columns {
    /// `u8`: the tensors' names (UTF-8), in the order published, joined by `"\n"` (a name
    /// has none).
    pub names: ferry_rpc::RpcTensor,
    /// `u8`: their dtypes' wire names, joined by `"\n"`.
    pub dtypes: ferry_rpc::RpcTensor,
    /// `u64 [n, 3]`: each tensor's bucket, byte offset in it, and number of dimensions.
    pub table: ferry_rpc::RpcTensor,
    /// `u64 [sum of the ndims]`: every tensor's dimensions, one after the other.
    pub dims: ferry_rpc::RpcTensor,
}

fn text_tensor(s: String) -> ferry_rpc::RpcTensor {
    let meta = TensorMeta::new(DType::U8, vec![s.len() as u64]);
    ferry_rpc::RpcTensor(ferry_core::Tensor::new(meta, s.into_bytes().into()).expect("a u8 vector of its own length"))
}

fn text<'a>(t: &'a ferry_rpc::RpcTensor, what: &str) -> Result<&'a str, String> {
    if t.dtype() != DType::U8 || t.shape().len() != 1 {
        return Err(format!("the manifest's {what} is not a u8 vector"));
    }
    let bytes = t.host_bytes().ok_or_else(|| format!("the manifest's {what} is not in host memory"))?;
    std::str::from_utf8(bytes).map_err(|e| format!("the manifest's {what} is not UTF-8: {e}"))
}

fn u64_tensor(shape: Vec<u64>, v: &[u64]) -> ferry_rpc::RpcTensor {
    ferry_rpc::RpcTensor(ferry_core::Tensor::from_slice(shape, v).expect("a u64 tensor of its own length"))
}

impl Columns {
    /// The columns of `entries` (names must not contain `"\n"`: the store refuses them).
    pub fn of(entries: &[Entry]) -> Columns {
        let mut names = String::new();
        let mut dtypes = String::new();
        let (mut table, mut dims) = (Vec::with_capacity(entries.len() * 3), Vec::new());
        for (i, e) in entries.iter().enumerate() {
            if i > 0 {
                names.push('\n');
                dtypes.push('\n');
            }
            names.push_str(&e.0);
            dtypes.push_str(e.1.name());
            table.extend([u64::from(e.3), e.4, e.2.len() as u64]);
            dims.extend_from_slice(&e.2);
        }
        Columns {
            names: text_tensor(names),
            dtypes: text_tensor(dtypes),
            table: u64_tensor(vec![entries.len() as u64, 3], &table),
            dims: u64_tensor(vec![dims.len() as u64], &dims),
        }
    }

    /// The entries back, every column checked against the others.
    pub fn entries(&self) -> Result<Vec<Entry>, String> {
        let (table, dims) = (self.table.0.to_aligned(), self.dims.0.to_aligned());
        let table = table.as_slice::<u64>().map_err(|e| format!("manifest table: {e}"))?;
        let dims = dims.as_slice::<u64>().map_err(|e| format!("manifest dims: {e}"))?;
        let n = table.len() / 3;
        if self.table.dtype() != DType::U64 || self.table.shape() != [n as u64, 3] || self.dims.shape().len() != 1 {
            return Err("the manifest table is not a u64 [n, 3] tensor".into());
        }
        let (names, dtypes) = (text(&self.names, "names")?, text(&self.dtypes, "dtypes")?);
        let names: Vec<&str> = if n == 0 { Vec::new() } else { names.split('\n').collect() };
        let dtypes: Vec<&str> = if n == 0 { Vec::new() } else { dtypes.split('\n').collect() };
        if names.len() != n || dtypes.len() != n {
            return Err(format!("the manifest has {n} rows, {} names and {} dtypes", names.len(), dtypes.len()));
        }
        let mut at = 0usize;
        let mut out = Vec::with_capacity(n);
        for (i, row) in table.chunks_exact(3).enumerate() {
            let ndim = usize::try_from(row[2]).map_err(|_| "a tensor's ndim overflows")?;
            let shape =
                at.checked_add(ndim).and_then(|end| dims.get(at..end)).ok_or("the manifest's dims are short")?;
            at += ndim;
            let dtype = dtypes[i].parse::<DType>()?;
            let bucket = u32::try_from(row[0]).map_err(|_| "a bucket index overflows")?;
            out.push(Entry(names[i].to_owned(), dtype, shape.to_vec(), bucket, row[1]));
        }
        if at != dims.len() {
            return Err("the manifest's dims are too long".into());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_round_trip_and_refuse_what_does_not_add_up() {
        let entries = vec![
            Entry("a.weight".into(), DType::Bf16, vec![4, 8], 0, 0),
            Entry("scalar".into(), DType::F32, vec![], 0, 4096),
            Entry("b".into(), DType::U8, vec![3], 2, 64),
        ];
        let c = Columns::of(&entries);
        assert_eq!(c.names.as_bytes(), b"a.weight\nscalar\nb");
        assert_eq!(c.entries().unwrap(), entries);
        assert!(Columns::of(&[]).entries().unwrap().is_empty());
        let mut short = c.clone();
        short.names = text_tensor("a.weight\nscalar".into());
        assert!(short.entries().is_err());
        let mut bad = c.clone();
        bad.dims = Columns::of(&entries[..1]).dims;
        assert!(bad.entries().is_err());
        let mut dtype = c;
        dtype.dtypes = text_tensor("bf16\nf32\nf128".into());
        assert!(dtype.entries().is_err());
    }
}
