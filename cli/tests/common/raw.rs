//! A raw client of `ferry serve` for tests that play a hostile peer: frames written by
//! hand over a unix socket, and the server process's memory as `/proc` reports it.

use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::Duration;

use ferry_core::frame::FrameKind;

/// A field of `/proc/PID/status` in KiB (`VmRSS`, `VmHWM`).
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The resident memory of process `pid`, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// `ferry call ADDR add [1, 2]` answers 3.0.
pub fn add_works(addr: &str) {
    let out = super::run(Command::new(super::exe()).args(["call", addr, "add", "[1, 2]"]), Duration::from_secs(60));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "3.0", "{}", String::from_utf8_lossy(&out.stderr));
}

pub use ferry_commands::raw_peer::frame_prefix;

/// A MESSAGE frame carrying an `add` call with this id.
pub fn add_call_frame(id: usize) -> Vec<u8> {
    let h = serde_json::to_vec(&serde_json::json!({
        "header": {"jsonrpc": "2.0", "method": "add", "params": [1, 2], "id": id}, "tensors": []
    }))
    .unwrap();
    let mut m = frame_prefix(FrameKind::Message, h.len() as u32, 0).to_vec();
    m.extend_from_slice(&h);
    m
}

/// A raw connection that completed the handshake (inline channel).
pub fn handshaken(addr: &str) -> UnixStream {
    ferry_commands::raw_peer::handshake(super::connect_abstract(addr), "raw-test-client").unwrap()
}
