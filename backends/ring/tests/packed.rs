//! Packed messages over the same-host ring (handshake feature `ring_messages`, ring record
//! tag 2; core's `pipe/packed.rs`): what the handshake agrees on; messages that come back
//! equal, their tensors 64-byte aligned, through `send` / `recv` and through `send_blocking` /
//! `recv_blocking`; their order among messages that cannot be packed (shm leases, frames
//! diverted to the socket, strided tensors); deadlines that pass and lose nothing; the
//! peer's limits; handlers, concurrent senders and receivers, dropped sends. Real unix
//! sockets and shared memory, one process (`packed_wire.rs` has the wire format and liars).

#![cfg(target_os = "linux")]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::packed::*;
use common::{bytes_tensor, check_bytes, endpoint, has_ring};
use ferry_core::{ALIGN, DType, Endpoint, InlineChannel, Limits, Message, Pipe, PipeError, TensorMeta};
use ferry_local::LocalTransport;
use ferry_ring::{RingExt, RingOptions};
use serde_json::json;

/// Two ring endpoints agree on packed messages; a ring endpoint with one without a ring
/// does not (and messages still go through).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packed_messages_are_agreed_only_between_two_rings() {
    let ring = endpoint(Some(RingOptions::default()), false);
    let ring_shm = endpoint(Some(RingOptions::default()), true);
    let plain = endpoint(None, false);
    let plain_shm = endpoint(None, true);
    let cases = [
        (&ring, &ring, true),
        (&ring_shm, &ring_shm, true),
        (&ring, &ring_shm, true),
        (&ring, &plain, false),
        (&plain, &ring, false),
        (&ring_shm, &plain_shm, false),
        (&plain, &plain, false),
    ];
    for (n, (server, client, want)) in cases.into_iter().enumerate() {
        let (s, c) = common::pair(server, client, "agree").await;
        assert_eq!((packs(&s), packs(&c)), (want, want), "case {n}: server / client packs");
        assert_eq!((has_ring(&s), has_ring(&c)), (want, want), "case {n}: ring");
        let m = Message::with_tensors(json!({"case": n}), vec![bytes_tensor(100, n as u8)]);
        c.send(m.clone()).await.unwrap();
        assert_same(&recv(&s).await.unwrap(), &m, "client to server");
        s.send(m.clone()).await.unwrap();
        assert_same(&recv(&c).await.unwrap(), &m, "server to client");
    }
}

/// Every packable message comes back equal through `send` / `recv`, both ways, with shm and
/// without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packed_messages_round_trip_async() {
    for shm in [false, true] {
        let ep = endpoint(Some(RingOptions::default()), shm);
        let (s, c) = common::pair(&ep, &ep, "rt").await;
        assert!(packs(&s) && packs(&c), "shm {shm}");
        for (i, m) in packable_messages().into_iter().enumerate() {
            c.send(m.clone()).await.unwrap();
            let got = recv(&s).await.unwrap();
            assert_same(&got, &m, &format!("shm {shm}, message {i}, to the server"));
            // What was received goes back as it is (its tensors are this side's heap memory).
            s.send(got).await.unwrap();
            assert_same(&recv(&c).await.unwrap(), &m, &format!("shm {shm}, message {i}, back"));
        }
        // Sent in a burst, received after.
        let all = packable_messages();
        for m in &all {
            c.send(m.clone()).await.unwrap();
        }
        for (i, m) in all.iter().enumerate() {
            assert_same(&recv(&s).await.unwrap(), m, &format!("shm {shm}, burst message {i}"));
        }
    }
}

