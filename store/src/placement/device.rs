//! A device tier (`cuda:N`, with a byte budget) above the cpu and disk tiers ([`Tiers`]),
//! for tensors whose home is that device: a model's weights on a GPU that do not all fit.
//!
//! - A tensor's **home** is the device: every use ([`DeviceTier::get`]) gets it in device
//!   memory, wherever it is kept between uses. What stays on the device is the
//!   [`Policy`]'s choice (a policy of its own, beside the cpu tier's): `genoa` uploads it
//!   for the use and lets it go right after, `lru` and `flow` keep the hot ones within the
//!   budget, a declared [`DeviceTier::schedule`] uploads ahead of the uses.
//! - **Below the device** a tensor lives in the [`Tiers`] (the cpu tier, then disk), whose
//!   own policy moves it there. Its host copy is made the first time it leaves the device
//!   (a copy to the host, then [`Tiers::put`]); tensors are immutable, so later moves down
//!   only drop the device copy.
//! - **Moves are asynchronous**: uploads and copies down run on the tier's mover thread; a
//!   tensor on its way down stays usable on the device until its host copy exists.
//! - **Never moved under its user**: while anyone holds a tensor's device memory (a use's
//!   buffer, a tensor made of it, a cuda-ipc peer's mapping of it) the tier keeps it. When
//!   the policy lets it go meanwhile, it is dropped once the last user lets go (`deferred`,
//!   counted in [`DeviceStats::held_over_bytes`] beyond the budget).
//! - **Placed by hand** ([`DeviceTier::place`]): pinned on the device (within its budget),
//!   pinned below it (in the cpu tier or on disk, [`Pin`]), or back to the policy.
//!
//! The device's memory comes from a [`DeviceMemory`]: with the `cuda` feature,
//! [`CudaMemory`] allocates it in the cuda-ipc channel's exportable pool, so that a tensor
//! on the device tier is lent to a cuda-ipc peer without a copy.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ferry_core::{Device, DeviceBuffer};

use super::kept::{Kept, MoverThread};
use super::{Decision, Key, Pin, Policy, Tier, TierError, Tiers};

#[cfg(feature = "cuda")]
mod cuda;
mod moves;

#[cfg(feature = "cuda")]
pub use cuda::CudaMemory;

/// Device memory for a [`DeviceTier`]: allocation and the copies to and from the host.
/// Called on the tier's mover thread only (a plain thread, outside any async runtime).
pub trait DeviceMemory: Send + Sync + 'static {
    /// The device (`cuda:N`).
    fn device(&self) -> Device;
    /// New memory on [`DeviceMemory::device`] holding a copy of `src`.
    fn upload(&self, src: &[u8]) -> Result<Arc<dyn DeviceBuffer>, String>;
    /// The bytes of `buf` (memory on this device), copied to the host.
    fn download(&self, buf: &Arc<dyn DeviceBuffer>) -> Result<Vec<u8>, String>;
}

/// Where a device-tier tensor was placed by hand ([`DeviceTier::place`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DevicePin {
    /// Where the device tier's policy (and below it the cpu tier's) decides.
    #[default]
    Auto,
    /// Pinned on the device.
    Device,
    /// Kept off the device, placed so below it: each use uploads it and lets it go.
    Below(Pin),
}

/// What the device tier did so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Uses ([`DeviceTier::get`]).
    pub uses: u64,
    /// Uses of a tensor placed on the device (kept, pinned, or uploaded ahead).
    pub hits: u64,
    /// Uses that waited for an upload.
    pub waits: u64,
    /// Bytes copied to the device.
    pub bytes_up: u64,
    /// Bytes copied from the device to the host (each tensor at most once).
    pub bytes_down: u64,
    /// Uploads started ahead of a use (prefetches).
    pub prefetches: u64,
    /// Time uses spent waiting for uploads.
    pub stalled: Duration,
    /// The last move that failed, if any (the tensor stayed where it was).
    pub last_error: Option<String>,
    /// Moves off the device deferred because the tensor was in use.
    pub deferred: u64,
    /// Bytes on the device waiting for their users to let go, beyond the budget's.
    pub held_over_bytes: u64,
}

