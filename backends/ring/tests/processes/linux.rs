//! The tests and the peer's scripts (Linux only; see `../processes.rs`).

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitCode, Stdio};
use std::time::Duration;

use ferry_ring::handoff::{recv_ring_fd, send_ring_fd};
use ferry_ring::{OpenError, Ring, RingError, RingOptions, deadline_in, testing};
use libtest_mimic::{Arguments, Failed, Trial};

/// The bound on any one wait: reached only when something is broken.
const BOUND: Duration = Duration::from_secs(60);
/// The ring capacity of most tests: small, so that frames wrap around often.
const CAP: usize = 4096;

type Outcome = Result<(), Failed>;
/// A named test.
type Case = (&'static str, fn() -> Outcome);

/// The test binary's entry point on Linux: the peer's script, or the tests.
pub fn main() -> ExitCode {
    if let Ok(role) = std::env::var("FERRY_RING_PEER") {
        return match peer(&role) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("ferry-ring test peer {role}: {e}");
                ExitCode::from(2)
            }
        };
    }
    let tests: [Case; 18] = [
        ("round_trips_of_many_sizes_wrap_around", || round_trips(Duration::from_micros(50))),
        ("round_trips_with_spinning_off_sleep_on_the_futex", || round_trips(Duration::ZERO)),
        ("pipelined_frames_both_ways_spinning", || pipelined(Duration::from_micros(50), 20_000)),
        ("pipelined_frames_both_ways_sleeping_every_wait", || pipelined(Duration::ZERO, 20_000)),
        ("a_frame_too_large_is_refused_and_the_ring_goes_on", too_large),
        ("a_full_ring_blocks_the_sender_until_the_consumer_reads", full_ring),
        ("a_tail_past_the_capacity_is_corrupt", || corrupt_recv("liar-tail")),
        ("a_length_over_the_largest_frame_is_corrupt", || corrupt_recv("liar-len-max")),
        ("a_length_past_the_published_bytes_is_corrupt", || corrupt_recv("liar-len-avail")),
        ("a_head_past_the_tail_is_corrupt", corrupt_head),
        ("sigkill_of_the_opener_mid_write_is_noticed", kill_opener_mid_write),
        ("sigkill_of_the_creator_wakes_a_blocked_sender_and_receiver", kill_creator),
        ("frames_published_before_a_sigkill_are_received_first", kill_after_frames),
        ("an_orderly_close_is_seen_after_the_last_frame", orderly_close),
        ("an_idle_waiter_sleeps_in_the_kernel", idle_waiter_sleeps),
        ("open_refuses_bad_files", open_refusals),
        ("a_peer_scribbling_over_the_file_gets_typed_errors_only", scribbling_peer),
        ("an_async_caller_waits_in_the_blocking_pool", async_caller),
    ];
    let mut trials: Vec<Trial> = tests.into_iter().map(|(name, f)| Trial::test(name, f)).collect();
    // Stress, run by name: `cargo test -p ferry-ring --test processes -- --ignored stress`.
    trials.push(
        Trial::test("stress_a_million_pipelined_frames_with_every_wait_sleeping", || {
            pipelined(Duration::ZERO, 1_000_000)
        })
        .with_ignored_flag(true),
    );
    trials.push(
        Trial::test("stress_a_million_pipelined_frames_spinning", || pipelined(Duration::from_micros(50), 1_000_000))
            .with_ignored_flag(true),
    );
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

// ---------------------------------------------------------------------------------------
// The parent's side

/// A peer process and this side's end of its socket.
struct Peer {
    child: std::process::Child,
    sock: UnixStream,
}

impl Peer {
    /// Starts this binary as `role`, with spin window `spin` and ring capacity `cap`.
    fn spawn(role: &str, spin: Duration, cap: usize) -> Result<Peer, Failed> {
        let (mine, theirs) = UnixStream::pair()?;
        let child = Command::new(std::env::current_exe()?)
            .env("FERRY_RING_PEER", role)
            .env("FERRY_RING_SPIN_NS", spin.as_nanos().to_string())
            .env("FERRY_RING_CAP", cap.to_string())
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            .spawn()?;
        Ok(Peer { child, sock: mine })
    }

