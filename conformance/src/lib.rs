//! ferry-conformance: one generic suite that every backend must pass.
//!
//! Each backend instantiates it in its own `tests/conformance.rs` with a [`Fixture`]:
//!
//! ```
//! use std::sync::Arc;
//! use ferry_core::{Channel, InlineChannel, Transport};
//!
//! #[derive(Default)]
//! struct MyBackend;
//!
//! impl ferry_conformance::Fixture for MyBackend {
//!     const NAME: &'static str = "my-backend";
//!     fn transport(&self) -> Arc<dyn Transport> {
//!         todo!("Arc::new(MyTransport::new())")
//!     }
//!     fn channels(&self) -> Vec<Arc<dyn Channel>> {
//!         vec![Arc::new(InlineChannel)]
//!     }
//!     fn addr(&self, tag: &str) -> String {
//!         format!("my:{}", ferry_conformance::unique(tag))
//!     }
//! }
//!
//! // tests/conformance.rs, with `harness = false` for it in Cargo.toml:
//! fn conformance_main() -> std::process::ExitCode {
//!     ferry_conformance::main::<MyBackend>()
//! }
//! # let _ = conformance_main;
//! ```
//!
//! The cases (in [`cases`]) are generic functions over the fixture. Data cases run twice:
//! with the peer in a thread of this process (`::threads`) and in a separate process
//! (`::processes`, this test binary re-executed with `FERRY_PEER` set). A backend that is
//! not viable on this machine shows every case as *ignored*, never as passed.
//!
//! With `FERRY_CONFORMANCE_REPORT=path` set, a JSON report of every case is written there
//! (read by `cargo xtask conformance`).
//!
//! # Feature flags
//! None.
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_core::{Channel, EndpointBuilder, Transport};
pub use libtest_mimic::Failed;

pub mod cases;
pub mod peer;
pub mod util;

/// What a backend provides to the suite.
pub trait Fixture: Default + Send + Sync + 'static {
    /// The backend's name (a column of the conformance table).
    const NAME: &'static str;

    /// Whether a peer in another process can reach the transport. `false` (the in-process
    /// `mem` transport) leaves out the cases whose peer is a process: the `::processes`
    /// variants and the faults cases (which kill the peer process).
    const PROCESS_PEERS: bool = true;

    /// The transport under test.
    fn transport(&self) -> Arc<dyn Transport>;

    /// The channels under test, highest priority first.
    fn channels(&self) -> Vec<Arc<dyn Channel>>;

    /// The channel the handshake should pick for CPU tensors.
    fn expected_channel(&self) -> &'static str {
        self.channels().first().map(|c| c.name()).unwrap_or("inline")
    }

    /// A fresh address, unique to this process and `tag`.
    fn addr(&self, tag: &str) -> String;

    /// Whether the backend can run here; `Err(reason)` marks every case ignored.
    fn viability(&self) -> Result<(), String> {
        self.transport().viability().map_err(|e| e.to_string())?;
        for c in self.channels() {
            c.viability().map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// An endpoint builder with the transport and channels.
    fn endpoint(&self) -> EndpointBuilder {
        let mut b = ferry_core::Endpoint::builder().transport(self.transport());
        for c in self.channels() {
            b = b.channel(c);
        }
        b
    }
}

/// A unique suffix for addresses: pid plus a counter.
pub fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{}-{}-{}", std::process::id(), tag.replace("::", "-"), N.fetch_add(1, Ordering::Relaxed))
}

/// Where a case's peer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peers {
    /// In a thread of the test process, on its own runtime.
    Threads,
    /// In a separate process (the test binary, re-executed).
    Processes,
}

impl Peers {
    /// The suffix used in case names.
    pub fn name(self) -> &'static str {
        match self {
            Peers::Threads => "threads",
            Peers::Processes => "processes",
        }
    }
}

/// The outcome of one case.
pub type Outcome = Result<(), Failed>;

/// Fails a case with a message unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::Failed::from(format!($($fmt)+)));
        }
    };
}

/// Runs an async case body on a fresh runtime, bounded by `limit`.
pub fn run_async<Fut>(limit: Duration, f: Fut) -> Outcome
where
    Fut: std::future::Future<Output = Outcome>,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    let r = rt.block_on(async { tokio::time::timeout(limit, f).await });
    rt.shutdown_timeout(Duration::from_secs(2));
    r.map_err(|_| Failed::from(format!("case did not finish within {limit:?}")))?
}

