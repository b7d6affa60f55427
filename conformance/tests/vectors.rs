//! The shared test vectors (`conformance/vectors/*.json`, written by `cargo xtask codegen`)
//! read back by the Rust implementation: every frame through the real `FrameReader`,
//! every header through the wire types, every MESSAGE through the inline channel's
//! decoding, every HELLO through `server_decide`, every WELCOME through `client_accept`.
//! The TypeScript SDK (`sdks/typescript/test/vectors.test.ts`) reads the same files (the
//! Python package runs on this implementation). The worked example is
//! also compared with the hex dumps of PROTOCOL.md §14.

use std::path::PathBuf;
use std::sync::Arc;

use ferry_core::compact::DescsOut;
use ferry_core::frame::{Frame, FrameKind, FramePrefix, FrameReader, PREFIX_LEN, parse_preamble};
use ferry_core::handshake::{ServerPolicy, client_accept, server_decide};
use ferry_core::inline::decode_inline;
use ferry_core::wire::{
    ChannelOffer, Close, ControlHeader, Hello, Limits, MessageHeader, PROTOCOL_VERSION, Refusal, RingAnswer,
    TensorDesc, Welcome,
};
use ferry_core::{Channel, ConnInfo, Device, Incoming, InlineChannel, PipeError, ProtocolError};
use ferry_rpc::ErrorObject;
use serde_json::{Value, json};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("conformance/ is in the repository root").to_path_buf()
}

fn load(name: &str) -> Value {
    let path = root().join("conformance/vectors").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex {s}");
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_else(|| panic!("{key} in {v}"))
}

fn limits_of(v: &Value, default: Limits) -> Limits {
    if v["limits"].is_null() { default } else { serde_json::from_value(v["limits"].clone()).unwrap() }
}

/// Reads one frame of `bytes` (no preamble) with the real reader.
fn read_frame(bytes: Vec<u8>, limits: Limits) -> Result<Frame, PipeError> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async move {
        FrameReader::new(Box::new(std::io::Cursor::new(bytes)), None, limits).read_frame().await?.into_frame()
    })
}

/// The CLOSE code a receiver answers `e` with (PROTOCOL.md §10.2).
fn close_code(e: &PipeError) -> &'static str {
    if matches!(e, PipeError::Limit(_)) { "limit" } else { "protocol_error" }
}

/// Checks an error against the vector's `{"kind", "contains"}`.
fn check_error(name: &str, e: &PipeError, want: &Value) {
    assert_eq!(close_code(e), s(want, "kind"), "{name}: {e}");
    if let Some(c) = want["contains"].as_str() {
        assert!(e.to_string().contains(c), "{name}: {e:?} does not say {c:?}");
    }
}

/// Parses a frame's header as the type of its kind and writes it back (as the writer
/// would: a MESSAGE's descriptors compact when `compact`).
fn typed_roundtrip(f: &Frame, compact: bool) -> Result<Vec<u8>, ProtocolError> {
    let to = |v: Result<Vec<u8>, serde_json::Error>| v.unwrap();
    Ok(match f.kind {
        FrameKind::Hello => to(serde_json::to_vec(&f.parse::<Hello>()?)),
        FrameKind::Welcome => to(serde_json::to_vec(&f.parse::<Welcome>()?)),
        FrameKind::Refuse => to(serde_json::to_vec(&f.parse::<Refusal>()?)),
        FrameKind::Message => {
            let m: MessageHeader = f.parse()?;
            let descs = to(serde_json::to_vec(&DescsOut { descs: &m.tensors, compact }));
            [&b"{\"header\":"[..], &to(serde_json::to_vec(&m.header)), b",\"tensors\":", &descs, b"}"].concat()
        }
        FrameKind::Control => to(serde_json::to_vec(&f.parse::<ControlHeader>()?)),
        FrameKind::Close => to(serde_json::to_vec(&f.parse::<Close>()?)),
        // The doorbell has no header; the handshake's answer has one.
        FrameKind::Ring if f.header.is_empty() => Vec::new(),
        FrameKind::Ring => to(serde_json::to_vec(&f.parse::<RingAnswer>()?)),
    })
}

