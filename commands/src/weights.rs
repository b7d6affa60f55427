//! `ferry serve-weights`: publish `.safetensors` checkpoints in a tensor store and serve it
//! (`store.open`, `store.list`, `store.publish`, `store.unpublish`).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use ferry_rpc::Server;
use ferry_store::{Store, StoreOptions};
use indicatif::{ProgressBar, ProgressStyle};

use crate::cli_rpc::{Access, ServeOptions, bind, run, stop_signal};

/// The address `ferry serve-weights` uses when none is given.
pub const DEFAULT_ADDR: &str = "unix:ferry-weights";

/// The address and the checkpoint files of `ferry serve-weights [ADDR] [FILE]... [--addr ADDR]`:
/// like `ferry serve ADDR`, the address may come first among the positional arguments, when
/// it names a transport's scheme (`unix:`, `quic://`) and is not an existing file; or with
/// `--addr`; else [`DEFAULT_ADDR`]. Two addresses, or an address after a file, are refused
/// with what to write instead.
pub fn address_and_files(positional: Vec<PathBuf>, addr: Option<String>) -> anyhow::Result<(String, Vec<PathBuf>)> {
    let is_address = |p: &PathBuf| {
        !p.exists()
            && p.to_str().is_some_and(|s| {
                ferry::transports().iter().any(|t| s.strip_prefix(t.scheme()).is_some_and(|r| r.starts_with(':')))
            })
    };
    let mut files = positional;
    let first = if files.first().is_some_and(is_address) { Some(files.remove(0)) } else { None };
    if let Some(late) = files.iter().find(|p| is_address(p)) {
        anyhow::bail!(
            "{} looks like an address, not a checkpoint file: give the address first \
             (ferry serve-weights ADDR FILE... --name NAME) or as --addr ADDR",
            late.display()
        );
    }
    let addr = match (first, addr) {
        (Some(p), Some(flag)) => anyhow::bail!(
            "two addresses: {} and --addr {flag}; give one (ferry serve-weights ADDR FILE... or --addr ADDR)",
            p.display()
        ),
        (Some(p), None) => p.to_string_lossy().into_owned(),
        (None, Some(flag)) => flag,
        (None, None) => DEFAULT_ADDR.to_owned(),
    };
    Ok((addr, files))
}

/// `ferry serve-weights`' placement options, as given (`--placement` and the options that
/// need it).
#[derive(Debug, Clone, Default)]
pub struct PlacementArgs {
    /// `--placement`: pinned, genoa, lru or flow (`None`: no tiers).
    pub policy: Option<String>,
    /// `--cpu-budget-mib`.
    pub cpu_budget_mib: Option<u64>,
    /// `--disk-budget-mib`.
    pub disk_budget_mib: Option<u64>,
    /// `--disk-dir`.
    pub disk_dir: Option<PathBuf>,
    /// `--record-trace`.
    pub record_trace: Option<PathBuf>,
    /// `--record-trace-limit`.
    pub record_trace_limit: u64,
    /// `--cuda-budget-mib`.
    pub cuda_budget_mib: Option<u64>,
    /// `--cuda-device`.
    pub cuda_device: u32,
}

/// The placement options of `args` (checked: a tier option without a policy is refused by
/// name) and, with a device tier, how kept device tensors are copied into it.
pub fn placement(args: PlacementArgs) -> anyhow::Result<(Option<ferry_store::PlacementOptions>, Option<DeviceCopy>)> {
    let placement = match args.policy {
        Some(policy) => {
            ferry_store::placement_policy(&policy).map_err(|e| anyhow::anyhow!("--placement: {e}"))?;
            let mut p = ferry_store::PlacementOptions {
                policy,
                disk_dir: args.disk_dir,
                record_trace: args.record_trace,
                trace_limit: args.record_trace_limit,
                ..Default::default()
            };
            if let Some(m) = args.cpu_budget_mib {
                p.cpu_budget_bytes = m.saturating_mul(1 << 20);
            }
            p.disk_budget_bytes = args.disk_budget_mib.map(|m| m.saturating_mul(1 << 20));
            Some(p)
        }
        None => {
            if args.cpu_budget_mib.is_some()
                || args.disk_budget_mib.is_some()
                || args.disk_dir.is_some()
                || args.record_trace.is_some()
                || args.cuda_budget_mib.is_some()
            {
                anyhow::bail!(
                    "--cpu-budget-mib, --disk-budget-mib, --disk-dir, --record-trace and \
                     --cuda-budget-mib need --placement POLICY (pinned, genoa, lru or flow)"
                );
            }
            None
        }
    };
    device_tier(placement, args.cuda_budget_mib, args.cuda_device)
}

