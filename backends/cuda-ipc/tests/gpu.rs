//! CUDA tensors between processes on a real GPU, plus the same scenarios against the
//! in-memory driver so that the scenarios themselves are exercised on every machine.
//!
//! - `gpu::*`: this test binary re-executed as the peer process (`FERRY_CUDA_GPU_ROLE`),
//!   over the real driver. *Ignored* (with the reason printed) where the channel is not
//!   viable; `gpu::devices_matched_by_uuid` also needs two GPUs.
//! - `fake::*`: the same scenarios with the peer in a thread of this process, each side over
//!   its own simulated process of one simulated two-GPU machine; "killing" the peer stops
//!   its runtime.
//!
//! The parent listens; the peer connects and obeys commands in message headers
//! (`echo`, `sums`, `drop`), so each scenario is driven from the parent. Run with
//! `cargo test -p ferry-cuda-ipc --test gpu -- --nocapture` to see timings.

use std::io::Read;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use ferry_conformance::Fixture;
use ferry_conformance::peer::RawConn;
use ferry_core::frame::FrameKind;
use ferry_core::{
    Channel, ChannelError, ConnInfo, DType, Device, DeviceBuffer, DeviceKind, Endpoint, InlineChannel, Message, Pipe,
    PipeListener, Tensor, TensorMeta, Transport,
};
use ferry_cuda_ipc::fake::FakeGpu;
use ferry_cuda_ipc::{CudaIpcChannel, CudaIpcOptions, is_orphaned};
use ferry_local::LocalTransport;
use libtest_mimic::{Arguments, Failed, Trial};
use serde_json::{Value, json};

const ROLE: &str = "FERRY_CUDA_GPU_ROLE";
const ADDR: &str = "FERRY_CUDA_GPU_ADDR";
const REVERSED: &str = "FERRY_CUDA_GPU_REVERSED";
/// Limit for one receive.
const T: Duration = Duration::from_secs(30);
/// A dead peer must be noticed within this.
const NOTICE: Duration = Duration::from_secs(2);
const KILLS: usize = 5;

/// Where the peer runs and which driver both sides use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A re-executed process over the real driver.
    Gpu,
    /// A thread, over simulated processes of one simulated machine.
    Fake,
}

static FAKE_GPU: OnceLock<Arc<FakeGpu>> = OnceLock::new();
static NEXT_FAKE_PID: AtomicU32 = AtomicU32::new(1_000_000);

/// A channel for one side (in fake mode, a new simulated process each time).
fn channel(mode: Mode, reversed: bool, opts: CudaIpcOptions) -> CudaIpcChannel {
    match mode {
        Mode::Gpu => CudaIpcChannel::with_options(opts),
        Mode::Fake => {
            let gpu = FAKE_GPU.get_or_init(|| FakeGpu::new(2));
            let pid = NEXT_FAKE_PID.fetch_add(1, Ordering::Relaxed);
            let drv = if reversed { gpu.process_with_devices(pid, vec![1, 0]) } else { gpu.process(pid) };
            CudaIpcChannel::with_driver(drv, opts)
        }
    }
}

fn endpoint(chan: &CudaIpcChannel) -> Endpoint {
    Endpoint::builder()
        .transport(Arc::new(LocalTransport::new()))
        .channel(Arc::new(chan.clone()))
        .channel(Arc::new(InlineChannel))
        .build()
}

#[derive(Default)]
struct Fx;

impl Fixture for Fx {
    const NAME: &'static str = "cuda-ipc";
    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(LocalTransport::new())
    }
    fn channels(&self) -> Vec<Arc<dyn Channel>> {
        vec![Arc::new(InlineChannel)]
    }
    fn addr(&self, tag: &str) -> String {
        format!("unix:ferry-cuda-gpu-{}", ferry_conformance::unique(tag))
    }
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn err<E: std::fmt::Display>(ctx: &'static str) -> impl Fn(E) -> Failed {
    move |e| Failed::from(format!("{ctx}: {e}"))
}

