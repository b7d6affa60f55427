//! The store: named bundles, their versions and the byte budget. Building a version in
//! place ([`BundleBuilder`]) is in `builder`.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use ferry_core::Tensor;
use serde_json::Value;

use crate::bucket::{Bucket, BucketMut, WeakBucket};
use crate::manifest::{DigestCell, Entry, digest};
use crate::{StoreError, StoreOptions};

mod builder;
mod plan;
mod spares;

pub use builder::BundleBuilder;
pub(crate) use builder::{Placed, Reservation};
pub(crate) use plan::plan;
use spares::background_priority;
pub(crate) use spares::free_later;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Who publishes: `None` is the process that owns the store (it may publish any name); an
/// RPC caller is its identity, and a name belongs to the identity that first published it.
pub type Owner = Option<ferry_rpc::Identity>;

/// What a version is, apart from its memory: kept while any of its buckets lives, so that a
/// superseded version still held by a reader can be opened again.
#[derive(Debug)]
pub struct Manifest {
    /// The bundle's name.
    pub name: String,
    /// Its version number (1, 2, ...).
    pub version: u64,
    /// Where each tensor lies, in the order published.
    pub entries: Vec<Entry>,
    /// The producer's metadata (any JSON; `null` when none).
    pub metadata: Value,
    /// Bytes of its buckets (those it shares with the version before included).
    pub bytes: u64,
    /// Bytes of the buckets made for it: what publishing it cost. The rest it shares with
    /// the version before (the tensors that did not change).
    pub new_bytes: u64,
    /// When it was published (milliseconds since the Unix epoch).
    pub published_ms: u64,
    pub(crate) digest: Arc<DigestCell>,
    /// `entries` in columns, made on the first open and sent as they are to every reader.
    pub(crate) columns: OnceLock<crate::manifest::Columns>,
    /// Each entry's BLAKE3 digest (of its bytes), once computed.
    pub(crate) tensor_digests: OnceLock<Arc<Vec<[u8; 32]>>>,
    /// Digests to take from the version before (the tensors it shares storage with).
    pub(crate) inherit: crate::digests::Inherit,
    /// Bytes hashed to compute `tensor_digests` (the tensors not inherited).
    pub(crate) digested_bytes: std::sync::atomic::AtomicU64,
}

impl Manifest {
    /// The digest (`blake3:HEX`) once computed; `None` while it is computed or when digests
    /// are off ([`StoreOptions::digest`]).
    pub fn digest(&self) -> Option<String> {
        self.digest.get().flatten()
    }

    /// Waits for the digest (`None`: digests are off).
    pub fn wait_digest(&self) -> Option<String> {
        self.digest.wait()
    }

    /// `entries` in columns ([`crate::Columns`]), made once per version: what `store.open`
    /// sends as the manifest, so that an open costs the server O(buckets), not O(tensors).
    pub fn columns(&self) -> crate::Columns {
        self.columns.get_or_init(|| crate::Columns::of(&self.entries)).clone()
    }

    /// Each tensor's BLAKE3 digest (of its bytes), in the order of `entries`, once computed
    /// ([`Version::tensor_digests`] computes them).
    pub fn tensor_digests(&self) -> Option<Arc<Vec<[u8; 32]>>> {
        self.tensor_digests.get().cloned()
    }

    /// The version's tree digest (`blake3:HEX` over every tensor's name, dtype, shape and
    /// digest; PROTOCOL.md §23), once the tensors' digests are computed.
    pub fn tree_digest(&self) -> Option<String> {
        Some(crate::manifest::tree_digest(&self.entries, &self.tensor_digests()?))
    }

