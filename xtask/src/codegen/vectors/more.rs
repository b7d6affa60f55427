//! The vectors of JSON values alone: descriptors, the handshake's answers and checks,
//! refusals and JSON-RPC error objects.

use std::collections::BTreeMap;
use std::sync::Arc;

use ferry_core::compact::DescsOut;
use ferry_core::handshake::{agent, server_choose};
use ferry_core::meta::TensorMeta;
use ferry_core::wire::FEATURES;
use ferry_core::wire::{
    CudaIpcRef, InlineRef, Limits, Location, PROTOCOL_VERSION, QuicStreamRef, Refusal, SegmentAnnounce, ShmRef,
    TensorDesc, Welcome,
};
use ferry_core::{Channel, ConnInfo, DType, Device, InlineChannel};
use ferry_rpc::codes::{ERROR_CODES, ErrorObject, lookup};
use ferry_sdk_gen::names::error_class_name;
use serde_json::{Value, json};

use super::{error, inline_desc, inline_offer, minimal_hello, shm, shm_return};

/// What a server with only the inline channel and default limits answers `hello`.
pub fn welcome_for(hello: &ferry_core::wire::Hello) -> Welcome {
    let chans: Vec<Arc<dyn Channel>> = vec![Arc::new(InlineChannel)];
    server_choose(&chans, hello, &ConnInfo::default(), PROTOCOL_VERSION, Limits::default())
        .expect("the inline server welcomes an inline offer")
}

/// One refusal of each reason, as a server writes them (PROTOCOL.md §6.3).
pub fn refusals() -> Vec<(&'static str, Refusal)> {
    vec![
        ("version_mismatch", Refusal::VersionMismatch { server: 1, client: 2 }),
        (
            "no_common_channel",
            Refusal::NoCommonChannel { offered: vec!["shm".into()], supported: vec!["inline".into()] },
        ),
        ("bad_token", Refusal::BadToken),
        ("malformed", Refusal::Malformed { detail: "protocol is \"http\", expected \"ferry\"".into() }),
    ]
}

fn text<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("wire types serialize")
}

