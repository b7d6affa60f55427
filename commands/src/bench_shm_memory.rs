//! `ferry bench`'s shm memory rows (issue 45 point 5): shared memory given back while a
//! connection lives, measured between two processes.
//!
//! - **param+result**: a param made in this process's pool and a result the peer makes in
//!   its own, both read in full, then dropped. The figure is the resident memory (RSS, which
//!   holds the shared pages each process maps) of both processes before, right after the
//!   round trip, and how long after the drop it is back within 64 MiB of before.
//! - **large after 1,000 small**: 1,000 messages of 1.5 MiB held by the peer at once (the
//!   pool fills with 64 MiB segments), dropped; then one allocation of the large size, which
//!   must find room (empty segments are given back for it) instead of waiting `full_wait`
//!   (10 s) and failing "pool full".
//!
//! The peer is `ferry __shm-memory-peer ADDR`, a second process.

use crate::self_exe::SelfExe;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use ferry_core::{DType, Message, Pipe, TensorMeta};
use serde::Serialize;
use serde_json::json;

use crate::bench::start_child;

const MIB: u64 = 1 << 20;
/// Small messages of the second row, and their count.
const SMALL: usize = 1536 << 10;
const SMALL_COUNT: usize = 1000;
/// How long a wait of the benchmark may take before it gives up (not a target).
const LIMIT: Duration = Duration::from_secs(60);

/// One row: its case and its figures, in words.
#[derive(Debug, Clone, Serialize)]
pub struct MemRow {
    /// What was measured.
    pub case: String,
    /// The figures.
    pub result: String,
}

/// The peer (`ferry __shm-memory-peer ADDR`): serves one pipe until stdin closes. Header
/// `{"op": ...}`: `result` reads the tensor and answers one of the same size made in its own
/// pool; `hold` keeps the message; `drop` drops what it keeps and answers; anything else is
/// answered with an ack.
pub async fn peer(addr: &str) -> anyhow::Result<()> {
    let mut l = ferry::endpoint().build().listen(addr).await.with_context(|| format!("listen on {addr}"))?;
    println!("ready {}", l.local_addr());
    std::io::stdout().flush()?;
    std::thread::spawn(|| {
        let mut b = [0u8; 1];
        let _ = std::io::stdin().read(&mut b);
        std::process::exit(0);
    });
    let p = l.accept().await?;
    let mut held = Vec::new();
    while let Ok(m) = p.recv().await {
        match m.header["op"].as_str() {
            Some("result") => {
                let param = m.tensors.first().context("a result without a param")?;
                let sum = touch(param.as_bytes());
                let mut r = p.alloc(TensorMeta::new(DType::U8, vec![param.as_bytes().len() as u64])).await?;
                r.as_bytes_mut().fill(1);
                drop(m);
                p.send(Message::with_tensors(json!({"op": "result", "sum": sum}), vec![r.freeze()])).await?;
            }
            Some("hold") => held.push(m),
            Some("drop") => {
                held.clear();
                p.send(Message::new(json!({"op": "dropped"}))).await?;
            }
            _ => {
                drop(m);
                p.send(Message::new(json!({"op": "ack"}))).await?;
            }
        }
    }
    Ok(())
}

/// Reads one byte of every page (a handler reading its param): returns their sum.
fn touch(b: &[u8]) -> u64 {
    b.iter().step_by(4096).map(|&x| u64::from(x)).sum()
}

/// Resident memory of process `pid` in bytes (VmRSS: anonymous, file and shared pages it maps).
fn rss(pid: u32) -> anyhow::Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .context("no VmRSS")?;
    Ok(kb * 1024)
}

/// Bytes of ferry-shm memfd mappings in process `pid` (its own segments and its peer's).
fn shm_mapped(pid: u32) -> anyhow::Result<u64> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    Ok(maps
        .lines()
        .filter(|l| l.contains("memfd:ferry-shm"))
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            Some(u64::from_str_radix(b, 16).ok()? - u64::from_str_radix(a, 16).ok()?)
        })
        .sum())
}

fn mib(b: u64) -> String {
    format!("{:.0}", b as f64 / MIB as f64)
}