    /// Bytes hashed to compute the tensors' digests (0 until computed): the tensors that
    /// do not share storage with the version before, whose digests are taken from it.
    pub fn digested_bytes(&self) -> u64 {
        self.digested_bytes.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// One immutable version of a bundle: its manifest and its buckets. Holding it (or any
/// tensor made from it) keeps its memory; readers over a pipe hold leases on the buckets
/// instead.
#[derive(Clone)]
pub struct Version {
    manifest: Arc<Manifest>,
    buckets: Vec<Bucket>,
}

impl std::fmt::Debug for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Version")
            .field("name", &self.manifest.name)
            .field("version", &self.manifest.version)
            .field("tensors", &self.manifest.entries.len())
            .field("buckets", &self.buckets.len())
            .finish()
    }
}

impl Version {
    /// Its manifest.
    pub fn manifest(&self) -> &Arc<Manifest> {
        &self.manifest
    }

    /// Its buckets' bytes, one host tensor (`u8`, 1-D) per bucket: what a reader maps.
    pub fn bucket_tensors(&self) -> Vec<Tensor> {
        self.buckets.iter().map(Bucket::tensor).collect()
    }

    /// Each tensor's BLAKE3 digest, in the order of the manifest's entries: computed once
    /// per version (by the digest thread after publishing, or here; a second caller waits
    /// for the first), several tensors at a time, taken from the version before for the
    /// tensors whose storage it shares (a bucket never changes once published), then remembered in the
    /// manifest. A tensor in a device bucket cannot be hashed here: [`StoreError::Invalid`].
    pub fn tensor_digests(&self) -> Result<Arc<Vec<[u8; 32]>>, StoreError> {
        if let Some(d) = self.manifest.tensor_digests.get() {
            return Ok(d.clone());
        }
        let mut bytes = Vec::with_capacity(self.manifest.entries.len());
        for (i, e) in self.manifest.entries.iter().enumerate() {
            bytes
                .push(self.entry_bytes(i).ok_or_else(|| {
                    StoreError::Invalid(format!("tensor {:?} is not in host memory: no digest", e.0))
                })?);
        }
        let m = &self.manifest;
        Ok(m.tensor_digests
            .get_or_init(|| {
                let (d, n) = crate::digests::compute(&bytes, &m.inherit.take());
                m.digested_bytes.store(n, std::sync::atomic::Ordering::Relaxed);
                Arc::new(d)
            })
            .clone())
    }

    /// The host bytes of the `i`-th entry (`None` in a device bucket).
    pub(crate) fn entry_bytes(&self, i: usize) -> Option<Bytes> {
        let e = self.manifest.entries.get(i)?;
        let len = usize::try_from(e.byte_len()?).ok()?;
        self.buckets.get(e.3 as usize)?.bytes(usize::try_from(e.4).ok()?, len)
    }

    /// The bucket and offset of the `i`-th entry.
    pub(crate) fn entry_place(&self, i: usize) -> Option<(Bucket, usize)> {
        let e = self.manifest.entries.get(i)?;
        Some((self.buckets.get(e.3 as usize)?.clone(), usize::try_from(e.4).ok()?))
    }

    /// The `i`-th tensor as a view of its bucket (host buckets only).
    pub(crate) fn tensors_at(&self, i: usize) -> Option<Tensor> {
        Tensor::new(self.manifest.entries.get(i)?.meta(), self.entry_bytes(i)?).ok()
    }

    pub(crate) fn buckets(&self) -> &[Bucket] {
        &self.buckets
    }

    /// Every tensor, in the order published, as a view of the buckets (no copy).
    pub fn tensors(&self) -> Vec<(String, Tensor)> {
        self.manifest
            .entries
            .iter()
            .filter_map(|e| {
                let t = match self.buckets.get(e.3 as usize)? {
                    Bucket::Device(b) => crate::device::device_slice(b, e.4, e.meta())?,
                    b @ Bucket::Host(_) => {
                        let len = usize::try_from(e.byte_len()?).ok()?;
                        Tensor::new(e.meta(), b.bytes(usize::try_from(e.4).ok()?, len)?).ok()?
                    }
                };
                Some((e.0.clone(), t))
            })
            .collect()
    }
}

/// A superseded version: its manifest and weak handles on its buckets.
struct Old {
    manifest: Arc<Manifest>,
    buckets: Vec<WeakBucket>,
}

