//! `ferry bench` rows for JSON-RPC: calls to `ferry serve` (the demo API) in a second
//! process, over every compiled-in transport and channel, measured in the same run as the
//! message round trips of [`crate::bench`].
//!
//! Cases:
//! - `call-add`: one client, one small call at a time (`add`): latency and calls/s.
//! - `call-add-x16`: 16 clients on 16 connections, each one call at a time: calls/s.
//! - `call-add-matmul`: `add` while another client (a thread and runtime of its own) loops
//!   `matmul` (a blocking handler), measured in blocks interleaved with `call-add-quiet`
//!   (the same client while the other waits); `x_p99` is the p99 ratio of the two.
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

use crate::self_exe::SelfExe;
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
    /// p50 over the p50 of the base measured interleaved with it, if any.
    pub x_base: Option<f64>,
    /// p99 over the p99 of that base, if any.
    pub x_p99: Option<f64>,
}

fn row(pair: (&str, &str), case: &str, tensor: &str, bytes: u64, factor: f64, s: &Samples) -> RpcRow {
    let n = s.times.len();
    RpcRow {
        row: crate::bench::row(pair.0, pair.1, case, tensor.into(), bytes, factor, s.times.clone()),
        calls_per_s: if s.wall.is_zero() { 0.0 } else { n as f64 / s.wall.as_secs_f64() },
        x_base: None,
        x_p99: None,
    }
}

