//! 64-byte round trips between two processes, in one run: ferry-ring with spinning on and
//! off, iceoryx2 request-response (busy-polling, the way its own benchmarks wait), and a
//! bare unix stream socket (blocking read/write, the floor under today's socket path; and
//! non-blocking with each read waited for in `epoll`, as a program that multiplexes waits);
//! then the same through ferry's `Pipe` (`src/pipe.rs`): the blocking calls over the ring
//! (spinning on and off; a 64-byte tensor, the same with a small JSON header, and a
//! 24.9 MB shm tensor handed back and forth without a copy) and over the socket, and the
//! async calls over the socket.
//!
//! ```sh
//! cargo run --release --manifest-path bench/iceoryx2-peer/Cargo.toml -- [--iters N] [--rounds R] [--only CASE] [--json] [--load N] [--placement one-cpu|two-cpus]
//! ```
//!
//! The socket rows also run with the two processes pinned (`... 1 CPU`: both on the first
//! CPU this process may use; `... 2 CPUs`: one each on the first two): a round trip through
//! the kernel costs several times more across two CPUs than on one, and the scheduler picks
//! either from one pair of processes to the next, so only pinned rows compare like with
//! like (`FERRY_BENCH_CPU` tells a peer its CPU).
//!
//! `--load N` measures on a busy machine: N CPU burners (this binary as `--peer burn`, at
//! the default priority) spin beside the run; they are killed when it ends, and exit by
//! themselves when its socket to them closes.
//!
//! The parent is the client and times every round trip (`Instant` around send + receive);
//! the peer is this binary re-executed (`--peer KIND`), its stdin a unix socket to the
//! parent: the ring file crosses it, and its EOF tells the peer to stop. iceoryx2 leaves
//! files in /dev/shm and /tmp/iceoryx2 (more of them when a process dies): what appeared
//! there during the run, under iceoryx2's prefix, is removed at the end.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ferry_ring::handoff::{recv_ring_fd, send_ring_fd};
use ferry_ring::{Ring, RingError, RingOptions, deadline_in};
use iceoryx2::prelude::*;

mod pipe;
use pipe::{Load, Path};

pub(crate) type Res<T> = Result<T, Box<dyn std::error::Error>>;