struct Record {
    name: String,
    outcome: &'static str,
    detail: Option<String>,
    ms: u128,
}

fn json_escape(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

fn write_report(path: &str, backend: &str, viability: &Result<(), String>, records: &[Record]) {
    let cases: Vec<String> = records
        .iter()
        .map(|r| {
            format!(
                "{{\"name\":{},\"outcome\":\"{}\",\"detail\":{},\"ms\":{}}}",
                json_escape(&r.name),
                r.outcome,
                r.detail.as_deref().map(json_escape).unwrap_or_else(|| "null".into()),
                r.ms
            )
        })
        .collect();
    let text = format!(
        "{{\"backend\":{},\"viable\":{},\"reason\":{},\"cases\":[{}]}}\n",
        json_escape(backend),
        viability.is_ok(),
        viability.as_ref().err().map(|r| json_escape(r)).unwrap_or_else(|| "null".into()),
        cases.join(",")
    );
    if let Some(dir) = std::path::Path::new(path).parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Err(e) = std::fs::write(path, text) {
        eprintln!("ferry-conformance: cannot write report {path}: {e}");
    }
}

/// The test binary's `main`: runs a peer role when re-executed as a peer, the suite
/// otherwise.
pub fn main<F: Fixture>() -> ExitCode {
    if let Some(code) = peer::run_if_peer::<F>() {
        return code;
    }
    let viability = F::default().viability();
    if let Err(reason) = &viability {
        eprintln!("ferry-conformance: backend {} is not viable here, every case is ignored: {reason}", F::NAME);
    }
    let cases = cases::all::<F>()
        .into_iter()
        .map(|(name, case)| {
            let run: Suite = Box::new(move || case(&F::default()));
            (name, run)
        })
        .collect();
    run_suite(F::NAME, viability, cases)
}

/// One case of [`run_suite`].
pub type Suite = Box<dyn FnOnce() -> Outcome + Send>;

/// Runs named cases as libtest-mimic trials (two at a time unless `--test-threads` says
/// otherwise; a panic is a failure) and, with `FERRY_CONFORMANCE_REPORT` set, writes the
/// report of column `column` there. Not viable: every case is reported ignored, with the
/// reason.
pub fn run_suite(column: &str, viability: Result<(), String>, cases: Vec<(String, Suite)>) -> ExitCode {
    let records = Arc::new(Mutex::new(Vec::<Record>::new()));
    let mut args = libtest_mimic::Arguments::from_args();
    // Cases are heavy (processes, 256 MiB payloads): two at a time unless told otherwise.
    if args.test_threads.is_none() {
        args.test_threads = Some(2);
    }
    let trials = cases
        .into_iter()
        .map(|(name, case)| {
            let records = records.clone();
            let ignored = viability.is_err();
            if ignored {
                records.lock().unwrap_or_else(|e| e.into_inner()).push(Record {
                    name: name.clone(),
                    outcome: "ignored",
                    detail: viability.as_ref().err().cloned(),
                    ms: 0,
                });
            }
            let trial_name = name.clone();
            let case = Mutex::new(Some(case));
            libtest_mimic::Trial::test(name, move || {
                let start = Instant::now();
                let case = case.lock().unwrap_or_else(|e| e.into_inner()).take();
                let case = case.ok_or_else(|| Failed::from("the case ran twice"))?;
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(case)).unwrap_or_else(|p| {
                    let msg = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "panic".into());
                    Err(Failed::from(format!("panicked: {msg}")))
                });
                records.lock().unwrap_or_else(|e| e.into_inner()).push(Record {
                    name: trial_name,
                    outcome: if r.is_ok() { "pass" } else { "fail" },
                    detail: r.as_ref().err().and_then(|f| f.message().map(str::to_string)),
                    ms: start.elapsed().as_millis(),
                });
                r
            })
            .with_ignored_flag(ignored)
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    if let Ok(path) = std::env::var("FERRY_CONFORMANCE_REPORT")
        && !args.list
    {
        let mut recs = records.lock().unwrap_or_else(|e| e.into_inner());
        recs.sort_by(|a, b| a.name.cmp(&b.name));
        write_report(&path, column, &viability, &recs);
    }
    conclusion.exit_code()
}
