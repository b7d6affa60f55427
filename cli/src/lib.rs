//! The `ferry` command-line tool's library: what `ferry bench`, `serve`, `call`,
//! `discover` and `sdk` run, and the built-in APIs they serve.
//!
//! - [`mod@bench`] (and `bench_rpc`): the benchmark, with its echo peer.
//! - `cli_rpc`: `ferry serve / call / discover` (feature `rpc`).
//! - `demo`, `conformance_api`: the demo API and the API the SDKs' conformance scenarios
//!   call (feature `rpc`).
//! - `sdk`: `ferry sdk`, typed Python and TypeScript clients from an OpenRPC document.
//! - `raw_peer`: a raw ferry client that plays a hostile peer (the soak, the tests).
//! - `soak`: `ferry __soak` (`cargo xtask soak`), the server under heavy and hostile load.
//!
//! It is a separate package from the `ferry` library so that programs using the library do
//! not compile clap, indicatif, tracing-subscriber or the SDK generator. The binary is still
//! called `ferry`: `cargo run --release -p ferry-cli -- bench`.
//!
//! # Feature flags
//! The `ferry` library's (`local`, `shm`, `cuda-ipc`, `quic`, `rpc`, `http`), forwarded to it.
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod bench;
pub mod bench_load;
#[cfg(feature = "rpc")]
pub mod bench_rpc;
#[cfg(all(feature = "shm", target_os = "linux"))]
pub mod bench_shm_memory;
#[cfg(feature = "rpc")]
pub mod cli_rpc;
#[cfg(feature = "rpc")]
pub mod conformance_api;
#[cfg(feature = "rpc")]
pub mod demo;
#[cfg(target_os = "linux")]
pub mod raw_peer;
#[cfg(feature = "rpc")]
pub mod sdk;
#[cfg(all(feature = "rpc", target_os = "linux"))]
pub mod soak;
#[cfg(feature = "rpc")]
pub mod weights;
