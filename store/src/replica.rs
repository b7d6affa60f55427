//! The reader's side of `store.delta`: a local copy of a version ([`Replica`], or any
//! [`DeltaTarget`], such as a model's parameters) that a [`Delta`] turns into the next
//! version, all or nothing.
//!
//! [`apply`] first checks everything without writing: the delta is from the version the
//! target holds (number and tree digest), every index is in range and ascending, and each
//! tensor that changes hashes, once changed, to the digest the store sent (sparse ones are
//! hashed by streaming the held bytes with the changes laid over them, nothing allocated),
//! then the tree digest of the whole version. Only then does it write, in place. A delta
//! that fails any check changes nothing.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use ferry_core::{AlignedBuf, DType, TensorMeta};
use serde_json::Value;

use crate::Entry;
use crate::delta::{Change, Delta, DeltaParams, TensorDelta, hex, unhex};
use crate::manifest::tree_digest;

/// Why a delta was not applied (nothing was written).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum DeltaError {
    /// The delta is not from the version the target holds.
    #[error("the delta is from {got} but the copy holds {held}")]
    Base {
        /// What the delta is from.
        got: String,
        /// What the target holds.
        held: String,
    },
    /// The delta does not add up (bad indices, a missing tensor, a dtype that differs).
    #[error("invalid delta: {0}")]
    Invalid(String),
    /// Applied, a tensor (or the whole version) would not be the publisher's.
    #[error("digest mismatch for {what}: expected {expected}, got {actual}")]
    Digest {
        /// The tensor's name, or `version`.
        what: String,
        /// The digest the store sent.
        expected: String,
        /// What applying gave.
        actual: String,
    },
    /// The target cannot take this change in place (a new tensor or a new shape, in a
    /// model's fixed parameters).
    #[error("cannot apply in place: {0}")]
    NotInPlace(String),
}

/// A held tensor: name, dtype, shape and the BLAKE3 digest of its bytes.
pub type HeldTensor = (String, DType, Vec<u64>, [u8; 32]);

/// What a copy of a version holds: its identity and each tensor's dtype, shape and digest.
#[derive(Debug, Clone, Default)]
pub struct Held {
    /// The bundle's name.
    pub name: String,
    /// The version held (`None`: none yet).
    pub version: Option<u64>,
    /// Its tree digest.
    pub tree: Option<String>,
    /// Its bundle digest, when the store sent one.
    pub digest: Option<String>,
    /// Its metadata.
    pub metadata: Value,
    /// Each tensor: name, dtype, shape and BLAKE3 digest of its bytes, in the order published.
    pub tensors: Vec<HeldTensor>,
}

impl Held {
    /// Nothing held yet of bundle `name`.
    pub fn empty(name: &str) -> Held {
        Held { name: name.to_owned(), ..Held::default() }
    }

    /// The params of `store.delta` asking for version `to` (default the latest) from this.
    pub fn params(&self, to: Option<u64>) -> DeltaParams {
        DeltaParams {
            name: self.name.clone(),
            from: self.version,
            from_tree: self.tree.clone(),
            to,
            sparse: true,
            wait_ms: None,
        }
    }
}

/// A local copy of a version that a delta is applied to in place.
pub trait DeltaTarget {
    /// What it holds.
    fn held(&self) -> &Held;
    /// The bytes of tensor `name` now.
    fn bytes(&self, name: &str) -> Option<&[u8]>;
    /// The bytes of tensor `name`, to write.
    fn bytes_mut(&mut self, name: &str) -> Option<&mut [u8]>;
    /// Whether it can take new tensors and new shapes ([`DeltaTarget::replace`]); a
    /// model's parameters cannot (default false).
    fn can_replace(&self) -> bool {
        false
    }
    /// Puts `data` as tensor `name` (a new tensor, or one whose dtype or shape changed).
    fn replace(&mut self, name: &str, dtype: DType, shape: &[u64], data: AlignedBuf) {
        let _ = (name, dtype, shape, data);
    }
    /// Drops tensor `name` (not in the new version).
    fn remove(&mut self, name: &str) {
        let _ = name;
    }
    /// Records the version now held (called last).
    fn set_held(&mut self, held: Held);
}

/// What [`apply`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// The version now held.
    pub version: u64,
    /// Tensors unchanged, patched sparsely, and written whole.
    pub same: usize,
    /// Tensors patched sparsely.
    pub sparse: usize,
    /// Tensors written whole.
    pub dense: usize,
    /// Elements written by sparse patches.
    pub elements: u64,
}

