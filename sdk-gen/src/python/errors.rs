//! The error classes: the section of a generated module that maps an API's error table to
//! exception classes, and the runtime's own module of them (`ferry/rpc_errors.py`).
//!
//! The runtime has one class per code of ferry's table ([`RUNTIME_ERRORS`]), and it raises
//! them. A generated module declares no class of its own for such a code: it re-exports the
//! runtime's under the runtime's name, so `except demo.InvalidParamsError`,
//! `except conformance.InvalidParamsError` and `except ferry.InvalidParamsError`
//! catch the same error whichever client raised it, and no generated class shadows a
//! runtime one (code -32003 is `ServerTimeoutError` whatever the API's table calls it).
//! It declares classes only for its API's own codes.

use super::{BUILTIN_EXCEPTIONS, Ctx, WIDTH, docstring};
use crate::PREAMBLE;
use crate::ir::{ErrorDef, pascal_case};
use crate::names::{RUNTIME_ERRORS, error_class_name, reserved_code, runtime_error_class};
use crate::writer::CodeWriter;

/// One `class Name(RpcError)` with its docstring and `CODE`.
fn error_class(w: &mut CodeWriter, name: &str, e: &ErrorDef) {
    w.blank(2);
    w.line(format!("class {name}(RpcError):"));
    w.indented(|w| {
        let mut doc = e.description.clone().unwrap_or_else(|| e.message.clone());
        doc.push_str(&format!("\n\nCode {}, `{}`: \"{}\".", e.code, e.name, e.message));
        docstring(w, &doc);
        w.line("");
        w.line(format!("CODE = {}", e.code));
    });
}

/// The `ERRORS` dict of `(code, class name)` pairs, with its docstring.
fn errors_dict(w: &mut CodeWriter, classes: &[(i64, String)], doc: &str) {
    w.blank(2);
    let items: Vec<String> = classes.iter().map(|(code, name)| format!("{code}: {name}")).collect();
    w.list("ERRORS: dict[int, type[RpcError]] = {", &items, "}");
    docstring(w, doc);
}

/// The error section of a generated module: the runtime's classes of the table's codes
/// (imported by `module`, from `cx.runtime_errors`), a class per other code, `ERRORS` and
/// `error_from_code`.
pub(super) fn errors(cx: &mut Ctx<'_>, w: &mut CodeWriter) {
    let api = cx.api;
    // The runtime's classes first, so that no class of the API's own takes their names.
    for e in &api.errors {
        if let Some(runtime) = runtime_error_class(e.code) {
            let name = cx.types.name(&format!("error:{}", e.name), runtime);
            cx.runtime_errors.push((runtime, name));
        }
    }
    cx.runtime_errors.sort();
    let mut classes = Vec::new();
    for e in &api.errors {
        let key = format!("error:{}", e.name);
        if runtime_error_class(e.code).is_some() {
            classes.push((e.code, cx.types.name(&key, "")));
            continue;
        }
        let mut wanted = error_class_name(&e.name);
        if BUILTIN_EXCEPTIONS.contains(&wanted.as_str()) {
            wanted = format!("Rpc{wanted}");
        } else if RUNTIME_ERRORS.iter().any(|(_, n)| *n == wanted) {
            // Another code under a runtime class's name: named for its API instead.
            wanted = format!("{}{wanted}", pascal_case(&api.name));
        }
        let name = cx.types.name(&key, &wanted);
        error_class(w, &name, e);
        classes.push((e.code, name));
    }
    errors_dict(
        w,
        &classes,
        "The exception class of each code of the error table: the runtime's own (`ferry.rpc_errors`, \
         re-exported here) for ferry's codes, this module's for the API's.",
    );
    w.blank(2);
    w.line("def error_from_code(code: int, message: str, data: object = None) -> RpcError:");
    w.indented(|w| {
        docstring(
            w,
            "The exception for an error response: the class of `code` in `ERRORS`, else the runtime's \
             (`ferry.rpc_errors.error_from_code`: its class for ferry's codes, else `RpcError`).",
        );
        w.line("cls = ERRORS.get(code)");
        w.line("if cls is None:");
        w.indented(|w| w.line("return _runtime_error(code, message, data)"));
        w.line("return cls(code, message, data)");
    });
}