impl Old {
    fn upgrade(&self) -> Option<Version> {
        let buckets = self.buckets.iter().map(WeakBucket::upgrade).collect::<Option<Vec<_>>>()?;
        Some(Version { manifest: self.manifest.clone(), buckets })
    }
}

#[derive(Default)]
pub(crate) struct Slot {
    /// `None`: the process itself; else the identity that first published the name.
    owner: Owner,
    /// Its owner can never call again ([`Store::owner_gone`]): the next publisher takes it.
    orphan: bool,
    pub(crate) latest: Option<Version>,
    old: Vec<Old>,
    next: u64,
    /// Superseded versions the store keeps for sparse deltas ([`StoreOptions::delta_bases`]),
    /// oldest first.
    pub(crate) bases: VecDeque<Version>,
    /// Manifests of superseded versions ([`StoreOptions::delta_history`]), oldest first.
    pub(crate) history: VecDeque<Arc<Manifest>>,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) bundles: BTreeMap<String, Slot>,
    /// Bytes held by builders not committed yet.
    building: u64,
    /// New buckets made ready for the next publish ([`StoreOptions::spare_buckets`]).
    spares: Vec<BucketMut>,
}

impl State {
    /// Forgets superseded versions nothing holds: an old version is kept while one of its
    /// buckets lives apart from the latest version's and the kept bases' (a bucket it
    /// shares with them is counted with them), or, among the last `recent` versions, while
    /// all of its buckets live (so that it can still be opened).
    fn prune(&mut self, recent: usize) {
        for slot in self.bundles.values_mut() {
            let current: HashSet<usize> =
                slot.latest.iter().chain(&slot.bases).flat_map(|v| v.buckets.iter().map(Bucket::key)).collect();
            let newest = slot.next;
            slot.old.retain(|o| {
                o.buckets.iter().any(|b| b.live_bytes().is_some() && !current.contains(&b.key()))
                    || (o.manifest.version + recent as u64 >= newest
                        && o.buckets.iter().all(|b| b.live_bytes().is_some()))
            });
        }
        self.bundles.retain(|_, s| s.latest.is_some() || !s.old.is_empty() || !s.bases.is_empty());
    }

    /// Bytes of live buckets, each counted once however many versions share it.
    fn used(&self) -> u64 {
        let mut seen = HashSet::new();
        let mut sum = self.building + self.spares.iter().map(|b| b.as_slice().len() as u64).sum::<u64>();
        for s in self.bundles.values() {
            for b in s.latest.iter().chain(&s.bases).flat_map(|v| &v.buckets) {
                if seen.insert(b.key()) {
                    sum += b.len() as u64;
                }
            }
            for w in s.old.iter().flat_map(|o| &o.buckets) {
                if let Some(n) = w.live_bytes()
                    && seen.insert(w.key())
                {
                    sum += n as u64;
                }
            }
        }
        sum
    }
}

/// Named, versioned, immutable bundles of tensors (a model's state_dict) in a few large
/// buckets. See the crate docs.
pub struct Store {
    pub(crate) opts: StoreOptions,
    pub(crate) state: Mutex<State>,
    pub(crate) placement: OnceLock<Arc<crate::PlacedRefs>>,
    /// Counts the changes of latest versions (publish, unpublish): what
    /// [`Store::wait_latest`] waits on.
    pub(crate) changes: tokio::sync::watch::Sender<u64>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("opts", &self.opts).finish_non_exhaustive()
    }
}

/// What [`Store::list`] says of a bundle.
#[derive(Debug, Clone)]
pub struct BundleStatus {
    /// The latest version (`None` once unpublished while readers still hold older ones).
    pub latest: Option<Arc<Manifest>>,
    /// Superseded versions still held by readers.
    pub held: Vec<Arc<Manifest>>,
}

impl Store {
    /// An empty store.
    pub fn new(opts: StoreOptions) -> Arc<Store> {
        Arc::new(Store {
            opts,
            state: Mutex::new(State::default()),
            placement: OnceLock::new(),
            changes: tokio::sync::watch::Sender::new(0),
        })
    }

