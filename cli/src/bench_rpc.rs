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
//!
//! Each call case whose target compares it with a plain message round trip is measured
//! interleaved with that round trip (blocks of each in turn, over a second connection to a
//! plain echo peer, `ferry __echo`), so both see the same machine load: `base-rtt-64B`
//! beside `call-add`, `base-rtt-zero-copy` beside `call-zero-copy`, `base-rtt-tensor` /
//! `base-rtt-copy-in` beside `call-tensor` / `call-copy-in`. `x_base` is the call's p50
//! over its base's p50.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use ferry_core::{Channel, DType, Endpoint, Message, Pipe, PipeError, Tensor, TensorMeta, Transport};
use ferry_rpc::{Client, RpcTensor};

use crate::bench::{ChildProcess, start_child, start_echo_peer};
use serde::Serialize;
use serde_json::json;

use crate::bench::{BenchOptions, filled};
use crate::demo::AddParams;

/// Concurrent clients of the `call-add-x16` case.
pub const CLIENTS: usize = 16;

/// One measured row: the keys of [`crate::bench::Row`] plus `calls_per_s`.
#[derive(Debug, Clone, Serialize)]
pub struct RpcRow {
    /// The common keys (backend, channel, case, tensor, bytes, iters, p50/p99/min, GB/s).
    #[serde(flatten)]
    pub row: crate::bench::Row,
    /// Calls completed per second of wall time (all clients together).
    pub calls_per_s: f64,
    /// p50 over the p50 of the plain round trip measured interleaved with it, if any.
    pub x_base: Option<f64>,
}

fn row(pair: (&str, &str), case: &str, tensor: &str, bytes: u64, factor: f64, s: &Samples) -> RpcRow {
    let n = s.times.len();
    RpcRow {
        row: crate::bench::row(pair.0, pair.1, case, tensor.into(), bytes, factor, s.times.clone()),
        calls_per_s: if s.wall.is_zero() { 0.0 } else { n as f64 / s.wall.as_secs_f64() },
        x_base: None,
    }
}

/// `call`'s row with `x_base` set against `base`.
fn versus(mut call: RpcRow, base: &RpcRow) -> RpcRow {
    if base.row.p50_us > 0.0 {
        call.x_base = Some(call.row.p50_us / base.row.p50_us);
    }
    call
}

#[derive(Default)]
struct Samples {
    times: Vec<Duration>,
    wall: Duration,
}

impl Samples {
    fn extend(&mut self, other: Samples) {
        self.times.extend(other.times);
        self.wall += other.wall;
    }
}

/// The benchmark's plain echo peer (`ferry __echo ADDR`); exits when its stdin closes.
async fn rtt(pipe: &Pipe, msg: &Message) -> anyhow::Result<Message> {
    pipe.send(msg.clone()).await?;
    Ok(pipe.recv().await?)
}

/// Times `n` runs each of `a` and `b`, alternating in blocks so both see the same load.
async fn interleaved<TA, TB, FA, FB, A, B>(n: usize, mut a: FA, mut b: FB) -> anyhow::Result<(Samples, Samples)>
where
    FA: FnMut() -> A,
    FB: FnMut() -> B,
    A: std::future::Future<Output = anyhow::Result<TA>>,
    B: std::future::Future<Output = anyhow::Result<TB>>,
{
    const BLOCKS: usize = 10;
    let per = n.div_ceil(BLOCKS).max(1);
    let (mut sa, mut sb) = (Samples::default(), Samples::default());
    for _ in 0..BLOCKS {
        sa.extend(time_calls(per, &mut a).await?);
        sb.extend(time_calls(per, &mut b).await?);
    }
    Ok((sa, sb))
}

