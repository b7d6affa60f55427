//! The shared test vectors, `conformance/vectors/*.json`: bytes on the wire (hex) with
//! what they mean, or with the error a receiver must report. The Rust implementation
//! writes every byte here (its wire types' serde, `FramePrefix::encode`, `DescsOut`,
//! `server_choose`, `ErrorObject`'s constructors); what a receiver must make of malformed
//! input is the specification's (PROTOCOL.md §7.2, §10.2), stated here once.
//!
//! Two test suites read every vector with their own implementation and assert the same
//! meaning: Rust (`conformance/tests/vectors.rs`; the Python package runs on that core)
//! and TypeScript (`sdks/typescript/test/vectors.test.ts`).
//! An error is `{"kind": "protocol_error" | "limit", "contains": TEXT}`: the CLOSE code a
//! receiver answers with and a fragment every implementation's message has (absent where
//! the implementations word it differently).
//!
//! Files: `frames.json` (preambles, a frame of every kind, malformed prefixes and headers),
//! `messages.json` (MESSAGE frames with inline tensors, and malformed ones),
//! `descriptors.json` (tensor descriptors in their object and compact forms),
//! `handshake.json` (HELLO answered by WELCOME or REFUSE, WELCOMEs a client accepts or
//! refuses, every refusal), `errors.json` (JSON-RPC error objects) and
//! `worked_example.json` (PROTOCOL.md §14, byte for byte), `packed.json` (packed ring
//! records, PROTOCOL.md §22.5; read by the Rust suite only: [`packed`]).

use std::path::PathBuf;

use ferry_core::compact::DescsOut;
use ferry_core::frame::{FrameKind, FramePrefix, preamble};
use ferry_core::meta::TensorMeta;
use ferry_core::wire::{
    ChannelOffer, Close, ControlHeader, Hello, InlineRef, Limits, Location, MessageHeader, PROTOCOL, PROTOCOL_VERSION,
    ShmRef, ShmReturnRef, TensorDesc,
};
use ferry_core::{DType, DeviceKind};
use serde_json::{Value, json};

use super::Output;

mod more;
pub mod packed;

/// The directory of the vectors.
pub const DIR: &str = "conformance/vectors";

/// Every vector file.
pub fn output() -> Output {
    let dir = PathBuf::from(DIR);
    let files = [
        ("frames.json", frames()),
        ("messages.json", messages()),
        ("descriptors.json", more::descriptors()),
        ("handshake.json", more::handshake()),
        ("errors.json", more::errors()),
        ("worked_example.json", worked_example()),
        ("packed.json", packed::packed()),
    ];
    let files = files.into_iter().map(|(name, v)| (dir.join(name), pretty(&v))).collect();
    Output { dir, exts: &["json"], files }
}

fn pretty(v: &Value) -> String {
    let mut s = serde_json::to_string_pretty(v).expect("a Value serializes");
    s.push('\n');
    s
}

/// Lowercase hex, no separators.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An expected error: the CLOSE code and, where all implementations share it, a fragment
/// of the message.
pub fn error(kind: &str, contains: Option<&str>) -> Value {
    match contains {
        Some(c) => json!({"kind": kind, "contains": c}),
        None => json!({"kind": kind}),
    }
}

/// The bytes of one frame: prefix, header, payload.
pub fn frame_bytes(kind: u8, flags: u8, fds: u16, header: &[u8], payload: &[u8]) -> Vec<u8> {
    let prefix = FramePrefix {
        kind,
        flags,
        fds,
        header_len: u32::try_from(header.len()).expect("a small header"),
        payload_len: payload.len() as u64,
    };
    let mut out = prefix.encode().to_vec();
    out.extend_from_slice(header);
    out.extend_from_slice(payload);
    out
}

/// A valid frame vector: its bytes and its meaning.
fn valid(name: &str, kind: FrameKind, header: &[u8], payload: &[u8]) -> Value {
    let text = std::str::from_utf8(header).expect("serde_json writes UTF-8");
    json!({
        "name": name,
        "hex": hex(&frame_bytes(kind as u8, 0, 0, header, payload)),
        "kind": kind as u8,
        "kind_name": format!("{kind:?}").to_uppercase(),
        "header_json": text,
        "header": serde_json::from_str::<Value>(text).expect("valid JSON"),
        "payload_hex": hex(payload),
    })
}

fn to_json<T: serde::Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("wire types serialize")
}