/// One checked change, ready to write.
enum Step<'a> {
    Same,
    Sparse { index: Vec<u64>, values: &'a [u8], size: usize },
    Dense { data: &'a [u8], in_place: bool },
}

/// Applies `delta` to `target`, all or nothing: every check first (see the module docs),
/// then the writes. On an error nothing was written.
pub fn apply(delta: &Delta, target: &mut dyn DeltaTarget) -> Result<Applied, DeltaError> {
    let held = target.held().clone();
    let desc = |v: Option<u64>, t: &Option<String>| match v {
        Some(v) => format!("version {v} ({})", t.as_deref().unwrap_or("no tree digest")),
        None => "nothing".to_string(),
    };
    if delta.name != held.name {
        return Err(DeltaError::Invalid(format!("delta of {:?} for a copy of {:?}", delta.name, held.name)));
    }
    if delta.base.is_some() && (delta.base != held.version || delta.base_tree != held.tree) {
        return Err(DeltaError::Base { got: desc(delta.base, &delta.base_tree), held: desc(held.version, &held.tree) });
    }
    let by_name: HashMap<&str, &HeldTensor> = held.tensors.iter().map(|t| (t.0.as_str(), t)).collect();
    let mut seen = HashSet::new();
    let mut steps = Vec::with_capacity(delta.tensors.len());
    let mut digests = Vec::with_capacity(delta.tensors.len());
    for t in &delta.tensors {
        if !seen.insert(t.name.as_str()) {
            return Err(DeltaError::Invalid(format!("tensor {:?} is listed twice", t.name)));
        }
        let want = unhex(&t.digest).ok_or_else(|| DeltaError::Invalid(format!("{:?}: bad digest", t.name)))?;
        digests.push(want);
        let len = TensorMeta::new(t.dtype, t.shape.clone())
            .byte_span()
            .ok()
            .and_then(|l| usize::try_from(l).ok())
            .ok_or_else(|| DeltaError::Invalid(format!("{:?}: bad shape", t.name)))?;
        let old = by_name.get(t.name.as_str()).filter(|o| delta.base.is_some() && o.1 == t.dtype && o.2 == t.shape);
        steps.push(check(t, old.map(|o| o.3), len, target, &want)?);
    }
    if steps.iter().any(|s| matches!(s, Step::Dense { in_place: false, .. })) && !target.can_replace() {
        let n = delta.tensors.iter().zip(&steps).find(|(_, s)| matches!(s, Step::Dense { in_place: false, .. }));
        return Err(DeltaError::NotInPlace(format!(
            "tensor {:?} is new or changes shape",
            n.map_or("", |x| &x.0.name)
        )));
    }
    // The changed tensors, hashed (in parallel) as they will be once written.
    {
        let now: Vec<Option<&[u8]>> = delta
            .tensors
            .iter()
            .zip(&steps)
            .map(|(t, s)| if matches!(s, Step::Sparse { .. }) { target.bytes(&t.name) } else { None })
            .collect();
        hash_all(delta, &steps, &now, &digests)?;
    }
    let entries: Vec<Entry> =
        delta.tensors.iter().map(|t| Entry(t.name.clone(), t.dtype, t.shape.clone(), 0, 0)).collect();
    let tree = tree_digest(&entries, &digests);
    if tree != delta.tree {
        return Err(DeltaError::Digest { what: "version".into(), expected: delta.tree.clone(), actual: tree });
    }
    // Everything checked: write.
    let mut out = Applied { version: delta.version, ..Applied::default() };
    for (t, step) in delta.tensors.iter().zip(steps) {
        match step {
            Step::Same => out.same += 1,
            Step::Sparse { index, values, size } => {
                let dst = target.bytes_mut(&t.name).expect("checked: the target holds it");
                for (k, &i) in index.iter().enumerate() {
                    let at = i as usize * size;
                    dst[at..at + size].copy_from_slice(&values[k * size..(k + 1) * size]);
                }
                out.sparse += 1;
                out.elements += index.len() as u64;
            }
            Step::Dense { data, in_place: true } => {
                target.bytes_mut(&t.name).expect("checked: the target holds it").copy_from_slice(data);
                out.dense += 1;
            }
            Step::Dense { data, in_place: false } => {
                target.replace(&t.name, t.dtype, &t.shape, AlignedBuf::copy_from(data));
                out.dense += 1;
            }
        }
    }
    for gone in held.tensors.iter().filter(|o| !seen.contains(o.0.as_str())) {
        target.remove(&gone.0);
    }
    target.set_held(Held {
        name: held.name,
        version: Some(delta.version),
        tree: Some(delta.tree.clone()),
        digest: delta.digest.clone(),
        metadata: delta.metadata.clone(),
        tensors: delta
            .tensors
            .iter()
            .zip(digests)
            .map(|(t, d)| (t.name.clone(), t.dtype, t.shape.clone(), d))
            .collect(),
    });
    Ok(out)
}

/// Checks one tensor's change against what is held (`old`: the held tensor's digest, when
/// held with the same dtype and shape), without hashing.
fn check<'a>(
    t: &'a TensorDelta,
    old: Option<[u8; 32]>,
    len: usize,
    target: &dyn DeltaTarget,
    want: &[u8; 32],
) -> Result<Step<'a>, DeltaError> {
    let bad = |m: &str| DeltaError::Invalid(format!("{:?}: {m}", t.name));
    match t.change {
        Change::Same => match old {
            Some(d) if &d == want => Ok(Step::Same),
            Some(d) => Err(DeltaError::Digest { what: t.name.clone(), expected: t.digest.clone(), actual: hex(&d) }),
            None => Err(bad("`same`, but the copy does not hold it with this dtype and shape")),
        },
        Change::Dense => {
            let data = t.data.as_ref().ok_or_else(|| bad("`dense` without `data`"))?;
            if data.dtype() != t.dtype || data.shape() != t.shape.as_slice() || data.meta().strides.is_some() {
                return Err(bad("`data` is not of the tensor's dtype and shape"));
            }
            let bytes = data.host_bytes().ok_or_else(|| bad("`data` is not in host memory"))?;
            if bytes.len() != len {
                return Err(bad("`data` has the wrong length"));
            }
            let in_place = old.is_some() && target.bytes(&t.name).is_some_and(|b| b.len() == len);
            Ok(Step::Dense { data: bytes, in_place })
        }
        Change::Sparse => {
            old.ok_or_else(|| bad("`sparse`, but the copy does not hold it with this dtype and shape"))?;
            let held =
                target.bytes(&t.name).filter(|b| b.len() == len).ok_or_else(|| bad("the copy's bytes are missing"))?;
            let (index, values) =
                t.index.as_ref().zip(t.values.as_ref()).ok_or_else(|| bad("`sparse` without `index` and `values`"))?;
            let size = t.dtype.itemsize();
            let numel = (held.len() / size.max(1)) as u64;
            let ib = index.host_bytes().ok_or_else(|| bad("`index` is not in host memory"))?;
            if index.meta().strides.is_some() {
                return Err(bad("`index` is strided"));
            }
            // Read straight from the received bytes (little-endian), no aligned copy first.
            let idx: Vec<u64> = match (index.dtype(), index.shape()) {
                (DType::U32, [n]) if ib.len() as u64 == n * 4 => {
                    ib.chunks_exact(4).map(|c| u64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect()
                }
                (DType::U64, [n]) if ib.len() as u64 == n * 8 => ib
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                    .collect(),
                _ => return Err(bad("`index` is not a u32 or u64 vector")),
            };
            if values.dtype() != t.dtype || values.shape() != [idx.len() as u64] {
                return Err(bad("`values` is not one element of the tensor's dtype per index"));
            }
            if idx.windows(2).any(|w| w[0] >= w[1]) || idx.last().is_some_and(|&i| i >= numel) {
                return Err(bad("`index` is not ascending within the tensor"));
            }
            let values = values.host_bytes().ok_or_else(|| bad("`values` is not in host memory"))?;
            Ok(Step::Sparse { index: idx, values, size })
        }
    }
}

