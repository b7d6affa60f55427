//! A raw ferry client for playing a hostile peer (the soak, and ferry-cli's tests): unix
//! connections to abstract addresses, frames written by hand, the handshake done by hand.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use anyhow::{Context, ensure};
use ferry_core::PROTOCOL_VERSION;
use ferry_core::frame::{FrameKind, FramePrefix, PREAMBLE_LEN, PREFIX_LEN, preamble};

/// A connection to the abstract unix socket of `addr` (`unix:NAME`), without timeouts.
pub fn connect_abstract(addr: &str) -> anyhow::Result<UnixStream> {
    use std::os::linux::net::SocketAddrExt;
    let name = addr.strip_prefix("unix:").context("a unix: address")?;
    let sa = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    UnixStream::connect_addr(&sa).with_context(|| format!("connecting to {addr}"))
}

/// A frame prefix (no descriptors).
pub fn frame_prefix(kind: FrameKind, header_len: u32, payload_len: u64) -> [u8; PREFIX_LEN] {
    FramePrefix { kind: kind as u8, flags: 0, fds: 0, header_len, payload_len }.encode()
}

/// Does the client's side of the handshake on `s` (inline channel only, announcing
/// `agent`) and returns it once WELCOMEd.
pub fn handshake(mut s: UnixStream, agent: &str) -> anyhow::Result<UnixStream> {
    s.write_all(&preamble(PROTOCOL_VERSION))?;
    let hello = serde_json::to_vec(&serde_json::json!({
        "protocol": ferry_core::wire::PROTOCOL, "version": PROTOCOL_VERSION,
        "channels": [{"name": "inline", "devices": ["cpu"]}], "agent": agent,
    }))?;
    s.write_all(&frame_prefix(FrameKind::Hello, hello.len() as u32, 0))?;
    s.write_all(&hello)?;
    let mut pre = [0u8; PREAMBLE_LEN];
    s.read_exact(&mut pre)?;
    let mut p = [0u8; PREFIX_LEN];
    s.read_exact(&mut p)?;
    let p = FramePrefix::decode(&p);
    ensure!(p.kind == FrameKind::Welcome as u8, "no WELCOME: the server did not accept the handshake");
    let mut rest = vec![0u8; p.header_len as usize + p.payload_len as usize];
    s.read_exact(&mut rest)?;
    Ok(s)
}
