//! Session tests with the in-memory driver: two sessions wired back to back (descriptors go
//! through their JSON form, CONTROL frames are pumped by hand), each in its own simulated
//! process on one simulated machine.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use ferry_core::wire::Location;
use ferry_core::{
    Channel, ChannelError, ChannelSession, ConnInfo, ControlWaker, DType, Device, DeviceBuffer, Incoming, Outgoing,
    SessionCtx, Tensor, TensorMeta,
};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::fake::{FakeDriver, FakeGpu};
use crate::{CudaIpcChannel, CudaIpcOptions, WaitMode, is_orphaned};

/// One side: a channel over a simulated process, and one session of it.
struct End {
    chan: CudaIpcChannel,
    drv: Arc<FakeDriver>,
    session: Arc<dyn ChannelSession>,
    /// Kept for the sessions' waits that end when the pipe closes.
    _closed: watch::Sender<bool>,
}

fn end(drv: Arc<FakeDriver>, opts: CudaIpcOptions) -> End {
    let chan = CudaIpcChannel::with_driver(drv.clone(), opts);
    session_of(chan, drv)
}

fn session_of(chan: CudaIpcChannel, drv: Arc<FakeDriver>) -> End {
    let control = ControlWaker::new();
    let (closed, closed_rx) = watch::channel(false);
    let ctx =
        SessionCtx { conn: ConnInfo::default(), control, closed: closed_rx, is_server: false, features: Vec::new() };
    let session = chan.open(ctx).expect("open");
    End { chan, drv, session, _closed: closed }
}

fn pair(gpu: &Arc<FakeGpu>) -> (End, End) {
    (end(gpu.process(1), CudaIpcOptions::default()), end(gpu.process(2), CudaIpcOptions::default()))
}

fn incoming() -> Incoming {
    Incoming::new(
        Bytes::new(),
        #[cfg(unix)]
        Vec::new(),
    )
}

/// Encodes on `from`, sends the descriptor through JSON, decodes on `to`.
async fn send(from: &End, to: &End, t: &Tensor) -> Result<(Tensor, Location), ChannelError> {
    let loc = encode(from, t).await?;
    Ok((decode_raw(to, t.meta().clone(), serde_json::to_value(&loc).unwrap()).await?, loc))
}

async fn encode(from: &End, t: &Tensor) -> Result<Location, ChannelError> {
    let mut out = Outgoing::default();
    let loc = from.session.encode(t, &mut out).await?;
    let (_frame, tickets) = out.finish(Vec::new());
    tickets.sent();
    Ok(loc)
}

async fn decode_raw(to: &End, meta: TensorMeta, loc: Value) -> Result<Tensor, ChannelError> {
    let loc: Location = serde_json::from_value(loc).expect("location parses");
    to.session.decode(meta, &loc, &mut incoming()).await
}

/// Pulls `from`'s due CONTROL frames (as its pipe's writer would) and delivers them to `to`.
async fn pump(from: &mut End, to: &End) -> Result<usize, ChannelError> {
    let mut due = Vec::new();
    assert_eq!(from.session.poll_control(Instant::now(), &mut due), None, "cuda-ipc asks for no timer");
    let n = due.len();
    for c in due {
        assert_eq!(c.channel, "cuda-ipc");
        to.session.control(&c.body, &mut incoming())?;
    }
    Ok(n)
}

/// A CONTROL body as the pipe hands it to a session: JSON text.
fn raw(v: &serde_json::Value) -> Box<serde_json::value::RawValue> {
    serde_json::value::to_raw_value(v).expect("JSON")
}

fn stat(e: &End, key: &str) -> u64 {
    e.session.stats()[key].as_u64().unwrap_or_else(|| panic!("no stat {key}"))
}

fn meta(n: u64) -> TensorMeta {
    TensorMeta::new(DType::F32, vec![n]).with_device(Device::Cuda(0))
}

async fn filled(e: &End, n: u64, seed: u8) -> Tensor {
    let t = e.session.alloc_device(&meta(n)).await.unwrap().expect("cuda-ipc allocates");
    let bytes: Vec<u8> = (0..n * 4).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
    e.chan.copy_from_host(&t, &bytes).unwrap();
    t
}

