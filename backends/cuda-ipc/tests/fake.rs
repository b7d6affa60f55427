//! The whole stack without a GPU: real pipes over unix sockets, real handshakes and CONTROL
//! frames, with each endpoint's channel over its own simulated process of one simulated
//! machine (`ferry_cuda_ipc::fake`).

use std::sync::Arc;
use std::time::Duration;

use ferry_conformance::Fixture;
use ferry_conformance::peer::RawConn;
use ferry_core::frame::FrameKind;
use ferry_core::{
    Channel, ConnInfo, DType, Device, DeviceKind, Endpoint, InlineChannel, Message, Pipe, PipeError, PipeListener,
    Tensor, TensorMeta, Transport,
};
use ferry_cuda_ipc::fake::{FakeDriver, FakeGpu};
use ferry_cuda_ipc::{CudaIpcChannel, CudaIpcOptions, is_orphaned};
use ferry_local::LocalTransport;
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(20);

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
        format!("unix:ferry-cuda-fake-{}", ferry_conformance::unique(tag))
    }
}

fn endpoint(chan: &CudaIpcChannel) -> Endpoint {
    Endpoint::builder()
        .transport(Arc::new(LocalTransport::new()))
        .channel(Arc::new(chan.clone()))
        .channel(Arc::new(InlineChannel))
        .build()
}

fn chan(drv: Arc<FakeDriver>) -> CudaIpcChannel {
    CudaIpcChannel::with_driver(drv, CudaIpcOptions::default())
}

async fn connect(server: &CudaIpcChannel, client: &CudaIpcChannel, tag: &str) -> (PipeListener, Pipe, Pipe) {
    let addr = Fx.addr(tag);
    let mut l = endpoint(server).listen(&addr).await.unwrap();
    let c = endpoint(client).connect(&addr).await.unwrap();
    let s = tokio::time::timeout(T, l.accept()).await.unwrap().unwrap();
    (l, c, s)
}

fn cuda_channel(p: &Pipe) -> Option<&str> {
    p.info().channels.get(&DeviceKind::Cuda).map(String::as_str)
}

fn stat(p: &Pipe, key: &str) -> u64 {
    p.stats()["cuda-ipc"][key].as_u64().unwrap_or_else(|| panic!("no {key} in {}", p.stats()))
}

