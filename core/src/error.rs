//! Error types, one enum per operation family. All are `Clone` (so tests can compare them)
//! and `#[non_exhaustive]`.

use std::borrow::Cow;
use std::sync::Arc;

use crate::dtype::DType;
use crate::wire::Refusal;

/// A tensor description that does not fit the bytes present, or cannot be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MetaError {
    /// More dimensions than [`crate::MAX_DIMS`].
    #[error("tensor has {dims} dimensions, more than the maximum of {max}")]
    TooManyDims {
        /// Dimensions described.
        dims: usize,
        /// The maximum.
        max: usize,
    },
    /// A size or offset computation overflowed 64 bits.
    #[error("tensor size overflows 64 bits")]
    Overflow,
    /// A stride is negative.
    #[error("stride {stride} of dimension {dim} is negative; negative strides are not supported")]
    NegativeStride {
        /// Dimension.
        dim: usize,
        /// Its stride.
        stride: i64,
    },
    /// Strides and shape have different lengths.
    #[error("{strides} strides given for {dims} dimensions")]
    StridesMismatch {
        /// Dimensions in the shape.
        dims: usize,
        /// Strides given.
        strides: usize,
    },
    /// The metadata names another device than the storage is on.
    #[error("tensor metadata says {meta} but its bytes are on {storage}")]
    DeviceMismatch {
        /// Device in the metadata.
        meta: crate::Device,
        /// Device of the storage.
        storage: crate::Device,
    },
    /// The described size does not match the bytes present.
    #[error("tensor needs {expected} bytes but {actual} are present")]
    LengthMismatch {
        /// Bytes the description needs.
        expected: u64,
        /// Bytes present.
        actual: u64,
    },
}

/// A typed view of a tensor that cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ViewError {
    /// The tensor's dtype is not the requested Rust type's.
    #[error("tensor has dtype {actual}, not {requested}")]
    DType {
        /// The requested dtype.
        requested: DType,
        /// The tensor's dtype.
        actual: DType,
    },
    /// The bytes are not aligned for the element type.
    #[error("tensor bytes are not aligned to {align} bytes; copy with Tensor::to_aligned()")]
    Misaligned {
        /// Alignment needed.
        align: usize,
    },
    /// The tensor is strided; typed slices need contiguous tensors.
    #[error("tensor is not contiguous; typed slices need a contiguous tensor")]
    NotContiguous,
    /// The tensor is not in host memory.
    #[error("tensor is on {0}, not in host memory")]
    NotHost(crate::Device),
}

/// Encoding or decoding a tensor container (raw or safetensors) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// The input is not a valid container.
    #[error("malformed {codec} data: {reason}")]
    Malformed {
        /// Codec name.
        codec: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A tensor description does not fit its bytes.
    #[error("tensor {name:?}: {source}")]
    Meta {
        /// Tensor name.
        name: String,
        /// The problem.
        source: MetaError,
    },
    /// The codec cannot represent this tensor (e.g. strided, or on a device).
    #[error("{codec} cannot encode tensor {name:?}: {reason}")]
    Unsupported {
        /// Codec name.
        codec: &'static str,
        /// Tensor name.
        name: String,
        /// Why.
        reason: String,
    },
    /// The input names one tensor twice (which of the two is meant cannot be told).
    #[error("{codec} data names tensor {name:?} twice")]
    DuplicateName {
        /// Codec name.
        codec: &'static str,
        /// The repeated name.
        name: String,
    },
}

/// A limit was exceeded. The message names the limit and how to raise it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} is {value}, over the limit {limit} = {max}; {hint}")]
pub struct LimitError {
    /// The name of the limit (a field of [`crate::Limits`] or of a backend's options).
    pub limit: &'static str,
    /// What was measured.
    pub what: &'static str,
    /// The value seen.
    pub value: u64,
    /// The limit in force.
    pub max: u64,
    /// How to raise it, and which side enforces it.
    pub hint: Cow<'static, str>,
}