/// `call`'s row with `x_base` and `x_p99` set against `base`.
fn versus(mut call: RpcRow, base: &RpcRow) -> RpcRow {
    if base.row.p50_us > 0.0 {
        call.x_base = Some(call.row.p50_us / base.row.p50_us);
    }
    if base.row.p99_us > 0.0 {
        call.x_p99 = Some(call.row.p99_us / base.row.p99_us);
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
fn start_server(exe: &SelfExe, addr: &str) -> anyhow::Result<ChildProcess> {
    let extra = std::env::var("FERRY_BENCH_SERVE_ARGS").unwrap_or_default();
    let mut args = vec!["serve", addr];
    args.extend(extra.split_whitespace());
    Ok(start_child(exe, &args, "listening on")?.0)
}

/// The other client of `call-add-matmul`: a thread of its own, with a runtime of its own
/// (like another process: its connection's tasks share no runtime worker with the measured
/// client), calling `matmul` on 256x256 f32 matrices in a loop while resumed. Its matrices
/// are made once in the pipe's memory (`pipe.alloc`), as a client that sends the same
/// tensors again would do, so each call costs it no copy.
struct MatmulLoop {
    /// What the loop should do: run, wait, or end.
    want: tokio::sync::watch::Sender<LoopWant>,
    /// Calls made so far, and whether the loop is waiting (no call in flight).
    state: tokio::sync::watch::Receiver<(u64, bool)>,
    thread: Option<std::thread::JoinHandle<anyhow::Result<u64>>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LoopWant {
    Run,
    Wait,
    End,
}

impl MatmulLoop {
    /// Connects and checks one call; the loop then waits until [`Self::resume`].
    async fn start(ep: &Endpoint, addr: &str) -> anyhow::Result<MatmulLoop> {
        let (want, mut want_rx) = tokio::sync::watch::channel(LoopWant::Wait);
        let (state_tx, state) = tokio::sync::watch::channel((0u64, true));
        let (ep, addr) = (ep.clone(), addr.to_owned());
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<anyhow::Result<()>>();
        let thread = std::thread::Builder::new().name("bench-matmul".into()).spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(async move {
                let start = async {
                    let busy = Client::new(ep.connect(&addr).await?);
                    let mut m = busy.pipe().alloc(TensorMeta::new(DType::F32, vec![256, 256])).await?;
                    m.as_mut_slice::<f32>()?.fill(0.5);
                    let m = m.freeze();
                    // Typed params: the matrices travel over the channel (`json!` would
                    // inline them as base64 text, which the server would then parse).
                    let mm = crate::demo::MatmulParams { a: RpcTensor::from(m.clone()), b: RpcTensor::from(m) };
                    let r: RpcTensor = busy.call("matmul", &mm).await?;
                    anyhow::ensure!(r.meta().shape == [256, 256], "matmul returned {:?}", r.meta());
                    anyhow::Ok((busy, mm))
                };
                let (busy, mm) = match start.await {
                    Ok(started) => {
                        let _ = ready_tx.send(Ok(()));
                        started
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return Ok(0);
                    }
                };
                let mut n = 0u64;
                loop {
                    let want = *want_rx.borrow_and_update();
                    match want {
                        LoopWant::End => break,
                        LoopWant::Wait => {
                            state_tx.send_replace((n, true));
                            // The sender gone: end as if told to.
                            if want_rx.changed().await.is_err() {
                                break;
                            }
                        }
                        LoopWant::Run => {
                            busy.call::<_, RpcTensor>("matmul", &mm).await?;
                            n += 1;
                            state_tx.send_replace((n, false));
                        }
                    }
                }
                busy.close().await;
                anyhow::Ok(n)
            })
        })?;
        ready_rx.await.context("the matmul loop's thread ended before it started")??;
        Ok(MatmulLoop { want, state, thread: Some(thread) })
    }

    /// Lets the loop run, and returns once a call of it has finished (the next one is then
    /// in flight).
    async fn resume(&mut self) -> anyhow::Result<()> {
        let before = self.state.borrow_and_update().0;
        self.want.send_replace(LoopWant::Run);
        self.state.wait_for(|&(n, _)| n > before).await.context("the matmul loop ended")?;
        Ok(())
    }

    /// Stops the loop after its current call, and returns once that call has finished.
    async fn pause(&mut self) -> anyhow::Result<()> {
        self.want.send_replace(LoopWant::Wait);
        self.state.wait_for(|&(_, waiting)| waiting).await.context("the matmul loop ended")?;
        Ok(())
    }

    /// Ends the loop: how many calls it made.
    async fn stop(mut self) -> anyhow::Result<u64> {
        self.want.send_replace(LoopWant::End);
        let thread = self.thread.take().context("the matmul loop was already stopped")?;
        tokio::task::spawn_blocking(move || thread.join())
            .await?
            .map_err(|_| anyhow::anyhow!("the matmul loop's thread panicked"))?
    }
}

impl Drop for MatmulLoop {
    fn drop(&mut self) {
        // On an error path: the loop ends after its current call, on its own.
        self.want.send_replace(LoopWant::End);
    }
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
pub async fn run(exe: &SelfExe, opts: &BenchOptions, mut on_row: impl FnMut(&RpcRow)) -> anyhow::Result<Vec<RpcRow>> {
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
        // handler), in blocks interleaved with blocks of `add` while that client waits
        // (`call-add-quiet`), so both see the same machine; 5x the small iterations each, as
        // a p99 needs samples. `x_p99` is the target's ratio.
        step(&format!("{} / {channel}: add while another client loops matmul", t.name()));
        {
            let mut looping = MatmulLoop::start(&ep, &addr).await?;
            let (mut quiet, mut loaded) = (Samples::default(), Samples::default());
            const BLOCKS: usize = 10;
            let per = (opts.small_iters * 5).div_ceil(BLOCKS).max(1);
            for _ in 0..BLOCKS {
                quiet.extend(time_calls(per, || add(&client)).await?);
                looping.resume().await?;
                loaded.extend(time_calls(per, || add(&client)).await?);
                looping.pause().await?;
            }
            let matmuls = looping.stop().await?;
            anyhow::ensure!(matmuls >= BLOCKS as u64, "the matmul loop made {matmuls} calls in {BLOCKS} blocks");
            let quiet = row(pair, "call-add-quiet", "-", 0, 0.0, &quiet);
            emit(versus(row(pair, "call-add-matmul", "-", 0, 0.0, &loaded), &quiet));
            emit(quiet);
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
        "{:<8} {:<8} {:<18} {:<20} {:>11} {:>6} {:>11} {:>11} {:>8} {:>10} {:>6} {:>6}\n",
        "backend",
        "channel",
        "case",
        "tensor",
        "bytes",
        "iters",
        "p50_us",
        "p99_us",
        "GB/s",
        "calls/s",
        "x_base",
        "x_p99"
    );
    for r in rows {
        let x = r.x_base.map(|x| format!("{x:.2}")).unwrap_or_default();
        let x99 = r.x_p99.map(|x| format!("{x:.2}")).unwrap_or_default();
        out += &format!(
            "{:<8} {:<8} {:<18} {:<20} {:>11} {:>6} {:>11.1} {:>11.1} {:>8.2} {:>10.0} {:>6} {:>6}\n",
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
            x,
            x99
        );
    }
    out
}
