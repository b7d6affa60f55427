//! Serializable wire types: the JSON parts of frames. These are the IPC contract; their JSON
//! Schemas are generated into `core/schemas/` (see [`crate::schema`]) and documented in
//! `docs/PROTOCOL.md`.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{self, Unexpected};
use serde::{Deserialize, Deserializer, Serialize};

use crate::dtype::DeviceKind;
use crate::meta::TensorMeta;

/// The handshake feature (`Hello::features`, `Welcome::features`) under which both sides
/// may send compact tensor descriptors.
pub const FEATURE_COMPACT_TENSORS: &str = "compact_tensors";

/// The handshake feature under which the shm channel's CONTROL body may carry `forget`
/// (PROTOCOL.md §11.5): the sender will never use a segment again, and the receiver unmaps
/// it. A sender shares long-lived segments of its own (a tensor store's buckets) only with a
/// peer that agreed to it.
pub const FEATURE_SHM_FORGET: &str = "shm_forget";

/// The handshake feature of the same-host ring (PROTOCOL.md §22): offered by a client whose
/// endpoint has a ring configured and whose connection passes descriptors; a server that
/// grants it makes the ring and sends it with the WELCOME ([`Welcome::ring`]). It is not in
/// [`FEATURES`]: whether it is offered depends on the endpoint and the connection.
pub const FEATURE_RING: &str = "ring";

/// The handshake feature under which the same-host ring may carry packed messages
/// (PROTOCOL.md §22.5: a MESSAGE whose tensors all travel inline, in one binary record,
/// without JSON descriptors). Offered and granted beside [`FEATURE_RING`], and only with
/// it; not in [`FEATURES`] either.
pub const FEATURE_RING_MESSAGES: &str = "ring_messages";

/// The protocol features this build understands, offered in HELLO and granted in WELCOME.
pub const FEATURES: [&str; 2] = [FEATURE_COMPACT_TENSORS, FEATURE_SHM_FORGET];

/// The protocol name carried in [`Hello`].
pub const PROTOCOL: &str = "ferry";
/// The protocol version this build speaks (in the preamble, [`Hello`] and [`Welcome`]).
pub const PROTOCOL_VERSION: u16 = 1;

/// The largest value of a 64-bit integer in a channel's JSON (tensor locations and CONTROL
/// bodies: ids, leases, offsets, lengths, sizes): 2^53 - 1, the largest integer a JSON
/// number keeps exactly in JavaScript (`Number.MAX_SAFE_INTEGER`). Every integer on the wire
/// is a JSON number, never a string; a reader refuses a larger one (PROTOCOL.md §5.5).
pub const MAX_WIRE_INT: u64 = (1 << 53) - 1;

/// What a reader expected where an integer broke the [`MAX_WIRE_INT`] rule.
const WIRE_INT_EXPECTED: &str = "an integer in 0..=9007199254740991 (2^53 - 1, PROTOCOL.md 5.5)";

/// A `u64` read under the [`MAX_WIRE_INT`] rule: a JSON number at most 2^53 - 1, else a
/// serde error (which a frame's reader turns into a protocol error). For reading the
/// elements of a compact descriptor; fields use [`wire_int`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireInt(pub u64);

impl<'de> Deserialize<'de> for WireInt {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = u64::deserialize(d)?;
        if v > MAX_WIRE_INT {
            return Err(de::Error::invalid_value(Unexpected::Unsigned(v), &WIRE_INT_EXPECTED));
        }
        Ok(WireInt(v))
    }
}

impl JsonSchema for WireInt {
    fn schema_name() -> Cow<'static, str> {
        "WireInt".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A 64-bit value of a channel's JSON (an id, lease, offset, length or size): a JSON \
                            number, never a string, at most 2^53 - 1 so that JavaScript reads it exactly \
                            (PROTOCOL.md 5.5).",
            "type": "integer",
            "format": "uint64",
            "minimum": 0,
            "maximum": MAX_WIRE_INT,
        })
    }
}

