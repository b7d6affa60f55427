//! ferry-quic: tensors and RPC across hosts over QUIC (quinn), encrypted and authenticated.
//!
//! - [`QuicTransport`] (scheme `quic`, addresses `quic://host:port[#sha256=FINGERPRINT]`):
//!   one QUIC connection per pipe; its first bidirectional stream carries ferry's frames.
//!   TLS 1.3 only, rustls with the ring provider only, ALPN `ferry/1`.
//! - Identity: the server makes a self-signed certificate on first start (rcgen) and keeps
//!   it in a file (mode 0600; [`QuicOptions::identity`], by default
//!   `~/.config/ferry/quic-identity.pem`). Its listener's address carries the SHA-256
//!   fingerprint, which clients pin (`#sha256=...`), or clients trust a CA bundle
//!   ([`QuicOptions::ca_bundle`]). A bearer token is checked by the ferry handshake
//!   (`EndpointBuilder::require_token` / `token`).
//! - Liveness: keep-alives and an idle timeout ([`QuicOptions::keep_alive`],
//!   [`QuicOptions::idle_timeout`]): a peer that vanishes without a word is noticed within
//!   the idle timeout, and pending operations fail with `Closed` (a warning names the
//!   option). The frame stream spends tokio's cooperative budget like tokio's own sockets,
//!   so a task that sends without ever waiting still lets the connection's keep-alives out.
//! - [`QuicChannel`] (name `quic`): each tensor on its own unidirectional stream, in
//!   parallel, with flow-control windows sized for throughput ([`QuicOptions`]).
//!
//! Entry point: register [`QuicTransport`] and [`QuicChannel`] in an
//! [`ferry_core::Endpoint`] (the `ferry` facade does, with feature `quic`).
//!
//! # Feature flags
//! None.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::time::Duration;

pub mod baseline;
mod channel;
mod recv_buf;
pub mod tls;
mod transport;

pub use channel::{QuicChannel, StreamOptions};
pub use transport::{QuicAddr, QuicConn, QuicTransport};

/// Where the server's identity comes from.
#[derive(Debug, Clone, Default)]
pub enum IdentitySource {
    /// The per-user default file (see [`tls::default_identity_path`]).
    #[default]
    Default,
    /// This file (created, mode 0600, when missing).
    File(PathBuf),
    /// A fresh identity in memory, never stored (tests, one-off servers).
    Ephemeral,
}

/// Options of the QUIC transport.
#[derive(Debug, Clone)]
pub struct QuicOptions {
    /// The server identity (default: the per-user file).
    pub identity: IdentitySource,
    /// Client: trust servers signed by these CAs (PEM) when the address pins no fingerprint.
    pub ca_bundle: Option<PathBuf>,
    /// Keep-alive interval (default 2 s): a side that has sent nothing for this long sends
    /// a PING. Must be above zero and shorter than [`QuicOptions::idle_timeout`] (a third of
    /// it or less, so that one lost keep-alive does not end the connection); otherwise
    /// `listen` and `connect` fail with `ApiMisuse` naming both.
    pub keep_alive: Duration,
    /// A connection from whose peer nothing arrived for this long is dead (default 10 s).
    /// The smaller of the two sides' non-zero values applies (zero: this side sets none, and
    /// with neither side setting one a vanished peer is never noticed). Such a pipe
    /// reports `Closed`, and a warning naming this option is logged. A process starved of
    /// CPU for longer than this looks dead to its peer: keep it well above the longest
    /// stall the machines may see.
    pub idle_timeout: Duration,
    /// How long the QUIC + TLS handshake may take (default 10 s).
    pub handshake_timeout: Duration,
    /// Receive window of one stream (default 64 MiB).
    pub stream_window: u64,
    /// Receive and send window of the whole connection (default 256 MiB).
    pub connection_window: u64,
    /// Concurrent unidirectional streams a peer may open (default 1024).
    pub max_streams: u64,
}

impl Default for QuicOptions {
    fn default() -> Self {
        QuicOptions {
            identity: IdentitySource::Default,
            ca_bundle: None,
            keep_alive: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            stream_window: 64 << 20,
            connection_window: 256 << 20,
            max_streams: 1024,
        }
    }
}
