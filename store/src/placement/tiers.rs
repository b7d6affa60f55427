//! Tensors placed across a cpu tier (memory, with a byte budget) and a disk tier (one file
//! per tensor in a directory, with a byte budget), moved by a [`Policy`].
//!
//! - [`Tiers::put`] stores a tensor (immutable from then on) and returns its key; it lands
//!   in the cpu tier when the policy keeps it there, else on disk.
//! - [`Tiers::get`] returns a [`Held`] tensor in cpu memory: a tensor on disk is read in
//!   (a real copy), or waited for when a prefetch is already reading it. After the use the
//!   policy decides what the cpu tier keeps; its prefetches are read by a background thread,
//!   so that with a declared [`Tiers::schedule`] copies overlap the caller's compute.
//! - **Never moved under its user**: a [`Held`] tensor keeps its bytes alive and unchanged
//!   until dropped, even when the policy moves the tensor to disk meanwhile (its memory is
//!   then freed when the last holder lets go; the budget counts it from the move).
//! - A tensor demoted for the first time is written to disk once; later demotions only drop
//!   the cpu copy (the file stays: tensors are immutable).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;

use super::{Decision, Key, Policy, View};

/// Where a tensor lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// In memory.
    Cpu,
    /// In a file of the disk tier (being read in, when a prefetch is on its way).
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
    /// Reading or writing the disk tier failed.
    #[error("disk tier {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The policy broke the rules (a bug of the policy).
    #[error("placement policy: {0}")]
    Policy(String),
}

/// Options of [`Tiers`].
#[derive(Debug, Clone)]
pub struct TierOptions {
    /// Bytes the cpu tier may hold.
    pub cpu_budget: u64,
    /// The disk tier's directory (created if missing; its files are removed on drop).
    pub disk_dir: PathBuf,
    /// Bytes the disk tier may hold (default unlimited).
    pub disk_budget: u64,
}

impl TierOptions {
    /// A cpu tier of `cpu_budget` bytes above an unlimited disk tier in `disk_dir`.
    pub fn new(cpu_budget: u64, disk_dir: impl Into<PathBuf>) -> TierOptions {
        TierOptions { cpu_budget, disk_dir: disk_dir.into(), disk_budget: u64::MAX }
    }
}

struct Entry {
    bytes: u64,
    /// The cpu copy, when the tensor is in the cpu tier and has arrived.
    cpu: Option<Bytes>,
    /// Whether its file exists.
    on_disk: bool,
}

struct State {
    view: View,
    policy: Box<dyn Policy + Send>,
    entries: HashMap<Key, Entry>,
    next_key: Key,
    disk_used: u64,
    step: usize,
    /// Prefetches decided and not done: a use of one waits for it.
    pending: std::collections::HashSet<Key>,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when a prefetch arrives.
    arrived: Condvar,
    opts: TierOptions,
}

/// Tensors across a cpu and a disk tier (see the module docs).
pub struct Tiers {
    shared: Arc<Shared>,
    prefetch: Mutex<Option<mpsc::Sender<Key>>>,
    worker: Option<std::thread::JoinHandle<()>>,
}

/// A tensor in cpu memory, held for a use: its bytes stay valid and unchanged while held.
#[derive(Debug, Clone)]
pub struct Held {
    /// The tensor's key.
    pub key: Key,
    /// Its bytes.
    pub bytes: Bytes,
}

impl Tiers {
    /// Tiers with these options and placement policy.
    pub fn new(opts: TierOptions, policy: Box<dyn Policy + Send>) -> Result<Tiers, TierError> {
        std::fs::create_dir_all(&opts.disk_dir)
            .map_err(|source| TierError::Io { path: opts.disk_dir.clone(), source })?;
        let state = State {
            view: View::new(opts.cpu_budget),
            policy,
            entries: HashMap::new(),
            next_key: 0,
            disk_used: 0,
            step: 0,
            pending: Default::default(),
        };
        let shared = Arc::new(Shared { state: Mutex::new(state), arrived: Condvar::new(), opts });
        let (tx, rx) = mpsc::channel::<Key>();
        let worker_shared = shared.clone();
        let worker = std::thread::Builder::new()
            .name("ferry-tiers-prefetch".into())
            .spawn(move || {
                for key in rx {
                    worker_shared.read_in(key);
                }
            })
            .map_err(|source| TierError::Io { path: PathBuf::from("<prefetch thread>"), source })?;
        Ok(Tiers { shared, prefetch: Mutex::new(Some(tx)), worker: Some(worker) })
    }

    /// Stores a tensor; returns its key. Its placement is the policy's decision after this
    /// first "use"; a tensor the cpu tier does not keep is written to disk.
    pub fn put(&self, data: Bytes) -> Result<Key, TierError> {
        let bytes = data.len() as u64;
        let mut st = self.shared.lock();
        let key = st.next_key;
        st.next_key += 1;
        st.entries.insert(key, Entry { bytes, cpu: Some(data), on_disk: false });
        let d = st.decide(key, bytes, false);
        drop(st);
        self.apply(key, d)?;
        Ok(key)
    }

    /// The tensor `key` in cpu memory, for a use (see the module docs).
    pub fn get(&self, key: Key) -> Result<Held, TierError> {
        let mut st = self.shared.lock();
        let bytes = st.entries.get(&key).ok_or(TierError::Unknown(key))?.bytes;
        let hit = st.view.contains(key);
        let data = loop {
            let e = st.entries.get(&key).ok_or(TierError::Unknown(key))?;
            if let Some(b) = &e.cpu {
                break b.clone();
            }
            if !st.pending.contains(&key) {
                // On disk and nobody reading it in: read it here (outside the lock).
                drop(st);
                let b = self.shared.read_file(key)?;
                st = self.shared.lock();
                break b;
            }
            // A prefetch is reading it in: wait for it (it always ends: `read_in`).
            st = self
                .shared
                .arrived
                .wait_timeout(st, Duration::from_secs(1))
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        };
        let d = st.decide(key, bytes, hit);
        if d.keep
            && let Some(e) = st.entries.get_mut(&key)
        {
            e.cpu = Some(data.clone());
        }
        drop(st);
        self.apply(key, d)?;
        Ok(Held { key, bytes: data })
    }