/// serde `deserialize_with` helpers for `u64` fields under the [`MAX_WIRE_INT`] rule.
pub mod wire_int {
    use serde::{Deserialize, Deserializer};

    use super::WireInt;

    /// One `u64` field.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        WireInt::deserialize(d).map(|v| v.0)
    }

    /// A `Vec<u64>` field.
    pub fn vec<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u64>, D::Error> {
        Vec::<WireInt>::deserialize(d).map(|v| v.into_iter().map(|v| v.0).collect())
    }
}

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
    /// [`FEATURE_COMPACT_TENSORS`]); unknown ones are ignored.
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
    /// The same-host ring the server made for this connection (feature
    /// [`FEATURE_RING`]): its memfd is the WELCOME frame's one descriptor. The client
    /// answers with a RING frame ([`RingAnswer`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring: Option<RingOffer>,
}

/// The ring a server offers in its WELCOME.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RingOffer {
    /// Bytes of each of the two rings in the file (a power of two); the client refuses
    /// more than its own limit.
    pub capacity: u64,
}

/// The client's answer to a [`RingOffer`]: the last frame of the handshake (kind RING).
/// After `ready`, each side writes only through the ring (and the socket beside it, for
/// what the ring cannot carry); after `refused`, both stay on the socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum RingAnswer {
    /// The client mapped the ring.
    Ready,
    /// The client could not or would not use it.
    Refused {
        /// Why, in words.
        reason: String,
    },
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
    #[serde(deserialize_with = "wire_int::deserialize")]
    #[schemars(with = "WireInt")]
    pub stream: u64,
    /// Length of the tensor's bytes.
    #[serde(deserialize_with = "wire_int::deserialize")]
    #[schemars(with = "WireInt")]
    pub len: u64,
}

/// A range of a CUDA allocation exported with `cuIpcGetMemHandle`, leased to the receiver
/// until it sends a release for `lease`. Handles are base64; 64-bit values are JSON numbers
/// under the [`MAX_WIRE_INT`] rule, like every integer on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CudaIpcRef {
    /// UUID of the device the memory is on (`GPU-xxxxxxxx-...`), not its ordinal.
    pub device_uuid: String,
    /// Base64 of the 64-byte `CUipcMemHandle` of the allocation's base.
    pub mem_handle: String,
    /// The producer's id for the allocation (with `mem_handle`, the consumer's cache key).
    #[serde(deserialize_with = "wire_int::deserialize")]
    #[schemars(with = "WireInt")]
    pub alloc_id: u64,
    /// Size of the whole allocation in bytes.
    #[serde(deserialize_with = "wire_int::deserialize")]
    #[schemars(with = "WireInt")]
    pub alloc_size: u64,
    /// Offset of the tensor's bytes from the allocation base.
    #[serde(deserialize_with = "wire_int::deserialize")]
    #[schemars(with = "WireInt")]
    pub offset: u64,
    /// Length in bytes.
    #[serde(deserialize_with = "wire_int::deserialize")]
    #[schemars(with = "WireInt")]
    pub len: u64,
    /// Base64 of the 64-byte `CUipcEventHandle` recorded after the producer's writes; the
    /// consumer waits on it before handing the tensor out.
    pub event_handle: String,
    /// Lease id to release when done.
    #[serde(deserialize_with = "wire_int::deserialize")]
    #[schemars(with = "WireInt")]
    pub lease: u64,
}

/// A range inside a CUDA lease the receiver itself granted (so: its own device memory),
/// sent back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CudaIpcReturnRef {
    /// The receiver's lease id.
    #[serde(deserialize_with = "wire_int::deserialize")]
    #[schemars(with = "WireInt")]
    pub lease: u64,
    /// Offset inside the leased range.
    #[serde(deserialize_with = "wire_int::deserialize")]
    #[schemars(with = "WireInt")]
    pub offset: u64,
    /// Length in bytes.
    #[serde(deserialize_with = "wire_int::deserialize")]
    #[schemars(with = "WireInt")]
    pub len: u64,
    /// Base64 of the 64-byte `CUipcEventHandle` the sender recorded after its last use of
    /// the bytes; the receiver waits on it before handing the tensor out.
    pub event_handle: String,
}