/// Every packable message comes back equal through `send_blocking` / `recv_blocking` on
/// plain threads (an echo on one, the sender on the other), with shm and without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packed_messages_round_trip_blocking() {
    for shm in [false, true] {
        let ep = endpoint(Some(RingOptions::default()), shm);
        let (s, c) = arc_pair(&ep, &ep, "rtb").await;
        assert!(packs(&s) && packs(&c), "shm {shm}");
        let rounds = 5;
        let n = rounds * packable_messages().len();
        let echo = std::thread::spawn(move || {
            for _ in 0..n {
                let m = s.recv_blocking(LONG).unwrap();
                for (i, t) in m.tensors.iter().enumerate() {
                    let at = t.as_bytes().as_ptr() as usize;
                    assert!(t.nbytes() == 0 || at.is_multiple_of(ALIGN), "echo: tensor {i} at {at:#x}");
                }
                s.send_blocking(m).unwrap();
            }
            s
        });
        let client = std::thread::spawn(move || {
            for round in 0..rounds {
                for (i, m) in packable_messages().into_iter().enumerate() {
                    c.send_blocking(m.clone()).unwrap();
                    let got = c.recv_blocking(LONG).unwrap();
                    assert_same(&got, &m, &format!("shm {shm}, round {round}, message {i}"));
                }
            }
            c
        });
        let c = join(client).await;
        let s = join(echo).await;
        // The async calls still work after the blocking ones (the task takes the reader back).
        let m = packable_messages().swap_remove(3);
        s.send(m.clone()).await.unwrap();
        assert_same(&recv(&c).await.unwrap(), &m, "async after blocking");
    }
}

/// The messages of one round of [`packed_and_unpacked_messages_keep_their_order`]: packable
/// ones between ones that cannot be packed (shm leases, frames larger than a small ring's
/// record, a strided tensor, a tensor in the shm pool).
async fn mixed_round(c: &Pipe, round: u32) -> Vec<Message> {
    let seed = |i: u32| (round * 16 + i) as u8;
    let h = |i: u32| json!({"round": round, "i": i});
    // Shape [3, 2] with row stride 4: 10 bytes, not contiguous.
    let strided_meta = TensorMeta::new(DType::U8, vec![3, 2]).with_strides(vec![4, 1]);
    let strided_bytes: Vec<u8> = (0..10u8).map(|b| b.wrapping_add(seed(3))).collect();
    let strided = raw_tensor(strided_meta, &strided_bytes);
    // In the shm pool when shm is on (sent by lease), on the heap otherwise.
    let mut pooled = c.alloc(TensorMeta::new(DType::U8, vec![256])).await.unwrap();
    pooled.as_mut_slice::<u8>().unwrap().fill(seed(6));
    vec![
        Message::with_tensors(h(0), vec![bytes_tensor(100, seed(0))]),
        Message::with_tensors(h(1), vec![bytes_tensor(20_000, seed(1))]),
        Message::with_tensors(h(2), vec![bytes_tensor(5000, seed(2))]),
        Message::with_tensors(h(3), vec![strided]),
        Message::new(h(4)),
        Message::with_tensors(h(5), vec![bytes_tensor(10, seed(5)), patterned(DType::F64, &[3], seed(5))]),
        Message::with_tensors(h(6), vec![pooled.freeze()]),
        Message::new(json!({"round": round, "i": 7, "pad": "p".repeat(5000)})),
        Message::with_tensors(h(8), vec![bytes_tensor(200_000, seed(8))]),
        Message::with_tensors(h(9), vec![bytes_tensor(3, seed(9)), bytes_tensor(6000, seed(9))]),
    ]
}