fn cuda(dtype: DType, shape: &[u64], dev: u32) -> TensorMeta {
    TensorMeta::new(dtype, shape.to_vec()).with_device(Device::Cuda(dev))
}

fn ptr(t: &Tensor) -> u64 {
    t.device_buffer().map(|b| b.device_ptr()).unwrap_or(0)
}

// ---- the peer ---------------------------------------------------------------------------

async fn run_role(mode: Mode, role: &str, addr: &str, reversed: bool) -> Result<(), String> {
    let chan = channel(mode, reversed, CudaIpcOptions::default());
    if role == "hostile" {
        return hostile(&chan, addr).await;
    }
    let pipe = endpoint(&chan).connect(addr).await.map_err(|e| format!("connect: {e}"))?;
    if role == "produce" {
        let t = pipe.alloc_device(cuda(DType::U8, &[3 << 20], 0)).await.map_err(|e| e.to_string())?;
        let data = pattern(3 << 20, 42);
        chan.copy_from_host(&t, &data).map_err(|e| e.to_string())?;
        let m = Message::with_tensors(json!({"sum": fnv(&data).to_string()}), vec![t]);
        pipe.send(m).await.map_err(|e| e.to_string())?;
    }
    serve(&chan, &pipe).await
}

/// Obeys the parent's commands until the pipe closes.
async fn serve(chan: &CudaIpcChannel, pipe: &Pipe) -> Result<(), String> {
    let mut held = Vec::new();
    loop {
        let m = match pipe.recv().await {
            Ok(m) => m,
            Err(e) if e.is_closed() => return Ok(()),
            Err(e) => return Err(format!("recv: {e}")),
        };
        let reply = match m.header["cmd"].as_str().unwrap_or_default() {
            "echo" => {
                pipe.send(m).await.map_err(|e| format!("echo: {e}"))?;
                continue;
            }
            "sums" => {
                let (mut sums, mut devices) = (Vec::new(), Vec::new());
                for t in &m.tensors {
                    let Device::Cuda(d) = t.device() else { return Err("a cpu tensor".into()) };
                    sums.push(fnv(&chan.copy_to_host(t).map_err(|e| format!("copy_to_host: {e}"))?).to_string());
                    devices.push(d);
                }
                if m.header["keep"] == json!(true) {
                    held.push(m);
                } else {
                    drop(m);
                }
                json!({"sums": sums, "devices": devices, "stats": pipe.stats()})
            }
            "drop" => {
                let n = held.len();
                held.clear();
                json!({"dropped": n})
            }
            other => return Err(format!("unknown command {other:?}")),
        };
        pipe.send(Message::new(reply)).await.map_err(|e| format!("reply: {e}"))?;
    }
}

/// Negotiates cuda-ipc by hand and sends a descriptor whose handle is 64 bytes of noise.
async fn hostile(chan: &CudaIpcChannel, addr: &str) -> Result<(), String> {
    let mut raw = RawConn::connect(&Fx, addr).await.map_err(|e| format!("{e:?}"))?;
    let offer = chan.offer(&ConnInfo { same_host: true, ..Default::default() }).ok_or("cuda-ipc not offered")?;
    let uuid = chan.devices().map_err(|e| e.to_string())?[0].uuid.clone();
    raw.handshake_with(json!([offer, {"name": "inline", "devices": ["cpu"]}])).await.map_err(|e| format!("{e:?}"))?;
    let noise = "Wlpa".repeat(21) + "Wg=="; // base64 of 64 bytes of 0x5a
    let desc = json!({"device_uuid": uuid, "mem_handle": noise, "alloc_id": 1, "alloc_size": 2097152,
        "offset": 0, "len": 16, "event_handle": noise, "lease": 1});
    let msg = json!({"header": null, "tensors": [{"meta": {"dtype": "u8", "shape": [16], "device": "cuda:0"},
        "data": {"cuda_ipc": desc}}]});
    let h = serde_json::to_vec(&msg).map_err(|e| e.to_string())?;
    raw.write_prefix(FrameKind::Message as u8, 0, 0, h.len() as u32, 0).await.map_err(|e| format!("{e:?}"))?;
    raw.write_raw(&h).await.map_err(|e| format!("{e:?}"))?;
    let close = raw.expect_close().await.map_err(|e| format!("{e:?}"))?;
    if close.code != "protocol_error" {
        return Err(format!("expected a protocol_error close, got {close:?}"));
    }
    std::future::pending::<()>().await;
    Ok(())
}