#[tokio::test]
async fn round_trip_leases_and_release() {
    let gpu = FakeGpu::new(1);
    let (mut a, b) = pair(&gpu);
    let t = filled(&a, 1000, 1).await;
    let (got, loc) = send(&a, &b, &t).await.unwrap();
    assert!(matches!(loc, Location::CudaIpc(_)));
    assert_eq!(got.device(), Device::Cuda(0));
    assert_eq!(b.chan.copy_to_host(&got).unwrap(), a.chan.copy_to_host(&t).unwrap());
    assert_eq!((stat(&a, "leases_granted"), stat(&b, "leases_held"), stat(&b, "peer_allocs")), (1, 1, 1));
    assert_eq!(b.drv.calls("cuStreamWaitEvent"), 1, "the consumer waited on the producer's event");
    assert_eq!(stat(&a, "copies_in"), 0, "pool memory is sent without a copy");
    let mut b = b;
    drop(got);
    assert_eq!(pump(&mut b, &a).await.unwrap(), 1);
    assert_eq!((stat(&a, "leases_granted"), stat(&b, "leases_held")), (0, 0));
    assert_eq!(a.drv.calls("cuStreamWaitEvent"), 1, "the producer ordered reuse after the consumer's event");
    assert_eq!(stat(&b, "releases_sent"), 1);
    drop(pump(&mut a, &b).await);
}

#[tokio::test]
async fn one_open_per_allocation_and_no_copy() {
    let gpu = FakeGpu::new(1);
    let (a, b) = pair(&gpu);
    let mut held = Vec::new();
    for i in 0..5u8 {
        let t = filled(&a, 256, i).await;
        let (got, _) = send(&a, &b, &t).await.unwrap();
        assert_eq!(b.chan.copy_to_host(&got).unwrap(), a.chan.copy_to_host(&t).unwrap());
        held.push(got);
    }
    assert_eq!(b.drv.calls("cuIpcOpenMemHandle"), 1, "five tensors of one slab, one mapping");
    assert_eq!(b.drv.calls("cuIpcOpenEventHandle"), 1, "one event per peer and device");
    assert_eq!((stat(&b, "peer_allocs"), stat(&b, "leases_held")), (1, 5));
}

#[tokio::test]
async fn return_to_sender_is_a_reference() {
    let gpu = FakeGpu::new(1);
    let (a, b) = pair(&gpu);
    let t = filled(&a, 64, 9).await;
    let (got, _) = send(&a, &b, &t).await.unwrap();
    let (back, loc) = send(&b, &a, &got).await.unwrap();
    assert!(matches!(loc, Location::CudaIpcReturn(_)), "{loc:?}");
    let ptr = |t: &Tensor| t.device_buffer().unwrap().device_ptr();
    assert_eq!(ptr(&back), ptr(&t), "the producer got its own memory back");
    assert_eq!(a.drv.calls("cuIpcOpenMemHandle"), 0, "a process never opens its own handle");
    assert_eq!((stat(&b, "returns_sent"), stat(&a, "returns_received")), (1, 1));
    // Sent out again, the same lease-backed memory costs no copy either.
    let (again, _) = send(&a, &b, &back).await.unwrap();
    assert_eq!(b.chan.copy_to_host(&again).unwrap(), a.chan.copy_to_host(&t).unwrap());
    assert_eq!(stat(&a, "copies_in"), 0);
}

/// A device buffer the channel does not know (e.g. a tensor from another library).
struct Foreign {
    ptr: u64,
    len: usize,
}