pub fn descriptors() -> Value {
    let cuda = CudaIpcRef {
        device_uuid: "GPU-00000000-0000-0000-0000-000000000001".into(),
        mem_handle: "A".repeat(86) + "==",
        alloc_id: 7,
        alloc_size: 2097152,
        offset: 4096,
        len: 32,
        event_handle: "B".repeat(86) + "==",
        lease: 3,
    };
    let announced = ShmRef {
        segment: 2,
        offset: 0,
        len: 64,
        lease: 5,
        announce: Some(SegmentAnnounce { fd: 0, size: 1 << 21 }),
        lazy_release: false,
    };
    let strided = TensorMeta::new(DType::F32, vec![2, 3]).with_strides(vec![1, 2]);
    let descs = vec![
        ("inline", inline_desc(DType::F32, &[2], 0, 8)),
        ("inline_scalar_bf16", inline_desc(DType::Bf16, &[], 64, 2)),
        ("inline_empty", inline_desc(DType::C128, &[0, 4], 128, 0)),
        ("inline_strided", TensorDesc { meta: strided, data: Location::Inline(InlineRef { offset: 0, len: 24 }) }),
        ("shm", TensorDesc { meta: TensorMeta::new(DType::U8, vec![4, 4]), data: shm(1, 128, 16, 9, false) }),
        ("shm_lazy_release", TensorDesc { meta: TensorMeta::new(DType::I16, vec![8]), data: shm(1, 0, 16, 10, true) }),
        ("shm_announce", TensorDesc { meta: TensorMeta::new(DType::F64, vec![8]), data: Location::Shm(announced) }),
        (
            "shm_return",
            TensorDesc { meta: TensorMeta::new(DType::F32, vec![1920, 1080, 3]), data: shm_return(4, 0, 24883200) },
        ),
        (
            "cuda_ipc",
            TensorDesc {
                meta: TensorMeta::new(DType::F16, vec![16]).with_device(Device::Cuda(1)),
                data: Location::CudaIpc(cuda),
            },
        ),
        (
            "quic_stream",
            TensorDesc {
                meta: TensorMeta::new(DType::U64, vec![8192]),
                data: Location::QuicStream(QuicStreamRef { stream: 6, len: 65536 }),
            },
        ),
    ];
    let descriptors: Vec<Value> = descs
        .iter()
        .map(|(name, d)| {
            let object = text(d);
            let written = text(&DescsOut { descs: std::slice::from_ref(d), compact: true });
            let written = &written[1..written.len() - 1];
            let compact = (written != object).then(|| written.to_owned());
            json!({
                "name": name,
                "object_json": object,
                "compact_json": compact,
                "meta": d.meta,
                "location": d.data,
            })
        })
        .collect();
    let malformed = [
        ("compact_missing_element", r#"["u8",[1],"inline",0]"#),
        ("compact_extra_element", r#"["u8",[1],"inline",0,1,2]"#),
        ("compact_unknown_location", r#"["u8",[1],"quic",0,1]"#),
        ("compact_shape_not_an_array", r#"["u8","1","inline",0,1]"#),
        ("compact_offset_negative", r#"["u8",[1],"inline",-1,1]"#),
        ("compact_unknown_dtype", r#"["u7",[1],"inline",0,1]"#),
        ("compact_shm_too_short", r#"["u8",[1],"shm",1,0,1]"#),
        ("object_unknown_location", r#"{"meta":{"dtype":"u8","shape":[1]},"data":{"quic":{"offset":0,"len":1}}}"#),
        (
            "object_two_locations",
            r#"{"meta":{"dtype":"u8","shape":[1]},"data":{"inline":{"offset":0,"len":1},"shm":{"segment":1,"offset":0,"len":1,"lease":1}}}"#,
        ),
        ("object_no_meta", r#"{"data":{"inline":{"offset":0,"len":1}}}"#),
        (
            "object_bad_device",
            r#"{"meta":{"dtype":"u8","shape":[1],"device":"gpu"},"data":{"inline":{"offset":0,"len":1}}}"#,
        ),
        ("not_a_descriptor", r#""u8""#),
    ];
    let malformed: Vec<Value> = malformed.iter().map(|(name, json)| json!({"name": name, "json": json})).collect();
    json!({
        "about": "Tensor descriptors (PROTOCOL.md §7, §7.3). `descriptors`: the object as written \
                  (`object_json`), the compact array written to a peer that agreed to compact_tensors \
                  (`compact_json`; null where the descriptor has no compact form and goes as the object), \
                  and the meaning (`meta`, `location`). Both texts read back to the same descriptor. \
                  `malformed`: texts that are no descriptor: a header holding one is unparseable.",
        "descriptors": descriptors,
        "malformed": malformed,
    })
}

pub fn handshake() -> Value {
    let inline_welcome = welcome_for(&minimal_hello());
    let with = |f: &dyn Fn(&mut Value)| {
        let mut v = serde_json::to_value(minimal_hello()).expect("serializes");
        f(&mut v);
        serde_json::to_string(&v).expect("serializes")
    };
    let welcome = |w: &Welcome| json!({"kind": "WELCOME", "json": text(w)});
    let refuse = |r: &Refusal| json!({"kind": "REFUSE", "reason": reason(r), "json": text(r)});
    let malformed = json!({"kind": "REFUSE", "reason": "malformed"});
    let featured = Welcome { features: FEATURES.iter().map(|f| (*f).to_owned()).collect(), ..inline_welcome.clone() };
    let hello = |name: &str, hello_json: String, preamble: u16, token: Option<&str>, answer: Value| json!({"name": name, "hello_json": hello_json, "preamble_version": preamble, "require_token": token, "answer": answer});
    let hellos = vec![
        hello("minimal", text(&minimal_hello()), 1, None, welcome(&inline_welcome)),
        hello(
            "features_known_and_unknown",
            with(&|v| v["features"] = json!(["shm_forget", "future_feature", "compact_tensors"])),
            1,
            None,
            welcome(&featured),
        ),
        hello("unknown_fields_ignored", with(&|v| v["future"] = json!({"x": 1})), 1, None, welcome(&inline_welcome)),
        hello(
            "version_2",
            with(&|v| v["version"] = json!(2)),
            2,
            None,
            refuse(&Refusal::VersionMismatch { server: 1, client: 2 }),
        ),
        hello(
            "preamble_disagrees",
            with(&|v| v["version"] = json!(2)),
            1,
            None,
            refuse(&Refusal::Malformed { detail: "preamble says version 1, HELLO says 2".into() }),
        ),
        hello(
            "protocol_http",
            with(&|v| v["protocol"] = json!("http")),
            1,
            None,
            refuse(&Refusal::Malformed { detail: "protocol is \"http\", expected \"ferry\"".into() }),
        ),
        hello(
            "only_shm_offered",
            with(&|v| v["channels"] = json!([{"name": "shm", "devices": ["cpu"], "domain": {"boot_id": "b"}}])),
            1,
            None,
            refuse(&Refusal::NoCommonChannel { offered: vec!["shm".into()], supported: vec!["inline".into()] }),
        ),
        hello(
            "inline_for_cuda_only",
            with(&|v| v["channels"] = json!([{"name": "inline", "devices": ["cuda"]}])),
            1,
            None,
            refuse(&Refusal::NoCommonChannel { offered: vec!["inline".into()], supported: vec!["inline".into()] }),
        ),
        hello("token_missing", text(&minimal_hello()), 1, Some("s3cret"), refuse(&Refusal::BadToken)),
        hello("token_wrong", with(&|v| v["token"] = json!("s3cre7")), 1, Some("s3cret"), refuse(&Refusal::BadToken)),
        hello("token_right", with(&|v| v["token"] = json!("s3cret")), 1, Some("s3cret"), welcome(&inline_welcome)),
        hello("token_unasked", with(&|v| v["token"] = json!("x")), 1, None, welcome(&inline_welcome)),
        hello(
            "no_channels_field",
            r#"{"protocol":"ferry","version":1,"agent":"a"}"#.into(),
            1,
            None,
            malformed.clone(),
        ),
        hello(
            // A device kind this build does not know is never chosen (`DeviceKind::Other`), and
            // is no parse error (PROTOCOL.md 6.1, 13): offering only one is no common channel,
            // never `malformed` ...
            "unknown_device_kind",
            with(&|v| v["channels"][0]["devices"] = json!(["tpu"])),
            1,
            None,
            refuse(&Refusal::NoCommonChannel { offered: vec!["inline".into()], supported: vec!["inline".into()] }),
        ),
        hello(
            // ... and beside a known kind it is ignored: a newer client's HELLO is accepted.
            "unknown_device_kind_beside_cpu",
            with(&|v| v["channels"][0]["devices"] = json!(["tpu", "cpu"])),
            1,
            None,
            welcome(&inline_welcome),
        ),
        hello(
            "unknown_device_kind_in_another_offer",
            with(&|v| {
                v["channels"] = json!([
                    {"name": "tpu-link", "devices": ["tpu"], "domain": {"pod": "a"}},
                    {"name": "inline", "devices": ["cpu"], "domain": {}},
                ])
            }),
            1,
            None,
            welcome(&inline_welcome),
        ),
        hello("not_json", "{\"protocol\":".into(), 1, None, malformed),
    ];
    let ok = |name: &str, w: String, limits: Limits| json!({"name": name, "offered": ["inline"], "welcome_json": w, "peer_limits": limits});
    let bad = |name: &str, w: String| json!({"name": name, "offered": ["inline"], "welcome_json": w, "error": error("protocol_error", None)});
    let w = |f: &dyn Fn(&mut Value)| {
        let mut v = serde_json::to_value(&inline_welcome).expect("serializes");
        f(&mut v);
        serde_json::to_string(&v).expect("serializes")
    };
    let partial = Limits { max_tensors: 8, ..Limits::default() };
    let welcomes = vec![
        ok("inline", text(&inline_welcome), Limits::default()),
        ok("features", text(&featured), Limits::default()),
        ok("partial_limits", w(&|v| v["limits"] = json!({"max_tensors": 8})), partial),
        ok("unknown_fields_ignored", w(&|v| v["future"] = json!([1, 2])), Limits::default()),
        bad("version_2", w(&|v| v["version"] = json!(2))),
        bad("no_cpu_channel", w(&|v| v["channels"] = json!({}))),
        bad("cpu_channel_not_offered", w(&|v| v["channels"] = json!({"cpu": "shm"}))),
        bad("cuda_channel_not_offered", w(&|v| v["channels"] = json!({"cpu": "inline", "cuda": "cuda-ipc"}))),
    ];
    let mut refused: Vec<Value> = refusals()
        .into_iter()
        .map(|(name, r)| json!({"name": name, "json": text(&r), "reason": reason(&r), "known": true}))
        .collect();
    refused.push(json!({"name": "unknown_reason", "json": r#"{"reason":"over_capacity","retry_ms":50}"#, "reason": "over_capacity", "known": false}));
    json!({
        "about": "The handshake (PROTOCOL.md §6). `hellos`: a HELLO (text), the version of the client's \
                  preamble and the token the server requires, answered by a server with only the inline \
                  channel and default limits: a WELCOME or REFUSE (text as written; a malformed HELLO's \
                  detail is the parser's and is not compared). `welcomes`: a WELCOME a client that offered \
                  `offered` accepts (with the peer's limits it then holds to) or refuses with `error`. \
                  `refusals`: REFUSE bodies and their reason (`known`: a reason of this version).",
        "hellos": hellos,
        "welcomes": welcomes,
        "refusals": refused,
        "agent": agent(),
        "server_channels": [inline_offer()],
    })
}

fn reason(r: &Refusal) -> Value {
    serde_json::to_value(r).expect("serializes")["reason"].clone()
}

pub fn errors() -> Value {
    let mut objects: Vec<(String, ErrorObject)> = vec![
        ("parse_error".into(), ErrorObject::parse_error("expected value at line 1 column 1")),
        ("invalid_request".into(), ErrorObject::invalid_request("jsonrpc must be \"2.0\"")),
        ("method_not_found".into(), ErrorObject::method_not_found("nope")),
        ("invalid_params".into(), ErrorObject::invalid_params("b", "invalid type: string \"x\", expected f64")),
        ("internal".into(), ErrorObject::internal("the handler panicked")),
        ("limit".into(), ErrorObject::limit("max_batch", "batch size", 5, 4)),
        ("cancelled".into(), ErrorObject::cancelled("ferry.cancel")),
        ("tensor".into(), ErrorObject::tensor("tensor 3 is not in the message")),
        ("application_code".into(), ErrorObject::new(7, "out of coffee").with_data(json!({"cups": 0}))),
        ("reserved_unknown_code".into(), ErrorObject::new(-32050, "from a newer server")),
        ("non_ascii".into(), ErrorObject::new(1, "caf\u{e9} \u{2615}").with_data(json!(["\u{1f600}"]))),
    ];
    for row in ERROR_CODES {
        objects.push((format!("table_{}", row.name.to_lowercase()), ErrorObject::new(row.code, row.message)));
    }
    let errors: Vec<Value> = objects
        .iter()
        .map(|(name, e)| {
            let known = lookup(e.code);
            json!({
                "name": name,
                "json": text(e),
                "code": e.code,
                "error_name": known.map(|c| c.name),
                "class": known.map_or_else(|| "RpcError".to_owned(), |c| error_class_name(c.name)),
            })
        })
        .collect();
    let table: BTreeMap<String, Value> = ERROR_CODES
        .iter()
        .map(|c| (c.code.to_string(), json!({"name": c.name, "message": c.message, "class": error_class_name(c.name)})))
        .collect();
    json!({
        "about": "JSON-RPC error objects (PROTOCOL.md §18.4) as the Rust server writes them: the text, the \
                  code, its name in the error table (null: not in it) and the class an SDK throws for it \
                  (the same name in every SDK; RpcError for codes without one). `table`: every code.",
        "errors": errors,
        "table": table,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The descriptor vectors cover every location and both forms.
    #[test]
    fn descriptors_cover_both_forms() {
        let v = descriptors();
        let all = v["descriptors"].as_array().unwrap();
        assert!(all.iter().any(|d| d["compact_json"].is_null()));
        assert!(all.iter().filter(|d| !d["compact_json"].is_null()).count() >= 5);
    }
}
