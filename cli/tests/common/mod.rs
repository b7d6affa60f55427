//! `ferry serve` as a child process, killed (and its socket directory removed) on drop.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[cfg(unix)]
pub mod raw;

static N: AtomicUsize = AtomicUsize::new(0);

/// The `ferry` binary under test.
pub fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_ferry")
}

/// A running `ferry serve`.
pub struct Served {
    child: Child,
    /// Its ferry / plain JSON address.
    pub addr: String,
    /// Its HTTP URL, if started with `--http`.
    pub url: Option<String>,
    _dir: Option<tempfile::TempDir>,
}

impl Served {
    /// Serves on a unique abstract name.
    pub fn start(http: bool) -> Served {
        let addr = format!("unix:ferry-rpc-test-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
        Self::start_at(addr, None, http, &[])
    }

    /// The server process's id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Serves on a unique abstract name, with more `ferry serve` options.
    pub fn start_with(args: &[&str]) -> Served {
        let addr = format!("unix:ferry-rpc-test-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
        Self::start_at(addr, None, false, args)
    }

    /// Serves on a socket file in a fresh temporary directory (Node cannot reach abstract
    /// names).
    pub fn start_in_dir(http: bool) -> Served {
        let dir = tempfile::Builder::new().prefix("ferry-rpc-test-").tempdir().unwrap();
        let addr = format!("unix:{}/rpc.sock", dir.path().display());
        Self::start_at(addr, Some(dir), http, &[])
    }

    fn start_at(addr: String, dir: Option<tempfile::TempDir>, http: bool, args: &[&str]) -> Served {
        let mut cmd = Command::new(exe());
        cmd.args(["serve", &addr]).args(args);
        if http {
            cmd.args(["--http", "127.0.0.1:0"]);
        }
        Self::spawn(cmd, addr, dir, http)
    }

    /// Runs `ferry ARGS` (a server of any kind that serves `addr`) and waits until it
    /// prints `listening on`.
    pub fn start_command(args: &[&str], addr: &str) -> Served {
        let mut cmd = Command::new(exe());
        cmd.args(args);
        Self::spawn(cmd, addr.to_owned(), None, false)
    }

    fn spawn(mut cmd: Command, addr: String, dir: Option<tempfile::TempDir>, http: bool) -> Served {
        let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut served = Served { child, addr, url: None, _dir: dir };
        let first = rx.recv_timeout(Duration::from_secs(30)).expect("ferry serve said nothing").unwrap();
        assert!(first.starts_with("listening on"), "ferry serve said {first:?}");
        if http {
            let line = rx.recv_timeout(Duration::from_secs(30)).expect("no http line").unwrap();
            served.url = Some(format!("{}/", line.strip_prefix("http on ").expect("http on URL")));
        }
        served
    }

    /// Kills the server now.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs a command to completion with a time limit (killed past it).
pub fn run(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{cmd:?} ran over {limit:?}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A connection to the abstract unix socket of `addr` (`unix:NAME`), reads timing out after
/// 20 s so that a test never hangs on a silent server.
#[cfg(target_os = "linux")]
pub fn connect_abstract(addr: &str) -> std::os::unix::net::UnixStream {
    let s = ferry_commands::raw_peer::connect_abstract(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}