/// Packed messages interleaved with messages that take the old paths (MESSAGE frames in
/// the ring, diverts to the socket, shm leases): the receiver gets them all, in order,
/// whole, whether it reads with `recv` or `recv_blocking` and whether the sender uses
/// `send` or `send_blocking`; small (4 KiB) and default rings, shm off and on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packed_and_unpacked_messages_keep_their_order() {
    const ROUNDS: u32 = 5;
    for capacity in [4096usize, 256 * 1024] {
        for shm in [false, true] {
            for (blocking_send, blocking_recv) in [(false, false), (true, false), (false, true), (true, true)] {
                let what = format!(
                    "capacity {capacity}, shm {shm}, blocking send {blocking_send}, blocking recv {blocking_recv}"
                );
                let ep = endpoint(Some(RingOptions::default().capacity(capacity)), shm);
                let (s, c) = arc_pair(&ep, &ep, "order").await;
                assert!(packs(&s) && packs(&c), "{what}");
                let mut msgs = Vec::new();
                for round in 0..ROUNDS {
                    msgs.extend(mixed_round(&c, round).await);
                }
                let want = msgs.clone();
                let n = msgs.len();
                let sender = {
                    let c = c.clone();
                    if blocking_send {
                        let t = std::thread::spawn(move || {
                            for m in msgs {
                                c.send_blocking(m).unwrap();
                            }
                        });
                        tokio::spawn(join(t))
                    } else {
                        tokio::spawn(async move {
                            for m in msgs {
                                c.send(m).await.unwrap();
                            }
                        })
                    }
                };
                let check = |what: &str, k: usize, got: &Message, want: &Message| {
                    assert_eq!(got.header["round"], json!(k / 10), "{what}: message {k} out of order");
                    assert_eq!(got.header["i"], json!(k % 10), "{what}: message {k} out of order");
                    assert_eq!(got, want, "{what}: message {k}");
                };
                if blocking_recv {
                    let (s2, want2, what2) = (s.clone(), want.clone(), what.clone());
                    join(std::thread::spawn(move || {
                        for (k, w) in want2.iter().enumerate() {
                            let got = s2.recv_blocking(LONG).unwrap_or_else(|e| panic!("{what2}: message {k}: {e}"));
                            check(&what2, k, &got, w);
                        }
                    }))
                    .await;
                } else {
                    for (k, w) in want.iter().enumerate() {
                        let got = recv(&s).await.unwrap_or_else(|e| panic!("{what}: message {k}: {e}"));
                        check(&what, k, &got, w);
                    }
                }
                tokio::time::timeout(BOUND, sender).await.expect("the sender ends").unwrap();
                assert_eq!(n, (ROUNDS * 10) as usize);
                // Nothing is left over: the next message is the next one sent.
                c.send(Message::new(json!("last"))).await.unwrap();
                assert_eq!(recv(&s).await.unwrap().header, json!("last"), "{what}");
            }
        }
    }
}

