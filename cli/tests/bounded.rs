//! A hostile client costs `ferry serve` only memory for bytes it really sent: a frame that
//! announces gigabytes and sends a hundred bytes grows the server by less than 2 MiB, before
//! the handshake too, and other clients are served meanwhile.
#![cfg(all(feature = "rpc", target_os = "linux"))]

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::Duration;

use common::{Served, exe, run};
use ferry_core::PROTOCOL_VERSION;
use ferry_core::frame::{FrameKind, FramePrefix, PREAMBLE_LEN, PREFIX_LEN, preamble};
use ferry_core::wire::PROTOCOL;

/// The resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn connect(addr: &str) -> UnixStream {
    common::connect_abstract(addr)
}

fn frame_prefix(kind: FrameKind, header_len: u32, payload_len: u64) -> [u8; PREFIX_LEN] {
    FramePrefix { kind: kind as u8, flags: 0, fds: 0, header_len, payload_len }.encode()
}

/// A raw connection that completed the handshake (inline channel).
fn handshaken(addr: &str) -> UnixStream {
    let mut s = connect(addr);
    s.write_all(&preamble(PROTOCOL_VERSION)).unwrap();
    let hello = serde_json::json!({
        "protocol": PROTOCOL, "version": PROTOCOL_VERSION,
        "channels": [{"name": "inline", "devices": ["cpu"]}], "agent": "bounded-test",
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

fn add_works(addr: &str) {
    let out = run(Command::new(exe()).args(["call", addr, "add", "[1, 2]"]), Duration::from_secs(60));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "3.0", "{}", String::from_utf8_lossy(&out.stderr));
}

/// RSS after the server settles (it may still be reading what was sent).
fn settled_rss(pid: u32) -> u64 {
    std::thread::sleep(Duration::from_millis(300));
    rss_kib(pid)
}

#[test]
fn a_frame_claiming_gigabytes_costs_only_what_arrived() {
    let s = Served::start(false);
    add_works(&s.addr);
    let before = settled_rss(s.pid());
    // Two connections, each announcing a 4 GiB payload and sending 100 bytes of it.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut c = handshaken(&s.addr);
        let h = serde_json::to_vec(&serde_json::json!({"header": {"jsonrpc": "2.0"}, "tensors": []})).unwrap();
        c.write_all(&frame_prefix(FrameKind::Message, h.len() as u32, 4 << 30)).unwrap();
        c.write_all(&h).unwrap();
        c.write_all(&[7u8; 100]).unwrap();
        held.push(c);
    }
    let after = settled_rss(s.pid());
    // Other clients are served meanwhile.
    add_works(&s.addr);
    let grew = after.saturating_sub(before);
    eprintln!("two 4 GiB claims: server RSS {before} -> {after} KiB");
    assert!(grew < 2048, "two 4 GiB claims grew the server by {grew} KiB ({before} -> {after} KiB)");
    drop(held);
    add_works(&s.addr);
}

#[test]
fn before_the_handshake_frames_are_small() {
    let s = Served::start(false);
    add_works(&s.addr);
    let before = settled_rss(s.pid());
    // A HELLO announcing a 1 GiB header (and one announcing a payload) is refused at once.
    for (header_len, payload_len) in [(1u32 << 30, 0u64), (10, 4 << 30)] {
        let mut c = connect(&s.addr);
        c.write_all(&preamble(PROTOCOL_VERSION)).unwrap();
        c.write_all(&frame_prefix(FrameKind::Hello, header_len, payload_len)).unwrap();
        c.write_all(&[b'{'; 10]).unwrap();
        // The server answers with its preamble, then closes without reading more.
        let mut got = Vec::new();
        let _ = c.read_to_end(&mut got);
        assert!(got.len() <= PREAMBLE_LEN + PREFIX_LEN + 4096, "the server answered {} bytes", got.len());
    }
    let after = settled_rss(s.pid());
    let grew = after.saturating_sub(before);
    eprintln!("oversized handshake frames: server RSS {before} -> {after} KiB");
    assert!(grew < 2048, "oversized handshake frames grew the server by {grew} KiB");
    add_works(&s.addr);
}

/// The peak resident memory of process `pid` so far, in KiB.
fn peak_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_huge_flat_request_is_refused_before_it_is_parsed() {
    let s = Served::start(false);
    add_works(&s.addr);
    let before = peak_kib(s.pid());
    // 63 MiB of `[0,0,...]` on one plain JSON line: parsed into values it took a gigabyte.
    let n = 63 << 20;
    let mut line = Vec::with_capacity(n + 2);
    line.push(b'[');
    while line.len() < n - 2 {
        line.extend_from_slice(b"0,");
    }
    line.extend_from_slice(b"0]\n");
    let mut c = connect(&s.addr);
    c.write_all(&line).unwrap();
    let mut answer = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(&mut c), &mut answer).unwrap();
    assert!(answer.contains("max_batch"), "{answer}");
    let peak = peak_kib(s.pid());
    let grew = peak.saturating_sub(before);
    eprintln!(
        "a 63 MiB [0,0,...] line: peak RSS {before} -> {peak} KiB (+{grew} KiB, {:.2}x the line)",
        grew as f64 * 1024.0 / n as f64
    );
    assert!(grew * 1024 <= 3 * n as u64, "a 63 MiB line raised the peak by {grew} KiB");
    add_works(&s.addr);
}
