//! An answer that gives the peer its memory back (`shm_return`) carries the release of
//! that memory over the ring: the message record and the CONTROL frame with the release
//! are published together (`Sender::try_send_records`, whose own test shows that they
//! are seen together), so the peer never has the answer without the release. Before, the
//! release went in a record of its own right after the answer's; a sender that lost its
//! CPU between the two left its peer's next send without the memory: on a busy 2-vCPU
//! VM, `ferry bench`'s copy-in echo over the ring grew the pool by a segment in 4 to 7 of
//! 10 connections, and that segment's first touch (35-45 ms) was the row's p99, 2.4-2.8x
//! the socket's.
//!
//! Here the caller's pool has room for one tensor and never waits for room (`full_wait`
//! zero): every send must find the memory of the last one released, by the answer it
//! got. (The old order passed this too: the window it lost was microseconds wide, which
//! only a busy machine's scheduler hits; the benchmark shows that.) Real unix sockets,
//! ring and shared memory; both sides on plain threads.

#![cfg(target_os = "linux")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{bytes_tensor, check_bytes, has_ring};
use ferry_core::{Channel, Endpoint, Message};
use ferry_local::LocalTransport;
use ferry_ring::{RingExt, RingOptions};
use ferry_shm::{ShmChannel, ShmOptions};
use serde_json::json;

const LONG: Option<Duration> = Some(Duration::from_secs(20));

fn endpoint(opts: ShmOptions) -> Endpoint {
    let shm: Arc<dyn Channel> = Arc::new(ShmChannel::with_options(opts));
    Endpoint::builder()
        .transport(Arc::new(LocalTransport::new()))
        .channel(shm)
        .ring(Some(RingOptions::default()))
        .build()
}

fn stat(p: &ferry_core::Pipe, key: &str) -> u64 {
    p.stats()["shm"][key].as_u64().unwrap_or_else(|| panic!("no shm stat {key}: {}", p.stats()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_with_room_for_one_tensor_serves_a_copy_in_echo_loop() {
    const N: usize = 1536 << 10; // in a 2 MiB segment, one at a time
    // The caller: one segment's room, and no waiting for more.
    let caller = endpoint(ShmOptions {
        pool_limit: 2 << 20,
        segment_bytes: 2 << 20,
        full_wait: Duration::ZERO,
        ..ShmOptions::default()
    });
    // The echo: its releases of such a tensor are due at once (as a 24.9 MB one's are by
    // default).
    let echo = endpoint(ShmOptions { release_batch_bytes: 1 << 20, ..ShmOptions::default() });
    let (s, c) = common::pair(&echo, &caller, "release-with-answer").await;
    assert!(has_ring(&c), "the pair agreed on no ring");
    let (s, c) = (Arc::new(s), Arc::new(c));
    let rounds = 100;
    let peer = {
        let s = s.clone();
        std::thread::spawn(move || {
            for _ in 0..rounds {
                let m = s.recv_blocking(LONG).unwrap();
                // Sent back as it came: the caller's own memory, returned.
                s.send_blocking(m).unwrap();
            }
        })
    };
    let client = {
        let c = c.clone();
        std::thread::spawn(move || {
            for round in 0..rounds {
                let seed = round as u8;
                // A heap tensor: copied into the pool on every send.
                c.send_blocking(Message::with_tensors(json!({ "round": round }), vec![bytes_tensor(N, seed)]))
                    .unwrap_or_else(|e| panic!("round {round}: {e}"));
                let m = c.recv_blocking(LONG).unwrap();
                assert_eq!(m.header, json!({ "round": round }));
                check_bytes(&m.tensors[0], N, seed);
            }
        })
    };
    client.join().expect("the caller's sends all found room");
    peer.join().unwrap();
    assert_eq!(stat(&c, "segments_created"), 1, "the pool grew: {}", c.stats());
}
