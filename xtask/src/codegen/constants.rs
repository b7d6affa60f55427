//! The wire constants of the Python and TypeScript SDKs, generated from the Rust tables
//! they copy: the preamble and frame prefix (`ferry_core::frame`), the frame kinds
//! (`FrameKind`), the default and handshake [`Limits`], the dtypes and their sizes
//! (`DType::ALL`), the handshake features (`wire::FEATURES`) and the JSON-RPC error codes
//! (`ferry_rpc::codes::ERROR_CODES`).
//!
//! - `bindings/python/python/ferry/_constants.py`: the constants as `Final` names.
//! - `bindings/python/python/ferry/rpc_errors.py`: one `RpcError` subclass per error code,
//!   `ERRORS` and `error_from_code` (written by `ferry_sdk_gen::python::runtime_module`, as
//!   the generated clients' own classes are): the classes the runtime raises and the
//!   generated clients re-export, so `except` catches an error whichever client raised it.
//! - `sdks/typescript/src/constants.ts`: the same for TypeScript.
//! - `sdks/typescript/src/rpc_errors.ts`: the error codes (`ErrorCode`), one `RpcError`
//!   subclass per code, `ERRORS` and `errorFromCode`: the one module of error classes that
//!   the runtime throws and the generated clients import, so `instanceof` holds whichever
//!   client threw.
//!
//! Both languages are written already formatted (ruff format; prettier at 100 columns), so
//! the staleness check needs neither Python nor Node.

use ferry_core::DType;
use ferry_core::frame::{FrameKind, HANDSHAKE_LIMITS, MAGIC, PREAMBLE_LEN, PREFIX_LEN};
use ferry_core::wire::FEATURES;
use ferry_core::wire::{Limits, PROTOCOL, PROTOCOL_VERSION};
use ferry_rpc::codes::{ERROR_CODES, ErrorCode};
use ferry_sdk_gen::PREAMBLE;
use ferry_sdk_gen::names::error_class_name;

/// Every frame kind: its byte and its name (`HELLO`), in byte order.
pub fn frame_kinds() -> Vec<(u8, String)> {
    (0..=u8::MAX).filter_map(|b| FrameKind::from_u8(b).map(|k| (b, format!("{k:?}").to_uppercase()))).collect()
}