const SIZE: usize = 64;
pub(crate) const BOUND: Duration = Duration::from_secs(30);
const SPIN_ON: Duration = Duration::from_micros(50);
/// Where iceoryx2 keeps its node and service files.
const TMP_DIR: &str = "/tmp/iceoryx2";

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(kind) = flag(&args, "--peer") {
        if let Ok(cpu) = std::env::var(CPU_VAR) {
            pin(&[cpu.parse()?])?;
        }
        return peer(&kind, flag(&args, "--arg").unwrap_or_default());
    }
    let iters: usize = flag(&args, "--iters").map(|s| s.parse()).transpose()?.unwrap_or(100_000);
    let json = args.iter().any(|a| a == "--json");
    let load: usize = flag(&args, "--load").map(|s| s.parse()).transpose()?.unwrap_or(0);
    let _burners = Burners::start(load)?;
    if load > 0 {
        let say = format!("under load: {load} CPU burners (nice 0) spin beside the run");
        if json { eprintln!("{say}") } else { println!("{say}") }
    }
    set_log_level(LogLevel::Error);
    let before = iceoryx_files();
    let tmp_existed = std::path::Path::new(TMP_DIR).exists();
    let slow = (iters / 5).max(100);
    let big = (iters / 20).max(100);
    // `--rounds R`: every case runs R times, its iterations split among them, and the
    // cases take turns (case 1, 2, ..., then again): a change in the machine during the
    // run (a noisy neighbour, the host moving a vCPU) falls on every case alike, not on
    // the one that happened to be running.
    let rounds: usize = flag(&args, "--rounds").map(|s| s.parse()).transpose()?.unwrap_or(5).max(1);
    // `--placement one-cpu|two-cpus`: every row with its two processes pinned so (the rows
    // named for a placement keep theirs).
    let placement = match flag(&args, "--placement").as_deref() {
        None => None,
        Some("one-cpu") => Some(Placement::OneCpu),
        Some("two-cpus") => Some(Placement::TwoCpus),
        Some(p) => return Err(format!("--placement {p}: one-cpu or two-cpus").into()),
    };
    if let Some(p) = placement {
        let say = format!("every row pinned: {p:?}");
        if json { eprintln!("{say}") } else { println!("{say}") }
    }
    type Case<'a> = (&'a str, usize, Box<dyn Fn(usize) -> Res<Vec<Duration>>>);
    let cases: Vec<Case> = vec![
        ("ferry-ring spin on", iters, Box::new(|n| ring_rtt(SPIN_ON, n))),
        ("ferry-ring spin off", slow, Box::new(|n| ring_rtt(Duration::ZERO, n))),
        ("iceoryx2 request-response", iters, Box::new(iceoryx_rtt)),
        ("unix socket (blocking)", slow, Box::new(socket_rtt)),
        ("unix socket (blocking) 1 CPU", slow, Box::new(|n| Placed::run(Placement::OneCpu, || socket_rtt(n)))),
        ("unix socket (blocking) 2 CPUs", slow, Box::new(|n| Placed::run(Placement::TwoCpus, || socket_rtt(n)))),
        ("unix socket (epoll) 1 CPU", slow, Box::new(|n| Placed::run(Placement::OneCpu, || socket_rtt_as(n, true)))),
        ("unix socket (epoll) 2 CPUs", slow, Box::new(|n| Placed::run(Placement::TwoCpus, || socket_rtt_as(n, true)))),
        ("pipe ring spin on", iters, Box::new(|n| pipe::rtt(Path::Ring(SPIN_ON), Load::Bytes64, n))),
        ("pipe ring spin on +header", iters, Box::new(|n| pipe::rtt(Path::Ring(SPIN_ON), Load::Bytes64Header, n))),
        ("pipe ring spin on 24.9MB", big, Box::new(|n| pipe::rtt(Path::Ring(SPIN_ON), Load::Pool, n))),
        ("pipe ring spin off", slow, Box::new(|n| pipe::rtt(Path::Ring(Duration::ZERO), Load::Bytes64, n))),
        ("pipe socket blocking", slow, Box::new(|n| pipe::rtt(Path::SocketBlocking, Load::Bytes64, n))),
        (
            "pipe socket blocking 1 CPU",
            slow,
            Box::new(|n| Placed::run(Placement::OneCpu, || pipe::rtt(Path::SocketBlocking, Load::Bytes64, n))),
        ),
        (
            "pipe socket blocking 2 CPUs",
            slow,
            Box::new(|n| Placed::run(Placement::TwoCpus, || pipe::rtt(Path::SocketBlocking, Load::Bytes64, n))),
        ),
        ("pipe socket async", slow, Box::new(|n| pipe::rtt(Path::SocketAsync, Load::Bytes64, n))),
        ("pipe socket async 24.9MB", big, Box::new(|n| pipe::rtt(Path::SocketAsync, Load::Pool, n))),
        ("pipe ring copy-in 24.9MB", big, Box::new(|n| pipe::rtt(Path::Ring(SPIN_ON), Load::Heap, n))),
        ("pipe socket async copy-in 24.9MB", big, Box::new(|n| pipe::rtt(Path::SocketAsync, Load::Heap, n))),
    ];
    // `--only NAME`: the case of that exact name if there is one, else every case whose
    // name contains it.
    let only = flag(&args, "--only");
    let exact = only.as_deref().is_some_and(|o| cases.iter().any(|(name, _, _)| *name == o));
    let cases: Vec<_> = cases
        .into_iter()
        .filter(|(name, _, _)| only.as_deref().is_none_or(|o| if exact { *name == o } else { name.contains(o) }))
        .filter(|(name, _, _)| {
            // The two-CPU rows need two CPUs this process may use.
            let fits = !name.ends_with("2 CPUs") || allowed_cpus().len() >= 2;
            if !fits {
                eprintln!("{name}: skipped, this process may use one CPU only");
            }
            fits
        })
        .collect();
    let mut got: Vec<Res<Vec<Duration>>> = cases.iter().map(|_| Ok(Vec::new())).collect();
    for round in 0..rounds {
        for ((name, n, run), acc) in cases.iter().zip(got.iter_mut()) {
            // The first rounds take the remainder, so the rounds add up to the case's count.
            let share = n / rounds + usize::from(round < n % rounds);
            if let Ok(times) = acc
                && share > 0
            {
                let placed = placement.filter(|_| !name.ends_with("CPU") && !name.ends_with("CPUs"));
                let got = match placed {
                    Some(p) => Placed::run(p, || run(share)),
                    None => run(share),
                };
                match got {
                    Ok(t) => times.extend(t),
                    Err(e) => *acc = Err(e),
                }
            }
        }
    }
    let rows: Vec<_> = cases.iter().zip(got).map(|((name, n, _), r)| (*name, *n, r)).collect();
    let mut removed = remove_new(&before);
    if !tmp_existed {
        // The run made /tmp/iceoryx2: remove its (now empty) directories too; a directory
        // still holding something (another iceoryx2 user's files) stays.
        for d in [format!("{TMP_DIR}/nodes"), format!("{TMP_DIR}/services"), TMP_DIR.to_string()] {
            if std::fs::remove_dir(&d).is_ok() {
                removed.push(d);
            }
        }
    }
    let mut p50 = std::collections::HashMap::new();
    if !json {
        println!("{:<30} {:>8} {:>9} {:>9}", "case (64-byte round trip)", "iters", "p50_us", "p99_us");
    }
    for (name, n, r) in rows {
        let mut t = r?;
        t.sort_unstable();
        let q = |f: f64| t[((t.len() as f64 * f) as usize).min(t.len() - 1)].as_secs_f64() * 1e6;
        let (a, b) = (q(0.50), q(0.99));
        p50.insert(name, a);
        if json {
            println!("{{\"case\":\"{name}\",\"bytes\":{SIZE},\"iters\":{n},\"p50_us\":{a:.3},\"p99_us\":{b:.3}}}");
        } else {
            println!("{name:<30} {n:>8} {a:>9.3} {b:>9.3}");
        }
    }
    let p = |k: &str| p50.get(k).copied();
    let ratio = |a: &str, b: &str| Some(p(a)? / p(b)?);
    let ratios = [
        (
            "ring_spin_on_over_iceoryx2",
            "ferry-ring spin on / iceoryx2 request-response",
            ratio("ferry-ring spin on", "iceoryx2 request-response"),
        ),
        (
            "ring_spin_off_over_socket",
            "ferry-ring spin off / unix socket",
            ratio("ferry-ring spin off", "unix socket (blocking)"),
        ),
        (
            "pipe_ring_spin_on_over_iceoryx2",
            "pipe ring spin on / iceoryx2 request-response",
            ratio("pipe ring spin on", "iceoryx2 request-response"),
        ),
        (
            "pipe_ring_header_over_iceoryx2",
            "pipe ring spin on +header / iceoryx2 request-response",
            ratio("pipe ring spin on +header", "iceoryx2 request-response"),
        ),
        (
            "pipe_zero_copy_over_64b",
            "pipe ring 24.9MB zero-copy / pipe ring 64B",
            ratio("pipe ring spin on 24.9MB", "pipe ring spin on"),
        ),
        (
            "pipe_socket_blocking_over_unix_socket_1cpu",
            "pipe socket blocking / unix socket, both on 1 CPU",
            ratio("pipe socket blocking 1 CPU", "unix socket (blocking) 1 CPU"),
        ),
        (
            "pipe_socket_blocking_over_unix_socket_2cpus",
            "pipe socket blocking / unix socket, each side on its own CPU",
            ratio("pipe socket blocking 2 CPUs", "unix socket (blocking) 2 CPUs"),
        ),
        (
            "pipe_ring_spin_off_over_socket_async",
            "pipe ring spin off / pipe socket async",
            ratio("pipe ring spin off", "pipe socket async"),
        ),
    ];
    let ratios: Vec<_> = ratios.into_iter().filter_map(|(k, w, v)| Some((k, w, v?))).collect();
    if json {
        let fields: Vec<String> = ratios.iter().map(|(k, _, v)| format!("\"ratio_{k}\":{v:.3}")).collect();
        println!("{{{}}}", fields.join(","));
    } else {
        for (_, what, v) in ratios {
            println!("ratio p50 {what}: {v:.2}");
        }
        println!("iceoryx2 files left behind, now removed: {removed:?}");
    }
    Ok(())
}