// ---- the parent side --------------------------------------------------------------------

enum PeerKind {
    Proc(Child),
    Thread { stop: Option<tokio::sync::oneshot::Sender<()>>, join: Option<std::thread::JoinHandle<()>> },
}

/// A running peer; dropping it kills it.
struct Peer(PeerKind);

impl Peer {
    fn spawn(mode: Mode, role: &str, addr: &str, reversed: bool) -> Result<Peer, Failed> {
        match mode {
            Mode::Gpu => {
                let mut cmd = Command::new(std::env::current_exe().map_err(err("current_exe"))?);
                cmd.env(ROLE, role).env(ADDR, addr).stdin(Stdio::piped()).stdout(Stdio::inherit());
                if reversed {
                    cmd.env(REVERSED, "1").env("CUDA_VISIBLE_DEVICES", reversed_visible_devices());
                }
                Ok(Peer(PeerKind::Proc(cmd.spawn().map_err(err("spawn the peer"))?)))
            }
            Mode::Fake => {
                let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
                let (role, addr) = (role.to_string(), addr.to_string());
                let join = std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build();
                    let Ok(rt) = rt else { return };
                    rt.block_on(async {
                        tokio::select! {
                            r = run_role(Mode::Fake, &role, &addr, reversed) => {
                                if let Err(e) = r { eprintln!("peer {role}: {e}"); }
                            }
                            _ = stopped => {}
                        }
                    });
                    rt.shutdown_timeout(Duration::from_secs(2));
                });
                Ok(Peer(PeerKind::Thread { stop: Some(stop), join: Some(join) }))
            }
        }
    }

    /// SIGKILL for a process; for a thread, its runtime stops (its pipe and tensors drop).
    fn kill(&mut self) {
        match &mut self.0 {
            PeerKind::Proc(c) => {
                let _ = c.kill();
                let _ = c.wait();
            }
            PeerKind::Thread { stop, join } => {
                if let Some(s) = stop.take() {
                    let _ = s.send(());
                }
                if let Some(j) = join.take() {
                    let _ = j.join();
                }
            }
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `CUDA_VISIBLE_DEVICES` for a peer that sees this process's first two devices swapped.
fn reversed_visible_devices() -> String {
    match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(v) if v.split(',').count() >= 2 => {
            let mut d: Vec<&str> = v.split(',').collect();
            d.swap(0, 1);
            d.join(",")
        }
        _ => "1,0".into(),
    }
}

/// The parent's side of one scenario: its channel, listener, pipe and the peer.
struct Rig {
    chan: CudaIpcChannel,
    pipe: Pipe,
    peer: Peer,
    _listener: PipeListener,
}

async fn rig(mode: Mode, role: &str, tag: &str, opts: CudaIpcOptions, reversed: bool) -> Result<Rig, Failed> {
    rig_with(channel(mode, false, opts), mode, role, tag, reversed).await
}

async fn rig_with(chan: CudaIpcChannel, mode: Mode, role: &str, tag: &str, reversed: bool) -> Result<Rig, Failed> {
    let addr = Fx.addr(tag);
    let mut listener = endpoint(&chan).listen(&addr).await.map_err(err("listen"))?;
    let peer = Peer::spawn(mode, role, &addr, reversed)?;
    let pipe = tokio::time::timeout(T, listener.accept())
        .await
        .map_err(|_| "the peer did not connect")?
        .map_err(err("accept"))?;
    if pipe.info().channels.get(&DeviceKind::Cuda).map(String::as_str) != Some("cuda-ipc") {
        return Err(format!("cuda-ipc was not negotiated: {:?}", pipe.info().channels).into());
    }
    Ok(Rig { chan, pipe, peer, _listener: listener })
}

impl Rig {
    async fn request(&self, header: Value, tensors: Vec<Tensor>) -> Result<Message, Failed> {
        self.pipe.send(Message::with_tensors(header, tensors)).await.map_err(err("send"))?;
        self.pipe.recv_timeout(T).await.map_err(err("recv"))
    }

    /// A device tensor of `meta` in the pipe's pool, filled with a pattern; its checksum.
    async fn filled(&self, meta: TensorMeta, seed: u8) -> Result<(Tensor, u64), Failed> {
        let t = self.pipe.alloc_device(meta).await.map_err(err("alloc_device"))?;
        let data = pattern(t.nbytes(), seed);
        self.chan.copy_from_host(&t, &data).map_err(err("copy_from_host"))?;
        Ok((t, fnv(&data)))
    }

    fn stat(&self, key: &str) -> u64 {
        self.pipe.stats()["cuda-ipc"][key].as_u64().unwrap_or(u64::MAX)
    }

    async fn eventually(&self, what: &str, key: &str, want: u64) -> Result<(), Failed> {
        let deadline = Instant::now() + T;
        while self.stat(key) != want {
            if Instant::now() > deadline {
                return Err(
                    format!("{what}: {key} stayed {} (want {want}): {}", self.stat(key), self.pipe.stats()).into()
                );
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Ok(())
    }

    async fn closed_within(&self, d: Duration) -> Result<(), Failed> {
        match tokio::time::timeout(d, self.pipe.recv()).await {
            Ok(Err(e)) if e.is_closed() => Ok(()),
            other => Err(format!("the peer died but recv gave {other:?}").into()),
        }
    }
}

/// Checks that this process can still use the GPU (no sticky error after the scenario).
async fn healthy(chan: &CudaIpcChannel) -> Result<(), Failed> {
    let t = chan.alloc_device(cuda(DType::U8, &[4096], 0)).await.map_err(err("alloc after the scenario"))?;
    let data = pattern(4096, 3);
    chan.copy_from_host(&t, &data).map_err(err("copy after the scenario"))?;
    if chan.copy_to_host(&t).map_err(err("copy back after the scenario"))? != data {
        return Err("device memory reads back wrong after the scenario".into());
    }
    Ok(())
}

fn sums_of(reply: &Message) -> Vec<u64> {
    reply.header["sums"].as_array().into_iter().flatten().filter_map(|s| s.as_str()?.parse().ok()).collect()
}

/// A device buffer ferry does not know (as a tensor from another library would be).
struct Foreign(Tensor);

impl DeviceBuffer for Foreign {
    fn device(&self) -> Device {
        self.0.device()
    }
    fn device_ptr(&self) -> u64 {
        ptr(&self.0)
    }
    fn len(&self) -> usize {
        self.0.nbytes()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The [1920,1080,3] f32 tensor to the peer and back: zero copy both ways (the producer
/// gets its own memory back), then a foreign buffer (one copy in), then timed round trips.
async fn round_trip(mode: Mode) -> Result<(), Failed> {
    let r = rig(mode, "serve", "round-trip", CudaIpcOptions::default(), false).await?;
    let (t, sum) = r.filled(cuda(DType::F32, &[1920, 1080, 3], 0), 1).await?;
    let back = r.request(json!({"cmd": "echo"}), vec![t.clone()]).await?;
    if ptr(&back.tensors[0]) != ptr(&t) || back.tensors[0].meta() != t.meta() {
        return Err("the echo did not come back as the same device memory".into());
    }
    if fnv(&r.chan.copy_to_host(&back.tensors[0]).map_err(err("copy back"))?) != sum {
        return Err("the bytes changed on the way".into());
    }
    let foreign = Tensor::from_device(t.meta().clone(), Arc::new(Foreign(t.clone()))).map_err(err("foreign"))?;
    let back = r.request(json!({"cmd": "echo"}), vec![foreign]).await?;
    if ptr(&back.tensors[0]) == ptr(&t) || fnv(&r.chan.copy_to_host(&back.tensors[0]).map_err(err("copy"))?) != sum {
        return Err("a foreign buffer must travel as one copy, intact".into());
    }
    if r.stat("copies_in") != 1 {
        return Err(format!("copies_in = {}", r.stat("copies_in")).into());
    }
    let msg = Message::with_tensors(json!({"cmd": "echo"}), vec![t]);
    let mut samples = Vec::new();
    for i in 0..220 {
        let start = Instant::now();
        r.pipe.send(msg.clone()).await.map_err(err("send"))?;
        drop(r.pipe.recv_timeout(T).await.map_err(err("recv"))?);
        if i >= 20 {
            samples.push(start.elapsed());
        }
    }
    samples.sort();
    println!(
        "cuda-ipc ({mode:?}) f32[1920,1080,3] round trip: p50 {:.1} us, p99 {:.1} us",
        samples[samples.len() / 2].as_secs_f64() * 1e6,
        samples[samples.len() * 99 / 100].as_secs_f64() * 1e6
    );
    Ok(())
}

/// Many tensors, dtypes and sizes (strided, empty, several per message) written here are
/// read right there, round after round, on a warm pool.
async fn peer_reads_what_was_written(mode: Mode) -> Result<(), Failed> {
    let r = rig(mode, "serve", "reads", CudaIpcOptions::default(), false).await?;
    let mut slabs_after_first = 0;
    for round in 0..4u8 {
        let metas = [
            cuda(DType::F32, &[1920, 1080, 3], 0),
            cuda(DType::U8, &[1], 0),
            cuda(DType::Bf16, &[7, 13], 0),
            cuda(DType::I64, &[0], 0),
            cuda(DType::U16, &[4, 5], 0).with_strides(vec![0, 1]),
            cuda(DType::F64, &[], 0),
            cuda(DType::U8, &[(40 << 20) + 3], 0),
        ];
        let (mut tensors, mut want) = (Vec::new(), Vec::new());
        for (i, m) in metas.into_iter().enumerate() {
            let (t, s) = r.filled(m, round * 16 + i as u8).await?;
            tensors.push(t);
            want.push(s);
        }
        let reply = r.request(json!({"cmd": "sums", "keep": false}), tensors).await?;
        if sums_of(&reply) != want {
            return Err(format!("round {round}: sums {:?}, want {want:?}", sums_of(&reply)).into());
        }
        r.eventually("releases", "leases_granted", 0).await?;
        if round == 0 {
            slabs_after_first = r.stat("slabs");
        } else if r.stat("slabs") != slabs_after_first {
            return Err(format!("the warm pool grew: {} -> {} slabs", slabs_after_first, r.stat("slabs")).into());
        }
    }
    Ok(())
}

/// Leases pin memory across processes until released; then the pool reuses it.
async fn leases_across_processes(mode: Mode) -> Result<(), Failed> {
    let r = rig(mode, "serve", "leases", CudaIpcOptions::default(), false).await?;
    for round in 0..3u8 {
        let mut tensors = Vec::new();
        for i in 0..8 {
            tensors.push(r.filled(cuda(DType::U8, &[1 << 20], 0), round + i).await?.0);
        }
        let reply = r.request(json!({"cmd": "sums", "keep": true}), tensors).await?;
        if r.stat("leases_granted") != 8 || reply.header["stats"]["cuda-ipc"]["leases_held"] != json!(8) {
            return Err(format!("round {round}: leases {} / {}", r.pipe.stats(), reply.header["stats"]).into());
        }
        let reply = r.request(json!({"cmd": "drop"}), vec![]).await?;
        if reply.header["dropped"] != json!(1) {
            return Err(format!("drop: {}", reply.header).into());
        }
        r.eventually("releases", "leases_granted", 0).await?;
    }
    Ok(())
}

/// A consumer killed while holding leases: the producer notices, reclaims every lease, and
/// its GPU state stays sound.
async fn killed_consumer(mode: Mode) -> Result<(), Failed> {
    let chan = channel(mode, false, CudaIpcOptions::default());
    for i in 0..KILLS {
        let mut r = rig_with(chan.clone(), mode, "serve", &format!("kill-consumer-{i}"), false).await?;
        let (a, _) = r.filled(cuda(DType::F32, &[1 << 18], 0), 1).await?;
        let (b, _) = r.filled(cuda(DType::U8, &[1000], 0), 2).await?;
        r.request(json!({"cmd": "sums", "keep": true}), vec![a, b]).await?;
        if r.stat("leases_granted") != 2 {
            return Err(format!("kill {i}: {}", r.pipe.stats()).into());
        }
        r.peer.kill();
        r.closed_within(NOTICE).await?;
        r.eventually("reclaim", "leases_granted", 0).await?;
    }
    healthy(&chan).await
}

/// A producer killed while the consumer holds its tensor: the consumer's tensor becomes
/// orphaned (ferry operations fail with Closed), dropping it is clean, nothing crashes.
async fn killed_producer(mode: Mode) -> Result<(), Failed> {
    let r = rig(mode, "produce", "kill-producer", CudaIpcOptions::default(), false).await?;
    let m = r.pipe.recv_timeout(T).await.map_err(err("recv"))?;
    let t = &m.tensors[0];
    let want: u64 = m.header["sum"].as_str().and_then(|s| s.parse().ok()).ok_or("no sum")?;
    if fnv(&r.chan.copy_to_host(t).map_err(err("copy"))?) != want {
        return Err("the producer's bytes read wrong".into());
    }
    let mut r = r;
    r.peer.kill();
    r.closed_within(NOTICE).await?;
    let deadline = Instant::now() + NOTICE;
    while !is_orphaned(t) {
        if Instant::now() > deadline {
            return Err("the tensor was not orphaned after the producer died".into());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    match r.chan.copy_to_host(t) {
        Err(ChannelError::Closed) => {}
        other => return Err(format!("copy_to_host of an orphaned tensor gave {:?}", other.map(|v| v.len())).into()),
    }
    drop(m);
    healthy(&r.chan).await
}

/// Slabs freed and allocated again (often at the same address, with a new handle) are
/// never read through a stale mapping; the peer closes retired mappings.
async fn retired_slabs_and_reused_addresses(mode: Mode) -> Result<(), Failed> {
    let opts = CudaIpcOptions { slab_bytes: 2 << 20, ..Default::default() };
    let r = rig(mode, "serve", "retire", opts, false).await?;
    let mut bases = Vec::new();
    for round in 0..6u8 {
        let (t, want) = r.filled(cuda(DType::U8, &[1 << 20], 0), round).await?;
        bases.push(ptr(&t));
        let reply = r.request(json!({"cmd": "sums", "keep": false}), vec![t]).await?;
        if sums_of(&reply) != [want] {
            return Err(format!("round {round}: read {:?}, want {want} (a stale mapping?)", sums_of(&reply)).into());
        }
        r.eventually("release", "leases_granted", 0).await?;
        if r.chan.trim() != 1 {
            return Err(format!("round {round}: trim freed no slab").into());
        }
    }
    let reply = r.request(json!({"cmd": "sums", "keep": false}), vec![]).await?;
    let retired = reply.header["stats"]["cuda-ipc"]["retires_received"].as_u64().unwrap_or(0);
    if retired < 5 {
        return Err(format!("the peer heard of {retired} retirements: {}", reply.header["stats"]).into());
    }
    bases.sort();
    bases.dedup();
    println!("retire ({mode:?}): 6 slabs at {} distinct addresses, {retired} retirements", bases.len());
    Ok(())
}

/// The peer sees the devices in the other order (`CUDA_VISIBLE_DEVICES`): tensors land on
/// the same physical GPU, found by UUID.
async fn devices_matched_by_uuid(mode: Mode) -> Result<(), Failed> {
    let r = rig(mode, "serve", "uuid", CudaIpcOptions::default(), true).await?;
    let (a, sa) = r.filled(cuda(DType::U8, &[4096], 0), 1).await?;
    let (b, sb) = r.filled(cuda(DType::U8, &[4096], 1), 2).await?;
    let reply = r.request(json!({"cmd": "sums", "keep": false}), vec![a, b]).await?;
    if reply.header["devices"] != json!([1, 0]) || sums_of(&reply) != [sa, sb] {
        return Err(format!("expected devices [1, 0] and the same bytes, got {}", reply.header).into());
    }
    Ok(())
}

/// Two pipes of one process never negotiate cuda-ipc (a process never opens its own
/// handle); a descriptor of noise is refused with an error, not a crash.
async fn refusals(mode: Mode) -> Result<(), Failed> {
    let chan = channel(mode, false, CudaIpcOptions::default());
    let addr = Fx.addr("self");
    let mut l = endpoint(&chan).listen(&addr).await.map_err(err("listen"))?;
    let c = endpoint(&chan).connect(&addr).await.map_err(err("connect"))?;
    let _s = l.accept().await.map_err(err("accept"))?;
    if c.info().channels.contains_key(&DeviceKind::Cuda) {
        return Err("cuda-ipc was negotiated within one process".into());
    }
    let addr = Fx.addr("hostile");
    let mut l = endpoint(&chan).listen(&addr).await.map_err(err("listen"))?;
    let _peer = Peer::spawn(mode, "hostile", &addr, false)?;
    let pipe = tokio::time::timeout(T, l.accept()).await.map_err(|_| "no hostile peer")?.map_err(err("accept"))?;
    match pipe.recv_timeout(T).await {
        Err(e) if e.to_string().contains("cuIpcOpenMemHandle") => {}
        other => return Err(format!("a descriptor of noise gave {other:?}").into()),
    }
    healthy(&chan).await
}

type Scenario = fn(Mode) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), Failed>>>>;

macro_rules! scenarios {
    ($($f:ident),* $(,)?) => { vec![$((stringify!($f), (|m| Box::pin($f(m))) as Scenario)),*] };
}

fn run(mode: Mode, f: Scenario) -> Result<(), Failed> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(err("rt"))?;
    let r = rt.block_on(async { tokio::time::timeout(Duration::from_secs(300), f(mode)).await });
    rt.shutdown_timeout(Duration::from_secs(2));
    r.map_err(|_| Failed::from("the scenario did not finish within 300 s"))?
}

fn main() -> ExitCode {
    if let (Ok(role), Ok(addr)) = (std::env::var(ROLE), std::env::var(ADDR)) {
        // Exit when the parent goes away, however it died.
        std::thread::spawn(|| {
            let _ = std::io::stdin().read(&mut [0u8; 1]);
            std::process::exit(0);
        });
        let reversed = std::env::var_os(REVERSED).is_some();
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build();
        let r = rt.map_err(|e| e.to_string()).and_then(|rt| rt.block_on(run_role(Mode::Gpu, &role, &addr, reversed)));
        return match r {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("gpu peer {role}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let mut args = Arguments::from_args();
    // GPU memory, timings and kill counts are per process: one scenario at a time.
    args.test_threads = Some(1);
    let real = CudaIpcChannel::new();
    let viable = real.viability().map_err(|e| e.to_string());
    let gpus = real.devices().map(|d| d.len()).unwrap_or(0);
    match &viable {
        Ok(()) => eprintln!("gpu tests: {gpus} device(s): {:?}", real.devices().unwrap_or_default()),
        Err(why) => eprintln!("gpu tests: the gpu::* scenarios are ignored: {why}"),
    }
    let mut trials = Vec::new();
    for (name, f) in scenarios![
        round_trip,
        peer_reads_what_was_written,
        leases_across_processes,
        killed_consumer,
        killed_producer,
        retired_slabs_and_reused_addresses,
        devices_matched_by_uuid,
        refusals,
    ] {
        let ignored = viable.is_err() || (name == "devices_matched_by_uuid" && gpus < 2);
        trials.push(Trial::test(format!("gpu::{name}"), move || run(Mode::Gpu, f)).with_ignored_flag(ignored));
        trials.push(Trial::test(format!("fake::{name}"), move || run(Mode::Fake, f)));
    }
    libtest_mimic::run(&args, trials).exit_code()
}
