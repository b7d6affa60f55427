//! Crash safety, with real processes killed by SIGKILL in a loop: nothing is left in
//! /dev/shm or on disk, the survivor's pending operations fail with `Closed` within a
//! second, leases held by the dead peer are reclaimed, and descriptors and mappings return
//! to their baseline. Also: a receiver holding a 1 GiB tensor from shm has no private copy.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::{DType, Endpoint, InlineChannel, Message, Pipe, PipeError, TensorMeta};
use ferry_local::LocalTransport;
use ferry_shm::{ShmChannel, ShmOptions};
use libtest_mimic::{Arguments, Failed, Trial};
use serde_json::json;

const ROLE: &str = "FERRY_SHM_CRASH_ROLE";
const ADDR: &str = "FERRY_SHM_CRASH_ADDR";
const KILLS: usize = 200;
const NOTICE: Duration = Duration::from_secs(1);

fn endpoint(opts: ShmOptions) -> Endpoint {
    Endpoint::builder()
        .transport(Arc::new(LocalTransport::new()))
        .channel(Arc::new(ShmChannel::with_options(opts)))
        .channel(Arc::new(InlineChannel))
        .build()
}

fn say(word: &str) {
    println!("{word}");
}

/// The child side of each scenario.
async fn child(role: &str, addr: &str) -> Result<(), String> {
    let pipe = endpoint(ShmOptions::default()).connect(addr).await.map_err(|e| e.to_string())?;
    if pipe.channel() != "shm" {
        return Err(format!("negotiated {}", pipe.channel()));
    }
    match role {
        "send" => {
            let mut t = pipe.alloc(TensorMeta::new(DType::U8, vec![1 << 20])).await.map_err(|e| e.to_string())?;
            t.as_bytes_mut().fill(7);
            let heap =
                ferry_core::Tensor::from_slice(vec![64 << 10], &vec![9u8; 64 << 10]).map_err(|e| e.to_string())?;
            pipe.send(Message::with_tensors(json!("two"), vec![t.freeze(), heap])).await.map_err(|e| e.to_string())?;
            say("ready");
        }
        "recv" => {
            let m = pipe.recv().await.map_err(|e| e.to_string())?;
            say("ready");
            std::mem::forget(m); // hold the lease until killed
        }
        "big" => {
            let mut t = pipe.alloc(TensorMeta::new(DType::U8, vec![1 << 30])).await.map_err(|e| e.to_string())?;
            t.as_bytes_mut().fill(1);
            pipe.send(Message::with_tensors(json!("big"), vec![t.freeze()])).await.map_err(|e| e.to_string())?;
            say("ready");
        }
        other => return Err(format!("unknown role {other}")),
    }
    std::future::pending::<()>().await;
    Ok(())
}

struct Kid(Child);

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Kid {
    fn spawn(role: &str, addr: &str) -> Result<(Kid, std::sync::mpsc::Receiver<String>), Failed> {
        let mut c = Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
            .env(ROLE, role)
            .env(ADDR, addr)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("spawn: {e}"))?;
        let out = c.stdout.take();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            if let Some(o) = out {
                let _ = BufReader::new(o).read_line(&mut line);
            }
            let _ = tx.send(line);
        });
        Ok((Kid(c), rx))
    }

    fn wait_ready(rx: &std::sync::mpsc::Receiver<String>) -> Result<(), Failed> {
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(l) if l.trim() == "ready" => Ok(()),
            other => Err(format!("child not ready: {other:?}").into()),
        }
    }

    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

fn memfd_maps() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .map(|m| m.lines().filter(|l| l.contains("memfd:ferry-shm")).count())
        .unwrap_or(0)
}

fn dev_shm() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

fn status_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

async fn closed_within(pipe: &Pipe, what: &str) -> Result<(), Failed> {
    let start = Instant::now();
    match tokio::time::timeout(NOTICE, pipe.recv()).await {
        Ok(Err(e)) if e.is_closed() => Ok(()),
        other => Err(format!("{what}: after SIGKILL recv gave {other:?} after {:?}", start.elapsed()).into()),
    }
}

