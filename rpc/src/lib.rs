//! ferry-rpc: JSON-RPC 2.0 over ferry pipes, with tensors.
//!
//! - **Server** ([`Server`]): a [`Methods`] table of plain async Rust functions with typed
//!   params and results (serde + schemars). Handlers may take a [`CallContext`] (peer,
//!   cancellation, [`CallContext::alloc`] for result tensors in the channel's memory).
//! - **Tensors** anywhere in params and results: fields of type [`RpcTensor`] or
//!   [`TensorMap`] travel as `{"$tensor": i}` references into the ferry message (zero-copy
//!   where the channel allows), or inline as base64 for plain JSON and HTTP peers
//!   ([`tensor`]; the inline form is [`InlineCodec`], a [`ferry_core::TensorCodec`]).
//! - **JSON-RPC 2.0 to the letter** ([`jsonrpc`]): params by position and by name,
//!   notifications, batches, every id type, the standard errors; ferry's own codes in
//!   `-32000..=-32099` ([`codes`]).
//! - **Client** ([`Client`]): many calls in flight on one pipe, per-call timeout,
//!   cancellation (dropping a call cancels it on the server), immediate failure when the
//!   server goes away.
//! - **Long calls** ([`task`]): `ferry.task.submit / status / result / cancel`, owned by
//!   the caller's [`Identity`].
//! - **Remote tensor references** ([`remote`]): a handler returns a tensor kept on the
//!   server ([`CallContext::keep`], [`TensorRef`]); clients pass it back as a param without
//!   moving bytes, fetch it, free it (`ferry.ref.*`).
//! - **Discovery** ([`openrpc`]): `rpc.discover` returns an OpenRPC 1.3 document.
//! - **Plain clients**: newline-delimited JSON on the same socket
//!   ([`Server::serve_json`]) and, with feature `http`, HTTP POST (`Server::serve_http`).
//! - **Limits** ([`RpcLimits`]): calls in flight per connection, request size, batch size,
//!   task table size; every error names the limit.
//!
//! What it does not do: it opens no sockets of its own except the HTTP listener it is
//! given; pipes come from [`ferry_core::Endpoint`]. It starts no runtime (use tokio).
//!
//! Entry points: [`Methods::register`], [`Server::serve`], [`Client::new`].
//!
//! # Feature flags
//! - `http`: [`Server`]'s `serve_http`, JSON-RPC over HTTP POST (hyper).
//! - `fuzzing`: hidden entry points for the fuzz targets (`fuzz/harness`); not a stable API.
#![deny(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod blocking;
pub mod client;
pub mod codes;
mod dispatch;
mod finite;
mod follow;
#[cfg(feature = "http")]
mod http;
pub mod inline;
pub mod jsonrpc;
pub mod limits;
pub mod method;
pub mod openrpc;
mod outbox;
pub mod pending;
pub mod remote;
pub mod server;
mod shape;
mod strict;
#[cfg(target_os = "linux")]
mod sys;

/// Entry points for the fuzz targets (`fuzz/harness`): the server's own request parsing,
/// which is otherwise private. Not a stable API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    use serde_json::Value;

    use crate::codes::ErrorObject;
    use crate::limits::RpcLimits;

    /// What the server does to one plain JSON-RPC text before it classifies it: the shape
    /// check on the bytes ([`ferry_core::json_shape::check`] under `limits`), then the strict
    /// parse (duplicate members marked, inexact ids kept).
    pub fn parse_request(text: &[u8], limits: &RpcLimits) -> Result<Value, ErrorObject> {
        crate::shape::check(text, limits.max_batch, limits.max_request_values)?;
        crate::strict::parse(text).map_err(ErrorObject::parse_error)
    }

    /// The strict parse alone.
    pub fn strict_parse(text: &[u8]) -> Result<Value, serde_json::Error> {
        crate::strict::parse(text)
    }

    /// How the server writes a response (exact ids restored).
    pub fn write_response(v: &Value) -> Vec<u8> {
        crate::strict::write(v)
    }
}
pub mod task;
pub mod tensor;

pub use client::{CallError, Client};
pub use codes::{ERROR_CODES, ErrorCode, ErrorObject};
pub use dispatch::{CancelParams, CancelResult};
pub use follow::Follower;
#[cfg(feature = "http")]
pub use http::HttpOptions;
pub use limits::RpcLimits;
pub use method::{
    CallContext, ConnKind, ConnectionClosed, GivenSchemas, Identity, MethodInfo, Methods, PeerInfo, RegisterError,
    Reply,
};
pub use remote::{RefBacking, TensorRef};
pub use server::{RefCopy, Server, ServerBuilder, Spawner};
pub use task::{TaskState, TaskStatus};
pub use tensor::{InlineCodec, InlineTensor, RpcTensor, TensorMap};
