//! Liveness of QUIC pipes (issue 45 point 6): a busy sender does not starve its own
//! connection, and a connection that does die of silence says which option decided it.
//!
//! quinn buffers a write and returns at once while the flow-control window has room, so a
//! task sending many small messages never meets a `Pending`. Before the frame stream's halves
//! spent tokio's cooperative budget, such a task ran all its sends in one poll; the
//! connection's driver, woken by those writes into the same worker's LIFO slot (which other
//! workers cannot steal from), sent nothing for as long as that poll lasted, keep-alives
//! included, and once that passed the idle timeout the peer dropped the connection: the
//! sender's `recv` read `pipe closed` (seen as `data::order_10k` failing in the conformance
//! suite beside CPU burners).

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_core::{Endpoint, InlineChannel, Message, Tensor};
use ferry_quic::{IdentitySource, QuicChannel, QuicOptions, QuicTransport};
use serde_json::json;

/// Messages the busy task sends.
const SENDS: u64 = 4000;
/// Blocking work after each send: all of it, in one poll, is 2 s, twice the idle timeout.
const WORK: Duration = Duration::from_micros(500);
/// Generous bound for anything that should happen (never reached when all is well).
const T: Duration = Duration::from_secs(60);

fn options() -> QuicOptions {
    QuicOptions {
        identity: IdentitySource::Ephemeral,
        keep_alive: Duration::from_millis(200),
        idle_timeout: Duration::from_secs(1),
        ..QuicOptions::default()
    }
}

fn endpoint() -> Endpoint {
    endpoint_with(options())
}

fn endpoint_with(opts: QuicOptions) -> Endpoint {
    Endpoint::builder()
        .transport(Arc::new(QuicTransport::with_options(opts)))
        .channel(Arc::new(QuicChannel::new()))
        .channel(Arc::new(InlineChannel))
        .build()
}

/// An echo server on its own runtime in its own thread, as the conformance suite's thread
/// peers run; it stops when `stop` fires.
fn echo_server(addr_tx: std::sync::mpsc::Sender<String>, stop: tokio::sync::oneshot::Receiver<()>) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    rt.block_on(async move {
        let mut listener = endpoint().listen("quic://127.0.0.1:0").await.unwrap();
        addr_tx.send(listener.local_addr().to_string()).unwrap();
        let serve = async {
            while let Ok(pipe) = listener.accept().await {
                tokio::spawn(async move {
                    while let Ok(m) = pipe.recv().await {
                        if pipe.send(m).await.is_err() {
                            break;
                        }
                    }
                });
            }
        };
        tokio::select! {
            () = serve => {}
            _ = stop => {}
        }
    });
}

/// Each send is followed by a little blocking work, standing in for a slow or starved CPU,
/// so that one poll of all the sends would last twice the idle timeout. Asserted is what
/// must hold whatever the speed: every message comes back, in order, and the pipe stays open.
#[test]
fn a_sender_that_never_waits_does_not_starve_its_connection() {
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let server = std::thread::spawn(move || echo_server(addr_tx, stop_rx));
    let addr = addr_rx.recv_timeout(T).expect("the echo server listens");

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let pipe = Arc::new(endpoint().connect(&addr).await.unwrap());
        let sender = {
            let pipe = pipe.clone();
            tokio::spawn(async move {
                for i in 0..SENDS {
                    let t = Tensor::from_slice(vec![2], &[i, !i]).unwrap();
                    pipe.send(Message::with_tensors(json!({"seq": i}), vec![t])).await?;
                    // Blocking on purpose: the CPU time a real sender spends between sends,
                    // stretched so that a sender that never yields outlives the idle timeout.
                    std::thread::sleep(WORK);
                }
                Ok::<(), ferry_core::PipeError>(())
            })
        };
        for i in 0..SENDS {
            let m = pipe
                .recv_timeout(T)
                .await
                .unwrap_or_else(|e| panic!("message {i} of {SENDS} did not come back: {e} (connection starved?)"));
            assert_eq!(m.header, json!({"seq": i}), "message {i} out of order");
            let v = m.tensors.first().and_then(|t| t.as_slice::<u64>().ok()).unwrap_or(&[]);
            assert_eq!(v, [i, !i], "message {i} carries the wrong tensor");
        }
        sender.await.unwrap().unwrap();
        assert!(!pipe.is_closed(), "the pipe closed although both sides were alive");
    });
    let _ = stop_tx.send(());
    server.join().unwrap();
}

/// A `MakeWriter` collecting everything the subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(buf);
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

/// The peer completes the handshake and then falls silent (its only thread blocked until
/// the test ends, so not even a keep-alive leaves it): this side's `recv` ends with `Closed`
/// and the log names the option that decided it, with this side's value.
#[test]
fn a_connection_that_times_out_names_idle_timeout_in_the_log() {
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let peer = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let mut listener = endpoint().listen("quic://127.0.0.1:0").await.unwrap();
            addr_tx.send(listener.local_addr().to_string()).unwrap();
            let _pipe = listener.accept().await.unwrap();
            // Blocks the runtime's only thread: nothing of this peer runs until released.
            let _ = release_rx.recv_timeout(T);
        });
    });
    let addr = addr_rx.recv_timeout(T).expect("the peer listens");

    let out = Captured::default();
    let sub = tracing_subscriber::fmt().with_writer(out.clone()).with_ansi(false).finish();
    let _guard = tracing::subscriber::set_default(sub);
    // One thread for this side, so every event of its pipe reaches the subscriber above.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let idle = Duration::from_millis(300);
    let r = rt.block_on(async {
        let opts = QuicOptions { keep_alive: Duration::from_millis(100), idle_timeout: idle, ..options() };
        let pipe = endpoint_with(opts).connect(&addr).await.unwrap();
        pipe.recv_timeout(T).await
    });
    let _ = release_tx.send(());
    peer.join().unwrap();
    assert!(matches!(&r, Err(e) if e.is_closed()), "recv from a silent peer gave {r:?}");
    let log = String::from_utf8(out.0.lock().unwrap_or_else(|e| e.into_inner()).clone()).unwrap();
    assert!(
        log.contains("QuicOptions::idle_timeout") && log.contains(&format!("{idle:?}")),
        "the log does not name the idle timeout and its value:\n{log}"
    );
}
