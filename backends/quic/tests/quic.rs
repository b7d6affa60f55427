//! QUIC-specific behaviour: identity pinning and CA trust, tokens, garbage on the port, and
//! a peer that vanishes without a word.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::{Endpoint, InlineChannel, Message, PipeError, Refusal, Tensor, TransportError};
use ferry_quic::{IdentitySource, QuicChannel, QuicOptions, QuicTransport};
use serde_json::json;

const T: Duration = Duration::from_secs(20);

fn endpoint(opts: QuicOptions) -> ferry_core::EndpointBuilder {
    Endpoint::builder()
        .transport(Arc::new(QuicTransport::with_options(opts)))
        .channel(Arc::new(QuicChannel::new()))
        .channel(Arc::new(InlineChannel))
}

fn ephemeral() -> QuicOptions {
    QuicOptions { identity: IdentitySource::Ephemeral, ..QuicOptions::default() }
}

/// The QUIC fixture for raw (hand-made) peers.
#[derive(Default)]
struct Fx;

impl ferry_conformance::Fixture for Fx {
    const NAME: &'static str = "quic";
    fn transport(&self) -> Arc<dyn ferry_core::Transport> {
        Arc::new(QuicTransport::with_options(ephemeral()))
    }
    fn channels(&self) -> Vec<Arc<dyn ferry_core::Channel>> {
        vec![Arc::new(QuicChannel::new()), Arc::new(InlineChannel)]
    }
    fn addr(&self, _: &str) -> String {
        String::new()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_fingerprint_round_trip() {
    let mut l = endpoint(ephemeral()).build().listen("quic://127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().to_string();
    assert!(addr.contains("#sha256="), "the listener's address carries the pin: {addr}");
    let c = endpoint(ephemeral()).build().connect(&addr).await.unwrap();
    let s = tokio::time::timeout(T, l.accept()).await.unwrap().unwrap();
    assert_eq!((c.transport(), c.channel()), ("quic", "quic"));
    let big = Tensor::from_slice(vec![4 << 20], &vec![5u8; 4 << 20]).unwrap();
    c.send(Message::with_tensors(json!(1), vec![big.clone()])).await.unwrap();
    assert_eq!(s.recv_timeout(T).await.unwrap().tensors[0], big);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_fingerprint_is_refused_on_both_sides() {
    let mut l = endpoint(ephemeral()).build().listen("quic://127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().to_string();
    let wrong = format!("{}#sha256={}", addr.split('#').next().unwrap(), "ab".repeat(32));
    let e = endpoint(ephemeral()).build().connect(&wrong).await.unwrap_err();
    assert!(e.to_string().contains("does not match the pinned"), "client: {e}");
    let s = tokio::time::timeout(T, l.accept()).await.unwrap().unwrap_err();
    assert!(
        matches!(&s, PipeError::Transport(TransportError::PeerRefused(m)) if m.contains("handshake")),
        "server: {s:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unverifiable_address_is_refused_before_connecting() {
    let l = endpoint(ephemeral()).build().listen("quic://127.0.0.1:0").await.unwrap();
    let bare = l.local_addr().to_string().split('#').next().unwrap().to_string();
    let e = endpoint(ephemeral()).build().connect(&bare).await.unwrap_err();
    assert!(e.to_string().contains("#sha256="), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_bundle_can_stand_in_for_the_pin() {
    // A CA, and a server certificate it signed, written as the server's identity file.
    let dir = std::env::temp_dir().join(format!("ferry-quic-ca-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let srv_key = rcgen::KeyPair::generate().unwrap();
    let srv =
        rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap().signed_by(&srv_key, &issuer).unwrap();
    let id_path = dir.join("server.pem");
    let ca_path = dir.join("ca.pem");
    {
        use std::io::Write;
        let mut o = std::fs::OpenOptions::new();
        o.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
        o.open(&id_path).unwrap().write_all(format!("{}{}", srv.pem(), srv_key.serialize_pem()).as_bytes()).unwrap();
    }
    std::fs::write(&ca_path, ca_cert.pem()).unwrap();
    let server = QuicOptions { identity: IdentitySource::File(id_path), ..QuicOptions::default() };
    let mut l = endpoint(server).build().listen("quic://127.0.0.1:0").await.unwrap();
    let port = l.local_addr().to_string().split('#').next().unwrap().rsplit(':').next().unwrap().to_string();
    let client = QuicOptions { ca_bundle: Some(ca_path.clone()), ..ephemeral() };
    let c = endpoint(client.clone()).build().connect(&format!("quic://localhost:{port}")).await.unwrap();
    let _s = tokio::time::timeout(T, l.accept()).await.unwrap().unwrap();
    c.send(Message::new(json!("trusted"))).await.unwrap();
    // Another CA's bundle does not trust this server.
    let other_key = rcgen::KeyPair::generate().unwrap();
    let mut other = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    other.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    std::fs::write(&ca_path, other.self_signed(&other_key).unwrap().pem()).unwrap();
    let e = endpoint(client).build().connect(&format!("quic://localhost:{port}")).await.unwrap_err();
    assert!(e.to_string().contains("handshake"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_is_required_when_configured() {
    let mut l = endpoint(ephemeral()).require_token("hunter2").build().listen("quic://127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().to_string();
    let e = endpoint(ephemeral()).build().connect(&addr).await.unwrap_err();
    assert!(matches!(e, PipeError::Refused(Refusal::BadToken)), "{e:?}");
    assert!(matches!(l.accept().await, Err(PipeError::Refused(Refusal::BadToken))));
    let e = endpoint(ephemeral()).token("hunter3").build().connect(&addr).await.unwrap_err();
    assert!(matches!(e, PipeError::Refused(Refusal::BadToken)), "{e:?}");
    assert!(matches!(l.accept().await, Err(PipeError::Refused(Refusal::BadToken))));
    endpoint(ephemeral()).token("hunter2").build().connect(&addr).await.unwrap();
    assert!(l.accept().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_port_is_ignored_and_tcp_is_refused() {
    let mut l = endpoint(ephemeral()).build().listen("quic://127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().to_string();
    let sock_addr: std::net::SocketAddr =
        addr.trim_start_matches("quic://").split('#').next().unwrap().parse().unwrap();
    // UDP garbage: random datagrams, a fake long header, an HTTP request.
    let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut x = 0x1234_5678_u64;
    for i in 0..200 {
        let len = 1 + (i * 37) % 1400;
        let mut d = vec![0u8; len];
        for b in &mut d {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        if i % 3 == 0 {
            d[0] = 0xc0; // looks like a QUIC long header
        }
        udp.send_to(&d, sock_addr).await.unwrap();
    }
    udp.send_to(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", sock_addr).await.unwrap();
    // TCP on the same port: nothing listens there.
    let tcp = tokio::net::TcpStream::connect(sock_addr).await;
    assert!(tcp.is_err(), "a TCP connection to the QUIC port should be refused");
    // The listener reported nothing for the garbage, and a real client still works.
    let c = endpoint(ephemeral()).build().connect(&addr).await.unwrap();
    let s = tokio::time::timeout(T, l.accept()).await.unwrap().unwrap();
    c.send(Message::new(json!("after garbage"))).await.unwrap();
    assert_eq!(s.recv_timeout(T).await.unwrap().header, json!("after garbage"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_peer_is_noticed_within_the_idle_timeout() {
    let opts =
        QuicOptions { keep_alive: Duration::from_millis(100), idle_timeout: Duration::from_millis(800), ..ephemeral() };
    let mut l = endpoint(opts.clone()).build().listen("quic://127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().to_string();
    // A relay we can cut: the client talks to it, it forwards to the server.
    let relay = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let relay_addr = relay.local_addr().unwrap();
    let upstream: std::net::SocketAddr = addr.trim_start_matches("quic://").split('#').next().unwrap().parse().unwrap();
    let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cut2 = cut.clone();
    let fwd = tokio::spawn(async move {
        let up = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        up.connect(upstream).await.unwrap();
        let mut client = None;
        let (mut a, mut b) = (vec![0u8; 65536], vec![0u8; 65536]);
        loop {
            tokio::select! {
                r = relay.recv_from(&mut a) => {
                    let Ok((n, from)) = r else { break };
                    client = Some(from);
                    if !cut2.load(std::sync::atomic::Ordering::Relaxed) { let _ = up.send(&a[..n]).await; }
                }
                r = up.recv(&mut b) => {
                    let Ok(n) = r else { break };
                    if let (Some(c), false) = (client, cut2.load(std::sync::atomic::Ordering::Relaxed)) {
                        let _ = relay.send_to(&b[..n], c).await;
                    }
                }
            }
        }
    });
    let pin = addr.split('#').nth(1).unwrap();
    let c = endpoint(opts).build().connect(&format!("quic://{relay_addr}#{pin}")).await.unwrap();
    let s = tokio::time::timeout(T, l.accept()).await.unwrap().unwrap();
    c.send(Message::new(json!("hello"))).await.unwrap();
    s.recv_timeout(T).await.unwrap();
    // The network goes silent (no FIN, no reset): both sides must notice by themselves.
    cut.store(true, std::sync::atomic::Ordering::Relaxed);
    let start = Instant::now();
    let (rs, rc) = tokio::join!(s.recv_timeout(Duration::from_secs(5)), c.recv_timeout(Duration::from_secs(5)));
    let took = start.elapsed();
    assert!(matches!(&rs, Err(e) if e.is_closed()), "server: {rs:?}");
    assert!(matches!(&rc, Err(e) if e.is_closed()), "client: {rc:?}");
    assert!(took < Duration::from_secs(3), "noticed after {took:?} with an 800 ms idle timeout");
    fwd.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_message_sends_no_stream_and_the_pipe_goes_on() {
    let mut l = endpoint(ephemeral()).build().listen("quic://127.0.0.1:0").await.unwrap();
    let c = endpoint(ephemeral()).build().connect(&l.local_addr().to_string()).await.unwrap();
    let s = tokio::time::timeout(T, l.accept()).await.unwrap().unwrap();
    let big = Tensor::from_slice(vec![2 << 20], &vec![1u8; 2 << 20]).unwrap();
    // The second tensor has no channel (no CUDA here): the whole message is refused after
    // the first tensor's stream was opened.
    let gpu = Tensor::from_device(
        ferry_core::TensorMeta::new(ferry_core::DType::U8, vec![4]).with_device(ferry_core::Device::Cuda(0)),
        Arc::new(FakeDevice),
    )
    .unwrap();
    assert!(c.send(Message::with_tensors(json!("refused"), vec![big.clone(), gpu])).await.is_err());
    c.send(Message::with_tensors(json!("ok"), vec![big.clone()])).await.unwrap();
    let m = s.recv_timeout(T).await.unwrap();
    assert_eq!(m.header, json!("ok"), "the refused message must not arrive");
    assert_eq!(m.tensors[0], big);
}

struct FakeDevice;

impl ferry_core::DeviceBuffer for FakeDevice {
    fn device(&self) -> ferry_core::Device {
        ferry_core::Device::Cuda(0)
    }
    fn device_ptr(&self) -> u64 {
        0x1000
    }
    fn len(&self) -> usize {
        4
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_stream_descriptors_are_refused() {
    use ferry_core::frame::FrameKind;

    let cases = [
        (json!({"stream": 3, "len": 16}), "not a unidirectional stream of the peer"), // the server's own kind
        (json!({"stream": 0, "len": 16}), "not a unidirectional stream of the peer"), // bidirectional
        (json!({"stream": 2, "len": 5u64 << 30}), "max_stream_bytes"),
    ];
    for (desc, needle) in cases {
        let mut l = endpoint(ephemeral()).build().listen("quic://127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().to_string();
        let mut raw = ferry_conformance::peer::RawConn::connect(&Fx, &addr).await.unwrap();
        raw.handshake_with(json!([{"name": "quic", "devices": ["cpu"]}])).await.unwrap();
        let pipe = tokio::time::timeout(T, l.accept()).await.unwrap().unwrap();
        let h = json!({"header": null, "tensors": [{"meta": {"dtype": "u8", "shape": [desc["len"]]}, "data": {"quic_stream": desc}}]});
        raw.write_frame(FrameKind::Message as u8, &serde_json::to_vec(&h).unwrap(), &[]).await.unwrap();
        let e = pipe.recv_timeout(T).await.unwrap_err();
        assert!(e.to_string().contains(needle), "{e}");
        let close = raw.expect_close().await.unwrap();
        assert!(close.code == "protocol_error" || close.code == "limit", "{close:?}");
    }
}

/// Resident memory of this process in bytes (Linux).
#[cfg(target_os = "linux")]
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// A peer that announces a 1 GiB tensor stream and sends 100 bytes of it costs the receiver
/// about those bytes, not the announced length (issue 14: no memory ahead of the bytes).
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announced_stream_commits_memory_only_for_bytes_that_arrived() {
    let mut l = endpoint(ephemeral()).build().listen("quic://127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().to_string();
    let mut raw = ferry_conformance::peer::RawConn::connect(&Fx, &addr).await.unwrap();
    raw.handshake_with(json!([{"name": "quic", "devices": ["cpu"]}])).await.unwrap();
    let _pipe = tokio::time::timeout(T, l.accept()).await.unwrap().unwrap();
    let quic = raw.info.handle.as_ref().and_then(|h| h.downcast::<ferry_quic::QuicConn>()).expect("a QUIC connection");
    let before = rss();
    let mut streams = Vec::new();
    for _ in 0..4 {
        let mut s = quic.conn.open_uni().await.unwrap();
        s.write_all(&(1u64 << 30).to_le_bytes()).await.unwrap();
        s.write_all(&[7u8; 100]).await.unwrap();
        streams.push(s);
    }
    // Long enough for the receiver to read the length and the bytes (and, before this was
    // fixed, to zero the announced 4 x 1 GiB).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let grown = rss().saturating_sub(before);
    assert!(grown < 64 << 20, "4 streams announcing 1 GiB each with 100 bytes sent grew RSS by {} MiB", grown >> 20);
    drop(streams);
}
