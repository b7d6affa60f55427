//! The store's tensor references placed in tiers: [`PlacedRefs`] holds the tensors the RPC
//! server keeps as references (`ferry.ref.keep`, a handler's `CallContext::keep`) in a cpu
//! tier above a disk tier ([`crate::placement::Tiers`]), moved by the store's policy.
//!
//! A store gets one with [`crate::Store::enable_placement`]; its server then holds its
//! references there ([`ferry_rpc::ServerBuilder::ref_backing`]). Without it, references
//! stay in memory as kept (the `pinned` behaviour of every store before placement).
//!
//! - A use (a call taking the reference, `ferry.ref.fetch`) reads a tensor on disk into
//!   shared memory (so a fetch over shm lends it, zero-copy), waiting for a prefetch already
//!   reading it; then the policy decides what the cpu tier keeps.
//! - A reference in use is never moved under its user: while a call or a reader (a lease
//!   on its shared memory) holds its bytes it stays in the cpu tier, unchanged; when the
//!   policy lets it go meanwhile, its move down waits until the last user lets go
//!   (`deferred`).
//! - Moves are asynchronous (a background thread); a reference can be placed by hand
//!   (`store.ref.place`), the caller can declare the order of its next uses
//!   (`store.ref.schedule`), and the policy and budgets change at run time
//!   (`store.placement.set`).
//! - A device tensor (`cuda:N`) kept as a reference stays where it is: moving between a
//!   device and the host tiers is not done yet.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use ferry_core::{Device, Storage, Tensor, TensorMeta};
use ferry_rpc::codes::NOT_FOUND;
use ferry_rpc::{ErrorObject, RefBacking};

use crate::placement::{self, Key, Pin, TensorState, TierError, TierOptions, TierStats, Tiers};

/// How a store places its references ([`crate::Store::enable_placement`]).
#[derive(Debug, Clone)]
pub struct PlacementOptions {
    /// The policy: `pinned`, `genoa`, `lru` or `flow` (default `flow`).
    pub policy: String,
    /// Bytes of references the cpu tier holds (default: a quarter of this machine's
    /// memory, or 4 GiB where it cannot be read).
    pub cpu_budget_bytes: u64,
    /// Bytes of references the disk tier holds: every reference counts there from the
    /// moment it is kept (default: the space free in `disk_dir` when the store starts).
    pub disk_budget_bytes: Option<u64>,
    /// The disk tier's directory (default: a new directory in the temp directory, removed
    /// with the store); its files are removed with the store either way.
    pub disk_dir: Option<PathBuf>,
    /// Records every use of a reference the policy sees to this trace file (JSON lines
    /// `{"key":..,"bytes":..}`, [`crate::placement::TierOptions::record_trace`]; default
    /// none), for `cargo xtask placement-bench --trace FILE`.
    pub record_trace: Option<PathBuf>,
    /// Most uses recorded to `record_trace` (default
    /// [`crate::placement::DEFAULT_TRACE_LIMIT`]); then recording stops, with a log line.
    pub trace_limit: u64,
}

impl Default for PlacementOptions {
    fn default() -> Self {
        PlacementOptions {
            policy: "flow".into(),
            cpu_budget_bytes: crate::default_budget() / 2,
            disk_budget_bytes: None,
            disk_dir: None,
            record_trace: None,
            trace_limit: placement::DEFAULT_TRACE_LIMIT,
        }
    }
}

/// The policy named `name`, or an error listing the names.
pub fn policy(name: &str) -> Result<Box<dyn placement::Policy + Send>, String> {
    let p: Box<dyn placement::Policy + Send> = match name {
        "pinned" => Box::new(placement::Pinned::default()),
        "genoa" => Box::new(placement::Genoa),
        "lru" => Box::new(placement::Lru::default()),
        "flow" => Box::new(placement::Flow::new(placement::FlowOptions::default())),
        other => return Err(format!("no placement policy {other:.40?}: pinned, genoa, lru or flow")),
    };
    Ok(p)
}

/// Where a reference is ([`PlacedRefs::state`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefState {
    /// Its tier: `cpu`, `disk`, or the device it stays on (`cuda:0`).
    pub placement: String,
    /// How it was placed by hand: `auto` (by the policy), `cpu` or `disk`.
    pub pinned: &'static str,
    /// A move is under way.
    pub moving: bool,
    /// A call or a reader holds its bytes.
    pub in_use: bool,
    /// The cpu tier let it go while in use: it stays in memory until its users let go,
    /// then goes down.
    pub deferred: bool,
    /// Its size.
    pub bytes: u64,
}

enum Held {
    Placed(Key, TensorMeta),
    /// A device tensor: not placed, held as it is.
    Fixed(Tensor),
}

/// References held in tiers (see the module docs).
pub struct PlacedRefs {
    // (Dropped in this order: the tiers stop their mover and remove their files, then the
    // directory goes if it was made here.)
    tiers: Tiers,
    refs: Mutex<HashMap<String, Held>>,
    dir: DirGuard,
}

