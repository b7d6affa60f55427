//! Placement: which tensors behind references live in the fast tier, and which policy
//! decides (issue 19's Genoa and Flow).
//!
//! A two-level model: a fast tier with a byte budget (`cuda:N`, or `cpu` above `disk`) and
//! a slow tier below it that holds everything. Every use of a tensor needs it in the fast
//! tier: a use of a resident tensor is a *hit*; any other is a *miss*, and its bytes move
//! up (tensors behind references are immutable, so moving one down costs no copy: the slow
//! tier still has it). After each use the [`Policy`] says what the fast tier keeps.
//!
//! - [`Pinned`]: a fixed set stays resident; everything else is used in place from the slow
//!   tier and never moves.
//! - [`Genoa`]: promote for the use, demote right after (least fast memory, most traffic:
//!   accelerate's offload hooks).
//! - [`Lru`]: keep what was used, evict the least recently used.
//! - [`Flow`]: S3-FIFO (a small probation queue, a main queue and a ghost list: frequency
//!   decides admission to the main queue) with TinyLFU's admission test, pinning, a maximum reuse distance (DeepSpeed
//!   ZeRO-3's `max_reuse_distance`), and a declared schedule: told the order of upcoming
//!   uses, it prefetches ahead so copies overlap compute, and evicts what is used farthest
//!   ahead.
//! - [`Min`]: Belady's optimal offline policy (evict the tensor used farthest in the future,
//!   bypass one used later than all residents); the limit the others are measured against.
//!   Exact for tensors of equal size.
//!
//! [`replay`] runs a [`trace`] through a policy and reports bytes moved, hit rate and, with
//! a modelled link, stall time; `cargo xtask placement-bench` prints the table.
//!
//! [`Tiers`] applies a policy to real tensors: a cpu tier in memory above a disk tier of
//! files, with copies between them, prefetches on a background thread, and tensors held
//! for a use never changed under their holder. It can record its uses as a trace
//! ([`TierOptions::record_trace`]) for the benchmark to replay. A [`DeviceTier`] puts a
//! device (`cuda:N`) above them for tensors whose home is that device: uploads for uses and
//! ahead of them, copies down when its policy lets a tensor go.

mod device;
pub mod disk;
mod flow;
mod kept;
mod min;
mod policies;
pub mod replay;
mod tiers;
pub mod trace;

use std::collections::HashMap;

#[cfg(feature = "cuda")]
pub use device::CudaMemory;
pub use device::{DeviceMemory, DevicePin, DeviceStats, DeviceTensorState, DeviceTier};
pub use flow::{Flow, FlowOptions};
pub use min::Min;
pub use policies::{Genoa, Lru, Pinned};
pub use tiers::{DEFAULT_TRACE_LIMIT, Held, Pin, TensorState, Tier, TierError, TierOptions, TierStats, Tiers};

/// A tensor's key in a trace (a reference id, a parameter's index).
pub type Key = u64;

/// What the fast tier holds, as a policy sees it.
#[derive(Debug, Clone)]
pub struct View {
    budget: u64,
    used: u64,
    resident: HashMap<Key, u64>,
}

impl View {
    /// An empty fast tier of `budget` bytes.
    pub fn new(budget: u64) -> View {
        View { budget, used: 0, resident: HashMap::new() }
    }

    /// The fast tier's budget in bytes.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Bytes resident.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Bytes free.
    pub fn free(&self) -> u64 {
        self.budget - self.used
    }

    /// The size of resident `key`.
    pub fn bytes_of(&self, key: Key) -> Option<u64> {
        self.resident.get(&key).copied()
    }

    /// Whether `key` is resident.
    pub fn contains(&self, key: Key) -> bool {
        self.resident.contains_key(&key)
    }

    /// The resident keys and their sizes.
    pub fn resident(&self) -> impl Iterator<Item = (Key, u64)> + '_ {
        self.resident.iter().map(|(&k, &b)| (k, b))
    }

    /// Applies a policy's decision after a use of `key` (`bytes`): evictions, then the used
    /// tensor kept or let go, then prefetches. Refuses (naming what) a decision that evicts
    /// the tensor in use or one not resident, prefetches a resident one, or overfills the
    /// budget; the tier is then left partly changed (a policy bug, not a peer's input).
    pub fn apply(&mut self, d: &Decision, key: Key, bytes: u64) -> Result<(), String> {
        for &e in &d.evict {
            if e == key {
                return Err("evicted the tensor in use (say keep: false instead)".into());
            }
            if self.remove(e).is_none() {
                return Err(format!("evicted {e}, which is not resident"));
            }
        }
        if d.keep {
            self.insert(key, bytes);
        } else {
            self.remove(key);
        }
        for &(k, b) in &d.prefetch {
            if self.contains(k) {
                return Err(format!("prefetched {k}, which is resident"));
            }
            self.insert(k, b);
        }
        if self.used > self.budget {
            return Err(format!("{} bytes resident over a budget of {}", self.used, self.budget));
        }
        Ok(())
    }

    /// Changes the budget (the tiers' owner made room first, or will).
    pub(crate) fn set_budget(&mut self, budget: u64) {
        self.budget = budget;
    }

    /// Drops `key` from the tier outside a policy's decision (freed, pinned elsewhere).
    pub(crate) fn take(&mut self, key: Key) -> Option<u64> {
        self.remove(key)
    }

    fn insert(&mut self, key: Key, bytes: u64) {
        let old = self.resident.insert(key, bytes).unwrap_or(0);
        self.used = self.used - old + bytes;
    }

    fn remove(&mut self, key: Key) -> Option<u64> {
        let b = self.resident.remove(&key)?;
        self.used -= b;
        Some(b)
    }
}

/// A policy's answer after a use (see [`Policy::after_use`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// Whether the used tensor stays in (or is admitted to) the fast tier.
    pub keep: bool,
    /// Resident tensors to move down (evict) first, to make room.
    pub evict: Vec<Key>,
    /// Tensors to move up ahead of their use (each with its size), after the evictions.
    pub prefetch: Vec<(Key, u64)>,
}

/// A placement policy: after each use of a tensor, what the fast tier holds.
///
/// The replay checks every decision: evicted keys must be resident, and after it the fast
/// tier must fit its budget (a policy that breaks either is a bug, reported as an error).
pub trait Policy {
    /// Its name in reports.
    fn name(&self) -> String;

    /// The caller declares the order of upcoming uses (a model's layer order), each with
    /// its tensor's size: `upcoming` replaces any schedule declared before. Policies without
    /// prefetching ignore it.
    fn schedule(&mut self, _upcoming: &[(Key, u64)]) {}

    /// `key` (of `bytes`) was just used at step `t`; `hit` says whether it was resident.
    /// `view` is the fast tier before the decision.
    fn after_use(&mut self, t: usize, key: Key, bytes: u64, hit: bool, view: &View) -> Decision;

    /// `key` left the fast tier without the policy deciding it (its reference was freed, it
    /// was placed by hand, the tier shrank): forget what is known of it as resident.
    fn forget(&mut self, _key: Key) {}
}

/// The policies by name (`pinned`, `genoa`, `lru`, `flow`), for the benchmark and the
/// store's options. `min` needs the whole trace: see [`Min::new`].
pub fn by_name(name: &str) -> Option<Box<dyn Policy>> {
    Some(match name {
        "pinned" => Box::new(Pinned::default()),
        "genoa" => Box::new(Genoa),
        "lru" => Box::new(Lru::default()),
        "flow" => Box::new(Flow::new(FlowOptions::default())),
        _ => return None,
    })
}