    /// Its options.
    pub fn options(&self) -> &StoreOptions {
        &self.opts
    }

    /// Bytes of live buckets (latest versions, superseded ones readers hold, builders).
    pub fn used_bytes(&self) -> u64 {
        let mut st = lock(&self.state);
        st.prune(self.opts.delta_history);
        st.used()
    }

    /// Version `version` of `name` (`None`: the latest). A superseded version can be opened
    /// while some reader still holds it.
    pub fn open(&self, name: &str, version: Option<u64>) -> Result<Version, StoreError> {
        let st = lock(&self.state);
        let slot = st.bundles.get(name).ok_or_else(|| StoreError::NotFound(format!("no bundle named {name:?}")))?;
        match (version, &slot.latest) {
            (None, Some(v)) => Ok(v.clone()),
            (None, None) => Err(StoreError::NotFound(format!("bundle {name:?} was unpublished"))),
            (Some(n), Some(v)) if v.manifest.version == n => Ok(v.clone()),
            (Some(n), _) => slot
                .bases
                .iter()
                .find(|b| b.manifest.version == n)
                .cloned()
                .or_else(|| slot.old.iter().filter(|o| o.manifest.version == n).find_map(Old::upgrade))
                .ok_or_else(|| StoreError::NotFound(format!("version {n} of bundle {name:?} is not held any more"))),
        }
    }

    /// The number of the latest version of `name` (`None`: none).
    pub fn latest_version(&self, name: &str) -> Option<u64> {
        lock(&self.state).bundles.get(name)?.latest.as_ref().map(|v| v.manifest.version)
    }

