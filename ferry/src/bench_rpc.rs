//! `ferry bench` rows for JSON-RPC: calls to `ferry serve` (the demo API) in a second
//! process, over every compiled-in transport and channel, measured in the same run as the
//! message round trips of [`crate::bench`].
//!
//! Cases:
//! - `call-add`: one client, one small call at a time (`add`): latency and calls/s.
//! - `call-add-x16`: 16 clients on 16 connections, each one call at a time: calls/s.
//! - `call-zero-copy` (channels with their own memory): `echo` of a tensor made with
//!   `pipe.alloc`, compare with `rtt-zero-copy`.
//! - `call-tensor` / `call-copy-in`: `echo` of a heap tensor, compare with `rtt-tensor` /
//!   `rtt-copy-in`.
//! - `call-create`: `create_tensor` (the server allocates the result in the channel's
//!   memory and fills it): one-way bytes.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ferry_core::{Channel, Endpoint, PipeError, Tensor, TensorMeta, Transport};
use ferry_rpc::{Client, RpcTensor};
use serde::Serialize;
use serde_json::json;

use crate::bench::{BenchOptions, filled};
use crate::demo::AddParams;

/// Concurrent clients of the `call-add-x16` case.
pub const CLIENTS: usize = 16;

/// One measured row: the keys of [`crate::bench::Row`] plus `calls_per_s`.
#[derive(Debug, Clone, Serialize)]
pub struct RpcRow {
    /// Transport backend (`pipe`).
    pub backend: String,
    /// Channel (`shm`, `inline`).
    pub channel: String,
    /// What was measured (see the module docs).
    pub case: String,
    /// The tensor, e.g. `f32[1920,1080,3]`, or `-`.
    pub tensor: String,
    /// Tensor bytes per one-way trip.
    pub bytes: u64,
    /// Timed calls.
    pub iters: usize,
    /// Median call time, microseconds.
    pub p50_us: f64,
    /// 99th percentile, microseconds.
    pub p99_us: f64,
    /// Fastest call, microseconds.
    pub min_us: f64,
    /// Tensor data moved per second at the median (both directions for `echo`).
    pub gbps: f64,
    /// Calls completed per second of wall time (all clients together).
    pub calls_per_s: f64,
}

fn row(pair: (&str, &str), case: &str, tensor: &str, bytes: u64, factor: f64, s: &Samples) -> RpcRow {
    let mut v = s.times.clone();
    v.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let pick = |q: f64| v.get(((v.len().max(1) - 1) as f64 * q).round() as usize).map(|d| us(*d)).unwrap_or(0.0);
    let p50 = pick(0.5);
    RpcRow {
        backend: pair.0.into(),
        channel: pair.1.into(),
        case: case.into(),
        tensor: tensor.into(),
        bytes,
        iters: v.len(),
        p50_us: p50,
        p99_us: pick(0.99),
        min_us: v.first().map(|d| us(*d)).unwrap_or(0.0),
        gbps: if p50 > 0.0 { factor * bytes as f64 / (p50 * 1e-6) / 1e9 } else { 0.0 },
        calls_per_s: if s.wall.is_zero() { 0.0 } else { v.len() as f64 / s.wall.as_secs_f64() },
    }
}

struct Samples {
    times: Vec<Duration>,
    wall: Duration,
}

struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `ferry serve ADDR` and waits until it listens.
fn start_server(exe: &Path, addr: &str) -> anyhow::Result<Served> {
    let mut child = Command::new(exe)
        .args(["serve", addr])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {} serve", exe.display()))?;
    let out = child.stdout.take().context("server stdout")?;
    let served = Served(child);
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line)?;
    if !line.starts_with("listening on") {
        bail!("ferry serve did not start (said {line:?})");
    }
    Ok(served)
}

/// Times `n` calls of `f`. Like the round trips of [`crate::bench`], a call's time ends
/// when its result is in hand; dropping the result is not timed.
async fn time_calls<T, F, Fut>(n: usize, mut f: F) -> anyhow::Result<Samples>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let mut times = Vec::with_capacity(n);
    let start = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        let r = f().await?;
        times.push(t.elapsed());
        drop(r);
    }
    Ok(Samples { times, wall: start.elapsed() })
}

async fn add(c: &Client) -> anyhow::Result<()> {
    let r: f64 = c.call("add", &AddParams { a: 1.0, b: 2.0 }).await?;
    anyhow::ensure!(r == 3.0, "add returned {r}");
    Ok(())
}

async fn echo(c: &Client, t: &Tensor) -> anyhow::Result<Tensor> {
    let r: RpcTensor = c.call("echo", &crate::demo::TensorParams { tensor: RpcTensor(t.clone()) }).await?;
    Ok(r.into_inner())
}

