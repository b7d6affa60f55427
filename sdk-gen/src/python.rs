//! The Python emitter: one module per API on top of the `ferry` package
//! (`bindings/python`).
//!
//! The module has, in this order: the named types (`TypedDict`s, `Literal` aliases,
//! type aliases), the error classes (the runtime's re-exported for ferry's codes, one
//! class per other row of the error table: `python/errors.rs`) with `ERRORS` and
//! `error_from_code`, the result specs the runtime checks results against (`_TYPES`),
//! and two clients, `<Api>Client` (blocking, over `ferry.Client`) and
//! `Async<Api>Client` (asyncio, over `ferry.AsyncClient`), with one typed method
//! per API method (ferry's built-ins are the runtime's own methods): `python/client.rs`.
//!
//! The output is already formatted as `ruff format` (black style, 88 columns) would
//! format it, and passes `mypy --strict`; neither tool is needed to generate it.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::Value;

use crate::ir::{Api, Method, Ty, TypeDef, pascal_case};
use crate::names::{PYTHON_RESERVED, Scope};
use crate::writer::CodeWriter;
use crate::{Emitter, PREAMBLE};

mod client;
mod errors;
mod layout;
mod tasks;
use client::{arg_docs, client, params_value};
pub use errors::runtime_module;
use layout::expr;

/// Emits `<api>.py`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Python;

impl Emitter for Python {
    fn emit(&self, api: &Api) -> Vec<(PathBuf, String)> {
        vec![(PathBuf::from(format!("{}.py", api.name)), module(api))]
    }
}

/// `__init__.py` of a package holding the modules of `apis` (name, title).
pub fn package_init(apis: &[(&str, &str)]) -> String {
    let mut w = CodeWriter::new("    ", WIDTH);
    w.line(format!("# {PREAMBLE}"));
    w.line("\"\"\"Typed clients generated from OpenRPC documents by ferry-sdk-gen.");
    w.line("");
    for (name, title) in apis {
        w.line(format!("- `{name}`: {}", doc_text(title)));
    }
    w.line("\"\"\"");
    w.finish()
}

const WIDTH: usize = 88;

/// Names the module itself defines or imports; API names must not take them.
const MODULE_NAMES: &[&str] = &[
    "annotations",
    "Any",
    "Literal",
    "TypeAlias",
    "TypedDict",
    "cast",
    "Mapping",
    "Sequence",
    "npt",
    "AsyncClient",
    "Client",
    "RpcError",
    "TensorIn",
    "TensorParam",
    "TensorRef",
    "t",
    "ERRORS",
    "error_from_code",
    "_runtime_error",
    "_TYPES",
];

/// Names of Python builtins an exception class must not shadow.
const BUILTIN_EXCEPTIONS: &[&str] = &[
    "ArithmeticError",
    "AssertionError",
    "AttributeError",
    "BaseException",
    "BlockingIOError",
    "BrokenPipeError",
    "BufferError",
    "ChildProcessError",
    "ConnectionAbortedError",
    "ConnectionError",
    "ConnectionRefusedError",
    "ConnectionResetError",
    "EOFError",
    "EnvironmentError",
    "Exception",
    "FileExistsError",
    "FileNotFoundError",
    "FloatingPointError",
    "IOError",
    "ImportError",
    "IndentationError",
    "IndexError",
    "InterruptedError",
    "IsADirectoryError",
    "KeyError",
    "LookupError",
    "MemoryError",
    "ModuleNotFoundError",
    "NameError",
    "NotADirectoryError",
    "NotImplementedError",
    "OSError",
    "OverflowError",
    "PermissionError",
    "ProcessLookupError",
    "RecursionError",
    "ReferenceError",
    "RuntimeError",
    "StopIteration",
    "SyntaxError",
    "SystemError",
    "TabError",
    "TimeoutError",
    "TypeError",
    "UnboundLocalError",
    "UnicodeError",
    "ValueError",
    "ZeroDivisionError",
];

/// Where a type appears: params accept more (any sequence, mapping, `Tensor`, a remote
/// `TensorRef` where a tensor goes) than results give (lists, dicts, numpy arrays).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pos {
    Param,
    Result,
}