#[test]
fn preambles() {
    let v = load("frames.json");
    for p in v["preambles"].as_array().unwrap() {
        let bytes: [u8; 8] = unhex(s(p, "hex")).try_into().unwrap();
        match (parse_preamble(&bytes), p.get("version")) {
            (Ok(version), Some(want)) => assert_eq!(u64::from(version), want.as_u64().unwrap(), "{p}"),
            (Err(e), None) => check_error(s(p, "name"), &e.into(), &p["error"]),
            (got, _) => panic!("{}: got {got:?}", s(p, "name")),
        }
    }
}

#[test]
fn frames_decode_and_encode() {
    let v = load("frames.json");
    let frames = v["frames"].as_array().unwrap();
    assert!(frames.len() >= 6);
    let mut kinds = std::collections::BTreeSet::new();
    for f in frames {
        let name = s(f, "name");
        let bytes = unhex(s(f, "hex"));
        let prefix = FramePrefix::decode(&bytes[..PREFIX_LEN].try_into().unwrap());
        assert_eq!(u64::from(prefix.kind), f["kind"].as_u64().unwrap(), "{name}");
        assert_eq!((prefix.flags, prefix.fds), (0, 0), "{name}");
        let frame = read_frame(bytes.clone(), Limits::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
        kinds.insert(frame.kind as u8);
        assert_eq!(format!("{:?}", frame.kind).to_uppercase(), s(f, "kind_name"), "{name}");
        assert_eq!(frame.header, s(f, "header_json").as_bytes(), "{name}");
        assert_eq!(serde_json::from_slice::<Value>(&frame.header).unwrap(), f["header"], "{name}");
        assert_eq!(&frame.payload[..], unhex(s(f, "payload_hex")), "{name}");
        // The wire types read it and write the same bytes back.
        let back = typed_roundtrip(&frame, name.contains("compact")).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(String::from_utf8(back).unwrap(), s(f, "header_json"), "{name}");
        let mut again = prefix.encode().to_vec();
        again.extend_from_slice(&frame.header);
        again.extend_from_slice(&frame.payload);
        assert_eq!(again, bytes, "{name}");
    }
    assert_eq!(kinds.len(), 6, "a frame of every kind");
}

#[test]
fn malformed_frames_are_refused() {
    let v = load("frames.json");
    for f in v["malformed"].as_array().unwrap() {
        let name = s(f, "name");
        let limits = limits_of(f, Limits::default());
        let err = match read_frame(unhex(s(f, "hex")), limits) {
            Err(e) => e,
            // A body that reads is refused when its header is parsed.
            Ok(frame) => match frame.parse::<Value>() {
                Err(e) => e.into(),
                Ok(h) => panic!("{name}: accepted, header {h}"),
            },
        };
        check_error(name, &err, &f["error"]);
    }
}

/// What the inline channel and the pipe make of a MESSAGE frame (`decode_message` in
/// pipe.rs, on a connection whose only channel is inline).
fn decode_message(bytes: Vec<u8>, limits: Limits) -> Result<(Value, Vec<ferry_core::Tensor>), PipeError> {
    let frame = read_frame(bytes, limits)?;
    assert_eq!(frame.kind, FrameKind::Message);
    let h: MessageHeader = frame.parse()?;
    if h.tensors.len() as u64 > u64::from(limits.max_tensors) {
        return Err(PipeError::Limit(ferry_core::LimitError {
            limit: "max_tensors",
            what: "tensors in a received message",
            value: h.tensors.len() as u64,
            max: limits.max_tensors.into(),
            hint: "".into(),
        }));
    }
    let mut incoming = Incoming::new(
        frame.payload,
        #[cfg(unix)]
        Vec::new(),
    );
    let mut out = Vec::new();
    for (index, d) in h.tensors.into_iter().enumerate() {
        if d.meta.device != Device::Cpu {
            let reason = format!("no channel was negotiated for {:?} tensors", d.meta.device.kind());
            return Err(ProtocolError::BadTensor { index, reason }.into());
        }
        let t = decode_inline(d.meta, &d.data, &mut incoming)
            .map_err(|e| PipeError::from(ProtocolError::BadTensor { index, reason: e.to_string() }))?;
        out.push(t);
    }
    Ok((h.header, out))
}

#[test]
fn messages_decode() {
    let v = load("messages.json");
    for m in v["messages"].as_array().unwrap() {
        let name = s(m, "name");
        let (header, tensors) =
            decode_message(unhex(s(m, "hex")), Limits::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(header, m["header"], "{name}");
        let want = m["tensors"].as_array().unwrap();
        assert_eq!(tensors.len(), want.len(), "{name}");
        for (t, w) in tensors.iter().zip(want) {
            assert_eq!(t.dtype().name(), s(w, "dtype"), "{name}");
            assert_eq!(json!(t.shape()), w["shape"], "{name}");
            assert_eq!(t.meta().strides.as_ref().map(|s| json!(s)), w.get("strides").cloned(), "{name}");
            assert_eq!(t.as_bytes(), unhex(s(w, "data_hex")), "{name}");
        }
    }
    for m in v["malformed"].as_array().unwrap() {
        let name = s(m, "name");
        let limits = limits_of(m, Limits::default());
        match decode_message(unhex(s(m, "hex")), limits) {
            Ok(_) => panic!("{name}: accepted"),
            Err(e) => check_error(name, &e, &m["error"]),
        }
    }
}

#[test]
fn descriptors_in_both_forms() {
    let v = load("descriptors.json");
    for d in v["descriptors"].as_array().unwrap() {
        let name = s(d, "name");
        let object: TensorDesc = serde_json::from_str(s(d, "object_json")).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(serde_json::to_value(&object.meta).unwrap(), d["meta"], "{name}");
        assert_eq!(serde_json::to_value(&object.data).unwrap(), d["location"], "{name}");
        let one = std::slice::from_ref(&object);
        let written = |compact| serde_json::to_string(&DescsOut { descs: one, compact }).unwrap();
        assert_eq!(written(false), format!("[{}]", s(d, "object_json")), "{name}");
        match d["compact_json"].as_str() {
            Some(c) => {
                let compact: TensorDesc = serde_json::from_str(c).unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(compact, object, "{name}: both forms mean the same");
                assert_eq!(written(true), format!("[{c}]"), "{name}");
            }
            None => assert_eq!(written(true), written(false), "{name}: no compact form"),
        }
    }
    for d in v["malformed"].as_array().unwrap() {
        let r = serde_json::from_str::<TensorDesc>(s(d, "json"));
        assert!(r.is_err(), "{}: read as {r:?}", s(d, "name"));
    }
}

fn inline() -> Vec<Arc<dyn Channel>> {
    vec![Arc::new(InlineChannel)]
}

#[test]
fn handshake_server_side() {
    let v = load("handshake.json");
    let chans = inline();
    for h in v["hellos"].as_array().unwrap() {
        let name = s(h, "name");
        let policy = ServerPolicy {
            channels: &chans,
            version: PROTOCOL_VERSION,
            limits: Limits::default(),
            require_token: h["require_token"].as_str(),
        };
        let hello = serde_json::from_str::<Hello>(s(h, "hello_json")).map_err(|e| e.to_string());
        let preamble = u16::try_from(h["preamble_version"].as_u64().unwrap()).unwrap();
        let answer = &h["answer"];
        match server_decide(&policy, preamble, hello, &ConnInfo::default()) {
            Ok((welcome, _)) => {
                assert_eq!(s(answer, "kind"), "WELCOME", "{name}: welcomed");
                assert_eq!(serde_json::to_string(&welcome).unwrap(), s(answer, "json"), "{name}");
            }
            Err((refusal, _)) => {
                assert_eq!(s(answer, "kind"), "REFUSE", "{name}: refused with {refusal}");
                let got = serde_json::to_value(&refusal).unwrap();
                assert_eq!(got["reason"], answer["reason"], "{name}");
                if let Some(text) = answer["json"].as_str() {
                    assert_eq!(serde_json::to_string(&refusal).unwrap(), text, "{name}");
                }
            }
        }
    }
}

#[test]
fn handshake_client_side() {
    let v = load("handshake.json");
    let chans = inline();
    for w in v["welcomes"].as_array().unwrap() {
        let name = s(w, "name");
        let offered: Vec<ChannelOffer> = w["offered"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| ChannelOffer {
                name: n.as_str().unwrap().into(),
                devices: vec![ferry_core::DeviceKind::Cpu],
                domain: Default::default(),
            })
            .collect();
        let hello = Hello { channels: offered, ..serde_json::from_str(s(&v["hellos"][0], "hello_json")).unwrap() };
        let result = serde_json::from_str::<Welcome>(s(w, "welcome_json"))
            .map_err(|e| e.to_string())
            .and_then(|welcome| client_accept(&chans, &hello, &welcome).map(|_| welcome).map_err(|e| e.to_string()));
        match (result, w.get("peer_limits")) {
            (Ok(welcome), Some(limits)) => assert_eq!(serde_json::to_value(welcome.limits).unwrap(), *limits, "{name}"),
            (Err(e), None) => assert_eq!(s(&w["error"], "kind"), "protocol_error", "{name}: {e}"),
            (got, _) => panic!("{name}: {got:?}"),
        }
    }
    for r in v["refusals"].as_array().unwrap() {
        let name = s(r, "name");
        let refusal: Refusal = serde_json::from_str(s(r, "json")).unwrap_or_else(|e| panic!("{name}: {e}"));
        let known = r["known"].as_bool().unwrap();
        assert_eq!(refusal != Refusal::Unknown, known, "{name}");
        if known {
            assert_eq!(serde_json::to_string(&refusal).unwrap(), s(r, "json"), "{name}");
            assert_eq!(serde_json::to_value(&refusal).unwrap()["reason"], r["reason"], "{name}");
        }
    }
}

#[test]
fn error_objects() {
    let v = load("errors.json");
    for e in v["errors"].as_array().unwrap() {
        let name = s(e, "name");
        let obj: ErrorObject = serde_json::from_str(s(e, "json")).unwrap_or_else(|err| panic!("{name}: {err}"));
        assert_eq!(json!(obj.code), e["code"], "{name}");
        assert_eq!(json!(obj.known().map(|c| c.name)), e["error_name"], "{name}");
        assert_eq!(serde_json::to_string(&obj).unwrap(), s(e, "json"), "{name}");
    }
    let table = v["table"].as_object().unwrap();
    assert_eq!(table.len(), ferry_rpc::codes::ERROR_CODES.len());
    for row in ferry_rpc::codes::ERROR_CODES {
        assert_eq!(table[&row.code.to_string()]["name"], row.name);
    }
    assert_eq!(table["-32003"]["class"], "ServerTimeoutError", "one name for -32003 everywhere");
}

/// The bytes of each hex dump (a fenced block of `OFFSET  HEX.. |ASCII|` lines) in `text`.
fn hex_dumps(text: &str) -> Vec<Vec<u8>> {
    let mut dumps = Vec::new();
    let mut current: Option<Vec<u8>> = None;
    for line in text.lines() {
        if line.starts_with("```") {
            if let Some(d) = current.take().filter(|d| !d.is_empty()) {
                dumps.push(d);
            } else if current.is_none() {
                current = Some(Vec::new());
            }
            continue;
        }
        let Some(d) = current.as_mut() else { continue };
        let Some((offset, rest)) = line.split_once("  ") else { continue };
        if offset.len() != 4 || !offset.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        assert_eq!(usize::from_str_radix(offset, 16).unwrap(), d.len(), "offsets run on: {line}");
        let hex = rest.split('|').next().unwrap();
        d.extend(hex.split_whitespace().map(|b| u8::from_str_radix(b, 16).unwrap()));
    }
    dumps
}

#[test]
fn the_worked_example_of_protocol_md_is_what_rust_writes() {
    let doc = std::fs::read_to_string(root().join("docs/PROTOCOL.md")).unwrap();
    let start = doc.find("## 14. Worked example in hex").expect("PROTOCOL.md has §14");
    let end = start + doc[start..].find("\n## 15.").expect("§15 follows");
    let section = &doc[start..end];
    let dumps = hex_dumps(section);
    let v = load("worked_example.json");
    let steps = v["steps"].as_array().unwrap();
    assert_eq!(dumps.len(), 5, "five hex dumps in §14");
    for (dump, step) in dumps.iter().zip(steps) {
        assert_eq!(hex(dump), s(step, "hex"), "§14 step {}: {}", step["step"], s(step, "what"));
        assert!(section.contains(&format!("({} bytes)", dump.len())), "§14 states the length of step {}", step["step"]);
    }
    // Step 6: the CLOSE's prefix as the text spells it, then its header.
    let close = unhex(s(&steps[5], "hex"));
    let spelled: Vec<String> = close[..PREFIX_LEN].iter().map(|b| format!("{b:02x}")).collect();
    assert!(section.contains(&spelled.join(" ")), "§14 spells the CLOSE prefix {spelled:?}");
    assert!(section.contains(&format!("`{}`", std::str::from_utf8(&close[PREFIX_LEN..]).unwrap())));
    // And every frame of it reads back.
    for step in &steps[1..] {
        let bytes = unhex(s(step, "hex"));
        if bytes.len() > 8 {
            let f = read_frame(bytes, Limits::default()).unwrap();
            typed_roundtrip(&f, false).unwrap();
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `packed.json` (PROTOCOL.md §22.5): every record unpacks to its message (the inline
/// tensors' bytes, the other tensors' locations) and packs back to the same bytes; every
/// malformed record is refused with its error.
#[test]
fn packed_records_read_back_and_malformed_ones_are_refused() {
    use ferry_core::pipe::packed::{PackRoom, UnpackRules, pack, unpack};
    use ferry_core::wire::Location;
    use ferry_core::{Message, Tensor};
    let v = load("packed.json");
    let limits: Limits = serde_json::from_value(v["limits"].clone()).unwrap();
    let rules = UnpackRules { limits: &limits, max_header_values: 1 << 20 };
    let read = |bytes: &[u8]| {
        let mut found: Vec<(usize, Location)> = Vec::new();
        let msg = unpack(bytes, &rules, |i, meta, loc| {
            found.push((i, loc.clone()));
            Ok(Tensor::zeros(meta).unwrap())
        });
        msg.map(|m| (m, found))
    };
    let records = v["records"].as_array().unwrap();
    assert!(records.len() >= 3 && v["malformed"].as_array().unwrap().len() >= 5);
    for r in records {
        let name = s(r, "name");
        let bytes = unhex(s(r, "hex"));
        let (msg, found) = read(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(msg.header, r["header"], "{name}");
        let want = r["tensors"].as_array().unwrap();
        assert_eq!(msg.tensors.len(), want.len(), "{name}");
        let mut locs = Vec::new();
        for (i, (t, w)) in msg.tensors.iter().zip(want).enumerate() {
            assert_eq!(serde_json::to_value(t.meta().dtype).unwrap(), w["dtype"], "{name} tensor {i}");
            assert_eq!(json!(t.meta().shape), w["shape"], "{name} tensor {i}");
            let loc: Location = serde_json::from_value(w["location"].clone()).unwrap();
            match w.get("data_hex") {
                Some(d) => assert_eq!(t.bytes().as_ref(), unhex(d.as_str().unwrap()), "{name} tensor {i}"),
                None => assert!(found.contains(&(i, loc.clone())), "{name} tensor {i}: {found:?}"),
            }
            locs.push(loc);
        }
        let room = PackRoom { peer: &limits, max_record: 1 << 20 };
        let again = pack(&Message::with_tensors(msg.header.clone(), msg.tensors.clone()), &locs, &room);
        assert_eq!(again.as_deref(), Some(&bytes[..]), "{name}: packs back to the same bytes");
    }
    for m in v["malformed"].as_array().unwrap() {
        let name = s(m, "name");
        let e = read(&unhex(s(m, "hex"))).map(drop).expect_err(name);
        check_error(name, &e, &m["error"]);
    }
}
