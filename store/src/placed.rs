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
//! - A device tensor kept as a reference has the device as its home: every use gets it in
//!   device memory. With a device tier for its device ([`PlacementOptions::device`], a
//!   [`DeviceTier`] of its own budget and policy), it is kept on the device or below it
//!   (the cpu tier, disk) as the policies decide, uploaded for a use or ahead of it; a
//!   reference on another device stays where it is.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use ferry_core::{Device, Storage, Tensor, TensorMeta};
use ferry_rpc::codes::NOT_FOUND;
use ferry_rpc::{ErrorObject, RefBacking};

use crate::placement::{
    self, DeviceMemory, DevicePin, DeviceStats, DeviceTensorState, DeviceTier, Key, Pin, TensorState, TierError,
    TierOptions, TierStats, Tiers,
};

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
    /// with the store, and removed by the next store to start if this one was killed); its
    /// files are removed with the store either way. Made mode 0700 where missing, its files
    /// 0600; one store at a time holds it ([`crate::placement::disk`]).
    pub disk_dir: Option<PathBuf>,
    /// Records every use of a reference the policy sees to this trace file (JSON lines
    /// `{"key":..,"bytes":..}`, [`crate::placement::TierOptions::record_trace`]; default
    /// none), for `cargo xtask placement-bench --trace FILE`.
    pub record_trace: Option<PathBuf>,
    /// Most uses recorded to `record_trace` (default
    /// [`crate::placement::DEFAULT_TRACE_LIMIT`]); then recording stops, with a log line.
    pub trace_limit: u64,
    /// A device tier (`cuda:N`) above the cpu tier for references kept from that device
    /// (default none: they stay on the device as kept).
    pub device: Option<DeviceTierOptions>,
}

/// A device tier for a store's references ([`PlacementOptions::device`]).
#[derive(Clone)]
pub struct DeviceTierOptions {
    /// The device's memory (with the `cuda` feature, [`crate::placement::CudaMemory`]).
    pub memory: Arc<dyn DeviceMemory>,
    /// Bytes of references the device tier holds.
    pub budget_bytes: u64,
}

impl std::fmt::Debug for DeviceTierOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceTierOptions")
            .field("device", &self.memory.device())
            .field("budget_bytes", &self.budget_bytes)
            .finish()
    }
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
            device: None,
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
    /// Its tier: `cpu`, `disk`, or a device (`cuda:0`: on the device tier, or a device
    /// without one, where it stays).
    pub placement: String,
    /// How it was placed by hand: `auto` (by the policy), `cpu`, `disk`, or its device.
    pub pinned: String,
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
    /// A tensor homed on the device tier's device.
    Device(Key, TensorMeta),
    /// A device tensor without a device tier: not placed, held as it is.
    Fixed(Tensor),
}

/// References held in tiers (see the module docs).
pub struct PlacedRefs {
    // (Dropped in this order: the device tier stops its mover, the tiers stop theirs and
    // remove their files, then the directory goes if it was made here.)
    device: Option<DeviceTier>,
    tiers: Arc<Tiers>,
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
        let policy = placement_policy(&opts.policy)?;
        let (dir, own_dir, lock) = match &opts.disk_dir {
            Some(d) => (d.clone(), false, None),
            None => {
                let tmp = std::env::temp_dir();
                // What stores killed before they could remove theirs left.
                placement::disk::remove_leftovers(&tmp);
                let (d, lock) = placement::disk::make_own_dir(&tmp)
                    .map_err(|e| format!("disk tier in {}: {e} (PlacementOptions::disk_dir, TMPDIR)", tmp.display()))?;
                (d, true, Some(lock))
            }
        };
        let guard = DirGuard { path: dir.clone(), own: own_dir };
        let disk_budget = opts.disk_budget_bytes.unwrap_or_else(|| free_space(&dir));
        let tier_opts = TierOptions {
            cpu_budget: opts.cpu_budget_bytes,
            disk_dir: dir.clone(),
            disk_budget,
            record_trace: opts.record_trace.clone(),
            trace_limit: opts.trace_limit,
        };
        let tiers = Arc::new(Tiers::with_lock(tier_opts, policy, lock).map_err(|e| match &e {
            TierError::Io { path, .. } if *path == dir => format!("{e} (PlacementOptions::disk_dir)"),
            _ => e.to_string(),
        })?);
        let device = match &opts.device {
            Some(d) => {
                let policy = placement_policy(&opts.policy)?;
                Some(
                    DeviceTier::new(d.memory.clone(), d.budget_bytes, policy, tiers.clone())
                        .map_err(|e| e.to_string())?,
                )
            }
            None => None,
        };
        Ok(PlacedRefs { device, tiers, refs: Mutex::new(HashMap::new()), dir: guard })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.refs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The tiers.
    pub fn tiers(&self) -> &Tiers {
        &self.tiers
    }

    /// The device tier, if any ([`PlacementOptions::device`]).
    pub fn device_tier(&self) -> Option<&DeviceTier> {
        self.device.as_ref()
    }

