//! A ring writer whose peer stops reading (issue 43, point 1): a real peer process, a real
//! unix socket and ring, SIGKILL. A send blocked on the full ring fails with
//! `PipeError::PeerGone` once the peer dies, whether or not anyone reads the socket; a send
//! with a deadline gives up with `Timeout` and leaves the pipe open; `close()` from another
//! thread ends a stuck send instead of waiting for it; nothing (descriptor, mapping, thread)
//! is left behind.
//!
//! The test binary re-executes itself as the peer (`FERRY_DEAD_PEER_ROLE`).

#[cfg(target_os = "linux")]
mod common;

#[cfg(target_os = "linux")]
fn main() -> std::process::ExitCode {
    linux::main()
}

#[cfg(not(target_os = "linux"))]
fn main() {}

#[cfg(target_os = "linux")]
mod linux {
    use std::io::{BufRead, BufReader};
    use std::process::{Child, Command, ExitCode, Stdio};
    use std::sync::Arc;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use ferry_core::{Message, Pipe, PipeError};
    use ferry_ring::RingOptions;
    use libtest_mimic::{Arguments, Failed, Trial};
    use serde_json::json;

    use super::common::{addr, bytes_tensor, endpoint, has_ring};

    /// The bound on any one wait: reached only when something is broken (a hang).
    const BOUND: Duration = Duration::from_secs(60);
    /// Most messages a fill may take before its ring is full (a bound, never reached).
    const MAX_FILL: usize = 100_000;