/// Hashes every changed tensor as it will be once written, several at once, and compares
/// each with its digest.
fn hash_all(delta: &Delta, steps: &[Step<'_>], now: &[Option<&[u8]>], want: &[[u8; 32]]) -> Result<(), DeltaError> {
    let work: Vec<usize> = (0..steps.len()).filter(|&i| !matches!(steps[i], Step::Same)).collect();
    let next = Mutex::new(0usize);
    let failed: Mutex<Option<DeltaError>> = Mutex::new(None);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8).min(work.len().max(1));
    let one = |i: usize| -> Option<DeltaError> {
        let t = &delta.tensors[i];
        let got = match &steps[i] {
            Step::Same => return None,
            Step::Dense { data, .. } => *blake3::hash(data).as_bytes(),
            Step::Sparse { index, values, size } => patched_hash(now[i]?, index, values, *size),
        };
        (got != want[i]).then(|| DeltaError::Digest {
            what: t.name.clone(),
            expected: t.digest.clone(),
            actual: hex(&got),
        })
    };
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let k = {
                        let mut n = next.lock().unwrap_or_else(|e| e.into_inner());
                        let k = *n;
                        *n += 1;
                        k
                    };
                    let Some(&i) = work.get(k) else { break };
                    if let Some(e) = one(i) {
                        failed.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e);
                        break;
                    }
                }
            });
        }
    });
    match failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// BLAKE3 of `held` with `values` laid over the elements at `index` (ascending), streamed