async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + T;
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_tensors_round_trip_over_a_real_pipe() {
    let gpu = FakeGpu::new(1);
    let (sc, cc) = (chan(gpu.process(1)), chan(gpu.process(2)));
    let (_l, c, s) = connect(&sc, &cc, "round-trip").await;
    assert_eq!((cuda_channel(&c), cuda_channel(&s)), (Some("cuda-ipc"), Some("cuda-ipc")));
    assert_eq!(c.channel(), "inline");

    let meta = TensorMeta::new(DType::F32, vec![1920, 1080, 3]).with_device(Device::Cuda(0));
    let t = c.alloc_device(meta).await.unwrap();
    let data: Vec<u8> = (0..t.nbytes()).map(|i| (i % 251) as u8).collect();
    cc.copy_from_host(&t, &data).unwrap();
    let cpu = Tensor::from_slice(vec![3], &[1u16, 2, 3]).unwrap();
    c.send(Message::with_tensors(json!({"n": 1}), vec![t.clone(), cpu.clone()])).await.unwrap();

    let m = s.recv_timeout(T).await.unwrap();
    assert_eq!(m.tensors[0].device(), Device::Cuda(0));
    assert_eq!(sc.copy_to_host(&m.tensors[0]).unwrap(), data);
    assert_eq!(m.tensors[1], cpu, "CPU tensors of the same message go inline");
    assert_eq!(stat(&c, "leases_granted"), 1);
    // Echo: the client's own memory comes back by reference, zero copy both ways.
    s.send(m).await.unwrap();
    let back = c.recv_timeout(T).await.unwrap();
    assert_eq!(back.tensors[0], t, "same device memory");
    assert_eq!(stat(&s, "returns_sent"), 1);
    drop(back);
    // The server dropped its copy after sending: the release arrives as a CONTROL frame.
    eventually("the release", || stat(&c, "leases_granted") == 0).await;
    assert_eq!(stat(&c, "copies_in"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_reclaimed_when_the_peer_goes_away() {
    let gpu = FakeGpu::new(1);
    let (sc, cc) = (chan(gpu.process(1)), chan(gpu.process(2)));
    let (_l, c, s) = connect(&sc, &cc, "reclaim").await;
    let meta = TensorMeta::new(DType::U8, vec![1 << 20]).with_device(Device::Cuda(0));
    let mut sent = Vec::new();
    for _ in 0..4 {
        let t = c.alloc_device(meta.clone()).await.unwrap();
        c.send(Message::with_tensors(json!(null), vec![t.clone()])).await.unwrap();
        sent.push(t);
    }
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(s.recv_timeout(T).await.unwrap());
    }
    assert_eq!((stat(&c, "leases_granted"), stat(&s, "leases_held")), (4, 4));
    // The consumer's pipe goes away while it holds every lease.
    drop(s);
    let e = c.recv_timeout(T).await.unwrap_err();
    assert!(e.is_closed(), "{e:?}");
    eventually("reclaim", || stat(&c, "leases_granted") == 0).await;
    // The consumer's session closes in its own pipe's teardown, which the producer's reclaim
    // does not wait for: its tensors become orphaned soon, not necessarily by now.
    eventually("the consumer's tensors orphaned", || held.iter().all(|m| is_orphaned(&m.tensors[0]))).await;
    assert!(matches!(sc.copy_to_host(&held[0].tensors[0]), Err(ferry_core::ChannelError::Closed)));
    drop(held);
    drop(sent);
    assert_eq!(cc.trim(), 1, "every slot came back to the pool");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_negotiated_with_itself_or_without_a_shared_gpu() {
    let gpu = FakeGpu::new(1);
    // Both endpoints in one (simulated) process.
    let same = chan(gpu.process(1));
    let (_l, c, s) = connect(&same, &chan(gpu.process(1)), "same-pid").await;
    assert_eq!((cuda_channel(&c), cuda_channel(&s)), (None, None));
    // Different machines' GPUs (no UUID in common).
    let (_l, c, _s) = connect(&chan(gpu.process(1)), &chan(FakeGpu::new(1).process(2)), "no-gpu").await;
    assert_eq!(cuda_channel(&c), None);
    // A client without a driver does not offer it; CPU tensors still flow.
    let broken = CudaIpcChannel::with_driver(gpu.broken_process(3, "no driver"), CudaIpcOptions::default());
    let (_l, c, s) = connect(&chan(gpu.process(1)), &broken, "broken").await;
    assert_eq!(cuda_channel(&c), None);
    let e = c.alloc_device(TensorMeta::new(DType::U8, vec![4]).with_device(Device::Cuda(0))).await.unwrap_err();
    assert!(e.to_string().contains("no channel was negotiated"), "{e}");
    c.send(Message::with_tensors(json!(1), vec![Tensor::from_slice(vec![1], &[1u8]).unwrap()])).await.unwrap();
    assert_eq!(s.recv_timeout(T).await.unwrap().tensors[0].as_bytes(), &[1]);
}

/// A raw client that negotiated cuda-ipc with a server over simulated process 1.
async fn raw_cuda(gpu: &Arc<FakeGpu>, tag: &str) -> (PipeListener, RawConn, Pipe) {
    let addr = Fx.addr(tag);
    let mut l = endpoint(&chan(gpu.process(1))).listen(&addr).await.unwrap();
    let mut raw = RawConn::connect(&Fx, &addr).await.unwrap();
    let offer = chan(gpu.process(2)).offer(&ConnInfo { same_host: true, ..Default::default() }).unwrap();
    let w = raw.handshake_with(json!([offer, {"name": "inline", "devices": ["cpu"]}])).await.unwrap();
    assert_eq!(w.channels[&DeviceKind::Cuda], "cuda-ipc");
    let pipe = tokio::time::timeout(T, l.accept()).await.unwrap().unwrap();
    (l, raw, pipe)
}

async fn send_raw(raw: &mut RawConn, kind: FrameKind, header: Value) {
    let h = serde_json::to_vec(&header).unwrap();
    raw.write_prefix(kind as u8, 0, 0, h.len() as u32, 0).await.unwrap();
    raw.write_raw(&h).await.unwrap();
}

async fn expect_bad(pipe: &Pipe, raw: &mut RawConn, needle: &str) {
    let e = pipe.recv_timeout(T).await.unwrap_err();
    assert!(e.to_string().contains(needle), "error {e} does not mention {needle:?}");
    assert!(matches!(e, PipeError::Protocol(_) | PipeError::Channel(_)), "{e:?}");
    assert_eq!(raw.expect_close().await.unwrap().code, "protocol_error");
}

fn cuda_msg(desc: Value) -> Value {
    json!({"header": null, "tensors": [{"meta": {"dtype": "u8", "shape": [4], "device": "cuda:0"},
        "data": {"cuda_ipc": desc}}]})
}

fn desc(gpu: &FakeGpu) -> Value {
    let h = "A".repeat(86) + "==";
    json!({"device_uuid": gpu.uuid(0), "mem_handle": h, "alloc_id": 1, "alloc_size": 4096,
        "offset": 0, "len": 4, "event_handle": h, "lease": 1})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_frames_close_the_pipe_cleanly() {
    let gpu = FakeGpu::new(1);
    type Edit = fn(&mut Value);
    let edits: Vec<(Edit, &str)> = vec![
        (|d| d["mem_handle"] = json!("!!"), "mem_handle"),
        (|d| d["offset"] = json!(4093), "outside the allocation"),
        (|d| d["alloc_size"] = json!(9_007_199_254_740_992u64), "0..=9007199254740991"),
        (|d| d["alloc_size"] = json!("4096"), "invalid type: string"),
        (|d| d["device_uuid"] = json!("GPU-ffffffff-ffff-ffff-ffff-ffffffffffff"), "not visible"),
        (|_| {}, "unknown or freed handle"),
    ];
    for (i, (edit, needle)) in edits.into_iter().enumerate() {
        let (_l, mut raw, pipe) = raw_cuda(&gpu, &format!("hostile-{i}")).await;
        let mut d = desc(&gpu);
        edit(&mut d);
        send_raw(&mut raw, FrameKind::Message, cuda_msg(d)).await;
        expect_bad(&pipe, &mut raw, needle).await;
    }
    let (_l, mut raw, pipe) = raw_cuda(&gpu, "bad-release").await;
    let body = json!({"release": [7], "device": gpu.uuid(0), "event": "A".repeat(86) + "=="});
    send_raw(&mut raw, FrameKind::Control, json!({"channel": "cuda-ipc", "body": body})).await;
    expect_bad(&pipe, &mut raw, "release of lease 7").await;
}