/// Measures the RPC rows; `on_row` sees each as soon as it is measured.
pub async fn run(exe: &Path, opts: &BenchOptions, mut on_row: impl FnMut(&RpcRow)) -> anyhow::Result<Vec<RpcRow>> {
    let meta = TensorMeta::new(opts.dtype, opts.shape.clone());
    let bytes = meta.byte_span().context("tensor shape")?;
    let label = format!("{}[{}]", opts.dtype, opts.shape.iter().map(u64::to_string).collect::<Vec<_>>().join(","));
    let heap = filled(meta.clone())?;
    let pairs: Vec<(Arc<dyn Transport>, Arc<dyn Channel>)> = crate::transports()
        .into_iter()
        .flat_map(|t| crate::channels().into_iter().map(move |c| (t.clone(), c)))
        .filter(|(t, c)| opts.only.is_empty() || opts.only.iter().any(|o| o == t.name() || o == c.name()))
        .collect();
    let mut rows = Vec::new();
    let mut emit = |r: RpcRow| {
        on_row(&r);
        rows.push(r);
    };
    for (i, (t, c)) in pairs.iter().enumerate() {
        // Device-only channels (cuda-ipc) carry no CPU tensors: no RPC over them alone.
        if t.scheme() != "unix" || !c.devices().contains(&ferry_core::DeviceKind::Cpu) {
            continue;
        }
        let addr = format!("unix:ferry-bench-rpc-{}-{i}", std::process::id());
        let _server = start_server(exe, &addr)?;
        let ep = Endpoint::builder().transport(t.clone()).channel(c.clone()).build();
        let client = match ep.connect(&addr).await {
            Ok(p) => Client::new(p),
            Err(PipeError::Refused(r)) => {
                eprintln!("skipping rpc over {} / {}: {r}", t.name(), c.name());
                continue;
            }
            Err(e) => return Err(e).context(format!("connecting over {} / {}", t.name(), c.name())),
        };
        let channel = client.pipe().channel().to_owned();
        let pair = (t.name(), channel.as_str());

        time_calls(opts.warmup.max(10), || add(&client)).await?;
        let s = time_calls(opts.small_iters, || add(&client)).await?;
        emit(row(pair, "call-add", "-", 0, 0.0, &s));

        let mut clients = Vec::with_capacity(CLIENTS);
        for _ in 0..CLIENTS {
            clients.push(Client::new(ep.connect(&addr).await?));
        }
        for c in &clients {
            add(c).await?;
        }
        let start = Instant::now();
        let runs: Vec<_> = clients
            .iter()
            .map(|c| {
                let c = c.clone();
                let n = opts.small_iters;
                tokio::spawn(async move { time_calls(n, || add(&c)).await })
            })
            .collect();
        let mut times = Vec::new();
        for r in runs {
            times.extend(r.await??.times);
        }
        let s = Samples { times, wall: start.elapsed() };
        emit(row(pair, &format!("call-add-x{CLIENTS}"), "-", 0, 0.0, &s));
        drop(clients);

        if channel != "inline" {
            let mut own = client.pipe().alloc(meta.clone()).await?;
            own.as_bytes_mut().copy_from_slice(heap.as_bytes());
            let own = own.freeze();
            anyhow::ensure!(echo(&client, &own).await? == own, "echo changed the tensor");
            time_calls(opts.warmup, || echo(&client, &own)).await?;
            let s = time_calls(opts.iters, || echo(&client, &own)).await?;
            emit(row(pair, "call-zero-copy", &label, bytes, 2.0, &s));
        }
        anyhow::ensure!(echo(&client, &heap).await? == heap, "echo changed the tensor");
        time_calls(opts.warmup, || echo(&client, &heap)).await?;
        let s = time_calls(opts.iters, || echo(&client, &heap)).await?;
        emit(row(pair, if channel == "inline" { "call-tensor" } else { "call-copy-in" }, &label, bytes, 2.0, &s));

        let create = json!({ "shape": opts.shape, "dtype": opts.dtype, "fill": 1 });
        let made: RpcTensor = client.call("create_tensor", &create).await?;
        anyhow::ensure!(made.meta() == &meta, "create_tensor made {:?}", made.meta());
        let call =
            || async { client.call::<_, RpcTensor>("create_tensor", &create).await.map(drop).map_err(Into::into) };
        time_calls(opts.warmup, call).await?;
        let s = time_calls(opts.iters, call).await?;
        emit(row(pair, "call-create", &label, bytes, 1.0, &s));
        client.close().await;
    }
    Ok(rows)
}

/// Formats rows as an aligned table.
pub fn table(rows: &[RpcRow]) -> String {
    let mut out = format!(
        "{:<8} {:<8} {:<15} {:<20} {:>11} {:>6} {:>11} {:>11} {:>8} {:>10}\n",
        "backend", "channel", "case", "tensor", "bytes", "iters", "p50_us", "p99_us", "GB/s", "calls/s"
    );
    for r in rows {
        out += &format!(
            "{:<8} {:<8} {:<15} {:<20} {:>11} {:>6} {:>11.1} {:>11.1} {:>8.2} {:>10.0}\n",
            r.backend, r.channel, r.case, r.tensor, r.bytes, r.iters, r.p50_us, r.p99_us, r.gbps, r.calls_per_s
        );
    }
    out
}
