//! Named pipes on Windows (run under Wine on Linux): the listener's DACL names the current
//! user alone (or adds authenticated users with `allow_any_user`), connections know their
//! peer's process, and addresses take the pipe forms.
#![cfg(windows)]

use std::time::Duration;

use ferry_core::{Address, Transport};
use ferry_local::{LocalTransport, listener_dacl, pipe_security};

async fn t<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f).await.expect("timed out")
}

fn addr(s: &str) -> Address {
    s.parse().unwrap()
}

fn unique(tag: &str) -> String {
    format!("ferry-local-win-{tag}-{}", std::process::id())
}

/// Wine maps drive Z: to the unix root.
fn under_wine() -> bool {
    std::path::Path::new(r"Z:\proc\self").exists()
}

/// The ACEs of the DACL part of an SDDL string.
fn aces(sddl: &str) -> Vec<String> {
    let dacl = &sddl[sddl.find("D:").expect("a DACL") + 2..];
    assert!(dacl.starts_with('P'), "the DACL is not protected: {sddl}");
    dacl.split('(').skip(1).map(|a| a.trim_end_matches(')').to_owned()).collect()
}

/// The SID of the user this process runs as, from the DACL its listeners get.
fn me() -> String {
    let d = listener_dacl(false).unwrap();
    d[d.rfind(";;;").unwrap() + 3..].trim_end_matches(')').to_owned()
}

#[tokio::test]
async fn a_listeners_pipe_grants_the_current_user_alone() {
    let a = addr(&format!("unix:{}", unique("dacl")));
    let tr = LocalTransport::new();
    let mut l = t(tr.listen(&a)).await.unwrap();
    let accept = tokio::spawn(async move { l.accept().await.map(|_| ()) });
    let sddl = t(pipe_security(&a)).await.unwrap();
    let aces = aces(&sddl);
    assert_eq!(aces.len(), 1, "{sddl}");
    assert!(aces[0].starts_with("A;;") && aces[0].ends_with(&format!(";;;{}", me())), "{sddl}");
    drop(accept);
}

#[tokio::test]
async fn allow_any_user_adds_authenticated_users() {
    let a = addr(&format!("unix:{}", unique("any")));
    let tr = LocalTransport::new().allow_any_user(true);
    let mut l = t(tr.listen(&a)).await.unwrap();
    let accept = tokio::spawn(async move { l.accept().await.map(|_| ()) });
    let sddl = t(pipe_security(&a)).await.unwrap();
    let aces = aces(&sddl);
    assert_eq!(aces.len(), 2, "{sddl}");
    // Read and write, but not FILE_CREATE_PIPE_INSTANCE (0x4): no other user may add
    // server instances to the pipe.
    let au = aces.iter().find(|a| a.ends_with(";;;AU")).unwrap_or_else(|| panic!("no AU ace: {sddl}"));
    let mask = au.split(';').nth(2).unwrap();
    let mask = u32::from_str_radix(mask.trim_start_matches("0x"), 16).unwrap_or_else(|_| panic!("{sddl}"));
    assert_eq!(mask & 0x4, 0, "authenticated users may create pipe instances: {sddl}");
    assert_eq!(mask & 0x3, 0x3, "authenticated users cannot read and write: {sddl}");
    drop(accept);
}

#[tokio::test]
async fn both_ends_know_the_peer_process_and_user() {
    // The short name and the full pipe path name the same pipe.
    let name = unique("peer");
    let tr = LocalTransport::new();
    let mut l = t(tr.listen(&addr(&format!("unix:{name}")))).await.unwrap();
    let full = addr(&format!(r"unix:\\.\pipe\{name}"));
    let (c, s) = t(async { tokio::join!(tr.connect(&full), l.accept()) }).await;
    let (c, s) = (c.unwrap(), s.unwrap());
    for info in [c.info(), s.info()] {
        assert_eq!(info.peer_pid, Some(std::process::id()));
        assert!(!info.fd_passing && info.same_host);
    }
    // One user, one number: what a server keeps per user (tasks, references) is shared by
    // that user's connections.
    assert!(c.info().peer_uid.is_some());
    assert_eq!(c.info().peer_uid, s.info().peer_uid);
}

#[tokio::test]
async fn addresses_in_use_and_socket_files_are_told_apart() {
    let a = addr(&format!("unix:{}", unique("inuse")));
    let tr = LocalTransport::new();
    let _l = t(tr.listen(&a)).await.unwrap();
    if under_wine() {
        // Wine 8 ignores FILE_FLAG_FIRST_PIPE_INSTANCE: a second listener gets a second
        // instance of the same pipe. Windows refuses it (ACCESS_DENIED, "in use").
        eprintln!("under Wine: not checking that a second listener is refused");
    } else {
        let e = t(tr.listen(&a)).await.err().expect("a second listener on one pipe name");
        assert!(e.to_string().contains("in use"), "{e}");
    }
    let e = t(tr.connect(&addr(&format!("unix:{}", unique("nobody"))))).await.err().expect("nobody listens");
    assert!(e.to_string().contains("nothing is listening"), "{e}");
    let e = t(tr.listen(&addr("unix:/tmp/x.sock"))).await.err().expect("a socket file on Windows");
    assert!(e.to_string().contains(r"unix:\\.\pipe\NAME"), "{e}");
}