/// `recv_blocking` whose deadline passes with nothing sent returns `Timeout` and leaves
/// the pipe open; the packed message sent after is received whole. Then many short
/// deadlines race a stream of packed messages: none is lost, torn or reordered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_that_passes_loses_no_packed_message() {
    for shm in [false, true] {
        let ep = endpoint(Some(RingOptions::default()), shm);
        let (s, c) = arc_pair(&ep, &ep, "deadline").await;
        assert!(packs(&c), "shm {shm}");
        let short = Duration::from_millis(30);
        let c2 = c.clone();
        let e = join(std::thread::spawn(move || c2.recv_blocking(Some(short)))).await.unwrap_err();
        assert!(matches!(e, PipeError::Timeout(d, "recv_blocking") if d == short), "{e:?}");
        assert!(!c.is_closed());
        // Sent after the deadline passed, by `send` and by `send_blocking`.
        let m = packable_messages().swap_remove(4);
        s.send(m.clone()).await.unwrap();
        let c2 = c.clone();
        let got = join(std::thread::spawn(move || c2.recv_blocking(LONG))).await.unwrap();
        assert_same(&got, &m, "after a timeout");
        let c2 = c.clone();
        let e = join(std::thread::spawn(move || c2.recv_blocking(Some(short)))).await.unwrap_err();
        assert!(matches!(e, PipeError::Timeout(_, "recv_blocking")), "{e:?}");
        let s2 = s.clone();
        let m2 = m.clone();
        join(std::thread::spawn(move || s2.send_blocking(m2))).await.unwrap();
        let c2 = c.clone();
        let got = join(std::thread::spawn(move || c2.recv_blocking(LONG))).await.unwrap();
        assert_same(&got, &m, "after a second timeout");

        // Short deadlines racing a paced stream of packed messages.
        const N: u32 = 300;
        let s2 = s.clone();
        let sender = std::thread::spawn(move || {
            for i in 0..N {
                s2.send_blocking(Message::with_tensors(json!({"i": i}), vec![bytes_tensor(64 + i as usize, i as u8)]))
                    .unwrap();
                // Pacing (not a wait for anything): lets some receive deadlines pass between
                // messages, and some end while one arrives.
                if i % 4 == 0 {
                    std::thread::sleep(Duration::from_micros(200 * u64::from(i % 7)));
                }
            }
        });
        let c2 = c.clone();
        let receiver = std::thread::spawn(move || {
            let bound = Instant::now() + BOUND;
            let (mut next, mut timeouts, mut tries) = (0u32, 0u32, 0u64);
            while next < N {
                assert!(Instant::now() < bound, "only {next} of {N} messages came within the bound");
                tries += 1;
                let deadline = Duration::from_micros(100 + 250 * (tries % 5));
                match c2.recv_blocking(Some(deadline)) {
                    Ok(m) => {
                        assert_eq!(m.header, json!({"i": next}), "in order, none lost");
                        check_bytes(&m.tensors[0], 64 + next as usize, next as u8);
                        next += 1;
                    }
                    Err(PipeError::Timeout(d, "recv_blocking")) => {
                        assert_eq!(d, deadline);
                        timeouts += 1;
                    }
                    Err(e) => panic!("after {next} messages: {e:?}"),
                }
            }
            timeouts
        });
        join(sender).await;
        let _timeouts = join(receiver).await;
        assert!(!c.is_closed() && !s.is_closed());
        // The async side goes on where the blocking one stopped.
        s.send(Message::new(json!("after the race"))).await.unwrap();
        assert_eq!(recv(&c).await.unwrap().header, json!("after the race"));
    }
}

/// The receiver's limits bind packed messages as they bind MESSAGE frames: a message over
/// them is refused by the sender, by name, and the pipe goes on; one within them is packed
/// and arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_limits_still_bind_messages_that_would_be_packed() {
    let strict = Limits { max_tensors: 2, max_payload_bytes: 1000, max_header_bytes: 4096, ..Limits::default() };
    let server = limited_endpoint(strict);
    let client = endpoint(Some(RingOptions::default()), false);
    let (s, c) = arc_pair(&server, &client, "limits").await;
    assert!(packs(&s) && packs(&c));
    let over = [
        (
            "max_tensors",
            Message::with_tensors(json!(1), vec![bytes_tensor(1, 1), bytes_tensor(1, 2), bytes_tensor(1, 3)]),
        ),
        ("max_payload_bytes", Message::with_tensors(json!(2), vec![bytes_tensor(1001, 1)])),
        ("max_header_bytes", Message::new(json!({"pad": "h".repeat(5000)}))),
    ];
    for (blocking, (limit, m)) in [false, true].into_iter().flat_map(|b| over.clone().map(|o| (b, o))) {
        let e = if blocking {
            let c2 = c.clone();
            join(std::thread::spawn(move || c2.send_blocking(m))).await.unwrap_err()
        } else {
            c.send(m).await.unwrap_err()
        };
        assert!(matches!(&e, PipeError::Limit(l) if l.limit == limit), "blocking {blocking}, {limit}: {e:?}");
        assert!(!c.is_closed(), "a refused send leaves the pipe open");
    }
    // Within the limits (two tensors, 10 bytes padded to 64 plus 900: 964 bytes).
    let ok = Message::with_tensors(json!({"pad": "h".repeat(3000)}), vec![bytes_tensor(10, 4), bytes_tensor(900, 5)]);
    c.send(ok.clone()).await.unwrap();
    assert_same(&recv(&s).await.unwrap(), &ok, "within the limits");
    let c2 = c.clone();
    let ok2 = ok.clone();
    join(std::thread::spawn(move || c2.send_blocking(ok2))).await.unwrap();
    assert_same(&recv(&s).await.unwrap(), &ok, "within the limits, blocking");
}

