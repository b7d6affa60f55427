//! Tensors placed across a cpu tier (memory, with a byte budget) and a disk tier (one file
//! per tensor in a directory, with a byte budget), moved by a [`Policy`].
//!
//! - [`Tiers::put`] stores a tensor (immutable from then on) and returns its key. The disk
//!   tier is the slow tier that can hold everything: each tensor counts toward its budget
//!   from its `put` (a put past it is [`TierError::DiskFull`]); its file is written on its
//!   first move down. The cpu tier holds what the policy keeps.
//! - [`Tiers::get`] returns a [`Held`] tensor in cpu memory (shared memory on Linux, so
//!   that a fetch over shm lends it): a tensor on disk is read in (a real copy), or waited
//!   for when a prefetch is already reading it. After the use the policy decides what the
//!   cpu tier keeps.
//! - **Moves are asynchronous**: demotions (file writes) and prefetches (file reads) run on
//!   a background thread; a tensor on its way down stays readable from memory until its
//!   file is written, so with a declared [`Tiers::schedule`] copies overlap the caller's
//!   compute and no use waits for a write.
//! - **Never moved under its user**: while anyone holds a tensor's bytes (a [`Held`] use, a
//!   tensor made of it, a reader's lease on its shared memory) it stays in the cpu tier,
//!   unchanged. When the policy (or a placement by hand, a smaller budget, a new policy)
//!   lets it go meanwhile, its file is written but the move itself is deferred: its memory
//!   is dropped once the last user lets go (the mover thread looks for that), and it is then
//!   on disk. [`TensorState::in_use`] says whether anyone holds it,
//!   [`TensorState::deferred`] whether it waits to go down; its bytes count in
//!   [`TierStats::held_over_bytes`] meanwhile, beyond the cpu budget the policy keeps to.
//! - **Placed by hand** ([`Tiers::place`]): a tensor pinned to the cpu tier stays there
//!   (outside the policy, its bytes taken from the policy's share of the cpu budget), one
//!   pinned to disk is read from its file for each use and never kept; [`Pin::Auto`] gives
//!   it back to the policy.
//! - **Recorded**: with [`TierOptions::record_trace`], every use the policy sees (a put,
//!   its first use, and each [`Tiers::get`] of a tensor not placed by hand) is appended to
//!   a trace file that [`crate::placement::trace::Trace::load`] reads back (keys are the
//!   tiers' keys, sizes the tensors' bytes), up to [`TierOptions::trace_limit`] uses.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::kept::{Kept, MoverThread};
use super::{Key, Policy};

mod mover;
mod record;
mod state;

use state::{Entry, Job, Mem, Shared, State};

/// Where a tensor lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// In memory.
    Cpu,
    /// In a file of the disk tier (being read in, when a prefetch is on its way).
    Disk,
}

impl Tier {
    /// `"cpu"` or `"disk"`.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Cpu => "cpu",
            Tier::Disk => "disk",
        }
    }
}

/// Where a tensor was placed by hand ([`Tiers::place`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pin {
    /// Where the policy decides.
    #[default]
    Auto,
    /// Pinned in the cpu tier.
    Cpu,
    /// Pinned on disk: each use reads it from its file.
    Disk,
}

/// Errors of [`Tiers`].
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    /// No tensor has this key.
    #[error("no tensor {0} in the tiers")]
    Unknown(Key),
    /// The disk tier is full.
    #[error("the disk tier holds {used} of its {budget} bytes; {more} more do not fit (TierOptions::disk_budget)")]
    DiskFull {
        /// Bytes on disk.
        used: u64,
        /// `TierOptions::disk_budget`.
        budget: u64,
        /// The tensor that did not fit.
        more: u64,
    },
    /// Tensors pinned in the cpu tier would exceed its budget.
    #[error(
        "the cpu tier's budget is {budget} bytes; {pinned} are pinned there, {more} more do not fit (TierOptions::cpu_budget)"
    )]
    CpuFull {
        /// Bytes pinned in the cpu tier.
        pinned: u64,
        /// `TierOptions::cpu_budget`.
        budget: u64,
        /// The tensor (or the shortfall) that did not fit.
        more: u64,
    },
    /// Reading or writing the disk tier failed.
    #[error("disk tier {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Tensors pinned on the device tier would exceed its budget.
    #[error(
        "the device tier's budget is {budget} bytes; {pinned} are pinned there, {more} more do not fit \
         (PlacementOptions::device budget_bytes)"
    )]
    DeviceFull {
        /// Bytes pinned on the device.
        pinned: u64,
        /// The device tier's budget.
        budget: u64,
        /// The tensor (or the shortfall) that did not fit.
        more: u64,
    },
    /// A copy to or from the device tier failed, or a tensor was on another device.
    #[error("device tier: {0}")]
    Device(String),
    /// The policy broke the rules (a bug of the policy).
    #[error("placement policy: {0}")]
    Policy(String),
}