/// The disk tier's directory; removed on drop when `own` (made by the store).
struct DirGuard {
    path: PathBuf,
    own: bool,
}

impl Drop for DirGuard {
    fn drop(&mut self) {
        if self.own {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

impl std::fmt::Debug for PlacedRefs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlacedRefs").field("dir", &self.dir.path).field("policy", &self.tiers.policy_name()).finish()
    }
}

impl PlacedRefs {
    /// Tiers for these options: an unknown policy or a directory that cannot be made is an
    /// error naming the option.
    pub fn new(opts: &PlacementOptions) -> Result<PlacedRefs, String> {
        let policy = policy(&opts.policy).map_err(|e| format!("{e} (PlacementOptions::policy)"))?;
        let (dir, own_dir) = match &opts.disk_dir {
            Some(d) => (d.clone(), false),
            None => {
                let d = std::env::temp_dir().join(format!(
                    "ferry-store-tiers-{}-{:016x}",
                    std::process::id(),
                    fastrand::u64(..)
                ));
                (d, true)
            }
        };
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("disk tier {}: {e} (PlacementOptions::disk_dir)", dir.display()))?;
        let guard = DirGuard { path: dir.clone(), own: own_dir };
        let disk_budget = opts.disk_budget_bytes.unwrap_or_else(|| free_space(&dir));
        let tier_opts = TierOptions {
            cpu_budget: opts.cpu_budget_bytes,
            disk_dir: dir.clone(),
            disk_budget,
            record_trace: opts.record_trace.clone(),
            trace_limit: opts.trace_limit,
        };
        let tiers = Tiers::new(tier_opts, policy).map_err(|e| e.to_string())?;
        Ok(PlacedRefs { tiers, refs: Mutex::new(HashMap::new()), dir: guard })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.refs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The tiers.
    pub fn tiers(&self) -> &Tiers {
        &self.tiers
    }

    /// The disk tier's directory.
    pub fn disk_dir(&self) -> &std::path::Path {
        &self.dir.path
    }

    /// Where reference `id` is.
    pub fn state(&self, id: &str) -> Result<RefState, ErrorObject> {
        let key = match self.lock().get(id) {
            None => return Err(ferry_rpc::remote::not_found(id)),
            Some(Held::Fixed(t)) => {
                let in_use = t.device_buffer().is_some_and(|b| Arc::strong_count(b) > 1);
                let (placement, bytes) = (t.device().to_string(), t.nbytes() as u64);
                return Ok(RefState { placement, pinned: "auto", moving: false, in_use, deferred: false, bytes });
            }
            Some(Held::Placed(k, _)) => *k,
        };
        let s = self.tiers.state(key).map_err(|e| tier_error(e, id))?;
        Ok(ref_state(&s))
    }

    /// Places reference `id` by hand: `cpu`, `disk`, or `auto` (back to the policy). The
    /// move runs in the background.
    pub fn place(&self, id: &str, placement: &str) -> Result<RefState, ErrorObject> {
        let pin = match placement {
            "cpu" => Pin::Cpu,
            "disk" => Pin::Disk,
            "auto" => Pin::Auto,
            other => {
                return Err(ErrorObject::invalid_params(
                    "placement",
                    format!("no placement {other:.40?}: cpu, disk or auto"),
                ));
            }
        };
        let key = match self.lock().get(id) {
            None => return Err(ferry_rpc::remote::not_found(id)),
            Some(Held::Fixed(t)) => {
                return Err(ErrorObject::invalid_params(
                    "placement",
                    format!(
                        "reference {id:.40} is on {}; moving device tensors between tiers is not supported",
                        t.device()
                    ),
                ));
            }
            Some(Held::Placed(k, _)) => *k,
        };
        self.tiers.place(key, pin).map_err(|e| tier_error(e, id))?;
        self.state(id)
    }

    /// Declares the order of the next uses of these references (the policy prefetches
    /// ahead); unknown ids and device tensors are skipped. The count scheduled.
    pub fn schedule(&self, ids: &[String]) -> usize {
        let refs = self.lock();
        let keys: Vec<Key> = ids
            .iter()
            .filter_map(|id| match refs.get(id) {
                Some(Held::Placed(k, _)) => Some(*k),
                _ => None,
            })
            .collect();
        drop(refs);
        self.tiers.schedule(&keys);
        keys.len()
    }

    /// Changes the policy and the budgets (each when given).
    pub fn configure(&self, policy_name: Option<&str>, cpu: Option<u64>, disk: Option<u64>) -> Result<(), ErrorObject> {
        let p = policy_name.map(policy).transpose().map_err(|e| ErrorObject::invalid_params("policy", e))?;
        let (old_cpu, old_disk) = self.tiers.budgets();
        if cpu.is_some() || disk.is_some() {
            self.tiers.set_budgets(cpu.unwrap_or(old_cpu), disk.unwrap_or(old_disk)).map_err(|e| tier_error(e, ""))?;
        }
        if let Some(p) = p {
            self.tiers.set_policy(p);
        }
        Ok(())
    }

