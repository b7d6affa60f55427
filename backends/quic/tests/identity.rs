//! Many first starts of a server on one fresh identity path at once, threads of one process
//! and separate processes, must all end up with one identity: the one in the file. (Each
//! start once wrote the same temporary file, named by the process id only, and returned
//! the identity it had generated rather than the one linked into place, so the fingerprint
//! a server printed was not always the one it served.)
//!
//! `harness = false`: the `processes` case re-runs this binary as its children
//! (`FERRY_IDENTITY_RACE_PATH` set), each of which starts `THREADS` first starts at one
//! agreed instant and prints their fingerprints.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ferry_core::{Endpoint, InlineChannel, Message};
use ferry_quic::{IdentitySource, QuicChannel, QuicOptions, QuicTransport};
use libtest_mimic::{Arguments, Failed, Trial};
use serde_json::json;

/// The child's identity path; its presence makes this process a child.
const ENV_PATH: &str = "FERRY_IDENTITY_RACE_PATH";
/// When the child's starts begin (milliseconds since the Unix epoch).
const ENV_AT: &str = "FERRY_IDENTITY_RACE_AT";
/// First starts per process.
const THREADS: usize = 12;
/// Child processes in the `processes` case.
const CHILDREN: usize = 8;

fn transport(path: &Path) -> QuicTransport {
    QuicTransport::with_options(QuicOptions {
        identity: IdentitySource::File(path.to_owned()),
        ..QuicOptions::default()
    })
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// `THREADS` threads wait until `at_ms`, then (released together by a barrier) each makes
/// a new transport on `path` and asks for its fingerprint, the way a server starts.
fn first_starts(path: &Path, at_ms: u64) -> Vec<Result<String, String>> {
    let barrier = Arc::new(Barrier::new(THREADS));
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let (path, barrier) = (path.to_owned(), barrier.clone());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(at_ms.saturating_sub(now_ms())));
                barrier.wait();
                transport(&path).fingerprint().map_err(|e| e.to_string())
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap_or_else(|_| Err("the thread panicked".into()))).collect()
}

/// A fresh directory for one case's identity file.
fn fresh_dir(case: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("identity-race-{case}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Every start got the same fingerprint, that of the file; the file is private and whole;
/// no temporary file is left beside it.
fn check_agreement(dir: &Path, path: &Path, results: &[Result<String, String>]) -> Result<String, Failed> {
    let mut fps = Vec::new();
    for r in results {
        fps.push(r.clone().map_err(|e| format!("a first start failed: {e}"))?);
    }
    let on_disk = transport(path).fingerprint().map_err(|e| format!("reading back: {e}"))?;
    let disagree: Vec<_> = fps.iter().filter(|fp| **fp != on_disk).collect();
    if !disagree.is_empty() {
        return Err(format!(
            "{} of {} first starts got a fingerprint other than the file's {on_disk}: {disagree:?}",
            disagree.len(),
            fps.len()
        )
        .into());
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).map_err(|e| e.to_string())?.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(format!("the identity file has mode {:o}", mode & 0o777).into());
        }
    }
    let mut left = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| e.to_string())? {
        let name = e.map_err(|e| e.to_string())?.file_name();
        if Path::new(&name) != path.file_name().map(Path::new).unwrap_or(Path::new("")) {
            left.push(name);
        }
    }
    if !left.is_empty() {
        return Err(format!("files left beside the identity: {left:?}").into());
    }
    Ok(on_disk)
}