    /// Creates a ring, hands it to the peer and watches the socket.
    fn create(role: &str, spin: Duration, cap: usize) -> Result<(Peer, Ring, ferry_ring::DeathWatch), Failed> {
        let peer = Peer::spawn(role, spin, cap)?;
        let (ring, fd) = Ring::create(&RingOptions::new().capacity(cap).spin(spin))?;
        send_ring_fd(&peer.sock, &fd, cap)?;
        let watch = ring.watch_socket(OwnedFd::from(peer.sock.try_clone()?))?;
        Ok((peer, ring, watch))
    }

    /// Waits for the peer's exit (killing it at [`BOUND`]) and returns its status.
    fn wait(mut self) -> Result<std::process::ExitStatus, Failed> {
        // Shut down rather than close: the death watch holds a duplicate of the descriptor.
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
        for _ in 0..BOUND.as_millis() {
            if let Some(s) = self.child.try_wait()? {
                return Ok(s);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        Err("the peer process did not exit".into())
    }

    /// Waits for the peer to exit successfully.
    fn success(self) -> Outcome {
        let s = self.wait()?;
        check(s.success(), format!("peer exited with {s}"))
    }

    /// Reads one byte the peer writes when it reached a point of its script.
    fn await_signal(&mut self) -> Outcome {
        let mut b = [0u8; 1];
        self.sock.read_exact(&mut b)?;
        Ok(())
    }

    /// SIGKILLs the peer and checks that it died of it.
    fn kill(mut self) -> Outcome {
        self.child.kill()?;
        let s = self.child.wait()?;
        check(s.signal() == Some(9), format!("peer exited with {s}, not SIGKILL"))
    }
}

fn check(cond: bool, msg: impl Into<String>) -> Outcome {
    if cond { Ok(()) } else { Err(msg.into().into()) }
}

/// Deterministic payload bytes for frame `i` of length `len`.
fn pattern(i: u64, len: usize) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The lengths of the round-trip test: every length up to 200, then a spread up to the
/// largest frame (ending with it).
fn lengths(max: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..=200).collect();
    let mut x = 12345u64;
    for _ in 0..2000 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        v.push((x >> 33) as usize % (max + 1));
    }
    v.extend([max - 1, max, 0, max]);
    v
}

fn round_trips(spin: Duration) -> Outcome {
    let (peer, mut ring, _watch) = Peer::create("echo", spin, CAP)?;
    let mut buf = Vec::new();
    let max = ring.max_frame();
    check(max == CAP - 8, format!("largest frame {max}"))?;
    let lens = lengths(max);
    for (i, &len) in lens.iter().enumerate() {
        let p = pattern(i as u64, len);
        ring.send_tagged(i as u32, &p, deadline_in(BOUND))?;
        let tag = ring.recv(&mut buf, deadline_in(BOUND))?;
        check(tag == i as u32 && buf == p, format!("frame {i} of {len} bytes came back different"))?;
    }
    let sent: usize = lens.iter().map(|l| 8 + l.next_multiple_of(8)).sum();
    check(testing::tail(&ring) == sent as u64, "tail is the sum of the records")?;
    check(sent > 100 * CAP, "the ring wrapped around many times")?;
    drop(ring);
    peer.success()
}

fn pipelined(spin: Duration, n: u64) -> Outcome {
    // A sender thread streams frames while a receiver thread takes the echoes: both rings
    // fill, and the producers and consumers of both processes sleep and wake each other
    // (spinning off: every wait sleeps). A lost wake-up would end in Timeout at BOUND.
    let (peer, ring, _watch) = Peer::create("echo", spin, CAP)?;
    let (mut tx, mut rx) = ring.into_split();
    let len = |i: u64| (i as usize * 131) % 1000;
    let sender = std::thread::spawn(move || -> Result<(), RingError> {
        for i in 0..n {
            tx.send_tagged(i as u32, &pattern(i, len(i)), deadline_in(BOUND))?;
        }
        Ok(())
    });
    let mut buf = Vec::new();
    for i in 0..n {
        let tag = rx.recv(&mut buf, deadline_in(BOUND))?;
        check(u64::from(tag) == i && buf == pattern(i, len(i)), format!("frame {i} out of order or changed"))?;
    }
    sender.join().map_err(|_| "sender panicked")??;
    drop(rx);
    peer.success()
}