/// Where one device-tier tensor is ([`DeviceTier::state`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceTensorState {
    /// On the device (`None`), or the tier below it that holds it now.
    pub below: Option<Tier>,
    /// How it was placed by hand.
    pub pin: DevicePin,
    /// A move to or from the device is under way (or, off the device, between the tiers
    /// below it).
    pub moving: bool,
    /// Someone holds its device memory.
    pub in_use: bool,
    /// The device let it go while in use: it stays there until its users let go.
    pub deferred: bool,
    /// Its size.
    pub bytes: u64,
}

/// Longest a use waits for its upload.
const UPLOAD_WAIT: Duration = Duration::from_secs(60);

pub(super) struct Entry {
    bytes: u64,
    /// The device copy (kept, on its way down, or in use).
    copy: Option<Arc<dyn DeviceBuffer>>,
    /// Its key in the tiers below, once its host copy exists.
    below: Option<Key>,
    pin: DevicePin,
    last_use: usize,
    /// Uses waiting for its upload.
    waiting: u32,
    /// Why its last upload for a use failed (reported to the waiting uses).
    failed: Option<String>,
}

impl Entry {
    fn in_use(&self) -> bool {
        self.copy.as_ref().is_some_and(|c| Arc::strong_count(c) > 1)
    }
}

pub(super) enum Job {
    Up(Key),
    Down(Key),
}

pub(super) struct State {
    kept: Kept,
    entries: HashMap<Key, Entry>,
    next_key: Key,
    uploading: HashSet<Key>,
    downloading: HashSet<Key>,
    deferred: HashSet<Key>,
    stats: DeviceStats,
}

pub(super) struct Shared {
    state: Mutex<State>,
    moved: Condvar,
    mem: Arc<dyn DeviceMemory>,
    below: Arc<Tiers>,
}

/// Tensors homed on one device, kept there or below it (see the module docs).
pub struct DeviceTier {
    shared: Arc<Shared>,
    mover: MoverThread<Job>,
}

impl std::fmt::Debug for DeviceTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceTier").field("device", &self.device()).finish_non_exhaustive()
    }
}

impl DeviceTier {
    /// A device tier of `budget` bytes on `mem`'s device above `below`, moved by `policy`.
    pub fn new(
        mem: Arc<dyn DeviceMemory>,
        budget: u64,
        policy: Box<dyn Policy + Send>,
        below: Arc<Tiers>,
    ) -> Result<DeviceTier, TierError> {
        let state = State {
            kept: Kept::new(budget, policy),
            entries: HashMap::new(),
            next_key: 0,
            uploading: HashSet::new(),
            downloading: HashSet::new(),
            deferred: HashSet::new(),
            stats: DeviceStats::default(),
        };
        let shared = Arc::new(Shared { state: Mutex::new(state), moved: Condvar::new(), mem, below });
        let mover = MoverThread::spawn("ferry-device-tier", shared.clone())
            .map_err(|source| TierError::Io { path: "<device mover thread>".into(), source })?;
        Ok(DeviceTier { shared, mover })
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.shared.mem.device()
    }

    /// Takes over `buf` (memory on this tier's device; immutable from now on) and returns
    /// its key. Its first "use": the policy decides whether it stays on the device.
    pub fn put(&self, buf: Arc<dyn DeviceBuffer>) -> Result<Key, TierError> {
        if buf.device() != self.device() {
            return Err(TierError::Device(format!("a tensor on {} given to the {} tier", buf.device(), self.device())));
        }
        let bytes = buf.len() as u64;
        let mut st = self.shared.lock();
        let key = st.next_key;
        st.next_key += 1;
        let entry = Entry {
            bytes,
            copy: Some(buf),
            below: None,
            pin: DevicePin::Auto,
            last_use: st.kept.step,
            waiting: 0,
            failed: None,
        };
        st.entries.insert(key, entry);
        let d = st.decide(key, bytes, false);
        let jobs = st.apply(key, d);
        drop(st);
        self.send(jobs);
        Ok(key)
    }