    fn device_or_gone(&self, id: &str) -> Result<&DeviceTier, ErrorObject> {
        self.device.as_ref().ok_or_else(|| ferry_rpc::remote::not_found(id))
    }

    /// The disk tier's directory.
    pub fn disk_dir(&self) -> &std::path::Path {
        &self.dir.path
    }

    /// Where reference `id` is.
    pub fn state(&self, id: &str) -> Result<RefState, ErrorObject> {
        // (The references' lock is let go before a tier is asked: the tiers may take it.)
        let (key, device) = match self.lock().get(id) {
            None => return Err(ferry_rpc::remote::not_found(id)),
            Some(Held::Fixed(t)) => {
                let in_use = t.device_buffer().is_some_and(|b| Arc::strong_count(b) > 1);
                let (placement, bytes) = (t.device().to_string(), t.nbytes() as u64);
                return Ok(RefState {
                    placement,
                    pinned: "auto".into(),
                    moving: false,
                    in_use,
                    deferred: false,
                    bytes,
                });
            }
            Some(Held::Device(k, _)) => (*k, true),
            Some(Held::Placed(k, _)) => (*k, false),
        };
        if device {
            let d = self.device_or_gone(id)?;
            let s = d.state(key).map_err(|e| tier_error(e, id))?;
            return Ok(device_ref_state(&s, d.device()));
        }
        let s = self.tiers.state(key).map_err(|e| tier_error(e, id))?;
        Ok(ref_state(&s))
    }

    /// Places reference `id` by hand: `cpu`, `disk`, `auto` (back to the policy), or, for
    /// a reference homed on the device tier's device, that device (`cuda:0`). The move runs
    /// in the background.
    pub fn place(&self, id: &str, placement: &str) -> Result<RefState, ErrorObject> {
        let pin = match placement {
            "cpu" => Pin::Cpu,
            "disk" => Pin::Disk,
            "auto" => Pin::Auto,
            other => {
                let on_tier = self.device.as_ref().map(|d| d.device().to_string());
                if on_tier.as_deref() == Some(other) {
                    return self.place_on_device(id, DevicePin::Device);
                }
                let names = match &on_tier {
                    Some(d) => format!("cpu, disk, auto or {d}"),
                    None => "cpu, disk or auto".into(),
                };
                return Err(ErrorObject::invalid_params("placement", format!("no placement {other:.40?}: {names}")));
            }
        };
        let key = match self.lock().get(id) {
            None => return Err(ferry_rpc::remote::not_found(id)),
            Some(Held::Device(..)) => None,
            Some(Held::Fixed(t)) => {
                return Err(ErrorObject::invalid_params(
                    "placement",
                    format!(
                        "reference {id:.40} is on {}; moving device tensors between tiers is not supported",
                        t.device()
                    ),
                ));
            }
            Some(Held::Placed(k, _)) => Some(*k),
        };
        let Some(key) = key else {
            let pin = if pin == Pin::Auto { DevicePin::Auto } else { DevicePin::Below(pin) };
            return self.place_on_device(id, pin);
        };
        self.tiers.place(key, pin).map_err(|e| tier_error(e, id))?;
        self.state(id)
    }

    fn place_on_device(&self, id: &str, pin: DevicePin) -> Result<RefState, ErrorObject> {
        let key = match self.lock().get(id) {
            None => return Err(ferry_rpc::remote::not_found(id)),
            Some(Held::Device(k, _)) => *k,
            Some(Held::Placed(..) | Held::Fixed(_)) => {
                return Err(ErrorObject::invalid_params(
                    "placement",
                    format!("reference {id:.40} was not kept from the device tier's device: it cannot go there"),
                ));
            }
        };
        self.device_or_gone(id)?.place(key, pin).map_err(|e| tier_error(e, id))?;
        self.state(id)
    }

    /// Declares the order of the next uses of these references (the policy prefetches
    /// ahead); unknown ids and device tensors are skipped. The count scheduled.
    pub fn schedule(&self, ids: &[String]) -> usize {
        let refs = self.lock();
        let (mut host, mut device) = (Vec::new(), Vec::new());
        for id in ids {
            match refs.get(id) {
                Some(Held::Placed(k, _)) => host.push(*k),
                Some(Held::Device(k, _)) => device.push(*k),
                _ => {}
            }
        }
        drop(refs);
        self.tiers.schedule(&host);
        if let Some(d) = &self.device {
            d.schedule(&device);
        }
        host.len() + device.len()
    }

