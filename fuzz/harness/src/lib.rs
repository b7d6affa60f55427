//! The logic of ferry's fuzz targets: one function per target, each taking arbitrary bytes.
//!
//! The cargo-fuzz targets in `fuzz/fuzz_targets/` are one-line calls of these functions, and
//! `tests/replay.rs` runs every file of `fuzz/corpus/TARGET/` and `fuzz/regressions/TARGET/`
//! through them as a plain `cargo test`, so that CI replays the corpus and every crash found.
//!
//! Contract: no function here panics on any input. A panic (a failed assertion included) is
//! a finding: either ferry accepted something it must not, or it broke an invariant that
//! the function asserts (stated on each function).
//!
//! The functions drive ferry's real code: the frame reader and writer, the wire types, the
//! server's handshake over an in-memory connection, the JSON-RPC server's own request
//! parsing, and live channel sessions (shm with real memfds, cuda-ipc over its fake driver,
//! quic over a real QUIC connection). The quic target's connections are on loopback
//! (127.0.0.1); no other target does network I/O.
//!
//! # Feature flags
//! None. It turns on `ferry-rpc/fuzzing` for the server's private request parsing.
//!
//! # Platforms
//! Linux only (cargo-fuzz's libFuzzer runs there, and the shm target needs memfds): on
//! other targets the crate is empty.
#![forbid(unsafe_code)]
#![cfg(target_os = "linux")]

use std::cell::RefCell;
use std::future::Future;
use std::io::Cursor;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;

mod cuda;
mod desc;
mod frame;
mod handshake;
mod quic;
mod rpc;
mod shm;

pub use cuda::cuda_descriptor;
pub use desc::tensor_desc;
pub use frame::frame;
pub use handshake::handshake;
pub use quic::quic_descriptor;
pub use rpc::rpc_request;
pub use shm::shm_descriptor;

/// A target's function.
pub type Target = fn(&[u8]);

/// The fuzz targets by name (the names of `fuzz/fuzz_targets/*.rs`), for the replay test.
pub const TARGETS: &[(&str, Target)] = &[
    ("frame", frame),
    ("tensor_desc", tensor_desc),
    ("handshake", handshake),
    ("rpc_request", rpc_request),
    ("shm_descriptor", shm_descriptor),
    ("cuda_descriptor", cuda_descriptor),
    ("quic_descriptor", quic_descriptor),
];

thread_local! {
    static RT: RefCell<Option<tokio::runtime::Runtime>> = const { RefCell::new(None) };
}

/// Runs `f` on this thread's runtime (one current-thread runtime per thread, kept between
/// calls: building one per input would cost more than the input).
fn block_on<F: Future>(f: F) -> F::Output {
    RT.with(|rt| {
        let mut rt = rt.borrow_mut();
        let rt = rt.get_or_insert_with(|| {
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime")
        });
        rt.block_on(f)
    })
}

/// Lets the tasks that sessions and pipes spawned run to their end (they watch `closed`):
/// a current-thread runtime runs them only while a `block_on` future waits, and an input
/// whose future never waits would otherwise leave them, and what they hold, behind.
async fn settle() {
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
}

/// The bytes of `data`, as a reader that ends after them.
fn reader(data: &[u8]) -> Box<dyn tokio::io::AsyncRead + Send + Unpin> {
    Box::new(Cursor::new(data.to_vec()))
}

/// A writer whose bytes can be read back while it is owned elsewhere.
#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl Sink {
    fn bytes(&self) -> Vec<u8> {
        self.0.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

impl AsyncWrite for Sink {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        if let Ok(mut v) = self.0.lock() {
            v.extend_from_slice(buf);
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
