//! The `ferry` command line as a library: what `ferry bench`, `serve`, `call`, `discover`,
//! `sdk`, `serve-weights` and `info` run, and the built-in APIs they serve.
//!
//! - [`cli::main`]: the whole command line (clap), the entry point of the `ferry` binary
//!   (`ferry-cli`, a thin `main` over it) and of the Python package's `ferry` command.
//! - [`self_exe`]: how a command starts another copy of itself (benchmark peers, the soak).
//! - [`mod@bench`] (and `bench_rpc`): the benchmark, with its echo peer.
//! - `cli_rpc`: `ferry serve / call / discover` (feature `rpc`).
//! - `demo`, `conformance_api`: the demo API and the API the SDKs' conformance scenarios
//!   call (feature `rpc`).
//! - `sdk`: `ferry sdk`, typed Python and TypeScript clients from an OpenRPC document.
//! - `raw_peer`: a raw ferry client that plays a hostile peer (the soak, the tests).
//! - `soak`: `ferry __soak` (`cargo xtask soak`), the server under heavy and hostile load.
//!
//! It is a separate package from the `ferry` library so that programs using the library do
//! not compile clap, indicatif, tracing-subscriber or the SDK generator; and from the binary
//! (`ferry-cli`) so that the Python package builds the same commands without a binary
//! crate (and without the binary's global allocator). Each [`cli::main`] builds its own Tokio
//! runtime; the only process-wide state it sets is a tracing subscriber, where there is none. The binary: `cargo run --release -p ferry-cli
//! -- bench`.
//!
//! # Feature flags
//! The `ferry` library's (`local`, `shm`, `cuda-ipc`, `quic`, `rpc`, `http`), forwarded to it.
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod bench;
pub mod bench_load;
pub mod bench_place;
#[cfg(feature = "rpc")]
pub mod bench_rpc;
#[cfg(all(feature = "shm", target_os = "linux"))]
pub mod bench_shm_memory;
pub mod cli;
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
pub mod self_exe;
#[cfg(all(feature = "rpc", target_os = "linux"))]
pub mod soak;
#[cfg(feature = "rpc")]
pub mod weights;
