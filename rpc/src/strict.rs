//! Reading plain JSON-RPC text exactly (plain JSON connections and HTTP): request objects
//! with a duplicate member are marked invalid, and ids are echoed byte for byte.
//!
//! [`parse`] reads like `serde_json::from_slice::<Value>`, with two differences for each
//! request object (the top-level object, or each object of a batch):
//! - a member name that occurs twice (at any depth of the object) makes the request
//!   invalid: [`parse`] adds the member [`DUPLICATE`] naming it, which
//!   [`crate::jsonrpc::entry`] turns into an Invalid Request;
//! - an `id` whose number would not be written back with the same bytes (beyond 64-bit
//!   integers, `1e3`, `1.50`, `-0`) is replaced by a marker string that [`write`] turns
//!   back into the original bytes. The marker carries a per-process random nonce, so no
//!   peer can forge one.
//!
//! Everything else (ferry pipes, whose headers are parsed by ferry-core) is plain
//! `serde_json`.

use std::cell::Cell;
use std::fmt;
use std::sync::OnceLock;

use serde::Serialize;
use serde::de::{DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde_json::value::RawValue;
use serde_json::{Map, Number, Value};

/// The member [`parse`] adds to a request object that had a duplicate member.
pub(crate) const DUPLICATE: &str = "\u{0}ferry:duplicate-member";

/// The scalar `visit_*` methods, building plain values.
macro_rules! forward_scalars {
    () => {
        fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Value, E> {
            Ok(Value::Bool(v))
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Value, E> {
            Ok(Value::Number(v.into()))
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Value, E> {
            Ok(Value::Number(v.into()))
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
            Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Value, E> {
            Ok(Value::String(v.to_owned()))
        }
        fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Value, E> {
            Ok(Value::String(v))
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
    };
}

/// The prefix of an exact-id marker: NUL, a name and a random nonce.
fn marker() -> &'static str {
    static M: OnceLock<String> = OnceLock::new();
    M.get_or_init(|| {
        let mut b = [0u8; 16];
        // Without randomness the nonce is the address of a static and the time: still
        // unknown to peers, which never see it.
        if getrandom::getrandom(&mut b).is_err() {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            b[..16].copy_from_slice(&t.as_nanos().to_le_bytes());
        }
        format!("\u{0}ferry:id:{}:", b.iter().map(|x| format!("{x:02x}")).collect::<String>())
    })
}

/// Parses one JSON-RPC text (a request or a batch), marking duplicate members and keeping
/// inexact ids (see the module docs).
pub(crate) fn parse(text: &[u8]) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(text);
    let v = Top.deserialize(&mut de)?;
    de.end()?;
    Ok(v)
}

/// Writes a response (object or batch array) as JSON, restoring exact ids.
pub(crate) fn write(v: &Value) -> Vec<u8> {
    serde_json::to_vec(&Out(v)).unwrap_or_default()
}

struct Top;

impl<'de> DeserializeSeed<'de> for Top {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(TopVisitor)
    }
}

struct TopVisitor;

impl<'de> Visitor<'de> for TopVisitor {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON-RPC request or batch")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(Request)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Value, A::Error> {
        RequestVisitor.visit_map(map)
    }
    forward_scalars!();
}

/// One element: a request object, or any other value (then invalid, as JSON-RPC says).
struct Request;

impl<'de> DeserializeSeed<'de> for Request {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(RequestVisitor)
    }
}

struct RequestVisitor;

impl<'de> Visitor<'de> for RequestVisitor {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON-RPC request object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let dup = Cell::new(None::<String>);
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let v = if key == "id" {
                let raw: Box<RawValue> = map.next_value()?;
                exact_id(&raw).map_err(A::Error::custom)?
            } else {
                map.next_value_seed(Strict { dup: &dup })?
            };
            if out.contains_key(&key) {
                note(&dup, &key);
            }
            out.insert(key, v);
        }
        if let Some(name) = dup.take() {
            out.insert(DUPLICATE.to_owned(), Value::String(name));
        }
        Ok(Value::Object(out))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Value, A::Error> {
        Strict { dup: &Cell::new(None) }.visit_seq(seq)
    }
    forward_scalars!();
}