/// `ferry serve-weights --cuda-budget-mib`: the device tier in the placement options, and
/// the server's copy of kept device tensors into its pool.
fn device_tier(
    placement: Option<ferry_store::PlacementOptions>,
    budget_mib: Option<u64>,
    device: u32,
) -> anyhow::Result<(Option<ferry_store::PlacementOptions>, Option<DeviceCopy>)> {
    let (Some(mut p), Some(mib)) = (placement.clone(), budget_mib) else { return Ok((placement, None)) };
    #[cfg(feature = "cuda-ipc")]
    {
        let chan = ferry_cuda_ipc::CudaIpcChannel::new();
        let memory = ferry_store::placement::CudaMemory::new(chan.clone(), device)
            .map_err(|e| anyhow::anyhow!("--cuda-budget-mib: the device tier on cuda:{device}: {e}"))?;
        p.device = Some(ferry_store::DeviceTierOptions {
            memory: std::sync::Arc::new(memory),
            budget_bytes: mib.saturating_mul(1 << 20),
        });
        Ok((Some(p), Some(DeviceCopy(ferry_store::device_or_shared_copy(chan)))))
    }
    #[cfg(not(feature = "cuda-ipc"))]
    {
        let _ = (&mut p, mib, device);
        anyhow::bail!(
            "--cuda-budget-mib needs ferry built with the `cuda-ipc` feature (cargo build -p ferry-cli --features cuda-ipc)"
        )
    }
}

/// The store's options of `--budget-mib` (default: half of this machine's memory),
/// `--bucket-mib` (at least 1) and digests on or off.
pub fn store_options(budget_mib: Option<u64>, bucket_mib: usize, digest: bool) -> anyhow::Result<StoreOptions> {
    let mut store = StoreOptions { digest, ..Default::default() };
    if let Some(m) = budget_mib {
        store.budget_bytes = m.saturating_mul(1 << 20);
    }
    if bucket_mib == 0 {
        anyhow::bail!("--bucket-mib 0: a bucket needs at least 1 MiB");
    }
    store.bucket_bytes = bucket_mib.saturating_mul(1 << 20);
    Ok(store)
}

/// Who may call a store server: `token` (if any) from every client, at most
/// `max_connections` at once, `ferry serve`'s answer queue limits; no HTTP.
pub fn access(token: Option<String>, max_connections: usize) -> Access {
    Access {
        token,
        allow_unauthenticated: false,
        http_allow_origins: Vec::new(),
        http_allow_hosts: Vec::new(),
        max_connections,
        max_queued_answers: 256,
        max_queued_answer_bytes: 64 << 20,
    }
}

/// What `ferry serve-weights` was asked.
#[derive(Debug, Clone)]
pub struct WeightsOptions {
    /// The checkpoint files.
    pub files: Vec<PathBuf>,
    /// The bundle name they are published under.
    pub name: String,
    /// Where to serve.
    pub addr: String,
    /// The store's options (budget, bucket size, digests).
    pub store: StoreOptions,
    /// How tensor references are placed in tiers (`None`: kept in memory).
    pub placement: Option<ferry_store::PlacementOptions>,
    /// How kept tensors are copied when the store has a device tier (device tensors into
    /// its pool; `None`: host tensors only, [`ferry_store::shared_copy`]).
    pub device_copy: Option<DeviceCopy>,
    /// How long a connection busy-polls after an answer.
    pub busy_poll: std::time::Duration,
    /// Who may call.
    pub access: Access,
}

/// How a server with a device tier copies kept tensors ([`ferry_store::device_or_shared_copy`]).
#[derive(Clone)]
pub struct DeviceCopy(pub ferry_rpc::RefCopy);

impl std::fmt::Debug for DeviceCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeviceCopy")
    }
}

/// The store's server: its methods, titled.
pub fn server(
    store: Arc<Store>,
    limits: ferry_rpc::RpcLimits,
    device_copy: Option<DeviceCopy>,
) -> anyhow::Result<Server> {
    let backing = store.placement().cloned();
    let methods = ferry_store::rpc::methods(store).context("registering the store's methods")?;
    let mut b = Server::builder(methods);
    if let Some(p) = backing {
        b = b.ref_backing(p);
    }
    Ok(b.limits(limits)
        // (kept tensors in shared segments: ferry.ref.fetch lends them over shm; device
        // tensors, with a device tier, in its pool: lent over cuda-ipc)
        .ref_copy(device_copy.map_or_else(|| std::sync::Arc::new(ferry_store::shared_copy) as _, |d| d.0))
        .title("ferry weights")
        .version(env!("CARGO_PKG_VERSION"))
        .description(
            "A tensor store (ferry-store): store.open gives a bundle's manifest and its buckets, lent zero-copy over \
             shm; store.publish makes a new version; store.list and store.unpublish.",
        )
        .build())
}

