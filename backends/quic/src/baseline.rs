//! A bare quinn stream transfer with the same TLS and transport settings as ferry's QUIC
//! transport, for the benchmark to compare ferry against in the same run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_core::TransportError;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};

use crate::tls::{self, Identity};
use crate::{IdentitySource, QuicOptions, QuicTransport};

fn backend(e: impl std::fmt::Display) -> TransportError {
    TransportError::Backend(Arc::new(std::io::Error::other(e.to_string())))
}

/// Moves `bytes` bytes over one unidirectional quinn stream on loopback, `iters` times on
/// one connection, and returns the time of each transfer (until the receiver has read the
/// last byte).
pub async fn bare_quinn_transfers(
    bytes: usize,
    iters: usize,
    opts: &QuicOptions,
) -> Result<Vec<Duration>, TransportError> {
    let id = Identity::generate()?;
    let fp = id.fingerprint();
    let t = QuicTransport::with_options(QuicOptions { identity: IdentitySource::Ephemeral, ..opts.clone() });
    let mut scfg = quinn::ServerConfig::with_crypto(Arc::new(
        QuicServerConfig::try_from(tls::server_config(&id)?).map_err(backend)?,
    ));
    scfg.transport_config(t.transport_config_for_baseline()?);
    let server = quinn::Endpoint::server(scfg, "127.0.0.1:0".parse().map_err(backend)?).map_err(backend)?;
    let at = server.local_addr().map_err(backend)?;
    let mut ccfg = quinn::ClientConfig::new(Arc::new(
        QuicClientConfig::try_from(tls::client_config(Some(&fp), None)?).map_err(backend)?,
    ));
    ccfg.transport_config(t.transport_config_for_baseline()?);
    let client = quinn::Endpoint::client("127.0.0.1:0".parse().map_err(backend)?).map_err(backend)?;
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<Result<Instant, String>>();
    let srv = tokio::spawn(async move {
        let Some(inc) = server.accept().await else { return };
        let Ok(conn) = inc.await else { return };
        while let Ok(mut recv) = conn.accept_uni().await {
            let mut n = 0usize;
            let r = loop {
                match recv.read_chunk(usize::MAX, true).await {
                    Ok(Some(c)) => n += c.bytes.len(),
                    Ok(None) => break Ok(Instant::now()),
                    Err(e) => break Err(e.to_string()),
                }
            };
            let _ = done_tx
                .send(r.and_then(|t| if n == bytes { Ok(t) } else { Err(format!("received {n} of {bytes} bytes")) }));
        }
    });
    let conn = client.connect_with(ccfg, at, "ferry").map_err(backend)?.await.map_err(backend)?;
    let data = bytes::Bytes::from(vec![7u8; bytes]);
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let start = Instant::now();
        let mut s = conn.open_uni().await.map_err(backend)?;
        s.write_chunk(data.clone()).await.map_err(backend)?;
        s.finish().map_err(backend)?;
        let end = done_rx.recv().await.ok_or_else(|| backend("receiver stopped"))?.map_err(backend)?;
        times.push(end - start);
    }
    conn.close(0u32.into(), b"done");
    srv.abort();
    Ok(times)
}
