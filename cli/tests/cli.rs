//! The command line as a newcomer meets it: params from a file or stdin, errors that say
//! what happened and what to do.
#![cfg(feature = "rpc")]

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Served, exe, run};

fn stderr_of(args: &[&str]) -> String {
    let out = run(Command::new(exe()).args(args), Duration::from_secs(60));
    assert!(!out.status.success(), "{args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn call_takes_params_from_a_file_or_stdin() {
    let s = Served::start(false);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("params.json");
    std::fs::write(&file, r#"{"a": 40, "b": 2}"#).unwrap();
    let out = run(
        Command::new(exe()).args(["call", &s.addr, "add", &format!("@{}", file.display())]),
        Duration::from_secs(60),
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "42.0", "{}", String::from_utf8_lossy(&out.stderr));
    let mut child = Command::new(exe())
        .args(["call", &s.addr, "add", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"[1.5, 2]\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "3.5", "{}", String::from_utf8_lossy(&out.stderr));
    let err = stderr_of(&["call", &s.addr, "add", "@/nonexistent/params.json"]);
    assert!(err.contains("reading params from /nonexistent/params.json"), "{err}");
}

#[test]
fn in_use_nothing_listening_and_bad_address_are_told_apart() {
    let s = Served::start(false);
    // Wine 8 (where the Windows build is tested) ignores FILE_FLAG_FIRST_PIPE_INSTANCE, so a
    // second server there gets a second instance of the pipe; Windows refuses it. Wine maps
    // drive Z: to the unix root.
    if cfg!(windows) && std::path::Path::new(r"Z:\proc\self").exists() {
        eprintln!("under Wine: not checking that a second server on one pipe is refused");
    } else {
        let err = stderr_of(&["serve", &s.addr]);
        assert!(err.contains("address already in use"), "{err}");
    }
    let err = stderr_of(&["call", "unix:ferry-cli-test-nobody-here", "add", "[1, 2]"]);
    assert!(err.contains("nothing is listening at unix:ferry-cli-test-nobody-here"), "{err}");
    assert!(!err.contains("bad address"), "{err}");
    let err = stderr_of(&["call", "tcp://127.0.0.1:1", "add", "[1, 2]"]);
    assert!(err.contains("bad address") || err.contains("no transport"), "{err}");
}

#[test]
// The shm channel exists on Linux only.
#[cfg(target_os = "linux")]
fn a_full_shm_pool_names_the_serve_option() {
    let s = Served::start_with(&["--shm-pool-mib", "2"]);
    let err = stderr_of(&["call", &s.addr, "create_tensor", r#"{"shape": [2097152, 2], "dtype": "u8"}"#]);
    assert!(err.contains("--shm-pool-mib"), "{err}");
    // Small results still work.
    let out = run(
        Command::new(exe()).args(["call", &s.addr, "create_tensor", r#"{"shape": [4], "dtype": "u8"}"#]),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let err = stderr_of(&["serve", "unix:ferry-cli-test-small-pool", "--shm-pool-mib", "1"]);
    assert!(err.contains("--shm-pool-mib 1") && err.contains("at least 2 MiB"), "{err}");
}

#[test]
// Holds the place with a raw connection to an abstract (Linux) socket name.
#[cfg(target_os = "linux")]
fn connections_over_max_connections_are_refused_by_name() {
    let s = Served::start_with(&["--max-connections", "1"]);
    // One plain JSON connection holds the only place.
    let mut held = common::connect_abstract(&s.addr);
    held.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"add\",\"params\":[1,2],\"id\":1}\n").unwrap();
    let mut answer = [0u8; 16];
    std::io::Read::read(&mut held, &mut answer).unwrap();
    let err = stderr_of(&["call", &s.addr, "add", "[1, 2]"]);
    assert!(err.contains("max_connections = 1") && err.contains("--max-connections"), "{err}");
    drop(held);
}

#[test]
fn a_device_tier_without_placement_or_a_gpu_is_refused_by_name() {
    let err = stderr_of(&["serve-weights", "--name", "m", "--cuda-budget-mib", "64"]);
    assert!(err.contains("--cuda-budget-mib need --placement POLICY"), "{err}");
    if cfg!(feature = "cuda-ipc") && std::path::Path::new("/proc/driver/nvidia").exists() {
        eprintln!("an NVIDIA driver is here: the device tier would start; not checking its refusal");
        return;
    }
    let err = stderr_of(&[
        "serve-weights",
        "--name",
        "m",
        "--placement",
        "lru",
        "--cuda-budget-mib",
        "64",
        "--addr",
        "unix:ferry-cli-test-device-tier",
    ]);
    // This machine has no GPU: built with cuda-ipc, the tier says why it cannot start;
    // without it, which feature it needs.
    if cfg!(feature = "cuda-ipc") {
        assert!(err.contains("--cuda-budget-mib: the device tier on cuda:0:"), "{err}");
    } else {
        assert!(err.contains("needs ferry built with the `cuda-ipc` feature"), "{err}");
    }
}

#[test]
fn info_lists_the_same_host_ring() {
    let out = run(Command::new(exe()).arg("info"), Duration::from_secs(60));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    if cfg!(all(feature = "ring", target_os = "linux")) {
        assert!(text.contains("same-host ring: ring ("), "{text}");
    } else {
        assert!(text.contains("same-host ring: not compiled in"), "{text}");
    }
}

#[test]
fn serve_and_serve_weights_take_the_address_the_same_two_ways() {
    let n = std::process::id();
    // Positional, as `ferry serve ADDR`.
    let addr = format!("unix:ferry-cli-test-weights-pos-{n}");
    let s = Served::start_command(&["serve-weights", &addr, "--name", "m"], &addr);
    let out = run(Command::new(exe()).args(["call", &s.addr, "store.list", "{}"]), Duration::from_secs(60));
    assert!(out.status.success(), "store.list at {addr}: {}", String::from_utf8_lossy(&out.stderr));
    drop(s);
    // As a flag, both.
    let addr = format!("unix:ferry-cli-test-weights-flag-{n}");
    drop(Served::start_command(&["serve-weights", "--addr", &addr, "--name", "m"], &addr));
    let addr = format!("unix:ferry-cli-test-serve-flag-{n}");
    let s = Served::start_command(&["serve", "--addr", &addr], &addr);
    let out = run(Command::new(exe()).args(["call", &addr, "add", "[1, 2]"]), Duration::from_secs(60));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "3.0", "{}", String::from_utf8_lossy(&out.stderr));
    drop(s);
    // Two addresses, or an address after a file, are refused saying what to write.
    let err = stderr_of(&["serve-weights", "unix:a", "--addr", "unix:b", "--name", "m"]);
    assert!(err.contains("two addresses: unix:a and --addr unix:b"), "{err}");
    let err = stderr_of(&["serve-weights", "/nonexistent/w.safetensors", "unix:late", "--name", "m"]);
    assert!(err.contains("unix:late looks like an address") && err.contains("give the address first"), "{err}");
    let err = stderr_of(&["serve", "unix:a", "--addr", "unix:b"]);
    assert!(err.contains("--addr") && err.contains("cannot be used with"), "{err}");
}