impl DeviceBuffer for Foreign {
    fn device(&self) -> Device {
        Device::Cuda(0)
    }
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[tokio::test]
async fn foreign_memory_costs_one_device_copy() {
    let gpu = FakeGpu::new(1);
    let (a, b) = pair(&gpu);
    let ptr = crate::Driver::alloc(&*a.drv, 0, 4096).unwrap();
    crate::Driver::copy_htod(&*a.drv, 0, ptr, &[5u8; 4096]).unwrap();
    let t = Tensor::from_device(meta(1024), Arc::new(Foreign { ptr, len: 4096 })).unwrap();
    let (got, _) = send(&a, &b, &t).await.unwrap();
    assert_eq!(b.chan.copy_to_host(&got).unwrap(), vec![5u8; 4096]);
    assert_eq!(stat(&a, "copies_in"), 1);
    // A bogus pointer is an error, not a crash.
    let bogus = Tensor::from_device(meta(1024), Arc::new(Foreign { ptr: 0xdead_0000, len: 4096 })).unwrap();
    assert!(matches!(encode(&a, &bogus).await, Err(ChannelError::Backend(_))));
    // Forwarded to a third process: the lease-backed memory is copied once, there.
    let c = end(gpu.process(3), CudaIpcOptions::default());
    let b_to_c = session_of(b.chan.clone(), b.drv.clone());
    let (fwd, _) = send(&b_to_c, &c, &got).await.unwrap();
    assert_eq!(c.chan.copy_to_host(&fwd).unwrap(), vec![5u8; 4096]);
    assert_eq!(stat(&b_to_c, "copies_in"), 1);
}

#[tokio::test]
async fn devices_are_matched_by_uuid_not_ordinal() {
    let gpu = FakeGpu::new(2);
    let a = end(gpu.process(1), CudaIpcOptions::default());
    let b = end(gpu.process_with_devices(2, vec![1, 0]), CudaIpcOptions::default());
    let m = TensorMeta::new(DType::U8, vec![16]).with_device(Device::Cuda(1));
    let t = a.session.alloc_device(&m).await.unwrap().unwrap();
    a.chan.copy_from_host(&t, &[3; 16]).unwrap();
    let (got, loc) = send(&a, &b, &t).await.unwrap();
    let Location::CudaIpc(r) = loc else { panic!("{loc:?}") };
    assert_eq!(r.device_uuid, gpu.uuid(1));
    assert_eq!(got.device(), Device::Cuda(0), "the consumer's cuda:0 is the producer's cuda:1");
    assert_eq!(b.chan.copy_to_host(&got).unwrap(), vec![3; 16]);
}

fn ptr(t: &Tensor) -> u64 {
    t.device_buffer().unwrap().device_ptr()
}

#[tokio::test]
async fn retired_allocations_are_closed() {
    let gpu = FakeGpu::new(1);
    let (mut a, mut b) = pair(&gpu);
    let t = filled(&a, 100, 1).await;
    let (got, _) = send(&a, &b, &t).await.unwrap();
    assert_eq!(a.chan.trim(), 0, "a slab in use stays");
    drop((t, got));
    pump(&mut b, &a).await.unwrap();
    assert_eq!(a.chan.trim(), 1, "the empty slab is freed");
    assert_eq!(pump(&mut a, &b).await.unwrap(), 1, "the peer is told");
    assert_eq!((stat(&b, "peer_allocs"), stat(&b, "retires_received")), (0, 1));
    assert_eq!(b.drv.open_imports(), 0, "and closed its mapping");
    assert_eq!(gpu.live_memory(), 0);
}

#[tokio::test]
async fn a_reused_address_never_hits_a_stale_mapping() {
    let gpu = FakeGpu::new(1);
    let (a, mut b) = pair(&gpu);
    let t1 = filled(&a, 100, 1).await;
    let (g1, l1) = send(&a, &b, &t1).await.unwrap();
    let Location::CudaIpc(first) = l1 else { panic!("{l1:?}") };
    let p1 = ptr(&t1);
    drop((t1, g1));
    pump(&mut b, &a).await.unwrap();
    // The slab is freed, but its retirement has not reached the consumer yet.
    assert_eq!(a.chan.trim(), 1);
    let t2 = filled(&a, 100, 2).await;
    assert_eq!(ptr(&t2), p1, "the driver handed out the same address again");
    let mut l2 = serde_json::to_value(encode(&a, &t2).await.unwrap()).unwrap();
    assert_ne!(l2["cuda_ipc"]["mem_handle"], json!(first.mem_handle), "with a new handle");
    // Even a peer that reuses the allocation id too (one keyed by address, say) gets the
    // new memory: the handle bytes differ, so the cached mapping is stale and replaced.
    l2["cuda_ipc"]["alloc_id"] = json!(first.alloc_id);
    let g2 = decode_raw(&b, t2.meta().clone(), l2).await.unwrap();
    assert_eq!(b.chan.copy_to_host(&g2).unwrap(), a.chan.copy_to_host(&t2).unwrap());
    assert_eq!(stat(&b, "stale_evictions"), 1);
    assert_eq!(b.drv.open_imports(), 1, "the stale mapping was closed");
}

#[tokio::test]
async fn hostile_descriptors_are_refused() {
    let gpu = FakeGpu::new(1);
    let (a, b) = pair(&gpu);
    let t = filled(&a, 16, 0).await;
    let good = serde_json::to_value(encode(&a, &t).await.unwrap()).unwrap();
    let m = t.meta().clone();
    let try_with = |edit: &dyn Fn(&mut Value)| {
        let mut v = good.clone();
        edit(&mut v["cuda_ipc"]);
        v
    };
    let cases: Vec<(Value, &str)> = vec![
        (
            try_with(&|v| {
                v["mem_handle"] = json!("not base64 at all, not at all, not at all, not at all, not at all, not ab")
            }),
            "mem_handle",
        ),
        (try_with(&|v| v["mem_handle"] = json!("AAAA")), "88 characters"),
        (try_with(&|v| v["event_handle"] = json!("")), "event_handle"),
        (try_with(&|v| v["offset"] = json!(67_108_864)), "outside the allocation"),
        (try_with(&|v| v["len"] = json!(9_007_199_254_740_991u64)), "outside the allocation"),
        (try_with(&|v| v["alloc_size"] = json!(1u64 << 50)), "over the limit"),
        (try_with(&|v| v["alloc_size"] = json!(-1)), "invalid value: integer `-1`"),
        // The 64-bit rule (PROTOCOL.md 5.5): numbers only, at most 2^53 - 1.
        (try_with(&|v| v["alloc_size"] = json!("67108864")), "invalid type: string"),
        (try_with(&|v| v["len"] = json!(u64::MAX)), "0..=9007199254740991"),
        (try_with(&|v| v["device_uuid"] = json!("GPU-00000000-0000-0000-0000-000000000000")), "not visible here"),
        (try_with(&|v| v["device_uuid"] = json!("cuda:0")), "not a device UUID"),
        (try_with(&|v| v["len"] = json!(60)), "needs 64 bytes"),
        // The allocation is really 64 MiB; claiming more would let reads run past it.
        (try_with(&|v| v["alloc_size"] = json!(134_217_728)), "the driver mapped"),
        // 64 random bytes that are no handle.
        (
            try_with(&|v| {
                v["mem_handle"] = json!(crate::descriptor::handle_to_b64(&crate::driver::IpcHandle([7; 64])))
            }),
            "unknown or freed handle",
        ),
    ];
    for (loc, needle) in cases {
        // Numbers that break the 64-bit rule are refused while the frame's header is parsed.
        let e = match serde_json::from_value::<Location>(loc.clone()) {
            Err(e) => e.to_string(),
            Ok(_) => match decode_raw(&b, m.clone(), loc.clone()).await {
                Err(e) => e.to_string(),
                Ok(_) => panic!("accepted {loc}"),
            },
        };
        assert!(e.contains(needle), "{e:?} does not mention {needle:?} for {loc}");
    }
    // A CPU tensor cannot come over cuda-ipc; a lease cannot be granted twice.
    let cpu = TensorMeta::new(DType::F32, vec![16]);
    assert!(decode_raw(&b, cpu, good.clone()).await.is_err());
    let first = decode_raw(&b, m.clone(), good.clone()).await.unwrap();
    let e = decode_raw(&b, m.clone(), good.clone()).await.unwrap_err();
    assert!(e.to_string().contains("granted twice"), "{e}");
    drop(first);
    // A process handed its own handle refuses to open it.
    let e = decode_raw(&a, m.clone(), good.clone()).await.unwrap_err();
    assert!(e.to_string().contains("its own") || e.to_string().contains("exported"), "{e}");
    assert!(decode_raw(&b, m.clone(), json!({"inline": {"offset": 0, "len": 64}})).await.is_err());
}

#[tokio::test]
async fn hostile_control_and_returns_are_refused() {
    let gpu = FakeGpu::new(1);
    let (a, b) = pair(&gpu);
    let t = filled(&a, 16, 0).await;
    let (got, _) = send(&a, &b, &t).await.unwrap();
    let ev = crate::descriptor::handle_to_b64(&crate::driver::IpcHandle([1; 64]));
    let uuid = gpu.uuid(0);
    let bad_controls = [
        (json!({"release": [99], "device": uuid, "event": ev}), "release of lease 99"),
        (json!({"release": [1, 1], "device": uuid, "event": ev}), "release of lease 1"),
        (json!({"release": [1]}), "needs a valid"),
        (json!({"release": [1], "device": "GPU-11111111-0000-0000-0000-000000000000", "event": ev}), "not visible"),
        (json!({"retire": ["x"]}), "invalid type: string"),
        (json!({"retire": [1u64 << 53]}), "0..=9007199254740991"),
        (json!({"bogus": 1}), "unknown field"),
    ];
    for (body, needle) in bad_controls {
        let e = a.session.control(&raw(&body), &mut incoming()).unwrap_err();
        assert!(e.to_string().contains(needle), "{e} for {body}");
    }
    assert_eq!(stat(&a, "leases_granted"), 1, "a refused release releases nothing");
    // Returns of leases never granted, or ranges outside the lease.
    let mut back = serde_json::to_value(encode(&b, &got).await.unwrap()).unwrap();
    back["cuda_ipc_return"]["lease"] = json!(42);
    let e = decode_raw(&a, t.meta().clone(), back.clone()).await.unwrap_err();
    assert!(e.to_string().contains("never granted"), "{e}");
    back["cuda_ipc_return"]["lease"] = json!(1);
    back["cuda_ipc_return"]["offset"] = json!(8);
    let e = decode_raw(&a, t.meta().clone(), back).await.unwrap_err();
    assert!(e.to_string().contains("outside lease"), "{e}");
    // Retiring an allocation that is not mapped is harmless.
    a.session.control(&raw(&json!({"retire": [123_456]})), &mut incoming()).unwrap();
}

#[tokio::test]
async fn close_reclaims_leases_and_orphans_received_tensors() {
    let gpu = FakeGpu::new(1);
    let (a, b) = pair(&gpu);
    let t = filled(&a, 32, 4).await;
    let (got, _) = send(&a, &b, &t).await.unwrap();
    let copy = got.clone();
    assert!(!is_orphaned(&got));
    // The consumer goes away: the producer reclaims every lease it held.
    a.session.close();
    assert_eq!(stat(&a, "leases_granted"), 0);
    assert!(matches!(encode(&a, &t).await, Err(ChannelError::Closed)));
    // The producer goes away: the consumer's tensors are orphaned; ferry operations on them
    // fail with Closed, and dropping them closes the mapping.
    b.session.close();
    assert!(is_orphaned(&got) && is_orphaned(&copy));
    assert!(matches!(b.chan.copy_to_host(&got), Err(ChannelError::Closed)));
    let other = end(gpu.process(3), CudaIpcOptions::default());
    let b2 = session_of(b.chan.clone(), b.drv.clone());
    assert!(matches!(encode(&b2, &got).await, Err(ChannelError::Closed)));
    assert!(b.chan.copy_from_host(&got, &[0; 128]).is_err(), "received tensors are read-only");
    assert_eq!(b.drv.open_imports(), 1);
    drop((got, copy));
    assert_eq!(b.drv.open_imports(), 0);
    drop(other);
}

#[tokio::test]
async fn an_aborted_message_grants_nothing() {
    let gpu = FakeGpu::new(1);
    let (a, _b) = pair(&gpu);
    let t = filled(&a, 8, 0).await;
    let mut out = Outgoing::default();
    a.session.encode(&t, &mut out).await.unwrap();
    assert_eq!(stat(&a, "leases_granted"), 1);
    out.abort();
    assert_eq!(stat(&a, "leases_granted"), 0);
}

#[tokio::test]
async fn host_wait_mode_synchronises() {
    let gpu = FakeGpu::new(1);
    let a = end(gpu.process(1), CudaIpcOptions::default());
    let b = end(gpu.process(2), CudaIpcOptions { wait: WaitMode::Host, ..Default::default() });
    let t = filled(&a, 8, 0).await;
    send(&a, &b, &t).await.unwrap();
    assert_eq!(b.drv.calls("cuEventSynchronize"), 1);
}

#[tokio::test]
async fn driver_failures_are_errors_not_crashes() {
    let gpu = FakeGpu::new(1);
    let (a, b) = pair(&gpu);
    let t = filled(&a, 8, 0).await;
    let loc = serde_json::to_value(encode(&a, &t).await.unwrap()).unwrap();
    for op in ["cuIpcOpenMemHandle", "cuIpcOpenEventHandle", "cuStreamWaitEvent"] {
        b.drv.fail_next(op, 1);
        let e = decode_raw(&b, t.meta().clone(), loc.clone()).await.unwrap_err();
        assert!(e.to_string().contains("injected"), "{op}: {e}");
    }
    assert!(decode_raw(&b, t.meta().clone(), loc).await.is_ok(), "the next try works");
    for op in ["cuEventRecord", "cuEventCreate"] {
        let c = end(gpu.process(5), CudaIpcOptions::default());
        let t = filled(&c, 8, 0).await;
        c.drv.fail_next(op, 1);
        assert!(matches!(encode(&c, &t).await, Err(ChannelError::Backend(_))), "{op}");
    }
    a.drv.fail_next("cuMemcpyDtoH", 1);
    assert!(a.chan.copy_to_host(&t).is_err());
}

#[tokio::test]
async fn not_viable_without_a_driver_and_never_with_itself() {
    let gpu = FakeGpu::new(1);
    let broken = CudaIpcChannel::with_driver(gpu.broken_process(1, "no CUDA driver here"), Default::default());
    let e = broken.viability().unwrap_err();
    assert!(e.to_string().contains("no CUDA driver here"), "{e}");
    let conn = ConnInfo { same_host: true, peer_pid: Some(77), ..Default::default() };
    assert!(broken.offer(&conn).is_none());
    let a = CudaIpcChannel::with_driver(gpu.process(1), Default::default());
    let b = CudaIpcChannel::with_driver(gpu.process(2), Default::default());
    a.viability().unwrap();
    let offer = b.offer(&conn).unwrap();
    assert!(a.accepts(&offer, &conn));
    assert_eq!(offer.domain["pid"], "2");
    assert!(offer.domain.contains_key("boot_id"));
    // Same process, another host, no shared GPU, another boot: refused.
    assert!(!a.accepts(&a.offer(&conn).unwrap(), &conn), "own pid");
    let self_conn = ConnInfo { same_host: true, peer_pid: Some(1), ..Default::default() };
    assert!(a.offer(&self_conn).is_none() && !a.accepts(&offer, &self_conn));
    let remote = ConnInfo { same_host: false, ..conn.clone() };
    assert!(b.offer(&remote).is_none() && !a.accepts(&offer, &remote));
    let other_gpu = CudaIpcChannel::with_driver(FakeGpu::new(1).process(3), Default::default());
    assert!(!a.accepts(&other_gpu.offer(&conn).unwrap(), &conn));
    for key in ["boot_id", "pid_ns", "pid", "uuids"] {
        let mut o = offer.clone();
        o.domain.insert(key.into(), "elsewhere".into());
        assert!(!a.accepts(&o, &conn), "{key} differs");
        o.domain.remove(key);
        assert!(!a.accepts(&o, &conn), "{key} missing");
    }
}

#[tokio::test]
async fn pool_limits_name_the_option() {
    let gpu = FakeGpu::new(1);
    let opts = CudaIpcOptions {
        pool_limit: 4 << 20,
        slab_bytes: 2 << 20,
        full_wait: std::time::Duration::ZERO,
        ..Default::default()
    };
    let a = end(gpu.process(1), opts);
    let e = a
        .session
        .alloc_device(&TensorMeta::new(DType::U8, vec![8 << 20]).with_device(Device::Cuda(0)))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("CudaIpcOptions::pool_limit"), "{e}");
    assert!(a.session.alloc_device(&TensorMeta::new(DType::U8, vec![8])).await.unwrap().is_none(), "cpu: not ours");
    let e =
        a.session.alloc_device(&TensorMeta::new(DType::U8, vec![8]).with_device(Device::Cuda(3))).await.unwrap_err();
    assert!(e.to_string().contains("cuda:3"), "{e}");
    // A zero-size tensor still travels.
    let z = a
        .session
        .alloc_device(&TensorMeta::new(DType::F32, vec![0]).with_device(Device::Cuda(0)))
        .await
        .unwrap()
        .unwrap();
    let b = end(gpu.process(2), CudaIpcOptions::default());
    let (got, _) = send(&a, &b, &z).await.unwrap();
    assert_eq!(got.nbytes(), 0);
}

