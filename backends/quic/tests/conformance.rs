//! The conformance suite over QUIC (loopback) with the stream channel. Liveness is tuned so
//! that a killed peer is noticed within the suite's one second (idle timeout 700 ms).

use std::sync::Arc;
use std::time::Duration;

use ferry_conformance::Fixture;
use ferry_core::{Channel, InlineChannel, Transport};
use ferry_quic::{IdentitySource, QuicChannel, QuicOptions, QuicTransport};

#[derive(Default)]
struct Quic;

fn identity_file() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("ferry-quic-conformance-identity.pem")
}

fn transport() -> QuicTransport {
    QuicTransport::with_options(QuicOptions {
        identity: IdentitySource::File(identity_file()),
        keep_alive: Duration::from_millis(150),
        idle_timeout: Duration::from_millis(700),
        handshake_timeout: Duration::from_secs(2),
        ..QuicOptions::default()
    })
}

impl Fixture for Quic {
    const NAME: &'static str = "quic";

    fn transport(&self) -> Arc<dyn Transport> {
        Arc::new(transport())
    }

    fn channels(&self) -> Vec<Arc<dyn Channel>> {
        vec![Arc::new(QuicChannel::new()), Arc::new(InlineChannel)]
    }

    fn addr(&self, _tag: &str) -> String {
        // A free UDP port (the suite needs the address before the server starts).
        let port = std::net::UdpSocket::bind("127.0.0.1:0").and_then(|s| s.local_addr()).map(|a| a.port()).unwrap_or(0);
        let fp = transport().fingerprint().unwrap_or_default();
        format!("quic://127.0.0.1:{port}#sha256={fp}")
    }
}

fn main() -> std::process::ExitCode {
    ferry_conformance::main::<Quic>()
}