/// Options of [`Tiers`].
#[derive(Debug, Clone)]
pub struct TierOptions {
    /// Bytes the cpu tier may hold.
    pub cpu_budget: u64,
    /// The disk tier's directory (created mode 0700 if missing; its files are mode 0600 and
    /// removed on drop). The tiers hold its lock ([`crate::placement::disk`]) while they
    /// live: a directory another live store holds is an error, and tensor files a dead one
    /// left there are removed.
    pub disk_dir: PathBuf,
    /// Bytes the disk tier may hold (default unlimited).
    pub disk_budget: u64,
    /// Records every use the policy sees to this file (created, or truncated), one JSON
    /// line `{"key":..,"bytes":..}` each as [`crate::placement::trace::Trace::save`]
    /// writes: buffered, flushed by [`Tiers::flush_trace`] and when the tiers are dropped.
    /// A write error is logged once and recording stops; a use never fails for it.
    pub record_trace: Option<PathBuf>,
    /// Most uses recorded to [`TierOptions::record_trace`]; then recording stops, with a
    /// log line (default [`DEFAULT_TRACE_LIMIT`]).
    pub trace_limit: u64,
}

/// Uses recorded to a trace file at most, unless [`TierOptions::trace_limit`] says
/// otherwise: 10 million lines, about 300 MB.
pub const DEFAULT_TRACE_LIMIT: u64 = 10_000_000;

impl TierOptions {
    /// A cpu tier of `cpu_budget` bytes above an unlimited disk tier in `disk_dir`.
    pub fn new(cpu_budget: u64, disk_dir: impl Into<PathBuf>) -> TierOptions {
        TierOptions {
            cpu_budget,
            disk_dir: disk_dir.into(),
            disk_budget: u64::MAX,
            record_trace: None,
            trace_limit: DEFAULT_TRACE_LIMIT,
        }
    }
}

/// What the tiers did so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Uses ([`Tiers::get`]).
    pub uses: u64,
    /// Uses of a tensor placed in the cpu tier (kept there, pinned, or prefetched ahead of
    /// the use): the policy's hits, whether or not its bytes had arrived.
    pub hits: u64,
    /// Uses that waited for bytes from disk (read them, or waited for a prefetch).
    pub waits: u64,
    /// Bytes read from disk into memory (uses and prefetches).
    pub bytes_read: u64,
    /// Bytes written to disk (each tensor at most once).
    pub bytes_written: u64,
    /// Prefetches started.
    pub prefetches: u64,
    /// Time uses spent waiting for bytes from disk (read themselves, or a prefetch).
    pub stalled: Duration,
    /// The last background move that failed, if any (the tensor stayed where it was).
    pub last_error: Option<String>,
    /// Moves down deferred because the tensor was in use (each counted once per deferral).
    pub deferred: u64,
    /// Bytes of tensors waiting for their users to let go before they go down: in memory
    /// beyond the bytes the policy keeps in the cpu tier ([`Tiers::usage`]).
    pub held_over_bytes: u64,
}

/// Where one tensor is ([`Tiers::state`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorState {
    /// Its tier now (what its next use finds, once `moving` ends).
    pub tier: Tier,
    /// How it was placed by hand.
    pub pin: Pin,
    /// A move to or from disk is under way.
    pub moving: bool,
    /// Someone holds its bytes (a use, a reader's mapping).
    pub in_use: bool,
    /// The cpu tier let it go while it was in use: it stays in memory (`tier` is
    /// [`Tier::Cpu`]) and goes down when its users let go.
    pub deferred: bool,
    /// Its size.
    pub bytes: u64,
}