/// A pipe with a handler gets packed messages in its handler, in order, equal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_gets_packed_messages() {
    let ep = endpoint(Some(RingOptions::default()), true);
    let (s, c) = arc_pair(&ep, &ep, "handler").await;
    assert!(packs(&s));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    s.set_handler(Box::new(move |m| {
        let _ = tx.send(m);
        ferry_core::Handled::Done
    }));
    let want = packable_messages();
    for m in &want {
        c.send(m.clone()).await.unwrap();
    }
    let c2 = c.clone();
    let want2 = want.clone();
    join(std::thread::spawn(move || {
        for m in want2 {
            c2.send_blocking(m).unwrap();
        }
    }))
    .await;
    for (i, m) in want.iter().chain(&want).enumerate() {
        let got = tokio::time::timeout(BOUND, rx.recv()).await.expect("the handler gets it").unwrap();
        assert_same(&got, m, &format!("message {i}"));
    }
}

/// Several senders at once on one pipe, two with `send` in tasks and two with
/// `send_blocking` on threads, each mixing packed messages with ones that cannot be
/// packed: every message arrives whole, and each sender's arrive in its order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_senders_keep_each_senders_order() {
    const PER: u32 = 60;
    let sizes = [10usize, 5000, 0, 20_000, 64, 300];
    for shm in [false, true] {
        let ep = endpoint(Some(RingOptions::default().capacity(4096)), shm);
        let (s, c) = arc_pair(&ep, &ep, "concurrent").await;
        assert!(packs(&c));
        let msg = move |who: u32, i: u32| {
            let n = sizes[(i as usize + who as usize) % sizes.len()];
            let tensors = if n == 0 { vec![] } else { vec![bytes_tensor(n, (who * 64 + i) as u8)] };
            Message::with_tensors(json!({"who": who, "i": i, "n": n}), tensors)
        };
        let mut tasks = Vec::new();
        for who in 0..2u32 {
            let c = c.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..PER {
                    c.send(msg(who, i)).await.unwrap();
                }
            }));
        }
        for who in 2..4u32 {
            let c = c.clone();
            let t = std::thread::spawn(move || {
                for i in 0..PER {
                    c.send_blocking(msg(who, i)).unwrap();
                }
            });
            tasks.push(tokio::spawn(join(t)));
        }
        let mut next = [0u32; 4];
        for k in 0..4 * PER {
            let m = recv(&s).await.unwrap_or_else(|e| panic!("shm {shm}, message {k}: {e}"));
            let who = m.header["who"].as_u64().unwrap() as u32;
            let i = m.header["i"].as_u64().unwrap() as u32;
            assert_eq!(i, next[who as usize], "shm {shm}: sender {who} out of order");
            next[who as usize] += 1;
            assert_eq!(m, msg(who, i), "shm {shm}: sender {who}, message {i}");
        }
        for t in tasks {
            tokio::time::timeout(BOUND, t).await.expect("the senders end").unwrap();
        }
        assert_eq!(next, [PER; 4]);
    }
}

