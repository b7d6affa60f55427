//! JSON Schemas of every wire type, as checked in under `core/schemas/`.
//! `cargo xtask codegen` writes them; a test fails when the checked-in copies are stale.

use schemars::schema_for;

use crate::wire::{Close, ControlHeader, Hello, Limits, MessageHeader, Refusal, TensorDesc, Welcome};
use crate::{DType, Device, TensorMeta};

/// `(file name, pretty JSON)` for each wire type, sorted by file name.
pub fn schemas() -> Vec<(&'static str, String)> {
    let mut v = vec![
        ("close.json", serde_json::to_value(schema_for!(Close))),
        ("control.json", serde_json::to_value(schema_for!(ControlHeader))),
        ("device.json", serde_json::to_value(schema_for!(Device))),
        ("dtype.json", serde_json::to_value(schema_for!(DType))),
        ("hello.json", serde_json::to_value(schema_for!(Hello))),
        ("limits.json", serde_json::to_value(schema_for!(Limits))),
        ("message.json", serde_json::to_value(schema_for!(MessageHeader))),
        ("refusal.json", serde_json::to_value(schema_for!(Refusal))),
        ("tensor-desc.json", serde_json::to_value(schema_for!(TensorDesc))),
        ("tensor-meta.json", serde_json::to_value(schema_for!(TensorMeta))),
        ("welcome.json", serde_json::to_value(schema_for!(Welcome))),
    ]
    .into_iter()
    .map(|(name, v)| {
        let v = v.unwrap_or_default();
        let text = serde_json::to_string_pretty(&v).unwrap_or_default() + "\n";
        (name, text)
    })
    .collect::<Vec<_>>();
    v.sort_by_key(|(n, _)| *n);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checked-in schemas match the wire types. Run `cargo xtask codegen` to refresh.
    #[test]
    fn schemas_are_fresh() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas");
        let mut stale = Vec::new();
        for (name, text) in schemas() {
            let on_disk = std::fs::read_to_string(dir.join(name)).unwrap_or_default().replace("\r\n", "\n");
            if on_disk != text {
                stale.push(name);
            }
        }
        assert!(stale.is_empty(), "stale schemas {stale:?}: run `cargo xtask codegen`");
    }

    #[test]
    fn schemas_accept_real_values() {
        // Every schema is an object with a title; the real values carry the described keys.
        for (name, text) in schemas() {
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert!(v.get("title").is_some() || v.get("type").is_some(), "{name}");
        }
    }
}