/// `ferry/rpc_errors.py`: one `RpcError` subclass per row of `table` (ferry's error
/// table, every code in JSON-RPC's reserved range), `ERRORS` and `error_from_code`. The
/// runtime raises these classes and the generated modules re-export them.
///
/// # Panics
/// If a row's code is outside the reserved range or its class name is not the one the
/// generated modules import ([`RUNTIME_ERRORS`]).
pub fn runtime_module(table: &[ErrorDef]) -> String {
    let mut w = CodeWriter::new("    ", WIDTH);
    w.line(format!("# {PREAMBLE}"));
    docstring(
        &mut w,
        "The JSON-RPC error codes of ferry (PROTOCOL.md section 18.4) as exception classes, generated \
         from the Rust table `ferry_rpc::codes::ERROR_CODES`: one `RpcError` subclass per code.\n\n\
         The runtime raises these classes for error responses with these codes, and the generated clients \
         (`ferry.generated`) re-export them instead of declaring their own, so \
         `except ferry.InvalidParamsError` and `except demo.InvalidParamsError` catch the same \
         error whichever client raised it.",
    );
    w.line("");
    w.line("from __future__ import annotations");
    w.line("");
    w.line("from .errors import RpcError");
    let mut classes = Vec::new();
    for e in table {
        let name = error_class_name(&e.name);
        assert!(reserved_code(e.code), "{}: code {} outside the reserved range", e.name, e.code);
        assert_eq!(runtime_error_class(e.code), Some(name.as_str()), "sdk-gen's RUNTIME_ERRORS is stale");
        error_class(&mut w, &name, e);
        classes.push((e.code, name));
    }
    errors_dict(&mut w, &classes, "The exception class of each code.");
    w.blank(2);
    w.line("def error_from_code(code: int, message: str, data: object = None) -> RpcError:");
    w.indented(|w| {
        docstring(w, "The exception for an error response: the class of `code`, else `RpcError`.");
        w.line("return ERRORS.get(code, RpcError)(code, message, data)");
    });
    w.blank(2);
    let mut names: Vec<String> = classes.into_iter().map(|(_, n)| format!("\"{n}\"")).collect();
    names.push("\"ERRORS\"".into());
    names.push("\"error_from_code\"".into());
    names.sort();
    w.list("__all__ = [", &names, "]");
    w.finish()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::ir::{Api, ErrorDef};

    fn module_of(errors: serde_json::Value) -> String {
        let doc = json!({"openrpc": "1.3.2", "info": {"title": "t", "version": "1"}, "methods": [],
            "x-ferry-errors": errors});
        super::super::module(&Api::from_openrpc("shop", &doc).unwrap())
    }

    /// Ferry's codes are the runtime's classes, by code (whatever the table calls them);
    /// other codes, reserved ones the runtime lacks among them, get classes of their own,
    /// never under a runtime class's or a builtin's name.
    #[test]
    fn the_runtimes_classes_are_reexported_and_never_shadowed() {
        let py = module_of(json!([
            {"code": -32003, "name": "TIMEOUT", "message": "Timeout"},
            {"code": -32602, "name": "INVALID_PARAMS", "message": "Invalid params"},
            {"code": -32099, "name": "BUSY", "message": "Busy"},
            {"code": 7, "name": "NOT_FOUND", "message": "No such shelf"},
            {"code": 8, "name": "TIMEOUT", "message": "Too slow"},
        ]));
        assert!(
            py.contains(
                "from ferry.rpc_errors import (\n    InvalidParamsError as InvalidParamsError,\n    \
                 ServerTimeoutError as ServerTimeoutError,\n    error_from_code as _runtime_error,\n)\n"
            ),
            "{py}"
        );
        for local in ["class BusyError(RpcError):", "class ShopNotFoundError(RpcError):"] {
            assert!(py.contains(local), "{local} in {py}");
        }
        for shadow in
            ["class InvalidParamsError", "class ServerTimeoutError", "class TimeoutError", "class NotFoundError"]
        {
            assert!(!py.contains(shadow), "{shadow} in {py}");
        }
        assert!(py.contains("    -32003: ServerTimeoutError,\n    -32602: InvalidParamsError,\n"), "{py}");
        // The second TIMEOUT row (code 8) is a class of the API's own.
        assert!(py.contains("    -32099: BusyError,\n    7: ShopNotFoundError,\n"), "{py}");
    }

    #[test]
    fn a_table_without_ferrys_codes_imports_only_the_fallback() {
        let py = module_of(json!([{"code": 1, "name": "OOPS", "message": "Oops"}]));
        assert!(py.contains("\nfrom ferry.rpc_errors import error_from_code as _runtime_error\n"), "{py}");
        assert!(py.contains("class OopsError(RpcError):"), "{py}");
    }

    #[test]
    fn the_runtime_module_has_a_class_per_code() {
        let table: Vec<ErrorDef> = crate::names::RUNTIME_ERRORS
            .iter()
            .map(|(code, class)| ErrorDef {
                code: *code,
                name: screaming(class),
                message: "m".into(),
                description: None,
            })
            .collect();
        let py = super::runtime_module(&table);
        assert!(py.contains("class ServerTimeoutError(RpcError):"), "{py}");
        assert!(py.contains("    -32003: ServerTimeoutError,\n"), "{py}");
        assert!(py.contains("from .errors import RpcError\n"), "{py}");
        assert!(py.contains("    \"ERRORS\",\n"), "{py}");
    }

    /// `ServerTimeoutError` -> `SERVER_TIMEOUT`, `ParseError` -> `PARSE_ERROR`.
    fn screaming(class: &str) -> String {
        let mut out = String::new();
        for (i, c) in class.chars().enumerate() {
            if c.is_ascii_uppercase() && i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_uppercase());
        }
        match out.strip_suffix("_ERROR") {
            Some(base) if base != "PARSE" && base != "INTERNAL" && base != "SERVER" && base != "TENSOR" => base.into(),
            _ => out,
        }
    }
}
