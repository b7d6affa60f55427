//! ferry-store: a tensor store of named, versioned, immutable bundles (a model's
//! state_dict), for handing weights from a trainer or a weight daemon to inference engines.
//!
//! - **Bundles and versions.** [`Store::publish`] (or [`Store::builder`], to build a
//!   version in place and publish it without a copy) makes the next version of a name.
//!   Versions are immutable. The latest is what [`Store::open`] gives by default; a
//!   superseded version lives, and can still be opened, while a reader holds it, and its
//!   memory is freed when the last reader lets go.
//! - **Buckets.** A version's tensors are laid out in a few large buckets
//!   ([`StoreOptions::bucket_bytes`], default 512 MiB), each one sealed memfd on Linux
//!   (ferry-shm's shared segments). A reader maps the buckets, zero-copy, and slices them
//!   by the manifest ([`Entry`]), so opening costs O(buckets), not O(tensors).
//! - **Digests.** Each version gets a BLAKE3 digest of its content ([`Manifest::digest`]),
//!   computed in the background after publishing (publishing stays O(1)); a reader that
//!   passes `expect_digest` waits for it and is refused on a mismatch.
//! - **Checkpoints.** [`weights::publish_safetensors`] reads `.safetensors` files into
//!   buckets and publishes them through core's [`ferry_core::SafetensorsCodec`];
//!   [`weights::publish_files`] does the same with any [`ferry_core::TensorCodec`].
//! - **RPC.** [`rpc::methods`] serves a store as `store.publish`, `store.open`,
//!   `store.list` and `store.unpublish` (PROTOCOL.md §20); `ferry serve-weights` serves
//!   one with checkpoints published.
//! - **Limits.** [`StoreOptions::budget_bytes`] bounds the bytes of live buckets; a publish
//!   past it fails with [`StoreError::Budget`], naming the option.
//! - **Placement** ([`placement`]): the policies that decide which tensors stay in a fast
//!   tier (pinned, genoa, lru, flow, and Belady's MIN as the limit), replayed on traces by
//!   `cargo xtask placement-bench`, and [`placement::Tiers`], which places real tensors
//!   in a cpu tier above a disk tier by one of them. [`Store::enable_placement`] puts the
//!   server's tensor references there ([`PlacedRefs`]; `ferry serve-weights --placement
//!   POLICY`); `store.placement.*` and `store.ref.*` ([`rpc::methods`]) show and set a
//!   reference's placement, the policy and the budgets, and declare a schedule.

mod bucket;
pub mod delta;
pub mod delta_serve;
mod device;
mod digests;
mod manifest;
mod placed;
pub mod placement;
mod refs;
pub mod replica;
pub mod rpc;
mod share;
mod store;
pub mod weights;

pub use device::{DeviceView, device_slice, plan_layout};
pub use manifest::{Columns, Entry, tree_digest};
pub use placed::{DeviceTierOptions, PlacedRefs, PlacementOptions, RefState, policy as placement_policy};
#[cfg(feature = "cuda")]
pub use refs::device_or_shared_copy;
pub use refs::{shared_copy, shared_tensor_mut};
pub use share::FromBuilder;
pub use store::{BundleBuilder, BundleStatus, HostRead, Manifest, Owner, Store, Version};

/// Options of a [`Store`].
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Most bytes of buckets alive at once: latest versions, superseded versions readers
    /// still hold, and versions being built (default: half of this machine's memory, or
    /// 16 GiB where it cannot be read).
    pub budget_bytes: u64,
    /// Largest bucket (default 512 MiB); a larger tensor gets a bucket of its own size.
    pub bucket_bytes: usize,
    /// Compute each version's BLAKE3 digest, and each tensor's, in the background
    /// (default true). Off, the tensors' digests are computed when a delta first needs them.
    pub digest: bool,
    /// Superseded versions of each name the store itself keeps alive (default 0), so that
    /// `store.delta` can send a reader still at one of them sparse deltas (the elements that
    /// changed) rather than whole tensors. Each costs the memory its version does not share
    /// with the later ones, counted in [`StoreOptions::budget_bytes`]; they are let go first
    /// when a publish would go past the budget.
    pub delta_bases: usize,
    /// Manifests (with their tensors' digests) of superseded versions remembered per name
    /// (default 64): a reader at one of them whose storage is gone gets nothing for the
    /// tensors that did not change and whole tensors for the others.
    pub delta_history: usize,
    /// After each publish, make ready in the background (at a low priority) new buckets of
    /// the sizes that publish made, their pages already in memory, for the next publish to
    /// fill (default false). Writing a version into memory never touched costs the kernel a
    /// page fault per 4 KiB (on some virtual machines more than the copy itself); with
    /// spares a publisher in a loop (a trainer) pays it between publishes, not in them.
    /// Spares count in [`StoreOptions::budget_bytes`] and are let go first when a publish
    /// would go past it.
    pub spare_buckets: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            budget_bytes: default_budget(),
            bucket_bytes: 512 << 20,
            digest: true,
            delta_bases: 0,
            delta_history: 64,
            spare_buckets: false,
        }
    }
}

/// Half of `MemTotal`, or 16 GiB.
pub(crate) fn default_budget() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024 / 2)
        })
        .unwrap_or(16 << 30)
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// No such bundle, version or tensor (or it was freed).
    #[error("not found: {0}")]
    NotFound(String),
    /// The bundle belongs to another identity.
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// Publishing would exceed [`StoreOptions::budget_bytes`].
    #[error(
        "store budget exceeded: {needed} more bytes needed, {used} in use, budget_bytes = {budget} (StoreOptions::budget_bytes, `ferry serve-weights --budget-mib`)"
    )]
    Budget {
        /// Bytes the new version needs.
        needed: u64,
        /// Bytes in use.
        used: u64,
        /// The budget.
        budget: u64,
    },
    /// The digest is not the one expected.
    #[error("digest mismatch: version {version} of {name:?} has digest {actual}, expected {expected}")]
    DigestMismatch {
        /// The bundle.
        name: String,
        /// Its version.
        version: u64,
        /// What the reader expected.
        expected: String,
        /// What it is.
        actual: String,
    },
    /// A version was made from `base`, which is no longer the latest (another publisher
    /// published in between).
    #[error("bundle {name:?}: version {base} is no longer the latest ({latest:?} is); publish against the latest")]
    Stale {
        /// The bundle.
        name: String,
        /// The version the new one was made from.
        base: u64,
        /// The latest version now (`None`: unpublished).
        latest: Option<u64>,
    },
    /// The input cannot be stored (a device tensor, a strided one, a bad checkpoint).
    #[error("invalid: {0}")]
    Invalid(String),
    /// A system call failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}