/// Tensors across a cpu and a disk tier (see the module docs).
pub struct Tiers {
    shared: Arc<Shared>,
    mover: MoverThread<Job>,
    /// The disk tier directory's lock, let go (after the files are removed) on drop.
    _lock: super::disk::DirLock,
}

/// A tensor in cpu memory, held for a use: its bytes stay valid and unchanged while held.
#[derive(Debug, Clone)]
pub struct Held {
    /// The tensor's key.
    pub key: Key,
    /// Its bytes.
    pub bytes: Bytes,
}

/// Longest a use waits for a prefetch before reading the file itself.
const PREFETCH_WAIT: Duration = Duration::from_secs(60);

impl Tiers {
    /// Tiers with these options and placement policy. A trace file that cannot be created
    /// ([`TierOptions::record_trace`]) is an error naming it, and so is a disk directory
    /// another live store holds.
    pub fn new(opts: TierOptions, policy: Box<dyn Policy + Send>) -> Result<Tiers, TierError> {
        Self::with_lock(opts, policy, None)
    }

    /// [`Tiers::new`] in a directory whose lock the caller took already (`lock`), else
    /// taken here.
    pub(crate) fn with_lock(
        opts: TierOptions,
        policy: Box<dyn Policy + Send>,
        lock: Option<super::disk::DirLock>,
    ) -> Result<Tiers, TierError> {
        let io = |source| TierError::Io { path: opts.disk_dir.clone(), source };
        let lock = match lock {
            Some(l) => l,
            None => {
                super::disk::make_private_dir(&opts.disk_dir).map_err(io)?;
                super::disk::lock_for_tiers(&opts.disk_dir).map_err(io)?
            }
        };
        let recorder = match &opts.record_trace {
            Some(path) => Some(
                record::Recorder::create(path, opts.trace_limit)
                    .map_err(|source| TierError::Io { path: path.clone(), source })?,
            ),
            None => None,
        };
        let state = State {
            kept: Kept::new(opts.cpu_budget, policy),
            entries: HashMap::new(),
            next_key: 0,
            disk_used: 0,
            disk_budget: opts.disk_budget,
            reading: HashSet::new(),
            writing: HashSet::new(),
            deferred: HashSet::new(),
            stats: TierStats::default(),
            recorder,
        };
        let shared = Arc::new(Shared { state: Mutex::new(state), moved: Condvar::new(), dir: opts.disk_dir });
        let mover = MoverThread::spawn("ferry-tiers-mover", shared.clone())
            .map_err(|source| TierError::Io { path: PathBuf::from("<mover thread>"), source })?;
        Ok(Tiers { shared, mover, _lock: lock })
    }

    /// Stores a tensor; returns its key. Its placement is the policy's decision after this
    /// first "use"; a tensor the cpu tier does not keep is written to disk in the
    /// background. Bytes already in a shared segment are kept where they are; others are
    /// copied once into one.
    pub fn put(&self, data: Bytes) -> Result<Key, TierError> {
        let bytes = data.len() as u64;
        let mem = mover::to_mem(&data).map_err(|source| TierError::Io { path: PathBuf::from("<memory>"), source })?;
        let mut st = self.shared.lock();
        if st.disk_used.saturating_add(bytes) > st.disk_budget {
            return Err(TierError::DiskFull { used: st.disk_used, budget: st.disk_budget, more: bytes });
        }
        st.disk_used += bytes;
        let key = st.next_key;
        st.next_key += 1;
        let entry = Entry { bytes, cpu: Some(mem), on_disk: false, pin: Pin::Auto, last_use: st.kept.step };
        st.entries.insert(key, entry);
        let d = st.decide(key, bytes, false);
        let jobs = st.apply(key, d);
        drop(st);
        self.send(jobs);
        Ok(key)
    }