    /// Waits, at most `limit`, until bundle `name` has a latest version other than `held`
    /// (`None`: until it has one), and returns the latest version then (`held`, or `None`,
    /// when the time ran out). Woken by each publish, not by polling: a reader that holds
    /// version N and waits this way hears of N+1 as it is published.
    pub async fn wait_latest(&self, name: &str, held: Option<u64>, limit: std::time::Duration) -> Option<u64> {
        let mut changes = self.changes.subscribe();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            // (Subscribed before looking: a publish in between marks the receiver changed.)
            let now = self.latest_version(name);
            if now.is_some() && now != held {
                return now;
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return self.latest_version(name),
            }
        }
    }

    /// Tells [`Store::wait_latest`]'s waiters that a latest version changed.
    pub(crate) fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The manifest of version `n` of `name` if the store remembers it
    /// ([`StoreOptions::delta_history`]), whether or not its storage lives.
    pub(crate) fn remembered(&self, name: &str, n: u64) -> Option<Arc<Manifest>> {
        let st = lock(&self.state);
        let slot = st.bundles.get(name)?;
        slot.latest.iter().map(|v| &v.manifest).chain(slot.history.iter()).find(|m| m.version == n).cloned()
    }

    /// Every bundle with a latest version or held versions, by name.
    pub fn list(&self) -> BTreeMap<String, BundleStatus> {
        let mut st = lock(&self.state);
        st.prune(self.opts.delta_history);
        st.bundles
            .iter()
            .map(|(n, s)| {
                let held = s.old.iter().map(|o| o.manifest.clone()).collect();
                (n.clone(), BundleStatus { latest: s.latest.as_ref().map(|v| v.manifest.clone()), held })
            })
            .collect()
    }

    /// Drops the latest version of `name` (readers keep what they hold). Only its owner may.
    pub fn unpublish(&self, name: &str, by: &Owner) -> Result<(), StoreError> {
        let mut st = lock(&self.state);
        let slot = st.bundles.get_mut(name).ok_or_else(|| StoreError::NotFound(format!("no bundle named {name:?}")))?;
        check_owner(name, slot, by)?;
        if let Some(v) = slot.latest.take() {
            slot.old.push(Old { buckets: v.buckets.iter().map(Bucket::downgrade).collect(), manifest: v.manifest });
        }
        st.prune(self.opts.delta_history);
        drop(st);
        self.changed();
        Ok(())
    }

    /// `owner` can never call again (a per-connection identity whose connection ended:
    /// [`ferry_rpc::Identity::Connection`]): the latest versions of the bundles it owns are
    /// dropped as [`Store::unpublish`] drops them (readers keep what they hold), and their
    /// names are free for the next publisher. The count of versions dropped.
    pub fn owner_gone(&self, owner: &ferry_rpc::Identity) -> usize {
        let mut st = lock(&self.state);
        let mut dropped = Vec::new();
        for slot in st.bundles.values_mut().filter(|s| s.owner.as_ref() == Some(owner)) {
            if let Some(v) = slot.latest.take() {
                let buckets = v.buckets.iter().map(Bucket::downgrade).collect();
                slot.old.push(Old { buckets, manifest: v.manifest.clone() });
                dropped.push(v);
            }
            slot.orphan = true;
        }
        drop(st);
        self.changed();
        let n = dropped.len();
        // Freeing memory no reader holds takes about 0.2 s per GiB: not on the closing
        // connection's time.
        if dropped.iter().any(|v| v.buckets.iter().any(Bucket::is_last)) {
            let _ = std::thread::Builder::new().name("ferry-store-free".into()).spawn(move || drop(dropped));
        } else {
            drop(dropped);
        }
        lock(&self.state).prune(self.opts.delta_history);
        n
    }

    /// Makes `entries` in `buckets` the next version of `name`; with `base`, only if the
    /// latest version is still `base` ([`StoreError::Stale`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn commit(
        &self,
        name: &str,
        by: &Owner,
        entries: Vec<Entry>,
        buckets: Vec<Bucket>,
        metadata: Value,
        read: Option<HostRead>,
        base: Option<u64>,
    ) -> Result<Version, StoreError> {
        if let Some(e) = entries.iter().find(|e| e.0.contains('\n')) {
            return Err(StoreError::Invalid(format!("tensor name {:?} contains a line break", e.0)));
        }
        let bytes = buckets.iter().map(|b| b.len() as u64).sum();
        let cell = Arc::new(DigestCell::default());
        let mut st = lock(&self.state);
        let slot = st.bundles.entry(name.to_owned()).or_insert_with(|| Slot { owner: by.clone(), ..Slot::default() });
        check_owner(name, slot, by)?;
        let latest = slot.latest.as_ref().map(|v| v.manifest.version);
        if let Some(base) = base
            && latest != Some(base)
        {
            return Err(StoreError::Stale { name: name.to_owned(), base, latest });
        }
        if slot.orphan {
            (slot.owner, slot.orphan) = (by.clone(), false);
        }
        let before: HashSet<usize> =
            slot.latest.iter().chain(&slot.bases).flat_map(|v| v.buckets.iter().map(Bucket::key)).collect();
        let new_bytes = buckets.iter().filter(|b| !before.contains(&b.key())).map(|b| b.len() as u64).sum();
        slot.next += 1;
        // The digests of the tensors that stay where they were come from the version before.
        let inherit = match &slot.latest {
            Some(p) => crate::digests::Inherit::of(&p.manifest, &p.buckets, &entries, &buckets),
            None => crate::digests::Inherit::default(),
        };
        let manifest = Arc::new(Manifest {
            name: name.to_owned(),
            version: slot.next,
            entries,
            metadata,
            bytes,
            new_bytes,
            published_ms: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
            digest: cell.clone(),
            columns: OnceLock::new(),
            tensor_digests: OnceLock::new(),
            inherit,
            digested_bytes: Default::default(),
        });
        let v = Version { manifest, buckets };
        let prev = slot.latest.replace(v.clone());
        let mut dropped_bases = Vec::new();
        if let Some(prev) = &prev {
            slot.old.push(Old {
                buckets: prev.buckets.iter().map(Bucket::downgrade).collect(),
                manifest: prev.manifest.clone(),
            });
            slot.history.push_back(prev.manifest.clone());
            while slot.history.len() > self.opts.delta_history {
                slot.history.pop_front();
            }
            if self.opts.delta_bases > 0 {
                slot.bases.push_back(prev.clone());
            }
            while slot.bases.len() > self.opts.delta_bases {
                dropped_bases.extend(slot.bases.pop_front());
            }
        }
        drop(st);
        self.changed();
        free_later(dropped_bases);
        // Freeing a superseded version no reader holds unmaps and frees its memory (about
        // 0.2 s per GiB): not on the publisher's time.
        // (Where readers still hold it, dropping it here only counts down: no thread.)
        free_later(prev.into_iter().collect());
        lock(&self.state).prune(self.opts.delta_history);
        if self.opts.digest {
            let for_hash = v.clone();
            let read2 = read.clone();
            let spawned = std::thread::Builder::new().name("ferry-store-digest".into()).spawn(move || {
                let man = for_hash.manifest.clone();
                // (Host buckets only: a device version has no tensor digests until asked.)
                let _ =
                    for_hash.buckets.iter().all(|b| matches!(b, Bucket::Host(_))).then(|| for_hash.tensor_digests());
                // The tensors' digests are what readers of deltas wait for; the bundle
                // digest takes the cores they leave.
                background_priority();
                let d = version_digest(&for_hash, read2.as_ref());
                // The buckets are let go before the digest is told: who waited for it may
                // count on this thread holding nothing.
                drop(for_hash);
                man.digest.set(d);
            });
            if let Err(e) = spawned {
                tracing::warn!("ferry-store: cannot start the digest thread ({e}); computing the digest here");
                cell.set(version_digest(&v, read.as_ref()));
            }
        } else {
            cell.set(None);
        }
        tracing::info!(
            bundle = name,
            version = v.manifest.version,
            bytes,
            tensors = v.manifest.entries.len(),
            "published"
        );
        Ok(v)
    }
}