fn too_large() -> Outcome {
    let (peer, mut ring, _watch) = Peer::create("echo", Duration::from_micros(50), CAP)?;
    let max = ring.max_frame();
    let r = ring.send(&vec![1u8; max + 1], deadline_in(BOUND));
    check(matches!(r, Err(RingError::TooLarge { len, max: m }) if len == max + 1 && m == max), format!("{r:?}"))?;
    check(testing::tail(&ring) == 0, "nothing was written")?;
    let mut buf = Vec::new();
    ring.send(b"still fine", deadline_in(BOUND))?;
    ring.recv(&mut buf, deadline_in(BOUND))?;
    check(buf == b"still fine", "the ring works after a refusal")?;
    drop(ring);
    peer.success()
}

fn full_ring() -> Outcome {
    let (mut peer, ring, _watch) = Peer::create("sink", Duration::from_micros(50), CAP)?;
    let (mut tx, mut rx) = ring.into_split();
    // The sink reads nothing before the go: fill the ring until a send with a deadline
    // already passed times out (the ring is full, and stays full).
    let mut n = 0u64;
    loop {
        check(n < CAP as u64, "the ring never filled")?;
        match tx.send_tagged(n as u32, &pattern(n, 100), std::time::Instant::now()) {
            Ok(()) => n += 1,
            Err(RingError::Timeout) => break,
            Err(e) => return Err(e.into()),
        }
    }
    check(n == (CAP / 112) as u64, format!("{n} frames of 100 bytes filled a ring of {CAP}"))?;
    peer.sock.write_all(b"g")?;
    // Now the sends wait for room (spinning, then sleeping) while the sink drains.
    let total = n + 500;
    for i in n..total {
        tx.send_tagged(i as u32, &pattern(i, 100), deadline_in(BOUND))?;
    }
    drop(tx); // the sink sees Closed after the last frame
    let mut buf = Vec::new();
    rx.recv(&mut buf, deadline_in(BOUND))?;
    check(buf == total.to_le_bytes(), format!("the sink counted {buf:?}, {total} sent"))?;
    drop(rx);
    peer.success()
}

fn corrupt_recv(role: &str) -> Outcome {
    let (mut peer, mut ring, _watch) = Peer::create(role, Duration::from_micros(50), CAP)?;
    peer.await_signal()?;
    let mut buf = Vec::new();
    let r = ring.recv(&mut buf, deadline_in(BOUND));
    check(matches!(r, Err(RingError::Corrupt(_))), format!("{r:?}"))?;
    let again = ring.recv(&mut buf, deadline_in(BOUND));
    check(matches!(again, Err(RingError::Corrupt(_))), format!("stays corrupt: {again:?}"))?;
    let send = ring.send(b"x", deadline_in(BOUND));
    check(matches!(send, Err(RingError::Corrupt(_))), format!("the other half fails too: {send:?}"))?;
    drop(ring);
    peer.success()
}

fn corrupt_head() -> Outcome {
    let (mut peer, mut ring, _watch) = Peer::create("liar-head", Duration::from_micros(50), CAP)?;
    peer.await_signal()?;
    // The sender trusts the room it already saw; once it must look at `head` again it finds
    // the lie.
    let mut result = Ok(());
    for i in 0..=(CAP / 16) {
        result = ring.send(&[i as u8; 8], deadline_in(BOUND));
        if result.is_err() {
            break;
        }
    }
    check(matches!(result, Err(RingError::Corrupt(_))), format!("{result:?}"))?;
    drop(ring);
    peer.success()
}

fn kill_opener_mid_write() -> Outcome {
    let (mut peer, mut ring, _watch) = Peer::create("die-mid-write", Duration::ZERO, CAP)?;
    peer.await_signal()?;
    peer.kill()?;
    let mut buf = Vec::new();
    let r = ring.recv(&mut buf, deadline_in(BOUND));
    check(matches!(r, Err(RingError::PeerGone)), format!("{r:?}"))?;
    let s = ring.send(b"anyone?", deadline_in(BOUND));
    check(matches!(s, Err(RingError::PeerGone)), format!("{s:?}"))
}