/// CPU burners (`--load N`): killed and reaped on drop.
struct Burners(Vec<(Child, UnixStream)>);

impl Burners {
    fn start(n: usize) -> Res<Burners> {
        if n > 256 {
            return Err(format!("--load {n}: at most 256 CPU burners").into());
        }
        (0..n).map(|_| spawn("burn", "")).collect::<Res<Vec<_>>>().map(Burners)
    }
}

impl Drop for Burners {
    fn drop(&mut self) {
        for (child, _) in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Where a row's two processes run. A round trip through the kernel costs several times
/// more between two CPUs (a wake-up across CPUs) than on one, and the scheduler picks either
/// from run to run; the socket rows are also measured with the placement fixed, so that a
/// ratio compares like with like.
#[derive(Clone, Copy, Debug)]
enum Placement {
    /// Both processes on the first CPU this process may use.
    OneCpu,
    /// The timing process on the first, the peer on the second.
    TwoCpus,
}

/// The environment variable that tells a peer which CPU to run on.
const CPU_VAR: &str = "FERRY_BENCH_CPU";

/// The CPU a spawned peer is pinned to (`usize::MAX`: none).
static PEER_CPU: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(usize::MAX);

/// A placement in force: this thread pinned (threads it starts inherit it, as a pipe's
/// runtime does) and peers spawned pinned; undone on drop.
struct Placed(Vec<usize>);

impl Placed {
    /// Runs `f` under `p`.
    fn run<T>(p: Placement, f: impl FnOnce() -> Res<T>) -> Res<T> {
        let all = allowed_cpus();
        let (mine, theirs) = match (p, all.as_slice()) {
            (Placement::OneCpu, [a, ..]) => (*a, *a),
            (Placement::TwoCpus, [a, b, ..]) => (*a, *b),
            _ => return Err(format!("{p:?}: not enough CPUs ({all:?})").into()),
        };
        pin(&[mine])?;
        let _undo = Placed(all);
        PEER_CPU.store(theirs, Ordering::Relaxed);
        f()
    }
}

impl Drop for Placed {
    fn drop(&mut self) {
        PEER_CPU.store(usize::MAX, Ordering::Relaxed);
        let _ = pin(&self.0);
    }
}

/// The CPUs this thread may run on.
fn allowed_cpus() -> Vec<usize> {
    let set = rustix::thread::sched_getaffinity(None).unwrap_or_default();
    (0..rustix::thread::CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect()
}

/// Lets this thread run on `cpus` only.
fn pin(cpus: &[usize]) -> Res<()> {
    let mut set = rustix::thread::CpuSet::new();
    for &c in cpus {
        set.set(c);
    }
    rustix::thread::sched_setaffinity(None, &set)?;
    Ok(())
}

/// A number for unique names within this run.
pub(crate) fn next() -> usize {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

/// Starts this binary as `--peer kind --arg arg`, its stdin a socket to the returned end.
pub(crate) fn spawn(kind: &str, arg: &str) -> Res<(Child, UnixStream)> {
    let (mine, theirs) = UnixStream::pair()?;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["--peer", kind, "--arg", arg]).stdin(Stdio::from(OwnedFd::from(theirs)));
    match PEER_CPU.load(Ordering::Relaxed) {
        usize::MAX => cmd.env_remove(CPU_VAR),
        cpu => cmd.env(CPU_VAR, cpu.to_string()),
    };
    let child = cmd.spawn()?;
    Ok((child, mine))
}

/// Closes the peer's socket and waits for it (it exits at EOF).
pub(crate) fn finish(mut child: Child, sock: UnixStream) -> Res<()> {
    sock.shutdown(std::net::Shutdown::Both)?;
    let s = child.wait()?;
    if !s.success() {
        return Err(format!("peer exited with {s}").into());
    }
    Ok(())
}

fn ring_rtt(spin: Duration, iters: usize) -> Res<Vec<Duration>> {
    let (child, sock) = spawn("ring", &spin.as_nanos().to_string())?;
    let (mut ring, fd) = Ring::create(&RingOptions::new().spin(spin))?;
    send_ring_fd(&sock, &fd, ring.capacity())?;
    let _watch = ring.watch_socket(OwnedFd::from(sock.try_clone()?))?;
    let msg = [7u8; SIZE];
    let mut buf = Vec::with_capacity(SIZE);
    let mut times = Vec::with_capacity(iters);
    for i in 0..iters + iters / 10 {
        let t = Instant::now();
        ring.send(&msg, deadline_in(BOUND))?;
        ring.recv(&mut buf, deadline_in(BOUND))?;
        if i >= iters / 10 {
            times.push(t.elapsed());
        }
    }
    // Idle for a second: this thread waits for a frame that never comes, the peer waits for
    // the next request. Both should spin at most their window, then sleep. This thread's
    // CPU time is exact from the start. The peer's (`schedstat`) is brought up to date only
    // when it stops running, so it is read first 10 ms in, once the peer sleeps: read at
    // the start, it would lack the time since the last tick (up to 4 ms of the benchmark's
    // own busy polling, counted as idle time).
    let peer_stat = format!("/proc/{}/schedstat", child.id());
    let me0 = thread_cpu_ns();
    let settle = ring.recv(&mut buf, deadline_in(Duration::from_millis(10)));
    let peer0 = cpu_ns(&peer_stat);
    let idle = ring.recv(&mut buf, deadline_in(Duration::from_secs(1)));
    let (me1, peer1) = (thread_cpu_ns(), cpu_ns(&peer_stat));
    if !matches!((&settle, &idle), (Err(RingError::Timeout), Err(RingError::Timeout))) {
        return Err(format!("idle wait ended with {settle:?} / {idle:?}").into());
    }
    eprintln!(
        "ferry-ring spin {spin:?}: idle 1 s after the last round trip: {} us CPU in the waiting thread, {} us in the \
         peer (from 10 ms in)",
        (me1 - me0) / 1000,
        (peer1 - peer0) / 1000
    );
    drop(ring);
    finish(child, sock)?;
    Ok(times)
}

/// CPU time (ns) of the calling thread, exact (`CLOCK_THREAD_CPUTIME_ID`; `schedstat` of a
/// running thread lags by up to a scheduler tick).
fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    (t.tv_sec as u64) * 1_000_000_000 + t.tv_nsec as u64
}

/// CPU time (ns) of a sleeping thread, from its `schedstat` file (the first field).
fn cpu_ns(path: &str) -> u64 {
    std::fs::read_to_string(path).ok().and_then(|s| s.split_whitespace().next()?.parse().ok()).unwrap_or(0)
}

fn iceoryx_rtt(iters: usize) -> Res<Vec<Duration>> {
    let name = format!("ferry-bench/rtt-{}", std::process::id());
    let (child, mut sock) = spawn("iceoryx2", &name)?;
    sock.read_exact(&mut [0u8; 1])?; // the server exists
    let node = NodeBuilder::new().create::<ipc::Service>()?;
    let service = node
        .service_builder(&name.as_str().try_into()?)
        .request_response::<[u8; SIZE], [u8; SIZE]>()
        .open_or_create()?;
    let client = service.client_builder().create()?;
    let msg = [7u8; SIZE];
    let mut times = Vec::with_capacity(iters);
    let mut i = 0;
    while times.len() < iters {
        let t = Instant::now();
        let pending = client.send_copy(msg)?;
        let give_up = t + BOUND;
        let mut answered = false;
        while Instant::now() < give_up {
            if let Some(r) = pending.receive()? {
                answered = r.payload()[0] == 7;
                break;
            }
        }
        if !answered {
            return Err("iceoryx2: no response".into());
        }
        if i >= iters / 10 {
            times.push(t.elapsed());
        }
        i += 1;
    }
    drop((client, service, node));
    finish(child, sock)?;
    Ok(times)
}

fn socket_rtt(iters: usize) -> Res<Vec<Duration>> {
    socket_rtt_as(iters, false)
}

/// The unix socket round trip; `epoll`: both sides' sockets non-blocking, each read waited
/// for in an `epoll` set of the socket (what any program that multiplexes does, a runtime
/// and ferry's direct wait among them).
fn socket_rtt_as(iters: usize, epoll: bool) -> Res<Vec<Duration>> {
    let (child, sock) = spawn(if epoll { "socket-epoll" } else { "socket" }, "")?;
    let mut s = EpollSock::new(sock.try_clone()?, epoll)?;
    let msg = [7u8; SIZE];
    let mut buf = [0u8; SIZE];
    let mut times = Vec::with_capacity(iters);
    for i in 0..iters + iters / 10 {
        let t = Instant::now();
        s.write_all(&msg)?;
        s.read_exact(&mut buf)?;
        if i >= iters / 10 {
            times.push(t.elapsed());
        }
    }
    finish(child, sock)?;
    Ok(times)
}

// ---------------------------------------------------------------------------------------
// The peer

fn peer(kind: &str, arg: String) -> Res<()> {
    let sock = UnixStream::from(std::io::stdin().as_fd().try_clone_to_owned()?);
    match kind {
        "burn" => {
            // Spins until the parent's end of the socket closes.
            std::thread::spawn(move || {
                let mut b = [0u8; 1];
                let _ = (&sock).read(&mut b);
                std::process::exit(0);
            });
            let mut x = 0u64;
            loop {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
        "ring" => {
            let spin = Duration::from_nanos(arg.parse()?);
            let (fd, cap) = recv_ring_fd(&sock)?;
            let mut ring = Ring::open(fd, cap, &RingOptions::new().spin(spin))?;
            let _watch = ring.watch_socket(OwnedFd::from(sock.try_clone()?))?;
            let mut buf = Vec::new();
            loop {
                match ring.recv(&mut buf, deadline_in(Duration::from_secs(3600))) {
                    Ok(tag) => ring.send_tagged(tag, &buf, deadline_in(BOUND))?,
                    Err(RingError::Closed | RingError::PeerGone) => return Ok(()),
                    Err(e) => return Err(e.into()),
                }
            }
        }
        "iceoryx2" => {
            set_log_level(LogLevel::Error);
            let node = NodeBuilder::new().create::<ipc::Service>()?;
            let service = node
                .service_builder(&arg.as_str().try_into()?)
                .request_response::<[u8; SIZE], [u8; SIZE]>()
                .open_or_create()?;
            let server = service.server_builder().create()?;
            let stop = Arc::new(AtomicBool::new(false));
            let (stop2, mut sock2) = (stop.clone(), sock.try_clone()?);
            let eof = std::thread::spawn(move || {
                let _ = std::io::copy(&mut sock2, &mut std::io::sink());
                stop2.store(true, Ordering::Relaxed);
            });
            (&sock).write_all(b"r")?;
            while !stop.load(Ordering::Relaxed) {
                if let Some(req) = server.receive()? {
                    let payload = *req.payload();
                    req.send_copy(payload)?;
                }
            }
            let _ = eof.join();
            drop((server, service, node));
            Ok(())
        }
        "pipe" => pipe::peer(&arg, sock),
        "socket" | "socket-epoll" => {
            let mut s = EpollSock::new(sock, kind == "socket-epoll")?;
            let mut buf = [0u8; SIZE];
            loop {
                match s.read_exact(&mut buf) {
                    Ok(()) => s.write_all(&buf)?,
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                    Err(e) => return Err(e.into()),
                }
            }
        }
        _ => Err(format!("unknown peer {kind}").into()),
    }
}

/// A unix socket read either blocking or, non-blocking, with each wait in an `epoll` set.
struct EpollSock {
    sock: UnixStream,
    epoll: Option<OwnedFd>,
}

impl EpollSock {
    fn new(sock: UnixStream, epoll: bool) -> Res<EpollSock> {
        let epoll = if epoll {
            sock.set_nonblocking(true)?;
            let set = rustix::event::epoll::create(rustix::event::epoll::CreateFlags::CLOEXEC)?;
            rustix::event::epoll::add(
                &set,
                &sock,
                rustix::event::epoll::EventData::new_u64(0),
                rustix::event::epoll::EventFlags::IN,
            )?;
            Some(set)
        } else {
            None
        };
        Ok(EpollSock { sock, epoll })
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        // 64 bytes always fit the socket's buffer in a round trip.
        (&self.sock).write_all(buf)
    }

    fn read_exact(&mut self, mut buf: &mut [u8]) -> std::io::Result<()> {
        let Some(set) = &self.epoll else { return (&self.sock).read_exact(buf) };
        while !buf.is_empty() {
            match (&self.sock).read(buf) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => buf = &mut buf[n..],
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    let mut ev = [std::mem::MaybeUninit::<rustix::event::epoll::Event>::uninit(); 1];
                    match rustix::event::epoll::wait(set, &mut ev, None) {
                        Ok(_) | Err(rustix::io::Errno::INTR) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// iceoryx2's files

/// iceoryx2's entries in /dev/shm (prefix `iox2_`) and under /tmp/iceoryx2.
fn iceoryx_files() -> BTreeSet<std::path::PathBuf> {
    let mut out = BTreeSet::new();
    if let Ok(rd) = std::fs::read_dir("/dev/shm") {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with("iox2_") {
                out.insert(e.path());
            }
        }
    }
    let mut stack = vec![std::path::PathBuf::from(TMP_DIR)];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else { continue };
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            } else {
                out.insert(e.path());
            }
        }
    }
    out
}

/// Removes iceoryx2's files that were not there `before`; returns them.
fn remove_new(before: &BTreeSet<std::path::PathBuf>) -> Vec<String> {
    let new = iceoryx_files().difference(before).cloned().collect::<Vec<_>>();
    new.into_iter().filter(|p| std::fs::remove_file(p).is_ok()).map(|p| p.display().to_string()).collect()
}