/// Copies a device tensor to the host (for the digest of a version whose buckets are on a
/// device): e.g. `ferry_cuda_ipc::CudaIpcChannel::copy_to_host`.
pub type HostRead = Arc<dyn Fn(&Tensor) -> Result<Vec<u8>, String> + Send + Sync>;

/// The digest of `v`'s tensors; `None` when a device bucket cannot be read to the host.
fn version_digest(v: &Version, read: Option<&HostRead>) -> Option<String> {
    let mut host: Vec<Bytes> = Vec::with_capacity(v.buckets.len());
    for b in &v.buckets {
        host.push(match b {
            Bucket::Host(_) => b.bytes(0, b.len()).unwrap_or_default(),
            Bucket::Device(t) => match read.map(|r| r(t)) {
                Some(Ok(bytes)) => Bytes::from(bytes),
                Some(Err(e)) => {
                    tracing::warn!(bundle = %v.manifest.name, "ferry-store: no digest: cannot read a device bucket: {e}");
                    return None;
                }
                None => return None,
            },
        });
    }
    let slices = v.manifest.entries.iter().map(|e| {
        let (off, len) = (e.4 as usize, e.byte_len().unwrap_or(0) as usize);
        host.get(e.3 as usize).and_then(|b| b.get(off..off + len)).unwrap_or(&[])
    });
    Some(digest(v.manifest.entries.iter().zip(slices)))
}

/// The process itself may change any bundle; a caller, the bundles its identity published
/// first, those the process published when it runs as the caller's own user, and those
/// whose owner is gone.
fn check_owner(name: &str, slot: &Slot, by: &Owner) -> Result<(), StoreError> {
    match (by, &slot.owner) {
        (None, _) => Ok(()),
        _ if slot.orphan => Ok(()),
        (Some(who), Some(owner)) if who == owner => Ok(()),
        #[cfg(target_os = "linux")]
        (Some(ferry_rpc::Identity::Uid(uid)), None) if *uid == rustix::process::geteuid().as_raw() => Ok(()),
        _ => Err(StoreError::Forbidden(format!("bundle {name:?} belongs to another identity"))),
    }
}