fn limits_json(l: &Limits) -> Value {
    serde_json::to_value(l).expect("limits serialize")
}

/// The HELLO of PROTOCOL.md §14: inline only, agent `example-py/0.1`, nothing optional.
pub fn minimal_hello() -> Hello {
    Hello {
        protocol: PROTOCOL.into(),
        version: PROTOCOL_VERSION,
        channels: vec![inline_offer()],
        token: None,
        agent: "example-py/0.1".into(),
        limits: None,
        features: vec![],
    }
}

pub fn inline_offer() -> ChannelOffer {
    ChannelOffer { name: "inline".into(), devices: vec![DeviceKind::Cpu], domain: Default::default() }
}

/// An inline descriptor of a contiguous CPU tensor.
pub fn inline_desc(dtype: DType, shape: &[u64], offset: u64, len: u64) -> TensorDesc {
    TensorDesc { meta: TensorMeta::new(dtype, shape.to_vec()), data: Location::Inline(InlineRef { offset, len }) }
}

/// The MESSAGE of PROTOCOL.md §14: `{"op":"echo"}` and one f32 `[1.0, 2.0]`.
pub fn echo_message() -> (Vec<u8>, Vec<u8>) {
    let h = MessageHeader { header: json!({"op": "echo"}), tensors: vec![inline_desc(DType::F32, &[2], 0, 8)] };
    let payload: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    (to_json(&h), payload)
}

/// A MESSAGE header as the Pipe writes it (`header`, then `tensors`), descriptors compact
/// or not.
fn message_header(header: Value, descs: &[TensorDesc], compact: bool) -> Vec<u8> {
    let descs = to_json(&DescsOut { descs, compact });
    [&b"{\"header\":"[..], &to_json(&header), b",\"tensors\":", &descs, b"}"].concat()
}