    /// The tensor `key` in cpu memory, for a use (see the module docs).
    pub fn get(&self, key: Key) -> Result<Held, TierError> {
        let mut st = self.shared.lock();
        let e = st.entries.get(&key).ok_or(TierError::Unknown(key))?;
        let (bytes, pin) = (e.bytes, e.pin);
        let hit = st.kept.view.contains(key) || pin == Pin::Cpu;
        let started = Instant::now();
        let mut waited = false;
        let mut read_here = false;
        let deadline = started + PREFETCH_WAIT;
        let mem = loop {
            let e = st.entries.get(&key).ok_or(TierError::Unknown(key))?;
            if let Some(m) = &e.cpu {
                break m.clone();
            }
            if !st.reading.contains(&key) || Instant::now() >= deadline {
                // On disk and nobody reading it in: read it here (outside the lock).
                drop(st);
                let m = self.shared.read_file(key, bytes)?;
                read_here = true;
                st = self.shared.lock();
                break m;
            }
            waited = true;
            // A prefetch is reading it in: wait for it (bounded by `deadline`).
            st = self
                .shared
                .moved
                .wait_timeout(st, Duration::from_millis(100))
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        };
        st.stats.uses += 1;
        st.stats.hits += u64::from(hit);
        if read_here {
            st.stats.bytes_read += bytes;
        }
        if waited || read_here {
            st.stats.waits += 1;
            st.stats.stalled += started.elapsed();
        }
        // Every use is served from the entry's cpu copy, so that its users are seen (a
        // prefetch that landed meanwhile is used instead of this read).
        let mem = match st.entries.get_mut(&key) {
            Some(e) => e.cpu.get_or_insert(mem).clone(),
            None => mem,
        };
        let jobs = match pin {
            Pin::Auto => {
                let d = st.decide(key, bytes, hit);
                st.apply(key, d)
            }
            Pin::Cpu => Vec::new(),
            // Used from its file: the copy goes once its users let go.
            Pin::Disk => st.start_write(key).into_iter().collect(),
        };
        let step = st.kept.step;
        if let Some(e) = st.entries.get_mut(&key) {
            e.last_use = step;
        }
        drop(st);
        self.send(jobs);
        Ok(Held { key, bytes: mem.bytes() })
    }

    /// Where `key` lives now.
    pub fn placement(&self, key: Key) -> Result<Tier, TierError> {
        self.state(key).map(|s| s.tier)
    }

    /// Where `key` is, how it was placed, whether it is moving or in use.
    pub fn state(&self, key: Key) -> Result<TensorState, TierError> {
        let mut st = self.shared.lock();
        st.release_deferred();
        let wanted = st.wants_cpu(key);
        let e = st.entries.get(&key).ok_or(TierError::Unknown(key))?;
        let in_use = e.cpu.as_ref().is_some_and(Mem::in_use);
        let tier = if wanted || in_use { Tier::Cpu } else { Tier::Disk };
        let moving = st.reading.contains(&key) || st.writing.contains(&key);
        Ok(TensorState { tier, pin: e.pin, moving, in_use, deferred: in_use && !wanted, bytes: e.bytes })
    }

    /// Places `key` by hand (see the module docs); the move runs in the background.
    /// Pinning to the cpu tier past its budget is [`TierError::CpuFull`].
    pub fn place(&self, key: Key, pin: Pin) -> Result<(), TierError> {
        let mut st = self.shared.lock();
        let e = st.entries.get(&key).ok_or(TierError::Unknown(key))?;
        let (bytes, was) = (e.bytes, e.pin);
        if was == pin {
            return Ok(());
        }
        if pin == Pin::Cpu && st.kept.pinned + bytes > st.kept.budget {
            return Err(TierError::CpuFull { pinned: st.kept.pinned, budget: st.kept.budget, more: bytes });
        }
        let mut jobs = Vec::new();
        st.kept.unplace(key);
        if was == Pin::Cpu {
            st.kept.unpin(bytes);
        }
        if pin == Pin::Cpu {
            st.kept.pin(bytes).map_err(|(pinned, budget)| TierError::CpuFull { pinned, budget, more: bytes })?;
        }
        if let Some(e) = st.entries.get_mut(&key) {
            e.pin = pin;
        }
        match pin {
            Pin::Cpu => jobs.extend(st.start_read(key)),
            // (Given back to the policy from memory: it goes down, and comes back by the policy.)
            Pin::Disk | Pin::Auto => jobs.extend(st.start_write(key)),
        }
        jobs.extend(st.fit_view());
        drop(st);
        self.send(jobs);
        Ok(())
    }