/// A range of one of the sender's shared-memory segments, leased to the receiver until it
/// sends a release for `lease`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ShmRef {
    /// Segment id, chosen by the sender and announced with the first message that uses it.
    #[serde(deserialize_with = "wire_int::deserialize")]
    #[schemars(with = "WireInt")]
    pub segment: u64,
    /// Offset of the tensor's bytes in the segment.
    #[serde(deserialize_with = "wire_int::deserialize")]
    #[schemars(with = "WireInt")]
    pub offset: u64,
    /// Length in bytes.
    #[serde(deserialize_with = "wire_int::deserialize")]
    #[schemars(with = "WireInt")]
    pub len: u64,
    /// Lease id to release when done.
    #[serde(deserialize_with = "wire_int::deserialize")]
    #[schemars(with = "WireInt")]
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
    #[serde(deserialize_with = "wire_int::deserialize")]
    #[schemars(with = "WireInt")]
    pub size: u64,
}

/// A range inside a lease the receiver itself granted (so: its own memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ShmReturnRef {
    /// The receiver's lease id.
    #[serde(deserialize_with = "wire_int::deserialize")]
    #[schemars(with = "WireInt")]
    pub lease: u64,
    /// Offset inside the leased range.
    #[serde(deserialize_with = "wire_int::deserialize")]
    #[schemars(with = "WireInt")]
    pub offset: u64,
    /// Length in bytes.
    #[serde(deserialize_with = "wire_int::deserialize")]
    #[schemars(with = "WireInt")]
    pub len: u64,
}

/// A byte range of the frame payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct InlineRef {
    /// Offset from the start of the payload (a multiple of 64 when written by ferry).
    #[serde(deserialize_with = "wire_int::deserialize")]
    #[schemars(with = "WireInt")]
    pub offset: u64,
    /// Length in bytes.
    #[serde(deserialize_with = "wire_int::deserialize")]
    #[schemars(with = "WireInt")]
    pub len: u64,
}

/// The JSON header of a CONTROL frame: a message from one channel session to its peer
/// (e.g. shm lease releases). The body of each channel is a wire type too: [`ShmControl`]
/// and [`CudaIpcControl`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ControlHeader {
    /// The channel the message is for.
    pub channel: String,
    /// Channel-specific body.
    pub body: serde_json::Value,
}

/// The CONTROL body of the shm channel (`ControlHeader::body` when `channel` is `"shm"`,
/// PROTOCOL.md §11.5). Parsed strictly: an unknown field is an error.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShmControl {
    /// Leases the sender of this frame no longer needs (possibly none).
    #[serde(deserialize_with = "wire_int::vec")]
    #[schemars(with = "Vec<WireInt>")]
    pub release: Vec<u64>,
    /// Segments of the sender of this frame that it will never use again (only on a
    /// connection that agreed to the feature `shm_forget`): the receiver unmaps them.
    /// Absent when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "wire_int::vec")]
    #[schemars(with = "Vec<WireInt>")]
    pub forget: Vec<u64>,
}