    type Outcome = Result<(), Failed>;
    /// A named test.
    type Case = (&'static str, fn() -> Outcome);

    pub fn main() -> ExitCode {
        if let Ok(role) = std::env::var("FERRY_DEAD_PEER_ROLE") {
            return match peer(&role) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("dead-peer test peer {role}: {e}");
                    ExitCode::from(2)
                }
            };
        }
        let tests: [Case; 4] = [
            ("sigkill_of_a_peer_that_does_not_read_fails_a_blocked_send_with_peer_gone", || killed_peer(false)),
            ("sigkill_is_noticed_even_when_nobody_reads_the_socket", || killed_peer(true)),
            ("a_send_with_a_deadline_gives_up_and_the_pipe_stays_open", deadline),
            ("close_from_another_thread_ends_a_stuck_send_at_once", close_ends_stuck_send),
        ];
        let trials = tests.into_iter().map(|(name, f)| Trial::test(name, f)).collect();
        libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
    }

    fn ring_options() -> RingOptions {
        // A small ring: it fills after a few dozen messages.
        RingOptions::default().capacity(4096)
    }

    fn msg(i: usize) -> Message {
        Message::with_tensors(json!({"i": i}), vec![bytes_tensor(64, i as u8)])
    }

    /// The peer's side: connects with a ring, optionally floods this side until its own
    /// sends time out (so that this side's reader stops reading: its queue is full), says
    /// "ready" on stdout, then never reads.
    fn peer(role: &str) -> Result<(), String> {
        // Dies with the test process, should the test fail before it kills the peer.
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
            .map_err(|e| e.to_string())?;
        let a = std::env::var("FERRY_DEAD_PEER_ADDR").map_err(|e| e.to_string())?;
        let rt = runtime();
        let pipe =
            rt.block_on(endpoint(Some(ring_options()), false).connect(&a)).map_err(|e| format!("connect: {e}"))?;
        if role == "flood" {
            let mut sent = 0;
            loop {
                match rt.block_on(pipe.send_timeout(msg(sent), Duration::from_millis(200))) {
                    Ok(()) => sent += 1,
                    Err(PipeError::Timeout(..)) => break,
                    Err(e) => return Err(format!("flood: {e}")),
                }
                if sent > MAX_FILL {
                    return Err("the test's side never stopped reading".into());
                }
            }
        }
        println!("ready");
        std::thread::sleep(BOUND);
        Err("not killed within the bound".into())
    }

    /// A peer process in `role`, connected to a fresh listener; returns it with this
    /// side's pipe once the peer said "ready".
    fn start_peer(rt: &tokio::runtime::Runtime, role: &str) -> Result<(Child, Pipe), Failed> {
        let a = addr("dead-peer");
        let mut listener = rt.block_on(endpoint(Some(ring_options()), false).listen(&a))?;
        let mut child = Command::new(std::env::current_exe()?)
            .env("FERRY_DEAD_PEER_ROLE", role)
            .env("FERRY_DEAD_PEER_ADDR", &a)
            .stdout(Stdio::piped())
            .spawn()?;
        let pipe = rt.block_on(async { tokio::time::timeout(BOUND, listener.accept()).await })??;
        if !has_ring(&pipe) {
            return Err("the pipe did not agree on a ring".into());
        }
        let mut line = String::new();
        BufReader::new(child.stdout.take().ok_or("no stdout")?).read_line(&mut line)?;
        if line.trim() != "ready" {
            return Err(format!("peer said {line:?}").into());
        }
        Ok((child, pipe))
    }

    /// Sends with a short deadline until one times out: the ring (and the socket behind
    /// it) is full. Checks that the timeout left the pipe open.
    fn fill(pipe: &Pipe) -> Outcome {
        for i in 0..MAX_FILL {
            match pipe.send_blocking_timeout(msg(i), Some(Duration::from_millis(50))) {
                Ok(()) => {}
                Err(PipeError::Timeout(_, "send")) => {
                    if pipe.is_closed() {
                        return Err("a send that timed out closed the pipe".into());
                    }
                    return Ok(());
                }
                Err(e) => return Err(format!("send {i} failed: {e}").into()),
            }
        }
        Err("the ring never filled".into())
    }

    /// A send on another thread, with no deadline; its result comes on the channel.
    fn blocked_send(pipe: &Arc<Pipe>) -> mpsc::Receiver<Result<(), PipeError>> {
        let (tx, rx) = mpsc::channel();
        let p = pipe.clone();
        std::thread::spawn(move || {
            let _ = tx.send(p.send_blocking(msg(0)));
        });
        rx
    }

    /// What this process holds that a pipe could leave behind: descriptors, ring
    /// mappings, ferry threads.
    #[derive(Debug, PartialEq, Eq)]
    struct Held {
        fds: usize,
        ring_maps: usize,
        ferry_threads: usize,
    }

    fn held() -> Held {
        let fds = std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0);
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        let ring_maps = maps.lines().filter(|l| l.contains("memfd:ferry-ring")).count();
        let ferry_threads = std::fs::read_dir("/proc/self/task")
            .map(|d| {
                d.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                    .filter(|c| c.starts_with("ferry"))
                    .count()
            })
            .unwrap_or(0);
        Held { fds, ring_maps, ferry_threads }
    }

    /// What is held once released things are gone (the pipe's tasks end on the runtime):
    /// waits up to the bound for it to equal `want`.
    fn settle_to(want: &Held) -> Held {
        let start = Instant::now();
        loop {
            let now = held();
            if &now == want || start.elapsed() > BOUND {
                return now;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A peer that does not read; this side fills the ring, a send blocks, the peer is
    /// SIGKILLed: the send fails with `PeerGone`, and nothing is left. `flood`: the peer
    /// first fills this side's receive queue, so this side's reader task stops reading
    /// the socket and only the writer's own look at the peer can notice the death.
    fn killed_peer(flood: bool) -> Outcome {
        let rt = runtime();
        let before = held();
        let (mut child, pipe) = start_peer(&rt, if flood { "flood" } else { "stall" })?;
        let pipe = Arc::new(pipe);
        fill(&pipe)?;
        let result = blocked_send(&pipe);
        if let Ok(r) = result.recv_timeout(Duration::from_millis(200)) {
            return Err(format!("the send did not wait for a peer that does not read: {r:?}").into());
        }
        child.kill()?;
        child.wait()?;
        let died = Instant::now();
        let r = result.recv_timeout(BOUND).map_err(|_| "the blocked send never returned after the peer died")?;
        let took = died.elapsed();
        match r {
            Err(PipeError::PeerGone) => {}
            other => return Err(format!("the blocked send returned {other:?}, not PeerGone").into()),
        }
        eprintln!("blocked send failed {:.1} ms after the peer's death (flood: {flood})", took.as_secs_f64() * 1e3);
        // Later sends fail the same way, at once.
        match pipe.send_blocking(msg(1)) {
            Err(PipeError::PeerGone) => {}
            other => return Err(format!("a send after the death returned {other:?}, not PeerGone").into()),
        }
        drop(pipe);
        let after = settle_to(&before);
        if after != before {
            return Err(format!("left behind: before {before:?}, after {after:?}").into());
        }
        Ok(())
    }

    /// A send with a deadline to a peer that does not read gives up with `Timeout`; the
    /// pipe stays open, and an async send with a deadline does the same.
    fn deadline() -> Outcome {
        let rt = runtime();
        let (mut child, pipe) = start_peer(&rt, "stall")?;
        fill(&pipe)?;
        match rt.block_on(pipe.send_timeout(msg(0), Duration::from_millis(50))) {
            Err(PipeError::Timeout(_, "send")) => {}
            other => return Err(format!("async send with a deadline returned {other:?}").into()),
        }
        if pipe.is_closed() {
            return Err("an async send that timed out closed the pipe".into());
        }
        child.kill()?;
        child.wait()?;
        Ok(())
    }

    /// `close()` on another thread while a send is stuck on a live peer that does not
    /// read: close returns, and the send fails with `Closed` (this side closed it).
    fn close_ends_stuck_send() -> Outcome {
        let rt = runtime();
        let (mut child, pipe) = start_peer(&rt, "stall")?;
        let pipe = Arc::new(pipe);
        fill(&pipe)?;
        let result = blocked_send(&pipe);
        if let Ok(r) = result.recv_timeout(Duration::from_millis(200)) {
            return Err(format!("the send did not wait for a peer that does not read: {r:?}").into());
        }
        let (done_tx, done) = mpsc::channel();
        let p = pipe.clone();
        let handle = rt.handle().clone();
        std::thread::spawn(move || {
            handle.block_on(p.close());
            let _ = done_tx.send(());
        });
        done.recv_timeout(BOUND).map_err(|_| "close() waited for the stuck send")?;
        match result.recv_timeout(BOUND).map_err(|_| "the stuck send never returned after close()")? {
            Err(PipeError::Closed) => {}
            other => return Err(format!("the stuck send returned {other:?}, not Closed").into()),
        }
        child.kill()?;
        child.wait()?;
        Ok(())
    }
}