/// Everything the module's text depends on, resolved once.
struct Ctx<'a> {
    api: &'a Api,
    /// Type names (IR name -> Python name).
    types: Scope,
    /// What the rendered text uses from `typing` and friends.
    imports: BTreeSet<&'static str>,
    /// The runtime's error classes the module re-exports: (runtime name, name here).
    runtime_errors: Vec<(&'static str, String)>,
}

impl Ctx<'_> {
    fn ty(&mut self, ty: &Ty, pos: Pos) -> String {
        match ty {
            Ty::Any => {
                self.imports.insert("Any");
                "Any".into()
            }
            Ty::Null => "None".into(),
            Ty::Bool => "bool".into(),
            Ty::Integer => "int".into(),
            Ty::Number => "float".into(),
            Ty::String => "str".into(),
            Ty::TensorRef => {
                self.imports.insert("TensorRef");
                "TensorRef".into()
            }
            Ty::Tensor => match pos {
                // The server takes a reference wherever it takes a tensor (PROTOCOL.md §21):
                // `TensorParam` is `TensorIn | TensorRef`.
                Pos::Param => {
                    self.imports.insert("TensorParam");
                    "TensorParam".into()
                }
                Pos::Result => {
                    self.imports.insert("npt");
                    self.imports.insert("Any");
                    "npt.NDArray[Any]".into()
                }
            },
            Ty::Array(t) => {
                let inner = self.ty(t, pos);
                if pos == Pos::Param {
                    self.imports.insert("Sequence");
                    format!("Sequence[{inner}]")
                } else {
                    format!("list[{inner}]")
                }
            }
            Ty::Tuple(ts) => {
                let mut inner: Vec<String> = Vec::new();
                for t in ts {
                    let s = self.ty(t, pos);
                    if !inner.contains(&s) {
                        inner.push(s);
                    }
                }
                match pos {
                    // A tuple param may be any tuple or list of the right items.
                    Pos::Param if inner.is_empty() => "tuple[()]".into(),
                    Pos::Param => {
                        format!("tuple[{}]", ts.iter().map(|t| self.ty(t, pos)).collect::<Vec<_>>().join(", "))
                    }
                    // JSON gives a list back.
                    Pos::Result if inner.is_empty() => {
                        self.imports.insert("Any");
                        "list[Any]".into()
                    }
                    Pos::Result => format!("list[{}]", inner.join(" | ")),
                }
            }
            Ty::Map(t) => {
                let inner = self.ty(t, pos);
                if pos == Pos::Param {
                    self.imports.insert("Mapping");
                    format!("Mapping[str, {inner}]")
                } else {
                    format!("dict[str, {inner}]")
                }
            }
            Ty::Literal(vs) => {
                self.imports.insert("Literal");
                format!("Literal[{}]", vs.iter().map(py_value).collect::<Vec<_>>().join(", "))
            }
            Ty::Union(ts) => {
                // A param's tensor already takes a reference: no second `TensorRef`.
                let has_tensor = pos == Pos::Param && ts.contains(&Ty::Tensor);
                ts.iter()
                    .filter(|t| !(has_tensor && **t == Ty::TensorRef))
                    .map(|t| self.ty(t, pos))
                    .collect::<Vec<_>>()
                    .join(" | ")
            }
            Ty::Named(n) => self.type_name(n),
        }
    }

    fn type_name(&mut self, ir_name: &str) -> String {
        self.types.name(ir_name, ir_name)
    }

    /// The runtime spec (`ferry.types`) checking a result of type `ty`.
    fn spec(&mut self, ty: &Ty) -> String {
        match ty {
            Ty::Any => "t.ANY".into(),
            Ty::Null => "t.NULL".into(),
            Ty::Bool => "t.BOOL".into(),
            Ty::Integer => "t.INTEGER".into(),
            Ty::Number => "t.NUMBER".into(),
            Ty::String => "t.STRING".into(),
            Ty::Tensor => "t.TENSOR".into(),
            Ty::TensorRef => "t.TENSOR_REF".into(),
            Ty::Array(inner) => format!("t.ListOf({})", self.spec(inner)),
            Ty::Tuple(ts) => format!("t.TupleOf({})", ts.iter().map(|x| self.spec(x)).collect::<Vec<_>>().join(", ")),
            Ty::Map(inner) => format!("t.MapOf({})", self.spec(inner)),
            Ty::Literal(vs) => format!("t.OneOf({})", vs.iter().map(py_value).collect::<Vec<_>>().join(", ")),
            Ty::Union(ts) => format!("t.AnyOf({})", ts.iter().map(|x| self.spec(x)).collect::<Vec<_>>().join(", ")),
            Ty::Named(n) => format!("t.Ref({})", py_str(n)),
        }
    }
}

