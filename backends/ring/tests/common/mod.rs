//! What the pipe-level ring tests share: endpoints over unix sockets with or without a
//! ring and shm, connected pairs, patterned tensors, the process's CPU time, and a
//! hand-made client that does the ring handshake by the book (to lie in the ring after).

#![allow(dead_code)] // each test binary uses a part

use std::sync::Arc;

use ferry_core::{Channel, Endpoint, InlineChannel, Pipe, Tensor};
use ferry_local::LocalTransport;
use ferry_ring::{RingExt, RingOptions};
use ferry_shm::ShmChannel;

static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A fresh abstract unix address for this test binary.
pub fn addr(tag: &str) -> String {
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("unix:ferry-ring-test-{tag}-{}-{n}", std::process::id())
}

/// Local transport; shm (when asked) and inline channels; the ring when `ring` is set.
pub fn endpoint(ring: Option<RingOptions>, shm: bool) -> Endpoint {
    let mut channels: Vec<Arc<dyn Channel>> = Vec::new();
    if shm {
        channels.push(Arc::new(ShmChannel::new()));
    }
    channels.push(Arc::new(InlineChannel));
    let mut b = Endpoint::builder().transport(Arc::new(LocalTransport::new()));
    for c in channels {
        b = b.channel(c);
    }
    b.ring(ring).build()
}

/// A connected pair: (server side, client side).
pub async fn pair(server: &Endpoint, client: &Endpoint, tag: &str) -> (Pipe, Pipe) {
    let a = addr(tag);
    let mut l = server.listen(&a).await.unwrap();
    let (s, c) = tokio::join!(l.accept(), client.connect(&a));
    (s.unwrap(), c.unwrap())
}

/// Whether the pipe agreed on the ring.
pub fn has_ring(p: &Pipe) -> bool {
    p.info().features.iter().any(|f| f == "ring")
}

/// `n` bytes in a pattern of `seed`.
pub fn bytes_tensor(n: usize, seed: u8) -> Tensor {
    let v: Vec<u8> = (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
    Tensor::from_slice(vec![n as u64], &v).unwrap()
}

/// Checks a tensor made by [`bytes_tensor`].
pub fn check_bytes(t: &Tensor, n: usize, seed: u8) {
    assert_eq!(t.meta().shape, vec![n as u64]);
    let got = t.as_bytes();
    assert!(
        got.iter().enumerate().all(|(i, b)| *b == (i as u8).wrapping_mul(31).wrapping_add(seed)),
        "tensor of {n} bytes (seed {seed}) came back changed"
    );
}

/// CPU time this process has used (user + system), from /proc/self/stat, in clock ticks.
pub fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// A hand-made client, past the ring handshake: its frame reader and writer (the socket)
/// and the ring it mapped.
pub struct RawClient {
    pub reader: ferry_core::frame::FrameReader,
    pub writer: ferry_core::frame::FrameWriter,
    pub ring: ferry_ring::Ring,
}

/// Connects to `a` (a listener with a ring), offers the ring and says `ready`, by hand.
pub async fn raw_ring_client(a: &str) -> RawClient {
    raw_ring_client_offering(a, &["ring"]).await.0
}

/// [`raw_ring_client`] offering these features beside the usual ones (e.g. `["ring",
/// "ring_messages"]` for packed messages); also returns the features the WELCOME granted.
pub async fn raw_ring_client_offering(a: &str, features: &[&str]) -> (RawClient, Vec<String>) {
    use ferry_core::Transport;
    use ferry_core::frame::{FrameKind, FrameReader, FrameWriter, HANDSHAKE_LIMITS, OutFrame};
    use ferry_core::handshake::client_hello;
    use ferry_core::wire::{Limits, PROTOCOL_VERSION, RingAnswer, Welcome};

    let conn = LocalTransport::new().connect(&a.parse().unwrap()).await.unwrap();
    let info = conn.info().clone();
    let split = conn.split();
    let mut r = FrameReader::new(split.read, split.fds.clone(), Limits { max_fds: 1, ..HANDSHAKE_LIMITS });
    let mut w = FrameWriter::new(split.write, split.fds);
    let chans: Vec<Arc<dyn Channel>> = vec![Arc::new(InlineChannel)];
    let mut hello = client_hello(&chans, &info, PROTOCOL_VERSION, None, Limits::default());
    hello.features.extend(features.iter().map(|f| f.to_string()));
    w.write_preamble(PROTOCOL_VERSION).await.unwrap();
    w.write_frame(FrameKind::Hello, OutFrame::json(&hello)).await.unwrap();
    r.read_preamble().await.unwrap();
    let mut welcome_frame = r.read_frame().await.unwrap().into_frame().unwrap();
    let welcome: Welcome = welcome_frame.parse().unwrap();
    let granted = welcome.features.clone();
    let offer = welcome.ring.expect("the server offers a ring");
    let fd = welcome_frame.fds.pop().expect("the ring file comes with the WELCOME");
    let ring = ferry_ring::Ring::open(fd, offer.capacity as usize, &RingOptions::default()).unwrap();
    w.write_frame(FrameKind::Ring, OutFrame::json(&RingAnswer::Ready)).await.unwrap();
    (RawClient { reader: r, writer: w, ring }, granted)
}
pub mod packed;
