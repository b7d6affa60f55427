//! `ferry serve`, `ferry call` and `ferry discover` as real processes, and the Rust client
//! against the served demo API (over the best channel both sides have).
#![cfg(feature = "rpc")]

mod common;

use std::future::Future;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Served, exe, run};
use ferry::ferry_rpc::{CallError, Client, RpcTensor, TensorMap};
use ferry::{DType, Tensor, TensorMeta};
use serde_json::{Value, json};

async fn t<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(30), f).await.expect("timed out after 30 s")
}

fn ferry(args: &[&str]) -> (bool, String, String) {
    let out = run(Command::new(exe()).args(args), Duration::from_secs(60));
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn call_and_discover_from_the_command_line() {
    let s = Served::start(false);
    let (ok, out, err) = ferry(&["call", &s.addr, "add", "[1, 2]"]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "3.0");
    let (ok, out, _) = ferry(&["call", &s.addr, "add", r#"{"a": 1, "b": 0.5}"#]);
    assert!(ok && out.trim() == "1.5", "{out}");
    let (ok, out, err) =
        ferry(&["call", &s.addr, "create_tensor", r#"{"shape": [2, 2], "dtype": "f32", "fill": 1.5}"#]);
    assert!(ok, "{err}");
    assert!(out.contains("<tensor f32[2,2] 16 B [1.5, 1.5, 1.5, 1.5] via"), "{out}");
    let (ok, out, _) = ferry(&["call", &s.addr, "weights"]);
    assert!(ok && out.contains("\"fc1.weight\": \"<tensor f32[4,8] 128 B"), "{out}");
    let (ok, _, err) = ferry(&["call", &s.addr, "nope", "{}"]);
    assert!(!ok && err.contains("-32601 METHOD_NOT_FOUND"), "{err}");
    let (ok, _, err) = ferry(&["call", &s.addr, "add", "[1]"]);
    assert!(!ok && err.contains("-32602"), "{err}");
    let (ok, _, err) = ferry(&["call", &s.addr, "add", "5"]);
    assert!(!ok && err.contains("object (by name) or array"), "{err}");
    let (ok, out, err) = ferry(&["discover", &s.addr]);
    assert!(ok, "{err}");
    let doc: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["openrpc"], "1.3.2");
    assert_eq!(doc["info"]["title"], "ferry demo");
    let (ok, _, err) = ferry(&["call", "unix:ferry-rpc-test-nobody-listens", "add", "[1,2]"]);
    assert!(!ok && err.contains("connecting to"), "{err}");
}

#[test]
fn serve_refuses_a_busy_poll_window_over_the_maximum() {
    let (ok, _, err) = ferry(&["serve", "unix:ferry-rpc-test-busy-poll-refused", "--busy-poll-us", "5000"]);
    assert!(!ok && err.contains("--busy-poll-us 5000 is over the most allowed, 1000 µs"), "{err}");
}

#[test]
fn serve_refuses_a_worker_count_of_zero_or_over_the_maximum() {
    let (ok, _, err) = ferry(&["serve", "unix:ferry-rpc-test-workers-0", "--workers", "0"]);
    assert!(!ok && err.contains("--workers 0: a server needs at least 1 runtime worker thread"), "{err}");
    let (ok, _, err) = ferry(&["serve", "unix:ferry-rpc-test-workers-big", "--workers", "5000"]);
    assert!(!ok && err.contains("--workers 5000 is over the most allowed, 1024"), "{err}");
}

/// Threads of process `pid` named like Tokio's runtime workers.
fn runtime_workers(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "tokio-rt-worker")
        .count()
}

/// `--workers N` runs N runtime workers; by default half the CPUs when busy polling (an
/// idle worker wakes for every request a polling one reads), all of them when not.
#[test]
fn serve_runs_the_runtime_workers_asked_for() {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    for (args, want) in [
        (&["--workers", "3"][..], 3),
        (&["--workers", "1", "--busy-poll-us", "0"][..], 1),
        (&["--busy-poll-us", "20"][..], (cpus / 2).max(1)),
        (&["--busy-poll-us", "0"][..], cpus),
    ] {
        let s = Served::start_with(args);
        // Workers start with the runtime, but name themselves once running: wait (bounded).
        let mut seen = 0;
        for _ in 0..200 {
            seen = runtime_workers(s.pid());
            if seen == want {
                break;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        assert_eq!(seen, want, "ferry serve {args:?} on {cpus} CPUs");
        let (ok, out, err) = ferry(&["call", &s.addr, "add", "[1, 2]"]);
        assert!(ok && out.trim() == "3.0", "{args:?}: {out} {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_client_against_the_demo_process() {
    let s = Served::start(false);
    let c = Client::new(t(ferry::endpoint().build().connect(&s.addr)).await.unwrap());
    let who: Value = t(c.call("whoami", &())).await.unwrap();
    assert_eq!(who["kind"], "pipe");
    assert_eq!(who["channel"], c.pipe().channel());
    assert_eq!(who["pid"], std::process::id());
    if cfg!(feature = "shm") {
        assert_eq!(c.pipe().channel(), "shm");
    }
    // The tensor of the benchmark, made by the server in the channel's memory.
    let p = json!({"shape": [1920, 1080, 3], "dtype": "f32", "fill": 0.25});
    let big: RpcTensor = t(c.call("create_tensor", &p)).await.unwrap();
    assert_eq!(big.meta(), &TensorMeta::new(DType::F32, vec![1920, 1080, 3]));
    assert!(big.as_slice::<f32>().unwrap().iter().all(|&x| x == 0.25));
    let back: RpcTensor = t(c.call("echo", &ferry_commands::demo::TensorParams { tensor: big.clone() })).await.unwrap();
    assert_eq!(back, big);
    let sum: f64 = t(c.call("sum", &ferry_commands::demo::TensorParams { tensor: big })).await.unwrap();
    assert_eq!(sum, 1920.0 * 1080.0 * 3.0 * 0.25);
    let a = Tensor::from_slice(vec![2, 3], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    let b = Tensor::from_slice(vec![3, 1], &[1.0f32, 0.0, -1.0]).unwrap();
    let m: RpcTensor =
        t(c.call("matmul", &ferry_commands::demo::MatmulParams { a: a.into(), b: b.clone().into() })).await.unwrap();
    assert_eq!(m.shape(), &[2, 1]);
    assert_eq!(m.as_slice::<f32>().unwrap(), &[-2.0, -2.0]);
    let e =
        t(c.call::<_, RpcTensor>("matmul", &ferry_commands::demo::MatmulParams { a: b.clone().into(), b: b.into() }))
            .await
            .unwrap_err();
    assert!(e.to_string().contains("inner dimensions differ"), "{e}");
    let w: TensorMap = t(c.call("weights", &())).await.unwrap();
    let d: Value = t(c.call("describe", &ferry_commands::demo::DescribeParams { weights: w })).await.unwrap();
    assert_eq!(d["fc2.weight"]["shape"], json!([8, 2]));
    // A task.
    let id = t(c.submit("sleep", &json!({"ms": 50}), false)).await.unwrap();
    assert_eq!(t(c.task_result::<u64>(&id, Duration::from_secs(10))).await.unwrap(), 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_server_fails_calls_without_hanging() {
    let mut s = Served::start(false);
    let c = Client::new(t(ferry::endpoint().build().connect(&s.addr)).await.unwrap());
    assert_eq!(t(c.call::<_, f64>("add", &(1, 2))).await.unwrap(), 3.0);
    let pending: Vec<_> = (0..8)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move { c.call::<_, u64>("sleep", &json!({"ms": 60_000})).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let killed = Instant::now();
    s.kill();
    for p in pending {
        let r = t(p).await.unwrap();
        assert!(matches!(r, Err(CallError::Closed(_))), "{r:?}");
    }
    assert!(killed.elapsed() < Duration::from_secs(2), "took {:?} to notice", killed.elapsed());
    let r = t(c.call::<_, f64>("add", &(1, 2))).await;
    assert!(matches!(r, Err(CallError::Closed(_))), "{r:?}");
}