/// The module of `api`.
pub fn module(api: &Api) -> String {
    let mut types = Scope::new(PYTHON_RESERVED.iter().chain(MODULE_NAMES).chain(BUILTIN_EXCEPTIONS).copied());
    let client_types = api.client_types();
    // Type names first (in name order), so error classes and clients never take them.
    for name in client_types.keys() {
        types.name(name, name);
    }
    let mut cx = Ctx { api, types, imports: BTreeSet::new(), runtime_errors: Vec::new() };
    let class = pascal_case(&api.name);

    let mut body = CodeWriter::new("    ", WIDTH);
    for (name, def) in &client_types {
        body.blank(2);
        type_def(&mut cx, &mut body, name, def);
    }
    errors::errors(&mut cx, &mut body);
    specs(&mut cx, &mut body, &client_types);
    body.blank(2);
    client(&mut cx, &mut body, &class, false);
    body.blank(2);
    client(&mut cx, &mut body, &class, true);
    let body = body.finish();

    let mut w = CodeWriter::new("    ", WIDTH);
    w.line(format!("# {}", crate::preamble(&api.generated_by)));
    module_doc(&mut w, api, &class);
    w.line("");
    w.line("from __future__ import annotations");
    w.line("");
    let want = |k: &str| cx.imports.contains(k);
    let abc: Vec<&str> = ["Mapping", "Sequence"].into_iter().filter(|k| want(k)).collect();
    if !abc.is_empty() {
        w.line(format!("from collections.abc import {}", abc.join(", ")));
    }
    let typing: Vec<&str> =
        ["Any", "Literal", "TypeAlias", "TypedDict", "cast"].into_iter().filter(|k| want(k)).collect();
    if !typing.is_empty() {
        w.line(format!("from typing import {}", typing.join(", ")));
    }
    if want("npt") {
        w.line("");
        w.line("import numpy.typing as npt");
    }
    w.line("");
    let mut runtime = vec!["AsyncClient", "Client", "RpcError"];
    if want("TensorParam") {
        runtime.push("TensorParam");
    }
    if want("TensorRef") {
        runtime.push("TensorRef");
    }
    w.line(format!("from ferry import {}", runtime.join(", ")));
    w.line("from ferry import types as t");
    // `X as X`: re-exported (mypy --strict's no_implicit_reexport).
    let mut reexports: Vec<String> = cx.runtime_errors.iter().map(|(r, n)| format!("{r} as {n}")).collect();
    reexports.push("error_from_code as _runtime_error".into());
    let flat = format!("from ferry.rpc_errors import {}", reexports.join(", "));
    if w.fits(&flat) {
        w.line(flat);
    } else {
        w.list("from ferry.rpc_errors import (", &reexports, ")");
    }
    w.blank(2);
    for line in body.lines() {
        w.line(line);
    }
    w.finish()
}

fn module_doc(w: &mut CodeWriter, api: &Api, class: &str) {
    let version = if api.version.is_empty() { String::new() } else { format!(", version {}", api.version) };
    w.line(format!("\"\"\"Typed client of the \"{}\" API{version}.", doc_fragment(&api.title)));
    if let Some(d) = &api.description {
        w.line("");
        w.wrapped("", &doc_fragment(d));
    }
    w.line("");
    w.wrapped(
        "",
        &format!(
            "Generated by ferry-sdk-gen from the API's OpenRPC document. Use `{class}Client` (blocking) or \
             `Async{class}Client` (asyncio) on top of the `ferry` package. Errors the server returns are \
             raised as the classes of `ERRORS`, subclasses of `ferry.RpcError`: the runtime's own for \
             ferry's codes (`ferry.InvalidParamsError`, ..., re-exported here under the same names, so \
             `except` catches them whichever client raised), this module's for the API's own codes."
        ),
    );
    w.line("\"\"\"");
}

