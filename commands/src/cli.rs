//! The `ferry` command line: its arguments (clap) and what each subcommand runs. The
//! `ferry` binary (`ferry-cli`) and the Python package's `ferry` command both call [`main`].

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ferry::DType;

use crate::bench::{self, BenchOptions};
use crate::self_exe::SelfExe;

/// ferry moves tensors between processes as fast as the hardware allows.
#[derive(Parser)]
#[command(
    name = "ferry",
    version,
    about,
    long_about = None,
    propagate_version = true,
    after_help = "Environment:\n  FERRY_LOG    log filter for stderr (tracing EnvFilter syntax): info, debug, \
                  ferry_core=debug,ferry_shm=trace\n  FERRY_TOKEN  the bearer token of serve, call and discover \
                  (--token)"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Round-trip a tensor through a second process over every compiled-in backend
    /// (p50/p99 and GB/s, beside a 64-byte round trip and a memcpy of the same bytes).
    Bench {
        /// Shape of the tensor, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1920,1080,3")]
        shape: Vec<u64>,
        /// Element type: bool, u8, i8, u16, i16, u32, i32, u64, i64, f16, bf16, f32, f64.
        #[arg(long, default_value = "f32")]
        dtype: DType,
        /// Timed round trips of the tensor.
        #[arg(long, default_value_t = 50)]
        iters: usize,
        /// Timed round trips of the 64-byte message.
        #[arg(long, default_value_t = 2000)]
        small_iters: usize,
        /// Untimed round trips before each measurement.
        #[arg(long, default_value_t = 5)]
        warmup: usize,
        /// Also measure a u8 tensor of this many MiB (0: skip).
        #[arg(long, default_value_t = 256)]
        big_mib: u64,
        /// Timed round trips of the big tensor.
        #[arg(long, default_value_t = 10)]
        big_iters: usize,
        /// Only this backend or channel (repeatable), e.g. `--only local`.
        #[arg(long)]
        only: Vec<String>,
        /// Print one JSON object per row and line instead of a table.
        #[arg(long)]
        json: bool,
        /// Skip the JSON-RPC rows (calls to `ferry serve`).
        #[arg(long)]
        no_rpc: bool,
        /// The shm memory rows' large tensor in MiB (memory given back after a param and a
        /// result of this size; this size sent after 1,000 small messages); 0: skip them.
        #[arg(long, default_value_t = 1024)]
        shm_memory_mib: u64,
        /// Measure on a busy machine: start N CPU burners (processes spinning at the default
        /// priority) beside the benchmark, killed when it ends. At most 256.
        #[arg(long, value_name = "N", default_value_t = 0)]
        load: usize,
        /// Pin the benchmark and each echo peer: both on one CPU, or on two (the first two
        /// this process may use), so that two rows compare like with like (the scheduler
        /// otherwise places each pair of processes as it likes). Linux.
        #[arg(long, value_enum)]
        placement: Option<crate::bench_place::Placement>,
    },
    /// Serve the demo JSON-RPC API (add, echo, create_tensor, sum, matmul, sleep, weights,
    /// describe, whoami; tasks; rpc.discover) to ferry clients and plain JSON-RPC clients.
    #[cfg(feature = "rpc")]
    Serve {
        /// Address to listen on (or `--addr ADDR`).
        #[arg(default_value = crate::cli_rpc::DEFAULT_ADDR)]
        addr: String,
        /// Address to listen on, as a flag (the same as the positional ADDR; give one).
        #[arg(long = "addr", value_name = "ADDR", conflicts_with = "addr")]
        addr_flag: Option<String>,
        /// Also serve JSON-RPC over HTTP POST on HOST:PORT (feature `http`).
        #[arg(long, value_name = "HOST:PORT")]
        http: Option<String>,
        /// Which API to serve: demo, or conformance (what the SDKs' conformance scenarios call).
        #[arg(long, default_value = "demo")]
        api: crate::sdk::Api,
        /// Microseconds a connection that was just answered polls its socket for the next
        /// request before it sleeps: saves a wake-up per call, costs a spinning CPU (at most
        /// half the CPUs; only while no other connection is active). Default: 50 when this
        /// process may use 2 or more CPUs, else 0; at most 1000. Many clients at once get
        /// more calls per second with 0 (and then, by default, a worker per CPU).
        #[arg(long, value_name = "US")]
        busy_poll_us: Option<u64>,
        /// Runtime worker threads. Default: when busy polling, half the CPUs this process
        /// may use (at least one), else all of them: an idle worker still wakes for every
        /// request a polling one reads, and would take a CPU from the clients. At most
        /// 1024.
        #[arg(long, value_name = "N")]
        workers: Option<usize>,
        /// Require this bearer token from every client: ferry clients (QUIC, unix) present it
        /// in their handshake, HTTP callers as `Authorization: Bearer TOKEN`. Plain JSON-RPC
        /// connections on the socket cannot, and are refused.
        #[arg(long, env = "FERRY_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Serve a QUIC or `--http` address reachable from other hosts without a token.
        #[arg(long)]
        allow_unauthenticated: bool,
        /// A browser origin (e.g. `https://app.example`) allowed to call over HTTP; requests
        /// with any other `Origin` are refused (repeatable).
        #[arg(long, value_name = "ORIGIN")]
        http_allow_origin: Vec<String>,
        /// A host name accepted in HTTP `Host` headers besides the bound address and
        /// localhost (repeatable; DNS-rebinding protection).
        #[arg(long, value_name = "NAME")]
        http_allow_host: Vec<String>,
        /// Shared memory (MiB) each connection's shm pool may hold for results sent to
        /// that client (default 2048); results wait, then fail naming this option, when it
        /// is full.
        #[arg(long, value_name = "MIB")]
        shm_pool_mib: Option<u64>,
        /// Connections served at once (ferry, plain JSON and HTTP); one more is refused with
        /// a message naming this option.
        #[arg(long, value_name = "N", default_value_t = 512)]
        max_connections: usize,
        /// Answers one connection holds that are not written yet (running calls and error
        /// answers included); at this many the server stops reading that connection until
        /// some leave, so a client that never reads its answers stalls in its own writes.
        #[arg(long, value_name = "N", default_value_t = 256)]
        max_queued_answers: usize,
        /// As --max-queued-answers, in MiB of responses (one bigger response still goes).
        #[arg(long, value_name = "MIB", default_value_t = 64)]
        max_queued_answer_mib: u64,
    },
    /// Publish `.safetensors` checkpoints in a tensor store and serve it: readers open the
    /// bundle zero-copy (Python: `ferry.open_weights(ADDR, NAME)`), `store.publish`
    /// makes new versions. With `--placement`, the tensor references clients keep
    /// (`ferry.ref.keep`) live in a cpu tier above a disk tier, moved by that policy.
    #[cfg(feature = "rpc")]
    ServeWeights {
        /// The address to listen on, then the checkpoint files (`.safetensors`), published
        /// together as one bundle (none: an empty store). The address, as in `ferry serve
        /// ADDR`, is the first argument when it starts with a scheme (`unix:`, `quic://`);
        /// default unix:ferry-weights.
        #[arg(value_name = "[ADDR] FILE")]
        files: Vec<std::path::PathBuf>,
        /// The bundle's name.
        #[arg(long)]
        name: String,
        /// Address to listen on, as a flag (the same as a first positional ADDR; give one).
        #[arg(long, value_name = "ADDR")]
        addr: Option<String>,
        /// Most MiB of buckets the store holds (latest versions, superseded versions readers
        /// still hold, versions being published); default: half of this machine's memory.
        #[arg(long, value_name = "MIB")]
        budget_mib: Option<u64>,
        /// Largest bucket in MiB for versions published over RPC (a checkpoint file is one
        /// bucket).
        #[arg(long, value_name = "MIB", default_value_t = 512)]
        bucket_mib: usize,
        /// Do not compute BLAKE3 digests of versions (readers cannot then check one).
        #[arg(long)]
        no_digest: bool,
        /// Superseded versions of each bundle the store keeps so that readers one step
        /// behind get sparse deltas, only the changed elements (`store.delta`); each costs
        /// the memory its version does not share with the next.
        #[arg(long, value_name = "N", default_value_t = 1)]
        delta_bases: usize,
        /// Place tensor references in a cpu tier above a disk tier, moved by this policy:
        /// pinned, genoa, lru or flow (default: no tiers, references stay in memory).
        #[arg(long, value_name = "POLICY")]
        placement: Option<String>,
        /// With --placement: MiB of references the cpu tier holds (default: a quarter of
        /// this machine's memory).
        #[arg(long, value_name = "MIB")]
        cpu_budget_mib: Option<u64>,
        /// With --placement: MiB of references the disk tier holds (default: the space free
        /// in --disk-dir).
        #[arg(long, value_name = "MIB")]
        disk_budget_mib: Option<u64>,
        /// With --placement: the disk tier's directory (default: a new one in the temp
        /// directory, removed on exit).
        #[arg(long, value_name = "DIR")]
        disk_dir: Option<std::path::PathBuf>,
        /// With --placement: record every use of a reference the policy sees to FILE
        /// (created or truncated), one JSON line {"key":..,"bytes":..} each, for `cargo
        /// xtask placement-bench --trace FILE` to replay; written when its buffer fills
        /// and on exit. A write error is logged and stops the recording, never a call.
        #[arg(long, value_name = "FILE")]
        record_trace: Option<std::path::PathBuf>,
        /// With --record-trace: most uses recorded; then recording stops, with a log line.
        #[arg(long, value_name = "N", default_value_t = ferry_store::placement::DEFAULT_TRACE_LIMIT)]
        record_trace_limit: u64,
        /// With --placement: a device tier of this many MiB on --cuda-device above the cpu
        /// tier, for the references clients keep from that GPU (copied on the device; each
        /// use gets them there). Needs ferry built with the `cuda-ipc` feature and a CUDA
        /// driver.
        #[arg(long, value_name = "MIB")]
        cuda_budget_mib: Option<u64>,
        /// With --cuda-budget-mib: the device tier's GPU (`cuda:N`, in this process's
        /// numbering).
        #[arg(long, value_name = "N", default_value_t = 0)]
        cuda_device: u32,
        /// Require this bearer token from every client.
        #[arg(long, env = "FERRY_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Connections served at once.
        #[arg(long, value_name = "N", default_value_t = 512)]
        max_connections: usize,
    },
    /// Generate a typed client (python or typescript) from a server's OpenRPC document.
    #[cfg(feature = "rpc")]
    Sdk {
        /// Target language: python or typescript.
        #[arg(long)]
        lang: ferry_sdk_gen::Lang,
        /// A server address (asked with rpc.discover), an OpenRPC JSON file, or a built-in
        /// API (demo, conformance).
        #[arg(long)]
        from: String,
        /// Directory to write the client into (created if missing).
        #[arg(long)]
        out: std::path::PathBuf,
        /// Module name (default: from the API's title).
        #[arg(long)]
        name: Option<String>,
        /// TypeScript: the module the runtime is imported from.
        #[arg(long, default_value = "ferry-client")]
        ts_runtime: String,
        /// Seconds to wait for the server.
        #[arg(long, default_value_t = 10.0)]
        timeout: f64,
    },
    /// Call METHOD on the server at ADDR with PARAMS (a JSON object or array) and print the
    /// result, tensors summarised.
    #[cfg(feature = "rpc")]
    Call {
        /// Server address, e.g. unix:ferry-demo.
        addr: String,
        /// Method name.
        method: String,
        /// Params: a JSON object (by name) or array (by position); `-` reads them from
        /// standard input, `@PATH` from a file; omit for none.
        params: Option<String>,
        /// Seconds to wait for the result.
        #[arg(long, default_value_t = 60.0)]
        timeout: f64,
        /// The bearer token the server requires.
        #[arg(long, env = "FERRY_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Print the OpenRPC document of the server at ADDR (rpc.discover).
    #[cfg(feature = "rpc")]
    Discover {
        /// Server address, e.g. unix:ferry-demo.
        addr: String,
        /// Seconds to wait.
        #[arg(long, default_value_t = 10.0)]
        timeout: f64,
        /// The bearer token the server requires.
        #[arg(long, env = "FERRY_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Show the compiled-in transports and channels and the protocol version.
    Info,
    /// Internal: `cargo xtask soak`, `ferry serve` under heavy and hostile load (a table).
    #[cfg(all(feature = "rpc", target_os = "linux"))]
    #[command(name = "__soak", hide = true)]
    Soak {
        /// Issue 14's full counts (200 kills each side, 1,000 idle connections, 160k
        /// calls, 63 MiB lines...); default: CI's small ones.
        #[arg(long)]
        full: bool,
    },
    /// Internal: a CPU burner of `ferry bench --load`.
    #[command(name = "__burn", hide = true)]
    Burn,
    /// Internal: the benchmark's echo peer.
    #[command(name = "__echo", hide = true)]
    Echo {
        /// Address to listen on.
        addr: String,
    },
    /// Internal: the peer of `ferry bench`'s shm memory rows.
    #[command(name = "__shm-memory-peer", hide = true)]
    ShmMemoryPeer {
        /// Address to listen on.
        addr: String,
    },
}

/// A timeout given in seconds on the command line.
#[cfg(feature = "rpc")]
fn seconds(s: f64) -> anyhow::Result<std::time::Duration> {
    std::time::Duration::try_from_secs_f64(s).map_err(|e| anyhow::anyhow!("bad timeout {s}: {e}"))
}

/// `ferry serve --busy-poll-us`, checked, or its default.
#[cfg(feature = "rpc")]
fn serve_busy_poll(busy_poll_us: Option<u64>) -> anyhow::Result<std::time::Duration> {
    if let Some(us) = busy_poll_us.filter(|&us| us > crate::cli_rpc::MAX_BUSY_POLL_US) {
        anyhow::bail!(
            "--busy-poll-us {us} is over the most allowed, {} µs: a polling connection holds a \
             runtime thread that long after each answer",
            crate::cli_rpc::MAX_BUSY_POLL_US
        );
    }
    Ok(busy_poll_us.map_or_else(crate::cli_rpc::default_busy_poll, std::time::Duration::from_micros))
}

/// `ferry serve --workers`, checked, or its default for the busy-polling window.
#[cfg(feature = "rpc")]
fn serve_workers(busy_poll_us: Option<u64>, workers: Option<usize>) -> anyhow::Result<usize> {
    let busy_poll = serve_busy_poll(busy_poll_us)?;
    match workers {
        None => Ok(crate::cli_rpc::default_workers(busy_poll)),
        Some(0) => anyhow::bail!("--workers 0: a server needs at least 1 runtime worker thread"),
        Some(n) if n > crate::cli_rpc::MAX_WORKERS => {
            anyhow::bail!("--workers {n} is over the most allowed, {}", crate::cli_rpc::MAX_WORKERS)
        }
        Some(n) => Ok(n),
    }
}

/// The runtime's worker threads for `command`: `ferry serve`'s `--workers` (or its
/// default), Tokio's default (`None`) for the rest.
fn runtime_workers(command: &Cmd) -> anyhow::Result<Option<usize>> {
    #[cfg(feature = "rpc")]
    if let Cmd::Serve { busy_poll_us, workers, .. } = command {
        return serve_workers(*busy_poll_us, *workers).map(Some);
    }
    let _ = command;
    Ok(None)
}

/// Runs the command line `args` (the program name first, as `std::env::args_os` gives it):
/// parses it, runs the subcommand on a new Tokio runtime and says on stderr why it failed.
/// `self_exe` starts another copy of this command line (the benchmark's peers, the soak).
///
/// Logging goes to stderr, filtered by `FERRY_LOG`, unless the process already has a
/// tracing subscriber. `--help`, `--version` and a bad argument print what clap says and
/// return its exit code; nothing here exits the process.
pub fn main(args: impl IntoIterator<Item = impl Into<OsString> + Clone>, self_exe: &SelfExe) -> ExitCode {
    ExitCode::from(run(args, self_exe))
}

/// [`main`], returning the exit status as a number (0: success; 1: the command failed;
/// clap's for a bad argument or `--help`), for callers that are not `main` (the Python
/// package's `ferry` command).
pub fn run(args: impl IntoIterator<Item = impl Into<OsString> + Clone>, self_exe: &SelfExe) -> u8 {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("FERRY_LOG"))
        .with_writer(std::io::stderr)
        .try_init();
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return u8::try_from(e.exit_code()).unwrap_or(2);
        }
    };
    let workers = match runtime_workers(&cli.command) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("ferry: {e:#}");
            return 1;
        }
    };
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = workers {
        builder.worker_threads(n);
    }
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ferry: cannot start the runtime: {e}");
            return 1;
        }
    };
    let r = rt.block_on(async move {
        match cli.command {
            Cmd::Bench {
                shape,
                dtype,
                iters,
                small_iters,
                warmup,
                big_mib,
                big_iters,
                only,
                json,
                no_rpc,
                shm_memory_mib,
                load,
                placement,
            } => {
                let opts = BenchOptions {
                    shape,
                    dtype,
                    iters: iters.max(1),
                    small_iters: small_iters.max(1),
                    warmup,
                    big_mib,
                    big_iters: big_iters.max(1),
                    only,
                    progress: !json,
                    peer_cpu: None,
                };
                let exe = self_exe.clone();
                // Kept to the end of this arm: dropping it kills the burners.
                let burners = crate::bench_load::Burners::start(&exe, load)?;
                if !burners.is_empty() {
                    let say = format!(
                        "under load: {} CPU burners (nice 0, pids {:?}) spin beside the benchmark on {} CPUs",
                        burners.len(),
                        burners.ids(),
                        ferry_core::spin::load::cpus()
                    );
                    if json { eprintln!("{say}") } else { println!("{say}") }
                }
                let mut opts = opts;
                if let Some(p) = placement {
                    let theirs = crate::bench_place::pin_benchmark(p)?;
                    opts.peer_cpu = Some(theirs);
                    let say = format!("pinned ({p:?}): the benchmark on one CPU, each echo peer on CPU {theirs}");
                    if json { eprintln!("{say}") } else { println!("{say}") }
                }
                // `--only shm-memory`: those rows alone.
                let memory_only = !opts.only.is_empty() && opts.only.iter().all(|o| o == "shm-memory");
                if !memory_only {
                    if !json {
                        eprintln!(
                            "ferry bench: {} round trips of {}[{}] and {} of 64 bytes per backend",
                            opts.iters,
                            opts.dtype,
                            opts.shape.iter().map(u64::to_string).collect::<Vec<_>>().join(","),
                            opts.small_iters
                        );
                    }
                    let rows = bench::run(&exe, &opts, |r| {
                        if json {
                            println!("{}", serde_json::to_string(r).unwrap_or_default());
                        }
                    })
                    .await?;
                    if !json {
                        print!("{}", bench::table(&rows));
                        println!("round trips: GB/s counts both directions; memcpy: one copy.");
                    }
                }
                #[cfg(feature = "rpc")]
                if !no_rpc && !memory_only {
                    let rows = crate::bench_rpc::run(&exe, &opts, |r| {
                        if json {
                            println!("{}", serde_json::to_string(r).unwrap_or_default());
                        }
                    })
                    .await?;
                    if !json {
                        println!();
                        print!("{}", crate::bench_rpc::table(&rows));
                        println!(
                            "JSON-RPC calls to `ferry serve` in a second process; call-add-x{}: that many clients at \
                             once; echo GB/s counts both directions.",
                            crate::bench_rpc::CLIENTS
                        );
                    }
                }
                #[cfg(not(feature = "rpc"))]
                let _ = no_rpc;
                #[cfg(all(feature = "shm", target_os = "linux"))]
                if shm_memory_mib > 0 && (opts.only.is_empty() || opts.only.iter().any(|o| o == "shm-memory")) {
                    let rows = crate::bench_shm_memory::run(&exe, shm_memory_mib).await?;
                    if json {
                        for r in &rows {
                            println!("{}", serde_json::to_string(r).unwrap_or_default());
                        }
                    } else {
                        println!();
                        print!("{}", crate::bench_shm_memory::table(&rows));
                    }
                }
                #[cfg(not(all(feature = "shm", target_os = "linux")))]
                let _ = shm_memory_mib;
                Ok(())
            }
            #[cfg(feature = "rpc")]
            Cmd::Serve {
                addr,
                addr_flag,
                http,
                api,
                busy_poll_us,
                workers: _,
                token,
                allow_unauthenticated,
                http_allow_origin,
                http_allow_host,
                shm_pool_mib,
                max_connections,
                max_queued_answers,
                max_queued_answer_mib,
            } => {
                let busy_poll = serve_busy_poll(busy_poll_us)?;
                let access = crate::cli_rpc::Access {
                    token,
                    allow_unauthenticated,
                    http_allow_origins: http_allow_origin,
                    http_allow_hosts: http_allow_host,
                    max_connections,
                    max_queued_answers,
                    max_queued_answer_bytes: max_queued_answer_mib.saturating_mul(1 << 20),
                };
                let shm_pool = shm_pool_mib.map(|m| m.saturating_mul(1 << 20));
                let addr = addr_flag.unwrap_or(addr);
                crate::cli_rpc::serve(&addr, http.as_deref(), api, busy_poll, shm_pool, &access).await
            }
            #[cfg(feature = "rpc")]
            Cmd::ServeWeights {
                files,
                name,
                addr,
                budget_mib,
                bucket_mib,
                no_digest,
                delta_bases,
                placement,
                cpu_budget_mib,
                disk_budget_mib,
                disk_dir,
                record_trace,
                record_trace_limit,
                cuda_budget_mib,
                cuda_device,
                token,
                max_connections,
            } => {
                let (placement, device_copy) = crate::weights::placement(crate::weights::PlacementArgs {
                    policy: placement,
                    cpu_budget_mib,
                    disk_budget_mib,
                    disk_dir,
                    record_trace,
                    record_trace_limit,
                    cuda_budget_mib,
                    cuda_device,
                })?;
                let mut store = crate::weights::store_options(budget_mib, bucket_mib, !no_digest)?;
                store.delta_bases = delta_bases;
                store.spare_buckets = true;
                let access = crate::weights::access(token, max_connections);
                let busy_poll = serve_busy_poll(None)?;
                let (addr, files) = crate::weights::address_and_files(files, addr)?;
                crate::weights::serve_weights(crate::weights::WeightsOptions {
                    files,
                    name,
                    addr,
                    store,
                    placement,
                    device_copy,
                    busy_poll,
                    access,
                })
                .await
            }
            #[cfg(feature = "rpc")]
            Cmd::Sdk { lang, from, out, name, ts_runtime, timeout } => {
                let files =
                    crate::sdk::generate(lang, &from, &out, name.as_deref(), &ts_runtime, seconds(timeout)?).await?;
                for f in files {
                    println!("wrote {}", f.display());
                }
                Ok(())
            }
            #[cfg(feature = "rpc")]
            Cmd::Call { addr, method, params, timeout, token } => {
                let params = params.as_deref().map(crate::cli_rpc::params_text).transpose()?;
                let v = crate::cli_rpc::call(&addr, &method, params.as_deref(), token.as_deref(), seconds(timeout)?)
                    .await?;
                println!("{}", serde_json::to_string_pretty(&v)?);
                Ok(())
            }
            #[cfg(feature = "rpc")]
            Cmd::Discover { addr, timeout, token } => {
                let doc = crate::cli_rpc::discover(&addr, token.as_deref(), seconds(timeout)?).await?;
                println!("{}", serde_json::to_string_pretty(&doc)?);
                Ok(())
            }
            Cmd::Info => {
                let ep = ferry::endpoint().build();
                println!("ferry {} (protocol version {})", env!("CARGO_PKG_VERSION"), ferry::PROTOCOL_VERSION);
                println!(
                    "transports: {}",
                    ferry::transports()
                        .iter()
                        .map(|t| format!("{} ({}:)", t.name(), t.scheme()))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                println!("channels (priority order): {}", ep.channel_names().join(", "));
                if cfg!(all(feature = "ring", target_os = "linux")) {
                    println!(
                        "same-host ring: ring (frames through shared-memory rings beside a unix: socket, where \
                         both ends ask for it: RingExt::ring)"
                    );
                } else {
                    println!("same-host ring: not compiled in (feature `ring`, Linux)");
                }
                Ok(())
            }
            Cmd::Echo { addr } => {
                crate::bench_place::pin_peer_from_env()?;
                bench::echo_peer(&addr).await
            }
            Cmd::Burn => crate::bench_load::burn(),
            #[cfg(all(feature = "shm", target_os = "linux"))]
            Cmd::ShmMemoryPeer { addr } => crate::bench_shm_memory::peer(&addr).await,
            #[cfg(not(all(feature = "shm", target_os = "linux")))]
            Cmd::ShmMemoryPeer { .. } => Err(anyhow::anyhow!("the shm memory peer needs shm (Linux)")),
            #[cfg(all(feature = "rpc", target_os = "linux"))]
            Cmd::Soak { full } => {
                let exe = self_exe.clone();
                let counts = if full { crate::soak::Counts::full() } else { crate::soak::Counts::short() };
                crate::soak::run(&exe, counts).await
            }
        }
    });
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ferry: {e:#}");
            1
        }
    }
}