/// Runs both rows with a large tensor of `mib` MiB.
pub async fn run(exe: &SelfExe, size_mib: u64) -> anyhow::Result<Vec<MemRow>> {
    let addr = format!("unix:ferry-bench-shm-memory-{}", std::process::id());
    let (child, ready) = start_child(exe, &["__shm-memory-peer", &addr], "ready")?;
    let pipe = ferry::endpoint().build().connect(&ready).await.with_context(|| format!("connect to {ready}"))?;
    ensure!(pipe.channel() == "shm", "the pipe chose {}, not shm", pipe.channel());
    let (me, peer) = (std::process::id(), child.id());
    let both = || -> anyhow::Result<u64> { Ok(rss(me)? + rss(peer)?) };
    let len = size_mib * MIB;
    let mut rows = Vec::new();

    // A first small round trip: both sides' runtimes and pipes are up before "before".
    ack(&pipe, Message::new(json!({"op": "ack"}))).await?;
    let before = both()?;
    let t0 = Instant::now();
    let mut param = pipe.alloc(TensorMeta::new(DType::U8, vec![len])).await?;
    param.as_bytes_mut().fill(2);
    pipe.send(Message::with_tensors(json!({"op": "result"}), vec![param.freeze()])).await?;
    let result = tokio::time::timeout(LIMIT, pipe.recv()).await.context("no result")??;
    let bytes = result.tensors.first().context("a result without a tensor")?.as_bytes();
    ensure!(bytes.len() as u64 == len && touch(bytes) == len / 4096, "the result is not what the peer made");
    ensure!(result.header["sum"] == 2 * (len / 4096), "the peer read another param");
    let round_trip = t0.elapsed();
    let (peak, shm_peak) = (both()?, shm_mapped(me)? + shm_mapped(peer)?);
    drop(result);
    let dropped = Instant::now();
    let back = loop {
        if both()? <= before + 64 * MIB {
            break Some(dropped.elapsed());
        }
        if dropped.elapsed() > LIMIT {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let (after, shm_after) = (both()?, shm_mapped(me)? + shm_mapped(peer)?);
    rows.push(MemRow {
        case: format!("shm-memory param+result {size_mib} MiB"),
        result: format!(
            "RSS of both processes: before {} MiB, after the round trip {} MiB ({} ms; memfd mapped {} MiB), \
             back within 64 MiB of before {} after the drop (now {} MiB, memfd mapped {} MiB)",
            mib(before),
            mib(peak),
            round_trip.as_millis(),
            mib(shm_peak),
            match back {
                Some(d) => format!("{} ms", d.as_millis()),
                None => format!("not within {} s", LIMIT.as_secs()),
            },
            mib(after),
            mib(shm_after),
        ),
    });

    // 1,000 small messages held at once, dropped; then the large allocation.
    let small = ferry_core::Tensor::from_slice(vec![SMALL as u64], &vec![3u8; SMALL])?;
    for _ in 0..SMALL_COUNT {
        pipe.send(Message::with_tensors(json!({"op": "hold"}), vec![small.clone()])).await?;
    }
    let held = pipe.stats()["shm"]["reserved_bytes"].as_u64().unwrap_or(0);
    ack(&pipe, Message::new(json!({"op": "drop"}))).await?;
    let released = Instant::now();
    while pipe.stats()["shm"]["leases_granted"].as_u64() != Some(0) {
        if released.elapsed() > LIMIT {
            bail!("the peer's releases did not come within {LIMIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let s = pipe.stats()["shm"].clone();
    let t = Instant::now();
    let r = pipe.alloc(TensorMeta::new(DType::U8, vec![len])).await;
    let alloc = t.elapsed();
    let result = match r {
        Ok(mut big) => {
            big.as_bytes_mut()[0] = 4;
            let t = Instant::now();
            ack(&pipe, Message::with_tensors(json!({"op": "ack"}), vec![big.freeze()])).await?;
            format!(
                "pool held {} MiB in {} segments for {SMALL_COUNT} x {} KiB, all free; the {size_mib} MiB alloc \
                 took {:.1} ms, its send {} ms (segments given back so far: {})",
                mib(held),
                s["segments"],
                SMALL >> 10,
                alloc.as_secs_f64() * 1e3,
                t.elapsed().as_millis(),
                pipe.stats()["shm"]["segments_given_back"],
            )
        }
        Err(e) => format!("FAILED after {} ms: {e}", alloc.as_millis()),
    };
    rows.push(MemRow { case: format!("shm-memory {size_mib} MiB after {SMALL_COUNT} small"), result });
    drop(child);
    Ok(rows)
}

/// Sends `m` and waits for the peer's answer.
async fn ack(pipe: &Pipe, m: Message) -> anyhow::Result<()> {
    pipe.send(m).await?;
    tokio::time::timeout(LIMIT, pipe.recv()).await.context("no answer from the peer")??;
    Ok(())
}

/// The rows as a table.
pub fn table(rows: &[MemRow]) -> String {
    let w = rows.iter().map(|r| r.case.len()).max().unwrap_or(0);
    rows.iter().map(|r| format!("{:w$}  {}\n", r.case, r.result)).collect()
}