/// The CONTROL body of the cuda-ipc channel (`ControlHeader::body` when `channel` is
/// `"cuda-ipc"`, PROTOCOL.md §17.3). Either side may send either part; each is absent when
/// empty. Parsed strictly: an unknown field is an error (the cuda-ipc session also refuses
/// a `release` without a valid `device` and `event`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CudaIpcControl {
    /// Leases the sender of this frame no longer needs, all on `device`.
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "wire_int::vec")]
    #[schemars(with = "Vec<WireInt>")]
    pub release: Vec<u64>,
    /// UUID of the device of the released leases (`GPU-...` or `MIG-...`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Base64 of the 64-byte `CUipcEventHandle` recorded after the sender's last use of the
    /// released leases; the owner orders any reuse of the memory after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// Allocations the sender of this frame has freed (their `alloc_id`s); the receiver
    /// closes its mappings of them once no tensor uses them.
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "wire_int::vec")]
    #[schemars(with = "Vec<WireInt>")]
    pub retire: Vec<u64>,
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn control_bodies_round_trip_and_are_strict() {
        let shm = ShmControl { release: vec![1, 2, MAX_WIRE_INT], forget: vec![] };
        let v = serde_json::to_value(&shm).unwrap();
        assert_eq!(v, json!({"release": [1, 2, MAX_WIRE_INT]}));
        assert_eq!(serde_json::from_value::<ShmControl>(v).unwrap(), shm);
        let with_forget = json!({"release": [], "forget": [4_294_967_296u64]});
        assert_eq!(serde_json::from_value::<ShmControl>(with_forget).unwrap().forget, [1 << 32]);
        let cuda = CudaIpcControl {
            release: vec![12],
            device: Some("GPU-00".into()),
            event: Some("ZZ".into()),
            retire: vec![3],
        };
        let v = serde_json::to_value(&cuda).unwrap();
        assert_eq!(v, json!({"release": [12], "device": "GPU-00", "event": "ZZ", "retire": [3]}));
        assert_eq!(serde_json::from_value::<CudaIpcControl>(v).unwrap(), cuda);
        assert_eq!(serde_json::to_value(CudaIpcControl::default()).unwrap(), json!({}));
        for (bad, needle) in [
            (json!({"free": [1]}), "unknown field `free`"),
            (json!({}), "missing field `release`"),
            (json!({"release": [-1]}), "invalid value: integer `-1`"),
            (json!({"release": ["1"]}), "invalid type: string"),
            (json!({"release": [9_007_199_254_740_992u64]}), "0..=9007199254740991"),
            (json!({"release": [], "forget": [u64::MAX]}), "2^53 - 1"),
        ] {
            let e = serde_json::from_value::<ShmControl>(bad.clone()).unwrap_err().to_string();
            assert!(e.contains(needle), "{bad}: {e}");
        }
        for (bad, needle) in [
            (json!({"release": [1], "evnt": "x"}), "unknown field `evnt`"),
            (json!({"retire": ["3"]}), "invalid type: string \"3\""),
            (json!({"retire": [9_007_199_254_740_992u64]}), "0..=9007199254740991"),
        ] {
            let e = serde_json::from_value::<CudaIpcControl>(bad.clone()).unwrap_err().to_string();
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }

    #[test]
    fn cuda_ipc_values_are_numbers_under_the_rule() {
        let r = CudaIpcRef {
            device_uuid: "GPU-00".into(),
            mem_handle: "m".into(),
            alloc_id: 3,
            alloc_size: 64 << 20,
            offset: 0,
            len: 24_883_200,
            event_handle: "e".into(),
            lease: 12,
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["alloc_size"], json!(64u64 << 20));
        assert_eq!(serde_json::from_value::<CudaIpcRef>(v.clone()).unwrap(), r);
        for field in ["alloc_id", "alloc_size", "offset", "len", "lease"] {
            let mut big = v.clone();
            big[field] = json!(MAX_WIRE_INT + 1);
            let e = serde_json::from_value::<CudaIpcRef>(big).unwrap_err().to_string();
            assert!(e.contains("2^53 - 1"), "{field}: {e}");
            let mut text = v.clone();
            text[field] = json!("3");
            assert!(serde_json::from_value::<CudaIpcRef>(text).is_err(), "{field} as a decimal string");
        }
        let back = json!({"lease": 1, "offset": MAX_WIRE_INT, "len": 0, "event_handle": "e"});
        assert_eq!(serde_json::from_value::<CudaIpcReturnRef>(back).unwrap().offset, MAX_WIRE_INT);
        let e = serde_json::from_value::<QuicStreamRef>(json!({"stream": 2, "len": MAX_WIRE_INT + 1})).unwrap_err();
        assert!(e.to_string().contains("2^53 - 1"), "{e}");
    }
}