/// The sender dies after sending; the receiver still reads what it got, notices within a
/// second, and ends with no extra descriptor or mapping.
fn sender_killed() -> Result<(), Failed> {
    rt().block_on(async {
        let addr = format!("unix:ferry-shm-crash-send-{}", std::process::id());
        let shm_before = dev_shm();
        let mut listener = endpoint(ShmOptions::default()).listen(&addr).await.map_err(|e| e.to_string())?;
        let mut baseline = None;
        for i in 0..=KILLS {
            let (mut kid, ready) = Kid::spawn("send", &addr)?;
            let pipe = tokio::time::timeout(Duration::from_secs(20), listener.accept())
                .await
                .map_err(|_| "accept timed out")?
                .map_err(|e| e.to_string())?;
            let m = pipe.recv_timeout(Duration::from_secs(20)).await.map_err(|e| e.to_string())?;
            Kid::wait_ready(&ready)?;
            kid.kill();
            closed_within(&pipe, &format!("kill {i}")).await?;
            // The dead sender's memory is still readable through the leases.
            let sum: u64 = m.tensors[0].as_bytes().iter().map(|&b| u64::from(b)).sum();
            if sum != 7 << 20 || m.tensors[1].as_bytes().iter().any(|&b| b != 9) {
                return Err(format!("kill {i}: data changed after the sender died (sum {sum})").into());
            }
            drop(m);
            drop(pipe);
            // The first round warms up the runtime's own descriptors.
            if i == 0 {
                tokio::time::sleep(Duration::from_millis(50)).await;
                baseline = Some((fds(), memfd_maps()));
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (f0, m0) = baseline.unwrap_or_default();
        let (f1, m1) = (fds(), memfd_maps());
        if f1 > f0 || m1 > m0 || m1 != 0 {
            return Err(format!("after {KILLS} kills: fds {f0} -> {f1}, ferry-shm mappings {m0} -> {m1}").into());
        }
        if dev_shm() != shm_before {
            return Err(format!("/dev/shm changed: {:?} -> {:?}", shm_before, dev_shm()).into());
        }
        println!("sender_killed: {KILLS} kills, fds {f0} -> {f1}, mappings {m0} -> {m1}, /dev/shm unchanged");
        Ok(())
    })
}

/// The receiver dies holding a lease: the sender's pending recv fails within a second, the
/// lease is reclaimed, and descriptors and mappings return to the baseline.
fn receiver_killed() -> Result<(), Failed> {
    rt().block_on(async {
        let addr = format!("unix:ferry-shm-crash-recv-{}", std::process::id());
        let mut listener = endpoint(ShmOptions::default()).listen(&addr).await.map_err(|e| e.to_string())?;
        let mut baseline = None;
        for i in 0..=KILLS {
            let (mut kid, ready) = Kid::spawn("recv", &addr)?;
            let pipe = tokio::time::timeout(Duration::from_secs(20), listener.accept())
                .await
                .map_err(|_| "accept timed out")?
                .map_err(|e| e.to_string())?;
            let mut t = pipe.alloc(TensorMeta::new(DType::U8, vec![1 << 20])).await.map_err(|e| e.to_string())?;
            t.as_bytes_mut().fill(3);
            pipe.send(Message::with_tensors(json!(i), vec![t.freeze()])).await.map_err(|e| e.to_string())?;
            Kid::wait_ready(&ready)?;
            if pipe.stats()["shm"]["leases_granted"] != 1 {
                return Err(format!("kill {i}: lease not recorded: {}", pipe.stats()).into());
            }
            kid.kill();
            closed_within(&pipe, &format!("kill {i}")).await?;
            let deadline = Instant::now() + NOTICE;
            while pipe.stats()["shm"]["leases_granted"] != 0 {
                if Instant::now() > deadline {
                    return Err(format!("kill {i}: lease not reclaimed: {}", pipe.stats()).into());
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            drop(pipe);
            if i == 0 {
                tokio::time::sleep(Duration::from_millis(50)).await;
                baseline = Some((fds(), memfd_maps()));
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (f0, m0) = baseline.unwrap_or_default();
        let (f1, m1) = (fds(), memfd_maps());
        if f1 > f0 || m1 > m0 || m1 != 0 {
            return Err(format!("after {KILLS} kills: fds {f0} -> {f1}, ferry-shm mappings {m0} -> {m1}").into());
        }
        println!("receiver_killed: {KILLS} kills, fds {f0} -> {f1}, mappings {m0} -> {m1}");
        Ok(())
    })
}

/// A sender blocked on a full pool gets `Closed` within a second when the lease holder dies.
fn blocked_sender_sees_closed() -> Result<(), Failed> {
    rt().block_on(async {
        let addr = format!("unix:ferry-shm-crash-blocked-{}", std::process::id());
        let opts = ShmOptions {
            pool_limit: 4 << 20,
            segment_bytes: 2 << 20,
            full_wait: Duration::from_secs(60),
            ..Default::default()
        };
        let mut listener = endpoint(opts).listen(&addr).await.map_err(|e| e.to_string())?;
        let (mut kid, ready) = Kid::spawn("recv", &addr)?;
        let pipe = listener.accept().await.map_err(|e| e.to_string())?;
        let t = pipe.alloc(TensorMeta::new(DType::U8, vec![3 << 20])).await.map_err(|e| e.to_string())?;
        pipe.send(Message::with_tensors(json!(0), vec![t.freeze()])).await.map_err(|e| e.to_string())?;
        Kid::wait_ready(&ready)?;
        let pipe = Arc::new(pipe);
        let p2 = pipe.clone();
        let blocked = tokio::spawn(async move { p2.alloc(TensorMeta::new(DType::U8, vec![3 << 20])).await.map(drop) });
        tokio::time::sleep(Duration::from_millis(100)).await;
        if blocked.is_finished() {
            return Err("alloc should wait for pool space".into());
        }
        kid.kill();
        let r =
            tokio::time::timeout(NOTICE, blocked).await.map_err(|_| "blocked alloc still waiting 1 s after SIGKILL")?;
        match r {
            Ok(Err(PipeError::Channel(ferry_core::ChannelError::Closed))) => Ok(()),
            // The lease was reclaimed first, so the space came back: also a clean outcome.
            Ok(Ok(())) => Ok(()),
            other => Err(format!("blocked alloc gave {other:?}").into()),
        }
    })
}

/// A receiver holding a 1 GiB tensor from shm adds no private copy: its anonymous RSS stays
/// flat while its shared RSS grows by the tensor.
fn rss_no_private_copy() -> Result<(), Failed> {
    rt().block_on(async {
        let addr = format!("unix:ferry-shm-crash-rss-{}", std::process::id());
        let mut listener = endpoint(ShmOptions::default()).listen(&addr).await.map_err(|e| e.to_string())?;
        let (_kid, ready) = Kid::spawn("big", &addr)?;
        let pipe = listener.accept().await.map_err(|e| e.to_string())?;
        let (anon0, shmem0) = (status_kib("RssAnon:"), status_kib("RssShmem:"));
        let m = pipe.recv_timeout(Duration::from_secs(60)).await.map_err(|e| e.to_string())?;
        Kid::wait_ready(&ready)?;
        let sum: u64 = m.tensors[0].as_bytes().chunks(4096).map(|c| u64::from(c[0])).sum();
        let (anon1, shmem1) = (status_kib("RssAnon:"), status_kib("RssShmem:"));
        println!(
            "rss: RssAnon {anon0} -> {anon1} KiB, RssShmem {shmem0} -> {shmem1} KiB (1 GiB tensor, {sum} pages read)"
        );
        if sum != (1 << 30) / 4096 {
            return Err(format!("read {sum} pages").into());
        }
        if shmem1.saturating_sub(shmem0) < 900 << 10 {
            return Err(
                format!("RssShmem grew only {} KiB: was the tensor read from shared memory?", shmem1 - shmem0).into()
            );
        }
        if anon1.saturating_sub(anon0) > 64 << 10 {
            return Err(format!("RssAnon grew {} KiB: a private copy was made", anon1 - anon0).into());
        }
        Ok(())
    })
}

fn main() -> ExitCode {
    if let (Ok(role), Ok(addr)) = (std::env::var(ROLE), std::env::var(ADDR)) {
        std::thread::spawn(|| {
            let _ = std::io::stdin().read(&mut [0u8; 1]);
            std::process::exit(0);
        });
        return match rt().block_on(child(&role, &addr)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("crash child {role}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let mut args = Arguments::from_args();
    // Descriptor and mapping counts are per process: run the trials one at a time.
    args.test_threads = Some(1);
    let viable = ferry_core::Channel::viability(&ShmChannel::new()).is_ok();
    let trials = vec![
        Trial::test("sender_killed_200_times", sender_killed),
        Trial::test("receiver_killed_200_times", receiver_killed),
        Trial::test("blocked_sender_sees_closed", blocked_sender_sees_closed),
        Trial::test("rss_no_private_copy", rss_no_private_copy),
    ]
    .into_iter()
    .map(|t| t.with_ignored_flag(!viable))
    .collect();
    libtest_mimic::run(&args, trials).exit_code()
}