/// A blocking receiver and an async one share one stream of packed messages: each message
/// is received exactly once, whole, and each receiver gets its share in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_and_an_async_receiver_share_a_stream() {
    const N: u32 = 400;
    let ep = endpoint(Some(RingOptions::default()), false);
    let (s, c) = arc_pair(&ep, &ep, "share").await;
    let got = Arc::new(std::sync::Mutex::new(Vec::<u32>::new()));
    let count = |got: &std::sync::Mutex<Vec<u32>>| got.lock().unwrap().len() as u32;
    let take = |m: Message, mine: &mut Vec<u32>, got: &std::sync::Mutex<Vec<u32>>| {
        let i = m.header["i"].as_u64().unwrap() as u32;
        check_bytes(&m.tensors[0], 32 + (i as usize % 100), i as u8);
        assert!(mine.last().is_none_or(|l| *l < i), "{i} after {:?}", mine.last());
        mine.push(i);
        got.lock().unwrap().push(i);
    };
    let sender = {
        let s = s.clone();
        tokio::spawn(async move {
            for i in 0..N {
                s.send(Message::with_tensors(json!({"i": i}), vec![bytes_tensor(32 + (i as usize % 100), i as u8)]))
                    .await
                    .unwrap();
                if i % 16 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        })
    };
    let blocking = {
        let (c, got) = (c.clone(), got.clone());
        std::thread::spawn(move || {
            let bound = Instant::now() + BOUND;
            let mut mine = Vec::new();
            while count(&got) < N {
                assert!(Instant::now() < bound, "the stream ends within the bound");
                match c.recv_blocking(Some(Duration::from_millis(2))) {
                    Ok(m) => take(m, &mut mine, &got),
                    Err(PipeError::Timeout(..)) => {}
                    Err(e) => panic!("{e:?}"),
                }
            }
            mine.len()
        })
    };
    let bound = Instant::now() + BOUND;
    let mut mine = Vec::new();
    while count(&got) < N {
        assert!(Instant::now() < bound, "the stream ends within the bound");
        match c.recv_timeout(Duration::from_millis(2)).await {
            Ok(m) => take(m, &mut mine, &got),
            Err(PipeError::Timeout(..)) => {}
            Err(e) => panic!("{e:?}"),
        }
    }
    let _blocking_share = join(blocking).await;
    tokio::time::timeout(BOUND, sender).await.expect("the sender ends").unwrap();
    let mut all = got.lock().unwrap().clone();
    all.sort_unstable();
    assert_eq!(all, (0..N).collect::<Vec<_>>(), "each message exactly once");
}

/// A `send` of a packed message dropped while it waits for room in a full ring sends it
/// whole or not at all, and the pipe goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_packed_send_goes_whole_or_not_at_all() {
    let ep = endpoint(Some(RingOptions::default().capacity(4096)), false);
    let (s, c) = arc_pair(&ep, &ep, "dropped").await;
    // Nobody reads: the receive queue fills, then the ring; later sends wait for room.
    let mut sent = 0u32;
    let mut dropped = Vec::new();
    for i in 0..200u32 {
        let m = Message::with_tensors(json!({"i": i}), vec![bytes_tensor(200, i as u8)]);
        match tokio::time::timeout(Duration::from_millis(20), c.send(m)).await {
            Ok(r) => {
                r.unwrap();
                sent += 1;
            }
            Err(_) => dropped.push(i),
        }
        if dropped.len() >= 3 {
            break;
        }
    }
    assert!(!dropped.is_empty(), "a 4 KiB ring and the receive queue cannot take 200 messages");
    assert!(!c.is_closed());
    // Now read everything (while one more message is sent): each message whole, in order,
    // every completed send among them, a dropped one at most once.
    let end_sent = tokio::spawn({
        let c = c.clone();
        async move { c.send(Message::new(json!("end"))).await }
    });
    let mut seen: Vec<u32> = Vec::new();
    for _ in 0..=200 {
        let m = recv(&s).await.unwrap();
        if m.header == json!("end") {
            break;
        }
        let i = m.header["i"].as_u64().unwrap() as u32;
        assert!(seen.last().is_none_or(|l| *l < i), "{i} after {:?}", seen.last());
        check_bytes(&m.tensors[0], 200, i as u8);
        seen.push(i);
    }
    tokio::time::timeout(BOUND, end_sent).await.expect("the last send ends").unwrap().unwrap();
    let completed = seen.iter().filter(|i| !dropped.contains(i)).count() as u32;
    assert_eq!(completed, sent, "every completed send arrived (seen {seen:?}, dropped {dropped:?})");
    c.send(Message::new(json!("after"))).await.unwrap();
    assert_eq!(recv(&s).await.unwrap().header, json!("after"));
}

