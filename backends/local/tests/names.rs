//! Addresses in use: a stale socket file is reclaimed, a live listener is never disturbed
//! and is named (pid, uid) in the error, for socket files and abstract names.
#![cfg(target_os = "linux")]

use std::time::Duration;

use ferry_core::{Address, Transport, TransportError};
use ferry_local::LocalTransport;

async fn t<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f).await.expect("timed out")
}

fn addr(s: &str) -> Address {
    s.parse().unwrap()
}

fn holder_named(e: &TransportError) {
    let text = e.to_string();
    let me = format!("pid {}, uid {}", std::process::id(), rustix::process::geteuid().as_raw());
    assert!(text.contains("another process listens there") && text.contains(&me), "{text}");
}

#[tokio::test]
async fn a_stale_socket_file_is_reclaimed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    // A server that died without removing its socket file (std's listener leaves it).
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let a = addr(&format!("unix:{}", path.display()));
    let tr = LocalTransport::new();
    let mut l = t(tr.listen(&a)).await.expect("a stale socket file must not block a restart");
    let (c, s) = tokio::join!(tr.connect(&a), l.accept());
    c.unwrap();
    s.unwrap();
}

#[tokio::test]
async fn a_live_socket_file_is_left_alone_and_its_holder_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    let a = addr(&format!("unix:{}", path.display()));
    let tr = LocalTransport::new();
    let mut l = t(tr.listen(&a)).await.unwrap();
    let e = t(tr.listen(&a)).await.err().expect("a second listener on a live address");
    holder_named(&e);
    // The first one still serves.
    let (c, s) = tokio::join!(tr.connect(&a), l.accept());
    c.unwrap();
    s.unwrap();
}

#[tokio::test]
async fn a_plain_file_is_never_removed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("not-a-socket");
    std::fs::write(&path, b"precious").unwrap();
    let a = addr(&format!("unix:{}", path.display()));
    assert!(t(LocalTransport::new().listen(&a)).await.is_err());
    assert_eq!(std::fs::read(&path).unwrap(), b"precious");
}

#[tokio::test]
async fn a_taken_abstract_name_names_its_holder() {
    let a = addr(&format!("unix:ferry-names-test-{}", std::process::id()));
    let tr = LocalTransport::new();
    let _l = t(tr.listen(&a)).await.unwrap();
    let e = t(tr.listen(&a)).await.err().expect("a second listener on a live name");
    holder_named(&e);
}