/// Starts `ferry serve ADDR` (plus the options in `$FERRY_BENCH_SERVE_ARGS`, split on
/// whitespace, to compare server settings) and waits until it listens.
fn start_server(exe: &Path, addr: &str) -> anyhow::Result<ChildProcess> {
    let extra = std::env::var("FERRY_BENCH_SERVE_ARGS").unwrap_or_default();
    let mut args = vec!["serve", addr];
    args.extend(extra.split_whitespace());
    Ok(start_child(exe, &args, "listening on")?.0)
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
    let pairs: Vec<(Arc<dyn Transport>, Arc<dyn Channel>)> = ferry::transports()
        .into_iter()
        .flat_map(|t| ferry::channels().into_iter().map(move |c| (t.clone(), c)))
        .filter(|(t, c)| opts.only.is_empty() || opts.only.iter().any(|o| o == t.name() || o == c.name()))
        .collect();
    let mut rows = Vec::new();
    let mut emit = |r: RpcRow| {
        on_row(&r);
        rows.push(r);
    };
    // A spinner on stderr naming what is measured (hidden with --json and when stderr is
    // not a terminal).
    let bar = if opts.progress { indicatif::ProgressBar::new_spinner() } else { indicatif::ProgressBar::hidden() };
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    let step = |what: &str| bar.set_message(format!("ferry serve rows: {what}"));
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
            // The channel cannot work over this transport (quic over unix): not a row.
            Err(PipeError::Refused(ferry_core::Refusal::NoCommonChannel { offered, .. })) if offered.is_empty() => {
                continue;
            }
            Err(PipeError::Refused(r)) => {
                eprintln!("skipping rpc over {} / {}: {r}", t.name(), c.name());
                continue;
            }
            Err(e) => return Err(e).context(format!("connecting over {} / {}", t.name(), c.name())),
        };
        let channel = client.pipe().channel().to_owned();
        let pair = (t.name(), channel.as_str());
        step(&format!("{} / {channel}: add beside a 64-byte round trip", t.name()));

        let echo_addr = format!("unix:ferry-bench-rpc-echo-{}-{i}", std::process::id());
        let _echo = start_echo_peer(exe, &echo_addr)?;
        let raw = ep.connect(&echo_addr).await.context("connecting to the echo peer")?;
        let small = Message::with_tensors(json!({"bench": "64B"}), vec![filled(TensorMeta::new(DType::U8, vec![64]))?]);

        time_calls(opts.warmup.max(10), || add(&client)).await?;
        time_calls(opts.warmup.max(10), || rtt(&raw, &small)).await?;
        let (base, call) = interleaved(opts.small_iters, || rtt(&raw, &small), || add(&client)).await?;
        let base = row(pair, "base-rtt-64B", "u8[64]", 64, 2.0, &base);
        let quiet = versus(row(pair, "call-add", "-", 0, 0.0, &call), &base);
        emit(quiet.clone());
        emit(base);

        step(&format!("{} / {channel}: add from {CLIENTS} clients at once", t.name()));
        // `add` from one client while another loops a CPU-bound `matmul` (a blocking
        // handler): the add's p50 against the quiet `call-add` of this run (x_base), its
        // p99 in the row.
        step(&format!("{} / {channel}: add while another client loops matmul", t.name()));
        {
            let busy = Client::new(ep.connect(&addr).await?);
            let m = Tensor::from_slice(vec![256, 256], &vec![0.5f32; 256 * 256])?;
            // Typed params: the matrices travel over the channel (`json!` would inline them
            // as base64 text, which the server would then parse on its reader).
            let mm = crate::demo::MatmulParams { a: RpcTensor::from(m.clone()), b: RpcTensor::from(m) };
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let looping = {
                let (busy, stop) = (busy.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut n = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        busy.call::<_, RpcTensor>("matmul", &mm).await?;
                        n += 1;
                    }
                    anyhow::Ok(n)
                })
            };
            let loaded = time_calls(opts.small_iters, || add(&client)).await?;
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let matmuls = looping.await??;
            anyhow::ensure!(matmuls > 0, "the matmul loop did not run");
            let r = row(pair, "call-add-matmul", "-", 0, 0.0, &loaded);
            emit(versus(r, &quiet));
        }

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
            step(&format!("{} / {channel}: zero-copy echo of {label}", t.name()));
            let mut own = client.pipe().alloc(meta.clone()).await?;
            own.as_bytes_mut().copy_from_slice(heap.as_bytes());
            let own = own.freeze();
            anyhow::ensure!(echo(&client, &own).await? == own, "echo changed the tensor");
            let mut raw_own = raw.alloc(meta.clone()).await?;
            raw_own.as_bytes_mut().copy_from_slice(heap.as_bytes());
            let raw_msg = Message::with_tensors(json!({"bench": "pool"}), vec![raw_own.freeze()]);
            time_calls(opts.warmup, || echo(&client, &own)).await?;
            time_calls(opts.warmup, || rtt(&raw, &raw_msg)).await?;
            let (base, call) = interleaved(opts.iters, || rtt(&raw, &raw_msg), || echo(&client, &own)).await?;
            let base = row(pair, "base-rtt-zero-copy", &label, bytes, 2.0, &base);
            emit(versus(row(pair, "call-zero-copy", &label, bytes, 2.0, &call), &base));
            emit(base);
        }
        step(&format!("{} / {channel}: echo of a heap {label}", t.name()));
        anyhow::ensure!(echo(&client, &heap).await? == heap, "echo changed the tensor");
        let heap_msg = Message::with_tensors(json!({"bench": "heap"}), vec![heap.clone()]);
        time_calls(opts.warmup, || echo(&client, &heap)).await?;
        let (base, call) = interleaved(opts.iters, || rtt(&raw, &heap_msg), || echo(&client, &heap)).await?;
        let (base_case, call_case) =
            if channel == "inline" { ("base-rtt-tensor", "call-tensor") } else { ("base-rtt-copy-in", "call-copy-in") };
        let base = row(pair, base_case, &label, bytes, 2.0, &base);
        emit(versus(row(pair, call_case, &label, bytes, 2.0, &call), &base));
        emit(base);
        raw.close().await;

        step(&format!("{} / {channel}: create_tensor {label}", t.name()));
        let create = json!({ "shape": opts.shape, "dtype": opts.dtype, "fill": 1 });
        let made: RpcTensor = client.call("create_tensor", &create).await?;
        anyhow::ensure!(made.meta() == &meta, "create_tensor made {:?}", made.meta());
        let call =
            || async { client.call::<_, RpcTensor>("create_tensor", &create).await.map_err(anyhow::Error::from) };
        time_calls(opts.warmup, call).await?;
        let s = time_calls(opts.iters, call).await?;
        emit(row(pair, "call-create", &label, bytes, 1.0, &s));
        client.close().await;
    }
    bar.finish_and_clear();
    Ok(rows)
}

/// Formats rows as an aligned table.
pub fn table(rows: &[RpcRow]) -> String {
    let mut out = format!(
        "{:<8} {:<8} {:<18} {:<20} {:>11} {:>6} {:>11} {:>11} {:>8} {:>10} {:>6}\n",
        "backend", "channel", "case", "tensor", "bytes", "iters", "p50_us", "p99_us", "GB/s", "calls/s", "x_base"
    );
    for r in rows {
        let x = r.x_base.map(|x| format!("{x:.2}")).unwrap_or_default();
        out += &format!(
            "{:<8} {:<8} {:<18} {:<20} {:>11} {:>6} {:>11.1} {:>11.1} {:>8.2} {:>10.0} {:>6}\n",
            r.row.backend,
            r.row.channel,
            r.row.case,
            r.row.tensor,
            r.row.bytes,
            r.row.iters,
            r.row.p50_us,
            r.row.p99_us,
            r.row.gbps,
            r.calls_per_s,
            x
        );
    }
    out
}
