//! `packed.json`: packed ring records (PROTOCOL.md §22.5), written by the Rust packer
//! (`ferry_core::pipe::packed::pack`): each record's bytes with the message they hold, and
//! malformed records with the error a receiver must report. Only the Rust suite reads
//! them today (`conformance/tests/vectors.rs`): neither SDK speaks the ring, and both read
//! vector files by name, not by listing the directory.

use ferry_core::pipe::packed::{PackRoom, UnpackRules, pack, unpack};
use ferry_core::wire::{InlineRef, Limits, Location, ShmRef, ShmReturnRef};
use ferry_core::{Message, PipeError, Tensor};
use serde_json::{Value, json};

use super::{error, hex};

/// The limits the records are packed for and read with.
const LIMITS: Limits = Limits { max_header_bytes: 1 << 20, max_payload_bytes: 1 << 20, max_tensors: 16, max_fds: 0 };

fn inline(len: u64) -> Location {
    Location::Inline(InlineRef { offset: 0, len })
}

/// The valid records: name, message, locations.
fn messages() -> Vec<(&'static str, Message, Vec<Location>)> {
    let f32s = Tensor::from_slice([2u64], &[1.0f32, 2.0]).expect("a valid tensor");
    let bytes = Tensor::from_slice([3u64], &[1u8, 2, 3]).expect("a valid tensor");
    let shm = Tensor::from_slice([4u64], &[0.5f32; 4]).expect("a valid tensor");
    let back = Tensor::from_slice([2u64, 2], &[7i64; 4]).expect("a valid tensor");
    let shorts = Tensor::from_slice([2u64], &[-1i16, 1]).expect("a valid tensor");
    vec![
        ("no_tensors", Message::new(json!({"id": 1})), vec![]),
        ("inline_f32", Message::with_tensors(json!({"op": "echo"}), vec![f32s]), vec![inline(8)]),
        (
            "mixed",
            Message::with_tensors(json!({"op": "mix", "n": [1, 2]}), vec![bytes, shm, back, shorts]),
            vec![
                inline(3),
                Location::Shm(ShmRef {
                    segment: 2,
                    offset: 4096,
                    len: 16,
                    lease: 7,
                    announce: None,
                    lazy_release: true,
                }),
                Location::ShmReturn(ShmReturnRef { lease: 9, offset: 64, len: 32 }),
                inline(4),
            ],
        ),
    ]
}

/// Unpacks `record` as a receiver with [`LIMITS`] does; tensors not inline come back as
/// zeros, their locations listed.
pub fn read(record: &[u8]) -> Result<(Message, Vec<(usize, Location)>), PipeError> {
    let rules = UnpackRules { limits: &LIMITS, max_header_values: 1 << 20 };
    let mut found = Vec::new();
    let msg = unpack(record, &rules, |i, meta, loc| {
        found.push((i, loc.clone()));
        Tensor::zeros(meta).map_err(|e| PipeError::ApiMisuse(e.to_string().into()))
    })?;
    Ok((msg, found))
}

/// The vector file.
pub fn packed() -> Value {
    let room = PackRoom { peer: &LIMITS, max_record: 1 << 20 };
    let mut records = Vec::new();
    let mut mixed = Vec::new();
    for (name, msg, locs) in messages() {
        let record = pack(&msg, &locs, &room).expect("the vector messages pack");
        let tensors: Vec<Value> = msg
            .tensors
            .iter()
            .zip(&locs)
            .map(|(t, loc)| {
                let mut v = json!({
                    "dtype": t.meta().dtype,
                    "shape": t.meta().shape,
                    "location": loc,
                });
                if matches!(loc, Location::Inline(_)) {
                    v["data_hex"] = hex(&t.bytes()).into();
                }
                v
            })
            .collect();
        if name == "mixed" {
            mixed = record.clone();
        }
        records.push(json!({"name": name, "hex": hex(&record), "header": msg.header, "tensors": tensors}));
    }
    let mut bad: Vec<(&str, Vec<u8>)> = vec![("shorter_than_its_start", mixed[..4].to_vec())];
    let mut over = mixed.clone();
    over[..4].copy_from_slice(&(LIMITS.max_header_bytes + 1).to_le_bytes());
    bad.push(("header_over_max_header_bytes", over));
    let mut count = mixed.clone();
    count[4..8].copy_from_slice(&1000u32.to_le_bytes());
    bad.push(("tensors_over_max_tensors", count));
    bad.push(("data_cut_short", mixed[..mixed.len() - 1].to_vec()));
    // The first descriptor starts after the padded header.
    let header_len = u32::from_le_bytes(mixed[..4].try_into().expect("4 bytes")) as usize;
    let desc = 8 + header_len.next_multiple_of(8);
    let mut dtype = mixed.clone();
    dtype[desc] = 0xff;
    bad.push(("unknown_dtype", dtype));
    let mut place = mixed.clone();
    place[desc + 2] = 7;
    bad.push(("unknown_where", place));
    let mut ndim = mixed.clone();
    ndim[desc + 1] = 65;
    bad.push(("ndim_over_max_dims", ndim));
    let malformed: Vec<Value> = bad
        .into_iter()
        .map(|(name, record)| {
            let e = read(&record).map(drop).expect_err("a malformed record is refused");
            let text = e.to_string();
            let expect = match &e {
                PipeError::Limit(l) => error("limit", Some(l.limit)),
                _ => error("protocol_error", ["a packed message", "tensor 0"].into_iter().find(|f| text.contains(f))),
            };
            json!({"name": name, "hex": hex(&record), "error": expect})
        })
        .collect();
    json!({
        "about": "Packed ring records (PROTOCOL.md §22.5), read with these limits; tensors not inline are found by the channel's session (location given)",
        "limits": LIMITS,
        "records": records,
        "malformed": malformed,
    })
}
