//! Serializable wire types: the JSON parts of frames. These are the IPC contract; their JSON
//! Schemas are generated into `core/schemas/` (see [`crate::schema`]) and documented in
//! `docs/PROTOCOL.md`.

use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::dtype::DeviceKind;
use crate::meta::TensorMeta;

/// The protocol name carried in [`Hello`].
pub const PROTOCOL: &str = "ferry";
/// The protocol version this build speaks (in the preamble, [`Hello`] and [`Welcome`]).
pub const PROTOCOL_VERSION: u16 = 1;

/// The client's first frame (kind HELLO).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Hello {
    /// Always `"ferry"`.
    pub protocol: String,
    /// The protocol version the client speaks.
    pub version: u16,
    /// The channels the client can use, in its order of preference.
    pub channels: Vec<ChannelOffer>,
    /// An optional bearer token (checked by transports that require one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Free text naming the client implementation, e.g. `"ferry-rust/0.1.0"`.
    #[serde(default)]
    pub agent: String,
    /// The client's receive limits; the server does not send more. Absent: the server
    /// assumes its own limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    /// Protocol features the client understands (e.g. `"compact_tensors"`,
    /// [`crate::compact::FEATURE_COMPACT_TENSORS`]); unknown ones are ignored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
}

/// One channel a client offers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ChannelOffer {
    /// Channel name, e.g. `"inline"` or `"shm"`.
    pub name: String,
    /// Device kinds the channel can carry.
    pub devices: Vec<DeviceKind>,
    /// Where the channel can work (e.g. boot id and namespaces for shm). The server
    /// compares it with its own; an empty map means "anywhere".
    #[serde(default)]
    pub domain: BTreeMap<String, String>,
}

/// The server's answer when it accepts (kind WELCOME). Its choice is authoritative.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Welcome {
    /// The protocol version the server speaks (equal to the client's).
    pub version: u16,
    /// The channel chosen for each device kind. `cpu` is always present.
    pub channels: BTreeMap<DeviceKind, String>,
    /// The server's receive limits; a client should not send more.
    pub limits: Limits,
    /// Free text naming the server implementation.
    #[serde(default)]
    pub agent: String,
    /// The features of [`Hello::features`] the server understands too: both sides may use
    /// them on this connection.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
}

/// The server's answer when it refuses (kind REFUSE); the connection closes after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Refusal {
    /// Client and server speak different protocol versions.
    VersionMismatch {
        /// The server's version.
        server: u16,
        /// The client's version.
        client: u16,
    },
    /// No channel offered by the client can carry CPU tensors to this server.
    NoCommonChannel {
        /// What the client offered.
        offered: Vec<String>,
        /// What the server supports.
        supported: Vec<String>,
    },
    /// The bearer token is missing or wrong.
    BadToken,
    /// The HELLO frame could not be understood.
    Malformed {
        /// What is wrong.
        detail: String,
    },
    /// A reason this build does not know (from a newer peer).
    #[serde(other)]
    Unknown,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::VersionMismatch { server, client } => {
                write!(f, "protocol version mismatch: server speaks {server}, client speaks {client}")
            }
            Refusal::NoCommonChannel { offered, supported } => write!(
                f,
                "no common channel for cpu tensors: client offered [{}], server supports [{}]",
                offered.join(", "),
                supported.join(", ")
            ),
            Refusal::BadToken => f.write_str("missing or wrong bearer token"),
            Refusal::Malformed { detail } => write!(f, "malformed hello: {detail}"),
            Refusal::Unknown => f.write_str("refused for a reason this version of ferry does not know"),
        }
    }
}

/// Receive limits. Each side enforces its own on everything it receives; the server also
/// announces its limits in [`Welcome`] so that a client fails early instead of being cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct Limits {
    /// Largest JSON header of one frame, in bytes (default 16 MiB).
    pub max_header_bytes: u32,
    /// Largest payload of one frame, in bytes (default 4 GiB).
    pub max_payload_bytes: u64,
    /// Most tensors in one message (default 65,536).
    pub max_tensors: u32,
    /// Most file descriptors attached to one frame (default 64).
    pub max_fds: u16,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_header_bytes: 16 << 20, max_payload_bytes: 4 << 30, max_tensors: 65_536, max_fds: 64 }
    }
}

/// The JSON header of a MESSAGE frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MessageHeader {
    /// The application's JSON value.
    pub header: serde_json::Value,
    /// One descriptor per tensor, in order.
    #[serde(default)]
    pub tensors: Vec<TensorDesc>,
}

/// Describes one tensor of a message: what it is and where its bytes are. Serializes as the
/// object; reads the object or the compact array ([`crate::compact`], which also gives its
/// schema).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TensorDesc {
    /// dtype, shape, strides, device.
    pub meta: TensorMeta,
    /// Where the bytes are; the variant names the channel.
    pub data: Location,
}

