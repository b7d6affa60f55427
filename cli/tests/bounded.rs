//! A hostile client costs `ferry serve` only memory for bytes it really sent: a frame that
//! announces gigabytes and sends a hundred bytes grows the server by less than 2 MiB, before
//! the handshake too, and other clients are served meanwhile.
#![cfg(all(feature = "rpc", target_os = "linux"))]

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::Served;
use common::raw::{add_works, frame_prefix, handshaken, rss_kib, status_kib};
use ferry_core::PROTOCOL_VERSION;
use ferry_core::frame::{FrameKind, PREAMBLE_LEN, PREFIX_LEN, preamble};

fn connect(addr: &str) -> UnixStream {
    common::connect_abstract(addr)
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
        // The server may have refused the prefix and closed already: this write may fail
        // (EPIPE), which is the point.
        let _ = c.write_all(&[b'{'; 10]);
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
    status_kib(pid, "VmHWM:")
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