    /// Tensor `key` in device memory, for a use: uploaded from below when it is not on the
    /// device (or waited for, when an upload is under way). Its memory stays valid and
    /// unchanged while the returned buffer (or anything made of it) lives.
    pub fn get(&self, key: Key) -> Result<Arc<dyn DeviceBuffer>, TierError> {
        let started = Instant::now();
        let deadline = started + UPLOAD_WAIT;
        let mut st = self.shared.lock();
        let e = st.entries.get(&key).ok_or(TierError::Unknown(key))?;
        let (bytes, pin) = (e.bytes, e.pin);
        let hit = st.wants(key);
        let mut waited = false;
        let buf = loop {
            let e = st.entries.get_mut(&key).ok_or(TierError::Unknown(key))?;
            if let Some(c) = &e.copy {
                break c.clone();
            }
            if waited && let Some(why) = e.failed.take() {
                e.waiting -= 1;
                return Err(TierError::Device(why));
            }
            if !waited {
                e.waiting += 1;
                waited = true;
            }
            if Instant::now() >= deadline {
                e.waiting -= 1;
                return Err(TierError::Device(format!("tensor {key}: no upload to the device within {UPLOAD_WAIT:?}")));
            }
            if st.uploading.insert(key) {
                self.send(vec![Job::Up(key)]);
            }
            st = self.shared.wait(st, Duration::from_millis(100));
        };
        if waited && let Some(e) = st.entries.get_mut(&key) {
            e.waiting -= 1;
        }
        st.stats.uses += 1;
        st.stats.hits += u64::from(hit);
        if waited {
            st.stats.waits += 1;
            st.stats.stalled += started.elapsed();
        }
        let jobs = match pin {
            DevicePin::Auto => {
                let d = st.decide(key, bytes, hit);
                st.apply(key, d)
            }
            DevicePin::Device => Vec::new(),
            DevicePin::Below(_) => st.start_down(key).into_iter().collect(),
        };
        let step = st.kept.step;
        if let Some(e) = st.entries.get_mut(&key) {
            e.last_use = step;
        }
        drop(st);
        self.send(jobs);
        Ok(buf)
    }

    /// Where `key` is, how it was placed, whether it is moving or in use.
    pub fn state(&self, key: Key) -> Result<DeviceTensorState, TierError> {
        let mut st = self.shared.lock();
        st.release_deferred();
        let wanted = st.wants(key);
        let e = st.entries.get(&key).ok_or(TierError::Unknown(key))?;
        let in_use = e.in_use();
        let moving = st.uploading.contains(&key) || st.downloading.contains(&key);
        let (pin, bytes, below_key) = (e.pin, e.bytes, e.below);
        let on_device = wanted || in_use || below_key.is_none();
        drop(st);
        let (below, moving) = match (on_device, below_key) {
            (false, Some(k)) => {
                let s = self.shared.below.state(k)?;
                (Some(s.tier), moving || s.moving)
            }
            _ => (None, moving),
        };
        Ok(DeviceTensorState { below, pin, moving, in_use, deferred: in_use && !wanted, bytes })
    }

