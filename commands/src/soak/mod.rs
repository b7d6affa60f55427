//! `ferry __soak` (run by `cargo xtask soak`): a real `ferry serve` under heavy and hostile
//! load, one phase at a time, while a canary client calls `add` over shared memory. Each
//! phase prints a row: the server's peak and settled RSS, its descriptors and memfd
//! mappings, the bytes in `/dev/shm`, the canary's p50/p99, and what the phase checked.
//!
//! The short mode (CI) uses small counts; `--full` the counts of issue 14: kill loops of
//! 200 clients and 200 servers, 1,000 idle and 100 slowloris connections, 64 clients for
//! 160k calls, floods of 4 GiB frame claims, unread answers, 63 MiB `[0,0,...]` lines,
//! 16 MiB message headers, 256 MiB inline results, and a CPU-bound neighbour.
//!
//! A phase's check fails the run (exit 1) when the server stops answering, a hostile input
//! is not refused by name, or resources are not given back; speed is reported, never
//! asserted (the machine is shared).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ferry_rpc::Client;

use crate::bench::{ChildProcess, start_child};
use crate::self_exe::SelfExe;

mod conn_owner;
mod phases;
mod ring_peers;

/// How hard to push.
#[derive(Debug, Clone, Copy)]
pub struct Counts {
    pub(crate) kills: usize,
    pub(crate) idle: usize,
    pub(crate) slowloris: usize,
    pub(crate) clients: usize,
    pub(crate) calls: usize,
    pub(crate) frame_claims: usize,
    pub(crate) unread_requests: usize,
    pub(crate) zeros_line_mib: usize,
    pub(crate) header_mib: usize,
    pub(crate) inline_mib: usize,
    pub(crate) hold: Duration,
    pub(crate) full: bool,
}

impl Counts {
    /// CI's counts: every phase, small.
    pub fn short() -> Counts {
        Counts {
            kills: 10,
            idle: 100,
            slowloris: 10,
            clients: 16,
            calls: 8_000,
            frame_claims: 2,
            unread_requests: 5_000,
            zeros_line_mib: 8,
            header_mib: 4,
            inline_mib: 96,
            hold: Duration::from_secs(1),
            full: false,
        }
    }

    /// Issue 14's counts.
    pub fn full() -> Counts {
        Counts {
            kills: 200,
            idle: 1000,
            slowloris: 100,
            clients: 64,
            calls: 160_000,
            frame_claims: 8,
            unread_requests: 40_000,
            zeros_line_mib: 63,
            header_mib: 16,
            inline_mib: 256,
            hold: Duration::from_secs(5),
            full: true,
        }
    }
}

/// One process's resources, from `/proc`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Usage {
    pub(crate) rss_kib: u64,
    pub(crate) fds: usize,
    pub(crate) memfd_maps: usize,
}

pub(crate) fn usage(pid: u32) -> Usage {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0);
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let memfd_maps = maps.lines().filter(|l| l.contains("/memfd:")).count();
    Usage { rss_kib, fds, memfd_maps }
}

/// Bytes of the files in `/dev/shm` (POSIX shared memory left behind would show here).
pub(crate) fn dev_shm_bytes() -> u64 {
    std::fs::read_dir("/dev/shm").map(|d| d.filter_map(|e| e.ok()?.metadata().ok()).map(|m| m.len()).sum()).unwrap_or(0)
}

