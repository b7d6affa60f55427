//! `ferry bench`: the experiment of the well-known "sharing tensors between processes" blog
//! post. A tensor (default f32 `[1920,1080,3]`, 24.9 MB) is sent to a second process and
//! back, over every compiled-in transport and channel, beside a 64-byte message round trip
//! on the same connection and a plain memcpy of the same bytes, all measured in one run.

use crate::self_exe::SelfExe;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ferry_core::{Channel, DType, Endpoint, Message, Pipe, PipeError, Tensor, TensorMeta, TensorMut, Transport};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Shape of the big tensor.
    pub shape: Vec<u64>,
    /// Its dtype.
    pub dtype: DType,
    /// Round trips of the big tensor.
    pub iters: usize,
    /// Round trips of the 64-byte message.
    pub small_iters: usize,
    /// Untimed round trips before each measurement.
    pub warmup: usize,
    /// Also measure a u8 tensor of this many MiB (0: skip).
    pub big_mib: u64,
    /// Timed round trips of the big tensor.
    pub big_iters: usize,
    /// Only these backends (transport names) or channels; all when empty.
    pub only: Vec<String>,
    /// Show a progress bar on stderr.
    pub progress: bool,
    /// The CPU each echo peer pins itself to (`--placement`); `None`: where the scheduler
    /// puts it.
    pub peer_cpu: Option<usize>,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            shape: vec![1920, 1080, 3],
            dtype: DType::F32,
            iters: 50,
            small_iters: 2000,
            warmup: 5,
            big_mib: 256,
            big_iters: 10,
            only: Vec::new(),
            progress: true,
            peer_cpu: None,
        }
    }
}

/// One measured row.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Transport backend (`local`, `quic`), or `in-process` for the memcpy baseline.
    pub backend: String,
    /// Channel (`inline`), or `memcpy`.
    pub channel: String,
    /// What was measured: `rtt-64B`, `rtt-tensor` (a heap tensor), `rtt-zero-copy` (a
    /// tensor made with `pipe.alloc`), `rtt-copy-in` (a heap tensor over a channel with its
    /// own memory: one copy in), `memcpy`.
    pub case: String,
    /// The tensor, e.g. `f32[1920,1080,3]`.
    pub tensor: String,
    /// Bytes of tensor data per one-way trip.
    pub bytes: u64,
    /// Timed iterations.
    pub iters: usize,
    /// Median time per iteration, microseconds.
    pub p50_us: f64,
    /// 99th percentile, microseconds.
    pub p99_us: f64,
    /// Fastest iteration, microseconds.
    pub min_us: f64,
    /// Data moved per second at the median: 2 x bytes for a round trip, bytes for memcpy.
    pub gbps: f64,
}

/// Percentiles of a set of samples.
fn stats(mut samples: Vec<Duration>) -> (f64, f64, f64) {
    samples.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let pick = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        us(samples[i.min(samples.len() - 1)])
    };
    if samples.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    (pick(0.5), pick(0.99), us(samples[0]))
}

pub(crate) fn row(
    backend: &str,
    channel: &str,
    case: &str,
    tensor: String,
    bytes: u64,
    factor: f64,
    samples: Vec<Duration>,
) -> Row {
    let iters = samples.len();
    let (p50, p99, min) = stats(samples);
    let gbps = if p50 > 0.0 { factor * bytes as f64 / (p50 * 1e-6) / 1e9 } else { 0.0 };
    Row {
        backend: backend.into(),
        channel: channel.into(),
        case: case.into(),
        tensor,
        bytes,
        iters,
        p50_us: p50,
        p99_us: p99,
        min_us: min,
        gbps,
    }
}

