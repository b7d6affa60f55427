//! Bare quinn, with the same TLS and transport settings as ferry's QUIC transport, for the
//! benchmark to compare ferry against in the same run: a sink (run in the peer process) that
//! reads each bidirectional stream to its end and answers one byte, and a sender that times
//! those transfers, exactly like ferry's one-way measurement (tensor out, small ack back).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::TransportError;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};

use crate::tls::{self, Identity};
use crate::{IdentitySource, QuicAddr, QuicOptions, QuicTransport};

fn backend(e: impl std::fmt::Display) -> TransportError {
    TransportError::Backend(Arc::new(std::io::Error::other(e.to_string())))
}

fn transport_config(opts: &QuicOptions) -> Result<Arc<quinn::TransportConfig>, TransportError> {
    QuicTransport::with_options(QuicOptions { identity: IdentitySource::Ephemeral, ..opts.clone() })
        .transport_config_for_baseline()
}

/// Starts a bare quinn sink on 127.0.0.1 (any port); returns its `quic://...#sha256=...`
/// address. It serves until the runtime stops.
pub async fn quinn_sink(opts: &QuicOptions) -> Result<String, TransportError> {
    let id = Identity::generate()?;
    let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(
        QuicServerConfig::try_from(tls::server_config(&id)?).map_err(backend)?,
    ));
    cfg.transport_config(transport_config(opts)?);
    let ep = quinn::Endpoint::server(cfg, "127.0.0.1:0".parse().map_err(backend)?).map_err(backend)?;
    let at = ep.local_addr().map_err(backend)?;
    tokio::spawn(async move {
        while let Some(inc) = ep.accept().await {
            tokio::spawn(async move {
                let Ok(conn) = inc.await else { return };
                while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                    let mut n = 0u64;
                    while let Ok(Some(c)) = recv.read_chunk(usize::MAX, true).await {
                        n += c.bytes.len() as u64;
                    }
                    let _ = send.write_all(&n.to_le_bytes()).await;
                    let _ = send.finish();
                }
            });
        }
    });
    Ok(format!("quic://{at}#sha256={}", id.fingerprint()))
}

/// Sends `bytes` bytes to the sink at `addr` on one stream, `iters` times on one
/// connection; returns the time of each (until the sink's answer arrived).
pub async fn quinn_send(
    addr: &str,
    bytes: usize,
    iters: usize,
    opts: &QuicOptions,
) -> Result<Vec<Duration>, TransportError> {
    let a: ferry_core::Address = addr.parse()?;
    let qa = QuicAddr::parse(&a)?;
    let sock: std::net::SocketAddr = qa.host_port.parse().map_err(backend)?;
    let tls = tls::client_config(qa.pin.as_deref(), None)?;
    let mut cfg = quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls).map_err(backend)?));
    cfg.transport_config(transport_config(opts)?);
    let ep = quinn::Endpoint::client("127.0.0.1:0".parse().map_err(backend)?).map_err(backend)?;
    let conn = ep.connect_with(cfg, sock, "ferry").map_err(backend)?.await.map_err(backend)?;
    let data = bytes::Bytes::from(vec![7u8; bytes]);
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let start = Instant::now();
        let (mut send, mut recv) = conn.open_bi().await.map_err(backend)?;
        send.write_chunk(data.clone()).await.map_err(backend)?;
        send.finish().map_err(backend)?;
        let mut n = [0u8; 8];
        recv.read_exact(&mut n).await.map_err(backend)?;
        times.push(start.elapsed());
        if u64::from_le_bytes(n) != bytes as u64 {
            return Err(backend(format!("the sink got {} of {bytes} bytes", u64::from_le_bytes(n))));
        }
    }
    conn.close(0u32.into(), b"done");
    ep.wait_idle().await;
    Ok(times)
}

/// Both ends in this process (for tests): sink, then `iters` timed transfers.
pub async fn bare_quinn_transfers(
    bytes: usize,
    iters: usize,
    opts: &QuicOptions,
) -> Result<Vec<Duration>, TransportError> {
    let addr = quinn_sink(opts).await?;
    quinn_send(&addr, bytes, iters, opts).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bare_transfer_moves_every_byte() {
        let t = bare_quinn_transfers(3 << 20, 2, &QuicOptions::default()).await.unwrap();
        assert_eq!(t.len(), 2);
    }
}