fn frames() -> Value {
    let (echo_h, echo_p) = echo_message();
    let full_hello = Hello {
        channels: vec![
            ChannelOffer {
                name: "shm".into(),
                devices: vec![DeviceKind::Cpu],
                domain: [("boot_id".to_owned(), "b0".to_owned())].into(),
            },
            inline_offer(),
        ],
        token: Some("s3cret".into()),
        limits: Some(Limits::default()),
        features: ferry_core::wire::FEATURES.iter().map(|f| (*f).to_owned()).collect(),
        ..minimal_hello()
    };
    let welcome = more::welcome_for(&minimal_hello());
    let compact = message_header(json!({"id": 1}), &[inline_desc(DType::U8, &[3], 0, 3)], true);
    let control = ControlHeader { channel: "shm".into(), body: json!({"release": [1]}) };
    let mut frames = vec![
        valid("hello_minimal", FrameKind::Hello, &to_json(&minimal_hello()), &[]),
        valid("hello_full", FrameKind::Hello, &to_json(&full_hello), &[]),
        valid("welcome", FrameKind::Welcome, &to_json(&welcome), &[]),
        valid("message_echo", FrameKind::Message, &echo_h, &echo_p),
        valid("message_compact", FrameKind::Message, &compact, &[1, 2, 3]),
        valid("message_no_tensors", FrameKind::Message, br#"{"header":null,"tensors":[]}"#, &[]),
        valid("control", FrameKind::Control, &to_json(&control), &[]),
        valid(
            "close_normal",
            FrameKind::Close,
            &to_json(&Close { code: "normal".into(), message: String::new() }),
            &[],
        ),
        valid(
            "close_protocol_error",
            FrameKind::Close,
            &to_json(&Close { code: "protocol_error".into(), message: "tensor 0: bad range".into() }),
            &[],
        ),
    ];
    for (name, r) in more::refusals() {
        frames.push(valid(&format!("refuse_{name}"), FrameKind::Refuse, &to_json(&r), &[]));
    }
    let small = Limits { max_header_bytes: 16, max_payload_bytes: 4, ..Limits::default() };
    let bad = |name: &str, bytes: Vec<u8>, limits: Option<&Limits>, err: Value| {
        let mut v = json!({"name": name, "hex": hex(&bytes), "error": err});
        if let Some(l) = limits {
            v["limits"] = limits_json(l);
        }
        v
    };
    let close = br#"{"code":"normal","message":""}"#;
    let proto = |c: &str| error("protocol_error", Some(c));
    let limit = |c: &str| error("limit", Some(c));
    let malformed = vec![
        bad("kind_0", frame_bytes(0, 0, 0, close, &[]), None, proto("unexpected frame kind 0")),
        // 7 is RING (the same-host ring, PROTOCOL.md §22): known, refused where no ring was agreed.
        bad("kind_8", frame_bytes(8, 0, 0, close, &[]), None, proto("unexpected frame kind 8")),
        bad("kind_255", frame_bytes(255, 0, 0, close, &[]), None, proto("unexpected frame kind 255")),
        bad("flags_1", frame_bytes(6, 1, 0, close, &[]), None, proto("frame flags 0x01 are reserved")),
        bad("flags_80", frame_bytes(6, 0x80, 0, close, &[]), None, proto("frame flags 0x80 are reserved")),
        bad("header_over_limit", frame_bytes(6, 0, 0, close, &[]), Some(&small), limit("max_header_bytes")),
        bad("payload_over_limit", frame_bytes(4, 0, 0, b"{}", &[0; 5]), Some(&small), limit("max_payload_bytes")),
        bad("fds_over_limit", frame_bytes(6, 0, 65, close, &[]), None, limit("max_fds")),
        // Several limits at once: the first in the prefix's order of checks is named.
        bad("header_and_fds_over_limit", frame_bytes(6, 0, 65, close, &[]), Some(&small), limit("max_header_bytes")),
        bad("kind_and_limit", frame_bytes(9, 0, 65, close, &[]), Some(&small), proto("unexpected frame kind 9")),
        bad("fds_never_arrive", frame_bytes(6, 0, 1, close, &[]), None, proto("file descriptor mismatch")),
        bad("header_not_json", frame_bytes(6, 0, 0, br#"{"code":"#, &[]), None, proto("malformed frame header")),
        bad("header_not_utf8", frame_bytes(6, 0, 0, b"\"\xff\"", &[]), None, proto("malformed frame header")),
        bad("header_empty", frame_bytes(6, 0, 0, b"", &[]), None, proto("malformed frame header")),
        bad("header_two_values", frame_bytes(6, 0, 0, b"{} {}", &[]), None, proto("malformed frame header")),
    ];
    let mut preambles = vec![json!({"name": "version_1", "hex": hex(&preamble(1)), "version": 1})];
    preambles.push(json!({"name": "version_2", "hex": hex(&preamble(2)), "version": 2}));
    for (name, bytes) in [("plain_json", &b"{\"jsonrp"[..]), ("http", b"GET / HT"), ("png", b"\x89PNG\r\n\x1a\n")] {
        preambles.push(json!({"name": name, "hex": hex(bytes), "error": proto("not a ferry peer")}));
    }
    json!({
        "about": "Frames (PROTOCOL.md §3, §4, §10.2). `preambles`: 8 bytes each, a version or an error. \
                  `frames`: one valid frame each (after the preamble), with its prefix fields, header \
                  (text as written and value) and payload. `malformed`: one frame each that a receiver \
                  with `limits` (default: `default_limits`) refuses with `error`.",
        "default_limits": limits_json(&Limits::default()),
        "preambles": preambles,
        "frames": frames,
        "malformed": malformed,
    })
}

/// A MESSAGE vector: the frame and the tensors it must decode to.
fn message(name: &str, header: Value, descs: &[TensorDesc], payload: &[u8]) -> Value {
    let h = message_header(header.clone(), descs, false);
    let tensors: Vec<Value> = descs
        .iter()
        .map(|d| {
            let Location::Inline(r) = &d.data else { unreachable!("inline vectors only") };
            let bytes = &payload[r.offset as usize..(r.offset + r.len) as usize];
            let mut t = json!({"dtype": d.meta.dtype, "shape": d.meta.shape, "data_hex": hex(bytes)});
            if let Some(s) = &d.meta.strides {
                t["strides"] = json!(s);
            }
            t
        })
        .collect();
    json!({"name": name, "hex": hex(&frame_bytes(4, 0, 0, &h, payload)), "header": header, "tensors": tensors})
}

fn messages() -> Value {
    let (echo_h, echo_p) = echo_message();
    let echo = json!({
        "name": "echo",
        "hex": hex(&frame_bytes(4, 0, 0, &echo_h, &echo_p)),
        "header": {"op": "echo"},
        "tensors": [{"dtype": "f32", "shape": [2], "data_hex": hex(&echo_p)}],
    });
    // PROTOCOL.md §7.1: u8[3] at 0, 61 bytes of padding, f32[2] at 64.
    let mut two = vec![1u8, 2, 3];
    two.resize(64, 0);
    two.extend([1.0f32, 2.0].iter().flat_map(|x| x.to_le_bytes()));
    let two_descs = [inline_desc(DType::U8, &[3], 0, 3), inline_desc(DType::F32, &[2], 64, 8)];
    let strided = TensorDesc {
        meta: TensorMeta::new(DType::I32, vec![2, 2]).with_strides(vec![1, 2]),
        data: Location::Inline(InlineRef { offset: 0, len: 16 }),
    };
    let broadcast = TensorDesc {
        meta: TensorMeta::new(DType::U16, vec![3, 2]).with_strides(vec![0, 1]),
        data: Location::Inline(InlineRef { offset: 0, len: 4 }),
    };
    let counting: Vec<u8> = (0u8..16).collect();
    // Every dtype, one element (two for the 1-byte types), one after another at aligned offsets.
    let mut all = Vec::new();
    let mut all_payload = Vec::new();
    for d in DType::ALL {
        let n = if d.itemsize() == 1 { 2 } else { 1 };
        let off = all_payload.len().div_ceil(64) * 64;
        all_payload.resize(off, 0);
        all_payload.extend(
            (0..n * d.itemsize())
                .map(|i| if d == DType::Bool { (i % 2) as u8 } else { (i as u8).wrapping_mul(0x11).wrapping_add(1) }),
        );
        all.push(inline_desc(d, &[n as u64], off as u64, (n * d.itemsize()) as u64));
    }
    let messages = vec![
        echo,
        message("two_tensors_padded", json!({"id": 7, "jsonrpc": "2.0", "method": "add"}), &two_descs, &two),
        message("no_tensors", json!([1, "two", null, {"three": 3.5}]), &[], &[]),
        message("strided", json!(null), &[strided], &counting),
        message("broadcast_zero_stride", json!(null), &[broadcast], &counting[..4]),
        message("scalar", json!("s"), &[inline_desc(DType::I64, &[], 0, 8)], &counting[..8]),
        message("empty_tensor", json!(0), &[inline_desc(DType::F64, &[0, 3], 0, 0)], &[]),
        message("every_dtype", json!({"all": true}), &all, &all_payload),
        message("unaligned_offset", json!(null), &[inline_desc(DType::F32, &[1], 4, 4)], &counting[..8]),
        message("payload_beyond_tensors", json!(null), &[inline_desc(DType::U8, &[2], 0, 2)], &counting[..8]),
    ];
    let proto = |c: Option<&str>| error("protocol_error", c);
    let bad = |name: &str, header: &str, payload: &[u8], limits: Option<Limits>, err: Value| {
        let mut v = json!({"name": name, "hex": hex(&frame_bytes(4, 0, 0, header.as_bytes(), payload)), "error": err});
        if let Some(l) = limits {
            v["limits"] = limits_json(&l);
        }
        v
    };
    let one = |meta: &str, data: &str| format!(r#"{{"header":null,"tensors":[{{"meta":{meta},"data":{data}}}]}}"#);
    let f32_2 = r#"{"dtype":"f32","shape":[2],"device":"cpu"}"#;
    let at = |o: u64, l: u64| format!(r#"{{"inline":{{"offset":{o},"len":{l}}}}}"#);
    let dims65 = format!(r#"{{"dtype":"u8","shape":[{}],"device":"cpu"}}"#, vec!["1"; 65].join(","));
    let tensor0 = Some("tensor 0");
    let malformed = vec![
        bad(
            "too_many_tensors",
            &String::from_utf8(message_header(json!(null), &two_descs, false)).expect("UTF-8"),
            &two,
            Some(Limits { max_tensors: 1, ..Limits::default() }),
            error("limit", Some("max_tensors")),
        ),
        bad("range_outside_payload", &one(f32_2, &at(8, 8)), &[0; 8], None, proto(tensor0)),
        bad("range_overflows_u64", &one(f32_2, &at(u64::MAX, 8)), &[0; 8], None, proto(None)),
        bad("span_below_len", &one(f32_2, &at(0, 12)), &[0; 12], None, proto(tensor0)),
        bad(
            "span_above_len",
            &one(r#"{"dtype":"f32","shape":[3],"device":"cpu"}"#, &at(0, 8)),
            &[0; 8],
            None,
            proto(tensor0),
        ),
        bad(
            "strided_span_above_len",
            &one(r#"{"dtype":"u8","shape":[2,2],"strides":[2,1],"device":"cpu"}"#, &at(0, 3)),
            &[0; 4],
            None,
            proto(tensor0),
        ),
        bad(
            "negative_stride",
            &one(r#"{"dtype":"u8","shape":[2],"strides":[-1],"device":"cpu"}"#, &at(0, 2)),
            &[0; 2],
            None,
            proto(tensor0),
        ),
        bad(
            "strides_per_dimension",
            &one(r#"{"dtype":"u8","shape":[2,1],"strides":[1],"device":"cpu"}"#, &at(0, 2)),
            &[0; 2],
            None,
            proto(tensor0),
        ),
        bad(
            "size_overflows_u64",
            &one(r#"{"dtype":"f64","shape":[4294967296,4294967296],"device":"cpu"}"#, &at(0, 0)),
            &[],
            None,
            proto(tensor0),
        ),
        bad("too_many_dims", &one(&dims65, &at(0, 1)), &[0], None, proto(tensor0)),
        bad(
            "cuda_device_inline",
            &one(r#"{"dtype":"f32","shape":[2],"device":"cuda:0"}"#, &at(0, 8)),
            &[0; 8],
            None,
            proto(tensor0),
        ),
        bad(
            "shm_on_an_inline_connection",
            &one(f32_2, r#"{"shm":{"segment":1,"offset":0,"len":8,"lease":1}}"#),
            &[],
            None,
            proto(Some("unexpected location")),
        ),
        bad(
            "unknown_dtype",
            &one(r#"{"dtype":"f128","shape":[1],"device":"cpu"}"#, &at(0, 16)),
            &[0; 16],
            None,
            proto(Some("f128")),
        ),
        bad("no_header_field", r#"{"tensors":[]}"#, &[], None, proto(Some("malformed frame header"))),
        bad("compact_missing_element", r#"{"header":null,"tensors":[["u8",[1],"inline",0]]}"#, &[0], None, proto(None)),
        bad(
            "compact_unknown_location",
            r#"{"header":null,"tensors":[["u8",[1],"quic",0,1]]}"#,
            &[0],
            None,
            proto(None),
        ),
    ];
    json!({
        "about": "MESSAGE frames on an inline connection (PROTOCOL.md §7). `messages`: a frame (hex, with \
                  its prefix) and what it decodes to: the application header and each tensor's dtype, \
                  shape, strides (when given) and the bytes of its span. `malformed`: a frame a receiver \
                  with `limits` (default: the protocol's) refuses with `error`. Tensor i's error has \
                  `tensor i` in it.",
        "messages": messages,
        "malformed": malformed,
    })
}

/// PROTOCOL.md §14: the bytes of a whole inline session, in order.
fn worked_example() -> Value {
    let pre = preamble(PROTOCOL_VERSION);
    let hello = to_json(&minimal_hello());
    let welcome = to_json(&more::welcome_for(&minimal_hello()));
    let (msg_h, msg_p) = echo_message();
    let close = to_json(&Close { code: "normal".into(), message: String::new() });
    let step = |n: u32, from: &str, what: &str, bytes: Vec<u8>| json!({"step": n, "from": from, "what": what, "hex": hex(&bytes), "len": bytes.len()});
    json!({
        "about": "PROTOCOL.md §14, byte for byte: each step's bytes as the hex dumps of the document show \
                  them (the Rust test reads the dumps out of PROTOCOL.md and compares). Frames decode to \
                  the same meaning as in frames.json.",
        "steps": [
            step(1, "client", "preamble", pre.to_vec()),
            step(2, "client", "HELLO", frame_bytes(1, 0, 0, &hello, &[])),
            step(3, "server", "preamble", pre.to_vec()),
            step(4, "server", "WELCOME", frame_bytes(2, 0, 0, &welcome, &[])),
            step(5, "client", "MESSAGE", frame_bytes(4, 0, 0, &msg_h, &msg_p)),
            step(6, "either", "CLOSE", frame_bytes(6, 0, 0, &close, &[])),
        ],
    })
}

/// Descriptor locations the compact form has, for [`more::descriptors`].
pub fn shm(segment: u64, offset: u64, len: u64, lease: u64, lazy: bool) -> Location {
    Location::Shm(ShmRef { segment, offset, len, lease, announce: None, lazy_release: lazy })
}

/// A `shm_return` location.
pub fn shm_return(lease: u64, offset: u64, len: u64) -> Location {
    Location::ShmReturn(ShmReturnRef { lease, offset, len })
}