impl LimitError {
    /// A limit of [`crate::Limits`]; `side` says who enforces it (e.g. " on the receiving
    /// side").
    pub fn endpoint(limit: &'static str, what: &'static str, value: u64, max: u64, side: &str) -> Self {
        let hint = format!("raise it with Limits::{limit} (EndpointBuilder::limits){side}");
        LimitError { limit, what, value, max, hint: hint.into() }
    }
}

/// The peer broke the protocol. The connection is closed after this error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// The connection did not start with ferry's magic.
    #[error("not a ferry peer: connection starts with {got:02x?}, expected the ferry magic{hint}")]
    BadMagic {
        /// The first bytes received.
        got: Vec<u8>,
        /// A hint (e.g. plain JSON-RPC).
        hint: &'static str,
    },
    /// A frame kind that is unknown or not allowed here.
    #[error("unexpected frame kind {kind} ({context})")]
    UnexpectedFrame {
        /// The kind byte.
        kind: u8,
        /// Where it came.
        context: &'static str,
    },
    /// Reserved bits were set.
    #[error("frame flags {0:#04x} are reserved and must be 0")]
    BadFlags(u8),
    /// The JSON header could not be parsed.
    #[error("malformed frame header: {0}")]
    BadHeader(String),
    /// A tensor descriptor is inconsistent with the frame.
    #[error("tensor {index}: {reason}")]
    BadTensor {
        /// Index of the tensor in the message.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// File descriptors were announced but not received, or sent where not allowed.
    #[error("file descriptor mismatch: {0}")]
    Fds(String),
    /// The peer broke the same-host ring's rules (a corrupt index or length, a record that
    /// is not whole frames, frames on the socket with no record pointing to them).
    #[error("same-host ring: {0}")]
    Ring(String),
}

