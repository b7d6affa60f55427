//! ferry-core: the ground every ferry backend stands on.
//!
//! - Tensor types: [`DType`], [`Device`], [`TensorMeta`] (checked size arithmetic),
//!   [`Tensor`] and [`TensorMut`], [`Message`].
//! - The wire: the [`frame`] format (documented in `docs/PROTOCOL.md`), the handshake
//!   types in [`wire`] and their JSON Schemas ([`schema`]).
//! - The traits backends implement: [`Transport`] / [`Listener`] / [`Connection`] (move
//!   bytes), [`Channel`] / [`ChannelSession`] (move tensor bytes), [`TensorCodec`] (named
//!   tensor maps to bytes), with the [`InlineChannel`], [`RawCodec`] and
//!   [`SafetensorsCodec`].
//! - [`Endpoint`] and [`Pipe`]: negotiate a connection and send / receive messages.
//!
//! What it does not do: no OS-specific code (sockets and shared memory live in the backend
//! crates). Pipes run on a tokio runtime, which the caller provides.
//!
//! Entry point: `Endpoint::builder().transport(..).channel(..).build()`, then
//! [`Endpoint::listen`] / [`Endpoint::connect`]. The `ferry` facade crate builds an
//! endpoint with every compiled-in backend.
//!
//! The same-host ring (PROTOCOL.md §22) is not here: core defines what a link beside the
//! socket can do ([`frame::LinkRead`], [`frame::LinkWrite`], [`frame::LinkProvider`]) and
//! speaks its handshake; `ferry-ring` implements it (`EndpointBuilder::link`, or
//! `ferry_ring::RingExt::ring`).
#![forbid(unsafe_code)]

pub mod channel;
pub mod codec;
pub mod compact;
pub mod compute;
pub mod dtype;
pub mod endpoint;
pub mod error;
pub mod float8;
pub mod frame;
pub mod handshake;
pub mod inline;
pub mod json_shape;
pub mod logsafe;
pub mod mem;
pub mod message;
pub mod meta;
pub mod pipe;
pub mod schema;
pub mod spin;
pub mod tensor;
pub mod ticket;
pub mod transport;
pub mod wire;

pub use channel::{Channel, ChannelSession, ControlOut, ControlWaker, Incoming, Outgoing, SessionCtx};
pub use codec::{RawCodec, SafetensorsCodec, TensorCodec};
pub use dtype::{DType, Device, DeviceKind, Element};
pub use endpoint::{Accepted, DEFAULT_FRAME_TIMEOUT, Endpoint, EndpointBuilder, ForeignConn, PipeListener};
pub use error::{ChannelError, CodecError, LimitError, MetaError, PipeError, ProtocolError, TransportError, ViewError};
pub use inline::InlineChannel;
pub use message::Message;
pub use meta::{MAX_DIMS, TensorMeta};
pub use pipe::{FOLLOW_LINGER, Handled, MessageHandler, Pipe, PipeInfo, Served};
pub use spin::{BusyPoll, ListenerSpin, SpinStats};
pub use tensor::{ALIGN, AlignedBuf, DeviceBuffer, Storage, Tensor, TensorMut, WritableStorage};
pub use ticket::{SendTicket, Tickets};
pub use transport::{
    Address, ConnInfo, Connection, DirectRead, FdQueue, Half, Listener, PeerLiveness, Readiness, Split, Transport,
    TransportHandle,
};
pub use wire::{Limits, PROTOCOL_VERSION, Refusal};