    /// Places `key` by hand (see the module docs); the move runs in the background. Pinning
    /// on the device past its budget is [`TierError::DeviceFull`]; pinning below it past
    /// the cpu tier's budget, [`TierError::CpuFull`].
    pub fn place(&self, key: Key, pin: DevicePin) -> Result<(), TierError> {
        let mut st = self.shared.lock();
        let e = st.entries.get(&key).ok_or(TierError::Unknown(key))?;
        let (bytes, was, below) = (e.bytes, e.pin, e.below);
        if pin == DevicePin::Device && was != pin && st.kept.pinned + bytes > st.kept.budget {
            return Err(TierError::DeviceFull { pinned: st.kept.pinned, budget: st.kept.budget, more: bytes });
        }
        // The tiers below place their copy now, or when it is made ([`Shared::move_down`]).
        if let (Some(k), DevicePin::Below(p)) = (below, pin) {
            drop(st);
            self.shared.below.place(k, p)?;
            st = self.shared.lock();
        } else if let (Some(k), DevicePin::Below(_)) = (below, was) {
            drop(st);
            self.shared.below.place(k, Pin::Auto)?;
            st = self.shared.lock();
        }
        let mut jobs = Vec::new();
        st.kept.unplace(key);
        if was == DevicePin::Device {
            st.kept.unpin(bytes);
        }
        if pin == DevicePin::Device {
            st.kept.pin(bytes).map_err(|(pinned, budget)| TierError::DeviceFull { pinned, budget, more: bytes })?;
        }
        if let Some(e) = st.entries.get_mut(&key) {
            e.pin = pin;
        }
        match pin {
            DevicePin::Device => jobs.extend(st.start_up(key)),
            DevicePin::Below(_) | DevicePin::Auto => jobs.extend(st.start_down(key)),
        }
        jobs.extend(st.fit_view());
        drop(st);
        self.send(jobs);
        Ok(())
    }

    /// Forgets `key`: its device memory is freed once no user holds it, its host copy
    /// removed from the tiers below.
    pub fn remove(&self, key: Key) {
        let mut st = self.shared.lock();
        let Some(e) = st.entries.remove(&key) else { return };
        st.kept.unplace(key);
        if e.pin == DevicePin::Device {
            st.kept.unpin(e.bytes);
        }
        st.deferred.remove(&key);
        drop(st);
        if let Some(k) = e.below {
            self.shared.below.remove(k);
        }
    }

    /// Declares the order of upcoming uses (the policy uploads ahead when it can).
    pub fn schedule(&self, upcoming: &[Key]) {
        let mut st = self.shared.lock();
        let with_sizes: Vec<(Key, u64)> = upcoming
            .iter()
            .filter_map(|k| st.entries.get(k).filter(|e| e.pin == DevicePin::Auto).map(|e| (*k, e.bytes)))
            .collect();
        st.kept.policy.schedule(&with_sizes);
    }

    /// The policy's name.
    pub fn policy_name(&self) -> String {
        self.shared.lock().kept.policy.name()
    }

    /// Replaces the policy: what the old one kept leaves the device (tensors placed by hand
    /// stay), and the new one decides from the next use.
    pub fn set_policy(&self, policy: Box<dyn Policy + Send>) {
        let mut st = self.shared.lock();
        let jobs: Vec<Job> = st.kept.replace_policy(policy).into_iter().filter_map(|k| st.start_down(k)).collect();
        drop(st);
        self.mover.send(jobs);
    }

    /// The budget in bytes.
    pub fn budget(&self) -> u64 {
        self.shared.lock().kept.budget
    }

    /// Changes the budget: a smaller one moves the least recently used tensors off the
    /// device (in the background); one below the bytes pinned there is refused.
    pub fn set_budget(&self, budget: u64) -> Result<(), TierError> {
        let mut st = self.shared.lock();
        st.kept.set_budget(budget).map_err(|pinned| TierError::DeviceFull { pinned, budget, more: pinned - budget })?;
        let jobs = st.fit_view();
        drop(st);
        self.send(jobs);
        Ok(())
    }

    /// Bytes placed on the device (kept by the policy and pinned). Tensors let go while in
    /// use stay beyond this until their users let go ([`DeviceStats::held_over_bytes`]).
    pub fn usage(&self) -> u64 {
        self.shared.lock().kept.used()
    }

    /// What the tier did so far.
    pub fn stats(&self) -> DeviceStats {
        let mut st = self.shared.lock();
        st.release_deferred();
        let held_over_bytes = st.held_over();
        DeviceStats { held_over_bytes, ..st.stats.clone() }
    }

