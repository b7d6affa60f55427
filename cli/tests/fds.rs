//! Descriptors a peer sends that no frame announces are closed, not parked: the server
//! holds at most a few frames' worth (4 x `max_fds`) per connection, closes the pipe of a
//! peer that sends more, and its descriptor count returns to where it was.
#![cfg(all(feature = "rpc", target_os = "linux"))]

mod common;

use std::io::{IoSlice, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::Duration;

use common::raw::{add_call_frame, add_works, handshaken};
use common::{Served, exe};
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

/// Sends an `add` call in a frame announcing no descriptors, with `fds` attached.
fn call_with_unannounced(s: &UnixStream, id: usize, fds: &[OwnedFd]) -> std::io::Result<()> {
    let frame = add_call_frame(id);
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
