//! The soak's phases: each loads the server one way and says what it checked.

use std::future::Future;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::pin::Pin;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use ferry_core::frame::{FrameKind, preamble};
use ferry_core::{Message, PROTOCOL_VERSION, Tensor};
use ferry_rpc::RpcTensor;
use serde_json::json;

use super::{Ctx, Usage, connect, dev_shm_bytes, serve, usage};
use crate::raw_peer::{connect_abstract, frame_prefix, handshake};

type PhaseFuture<'a> = Pin<Box<dyn Future<Output = anyhow::Result<String>> + 'a>>;
type Phase = for<'a> fn(&'a mut Ctx) -> PhaseFuture<'a>;

/// The phases, in order.
pub(crate) const ALL: &[(&str, Phase)] = &[
    ("quiet", |c| Box::pin(quiet(c))),
    ("concurrent clients", |c| Box::pin(clients(c))),
    ("CPU-bound neighbour (matmul)", |c| Box::pin(compute(c))),
    ("idle + slowloris connections", |c| Box::pin(idle_and_slow(c))),
    ("4 GiB frame claims", |c| Box::pin(frame_claims(c))),
    ("client never reads answers", |c| Box::pin(unread(c))),
    ("3 huge [0,0,...] lines", |c| Box::pin(zeros_lines(c))),
    ("4 huge ferry headers", |c| Box::pin(big_headers(c))),
    ("inline result over the limit", |c| Box::pin(inline_result(c))),
    ("clients SIGKILLed mid-call", |c| Box::pin(kill_clients(c))),
    ("servers SIGKILLed under a client", |c| Box::pin(kill_servers(c))),
    ("ring peers SIGKILLed, not reading", |c| Box::pin(super::ring_peers::killed_ring_peers(c))),
    ("tokenless QUIC conns close", |c| Box::pin(super::conn_owner::tokenless_quic_connections(c))),
];

const WAIT: Duration = Duration::from_secs(60);

/// A connection to the server's abstract unix socket, reads and writes bounded by [`WAIT`].
fn raw(addr: &str) -> anyhow::Result<UnixStream> {
    let s = connect_abstract(addr)?;
    s.set_read_timeout(Some(WAIT))?;
    s.set_write_timeout(Some(WAIT))?;
    Ok(s)
}

/// One plain JSON-RPC line sent, one read back.
fn plain_call(addr: &str, line: &[u8]) -> anyhow::Result<serde_json::Value> {
    let mut s = raw(addr)?;
    s.write_all(line)?;
    let mut answer = String::new();
    BufReader::new(s).read_line(&mut answer)?;
    serde_json::from_str(&answer).with_context(|| format!("answer {answer:.200}"))
}

/// A raw ferry connection through the handshake (inline channel only).
fn handshaken(addr: &str) -> anyhow::Result<UnixStream> {
    handshake(raw(addr)?, "soak")
}

fn write_prefix(c: &mut UnixStream, kind: FrameKind, header_len: u32, payload_len: u64) -> std::io::Result<()> {
    c.write_all(&frame_prefix(kind, header_len, payload_len))
}

/// Whether the peer closed `s` (EOF or reset) within `within`.
fn closed_within(s: &mut UnixStream, within: Duration) -> bool {
    let _ = s.set_read_timeout(Some(within));
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return false;
            }
            Err(_) => return true,
        }
    }
    false
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> anyhow::Result<T> + Send + 'static) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(f).await.context("a blocking phase step panicked")?
}

async fn quiet(ctx: &mut Ctx) -> anyhow::Result<String> {
    tokio::time::sleep(ctx.counts.hold).await;
    Ok("baseline for the canary".into())
}