/// Records `key` as the duplicate, unless one is recorded already.
fn note(dup: &Cell<Option<String>>, key: &str) {
    let first = dup.take().unwrap_or_else(|| key.to_owned());
    dup.set(Some(first));
}

/// The id as a value: itself when it would be written back with the same bytes, else a
/// marker holding its exact text.
fn exact_id(raw: &RawValue) -> Result<Value, serde_json::Error> {
    let text = raw.get();
    let v: Value = serde_json::from_str(text)?;
    if let Value::Number(_) = &v
        && serde_json::to_string(&v)? != text
    {
        return Ok(Value::String(format!("{}{text}", marker())));
    }
    Ok(v)
}

/// Any JSON value, recording the first duplicate member name (at any depth) in `dup`.
struct Strict<'a> {
    dup: &'a Cell<Option<String>>,
}

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(v) = seq.next_element_seed(Strict { dup: self.dup })? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let v = map.next_value_seed(Strict { dup: self.dup })?;
            if out.contains_key(&key) {
                note(self.dup, &key);
            }
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
    forward_scalars!();
}

/// A response value written with exact ids restored.
struct Out<'a>(&'a Value);

impl Serialize for Out<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for it in items {
                    seq.serialize_element(&Out(it))?;
                }
                seq.end()
            }
            Value::Object(o) => {
                let mut map = s.serialize_map(Some(o.len()))?;
                for (k, v) in o {
                    match v.as_str().and_then(|t| t.strip_prefix(marker())).filter(|_| k == "id") {
                        Some(exact) => {
                            let raw = RawValue::from_string(exact.to_owned()).map_err(serde::ser::Error::custom)?;
                            map.serialize_entry(k, &raw)?;
                        }
                        None => map.serialize_entry(k, v)?,
                    }
                }
                map.end()
            }
            other => other.serialize(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn round_trip(text: &str) -> String {
        let v = parse(text.as_bytes()).unwrap();
        let id = v.get("id").cloned().unwrap_or(Value::Null);
        String::from_utf8(write(&json!({"jsonrpc": "2.0", "result": 1, "id": id}))).unwrap()
    }

    #[test]
    fn ids_come_back_byte_for_byte() {
        for id in
            ["18446744073709551616", "1e3", "1.50", "-0", "1E+2", "123456789012345678901234567890", "0.1", "7", "-7"]
        {
            let out = round_trip(&format!(r#"{{"jsonrpc":"2.0","method":"m","id":{id}}}"#));
            let written = out.split_once(r#""id":"#).unwrap().1.split([',', '}']).next().unwrap();
            assert_eq!(written, id, "{out}");
        }
        for id in [r#""abc""#, "null", r#""\u0000ferry:id:00:5""#] {
            let out = round_trip(&format!(r#"{{"jsonrpc":"2.0","method":"m","id":{id}}}"#));
            let back: Value = serde_json::from_str(&out).unwrap();
            assert_eq!(back["id"], serde_json::from_str::<Value>(id).unwrap(), "{out}");
        }
    }

    #[test]
    fn duplicate_members_are_marked() {
        let v = parse(br#"{"jsonrpc":"2.0","method":"a","method":"b","id":1}"#).unwrap();
        assert_eq!(v[DUPLICATE], "method");
        let v = parse(br#"[{"jsonrpc":"2.0","method":"a","params":{"x":1,"x":2},"id":1},{"id":2}]"#).unwrap();
        assert_eq!(v[0][DUPLICATE], "x");
        assert!(v[1].get(DUPLICATE).is_none());
        let v = parse(br#"{"jsonrpc":"2.0","method":"a","params":[1,{"y":[2]}],"id":1}"#).unwrap();
        assert!(v.get(DUPLICATE).is_none());
        assert_eq!(v["params"], json!([1, {"y": [2]}]));
    }

    #[test]
    fn other_values_parse_as_json() {
        assert_eq!(parse(b"[1, \"x\", null]").unwrap(), json!([1, "x", null]));
        assert_eq!(parse(b"3").unwrap(), json!(3));
        assert!(parse(b"{").is_err());
        assert!(parse(b"{} x").is_err());
    }
}