/// Publishes the files (with a progress bar on a terminal), then serves until interrupted.
pub async fn serve_weights(o: WeightsOptions) -> anyhow::Result<()> {
    let store = open_store(&o).await?;
    let served = bind_store(store, &o).await?;
    served.bound.announce()?;
    served
        .run(async {
            stop_signal().await?;
            eprintln!("ferry serve-weights: interrupted, stopping");
            Ok(())
        })
        .await
}

/// The store of `o`: made, placement enabled, `o.files` published as one bundle (with a
/// progress bar on a terminal; the digest is said on stderr when it is known).
pub async fn open_store(o: &WeightsOptions) -> anyhow::Result<Arc<Store>> {
    let store = Store::new(o.store.clone());
    if let Some(p) = &o.placement {
        let placed = store.enable_placement(p)?;
        let (cpu, disk) = placed.tiers().budgets();
        eprintln!(
            "ferry serve-weights: references placed by {} in a cpu tier of {:.1} MiB above a disk tier of {:.1} MiB in {}",
            p.policy,
            cpu as f64 / (1 << 20) as f64,
            disk as f64 / (1 << 20) as f64,
            placed.disk_dir().display()
        );
        if let Some(d) = placed.device_tier() {
            eprintln!(
                "ferry serve-weights: references kept from {} placed in a device tier of {:.1} MiB above the cpu tier",
                d.device(),
                d.budget() as f64 / (1 << 20) as f64
            );
        }
        if let Some(f) = &p.record_trace {
            eprintln!(
                "ferry serve-weights: recording the references' uses to {} (at most {})",
                f.display(),
                p.trace_limit
            );
        }
    }
    if o.files.is_empty() {
        return Ok(store);
    }
    let total: u64 = o.files.iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum();
    let bar = if std::io::stderr().is_terminal() {
        let b = ProgressBar::new(total);
        b.set_style(
            ProgressStyle::with_template("reading {msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b.set_message(o.name.clone());
        b
    } else {
        ProgressBar::hidden()
    };
    let started = std::time::Instant::now();
    let (s, files, name, b) = (store.clone(), o.files.clone(), o.name.clone(), bar.clone());
    let v = tokio::task::spawn_blocking(move || {
        ferry_store::weights::publish_safetensors(&s, &name, &files, serde_json::Value::Null, &mut |done, _| {
            b.set_position(done)
        })
    })
    .await
    .context("the publishing thread")??;
    bar.finish_and_clear();
    let m = v.manifest().clone();
    eprintln!(
        "ferry serve-weights: published {:?} version {}: {} tensors, {:.1} MiB in {} bucket(s), in {:.2} s",
        m.name,
        m.version,
        m.entries.len(),
        m.bytes as f64 / (1 << 20) as f64,
        v.bucket_tensors().len(),
        started.elapsed().as_secs_f64()
    );
    drop(v);
    // The digest is computed in the background; say it when it is known.
    std::thread::spawn(move || {
        if let Some(d) = m.wait_digest() {
            eprintln!("ferry serve-weights: {:?} version {} digest {d}", m.name, m.version);
        }
    });
    Ok(store)
}

/// A store's server bound to its address ([`bind_store`]), not serving yet.
pub struct BoundStore {
    /// The listener (its real address: [`crate::cli_rpc::Bound::addresses`]).
    pub bound: crate::cli_rpc::Bound,
    server: Server,
    store: Arc<Store>,
}

/// Binds `store`'s server to `o.addr` with `o`'s limits and access rules.
pub async fn bind_store(store: Arc<Store>, o: &WeightsOptions) -> anyhow::Result<BoundStore> {
    let limits = ferry_rpc::RpcLimits::default()
        .max_connections(o.access.max_connections)
        .max_queued_answers(o.access.max_queued_answers)
        .max_queued_answer_bytes(o.access.max_queued_answer_bytes);
    let server = server(store.clone(), limits, o.device_copy.clone())?;
    let opts = ServeOptions {
        addrs: vec![o.addr.clone()],
        http: None,
        busy_poll: o.busy_poll,
        shm_pool: None,
        access: o.access.clone(),
    };
    let bound = bind(&opts).await?;
    Ok(BoundStore { bound, server, store })
}

impl BoundStore {
    /// The store served.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Serves until `stop` ends; then writes out the placement's recorded trace, if any.
    pub async fn run(self, stop: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
        let placed = self.store.placement().cloned();
        let served = run(self.bound, &self.server, stop).await;
        // The trace is complete on exit, whoever still holds the store.
        if let Some(n) = placed.and_then(|p| p.tiers().flush_trace()) {
            eprintln!("ferry serve-weights: {n} uses recorded");
        }
        served
    }
}