/// Samples a process's RSS every 5 ms in a thread; [`Sampler::take_peak`] gives the peak
/// since the last take.
pub(crate) struct Sampler {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Sampler {
    fn start(pid: u32) -> Sampler {
        let (peak, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let (p, s) = (peak.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                p.fetch_max(usage(pid).rss_kib, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Sampler { peak, stop }
    }

    pub(crate) fn take_peak(&self) -> u64 {
        self.peak.swap(0, Ordering::Relaxed)
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The canary: a client calling `add` over shm all along, its latencies kept per phase. It
/// runs on a thread and runtime of its own, so the phases' hostile clients (in this process
/// too) cannot delay it: what it measures is the server.
pub(crate) struct Canary {
    samples: Arc<Mutex<Vec<Duration>>>,
    failures: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Canary {
    async fn start(addr: &str) -> anyhow::Result<Canary> {
        let (samples, failures, stop) =
            (Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let (s, f, st) = (samples.clone(), failures.clone(), stop.clone());
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let addr = addr.to_owned();
        let thread = std::thread::Builder::new().name("soak-canary".into()).spawn(move || {
            runtime.block_on(async move {
                let client = match connect(&addr).await {
                    Ok(c) => {
                        let _ = ready_tx.send(Ok(()));
                        c
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let mut i = 0u64;
                while !st.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let r = client.call::<_, f64>("add", &(i as f64, 1.0)).await;
                    let took = t.elapsed();
                    if matches!(r, Ok(v) if v == i as f64 + 1.0) {
                        s.lock().unwrap_or_else(|e| e.into_inner()).push(took);
                    } else {
                        f.fetch_add(1, Ordering::Relaxed);
                    }
                    i += 1;
                    // About 1,000 calls a second: a client, not a load.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
        })?;
        tokio::task::spawn_blocking(move || ready_rx.recv())
            .await?
            .context("the canary's thread ended before connecting")??;
        Ok(Canary { samples, failures, stop, thread })
    }

    /// The calls since the last take: (count, p50, p99, failures).
    pub(crate) fn take(&self) -> (usize, Duration, Duration, u64) {
        let mut v = std::mem::take(&mut *self.samples.lock().unwrap_or_else(|e| e.into_inner()));
        v.sort_unstable();
        let q = |f: f64| v.get(((v.len() as f64 - 1.0) * f).round() as usize).copied().unwrap_or_default();
        (v.len(), q(0.5), q(0.99), self.failures.swap(0, Ordering::Relaxed))
    }

    async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread;
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
}

/// A client over the fastest channel (shm), calls bounded by 60 s.
pub(crate) async fn connect(addr: &str) -> anyhow::Result<Client> {
    let pipe = tokio::time::timeout(Duration::from_secs(20), ferry::endpoint().build().connect(addr))
        .await
        .context("connecting: timed out")?
        .with_context(|| format!("connecting to {addr}"))?;
    Ok(Client::new(pipe).with_timeout(Some(Duration::from_secs(60))))
}

/// A `ferry serve` child (demo API) on a fresh abstract address.
pub(crate) struct Served {
    pub(crate) addr: String,
    pub(crate) pid: u32,
    pub(crate) child: ChildProcess,
}

pub(crate) fn serve(exe: &SelfExe, tag: &str, extra: &[&str]) -> anyhow::Result<Served> {
    static N: AtomicU64 = AtomicU64::new(0);
    let addr = format!("unix:ferry-soak-{}-{tag}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
    let mut args = vec!["serve", addr.as_str()];
    args.extend_from_slice(extra);
    let (child, _) = start_child(exe, &args, "listening on")?;
    let pid = child.id();
    Ok(Served { addr, pid, child })
}

/// One phase's row.
pub(crate) struct Row {
    pub(crate) phase: String,
    pub(crate) peak_mib: f64,
    pub(crate) after: Usage,
    pub(crate) shm_mib: f64,
    pub(crate) canary: (usize, Duration, Duration, u64),
    pub(crate) check: Result<String, String>,
}

fn print_header() {
    println!(
        "{:<34} {:>9} {:>9} {:>6} {:>6} {:>8} {:>7} {:>9} {:>9}  check",
        "phase", "peak MiB", "RSS MiB", "fds", "memfd", "shm MiB", "canary", "p50 µs", "p99 µs"
    );
}

fn print_row(r: &Row) {
    let (n, p50, p99, failed) = r.canary;
    let check = match &r.check {
        Ok(s) => format!("ok: {s}"),
        Err(s) => format!("FAILED: {s}"),
    };
    let failed = if failed > 0 { format!(" ({failed} canary calls failed)") } else { String::new() };
    println!(
        "{:<34} {:>9.1} {:>9.1} {:>6} {:>6} {:>8.1} {:>7} {:>9.0} {:>9.0}  {check}{failed}",
        r.phase,
        r.peak_mib,
        r.after.rss_kib as f64 / 1024.0,
        r.after.fds,
        r.after.memfd_maps,
        r.shm_mib,
        n,
        p50.as_secs_f64() * 1e6,
        p99.as_secs_f64() * 1e6,
    );
}

/// What a phase body sees.
pub(crate) struct Ctx {
    pub(crate) exe: SelfExe,
    pub(crate) server: Served,
    pub(crate) counts: Counts,
    pub(crate) idle: Usage,
}

/// Runs every phase against one server (and the kill loops against their own); prints the
/// table; fails if a check failed.
pub async fn run(exe: &SelfExe, counts: Counts) -> anyhow::Result<()> {
    #[cfg(unix)]
    crate::cli_rpc::raise_fd_limit();
    let max_conn = (counts.idle + counts.slowloris + counts.clients + 64).to_string();
    let server = serve(exe, "main", &["--max-connections", &max_conn])?;
    let sampler = Sampler::start(server.pid);
    let canary = Canary::start(&server.addr).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let idle = usage(server.pid);
    let mut ctx = Ctx { exe: exe.clone(), server, counts, idle };
    println!(
        "ferry soak ({} mode): server pid {} on {}, idle RSS {:.1} MiB",
        if counts.full { "full" } else { "short" },
        ctx.server.pid,
        ctx.server.addr,
        idle.rss_kib as f64 / 1024.0
    );
    print_header();
    let mut failed = 0;
    // FERRY_SOAK_ONLY=TEXT runs only the phases whose name contains TEXT (to measure one).
    let only = std::env::var("FERRY_SOAK_ONLY").ok();
    for (name, phase) in phases::ALL.iter().filter(|(n, _)| only.as_deref().is_none_or(|o| n.contains(o))) {
        let _ = sampler.take_peak();
        let _ = canary.take();
        let check = phase(&mut ctx).await.map_err(|e| format!("{e:#}"));
        // Settle: what the server keeps once the phase is over.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let canary = canary.take();
        // Every canary call must be answered right, whatever the phase did.
        let check = match check {
            Ok(_) if canary.3 > 0 => Err(format!("{} canary calls failed", canary.3)),
            c => c,
        };
        let row = Row {
            phase: name.to_string(),
            peak_mib: sampler.take_peak() as f64 / 1024.0,
            after: usage(ctx.server.pid),
            shm_mib: dev_shm_bytes() as f64 / (1 << 20) as f64,
            canary,
            check,
        };
        failed += usize::from(row.check.is_err());
        print_row(&row);
    }
    canary.stop().await;
    let end = usage(ctx.server.pid);
    println!(
        "server at the end: RSS {:.1} MiB ({:+.1} MiB from idle), {} fds ({:+}), {} memfd mappings ({:+})",
        end.rss_kib as f64 / 1024.0,
        (end.rss_kib as f64 - ctx.idle.rss_kib as f64) / 1024.0,
        end.fds,
        end.fds as i64 - ctx.idle.fds as i64,
        end.memfd_maps,
        end.memfd_maps as i64 - ctx.idle.memfd_maps as i64,
    );
    if failed > 0 {
        bail!("{failed} phase(s) failed");
    }
    Ok(())
}
