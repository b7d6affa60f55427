//! Peer-supplied strings reach the log escaped ([`ferry_core::logsafe`]): a client whose
//! agent name holds a newline and an ANSI escape, over the in-memory transport, leaves one
//! log line per event with the name's control characters shown as escapes.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_core::frame::{FrameKind, FrameWriter, OutFrame};
use ferry_core::handshake::client_hello;
use ferry_core::mem::MemTransport;
use ferry_core::transport::{Address, ConnInfo, Split, Transport};
use ferry_core::{Endpoint, InlineChannel, Limits, PROTOCOL_VERSION};

const T: Duration = Duration::from_secs(10);
const EVIL: &str = "evil\n2099-01-01T00:00:00Z  WARN FORGED line\x1b[31m red\x1b[0m";
const SHOWN: &str = "evil\\n2099-01-01T00:00:00Z  WARN FORGED line\\u{1b}[31m red\\u{1b}[0m";

/// A `MakeWriter` collecting everything the subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// Sends a HELLO whose agent is [`EVIL`] to `addr` (with `token`), as a client built by
/// hand would, and returns once the listener reported the connection.
async fn hello_from_evil(addr: &str, token: Option<&str>, server: &mut ferry_core::PipeListener) {
    let a: Address = addr.parse().unwrap();
    let conn = MemTransport::new().connect(&a).await.unwrap();
    let info = ConnInfo { transport: "mem", addr: addr.into(), same_host: true, ..ConnInfo::default() };
    let Split { write, read, .. } = conn.split();
    let mut hello =
        client_hello(&[Arc::new(InlineChannel)], &info, PROTOCOL_VERSION, token.map(Into::into), Limits::default());
    hello.agent = EVIL.into();
    let mut w = FrameWriter::new(write, None);
    w.write_preamble(PROTOCOL_VERSION).await.unwrap();
    w.write_frame(FrameKind::Hello, OutFrame::json(&hello)).await.unwrap();
    let _ = tokio::time::timeout(T, server.accept()).await.unwrap();
    drop((w, read));
}

fn assert_escaped(log: &str, event: &str) {
    assert!(log.contains(event), "no {event:?} event in:\n{log}");
    assert!(log.contains(SHOWN), "the agent is not shown escaped:\n{log}");
    assert!(!log.contains('\x1b'), "an ANSI escape reached the log:\n{log:?}");
    assert!(!log.lines().any(|l| l.starts_with("2099-01-01")), "the agent forged a log line:\n{log}");
    assert_eq!(log.lines().count(), log.matches(event).count(), "one line per event:\n{log}");
}

#[tokio::test]
async fn an_accepted_clients_agent_name_is_logged_escaped() {
    let out = Captured::default();
    let sub = tracing_subscriber::fmt()
        .with_writer(out.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    let _guard = tracing::subscriber::set_default(sub);
    let addr = format!("mem:log-escape-a-{}", std::process::id());
    let ep = Endpoint::builder().transport(Arc::new(MemTransport::new())).channel(Arc::new(InlineChannel)).build();
    let mut l = ep.listen(&addr).await.unwrap();
    hello_from_evil(&addr, None, &mut l).await;
    let log = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    assert_escaped(&log, "accepted");
}

#[tokio::test]
async fn a_refused_clients_agent_name_is_logged_escaped() {
    let out = Captured::default();
    let sub = tracing_subscriber::fmt()
        .with_writer(out.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let _guard = tracing::subscriber::set_default(sub);
    let addr = format!("mem:log-escape-r-{}", std::process::id());
    let ep = Endpoint::builder()
        .transport(Arc::new(MemTransport::new()))
        .channel(Arc::new(InlineChannel))
        .require_token("s3cret")
        .build();
    let mut l = ep.listen(&addr).await.unwrap();
    hello_from_evil(&addr, Some("wrong"), &mut l).await;
    let log = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    assert_escaped(&log, "refusing handshake");
}
