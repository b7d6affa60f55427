//! The tiers' bookkeeping: where each tensor is, what the policy holds, which moves are
//! under way. Everything here runs under the tiers' lock and does no I/O: it decides the
//! moves ([`Job`]s) that the mover thread ([`super::mover`]) carries out.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Condvar, Mutex};

use bytes::Bytes;

use super::record::Recorder;
use super::{Pin, TierStats};
use crate::bucket::Bucket;
use crate::placement::kept::Kept;
use crate::placement::{Decision, Key};

/// A tensor's bytes in memory: a range of a bucket (shared memory on Linux).
#[derive(Clone)]
pub(super) struct Mem {
    pub(super) bucket: Bucket,
    pub(super) off: usize,
    pub(super) len: usize,
}

impl Mem {
    pub(super) fn bytes(&self) -> Bytes {
        self.bucket.bytes(self.off, self.len).unwrap_or_default()
    }

    /// Whether anyone besides the tiers holds this memory: a use's [`super::Held`] bytes, a
    /// tensor made of them, a reader's lease on the shared segment (the shm channel keeps
    /// the segment while its peer maps it). Memory that others hold for their own reasons
    /// (a bundle's bucket a tensor was put from) counts too: dropping the tiers' copy would
    /// free nothing. Elsewhere than Linux readers get copies and users' [`Bytes`] keep the
    /// memory alive by themselves: nothing to wait for.
    pub(super) fn in_use(&self) -> bool {
        cfg!(target_os = "linux") && !self.bucket.is_last()
    }
}

pub(super) struct Entry {
    pub(super) bytes: u64,
    /// The cpu copy: while in the cpu tier, on its way down, or in use (every use is served
    /// from it, so that its users are seen).
    pub(super) cpu: Option<Mem>,
    /// Whether its file exists.
    pub(super) on_disk: bool,
    pub(super) pin: Pin,
    pub(super) last_use: usize,
}

/// A move for the background thread.
pub(super) enum Job {
    Up(Key),
    Down(Key),
}

pub(super) struct State {
    /// The cpu tier's policy, its share of the tier (the cpu budget less the pinned bytes)
    /// and the bytes pinned there.
    pub(super) kept: Kept,
    pub(super) entries: HashMap<Key, Entry>,
    pub(super) next_key: Key,
    /// Bytes counted on disk: every tensor's, from its put.
    pub(super) disk_used: u64,
    pub(super) disk_budget: u64,
    /// Reads in flight: a use of one waits for it.
    pub(super) reading: HashSet<Key>,
    /// Writes in flight.
    pub(super) writing: HashSet<Key>,
    /// Tensors the cpu tier let go (the policy, a placement by hand) whose cpu copy stays
    /// because a user holds it: dropped when the last user lets go
    /// ([`State::release_deferred`]).
    pub(super) deferred: HashSet<Key>,
    pub(super) stats: TierStats,
    /// Where uses are recorded ([`super::TierOptions::record_trace`]).
    pub(super) recorder: Option<Recorder>,
}

pub(super) struct Shared {
    pub(super) state: Mutex<State>,
    /// Signalled when a move ends.
    pub(super) moved: Condvar,
    pub(super) dir: PathBuf,
}

impl State {
    /// Asks the policy after a use and applies the decision to the view. The use is
    /// recorded when a trace is (every use the policy sees, in order).
    pub(super) fn decide(&mut self, key: Key, bytes: u64, hit: bool) -> Decision {
        if let Some(r) = self.recorder.as_mut() {
            r.record(key, bytes);
        }
        self.kept.decide(key, bytes, hit, "cpu tier")
    }

    /// The moves a decision (applied to the view) needs.
    pub(super) fn apply(&mut self, key: Key, d: Decision) -> Vec<Job> {
        let mut jobs = Vec::new();
        for k in d.evict.into_iter().chain((!d.keep).then_some(key)) {
            jobs.extend(self.start_write(k));
        }
        for (k, _) in d.prefetch {
            self.stats.prefetches += 1;
            jobs.extend(self.start_read(k));
        }
        jobs
    }

    /// Starts moving `key` down (unless it belongs in the cpu tier or has no cpu copy).
    pub(super) fn start_write(&mut self, key: Key) -> Option<Job> {
        let cpu_tier = self.kept.view.contains(key);
        let e = self.entries.get(&key)?;
        if cpu_tier || e.pin == Pin::Cpu || e.cpu.is_none() || !self.writing.insert(key) {
            return None;
        }
        Some(Job::Down(key))
    }

    /// Starts reading `key` in (unless its bytes are in memory or already coming).
    pub(super) fn start_read(&mut self, key: Key) -> Option<Job> {
        let e = self.entries.get(&key)?;
        if e.cpu.is_some() || !self.reading.insert(key) {
            return None;
        }
        Some(Job::Up(key))
    }

    /// Shrinks the policy's view to its budget (the cpu budget less the pinned bytes),
    /// moving the least recently used tensors down.
    pub(super) fn fit_view(&mut self) -> Vec<Job> {
        let entries = &self.entries;
        let out = self.kept.shrink(|k| entries.get(&k).map_or(0, |e| e.last_use));
        out.into_iter().filter_map(|k| self.start_write(k)).collect()
    }

    /// Ends the deferred moves whose users let go: their cpu copies are dropped (their
    /// files are written). A deferred tensor the cpu tier wants again stays. Whether any
    /// copy was dropped.
    pub(super) fn release_deferred(&mut self) -> bool {
        if self.deferred.is_empty() {
            return false;
        }
        let mut released = false;
        let keys: Vec<Key> = self.deferred.iter().copied().collect();
        for k in keys {
            let wanted = self.wants_cpu(k);
            match self.entries.get_mut(&k) {
                Some(e) if !wanted && e.cpu.as_ref().is_some_and(Mem::in_use) => continue,
                Some(e) if !wanted && e.on_disk => {
                    e.cpu = None;
                    released = true;
                }
                _ => {}
            }
            self.deferred.remove(&k);
        }
        released
    }

    /// Drops `key`'s cpu copy now that its file is written and the cpu tier does not want
    /// it, or defers that until its users let go.
    pub(super) fn drop_cpu_copy(&mut self, key: Key) {
        if self.wants_cpu(key) {
            return;
        }
        let Some(e) = self.entries.get_mut(&key) else { return };
        if !e.on_disk {
            return;
        }
        match &e.cpu {
            Some(m) if m.in_use() => {
                let newly = self.deferred.insert(key);
                self.stats.deferred += u64::from(newly);
            }
            Some(_) => e.cpu = None,
            None => {}
        }
    }

    /// Bytes of deferred tensors still in memory beyond the cpu tier's placed bytes.
    pub(super) fn held_over(&self) -> u64 {
        self.deferred.iter().filter_map(|k| self.entries.get(k)).filter(|e| e.cpu.is_some()).map(|e| e.bytes).sum()
    }

    /// Whether `key`'s bytes belong in memory now.
    pub(super) fn wants_cpu(&self, key: Key) -> bool {
        self.kept.view.contains(key) || self.entries.get(&key).is_some_and(|e| e.pin == Pin::Cpu)
    }
}