fn kill_after_frames() -> Outcome {
    let (mut peer, mut ring, _watch) = Peer::create("send-3", Duration::from_micros(50), CAP)?;
    peer.await_signal()?;
    peer.kill()?;
    let mut buf = Vec::new();
    for i in 0..3u32 {
        let r = ring.recv(&mut buf, deadline_in(BOUND));
        check(matches!(r, Ok(t) if t == i) && buf == pattern(u64::from(i), 10), format!("frame {i}: {r:?}"))?;
    }
    let r = ring.recv(&mut buf, deadline_in(BOUND));
    check(matches!(r, Err(RingError::PeerGone)), format!("after the frames: {r:?}"))
}

fn kill_creator() -> Outcome {
    let mut peer = Peer::spawn("creator-idle", Duration::from_micros(50), CAP)?;
    let (fd, cap) = recv_ring_fd(&peer.sock)?;
    let ring = Ring::open(fd, cap, &RingOptions::new())?;
    let _watch = ring.watch_socket(OwnedFd::from(peer.sock.try_clone()?))?;
    peer.await_signal()?;
    let (mut tx, mut rx) = ring.into_split();
    let mut n = 0u32;
    while tx.send(&[7u8; 200], std::time::Instant::now()).is_ok() {
        n += 1;
        check(n < CAP as u32, "the ring never filled")?;
    }
    // Both halves wait (the creator reads and writes nothing) while it is killed.
    let sender = std::thread::spawn(move || tx.send(&[7u8; 200], deadline_in(BOUND)));
    let receiver = std::thread::spawn(move || rx.recv(&mut Vec::new(), deadline_in(BOUND)));
    peer.kill()?;
    let s = sender.join().map_err(|_| "sender panicked")?;
    let r = receiver.join().map_err(|_| "receiver panicked")?;
    check(matches!(s, Err(RingError::PeerGone)), format!("sender: {s:?}"))?;
    check(matches!(r, Err(RingError::PeerGone)), format!("receiver: {r:?}"))
}

fn orderly_close() -> Outcome {
    let (mut peer, mut ring, _watch) = Peer::create("close-after-5", Duration::from_micros(50), CAP)?;
    peer.await_signal()?; // it dropped its ring, and keeps its socket open
    let mut buf = Vec::new();
    for i in 0..5u32 {
        let tag = ring.recv(&mut buf, deadline_in(BOUND))?;
        check(tag == i && buf == pattern(u64::from(i), 10), format!("frame {i}"))?;
    }
    let r = ring.recv(&mut buf, deadline_in(BOUND));
    check(matches!(r, Err(RingError::Closed)), format!("after the last frame: {r:?}"))?;
    let s = ring.send(b"x", deadline_in(BOUND));
    check(matches!(s, Err(RingError::Closed)), format!("sending to a closed ring: {s:?}"))?;
    peer.success()
}

fn idle_waiter_sleeps() -> Outcome {
    let (peer, ring, _watch) = Peer::create("echo", Duration::from_micros(50), CAP)?;
    let (mut tx, mut rx) = ring.into_split();
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        // "/proc/thread-self" links to "PID/task/TID".
        let me = std::fs::read_link("/proc/thread-self").unwrap_or_default();
        let _ = tid_tx.send(me.file_name().map(|t| t.to_string_lossy().into_owned()).unwrap_or_default());
        let mut buf = Vec::new();
        rx.recv(&mut buf, deadline_in(BOUND)).map(|_| buf)
    });
    let tid = tid_rx.recv()?;
    // Nothing was sent: the waiter spins for its window, then sleeps on the futex. Look
    // (a bounded number of times) until the kernel says it sleeps there.
    let mut asleep = false;
    for _ in 0..20_000 {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))?;
        let state = stat.rsplit(')').next().and_then(|s| s.split_whitespace().next());
        let wchan = std::fs::read_to_string(format!("/proc/self/task/{tid}/wchan")).unwrap_or_default();
        if state == Some("S") && (wchan.contains("futex") || wchan == "0" || wchan.is_empty()) {
            asleep = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    check(asleep, "the idle waiter never went to sleep")?;
    tx.send(b"wake up", deadline_in(BOUND))?;
    let got = waiter.join().map_err(|_| "waiter panicked")??;
    check(got == b"wake up", "the echo woke the sleeping waiter")?;
    drop(tx);
    peer.success()
}