    /// What the tiers did so far.
    pub fn stats(&self) -> TierStats {
        self.tiers.stats()
    }
}

impl crate::Store {
    /// Places the tensor references of this store's server in tiers ([`PlacedRefs`]:
    /// a cpu tier above a disk tier, moved by `opts.policy`); give the server
    /// [`crate::Store::placement`] as its [`ferry_rpc::ServerBuilder::ref_backing`]. Once per
    /// store; an unknown policy or a disk directory that cannot be made is an error naming
    /// the option.
    pub fn enable_placement(&self, opts: &crate::PlacementOptions) -> Result<Arc<PlacedRefs>, crate::StoreError> {
        if self.placement.get().is_some() {
            return Err(crate::StoreError::Invalid("this store already places its references".into()));
        }
        let p = Arc::new(PlacedRefs::new(opts).map_err(crate::StoreError::Invalid)?);
        Ok(self.placement.get_or_init(|| p).clone())
    }

    /// Where this store places its references, once [`crate::Store::enable_placement`] ran
    /// (`None`: they stay in memory as kept).
    pub fn placement(&self) -> Option<&Arc<PlacedRefs>> {
        self.placement.get()
    }
}

fn ref_state(s: &TensorState) -> RefState {
    let pinned = match s.pin {
        Pin::Auto => "auto",
        Pin::Cpu => "cpu",
        Pin::Disk => "disk",
    };
    RefState {
        placement: s.tier.name().into(),
        pinned,
        moving: s.moving,
        in_use: s.in_use,
        deferred: s.deferred,
        bytes: s.bytes,
    }
}

impl RefBacking for PlacedRefs {
    fn keep(&self, id: &str, tensor: Tensor) -> Result<(), ErrorObject> {
        if tensor.device() != Device::Cpu || !matches!(tensor.storage(), Storage::Host(_)) {
            self.lock().insert(id.to_owned(), Held::Fixed(tensor));
            return Ok(());
        }
        let key = self.tiers.put(tensor.bytes()).map_err(|e| tier_error(e, id))?;
        self.lock().insert(id.to_owned(), Held::Placed(key, tensor.meta().clone()));
        Ok(())
    }

    fn open(&self, id: &str) -> Result<Tensor, ErrorObject> {
        let (key, meta) = match self.lock().get(id) {
            None => return Err(ferry_rpc::remote::not_found(id)),
            Some(Held::Fixed(t)) => return Ok(t.clone()),
            Some(Held::Placed(k, m)) => (*k, m.clone()),
        };
        // A read from disk blocks: off the runtime's async work where it can be.
        let get = || self.tiers.get(key);
        let multi = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        let held = if multi { tokio::task::block_in_place(get) } else { get() };
        let held = held.map_err(|e| tier_error(e, id))?;
        Tensor::new(meta, held.bytes).map_err(|e| ErrorObject::internal(format!("reference {id:.40}: {e}")))
    }

    fn free(&self, id: &str) {
        if let Some(Held::Placed(k, _)) = self.lock().remove(id) {
            self.tiers.remove(k);
        }
    }
}

/// A tier error as a JSON-RPC error naming the store's option.
fn tier_error(e: TierError, id: &str) -> ErrorObject {
    match e {
        TierError::Unknown(_) => ErrorObject::new(NOT_FOUND, format!("reference {id:.40} is not in the tiers")),
        TierError::DiskFull { used, budget, more } => {
            let mut err =
                ErrorObject::limit("disk_budget_bytes", "bytes of references in the disk tier", used + more, budget);
            err.message = format!(
                "the store's disk tier holds {used} of its {budget} bytes; {more} more do not fit (disk_budget_bytes: \
                 PlacementOptions::disk_budget_bytes, `ferry serve-weights --disk-budget-mib`, store.placement.set)"
            );
            err
        }
        TierError::CpuFull { pinned, budget, more } => {
            let mut err = ErrorObject::limit("cpu_budget_bytes", "bytes pinned in the cpu tier", pinned + more, budget);
            err.message = format!(
                "the store's cpu tier holds {budget} bytes; {pinned} are pinned there and {more} more do not fit \
                 (cpu_budget_bytes: PlacementOptions::cpu_budget_bytes, `ferry serve-weights --cpu-budget-mib`, \
                 store.placement.set)"
            );
            err
        }
        e @ (TierError::Io { .. } | TierError::Policy(_)) => ErrorObject::internal(e),
    }
}

/// Bytes free for an unprivileged user in `dir`'s file system (unlimited where unknown).
fn free_space(dir: &std::path::Path) -> u64 {
    #[cfg(target_os = "linux")]
    if let Ok(s) = rustix::fs::statvfs(dir) {
        return s.f_bavail.saturating_mul(s.f_frsize);
    }
    let _ = dir;
    u64::MAX
}
