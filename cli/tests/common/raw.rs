//! A raw client of `ferry serve` for tests that play a hostile peer: frames written by
//! hand over a unix socket, and the server process's memory as `/proc` reports it.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::Duration;

use ferry_core::PROTOCOL_VERSION;
use ferry_core::frame::{FrameKind, FramePrefix, PREAMBLE_LEN, PREFIX_LEN, preamble};
use ferry_core::wire::PROTOCOL;

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

/// A frame prefix (no descriptors).
pub fn frame_prefix(kind: FrameKind, header_len: u32, payload_len: u64) -> [u8; PREFIX_LEN] {
    FramePrefix { kind: kind as u8, flags: 0, fds: 0, header_len, payload_len }.encode()
}

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
    let mut s = super::connect_abstract(addr);
    s.write_all(&preamble(PROTOCOL_VERSION)).unwrap();
    let hello = serde_json::json!({
        "protocol": PROTOCOL, "version": PROTOCOL_VERSION,
        "channels": [{"name": "inline", "devices": ["cpu"]}], "agent": "raw-test-client",
    });
    let h = serde_json::to_vec(&hello).unwrap();
    s.write_all(&frame_prefix(FrameKind::Hello, h.len() as u32, 0)).unwrap();
    s.write_all(&h).unwrap();
    let mut pre = [0u8; PREAMBLE_LEN];
    s.read_exact(&mut pre).unwrap();
    let mut p = [0u8; PREFIX_LEN];
    s.read_exact(&mut p).unwrap();
    let p = FramePrefix::decode(&p);
    assert_eq!(p.kind, FrameKind::Welcome as u8, "no WELCOME");
    let mut rest = vec![0u8; p.header_len as usize + p.payload_len as usize];
    s.read_exact(&mut rest).unwrap();
    s
}