/// Where a tensor's bytes are. Externally tagged by channel name: `{"inline": {...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Location {
    /// In this frame's payload.
    Inline(InlineRef),
    /// In a shared-memory segment of the sender's pool (shm channel).
    Shm(ShmRef),
    /// In the receiver's own pool: a lease the receiver granted earlier, sent back (shm).
    ShmReturn(ShmReturnRef),
    /// In the sender's exportable CUDA memory (cuda-ipc channel).
    CudaIpc(CudaIpcRef),
    /// In the receiver's own CUDA memory: a lease the receiver granted earlier, sent back
    /// (cuda-ipc), so that no process ever opens its own IPC handle.
    CudaIpcReturn(CudaIpcReturnRef),
    /// On its own QUIC unidirectional stream (quic channel).
    QuicStream(QuicStreamRef),
}

/// A tensor travelling on its own QUIC stream: the stream carries a u64 little-endian
/// length, then the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct QuicStreamRef {
    /// The QUIC stream id (a unidirectional stream the sender opened).
    pub stream: u64,
    /// Length of the tensor's bytes.
    pub len: u64,
}

/// A range of a CUDA allocation exported with `cuIpcGetMemHandle`, leased to the receiver
/// until it sends a release for `lease`. Handles are base64; 64-bit device values are
/// decimal strings (JSON numbers lose precision past 2^53).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CudaIpcRef {
    /// UUID of the device the memory is on (`GPU-xxxxxxxx-...`), not its ordinal.
    pub device_uuid: String,
    /// Base64 of the 64-byte `CUipcMemHandle` of the allocation's base.
    pub mem_handle: String,
    /// The producer's id for the allocation (with `mem_handle`, the consumer's cache key).
    pub alloc_id: String,
    /// Size of the whole allocation in bytes, decimal.
    pub alloc_size: String,
    /// Offset of the tensor's bytes from the allocation base, decimal.
    pub offset: String,
    /// Length in bytes, decimal.
    pub len: String,
    /// Base64 of the 64-byte `CUipcEventHandle` recorded after the producer's writes; the
    /// consumer waits on it before handing the tensor out.
    pub event_handle: String,
    /// Lease id to release when done.
    pub lease: u64,
}

/// A range inside a CUDA lease the receiver itself granted (so: its own device memory),
/// sent back. 64-bit values are decimal strings, as in [`CudaIpcRef`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CudaIpcReturnRef {
    /// The receiver's lease id.
    pub lease: u64,
    /// Offset inside the leased range, decimal.
    pub offset: String,
    /// Length in bytes, decimal.
    pub len: String,
    /// Base64 of the 64-byte `CUipcEventHandle` the sender recorded after its last use of
    /// the bytes; the receiver waits on it before handing the tensor out.
    pub event_handle: String,
}

/// A range of one of the sender's shared-memory segments, leased to the receiver until it
/// sends a release for `lease`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ShmRef {
    /// Segment id, chosen by the sender and announced with the first message that uses it.
    pub segment: u64,
    /// Offset of the tensor's bytes in the segment.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// Lease id to release when done.
    pub lease: u64,
    /// Present the first time the sender uses this segment on this pipe: the segment's
    /// descriptor travels with this frame.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub announce: Option<SegmentAnnounce>,
    /// The sender keeps this memory in use after the message (a buffer it sends again and
    /// again), so the lease's prompt return frees nothing it waits for: the receiver may
    /// batch the release by count and time alone, not by its size (PROTOCOL.md 11.5).
    /// Absent means false; receivers that do not know the field ignore it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lazy_release: bool,
}

/// A new shared-memory segment: a sealed memfd attached to the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SegmentAnnounce {
    /// Index of the descriptor among the frame's descriptors.
    pub fd: u32,
    /// Size of the segment in bytes (must equal the memfd's sealed size).
    pub size: u64,
}

/// A range inside a lease the receiver itself granted (so: its own memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ShmReturnRef {
    /// The receiver's lease id.
    pub lease: u64,
    /// Offset inside the leased range.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// A byte range of the frame payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct InlineRef {
    /// Offset from the start of the payload (a multiple of 64 when written by ferry).
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// The JSON header of a CONTROL frame: a message from one channel session to its peer
/// (e.g. shm lease releases).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ControlHeader {
    /// The channel the message is for.
    pub channel: String,
    /// Channel-specific body.
    pub body: serde_json::Value,
}

/// The JSON header of a CLOSE frame: the sender is closing and says why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Close {
    /// Why: `"normal"`, `"protocol_error"` or `"limit"`.
    pub code: String,
    /// Human-readable detail.
    #[serde(default)]
    pub message: String,
}