fn open_refusals() -> Outcome {
    let opts = RingOptions::new();
    let r = Ring::open(testing::unsealed_memfd((4096 + 2 * CAP) as u64)?, CAP, &opts);
    check(matches!(r, Err(OpenError::NotSealed(_))), format!("unsealed: {r:?}"))?;
    let devnull: OwnedFd = std::fs::File::open("/dev/null")?.into();
    let r = Ring::open(devnull, CAP, &opts);
    check(matches!(r, Err(OpenError::NotSealed(_))), format!("not a memfd: {r:?}"))?;
    let (_ring, fd) = Ring::create(&RingOptions::new().capacity(CAP))?;
    let r = Ring::open(fd.try_clone()?, 2 * CAP, &opts);
    check(matches!(r, Err(OpenError::WrongSize { .. })), format!("capacity lie: {r:?}"))?;
    let r = Ring::open(fd.try_clone()?, 2 * CAP, &RingOptions::new().capacity(CAP));
    check(matches!(r, Err(OpenError::BadCapacity(_))), format!("over this side's limit: {r:?}"))?;
    let r = Ring::open(fd.try_clone()?, 5000, &opts);
    check(matches!(r, Err(OpenError::BadCapacity(_))), format!("not a power of two: {r:?}"))?;
    let r = Ring::create(&RingOptions::new().capacity(1 << 31));
    check(matches!(r, Err(OpenError::BadCapacity(_))), format!("too large: {r:?}"))?;
    let r = Ring::open(testing::sealed_memfd(4096 + 2 * CAP)?, CAP, &opts);
    check(matches!(r, Err(OpenError::BadHeader(_))), format!("no header: {r:?}"))?;
    Ring::open(fd, CAP, &opts)?; // the real file opens
    Ok(())
}

fn scribbling_peer() -> Outcome {
    // Each trial: a peer writes random words all over the file (indices, lengths, futex
    // words, data) while this side sends and receives with short deadlines. Every result
    // must be a frame or a typed error; a corruption must stay reported.
    let mut corrupt = 0;
    for trial in 0..8u64 {
        let (mut peer, mut ring, _watch) = Peer::create("scribbler", Duration::from_micros(20), CAP)?;
        peer.await_signal()?; // it has begun to scribble
        let mut buf = Vec::new();
        for op in 0..300u64 {
            let r = if op % 2 == 0 {
                ring.send(&pattern(trial * 1000 + op, (op as usize * 37) % 300), deadline_in(Duration::from_millis(1)))
            } else {
                ring.recv(&mut buf, deadline_in(Duration::from_millis(1))).map(|_| ())
            };
            match r {
                Ok(()) | Err(RingError::Timeout | RingError::Closed) => {}
                Err(RingError::Corrupt(_)) => {
                    corrupt += 1;
                    let again = ring.recv(&mut buf, deadline_in(BOUND));
                    check(matches!(again, Err(RingError::Corrupt(_))), format!("not sticky: {again:?}"))?;
                    break;
                }
                Err(e) => return Err(format!("trial {trial}, op {op}: {e:?}").into()),
            }
        }
        drop(ring);
        peer.success()?;
    }
    // How often a trial ends corrupt depends on where the random words land: reported, not
    // asserted.
    eprintln!("scribbling: {corrupt} of 8 trials ended with Corrupt");
    Ok(())
}

fn async_caller() -> Outcome {
    // The async recipe of the crate docs: the receiver moves into the runtime's blocking pool
    // for each wait and comes back with the frame.
    let (peer, ring, _watch) = Peer::create("echo", Duration::from_micros(50), CAP)?;
    let (mut tx, mut rx) = ring.into_split();
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    rt.block_on(async move {
        let mut buf = Vec::new();
        for i in 0..100u32 {
            tx.send_tagged(i, &pattern(u64::from(i), 64), deadline_in(BOUND))?;
            let (back, back_buf, r) = tokio::task::spawn_blocking(move || {
                let r = rx.recv(&mut buf, deadline_in(BOUND));
                (rx, buf, r)
            })
            .await?;
            (rx, buf) = (back, back_buf);
            check(r? == i && buf == pattern(u64::from(i), 64), format!("frame {i}"))?;
        }
        Ok::<(), Failed>(())
    })?;
    peer.success()
}

// ---------------------------------------------------------------------------------------
// The peer's side