fn type_def(cx: &mut Ctx<'_>, w: &mut CodeWriter, ir_name: &str, def: &TypeDef) {
    let name = cx.type_name(ir_name);
    match def {
        TypeDef::Object { description, fields, additional: _ } => {
            cx.imports.insert("TypedDict");
            let (required, optional): (Vec<_>, Vec<_>) = fields.iter().partition(|f| f.required);
            let identifiers = fields.iter().all(|f| is_identifier(&f.name));
            if !identifiers {
                // Keys that are not identifiers need the functional syntax, which has no
                // bases: with optional keys, every key is optional to the type checker
                // (the runtime spec still requires the required ones).
                let items: Vec<String> =
                    fields.iter().map(|f| format!("{}: {}", py_str(&f.name), cx.ty(&f.ty, Pos::Result))).collect();
                let total = if optional.is_empty() { "" } else { ", total=False" };
                w.list(&format!("{name} = TypedDict({}, {{", py_str(&name)), &items, &format!("}}{total})"));
                if let Some(d) = description {
                    docstring(w, d);
                }
                return;
            }
            let fields_of = |cx: &mut Ctx<'_>, w: &mut CodeWriter, list: &[&crate::ir::Field]| {
                for f in list {
                    w.line(format!("{}: {}", f.name, cx.ty(&f.ty, Pos::Result)));
                    if let Some(d) = &f.description {
                        docstring(w, d);
                    }
                }
            };
            let doc = description.clone().unwrap_or_else(|| format!("The `{ir_name}` type."));
            if optional.is_empty() {
                w.line(format!("class {name}(TypedDict):"));
                w.indented(|w| {
                    docstring(w, &doc);
                    w.line("");
                    fields_of(cx, w, &required);
                });
            } else {
                let base = format!("_{name}Required");
                if required.is_empty() {
                    w.line(format!("class {name}(TypedDict, total=False):"));
                } else {
                    w.line(format!("class {base}(TypedDict):"));
                    w.indented(|w| {
                        docstring(w, &format!("The required fields of `{name}`."));
                        w.line("");
                        fields_of(cx, w, &required);
                    });
                    w.blank(2);
                    w.line(format!("class {name}({base}, total=False):"));
                }
                w.indented(|w| {
                    docstring(w, &doc);
                    w.line("");
                    fields_of(cx, w, &optional);
                });
            }
        }
        TypeDef::Enum { description, values } => {
            cx.imports.insert("Literal");
            cx.imports.insert("TypeAlias");
            let items: Vec<String> = values.iter().map(|v| py_value(&v.value)).collect();
            w.list(&format!("{name}: TypeAlias = Literal["), &items, "]");
            let mut doc = description.clone().unwrap_or_default();
            let described: Vec<String> = values
                .iter()
                .filter_map(|v| v.description.as_ref().map(|d| format!("- `{}`: {d}", py_value(&v.value))))
                .collect();
            if !described.is_empty() {
                if !doc.is_empty() {
                    doc.push_str("\n\n");
                }
                doc.push_str(&described.join("\n"));
            }
            if !doc.is_empty() {
                docstring(w, &doc);
            }
        }
        TypeDef::Alias { description, ty } => {
            cx.imports.insert("TypeAlias");
            let mut named = BTreeSet::new();
            ty.names(&mut named);
            let text = cx.ty(ty, Pos::Result);
            // An alias is evaluated at import time: quote it when it names other types,
            // which may be defined below it.
            let text = if named.is_empty() { text } else { py_str(&text) };
            w.line(format!("{name}: TypeAlias = {text}"));
            if let Some(d) = description {
                docstring(w, d);
            }
        }
    }
}

