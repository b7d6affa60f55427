//! Descriptors a peer sends that no frame announces are closed, not parked: the server
//! holds at most a few frames' worth (4 x `max_fds`) per connection, closes the pipe of a
//! peer that sends more, and its descriptor count returns to where it was.
#![cfg(all(feature = "rpc", target_os = "linux"))]

mod common;

use std::io::{IoSlice, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::Duration;

use common::{Served, exe, run};
use ferry_core::PROTOCOL_VERSION;
use ferry_core::frame::{FrameKind, FramePrefix, PREAMBLE_LEN, PREFIX_LEN, preamble};
use ferry_core::wire::PROTOCOL;
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

fn add_works(addr: &str) {
    let out = run(Command::new(exe()).args(["call", addr, "add", "[1, 2]"]), Duration::from_secs(60));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "3.0", "{}", String::from_utf8_lossy(&out.stderr));
}

fn prefix(kind: FrameKind, header_len: u32) -> [u8; PREFIX_LEN] {
    FramePrefix { kind: kind as u8, flags: 0, fds: 0, header_len, payload_len: 0 }.encode()
}

/// A raw ferry connection past the handshake, offering the shm channel (which passes
/// descriptors) so that the server reads descriptors on it.
fn handshaken(addr: &str) -> UnixStream {
    let mut s = common::connect_abstract(addr);
    s.write_all(&preamble(PROTOCOL_VERSION)).unwrap();
    let hello = serde_json::json!({
        "protocol": PROTOCOL, "version": PROTOCOL_VERSION,
        "channels": [{"name": "inline", "devices": ["cpu"]}], "agent": "fds-test",
    });
    let h = serde_json::to_vec(&hello).unwrap();
    s.write_all(&prefix(FrameKind::Hello, h.len() as u32)).unwrap();
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

/// Sends an `add` call in a frame announcing no descriptors, with `fds` attached.
fn call_with_unannounced(s: &UnixStream, id: usize, fds: &[OwnedFd]) -> std::io::Result<()> {
    let h = serde_json::to_vec(&serde_json::json!({
        "header": {"jsonrpc": "2.0", "method": "add", "params": [1, 2], "id": id}, "tensors": []
    }))
    .unwrap();
    let mut frame = prefix(FrameKind::Message, h.len() as u32).to_vec();
    frame.extend_from_slice(&h);
    let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
    let mut space = vec![std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(borrowed.len()))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    assert!(anc.push(SendAncillaryMessage::ScmRights(&borrowed)));
    let n = rustix::net::sendmsg(s, &[IoSlice::new(&frame)], &mut anc, SendFlags::empty())?;
    assert_eq!(n, frame.len(), "a short write");
    Ok(())
}

#[test]
fn unannounced_descriptors_are_closed_and_end_the_pipe() {
    let s = Served::start(false);
    add_works(&s.addr);
    let baseline = open_fds(s.pid());
    let c = handshaken(&s.addr);
    let null = std::fs::File::open("/dev/null").unwrap();
    let batch: Vec<OwnedFd> = (0..200).map(|_| OwnedFd::from(null.try_clone().unwrap())).collect();
    // 10 x 200 descriptors no frame announces: the server keeps at most 4 x 64 + 64 of
    // them, closes the rest as they arrive, and ends the pipe.
    let mut sent = 0;
    for id in 0..10 {
        if call_with_unannounced(&c, id, &batch).is_err() {
            break; // the server closed the connection already
        }
        sent += 1;
    }
    // The server answers what it read before, then closes: read to the end.
    let mut rest = Vec::new();
    let mut r = &c;
    let _ = r.read_to_end(&mut rest);
    let said = String::from_utf8_lossy(&rest);
    assert!(said.contains("no frame announced"), "{sent} batches sent; the server said: {said}");
    drop(c);
    // Every descriptor it received is closed.
    let mut now = open_fds(s.pid());
    for _ in 0..100 {
        if now <= baseline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        now = open_fds(s.pid());
    }
    assert!(now <= baseline, "the server holds {now} descriptors, {baseline} before");
    add_works(&s.addr);
}

#[test]
fn serve_raises_its_open_file_limit_to_the_hard_limit() {
    use std::io::BufRead;
    // Started with a soft limit of 1024 (the hard one as it is).
    let addr = format!("unix:ferry-fds-test-{}", std::process::id());
    let mut child = Command::new("sh")
        .args(["-c", "ulimit -Sn 1024 && exec \"$0\" serve \"$1\"", exe(), &addr])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with("listening on"), "{line}");
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.id())).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    // "Max open files  SOFT  HARD  files"
    let v: Vec<&str> = line.split_whitespace().collect();
    let (soft, hard) = (v[3], v[4]);
    // (Where the hard limit is 1024 itself, there is nothing to raise.)
    assert_eq!(soft, hard, "{line}");
}