fn peer(role: &str) -> Result<(), Box<dyn std::error::Error>> {
    let sock = UnixStream::from(std::io::stdin().as_fd().try_clone_to_owned()?);
    let spin = Duration::from_nanos(std::env::var("FERRY_RING_SPIN_NS")?.parse()?);
    let cap: usize = std::env::var("FERRY_RING_CAP")?.parse()?;
    let opts = RingOptions::new().capacity(cap).spin(spin);
    if role == "creator-idle" {
        let (_ring, fd) = Ring::create(&opts)?;
        send_ring_fd(&sock, &fd, cap)?;
        return idle_until_eof(sock, true);
    }
    let (fd, cap) = recv_ring_fd(&sock)?;
    let mut ring = Ring::open(fd, cap, &opts)?;
    let _watch = ring.watch_socket(OwnedFd::from(sock.try_clone()?))?;
    let mut buf = Vec::new();
    match role {
        "echo" => loop {
            match ring.recv(&mut buf, deadline_in(BOUND)) {
                Ok(tag) => ring.send_tagged(tag, &buf, deadline_in(BOUND))?,
                Err(RingError::Closed | RingError::PeerGone) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        },
        "sink" => {
            (&sock).read_exact(&mut [0u8; 1])?;
            let mut n = 0u64;
            loop {
                match ring.recv(&mut buf, deadline_in(BOUND)) {
                    Ok(tag) if u64::from(tag) == n && buf == pattern(n, 100) => n += 1,
                    Ok(tag) => return Err(format!("frame {n} came as tag {tag}, {} bytes", buf.len()).into()),
                    Err(RingError::Closed) => break,
                    Err(e) => return Err(e.into()),
                }
            }
            ring.send(&n.to_le_bytes(), deadline_in(BOUND))?;
            idle_until_eof(sock, false)
        }
        "scribbler" => {
            let len = testing::file_len(&ring);
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (stop2, mut sock2) = (stop.clone(), sock.try_clone()?);
            let eof = std::thread::spawn(move || {
                let _ = std::io::copy(&mut sock2, &mut std::io::sink());
                stop2.store(true, std::sync::atomic::Ordering::Relaxed);
            });
            let mut x = 0x2545_f491_4f6c_dd1du64 ^ u64::from(std::process::id());
            let mut writes = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && writes < 50_000_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Mostly the data areas, sometimes the control page; half the values small.
                let at = if x % 10 < 7 { 4096 + (x >> 8) as usize % (len - 4096) } else { (x >> 8) as usize % 4096 };
                let value = if x & (1 << 40) != 0 { (x >> 20) % 8192 / 8 * 8 } else { x.rotate_left(17) };
                testing::scribble(&ring, at / 8 * 8, value);
                writes += 1;
                if writes == 10_000 {
                    (&sock).write_all(b"r")?;
                }
                if writes.is_multiple_of(64) {
                    std::thread::yield_now();
                }
            }
            eof.join().map_err(|_| "eof thread panicked")?;
            Ok(())
        }
        "liar-tail" => {
            testing::set_tail(&ring, 2 * cap as u64);
            idle_until_eof(sock, true)
        }
        "liar-len-max" => {
            testing::publish_header(&ring, (cap - 7) as u32, 0, 16);
            idle_until_eof(sock, true)
        }
        "liar-len-avail" => {
            testing::publish_header(&ring, 100, 0, 16);
            idle_until_eof(sock, true)
        }
        "liar-head" => {
            testing::set_head(&ring, 1 << 40);
            idle_until_eof(sock, true)
        }
        "die-mid-write" => {
            testing::write_unpublished(&ring, &[0xff; 64]);
            idle_until_eof(sock, true) // killed here
        }
        "send-3" => {
            for i in 0..3u32 {
                ring.send_tagged(i, &pattern(u64::from(i), 10), deadline_in(BOUND))?;
            }
            idle_until_eof(sock, true) // killed here
        }
        "close-after-5" => {
            for i in 0..5u32 {
                ring.send_tagged(i, &pattern(u64::from(i), 10), deadline_in(BOUND))?;
            }
            drop(ring);
            idle_until_eof(sock, true)
        }
        _ => Err(format!("unknown role {role}").into()),
    }
}

/// Optionally signals the parent (one byte), then blocks until the socket's EOF.
fn idle_until_eof(mut sock: UnixStream, signal: bool) -> Result<(), Box<dyn std::error::Error>> {
    if signal {
        sock.write_all(b"r")?;
    }
    let mut rest = Vec::new();
    sock.read_to_end(&mut rest)?;
    Ok(())
}