fn specs(cx: &mut Ctx<'_>, w: &mut CodeWriter, client_types: &std::collections::BTreeMap<&str, &TypeDef>) {
    let mut items = Vec::new();
    for (ir_name, def) in client_types {
        let spec = match def {
            TypeDef::Object { fields, additional, .. } => {
                let part = |cx: &mut Ctx<'_>, required: bool| -> String {
                    let kv: Vec<String> = fields
                        .iter()
                        .filter(|f| f.required == required)
                        .map(|f| format!("{}: {}", py_str(&f.name), cx.spec(&f.ty)))
                        .collect();
                    format!("{{{}}}", kv.join(", "))
                };
                let required = part(cx, true);
                let optional = part(cx, false);
                let extra = additional.as_ref().map_or("None".to_owned(), |a| cx.spec(a));
                format!("t.Object({required}, {optional}, {extra})")
            }
            TypeDef::Enum { values, .. } => {
                format!("t.OneOf({})", values.iter().map(|v| py_value(&v.value)).collect::<Vec<_>>().join(", "))
            }
            TypeDef::Alias { ty, .. } => cx.spec(ty),
        };
        items.push(format!("{}: {spec}", py_str(ir_name)));
    }
    w.blank(2);
    spec_dict(w, "_TYPES: dict[str, t.Spec] = {", &items, "}");
    docstring(w, "What the results' named types look like, for `ferry.types.check`.");
}

/// A dict literal of specs, one entry per line when it does not fit, each entry itself
/// broken at its top-level commas when it is too long.
fn spec_dict(w: &mut CodeWriter, open: &str, items: &[String], close: &str) {
    let flat = format!("{open}{}{close}", items.join(", "));
    if items.is_empty() || w.fits(&flat) {
        w.line(flat);
        return;
    }
    w.line(open);
    w.indented(|w| {
        for item in items {
            expr(w, item, ",");
        }
    });
    w.line(close);
}

/// Writes a docstring: one line if it fits, else the text wrapped, closing quotes on their
/// own line.
fn docstring(w: &mut CodeWriter, text: &str) {
    let text = doc_text(text.trim());
    let one = format!("\"\"\"{text}\"\"\"");
    if !text.contains('\n') && w.fits(&one) {
        w.line(one);
        return;
    }
    let mut lines = Vec::new();
    let width = w.width().saturating_sub(w.indent_width()).max(20);
    for para_line in text.lines() {
        // Keep indented lines (Args entries) as they are, wrapping their text with a hanging indent.
        let lead = para_line.len() - para_line.trim_start().len();
        if para_line.trim().is_empty() {
            lines.push(String::new());
            continue;
        }
        let wrapped = crate::writer::wrap(para_line.trim(), width.saturating_sub(lead + 4).max(20));
        for (i, l) in wrapped.iter().enumerate() {
            let pad = if i == 0 || lead == 0 { lead } else { lead + 4 };
            lines.push(format!("{}{l}", " ".repeat(pad)));
        }
    }
    let mut first = true;
    for l in &lines {
        if first {
            w.line(format!("\"\"\"{l}"));
            first = false;
        } else {
            w.line(l);
        }
    }
    w.line("\"\"\"");
}

/// Text safe inside a `"""` docstring, not at its end: backslashes doubled, `"""` broken.
fn doc_fragment(s: &str) -> String {
    s.replace('\\', "\\\\").replace("\"\"\"", "\\\"\\\"\\\"")
}

/// Text safe as a whole `"""` docstring: [`doc_fragment`], and no quote right before the
/// closing quotes.
fn doc_text(s: &str) -> String {
    let mut t = doc_fragment(s);
    if t.ends_with('"') {
        t.pop();
        t.push_str("\\\"");
    }
    t
}

/// A Python string literal (double quotes, as ruff writes them).
fn py_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A JSON scalar as a Python literal.
fn py_value(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => py_str(s),
        other => py_str(&other.to_string()),
    }
}

fn is_identifier(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !PYTHON_RESERVED.contains(&s)
}

#[cfg(test)]
mod tests;
