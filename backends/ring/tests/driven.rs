//! Frames larger than the socket holds, moved by blocking callers (issue 45, point 1): the
//! caller drives the socket itself (`DirectRead::drive`: it waits for bytes or room on its
//! own thread, one kernel wake-up per socket buffer's worth instead of the runtime's two).
//! Frames the ring diverts to the socket and frames on a bare socket arrive whole and in
//! order; a send to a peer that never reads still ends at its deadline; a frame cut off
//! part-way ends the reader's call with an error, never a hang. Real unix sockets.

#![cfg(target_os = "linux")]

mod common;

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use common::{bytes_tensor, check_bytes, endpoint, has_ring};
use ferry_core::{Endpoint, Message, Pipe, PipeError};
use ferry_ring::RingOptions;
use serde_json::json;

const LONG: Option<Duration> = Some(Duration::from_secs(30));
/// How long a test waits for a call that must end.
const BOUND: Duration = Duration::from_secs(30);

async fn pair(ep: &Endpoint, tag: &str) -> (Arc<Pipe>, Arc<Pipe>) {
    let (s, c) = common::pair(ep, ep, tag).await;
    (Arc::new(s), Arc::new(c))
}

/// Runs `f` on a plain thread; its result, or a panic naming `what` if it does not end
/// within [`BOUND`].
fn on_thread<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(BOUND).unwrap_or_else(|_| panic!("{what} did not end within {BOUND:?}"))
}

/// Inline tensors of several socket buffers' worth each, both ways, from plain threads:
/// every byte arrives, in order, over a ring (which diverts them to the socket) and over
/// a bare socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_frames_from_plain_threads_arrive_whole_and_in_order() {
    let sizes = [24_883_200usize, 3 << 20, 64, 9 << 20, 300_001];
    for ring in [true, false] {
        let ep = endpoint(ring.then(RingOptions::default), false);
        let (s, c) = pair(&ep, "driven").await;
        assert_eq!(has_ring(&c), ring);
        let rounds = 3;
        let echo = std::thread::spawn(move || {
            for _ in 0..rounds * sizes.len() {
                let m = s.recv_blocking(LONG).unwrap();
                s.send_blocking(m).unwrap();
            }
        });
        on_thread("the client's round trips", move || {
            for round in 0..rounds {
                for (i, n) in sizes.iter().enumerate() {
                    let seed = (round * 8 + i) as u8;
                    let m = Message::with_tensors(json!({"round": round, "i": i}), vec![bytes_tensor(*n, seed)]);
                    c.send_blocking(m).unwrap();
                    let back = c.recv_blocking(LONG).unwrap();
                    assert_eq!(back.header, json!({"round": round, "i": i}), "ring {ring}");
                    check_bytes(&back.tensors[0], *n, seed);
                }
            }
        });
        echo.join().unwrap();
    }
}

/// The most small messages [`stop_the_peer_reading`] sends.
const MAX_FILL: usize = 100_000;

/// Sends small messages with a short deadline until one times out: the peer's queue is
/// full, so its reader stopped reading, and the ring (if any) and the socket filled.
fn stop_the_peer_reading(c: &Pipe) -> usize {
    for i in 0..MAX_FILL {
        let m = Message::with_tensors(json!({"fill": i}), vec![bytes_tensor(64, i as u8)]);
        match c.send_blocking_timeout(m, Some(Duration::from_millis(50))) {
            Ok(()) => {}
            Err(PipeError::Timeout(..)) => return i,
            Err(e) => panic!("filling: {e}"),
        }
    }
    panic!("the peer never stopped reading")
}

/// A blocking send of a large frame to a peer that never reads waits for room on its own
/// thread, and still ends at its deadline with `Timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_send_to_a_peer_that_never_reads_ends_at_its_deadline() {
    for ring in [true, false] {
        let ep = endpoint(ring.then(RingOptions::default), false);
        let (_s, c) = pair(&ep, "stuck").await;
        let e = on_thread("a send to a peer that never reads", move || {
            stop_the_peer_reading(&c);
            let m = Message::with_tensors(json!("big"), vec![bytes_tensor(32 << 20, 1)]);
            c.send_blocking_timeout(m, Some(Duration::from_millis(200))).unwrap_err()
        });
        assert!(matches!(e, PipeError::Timeout(..)), "ring {ring}: {e:?}");
    }
}

/// A frame cut off part-way (its sender gave up mid-write, which closes its pipe): the
/// reader, driving the socket, gets an error for the call, and later calls fail too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_cut_off_part_way_ends_the_readers_call() {
    for ring in [true, false] {
        let ep = endpoint(ring.then(RingOptions::default), false);
        let (s, c) = pair(&ep, "cut").await;
        let (filled, sent) = on_thread("a send cut off by its deadline", move || {
            let filled = stop_the_peer_reading(&c);
            let m = Message::with_tensors(json!("big"), vec![bytes_tensor(32 << 20, 2)]);
            let r = c.send_blocking_timeout(m, Some(Duration::from_millis(100)));
            drop(c);
            (filled, r)
        });
        assert!(sent.is_err(), "ring {ring}: the send could not have finished");
        let (got, err) = on_thread("the reader's calls", move || {
            // The small messages first (all that arrived whole), then the error.
            for n in 0..=filled + 1 {
                match s.recv_blocking(LONG) {
                    Ok(m) => assert_eq!(m.header["fill"], json!(n), "in order"),
                    Err(e) => return (n, e),
                }
            }
            panic!("more messages than were sent");
        });
        assert!(got <= filled + 1, "ring {ring}");
        assert!(!matches!(err, PipeError::Timeout(..)), "ring {ring}: {err:?}");
    }
}