/// On a machine without a usable driver (CI), the real channel says why, offers nothing,
/// accepts nothing, opens nothing, and no call panics.
#[tokio::test]
async fn the_real_channel_without_a_driver_is_not_viable() {
    let real = CudaIpcChannel::new();
    let Err(e) = real.viability() else {
        eprintln!("a usable CUDA driver is present; the gpu tests cover this machine");
        return;
    };
    assert!(matches!(e, ChannelError::NotViable(_)), "{e:?}");
    assert!(!e.to_string().is_empty());
    let conn = ConnInfo { same_host: true, peer_pid: Some(1), ..Default::default() };
    assert!(real.offer(&conn).is_none());
    let gpu = FakeGpu::new(1);
    let offer = CudaIpcChannel::with_driver(gpu.process(7), Default::default()).offer(&conn).unwrap();
    assert!(!real.accepts(&offer, &conn));
    let control = ControlWaker::new();
    let (_tx, closed) = watch::channel(false);
    assert!(real.open(SessionCtx { conn, control, closed, is_server: true, features: Vec::new() }).is_err());
    let m = TensorMeta::new(DType::U8, vec![4]).with_device(Device::Cuda(0));
    assert!(real.alloc_device(m.clone()).await.is_err());
    let fake_tensor = Tensor::from_device(m, Arc::new(Foreign { ptr: 0x1000, len: 4 })).unwrap();
    assert!(real.copy_to_host(&fake_tensor).is_err());
    assert!(real.copy_from_host(&fake_tensor, &[0; 4]).is_err());
    assert_eq!(real.trim(), 0);
}

