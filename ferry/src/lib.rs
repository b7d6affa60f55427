//! ferry moves tensors between processes as fast as the hardware allows.
//!
//! This facade re-exports [`ferry_core`] and every backend compiled in, and builds an
//! [`Endpoint`] that holds them all ([`endpoint()`]). Two peers then negotiate the fastest
//! channel they share. It also re-exports what a JSON-RPC handler needs ([`serde`],
//! [`serde_json`], and with `rpc` [`ferry_rpc`] and `schemars`), so a program depends on
//! `ferry` and `tokio` only. It starts no runtime of its own (use tokio) and never
//! deserialises code or pickles. The command-line tool is the separate `ferry-cli` package.
//!
//! # Feature flags
//! - `local` (default): local sockets (`ferry_local`), scheme `unix:`.
//! - `shm` (default): shared memory (`ferry_shm`): zero-copy CPU tensors between processes
//!   on one Linux host; negotiated over `unix:` connections.
//! - `cuda-ipc`: CUDA IPC (`ferry_cuda_ipc`): CUDA tensors between processes on one Linux
//!   host without a copy; the driver is loaded at run time, so this builds without CUDA and
//!   the channel is simply not offered where no GPU is usable.
//! - `quic`: QUIC across hosts (`ferry_quic`), scheme `quic://host:port#sha256=PIN`.
//! - `rpc` (default): JSON-RPC 2.0 with tensors (`ferry_rpc`).
//! - `http`: JSON-RPC over HTTP POST as well.
//! - `ring` (default): the same-host ring (`ferry_ring`, Linux): frames through
//!   shared-memory rings beside the unix socket, where both peers ask for it
//!   (`use ferry::RingExt;` then `.ring(Some(ferry::RingOptions::default()))` on an
//!   `EndpointBuilder`).
//!
//! The inline channel (tensor bytes inside the frame) is always present.
//!
//! The rest of this page is the repository's README; every Rust example in it is compiled
//! and run as a doctest.
#![doc = ""]
#![doc = include_str!("../../README.md")]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub use ferry_core::*;
#[cfg(feature = "cuda-ipc")]
pub use ferry_cuda_ipc;
#[cfg(feature = "local")]
pub use ferry_local;
#[cfg(feature = "quic")]
pub use ferry_quic;
#[cfg(feature = "ring")]
pub use ferry_ring;
/// The same-host ring: `ferry::endpoint().ring(Some(RingOptions::default()))` (Linux).
#[cfg(all(feature = "ring", target_os = "linux"))]
pub use ferry_ring::{RingExt, RingOptions};
#[cfg(feature = "rpc")]
pub use ferry_rpc;
#[cfg(feature = "shm")]
pub use ferry_shm;
#[cfg(feature = "rpc")]
pub use schemars::{self, JsonSchema};
pub use serde::{self, Deserialize, Serialize};
pub use serde_json;

use std::sync::Arc;

/// The compiled-in transports.
#[allow(unused_mut, clippy::vec_init_then_push)] // the pushes depend on features
pub fn transports() -> Vec<Arc<dyn Transport>> {
    let mut v: Vec<Arc<dyn Transport>> = Vec::new();
    #[cfg(feature = "local")]
    v.push(Arc::new(ferry_local::LocalTransport::new()));
    #[cfg(feature = "quic")]
    v.push(Arc::new(ferry_quic::QuicTransport::new()));
    v
}

/// The compiled-in channels, fastest first. The inline channel is always last.
pub fn channels() -> Vec<Arc<dyn Channel>> {
    vec![
        #[cfg(feature = "cuda-ipc")]
        Arc::new(ferry_cuda_ipc::CudaIpcChannel::new()),
        #[cfg(feature = "shm")]
        Arc::new(ferry_shm::ShmChannel::new()),
        #[cfg(feature = "quic")]
        Arc::new(ferry_quic::QuicChannel::new()),
        Arc::new(InlineChannel),
    ]
}

/// [`endpoint()`], with the shm channel's pool limited to `pool_limit` bytes
/// ([`ferry_shm::ShmOptions::pool_limit`]; `ferry serve --shm-pool-mib`).
#[cfg(feature = "shm")]
pub fn endpoint_with_shm_pool(pool_limit: u64) -> EndpointBuilder {
    endpoint_with_shm(ferry_shm::ShmOptions { pool_limit, ..ferry_shm::ShmOptions::default() })
}

/// [`endpoint()`], with these options for the shm channel (e.g. a binding's words for them in
/// errors, [`ferry_shm::ShmOptions::names`]).
#[cfg(feature = "shm")]
pub fn endpoint_with_shm(opts: ferry_shm::ShmOptions) -> EndpointBuilder {
    let mut b = Endpoint::builder();
    for t in transports() {
        b = b.transport(t);
    }
    for c in channels() {
        if c.name() == "shm" {
            b = b.channel(Arc::new(ferry_shm::ShmChannel::with_options(opts.clone())));
        } else {
            b = b.channel(c);
        }
    }
    b
}

/// An endpoint builder with every compiled-in transport and channel, channels in priority
/// order (fastest first). Add options, then `.build()`.
pub fn endpoint() -> EndpointBuilder {
    let mut b = Endpoint::builder();
    for t in transports() {
        b = b.transport(t);
    }
    for c in channels() {
        b = b.channel(c);
    }
    b
}