    /// Forgets `key`: its memory is freed once no user holds it, its file removed.
    pub fn remove(&self, key: Key) {
        let mut st = self.shared.lock();
        let Some(e) = st.entries.remove(&key) else { return };
        st.kept.unplace(key);
        if e.pin == Pin::Cpu {
            st.kept.unpin(e.bytes);
        }
        st.disk_used -= e.bytes;
        drop(st);
        if e.on_disk {
            let _ = std::fs::remove_file(self.shared.path(key));
        }
    }

    /// Declares the order of upcoming uses (the policy prefetches ahead when it can).
    pub fn schedule(&self, upcoming: &[Key]) {
        let mut st = self.shared.lock();
        let with_sizes: Vec<(Key, u64)> = upcoming
            .iter()
            .filter_map(|k| st.entries.get(k).filter(|e| e.pin == Pin::Auto).map(|e| (*k, e.bytes)))
            .collect();
        st.kept.policy.schedule(&with_sizes);
    }

    /// The policy's name.
    pub fn policy_name(&self) -> String {
        self.shared.lock().kept.policy.name()
    }

    /// Replaces the policy. The cpu tier starts over: every tensor the old policy kept goes
    /// down (those already on disk cost nothing) and the new one decides from the next use;
    /// tensors placed by hand stay.
    pub fn set_policy(&self, policy: Box<dyn Policy + Send>) {
        let mut st = self.shared.lock();
        let jobs: Vec<Job> = st.kept.replace_policy(policy).into_iter().filter_map(|k| st.start_write(k)).collect();
        drop(st);
        self.send(jobs);
    }

    /// The budgets (cpu, disk) in bytes.
    pub fn budgets(&self) -> (u64, u64) {
        let st = self.shared.lock();
        (st.kept.budget, st.disk_budget)
    }

    /// Changes the budgets. A smaller cpu tier moves its least recently used tensors down
    /// (in the background); a cpu budget below the bytes pinned there, or a disk budget
    /// below the bytes stored, is refused.
    pub fn set_budgets(&self, cpu: u64, disk: u64) -> Result<(), TierError> {
        let mut st = self.shared.lock();
        if disk < st.disk_used {
            return Err(TierError::DiskFull { used: st.disk_used, budget: disk, more: 0 });
        }
        st.kept.set_budget(cpu).map_err(|pinned| TierError::CpuFull { pinned, budget: cpu, more: pinned - cpu })?;
        st.disk_budget = disk;
        let jobs = st.fit_view();
        drop(st);
        self.send(jobs);
        Ok(())
    }

    /// Bytes in the cpu tier (kept by the policy and pinned) and counted on disk. Tensors
    /// the cpu tier let go while in use stay in memory beyond this until their users let go
    /// ([`TierStats::held_over_bytes`]).
    pub fn usage(&self) -> (u64, u64) {
        let st = self.shared.lock();
        (st.kept.used(), st.disk_used)
    }

    /// What the tiers did so far.
    pub fn stats(&self) -> TierStats {
        let mut st = self.shared.lock();
        st.release_deferred();
        let held_over_bytes = st.held_over();
        TierStats { held_over_bytes, ..st.stats.clone() }
    }

    /// Waits until no move is under way (at most `timeout`); whether none is. Moves
    /// deferred for users who still hold their tensor do not count: those whose users let
    /// go end here.
    pub fn settle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.lock();
        st.release_deferred();
        while !st.reading.is_empty() || !st.writing.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = self
                .shared
                .moved
                .wait_timeout(st, left.min(Duration::from_millis(100)))
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        true
    }

    /// Writes the uses recorded so far to the trace file ([`TierOptions::record_trace`]);
    /// how many were recorded (`None` when no trace is).
    pub fn flush_trace(&self) -> Option<u64> {
        let mut st = self.shared.lock();
        let r = st.recorder.as_mut()?;
        r.flush();
        Some(r.lines())
    }

    fn send(&self, jobs: Vec<Job>) {
        self.mover.send(jobs);
    }
}

impl Drop for Tiers {
    fn drop(&mut self) {
        self.mover.stop();
        let mut st = self.shared.lock();
        if let Some(r) = st.recorder.as_mut() {
            r.flush();
        }
        for (k, e) in &st.entries {
            if e.on_disk {
                let _ = std::fs::remove_file(self.shared.path(*k));
            }
        }
    }
}