    /// Waits until no move is under way (at most `timeout`), here and in the tiers below;
    /// whether none is.
    pub fn settle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.lock();
        st.release_deferred();
        while !st.uploading.is_empty() || !st.downloading.is_empty() {
            if Instant::now() >= deadline {
                return false;
            }
            st = self.shared.wait(st, Duration::from_millis(100));
        }
        drop(st);
        self.shared.below.settle(deadline.saturating_duration_since(Instant::now()))
    }

    fn send(&self, jobs: Vec<Job>) {
        self.mover.send(jobs);
    }
}

impl Drop for DeviceTier {
    fn drop(&mut self) {
        self.mover.stop();
        let st = self.shared.lock();
        let below: Vec<Key> = st.entries.values().filter_map(|e| e.below).collect();
        drop(st);
        for k in below {
            self.shared.below.remove(k);
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, st: MutexGuard<'a, State>, at_most: Duration) -> MutexGuard<'a, State> {
        self.moved.wait_timeout(st, at_most).map(|(g, _)| g).unwrap_or_else(|e| e.into_inner().0)
    }
}

impl State {
    fn decide(&mut self, key: Key, bytes: u64, hit: bool) -> Decision {
        self.kept.decide(key, bytes, hit, "device tier")
    }

    /// The moves a decision (applied to the view) needs.
    fn apply(&mut self, key: Key, d: Decision) -> Vec<Job> {
        let mut jobs = Vec::new();
        for k in d.evict.into_iter().chain((!d.keep).then_some(key)) {
            jobs.extend(self.start_down(k));
        }
        for (k, _) in d.prefetch {
            self.stats.prefetches += 1;
            jobs.extend(self.start_up(k));
        }
        jobs
    }

    /// Starts moving `key` off the device (unless it belongs there or is not there).
    fn start_down(&mut self, key: Key) -> Option<Job> {
        let wanted = self.wants(key);
        let e = self.entries.get(&key)?;
        if wanted || e.copy.is_none() || !self.downloading.insert(key) {
            return None;
        }
        Some(Job::Down(key))
    }

    /// Starts uploading `key` (unless it is on the device or on its way).
    fn start_up(&mut self, key: Key) -> Option<Job> {
        let e = self.entries.get(&key)?;
        if e.copy.is_some() || !self.uploading.insert(key) {
            return None;
        }
        Some(Job::Up(key))
    }

    /// Shrinks the policy's view to its budget (the budget less the pinned bytes), moving
    /// the least recently used tensors off the device.
    fn fit_view(&mut self) -> Vec<Job> {
        let entries = &self.entries;
        let out = self.kept.shrink(|k| entries.get(&k).map_or(0, |e| e.last_use));
        out.into_iter().filter_map(|k| self.start_down(k)).collect()
    }

    /// Drops the device copies of deferred tensors whose users let go (a deferred tensor
    /// the device wants again stays). Whether any was dropped.
    fn release_deferred(&mut self) -> bool {
        let mut released = false;
        let keys: Vec<Key> = self.deferred.iter().copied().collect();
        for k in keys {
            let wanted = self.wants(k);
            match self.entries.get_mut(&k) {
                Some(e) if !wanted && e.in_use() => continue,
                Some(e) if !wanted && e.below.is_some() => {
                    e.copy = None;
                    released = true;
                }
                _ => {}
            }
            self.deferred.remove(&k);
        }
        released
    }

    /// Drops `key`'s device copy now that its host copy exists and the device does not
    /// want it, or defers that until its users let go.
    fn drop_copy(&mut self, key: Key) {
        if self.wants(key) {
            return;
        }
        let Some(e) = self.entries.get_mut(&key) else { return };
        if e.below.is_none() {
            return;
        }
        if e.in_use() {
            let newly = self.deferred.insert(key);
            self.stats.deferred += u64::from(newly);
        } else {
            e.copy = None;
        }
    }

    fn held_over(&self) -> u64 {
        self.deferred.iter().filter_map(|k| self.entries.get(k)).filter(|e| e.copy.is_some()).map(|e| e.bytes).sum()
    }

    /// Whether `key` belongs on the device now.
    fn wants(&self, key: Key) -> bool {
        self.kept.view.contains(key) || self.entries.get(&key).is_some_and(|e| e.pin == DevicePin::Device)
    }
}