async fn clients(ctx: &mut Ctx) -> anyhow::Result<String> {
    let (n, per) = (ctx.counts.clients, ctx.counts.calls / ctx.counts.clients);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for k in 0..n {
        let addr = ctx.server.addr.clone();
        tasks.push(tokio::spawn(async move {
            let c = connect(&addr).await?;
            for i in 0..per {
                let v: f64 = c.call("add", &(i as f64, k as f64)).await?;
                ensure!(v == (i + k) as f64, "add({i}, {k}) = {v}");
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let s = start.elapsed().as_secs_f64();
    Ok(format!("{} clients x {per} calls, all right, {:.0} calls/s", n, (n * per) as f64 / s))
}

async fn compute(ctx: &mut Ctx) -> anyhow::Result<String> {
    let c = connect(&ctx.server.addr).await?;
    let a = RpcTensor(Tensor::from_slice(vec![256u64, 256], &vec![0.5f32; 256 * 256])?);
    let b = RpcTensor(Tensor::from_slice(vec![256u64, 256], &vec![0.25f32; 256 * 256])?);
    let deadline = Instant::now() + ctx.counts.hold;
    let mut n = 0;
    while Instant::now() < deadline {
        // Typed params: the matrices go over shm (`json!` would inline them as base64).
        let p = crate::demo::MatmulParams { a: a.clone(), b: b.clone() };
        let r: RpcTensor = c.call("matmul", &p).await?;
        let got = r.as_slice::<f32>()?.first().copied();
        ensure!(got == Some(32.0), "matmul result {got:?}, shape {:?}", r.shape());
        n += 1;
    }
    Ok(format!("{n} 256x256 matmuls beside the canary (compare its p99 with quiet)"))
}

async fn idle_and_slow(ctx: &mut Ctx) -> anyhow::Result<String> {
    let addr = ctx.server.addr.clone();
    let mut pipes = Vec::new();
    let mut sockets = Vec::new();
    for i in 0..ctx.counts.idle {
        if i % 2 == 0 {
            let ep = ferry::endpoint().build();
            pipes.push(tokio::time::timeout(WAIT, ep.connect(&addr)).await.context("idle pipe: timed out")??);
        } else {
            sockets.push(raw(&addr)?);
        }
    }
    let slow = ctx.counts.slowloris;
    let hold = ctx.counts.hold;
    let full = ctx.counts.full;
    let a = addr.clone();
    let slow_task = tokio::task::spawn_blocking(move || -> anyhow::Result<usize> {
        let mut conns = (0..slow).map(|_| raw(&a)).collect::<anyhow::Result<Vec<_>>>()?;
        let text = b"{\"jsonrpc\":\"2.0\",\"method\":\"add\",\"params\":[1,2],\"id\":1}";
        let deadline = Instant::now() + hold;
        let mut i = 0;
        while Instant::now() < deadline {
            for c in &mut conns {
                let _ = c.write_all(&text[i % text.len()..i % text.len() + 1]);
            }
            i += 1;
            std::thread::sleep(Duration::from_millis(200));
        }
        if !full {
            return Ok(0);
        }
        // Past the request timeout (30 s), every slowloris connection is closed.
        let deadline = Instant::now() + Duration::from_secs(40);
        let mut closed = 0;
        for c in &mut conns {
            let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(10));
            closed += usize::from(closed_within(c, left));
        }
        Ok(closed)
    });
    // A fresh client meanwhile.
    let fresh = connect(&addr).await?;
    for i in 0..200 {
        let v: f64 = fresh.call("add", &(i as f64, 1.0)).await?;
        ensure!(v == i as f64 + 1.0, "a fresh client's add");
    }
    let closed = slow_task.await??;
    let during = usage(ctx.server.pid);
    drop((pipes, sockets));
    let mut out = format!(
        "{} idle ({} ferry pipes, {} raw sockets) + {slow} slowloris open, {} server fds; a fresh client's 200 adds right",
        ctx.counts.idle,
        ctx.counts.idle.div_ceil(2),
        ctx.counts.idle / 2,
        during.fds
    );
    if full {
        ensure!(closed == slow, "{closed} of {slow} slowloris connections were closed by request_timeout");
        out += &format!("; all {slow} slowloris closed by request_timeout");
    }
    Ok(out)
}

async fn frame_claims(ctx: &mut Ctx) -> anyhow::Result<String> {
    let (addr, n, hold) = (ctx.server.addr.clone(), ctx.counts.frame_claims, ctx.counts.hold);
    let before = usage(ctx.server.pid).rss_kib;
    let pid = ctx.server.pid;
    let grew = blocking(move || {
        // Before the handshake: a HELLO claiming a 4 GiB header is refused at once.
        let mut early = raw(&addr)?;
        early.write_all(&preamble(PROTOCOL_VERSION))?;
        write_prefix(&mut early, FrameKind::Hello, u32::MAX, 0)?;
        ensure!(closed_within(&mut early, Duration::from_secs(10)), "a 4 GiB HELLO claim was not refused");
        // After it: MESSAGE frames announcing 4 GiB payloads that never come.
        let mut conns = Vec::new();
        for _ in 0..n {
            let mut c = handshaken(&addr)?;
            let header = serde_json::to_vec(&json!({"header": {"jsonrpc": "2.0", "method": "add", "id": 1}}))?;
            write_prefix(&mut c, FrameKind::Message, header.len() as u32, (4u64 << 30) - 4096)?;
            c.write_all(&header)?;
            c.write_all(&[0u8; 4096])?;
            conns.push(c);
        }
        std::thread::sleep(hold);
        let grew = usage(pid).rss_kib.saturating_sub(before);
        drop(conns);
        Ok(grew)
    })
    .await?;
    let per = grew as f64 / 1024.0 / n as f64;
    // The target is < 2 MiB a claim; the slack is for what else the server touches meanwhile
    // (an allocation ahead of the bytes would be 4 GiB).
    ensure!(grew < (n as u64 * 2 + 16) << 10, "RSS grew {per:.1} MiB per 4 GiB claim (target < 2)");
    Ok(format!("HELLO claim refused; {n} MESSAGE claims held: RSS +{per:.2} MiB each"))
}

async fn unread(ctx: &mut Ctx) -> anyhow::Result<String> {
    let (addr, n) = (ctx.server.addr.clone(), ctx.counts.unread_requests);
    let idle = ctx.idle.rss_kib;
    let pid = ctx.server.pid;
    let (written, peak_growth) = blocking(move || {
        let mut s = raw(&addr)?;
        s.set_write_timeout(Some(Duration::from_secs(2)))?;
        let mut written = 0;
        let mut peak = 0;
        for i in 0..n {
            let line = format!("{{\"jsonrpc\":\"2.0\",\"method\":\"add\",\"params\":[{i},1],\"id\":{i}}}\n");
            if s.write_all(line.as_bytes()).is_err() {
                break; // the server stopped reading: its bound on unwritten answers
            }
            written += 1;
            if i % 256 == 0 {
                peak = peak.max(usage(pid).rss_kib);
            }
        }
        drop(s);
        Ok((written, peak.saturating_sub(idle)))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = usage(ctx.server.pid).rss_kib.saturating_sub(idle) as f64 / 1024.0;
    ensure!(after < 64.0, "RSS {after:.1} MiB over idle after the client left (target < 64)");
    Ok(format!(
        "{written} of {n} requests written before the server stopped reading; RSS +{:.1} MiB during, +{after:.1} MiB after",
        peak_growth as f64 / 1024.0
    ))
}

async fn zeros_lines(ctx: &mut Ctx) -> anyhow::Result<String> {
    let mib = ctx.counts.zeros_line_mib;
    // Built off the runtime: the canary's calls share it, and must measure the server.
    let line = blocking(move || {
        let mut line = Vec::with_capacity(mib << 20);
        line.push(b'[');
        while line.len() < (mib << 20) - 3 {
            line.extend_from_slice(b"0,");
        }
        line.extend_from_slice(b"0]\n");
        Ok(std::sync::Arc::new(line))
    })
    .await?;
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let (addr, line) = (ctx.server.addr.clone(), line.clone());
        tasks.push(blocking(move || plain_call(&addr, &line)));
    }
    for t in tasks {
        let a = t.await?;
        let limit = a["error"]["data"]["limit"].as_str().unwrap_or("").to_owned();
        ensure!(limit == "max_batch" || limit == "max_request_values", "answered {a:.300}");
    }
    Ok(format!("3 lines of {mib} MiB refused by name before parsing (peak vs 3x the lines: see peak MiB)"))
}

async fn big_headers(ctx: &mut Ctx) -> anyhow::Result<String> {
    let bytes = (ctx.counts.header_mib << 20) - 1024;
    // Built off the runtime, as in zeros_lines.
    let header = blocking(move || {
        let zeros = "0,".repeat((bytes - 64) / 2);
        let text = format!("{{\"jsonrpc\":\"2.0\",\"method\":\"add\",\"params\":[{zeros}0],\"id\":1}}");
        drop(zeros);
        Ok(serde_json::from_str::<serde_json::Value>(&text)?)
    })
    .await?;
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (addr, header) = (ctx.server.addr.clone(), header.clone());
        tasks.push(tokio::spawn(async move {
            let pipe = tokio::time::timeout(WAIT, ferry::endpoint().build().connect(&addr)).await??;
            pipe.send(Message::new(header)).await?;
            let e = tokio::time::timeout(WAIT, pipe.recv()).await?.err().context("the header was answered")?;
            anyhow::Ok(e.to_string())
        }));
    }
    drop(header);
    for t in tasks {
        let e = t.await??;
        ensure!(e.contains("max_header_values"), "the pipe closed with {e:.300}");
    }
    Ok(format!("4 headers of {} MiB refused by name (max_header_values) before parsing", ctx.counts.header_mib))
}

async fn inline_result(ctx: &mut Ctx) -> anyhow::Result<String> {
    let (addr, mib) = (ctx.server.addr.clone(), ctx.counts.inline_mib);
    let a = blocking(move || {
        let line = format!(
            "{{\"jsonrpc\":\"2.0\",\"method\":\"create_tensor\",\"params\":{{\"shape\":[{}],\"dtype\":\"u8\",\"fill\":1}},\"id\":1}}\n",
            mib << 20
        );
        plain_call(&addr, line.as_bytes())
    })
    .await?;
    ensure!(a["error"]["data"]["limit"] == "max_inline_bytes", "answered {a:.300}");
    Ok(format!("a {mib} MiB result to a plain JSON client refused by name (max_inline_bytes)"))
}

/// A small deterministic generator of delays (no dependency for one number).
fn next(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    *seed >> 33
}

async fn kill_clients(ctx: &mut Ctx) -> anyhow::Result<String> {
    let before = usage(ctx.server.pid);
    let mut seed = 7u64;
    for _ in 0..ctx.counts.kills {
        let mut child = ctx
            .exe
            .command()
            .args(["call", &ctx.server.addr, "create_tensor", r#"{"shape":[4194304],"dtype":"f32","fill":1}"#])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        tokio::time::sleep(Duration::from_millis(5 + next(&mut seed) % 60)).await;
        let _ = child.kill();
        let _ = child.wait();
    }
    // The server notices each death and gives back what the connection held.
    back_to(ctx.server.pid, before, 0, || true, &format!("after {} kills, the server", ctx.counts.kills)).await?;
    Ok(format!("{} killed at 5-65 ms; fds and memfd mappings back to before", ctx.counts.kills))
}

/// Waits up to 20 s for process `pid` to hold no more than `before` (fds: plus `fd_slack`)
/// with `also` true; else an error saying what `who` still holds.
pub(super) async fn back_to(
    pid: u32,
    before: Usage,
    fd_slack: usize,
    also: impl Fn() -> bool,
    who: &str,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = usage(pid);
        if now.fds <= before.fds + fd_slack && now.memfd_maps <= before.memfd_maps && also() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{who}: {} fds (before {}), {} memfd mappings (before {})",
                now.fds,
                before.fds,
                now.memfd_maps,
                before.memfd_maps
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn kill_servers(ctx: &mut Ctx) -> anyhow::Result<String> {
    let me = std::process::id();
    let (before, shm) = (usage(me), dev_shm_bytes());
    for _ in 0..ctx.counts.kills {
        let mut victim = serve(&ctx.exe, "victim", &[])?;
        let c = connect(&victim.addr).await?;
        let held: RpcTensor =
            c.call("create_tensor", &json!({"shape": [1 << 20], "dtype": "f32", "fill": 2.0})).await?;
        victim.child.kill();
        // The lent memory stays readable after its owner died; then it is let go.
        ensure!(held.as_slice::<f32>()?[(1 << 20) - 1] == 2.0, "lent memory after the server died");
        let err = c.call::<_, f64>("add", &(1.0, 2.0)).await;
        ensure!(err.is_err(), "a call to a killed server succeeded");
        drop((held, c));
    }
    let who = format!("this client after {} server kills", ctx.counts.kills);
    back_to(me, before, 2, || dev_shm_bytes() <= shm, &who).await?;
    Ok(format!(
        "{} servers killed holding a lent 4 MiB result each; this client's fds and memfd mappings back to before",
        ctx.counts.kills
    ))
}