/// A tensor of `meta` filled with a cheap pattern.
pub fn filled(meta: TensorMeta) -> anyhow::Result<Tensor> {
    let mut t = TensorMut::zeros(meta)?;
    for (i, chunk) in t.as_bytes_mut().chunks_mut(8).enumerate() {
        let b = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
    if t.meta().dtype == DType::Bool {
        t.as_bytes_mut().iter_mut().for_each(|b| *b &= 1);
    }
    Ok(t.freeze())
}

/// The echo peer the benchmark starts in a second process (`ferry __echo ADDR`): serves
/// every pipe, echoing each message, until stdin closes. Over the ring, a message with the
/// header `{"bench": "stall"}` makes it stop reading that pipe for good (the soak's
/// dead-peer phase).
pub async fn echo_peer(addr: &str) -> anyhow::Result<()> {
    let ep = ferry::endpoint();
    // Grants the same-host ring to a client that asks for it (the `+ring` rows).
    #[cfg(all(feature = "ring", target_os = "linux"))]
    let ep = ferry::RingExt::ring(ep, Some(ferry::RingOptions::default()));
    let mut listener = ep.build().listen(addr).await.with_context(|| format!("listen on {addr}"))?;
    // The real address (a port chosen by the OS, a QUIC pin) for the benchmark to use, and
    // with QUIC a bare quinn sink to compare against.
    #[cfg(feature = "quic")]
    let sink = match ferry_quic::baseline::quinn_sink(&ferry_quic::QuicOptions::default()).await {
        Ok(a) => format!(" {a}"),
        Err(e) => {
            eprintln!("ferry echo peer: no bare quinn sink: {e}");
            String::new()
        }
    };
    #[cfg(not(feature = "quic"))]
    let sink = String::new();
    println!("ready {}{sink}", listener.local_addr());
    std::io::stdout().flush()?;
    std::thread::spawn(|| {
        let mut b = [0u8; 1];
        let _ = std::io::stdin().read(&mut b);
        std::process::exit(0);
    });
    loop {
        match listener.accept().await {
            Ok(p) if uses_ring(&p) => {
                // Over the ring, the peer answers with the blocking fast path on a thread
                // of its own.
                tokio::task::spawn_blocking(move || {
                    while let Ok(m) = p.recv_blocking(None) {
                        if m.header["bench"] == "stall" {
                            // A peer that stops reading (the soak's dead-peer phase kills
                            // it next); it exits when stdin closes.
                            std::thread::park();
                            continue;
                        }
                        let reply = if m.header["bench"] == "sink" {
                            Message::new(serde_json::json!({"bench": "ack"}))
                        } else {
                            m
                        };
                        if p.send_blocking(reply).is_err() {
                            break;
                        }
                    }
                });
            }
            Ok(p) => {
                tokio::spawn(async move {
                    while let Ok(m) = p.recv().await {
                        // One-way measurements: acknowledge instead of echoing.
                        let reply = if m.header["bench"] == "sink" {
                            Message::new(serde_json::json!({"bench": "ack"}))
                        } else {
                            m
                        };
                        if p.send(reply).await.is_err() {
                            break;
                        }
                    }
                });
            }
            Err(PipeError::Closed) => return Ok(()),
            // A benchmark client offering a channel this transport cannot carry.
            Err(PipeError::Refused(ferry_core::Refusal::NoCommonChannel { offered, .. })) if offered.is_empty() => {}
            Err(e) => eprintln!("ferry echo peer: {e}"),
        }
    }
}

/// A child process of the benchmark (the echo peer, `ferry serve`): killed when dropped.
pub(crate) struct ChildProcess(Child);

impl ChildProcess {
    /// The process id.
    pub(crate) fn id(&self) -> u32 {
        self.0.id()
    }

    /// Kills it (SIGKILL) and reaps it.
    #[cfg_attr(not(unix), allow(dead_code))]
    pub(crate) fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `exe args..` and waits for its first line, which must start with `ready`;
/// returns the process and the rest of that line (trimmed).
pub(crate) fn start_child(exe: &SelfExe, args: &[&str], ready: &str) -> anyhow::Result<(ChildProcess, String)> {
    start_child_with(exe, args, ready, &[])
}

/// [`start_child`] with `env` added to the child's environment.
fn start_child_with(
    exe: &SelfExe,
    args: &[&str],
    ready: &str,
    env: &[(&str, String)],
) -> anyhow::Result<(ChildProcess, String)> {
    let mut child = exe
        .command()
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {} {}", exe.display(), args.join(" ")))?;
    let out = child.stdout.take().context("child stdout")?;
    let process = ChildProcess(child);
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line)?;
    match line.trim().strip_prefix(ready) {
        Some(rest) => Ok((process, rest.trim().to_string())),
        None => bail!("`{} {}` did not start (said {line:?})", exe.display(), args.join(" ")),
    }
}

/// Starts the echo peer (`ferry __echo ADDR`); returns it and what it reports: the address
/// it really listens on, then (with QUIC) a bare quinn sink.
pub(crate) fn start_echo_peer(exe: &SelfExe, addr: &str) -> anyhow::Result<(ChildProcess, String)> {
    start_child(exe, &["__echo", addr], "ready")
}

/// [`start_echo_peer`] pinned to `cpu` when given ([`crate::bench_place`]).
fn start_echo_peer_on(exe: &SelfExe, addr: &str, cpu: Option<usize>) -> anyhow::Result<(ChildProcess, String)> {
    match cpu {
        None => start_echo_peer(exe, addr),
        Some(cpu) => {
            start_child_with(exe, &["__echo", addr], "ready", &[(crate::bench_place::CPU_VAR, cpu.to_string())])
        }
    }
}

/// The peer's reported addresses: its ferry address, then (with QUIC) a bare quinn sink.
fn split_ready(line: &str) -> (String, Option<String>) {
    let mut it = line.split_whitespace();
    (it.next().unwrap_or_default().to_string(), it.next().map(str::to_string))
}

async fn time_round_trips(pipe: &Pipe, msg: &Message, n: usize, bar: &ProgressBar) -> anyhow::Result<Vec<Duration>> {
    let mut samples = Vec::with_capacity(n);
    if uses_ring(pipe) {
        // The ring's fast path: blocking calls on this thread (a worker handed over to
        // blocking for the loop), as a request-response caller would use it.
        return tokio::task::block_in_place(|| {
            for _ in 0..n {
                let start = Instant::now();
                pipe.send_blocking(msg.clone())?;
                let back = pipe.recv_blocking(None)?;
                samples.push(start.elapsed());
                drop(back);
                bar.inc(1);
            }
            Ok(samples)
        });
    }
    for _ in 0..n {
        let start = Instant::now();
        pipe.send(msg.clone()).await?;
        let back = pipe.recv().await?;
        samples.push(start.elapsed());
        drop(back);
        bar.inc(1);
    }
    Ok(samples)
}

fn address_for(t: &dyn Transport, tag: &str) -> Option<String> {
    match t.scheme() {
        "unix" => Some(format!("unix:ferry-bench-{}-{tag}", std::process::id())),
        "quic" => Some("quic://127.0.0.1:0".into()),
        _ => None,
    }
}

fn memcpy_row(tensor: &Tensor, label: &str, iters: usize, bar: &ProgressBar) -> Row {
    let src = tensor.as_bytes();
    let mut dst = vec![0u8; src.len()];
    dst.copy_from_slice(src); // fault the pages in
    let mut samples = Vec::with_capacity(iters);
    for _ in 0..iters {
        let start = Instant::now();
        dst.copy_from_slice(std::hint::black_box(src));
        std::hint::black_box(&mut dst);
        samples.push(start.elapsed());
        bar.inc(1);
    }
    row("in-process", "memcpy", "memcpy", label.into(), src.len() as u64, 1.0, samples)
}

#[cfg(feature = "cuda-ipc")]
#[path = "bench_cuda.rs"]
mod cuda;

struct Size {
    label: String,
    meta: TensorMeta,
    iters: usize,
}

fn label_of(meta: &TensorMeta) -> String {
    let n = meta.byte_span().unwrap_or(0);
    if meta.dtype == DType::U8 && meta.shape.len() == 1 && n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        return format!("u8[{} MiB]", n >> 20);
    }
    format!("{}[{}]", meta.dtype, meta.shape.iter().map(u64::to_string).collect::<Vec<_>>().join(","))
}