    /// Changes the policy (of every tier) and the budgets (each when given). A device
    /// budget on a store without a device tier is INVALID_PARAMS.
    pub fn configure(
        &self,
        policy_name: Option<&str>,
        cpu: Option<u64>,
        disk: Option<u64>,
        device: Option<u64>,
    ) -> Result<(), ErrorObject> {
        let p = policy_name.map(policy).transpose().map_err(|e| ErrorObject::invalid_params("policy", e))?;
        if device.is_some() && self.device.is_none() {
            return Err(ErrorObject::invalid_params(
                "device_budget_bytes",
                "this store has no device tier (PlacementOptions::device, `ferry serve-weights --cuda-budget-mib`)",
            ));
        }
        let (old_cpu, old_disk) = self.tiers.budgets();
        if cpu.is_some() || disk.is_some() {
            self.tiers.set_budgets(cpu.unwrap_or(old_cpu), disk.unwrap_or(old_disk)).map_err(|e| tier_error(e, ""))?;
        }
        if let (Some(d), Some(b)) = (&self.device, device) {
            d.set_budget(b).map_err(|e| tier_error(e, ""))?;
        }
        if let Some(name) = policy_name.filter(|_| p.is_some())
            && let Some(d) = &self.device
        {
            d.set_policy(policy(name).map_err(|e| ErrorObject::invalid_params("policy", e))?);
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

    /// What the device tier did so far, if there is one.
    pub fn device_stats(&self) -> Option<DeviceStats> {
        self.device.as_ref().map(DeviceTier::stats)
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

fn pin_name(p: Pin) -> &'static str {
    match p {
        Pin::Auto => "auto",
        Pin::Cpu => "cpu",
        Pin::Disk => "disk",
    }
}

fn ref_state(s: &TensorState) -> RefState {
    RefState {
        placement: s.tier.name().into(),
        pinned: pin_name(s.pin).into(),
        moving: s.moving,
        in_use: s.in_use,
        deferred: s.deferred,
        bytes: s.bytes,
    }
}

fn device_ref_state(s: &DeviceTensorState, device: Device) -> RefState {
    let pinned = match s.pin {
        DevicePin::Auto => "auto".into(),
        DevicePin::Device => device.to_string(),
        DevicePin::Below(p) => pin_name(p).into(),
    };
    RefState {
        placement: s.below.map_or_else(|| device.to_string(), |t| t.name().into()),
        pinned,
        moving: s.moving,
        in_use: s.in_use,
        deferred: s.deferred,
        bytes: s.bytes,
    }
}

/// Runs a use's `get`, which may block on a copy: off the runtime's async work where it
/// can be.
fn blocking<T>(get: impl FnOnce() -> T) -> T {
    let multi = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if multi { tokio::task::block_in_place(get) } else { get() }
}

impl RefBacking for PlacedRefs {
    fn keep(&self, id: &str, tensor: Tensor) -> Result<(), ErrorObject> {
        if let Some(d) = &self.device
            && tensor.device() == d.device()
            && let Some(buf) = tensor.device_buffer()
        {
            let key = d.put(buf.clone()).map_err(|e| tier_error(e, id))?;
            self.lock().insert(id.to_owned(), Held::Device(key, tensor.meta().clone()));
            return Ok(());
        }
        if tensor.device() != Device::Cpu || !matches!(tensor.storage(), Storage::Host(_)) {
            self.lock().insert(id.to_owned(), Held::Fixed(tensor));
            return Ok(());
        }
        let key = self.tiers.put(tensor.bytes()).map_err(|e| tier_error(e, id))?;
        self.lock().insert(id.to_owned(), Held::Placed(key, tensor.meta().clone()));
        Ok(())
    }

    fn open(&self, id: &str) -> Result<Tensor, ErrorObject> {
        // (The references' lock is not held through a use's wait for its bytes.)
        let (key, meta, device) = match self.lock().get(id) {
            None => return Err(ferry_rpc::remote::not_found(id)),
            Some(Held::Fixed(t)) => return Ok(t.clone()),
            Some(Held::Device(k, m)) => (*k, m.clone(), true),
            Some(Held::Placed(k, m)) => (*k, m.clone(), false),
        };
        if device {
            let d = self.device_or_gone(id)?;
            let buf = blocking(|| d.get(key)).map_err(|e| tier_error(e, id))?;
            return Tensor::from_device(meta, buf)
                .map_err(|e| ErrorObject::internal(format!("reference {id:.40}: {e}")));
        }
        let held = blocking(|| self.tiers.get(key)).map_err(|e| tier_error(e, id))?;
        Tensor::new(meta, held.bytes).map_err(|e| ErrorObject::internal(format!("reference {id:.40}: {e}")))
    }

    fn free(&self, id: &str) {
        match self.lock().remove(id) {
            Some(Held::Placed(k, _)) => self.tiers.remove(k),
            Some(Held::Device(k, _)) => {
                if let Some(d) = &self.device {
                    d.remove(k);
                }
            }
            _ => {}
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
        TierError::DeviceFull { pinned, budget, more } => {
            let mut err =
                ErrorObject::limit("device_budget_bytes", "bytes pinned on the device tier", pinned + more, budget);
            err.message = format!(
                "the store's device tier holds {budget} bytes; {pinned} are pinned there and {more} more do not fit \
                 (device_budget_bytes: PlacementOptions::device, `ferry serve-weights --cuda-budget-mib`, \
                 store.placement.set)"
            );
            err
        }
        e @ (TierError::Io { .. } | TierError::Policy(_) | TierError::Device(_)) => ErrorObject::internal(e),
    }
}

/// The policy named `name`, or an error naming the option.
fn placement_policy(name: &str) -> Result<Box<dyn placement::Policy + Send>, String> {
    policy(name).map_err(|e| format!("{e} (PlacementOptions::policy)"))
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