    /// Where `key` lives now.
    pub fn placement(&self, key: Key) -> Result<Tier, TierError> {
        let st = self.shared.lock();
        st.entries.get(&key).ok_or(TierError::Unknown(key))?;
        Ok(if st.view.contains(key) { Tier::Cpu } else { Tier::Disk })
    }

    /// Declares the order of upcoming uses (the policy prefetches ahead when it can).
    pub fn schedule(&self, upcoming: &[Key]) {
        let mut st = self.shared.lock();
        let with_sizes: Vec<(Key, u64)> =
            upcoming.iter().filter_map(|k| st.entries.get(k).map(|e| (*k, e.bytes))).collect();
        st.policy.schedule(&with_sizes);
    }

    /// Bytes in the cpu tier and on disk.
    pub fn usage(&self) -> (u64, u64) {
        let st = self.shared.lock();
        (st.view.used(), st.disk_used)
    }

    /// Applies a decision made under the lock: demotions write files (once), prefetches go
    /// to the background thread.
    fn apply(&self, key: Key, d: Decision) -> Result<(), TierError> {
        let mut demote: Vec<Key> = d.evict.clone();
        if !d.keep {
            demote.push(key);
        }
        for k in demote {
            self.shared.demote(k)?;
        }
        if !d.prefetch.is_empty() {
            let tx = self.prefetch.lock().unwrap_or_else(|e| e.into_inner());
            for &(k, _) in &d.prefetch {
                if let Some(tx) = tx.as_ref() {
                    let _ = tx.send(k);
                }
            }
        }
        Ok(())
    }
}

impl Drop for Tiers {
    fn drop(&mut self) {
        self.prefetch.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
        let st = self.shared.lock();
        for (k, e) in &st.entries {
            if e.on_disk {
                let _ = std::fs::remove_file(self.shared.path(*k));
            }
        }
    }
}

impl State {
    /// Asks the policy after a use and applies the decision to the view.
    fn decide(&mut self, key: Key, bytes: u64, hit: bool) -> Decision {
        let step = self.step;
        self.step += 1;
        let d = self.policy.after_use(step, key, bytes, hit, &self.view);
        match self.view.apply(&d, key, bytes) {
            Ok(()) => {
                self.pending.extend(d.prefetch.iter().map(|&(k, _)| k));
                d
            }
            Err(e) => {
                // A policy bug: keep the tier consistent by letting this tensor go.
                tracing::error!("placement policy {}: {e}", self.policy.name());
                Decision { keep: false, ..Decision::default() }
            }
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn path(&self, key: Key) -> PathBuf {
        self.opts.disk_dir.join(format!("{key}.tensor"))
    }

    fn read_file(&self, key: Key) -> Result<Bytes, TierError> {
        let path = self.path(key);
        std::fs::read(&path).map(Bytes::from).map_err(|source| TierError::Io { path, source })
    }

    /// Moves `key` to disk: its file written the first time, its cpu copy dropped (memory a
    /// holder still uses is freed when it lets go).
    fn demote(&self, key: Key) -> Result<(), TierError> {
        let mut st = self.lock();
        let Some(e) = st.entries.get(&key) else { return Ok(()) };
        if st.view.contains(key) {
            // Kept again meanwhile (a later decision).
            return Ok(());
        }
        let (bytes, on_disk, cpu) = (e.bytes, e.on_disk, e.cpu.clone());
        if !on_disk {
            if st.disk_used + bytes > self.opts.disk_budget {
                return Err(TierError::DiskFull { used: st.disk_used, budget: self.opts.disk_budget, more: bytes });
            }
            let Some(data) = cpu else { return Ok(()) };
            st.disk_used += bytes;
            drop(st);
            let written = write_file(&self.path(key), &data);
            st = self.lock();
            if let Err(e) = written {
                st.disk_used -= bytes;
                return Err(e);
            }
        }
        let resident = st.view.contains(key);
        if let Some(e) = st.entries.get_mut(&key) {
            e.on_disk = true;
            if !resident {
                e.cpu = None;
            }
        }
        Ok(())
    }

    /// The prefetch thread: reads `key` in if the cpu tier still wants it; either way the
    /// prefetch ends (a use waiting for it wakes).
    fn read_in(&self, key: Key) {
        let wanted = {
            let st = self.lock();
            st.entries.get(&key).is_some_and(|e| e.cpu.is_none()) && st.view.contains(key)
        };
        let read = wanted.then(|| self.read_file(key));
        let mut st = self.lock();
        match read {
            Some(Ok(b)) => {
                if st.view.contains(key)
                    && let Some(e) = st.entries.get_mut(&key)
                {
                    e.cpu = Some(b);
                }
            }
            // The use reads it itself, and reports the error.
            Some(Err(e)) => tracing::warn!("prefetch of tensor {key}: {e}"),
            None => {}
        }
        st.pending.remove(&key);
        drop(st);
        self.arrived.notify_all();
    }
}

fn write_file(path: &Path, data: &[u8]) -> Result<(), TierError> {
    std::fs::write(path, data).map_err(|source| TierError::Io { path: path.to_owned(), source })
}