/// A server listening with one transport on `path` is reached by a client pinning the
/// fingerprint `pin` (which another transport on that path reported).
fn served_matches(path: &Path, pin: &str) -> Result<(), Failed> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let ep = |t: QuicTransport| {
            Endpoint::builder()
                .transport(Arc::new(t))
                .channel(Arc::new(QuicChannel::new()))
                .channel(Arc::new(InlineChannel))
        };
        let mut l = ep(transport(path)).build().listen("quic://127.0.0.1:0").await.map_err(|e| e.to_string())?;
        let printed = l.local_addr().to_string();
        if !printed.ends_with(&format!("#sha256={pin}")) {
            return Err(format!("the listener prints {printed}, the starts agreed on {pin}").into());
        }
        let sock = printed.split('#').next().unwrap_or_default().to_owned();
        let client = ep(QuicTransport::with_options(QuicOptions {
            identity: IdentitySource::Ephemeral,
            ..QuicOptions::default()
        }));
        let c =
            client.build().connect(&format!("{sock}#sha256={pin}")).await.map_err(|e| format!("connecting: {e}"))?;
        let s = tokio::time::timeout(Duration::from_secs(20), l.accept())
            .await
            .map_err(|_| "accept timed out".to_string())?
            .map_err(|e| e.to_string())?;
        c.send(Message::new(json!("hello"))).await.map_err(|e| e.to_string())?;
        let got = s.recv().await.map_err(|e| e.to_string())?;
        if got.header != json!("hello") {
            return Err(format!("received {:?}", got.header).into());
        }
        Ok(())
    })
}

/// Threads of one process.
fn threads() -> Result<(), Failed> {
    let dir = fresh_dir("threads");
    let path = dir.join("quic-identity.pem");
    let results = first_starts(&path, now_ms());
    let fp = check_agreement(&dir, &path, &results)?;
    served_matches(&path, &fp)?;
    std::fs::remove_dir_all(&dir).map_err(|e| e.to_string())?;
    Ok(())
}

/// `CHILDREN` processes (and this one), `THREADS` first starts each, at one instant.
fn processes() -> Result<(), Failed> {
    let dir = fresh_dir("processes");
    let path = dir.join("sub/quic-identity.pem"); // its directory is created by the starts too
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let at = now_ms() + 700;
    let children: Vec<_> = (0..CHILDREN)
        .map(|_| {
            Command::new(&exe)
                .env(ENV_PATH, &path)
                .env(ENV_AT, at.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
        })
        .collect::<Result<_, _>>()
        .map_err(|e| format!("spawning a child: {e}"))?;
    let mut results = first_starts(&path, at);
    for child in children {
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("a child failed: {}", out.status).into());
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<_> = text.lines().collect();
        if lines.len() != THREADS {
            return Err(format!("a child printed {} results, not {THREADS}: {text}", lines.len()).into());
        }
        results.extend(lines.iter().map(|l| match l.strip_prefix("ok ") {
            Some(fp) => Ok(fp.to_owned()),
            None => Err(l.to_string()),
        }));
    }
    let fp = check_agreement(&dir.join("sub"), &path, &results)?;
    served_matches(&path, &fp)?;
    std::fs::remove_dir_all(&dir).map_err(|e| e.to_string())?;
    Ok(())
}

/// One transport asked from many threads at once hands out one identity.
fn one_transport() -> Result<(), Failed> {
    let t = Arc::new(QuicTransport::with_options(QuicOptions {
        identity: IdentitySource::Ephemeral,
        ..QuicOptions::default()
    }));
    let barrier = Arc::new(Barrier::new(THREADS));
    let ids: Vec<_> = (0..THREADS)
        .map(|_| {
            let (t, barrier) = (t.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                t.identity().map_err(|e| e.to_string())
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap_or_else(|_| Err("the thread panicked".into())))
        .collect::<Result<Vec<_>, _>>()?;
    let first = t.identity().map_err(|e| e.to_string())?;
    if let Some(other) = ids.iter().find(|id| !Arc::ptr_eq(id, &first)) {
        return Err(format!("one transport handed out two identities: {first:?} and {other:?}").into());
    }
    Ok(())
}

/// A child of the `processes` case: prints `ok FINGERPRINT` or `err MESSAGE` per start.
fn child(path: &str) -> ExitCode {
    let at = std::env::var(ENV_AT).ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    for r in first_starts(Path::new(path), at) {
        match r {
            Ok(fp) => println!("ok {fp}"),
            Err(e) => println!("err {}", e.replace('\n', " ")),
        }
    }
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    if let Ok(path) = std::env::var(ENV_PATH) {
        return child(&path);
    }
    let trials = vec![
        Trial::test("concurrent_first_starts_agree::threads", threads),
        Trial::test("concurrent_first_starts_agree::processes", processes),
        Trial::test("one_transport_hands_out_one_identity", one_transport),
    ];
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}