#[tokio::test]
async fn a_received_tensor_copied_on_the_device_outlives_its_lease() {
    let gpu = FakeGpu::new(1);
    let (a, b) = pair(&gpu);
    let t = filled(&a, 1000, 4).await;
    let want = a.chan.copy_to_host(&t).unwrap();
    let (got, _) = send(&a, &b, &t).await.unwrap();
    let events = b.drv.live_events();
    let kept = b.chan.copy_on_device(&got).await.unwrap();
    assert_eq!(b.drv.live_events(), events, "the copy's own event is destroyed");
    assert_eq!(kept.meta(), got.meta());
    // The lease ends (released to the producer, who may reuse its memory): the copy stays.
    let mut b = b;
    drop(got);
    assert_eq!(pump(&mut b, &a).await.unwrap(), 1);
    assert_eq!(stat(&b, "leases_held"), 0);
    a.chan.copy_from_host(&t, &vec![0u8; want.len()]).unwrap();
    assert_eq!(b.chan.copy_to_host(&kept).unwrap(), want);
    // It is pool memory of the copier: sent on, no further copy.
    let b_to_a = session_of(b.chan.clone(), b.drv.clone());
    let (_, loc) = send(&b_to_a, &a, &kept).await.unwrap();
    assert!(matches!(loc, Location::CudaIpc(_)), "{loc:?}");
    assert_eq!(stat(&b_to_a, "copies_in"), 0);
    // A host tensor is not the call's to copy.
    let host = Tensor::from_slice(vec![4], &[1.0f32; 4]).unwrap();
    assert!(matches!(b.chan.copy_on_device(&host).await, Err(ChannelError::Unsupported { .. })));
}
