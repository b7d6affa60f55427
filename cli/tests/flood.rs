//! A client that sends calls and never reads the answers cannot grow `ferry serve`: every
//! answer counts against a per-connection bound (`max_queued_answers`,
//! `max_queued_answer_bytes`), and once it is full the server stops reading that
//! connection, so the flood stalls in the client's own writes. Over ferry frames and plain
//! JSON lines, with another client served meanwhile, and the memory given back once the
//! flooding client is gone.
#![cfg(all(feature = "rpc", target_os = "linux"))]

mod common;

use std::io::{ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::Served;
use common::raw::{add_call_frame, add_works, handshaken, rss_kib};

/// Messages a flood sends at most (the server stops reading long before, when it works;
/// the socket buffers hold a few hundred kilobytes).
const FLOOD: usize = 400_000;
/// RSS growth allowed during and after the flood (the target: the bound + 64 MiB
/// during, within 64 MiB of idle after).
const SLACK_KIB: u64 = 64 * 1024;

fn settled_rss(pid: u32) -> u64 {
    std::thread::sleep(Duration::from_millis(500));
    rss_kib(pid)
}

/// Writes `message(i)` for i in 0..FLOOD until a write stalls for a second (the server
/// stopped reading); returns how many went out whole.
fn flood(s: &mut UnixStream, message: impl Fn(usize) -> Vec<u8>) -> usize {
    s.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
    for i in 0..FLOOD {
        match s.write_all(&message(i)) {
            Ok(()) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return i,
            Err(e) => panic!("flood write {i}: {e}"),
        }
    }
    FLOOD
}

/// After one call (a plain JSON connection is told by its first byte), a valid JSON text
/// that is no request: each is answered with an error.
fn not_a_request(i: usize) -> Vec<u8> {
    if i == 0 { json_call(0) } else { b"1\n".to_vec() }
}

fn json_call(i: usize) -> Vec<u8> {
    format!("{{\"jsonrpc\":\"2.0\",\"method\":\"add\",\"params\":[1,2],\"id\":{i}}}\n").into_bytes()
}

/// Floods one connection made by `open`, checks the server's memory during and after.
fn bounded_flood(what: &str, open: impl Fn(&str) -> UnixStream, message: fn(usize) -> Vec<u8>) {
    let s = Served::start(false);
    add_works(&s.addr);
    let idle = settled_rss(s.pid());
    let mut c = open(&s.addr);
    let sent = flood(&mut c, message);
    let during = settled_rss(s.pid());
    // Another client is served while the flood is held.
    add_works(&s.addr);
    eprintln!(
        "{what}: {sent} calls written before the server stopped reading; RSS idle {idle} KiB, flooded {during} KiB"
    );
    assert!(sent < FLOOD, "{what}: the server read all {FLOOD} calls without their answers being read");
    assert!(during.saturating_sub(idle) < SLACK_KIB, "{what}: the flood grew the server {idle} -> {during} KiB");
    drop(c);
    let after = settled_rss(s.pid());
    eprintln!("{what}: RSS after the client left {after} KiB");
    assert!(after.saturating_sub(idle) < SLACK_KIB, "{what}: RSS {idle} -> {after} KiB after the flood ended");
    add_works(&s.addr);
}

#[test]
fn a_ferry_client_that_never_reads_cannot_grow_the_server() {
    bounded_flood("ferry frames", handshaken, add_call_frame);
}

#[test]
fn a_plain_json_client_that_never_reads_cannot_grow_the_server() {
    bounded_flood("plain JSON", common::connect_abstract, json_call);
}

#[test]
fn error_answers_count_too() {
    bounded_flood("plain JSON `1` lines", common::connect_abstract, not_a_request);
}