/// through a 64 KiB buffer.
fn patched_hash(held: &[u8], index: &[u64], values: &[u8], size: usize) -> [u8; 32] {
    const CHUNK: usize = 64 << 10;
    let chunk = CHUNK / size.max(1) * size.max(1);
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; chunk.min(held.len())];
    let mut k = 0;
    let mut at = 0;
    while at < held.len() {
        let end = (at + chunk).min(held.len());
        let b = &mut buf[..end - at];
        b.copy_from_slice(&held[at..end]);
        while k < index.len() && (index[k] as usize * size) < end {
            let off = index[k] as usize * size - at;
            b[off..off + size].copy_from_slice(&values[k * size..(k + 1) * size]);
            k += 1;
        }
        h.update(b);
        at = end;
    }
    *h.finalize().as_bytes()
}

/// A local copy of a version, in memory this process owns: what a reader on another host
/// keeps and applies each delta to ([`Replica::apply`]; same-shaped tensors are written in
/// place, so their addresses stay).
#[derive(Default)]
pub struct Replica {
    held: Held,
    data: HashMap<String, AlignedBuf>,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("name", &self.held.name)
            .field("version", &self.held.version)
            .field("tensors", &self.held.tensors.len())
            .finish()
    }
}

impl Replica {
    /// An empty copy of bundle `name` (its first delta brings every tensor).
    pub fn new(name: &str) -> Replica {
        Replica { held: Held::empty(name), data: HashMap::new() }
    }

    /// What it holds.
    pub fn held(&self) -> &Held {
        &self.held
    }

    /// The version held.
    pub fn version(&self) -> Option<u64> {
        self.held.version
    }

    /// Applies `delta` ([`apply`]): all or nothing.
    pub fn apply(&mut self, delta: &Delta) -> Result<Applied, DeltaError> {
        apply(delta, self)
    }

    /// The bytes of tensor `name`.
    pub fn tensor(&self, name: &str) -> Option<&[u8]> {
        self.data.get(name).map(AsRef::as_ref)
    }

    /// Every tensor, in the order published: name, dtype, shape, bytes.
    pub fn tensors(&self) -> impl Iterator<Item = (&str, DType, &[u64], &[u8])> {
        self.held.tensors.iter().filter_map(|(n, d, s, _)| Some((n.as_str(), *d, s.as_slice(), self.tensor(n)?)))
    }

    /// The bundle digest (PROTOCOL.md §20) of what it holds, computed from its bytes: the
    /// store's digest of the same version.
    pub fn bundle_digest(&self) -> String {
        let entries: Vec<Entry> =
            self.held.tensors.iter().map(|(n, d, s, _)| Entry(n.clone(), *d, s.clone(), 0, 0)).collect();
        let bytes: Vec<&[u8]> = entries.iter().map(|e| self.tensor(&e.0).unwrap_or(&[])).collect();
        crate::manifest::digest(entries.iter().zip(bytes))
    }
}

impl DeltaTarget for Replica {
    fn held(&self) -> &Held {
        &self.held
    }
    fn bytes(&self, name: &str) -> Option<&[u8]> {
        self.tensor(name)
    }
    fn bytes_mut(&mut self, name: &str) -> Option<&mut [u8]> {
        self.data.get_mut(name).map(AsMut::as_mut)
    }
    fn can_replace(&self) -> bool {
        true
    }
    fn replace(&mut self, name: &str, _: DType, _: &[u64], data: AlignedBuf) {
        self.data.insert(name.to_owned(), data);
    }
    fn remove(&mut self, name: &str) {
        self.data.remove(name);
    }
    fn set_held(&mut self, held: Held) {
        self.held = held;
    }
}

/// Calls `store.delta` on `client` for what `held` needs to become version `to` (default
/// the latest).
pub async fn fetch(client: &ferry_rpc::Client, held: &Held, to: Option<u64>) -> Result<Delta, ferry_rpc::CallError> {
    client.call("store.delta", &held.params(to)).await
}