/// A transport (moves frames) failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The peer closed the connection or went away.
    #[error("connection closed by peer")]
    Closed,
    /// This backend cannot work on this machine.
    #[error("backend not viable here: {0}")]
    NotViable(Cow<'static, str>),
    /// The address is not one this transport understands.
    #[error("bad address {addr:?}: {reason}")]
    BadAddress {
        /// The address.
        addr: String,
        /// Why.
        reason: Cow<'static, str>,
    },
    /// Something is already listening on the address.
    #[error("address already in use: {addr}{detail}")]
    AddrInUse {
        /// The address.
        addr: String,
        /// Who holds it and what to do, when known (starts with `: `), else empty.
        detail: String,
    },
    /// Nothing is listening at the address (no such socket, or the connection was refused).
    #[error("nothing is listening at {addr}: {detail} (is the server running, and is the address the one it printed?)")]
    NotListening {
        /// The address.
        addr: String,
        /// The OS's words.
        detail: String,
    },
    /// The peer is not allowed to connect (e.g. another user).
    #[error("peer refused: {0}")]
    PeerRefused(String),
    /// The caller used the API wrongly.
    #[error("API misuse: {0}")]
    ApiMisuse(&'static str),
    /// An I/O error.
    #[error("I/O: {0}")]
    Io(Arc<std::io::Error>),
    /// Backend-specific detail.
    #[error(transparent)]
    Backend(Arc<dyn std::error::Error + Send + Sync>),
}

impl From<std::io::Error> for TransportError {
    fn from(e: std::io::Error) -> Self {
        use std::io::ErrorKind::*;
        match e.kind() {
            UnexpectedEof | BrokenPipe | ConnectionReset | ConnectionAborted => TransportError::Closed,
            _ => TransportError::Io(Arc::new(e)),
        }
    }
}

/// A channel (moves tensor bytes) failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ChannelError {
    /// The channel cannot work here.
    #[error("channel not viable here: {0}")]
    NotViable(Cow<'static, str>),
    /// The tensor cannot go over this channel (e.g. wrong device).
    #[error("channel {channel} cannot carry this tensor: {reason}")]
    Unsupported {
        /// Channel name.
        channel: &'static str,
        /// Why.
        reason: String,
    },
    /// The peer sent a descriptor or control message that is not valid.
    #[error("channel {channel}: invalid descriptor from peer: {reason}")]
    BadDescriptor {
        /// Channel name.
        channel: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A tensor description does not fit its bytes.
    #[error(transparent)]
    Meta(#[from] MetaError),
    /// A limit was exceeded.
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// The pipe the session serves is closed.
    #[error("pipe closed")]
    Closed,
    /// Waiting for channel resources (e.g. pool space) took too long.
    #[error("timed out after {0:?}: {1}")]
    Timeout(std::time::Duration, String),
    /// Backend-specific detail.
    #[error(transparent)]
    Backend(Arc<dyn std::error::Error + Send + Sync>),
}

/// What a [`crate::Pipe`] operation (connect, accept, send, recv) can fail with.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum PipeError {
    /// The connection is closed: the peer went away, or this side closed it.
    #[error("pipe closed")]
    Closed,
    /// The peer closed the connection and said why.
    #[error("peer closed the pipe: {0}")]
    ClosedByPeer(String),
    /// A send waited for the peer to make room (it was not reading) and the peer's end of
    /// the connection closed meanwhile: the peer process exited, crashed or was killed
    /// without closing the pipe. The pipe is closed.
    #[error(
        "the peer is gone: its end of the connection closed while this side waited for it to read \
         (the peer process exited, crashed or was killed); the pipe is closed"
    )]
    PeerGone,
    /// The peer broke the protocol; the pipe is closed.
    #[error("protocol error: {0}")]
    Protocol(ProtocolError),
    /// A limit was exceeded; when the peer exceeded it the pipe is closed.
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// The handshake was refused (by the server; on the server side, by this side).
    #[error("handshake refused: {0}")]
    Refused(Refusal),
    /// A tensor description does not fit its bytes.
    #[error("invalid tensor: {0}")]
    Meta(MetaError),
    /// The transport failed.
    #[error("transport: {0}")]
    Transport(TransportError),
    /// The channel failed.
    #[error("channel: {0}")]
    Channel(ChannelError),
    /// An operation did not finish in time.
    #[error("timed out after {0:?} ({1})")]
    Timeout(std::time::Duration, &'static str),
    /// The caller used the API wrongly.
    #[error("API misuse: {0}")]
    ApiMisuse(Cow<'static, str>),
}

impl PipeError {
    /// True when the error means the pipe is closed for good (by the peer, by a protocol
    /// violation, or by this side).
    pub fn is_closed(&self) -> bool {
        matches!(
            self,
            PipeError::Closed
                | PipeError::ClosedByPeer(_)
                | PipeError::PeerGone
                | PipeError::Protocol(_)
                | PipeError::Transport(TransportError::Closed)
        )
    }
}

// Manual `From`s (not `#[from]`): the variants print their inner error themselves, so
// marking it as the `source` too would print it twice in error chains (`{:#}`).
impl From<ProtocolError> for PipeError {
    fn from(e: ProtocolError) -> Self {
        PipeError::Protocol(e)
    }
}

impl From<MetaError> for PipeError {
    fn from(e: MetaError) -> Self {
        PipeError::Meta(e)
    }
}

impl From<TransportError> for PipeError {
    fn from(e: TransportError) -> Self {
        PipeError::Transport(e)
    }
}

impl From<ChannelError> for PipeError {
    fn from(e: ChannelError) -> Self {
        PipeError::Channel(e)
    }
}

impl From<std::io::Error> for PipeError {
    fn from(e: std::io::Error) -> Self {
        match TransportError::from(e) {
            TransportError::Closed => PipeError::Closed,
            other => PipeError::Transport(other),
        }
    }
}