/// The receiver's `max_header_values` binds a big packed header as it binds a MESSAGE
/// frame's: the receiving pipe fails with the limit by name, for `recv` and for
/// `recv_blocking`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_receivers_max_header_values_binds_packed_headers() {
    for blocking in [false, true] {
        let server = Endpoint::builder()
            .transport(Arc::new(LocalTransport::new()))
            .channel(Arc::new(InlineChannel))
            .max_header_values(1000)
            .ring(Some(RingOptions::default()))
            .build();
        let client = endpoint(Some(RingOptions::default()), false);
        let (s, c) = arc_pair(&server, &client, "values").await;
        assert!(packs(&c));
        // 20,000 numbers, about 100 KiB of JSON: counted (over 64 KiB), and a packed record.
        let big = Message::with_tensors(json!({"v": (0..20_000u32).collect::<Vec<_>>()}), vec![bytes_tensor(8, 1)]);
        c.send(big).await.unwrap();
        let e = if blocking {
            let s2 = s.clone();
            join(std::thread::spawn(move || s2.recv_blocking(LONG))).await.unwrap_err()
        } else {
            recv(&s).await.unwrap_err()
        };
        assert!(matches!(&e, PipeError::Limit(l) if l.limit == "max_header_values"), "{e:?}");
        assert!(s.is_closed());
    }
}

/// The zero-copy hand-off through packed records, both sides blocking (the `bench-ring`
/// case): the client sends tensors made in its shm pool, the peer sends each one back (a
/// `shm_return` reference to the client's lease), and the client gets its own memory back,
/// not a copy. The peer's releases of the client's leases travel right behind its answers
/// and are read by the client's blocking calls on the way to the next answer: at the end no
/// lease is left granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shm_tensors_go_and_come_back_by_reference_in_packed_records() {
    let ep = endpoint(Some(RingOptions::default()), true);
    let (s, c) = arc_pair(&ep, &ep, "zero-copy").await;
    assert!(packs(&s) && packs(&c));
    const ROUNDS: usize = 200;
    let peer = std::thread::spawn(move || {
        for _ in 0..ROUNDS {
            let m = s.recv_blocking(LONG).unwrap();
            s.send_blocking(m).unwrap();
        }
        s
    });
    let meta = TensorMeta::new(DType::F32, vec![256, 1024]);
    let mut tensors = Vec::new();
    for i in 0..4u8 {
        let mut t = c.alloc(meta.clone()).await.unwrap();
        t.as_bytes_mut().fill(i);
        tensors.push(t.freeze());
    }
    let c2 = c.clone();
    let client = std::thread::spawn(move || {
        for round in 0..ROUNDS {
            let t = &tensors[round % tensors.len()];
            c2.send_blocking(Message::with_tensors(json!({"round": round}), vec![t.clone()])).unwrap();
            let back = c2.recv_blocking(LONG).unwrap();
            assert_eq!(back.header, json!({"round": round}));
            assert_eq!(back.tensors[0].as_bytes().as_ptr(), t.as_bytes().as_ptr(), "round {round}: a copy came back");
            assert!(back.tensors[0].as_bytes().iter().all(|b| *b == (round % 4) as u8));
        }
    });
    join(client).await;
    let s = join(peer).await;
    // The last release may still be in the ring: the client's task reads it once no blocking
    // call holds the reader (bounded wait).
    let deadline = Instant::now() + BOUND;
    while c.leases_granted() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(c.leases_granted(), 0, "every lease the peer held was released");
    drop(s);
}