/// The fields of `limits`, by name, in declaration order.
fn limit_fields(limits: &Limits) -> [(&'static str, u64); 4] {
    [
        ("max_header_bytes", limits.max_header_bytes.into()),
        ("max_payload_bytes", limits.max_payload_bytes),
        ("max_tensors", limits.max_tensors.into()),
        ("max_fds", limits.max_fds.into()),
    ]
}

/// The scalar constants both languages get: `(NAME, doc, value as source text)`.
fn scalars(py: bool) -> Vec<(&'static str, &'static str, String)> {
    let magic = if py {
        format!("b\"{}\"", MAGIC.iter().map(|b| py_byte(*b)).collect::<String>())
    } else {
        format!("[{}]", MAGIC.iter().map(|b| format!("0x{b:02x}")).collect::<Vec<_>>().join(", "))
    };
    vec![
        ("PROTOCOL", "The protocol name in HELLO.", format!("\"{PROTOCOL}\"")),
        ("PROTOCOL_VERSION", "The protocol version (preamble, HELLO, WELCOME).", PROTOCOL_VERSION.to_string()),
        ("MAGIC", "The first six bytes of the preamble: 0x89, then `FERRY`.", magic),
        ("PREAMBLE_LEN", "Bytes of the preamble: the magic and a u16 LE version.", PREAMBLE_LEN.to_string()),
        ("PREFIX_LEN", "Bytes of a frame prefix: kind, flags, fds, header_len, payload_len.", PREFIX_LEN.to_string()),
        ("ALIGN", "Alignment of inline tensors in a payload.", ferry_core::ALIGN.to_string()),
        ("MAX_DIMS", "The most dimensions of a tensor.", ferry_core::MAX_DIMS.to_string()),
    ]
}

fn py_byte(b: u8) -> String {
    if b.is_ascii_alphanumeric() { char::from(b).to_string() } else { format!("\\x{b:02x}") }
}

fn error_doc(e: &ErrorCode) -> String {
    format!("{} `{}`: {}", e.code, e.name, e.description)
}

/// `bindings/python/python/ferry/_constants.py`.
pub fn python() -> String {
    let mut o = format!("# {PREAMBLE}\n");
    o.push_str(
        "\"\"\"The wire constants of the ferry protocol (docs/PROTOCOL.md), generated from the\n\
         Rust tables: frame kinds, limits, dtypes, handshake features and JSON-RPC error codes.\n\
         \"\"\"\n\nfrom __future__ import annotations\n\nfrom typing import Final\n\n",
    );
    for (name, doc, value) in scalars(true) {
        o.push_str(&format!("{name}: Final = {value}\n\"\"\"{doc}\"\"\"\n"));
    }
    o.push_str("\n# Frame kinds (PROTOCOL.md section 4.2).\n");
    for (b, name) in frame_kinds() {
        o.push_str(&format!("{name}: Final = {b}\n"));
    }
    o.push_str("FRAME_KINDS: Final[dict[int, str]] = {\n");
    for (b, name) in frame_kinds() {
        o.push_str(&format!("    {b}: \"{name}\",\n"));
    }
    o.push_str("}\n\"\"\"The name of each frame kind.\"\"\"\n\n");
    o.push_str("# Limits (PROTOCOL.md sections 6.2 and 12).\n");
    for (field, value) in limit_fields(&Limits::default()) {
        o.push_str(&format!("DEFAULT_{}: Final = {value}\n", field.to_uppercase()));
    }
    o.push_str("HANDSHAKE_LIMITS: Final[dict[str, int]] = {\n");
    for (field, value) in limit_fields(&HANDSHAKE_LIMITS) {
        o.push_str(&format!("    \"{field}\": {value},\n"));
    }
    o.push_str("}\n\"\"\"What a peer may send before the handshake is done.\"\"\"\n\n");
    o.push_str("DTYPES: Final[tuple[str, ...]] = (\n");
    for d in DType::ALL {
        o.push_str(&format!("    \"{}\",\n", d.name()));
    }
    o.push_str(")\n\"\"\"Every dtype, in the protocol's order (PROTOCOL.md section 5.1).\"\"\"\n");
    o.push_str("ITEMSIZE: Final[dict[str, int]] = {\n");
    for d in DType::ALL {
        o.push_str(&format!("    \"{}\": {},\n", d.name(), d.itemsize()));
    }
    o.push_str("}\n\"\"\"Bytes per element of each dtype.\"\"\"\n");
    o.push_str("FEATURES: Final[tuple[str, ...]] = (\n");
    for f in FEATURES {
        o.push_str(&format!("    \"{f}\",\n"));
    }
    o.push_str(")\n\"\"\"The handshake features the Rust implementation understands.\"\"\"\n\n");
    o.push_str("# JSON-RPC error codes (PROTOCOL.md section 18.4).\n");
    for e in ERROR_CODES {
        o.push_str(&format!("{}: Final = {}\n", e.name, e.code));
    }
    o.push_str("ERROR_CODES: Final[dict[int, tuple[str, str]]] = {\n");
    for e in ERROR_CODES {
        o.push_str(&format!("    {}: (\"{}\", \"{}\"),\n", e.name, e.name, e.message));
    }
    o.push_str("}\n\"\"\"The name and default message of each code.\"\"\"\n");
    o.push_str("ERROR_CLASSES: Final[dict[int, str]] = {\n");
    for e in ERROR_CODES {
        o.push_str(&format!("    {}: \"{}\",\n", e.name, error_class_name(e.name)));
    }
    o.push_str("}\n\"\"\"The class name of each code, the same in every SDK.\"\"\"\n");
    o
}

/// `sdks/typescript/src/constants.ts`.
pub fn typescript() -> String {
    let mut o = format!("// {PREAMBLE}\n\n");
    o.push_str(
        "/**\n * The wire constants of the ferry protocol (docs/PROTOCOL.md), generated from the Rust\n\
         * tables: frame kinds, limits, dtypes and handshake features. The error codes are in\n\
         * `rpc_errors.ts`.\n */\n",
    );
    for (name, doc, value) in scalars(false) {
        let value = if name == "MAGIC" { format!("Object.freeze({value}) as readonly number[]") } else { value };
        o.push_str(&format!("\n/** {doc} */\nexport const {name} = {value};\n"));
    }
    o.push_str("\n/** Frame kinds (PROTOCOL.md §4.2). */\nexport const Kind = {\n");
    for (b, name) in frame_kinds() {
        o.push_str(&format!("  {name}: {b},\n"));
    }
    o.push_str("} as const;\n");
    let limits = |o: &mut String, name: &str, doc: &str, l: &Limits| {
        o.push_str(&format!("\n/** {doc} */\nexport const {name} = {{\n"));
        for (field, value) in limit_fields(l) {
            o.push_str(&format!("  {field}: {value},\n"));
        }
        o.push_str("} as const;\n");
    };
    limits(&mut o, "WIRE_DEFAULT_LIMITS", "The default limits (PROTOCOL.md §6.2).", &Limits::default());
    limits(&mut o, "HANDSHAKE_LIMITS", "What a peer may send before the handshake is done.", &HANDSHAKE_LIMITS);
    o.push_str("\n/** Every dtype, in the protocol's order (PROTOCOL.md §5.1). */\nexport const DTYPES = [\n");
    for d in DType::ALL {
        o.push_str(&format!("  \"{}\",\n", d.name()));
    }
    o.push_str("] as const;\n\n/** Bytes per element of each dtype. */\nexport const ITEM_SIZES = {\n");
    for d in DType::ALL {
        o.push_str(&format!("  {}: {},\n", d.name(), d.itemsize()));
    }
    o.push_str("} as const;\n\n/** The handshake features the Rust implementation understands. */\n");
    o.push_str("export const FEATURES = [\n");
    for f in FEATURES {
        o.push_str(&format!("  \"{f}\",\n"));
    }
    o.push_str("] as const;\n");
    o
}

/// `bindings/python/python/ferry/rpc_errors.py`: ferry's error table as exception classes.
pub fn python_errors() -> String {
    let table: Vec<ferry_sdk_gen::ir::ErrorDef> = ERROR_CODES
        .iter()
        .map(|e| ferry_sdk_gen::ir::ErrorDef {
            code: e.code,
            name: e.name.to_owned(),
            message: e.message.to_owned(),
            description: Some(e.description.to_owned()),
        })
        .collect();
    ferry_sdk_gen::python::runtime_module(&table)
}

/// `sdks/typescript/src/rpc_errors.ts`.
pub fn typescript_errors() -> String {
    let mut o = format!("// {PREAMBLE}\n\n");
    o.push_str(
        "/**\n * The JSON-RPC error codes (PROTOCOL.md §18.4), generated from the Rust table\n\
         * `ferry_rpc::codes::ERROR_CODES`, with one `RpcError` subclass per code. The runtime\n\
         * client throws these classes and the generated clients import them (they declare\n\
         * classes only for their API's own codes), so `instanceof` holds whichever client threw.\n\
         */\n\nimport { RpcError } from \"./errors.js\";\n\n/** Every code of the table, by name. */\n\
         export const ErrorCode = {\n",
    );
    for e in ERROR_CODES {
        o.push_str(&format!("  {}: {},\n", e.name, e.code));
    }
    o.push_str("} as const;\n");
    for e in ERROR_CODES {
        let class = error_class_name(e.name);
        o.push_str(&format!("\n/** {} */\nexport class {class} extends RpcError {{\n", error_doc(e)));
        o.push_str(&format!("  static readonly CODE = {};\n}}\n", e.code));
    }
    o.push_str(
        "\n/** A constructor of an error class. */\n\
         export type RpcErrorClass = new (code: number, message: string, data?: unknown) => RpcError;\n\n\
         /** The class of each code of the table. */\n\
         export const ERRORS: ReadonlyMap<number, RpcErrorClass> = new Map<number, RpcErrorClass>([\n",
    );
    for e in ERROR_CODES {
        o.push_str(&format!("  [{}, {}],\n", e.code, error_class_name(e.name)));
    }
    o.push_str(
        "]);\n\n/** The error for an error response: the class of `code` (`RpcError` for codes without one). */\n\
         export function errorFromCode(code: number, message: string, data?: unknown): RpcError {\n\
         \x20 const Cls = ERRORS.get(code) ?? RpcError;\n\
         \x20 return new Cls(code, message, data);\n}\n",
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No code's class takes a name the runtimes use for something else (a client-side
    /// timeout above all), and no two codes share a class.
    #[test]
    fn error_classes_are_unique_and_shadow_nothing() {
        let mut seen = std::collections::BTreeSet::new();
        for e in ERROR_CODES {
            let class = error_class_name(e.name);
            assert!(
                !["TimeoutError", "ProtocolError", "LimitError", "RpcError", "FerryError"].contains(&class.as_str())
            );
            assert!(seen.insert(class), "{}", e.name);
        }
        assert_eq!(error_class_name(ferry_rpc::codes::lookup(-32003).unwrap().name), "ServerTimeoutError");
    }

    /// sdk-gen's copy of the runtimes' classes (it depends on no ferry crate) is the table:
    /// the generated Python clients import exactly the classes `rpc_errors.py` declares.
    #[test]
    fn sdk_gen_knows_the_runtime_error_classes() {
        let table: Vec<(i64, String)> = ERROR_CODES.iter().map(|e| (e.code, error_class_name(e.name))).collect();
        let copy: Vec<(i64, String)> =
            ferry_sdk_gen::names::RUNTIME_ERRORS.iter().map(|(c, n)| (*c, (*n).to_owned())).collect();
        assert_eq!(table, copy, "update ferry_sdk_gen::names::RUNTIME_ERRORS");
        assert!(ERROR_CODES.iter().all(|e| ferry_sdk_gen::names::reserved_code(e.code)));
        let py = python_errors();
        for (_, class) in &table {
            assert!(py.contains(&format!("\nclass {class}(RpcError):\n")), "{class}");
        }
    }

    #[test]
    fn frame_kinds_are_the_protocols() {
        let names: Vec<String> = frame_kinds().into_iter().map(|(_, n)| n).collect();
        assert_eq!(names, ["HELLO", "WELCOME", "REFUSE", "MESSAGE", "CONTROL", "CLOSE", "RING"]);
        assert!(python().contains("MAGIC: Final = b\"\\x89FERRY\""), "{}", python());
    }
}