/// Whether the pipe agreed on the same-host ring (its rows use the blocking calls).
fn uses_ring(pipe: &Pipe) -> bool {
    pipe.info().features.iter().any(|f| f == "ring")
}

/// One round trip with a correctness check (untimed).
async fn checked(pipe: &Pipe, msg: &Message, what: &str) -> anyhow::Result<()> {
    pipe.send(msg.clone()).await?;
    let back = pipe.recv().await?;
    if back.tensors != msg.tensors {
        bail!("{what}: the tensor came back different");
    }
    Ok(())
}

/// Runs the benchmark. `exe` is the `ferry` binary (started as the peer); `on_row` sees
/// each row as soon as it is measured.
pub async fn run(exe: &SelfExe, opts: &BenchOptions, mut on_row: impl FnMut(&Row)) -> anyhow::Result<Vec<Row>> {
    let mut sizes =
        vec![Size { meta: TensorMeta::new(opts.dtype, opts.shape.clone()), label: String::new(), iters: opts.iters }];
    if opts.big_mib > 0 {
        sizes.push(Size {
            meta: TensorMeta::new(DType::U8, vec![opts.big_mib << 20]),
            label: String::new(),
            iters: opts.big_iters,
        });
    }
    for s in &mut sizes {
        s.meta.byte_span().context("tensor shape")?;
        s.label = label_of(&s.meta);
    }
    let small =
        Message::with_tensors(serde_json::json!({"bench": "64B"}), vec![filled(TensorMeta::new(DType::U8, vec![64]))?]);

    let pairs: Vec<Combination> = ferry::transports()
        .into_iter()
        .flat_map(|t| ferry::channels().into_iter().map(move |c| (t.clone(), c)))
        .flat_map(|(t, c)| ring_variants(t.as_ref()).into_iter().map(move |ring| (t.clone(), c.clone(), ring)))
        .filter(|(t, c, ring)| {
            opts.only.is_empty() || opts.only.iter().any(|o| o == t.name() || o == c.name() || (*ring && o == "ring"))
        })
        .collect();
    if pairs.is_empty() {
        bail!("no compiled-in backend matches {:?}", opts.only);
    }
    let per_size: u64 = sizes.iter().map(|s| 2 * (s.iters + opts.warmup * ROUNDS) as u64).sum();
    let total = sizes.iter().map(|s| s.iters as u64).sum::<u64>()
        + pairs.len() as u64 * ((opts.small_iters + opts.warmup * ROUNDS) as u64 + per_size);
    let bar = if opts.progress {
        let b = ProgressBar::new(total);
        b.set_style(
            ProgressStyle::with_template("{spinner} {msg:34} [{bar:30}] {pos}/{len} ({eta})")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b
    } else {
        ProgressBar::hidden()
    };

    let mut rows = Vec::new();
    let mut emit = |r: Row, rows: &mut Vec<Row>| {
        on_row(&r);
        rows.push(r);
    };
    for s in &sizes {
        bar.set_message(format!("memcpy {}", s.label));
        let t = filled(s.meta.clone())?;
        emit(memcpy_row(&t, &s.label, s.iters, &bar), &mut rows);
    }

    // The rows take turns in ROUNDS rounds (each row's round trips split among them), and
    // every round connects anew, to a fresh echo peer: a change in the machine during the
    // run (a noisy neighbour) falls on every row alike, and so does the scheduler's placing
    // of the two processes (on one CPU or two, beside which other threads), which decides
    // a round trip's cost more than anything the pipe does, and differs from one pair of
    // processes to the next. A ratio of two rows then compares like with like.
    let mut samples: Vec<Vec<Vec<Duration>>> = pairs.iter().map(|_| Vec::new()).collect();
    let mut last: Vec<Option<Setup>> = pairs.iter().map(|_| None).collect();
    for round in 0..ROUNDS {
        for (i, (t, c, ring)) in pairs.iter().enumerate() {
            if !c.devices().contains(&ferry_core::DeviceKind::Cpu) {
                continue; // device-only channels (cuda-ipc) have their own rows below
            }
            let Some(mut setup) = connect(exe, opts, (&sizes, &small), i, (t, c, *ring), round, &bar).await? else {
                continue;
            };
            bar.set_message(format!("{} / {}: round {} of {ROUNDS}", setup.backend, setup.channel, round + 1));
            let got = &mut samples[i];
            got.resize_with(setup.cases.len(), Vec::new);
            for (case, got) in setup.cases.iter_mut().zip(got.iter_mut()) {
                checked(&setup.pipe, &case.msg, case.name).await?;
                time_round_trips(&setup.pipe, &case.msg, opts.warmup, &bar).await?;
                got.extend(time_round_trips(&setup.pipe, &case.msg, share(case.iters, round), &bar).await?);
            }
            if round + 1 < ROUNDS {
                setup.pipe.close().await;
            } else {
                last[i] = Some(setup);
            }
        }
    }
    for (setup, got) in last.into_iter().zip(samples) {
        let Some(setup) = setup else { continue };
        for (case, got) in setup.cases.iter().zip(got) {
            emit(row(&setup.backend, &setup.channel, case.name, case.tensor.clone(), case.bytes, 2.0, got), &mut rows);
        }
        #[cfg(feature = "quic")]
        if setup.channel == "quic" {
            for r in quic_one_way(&setup.pipe, &sizes, setup.sink.as_deref(), &bar).await? {
                emit(r, &mut rows);
            }
        }
        let _ = &setup.sink;
        setup.pipe.close().await;
    }
    #[cfg(feature = "cuda-ipc")]
    for r in cuda::rows(exe, opts, &sizes, &bar).await? {
        emit(r, &mut rows);
    }
    bar.finish_and_clear();
    Ok(rows)
}

/// Connects to a fresh echo peer over `t` / `c` (asking for the ring when `ring`) and
/// makes the messages of its rows (the tensors of `sizes`, and `small`) for round `round`;
/// `None` when the combination cannot work.
async fn connect(
    exe: &SelfExe,
    opts: &BenchOptions,
    (sizes, small): (&[Size], &Message),
    i: usize,
    (t, c, ring): (&Arc<dyn Transport>, &Arc<dyn Channel>, bool),
    round: usize,
    bar: &ProgressBar,
) -> anyhow::Result<Option<Setup>> {
    let Some(addr) = address_for(t.as_ref(), &i.to_string()) else { return Ok(None) };
    bar.set_message(format!("{} / {}", t.name(), c.name()));
    let (peer, ready) = start_echo_peer_on(exe, &addr, opts.peer_cpu)?;
    let (addr, sink) = split_ready(&ready);
    let client = with_ring(Endpoint::builder().transport(t.clone()).channel(c.clone()), ring).build();
    let pipe = match client.connect(&addr).await {
        Ok(p) => p,
        // The channel cannot work over this transport (shm over QUIC, quic over unix).
        Err(PipeError::Refused(ferry_core::Refusal::NoCommonChannel { offered, .. })) if offered.is_empty() => {
            return Ok(None);
        }
        Err(PipeError::Refused(r)) => {
            bar.println(format!("skipping {} / {}: {r}", t.name(), c.name()));
            return Ok(None);
        }
        Err(e) => return Err(e).context(format!("connecting over {} / {}", t.name(), c.name())),
    };
    let backend = if ring { format!("{}+ring", t.name()) } else { t.name().to_string() };
    let channel = pipe.channel().to_string();
    let mut cases = vec![Case::new("rtt-64B", "u8[64]".into(), 64, small.clone(), opts.small_iters)];
    // Channels with memory of their own: a tensor made there travels without a copy.
    let own_memory = matches!(channel.as_str(), "shm" | "cuda-ipc");
    for s in sizes {
        let bytes = s.meta.byte_span()?;
        let heap = Message::with_tensors(serde_json::json!({"bench": "heap"}), vec![filled(s.meta.clone())?]);
        if own_memory {
            let mut t = pipe.alloc(s.meta.clone()).await?;
            t.as_bytes_mut().copy_from_slice(heap.tensors[0].as_bytes());
            let pooled = Message::with_tensors(serde_json::json!({"bench": "pool"}), vec![t.freeze()]);
            cases.push(Case::new("rtt-zero-copy", s.label.clone(), bytes, pooled, s.iters));
        } else {
            // The zero-copy row's share of the progress (the bar counts it for every channel).
            bar.inc((share(s.iters, round) + opts.warmup) as u64);
        }
        let case = if own_memory { "rtt-copy-in" } else { "rtt-tensor" };
        cases.push(Case::new(case, s.label.clone(), bytes, heap, s.iters));
    }
    Ok(Some(Setup { backend, channel, pipe, _peer: peer, sink, cases }))
}

/// How many rounds the timed round trips of every row are split into ([`run`]).
const ROUNDS: usize = 5;

/// Round `round`'s share of `iters` round trips (the first rounds take the remainder: the
/// rounds add up to `iters`).
fn share(iters: usize, round: usize) -> usize {
    iters / ROUNDS + usize::from(round < iters % ROUNDS)
}

/// A connected pipe and the rows it measures.
struct Setup {
    backend: String,
    channel: String,
    pipe: Pipe,
    /// The echo peer, killed on drop.
    _peer: ChildProcess,
    /// Where a QUIC peer takes one-way streams.
    sink: Option<String>,
    cases: Vec<Case>,
}

/// One row: what it sends, and how many timed round trips it takes in all.
struct Case {
    name: &'static str,
    tensor: String,
    bytes: u64,
    msg: Message,
    iters: usize,
}

impl Case {
    fn new(name: &'static str, tensor: String, bytes: u64, msg: Message, iters: usize) -> Case {
        Case { name, tensor, bytes, msg, iters }
    }
}

/// A transport, a channel, and whether the client asks for the same-host ring.
type Combination = (Arc<dyn Transport>, Arc<dyn Channel>, bool);

/// Whether to measure a transport without the same-host ring, and with it (unix sockets,
/// where the feature is compiled in).
fn ring_variants(t: &dyn Transport) -> Vec<bool> {
    let mut v = vec![false];
    if cfg!(all(feature = "ring", target_os = "linux")) && t.scheme() == "unix" {
        v.push(true);
    }
    v
}

/// `b` asking for the same-host ring when `ring`.
fn with_ring(b: ferry_core::EndpointBuilder, ring: bool) -> ferry_core::EndpointBuilder {
    #[cfg(all(feature = "ring", target_os = "linux"))]
    if ring {
        return ferry::RingExt::ring(b, Some(ferry::RingOptions::default()));
    }
    let _ = ring;
    b
}

/// QUIC one-way throughput of the largest tensor (the peer acknowledges instead of
/// echoing), beside a bare quinn stream moving the same bytes in the same run.
#[cfg(feature = "quic")]
async fn quic_one_way(pipe: &Pipe, sizes: &[Size], sink: Option<&str>, bar: &ProgressBar) -> anyhow::Result<Vec<Row>> {
    let Some(s) = sizes.iter().max_by_key(|s| s.meta.byte_span().unwrap_or(0)) else { return Ok(Vec::new()) };
    let bytes = s.meta.byte_span()?;
    bar.set_message(format!("quic one-way {}", s.label));
    let msg = Message::with_tensors(serde_json::json!({"bench": "sink"}), vec![filled(s.meta.clone())?]);
    time_round_trips(pipe, &msg, 1, bar).await?;
    let smp = time_round_trips(pipe, &msg, s.iters, bar).await?;
    let ferry_row = row("quic", "quic", "one-way", s.label.clone(), bytes, 1.0, smp);
    let Some(sink) = sink else { return Ok(vec![ferry_row]) };
    bar.set_message(format!("bare quinn one-way {}", s.label));
    let n = usize::try_from(bytes)?;
    // The same peer process, the same settings, one stream per transfer, a small answer.
    let mut smp = ferry_quic::baseline::quinn_send(sink, n, s.iters + 1, &ferry_quic::QuicOptions::default()).await?;
    smp.remove(0); // warm-up
    Ok(vec![ferry_row, row("quic", "bare-quinn", "one-way", s.label.clone(), bytes, 1.0, smp)])
}

/// Formats rows as an aligned table.
pub fn table(rows: &[Row]) -> String {
    let mut out = format!(
        "{:<10} {:<8} {:<13} {:<18} {:>11} {:>6} {:>11} {:>11} {:>8}\n",
        "backend", "channel", "case", "tensor", "bytes", "iters", "p50_us", "p99_us", "GB/s"
    );
    for r in rows {
        out += &format!(
            "{:<10} {:<8} {:<13} {:<18} {:>11} {:>6} {:>11.1} {:>11.1} {:>8.2}\n",
            r.backend, r.channel, r.case, r.tensor, r.bytes, r.iters, r.p50_us, r.p99_us, r.gbps
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let s: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        let (p50, p99, min) = stats(s);
        assert!((p50 - 50.0).abs() <= 1.0, "{p50}");
        assert!((p99 - 99.0).abs() <= 1.0, "{p99}");
        assert_eq!(min, 1.0);
        assert_eq!(stats(vec![]), (0.0, 0.0, 0.0));
    }

    #[test]
    fn table_has_every_row() {
        let r = row("local", "inline", "rtt-64B", "u8[64]".into(), 64, 2.0, vec![Duration::from_micros(10); 3]);
        let t = table(&[r.clone(), r]);
        assert_eq!(t.lines().count(), 3);
        assert!(t.contains("rtt-64B"));
    }
}
