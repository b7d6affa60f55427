//! The TypeScript emitter: one ES module per API on top of the `ferry-client` runtime
//! (`sdks/typescript`), as plain JavaScript (`<api>.js`) with its declarations
//! (`<api>.d.ts`): usable from JavaScript as it is, typed in TypeScript, no compiler step.
//!
//! The module exports, in this order: the named types (interfaces and type aliases), one
//! params interface and one result type per method (`<Method>Params`, `<Method>Result`;
//! tensors are `Tensor`, named tensor maps `Record<string, Tensor>`, and a param's tensor is
//! `Tensor | TensorRef`, the server taking a remote reference wherever it takes a tensor),
//! one error class per row of the error table outside JSON-RPC's reserved range (`class
//! <Name>Error extends RpcError`; the runtime has the classes of ferry's own codes, which the
//! module does not declare again) with `errorFromCode(code, message, data)`, and `class <Api>Client` with one method per API
//! method: `method(params, opts?: { timeoutMs?: number }): Promise<Result>`. Errors the
//! server returns are rethrown as the table's classes. ferry's built-in methods are the
//! runtime's own.
//!
//! The runtime is imported from [`TypeScript::runtime`] (`"ferry-client"` for a client of
//! one's own; `"../index.js"` inside the runtime package). The output is formatted as
//! prettier formats it (80 columns, double quotes, trailing commas).

use std::path::PathBuf;

use serde_json::Value;

use crate::Emitter;
use crate::ir::{Api, Method, ParamStructure, Ty, TypeDef, pascal_case};
use crate::names::{Scope, TS_RESERVED, camel_case, error_class_name, reserved_code};
use crate::writer::CodeWriter;

/// Emits `<api>.js` and `<api>.d.ts`.
#[derive(Debug, Clone)]
pub struct TypeScript {
    /// The module specifier the runtime is imported from.
    pub runtime: String,
}

impl Default for TypeScript {
    fn default() -> Self {
        TypeScript { runtime: "ferry-client".into() }
    }
}

impl Emitter for TypeScript {
    fn emit(&self, api: &Api) -> Vec<(PathBuf, String)> {
        let (js, dts) = modules(api, &self.runtime);
        vec![(PathBuf::from(format!("{}.js", api.name)), js), (PathBuf::from(format!("{}.d.ts", api.name)), dts)]
    }
}

const WIDTH: usize = 80;

/// Names the module imports or defines itself.
const MODULE_NAMES: &[&str] = &[
    "Client",
    "RpcError",
    "Tensor",
    "TensorRef",
    "CallOptions",
    "TaskStatus",
    "TaskSubmitOptions",
    "TaskResultOptions",
    "errorFromCode",
    "ERRORS",
    "RpcErrorClass",
    "runtimeError",
];

/// Members of the generated client class.
const CLIENT_MEMBERS: &[&str] = &["client", "call", "settle", "constructor"];

/// Whether `text` has `word` as a whole identifier (not inside `TensorRefsClient`).
fn mentions(text: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '$';
    text.match_indices(word).any(|(i, _)| !text[..i].ends_with(ident) && !text[i + word.len()..].starts_with(ident))
}

/// Where a type appears: a param's tensor also takes a remote `TensorRef` (the server puts
/// its kept tensor there, PROTOCOL.md §21); results and named types are as they travel.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pos {
    Param,
    Result,
}

fn ty(t: &Ty, types: &Scope, tensor: &mut bool, pos: Pos) -> String {
    match t {
        Ty::Any => "unknown".into(),
        Ty::Null => "null".into(),
        Ty::Bool => "boolean".into(),
        Ty::Integer | Ty::Number => "number".into(),
        Ty::String => "string".into(),
        Ty::Tensor => {
            *tensor = true;
            match pos {
                Pos::Param => "Tensor | TensorRef".into(),
                Pos::Result => "Tensor".into(),
            }
        }
        // (imported when the declarations mention it: see `declarations`)
        Ty::TensorRef => "TensorRef".into(),
        Ty::Array(inner) => {
            let s = ty(inner, types, tensor, pos);
            if matches!(**inner, Ty::Union(_) | Ty::Literal(_)) || split_union(&s).len() > 1 {
                format!("({s})[]")
            } else {
                format!("{s}[]")
            }
        }
        Ty::Tuple(ts) => format!("[{}]", ts.iter().map(|x| ty(x, types, tensor, pos)).collect::<Vec<_>>().join(", ")),
        Ty::Map(inner) => format!("Record<string, {}>", ty(inner, types, tensor, pos)),
        Ty::Literal(vs) => vs.iter().map(ts_value).collect::<Vec<_>>().join(" | "),
        Ty::Union(ts) => {
            // A param's tensor already takes a reference: no second `TensorRef`.
            let has_tensor = pos == Pos::Param && ts.contains(&Ty::Tensor);
            ts.iter()
                .filter(|x| !(has_tensor && **x == Ty::TensorRef))
                .map(|x| ty(x, types, tensor, pos))
                .collect::<Vec<_>>()
                .join(" | ")
        }
        Ty::Named(n) => types.get(n).unwrap_or(n).to_owned(),
    }
}

/// What a part of the module is written for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Out {
    /// The declarations (`.d.ts`): types, signatures, documentation.
    Dts,
    /// The code (`.js`): classes and functions without types.
    Js,
}

/// The modules of `api` (`.js`, `.d.ts`), importing the runtime from `runtime`.
pub fn modules(api: &Api, runtime: &str) -> (String, String) {
    let mut types = Scope::new(TS_RESERVED.iter().chain(MODULE_NAMES).copied());
    let client_types = api.client_types();
    for name in client_types.keys() {
        types.name(name, name);
    }
    let methods: Vec<&Method> = api.client_methods().collect();
    // Params and result type names, after the API's own names.
    let mut method_types = Vec::new();
    for m in &methods {
        let base = pascal_case(&m.name);
        let params = types.name(&format!("params:{}", m.name), &format!("{base}Params"));
        let result = types.name(&format!("result:{}", m.name), &format!("{base}Result"));
        method_types.push((params, result));
    }
    let mut tensor = false;
    let mut body = CodeWriter::new("  ", WIDTH);

    for (name, def) in &client_types {
        body.blank(1);
        type_def(&mut body, types.get(name).unwrap_or(name), def, &types, &mut tensor);
    }
    for (m, (params, result)) in methods.iter().zip(&method_types) {
        body.blank(1);
        jsdoc(&mut body, &format!("Params of `{}`.", m.name));
        if m.params.is_empty() {
            body.line(format!("export type {params} = Record<string, never>;"));
        } else {
            body.line(format!("export interface {params} {{"));
            body.indented(|w| {
                for p in &m.params {
                    if let Some(d) = &p.description {
                        let mut d = d.clone();
                        if let Some(default) = &p.default {
                            d.push_str(&format!(" Default (applied by the server): `{default}`."));
                        }
                        jsdoc(w, &d);
                    }
                    let opt = if p.required { "" } else { "?" };
                    w.line(format!("{}{opt}: {};", ts_key(&p.name), ty(&p.ty, &types, &mut tensor, Pos::Param)));
                }
            });
            body.line("}");
        }
        body.blank(1);
        jsdoc(&mut body, &m.result_description.clone().unwrap_or_else(|| format!("Result of `{}`.", m.name)));
        type_alias(&mut body, result, &ty(&m.result, &types, &mut tensor, Pos::Result));
    }
    let mut js = CodeWriter::new("  ", WIDTH);
    let mut error_types = types.clone();
    errors(&mut body, api, &mut types, Out::Dts);
    errors(&mut js, api, &mut error_types, Out::Js);
    client(&mut body, api, &methods, &method_types, Out::Dts);
    client(&mut js, api, &methods, &method_types, Out::Js);

    let mut doc = format!("Typed client of the \"{}\" API", api.title);
    if !api.version.is_empty() {
        doc.push_str(&format!(", version {}", api.version));
    }
    doc.push('.');
    if let Some(d) = &api.description {
        doc.push_str("\n\n");
        doc.push_str(d);
    }
    doc.push_str(&format!(
        "\n\nGenerated by ferry-sdk-gen from the API's OpenRPC document. Wrap a connected `Client` in \
         `{}Client`; errors the server returns are thrown as the runtime's error classes for ferry's \
         and JSON-RPC's codes (`InvalidParamsError` of `ferry-client`, ...) and as this module's for the \
         API's own, all subclasses of `RpcError`.",
        pascal_case(&api.name)
    ));
    let head = |w: &mut CodeWriter, what: &str, imports: &str| {
        w.line(format!("// {}", crate::preamble(&api.generated_by)));
        w.line("");
        jsdoc(w, &format!("{doc}\n\n{what}"));
        w.line("");
        w.line(format!("import {{ {imports} }} from {};", ts_str(runtime)));
    };

    let mut d = CodeWriter::new("  ", WIDTH);
    head(&mut d, "The declarations of the module beside this file (its `.js`).", "RpcError");
    let mut type_imports = vec!["Client"];
    if tensor {
        type_imports.push("Tensor");
    }
    let body_text = body.finish();
    // A user type cannot be called `TensorRef` (MODULE_NAMES): the name is the runtime's.
    if mentions(&body_text, "TensorRef") {
        type_imports.push("TensorRef");
    }
    if methods.iter().any(|m| m.task) {
        type_imports.push("TaskStatus");
    }
    d.line(format!("import type {{ {} }} from {};", type_imports.join(", "), ts_str(runtime)));
    d.line("");
    for line in body_text.lines() {
        d.line(line);
    }

    let mut j = CodeWriter::new("  ", WIDTH);
    head(
        &mut j,
        "Plain JavaScript; the types and documentation are in the `.d.ts` beside it.",
        "RpcError, errorFromCode as runtimeError",
    );
    j.line("");
    for line in js.finish().lines() {
        j.line(line);
    }
    (j.finish(), d.finish())
}

fn type_def(w: &mut CodeWriter, name: &str, def: &TypeDef, types: &Scope, tensor: &mut bool) {
    if let Some(d) = def.description() {
        jsdoc(w, d);
    }
    match def {
        TypeDef::Object { fields, additional, .. } => {
            w.line(format!("export interface {name} {{"));
            w.indented(|w| {
                for f in fields {
                    if let Some(d) = &f.description {
                        jsdoc(w, d);
                    }
                    let opt = if f.required { "" } else { "?" };
                    w.line(format!("{}{opt}: {};", ts_key(&f.name), ty(&f.ty, types, tensor, Pos::Result)));
                }
                if let Some(a) = additional {
                    // An index signature must admit every field's type too.
                    let mut all: Vec<String> = vec![ty(a, types, tensor, Pos::Result)];
                    for f in fields {
                        let t = ty(&f.ty, types, tensor, Pos::Result);
                        if !all.contains(&t) {
                            all.push(t);
                        }
                        if !f.required && !all.iter().any(|x| x == "undefined") {
                            all.push("undefined".into());
                        }
                    }
                    jsdoc(w, "Further keys.");
                    w.line(format!("[key: string]: {};", all.join(" | ")));
                }
            });
            w.line("}");
        }
        TypeDef::Enum { values, .. } => {
            let t = values.iter().map(|v| ts_value(&v.value)).collect::<Vec<_>>().join(" | ");
            type_alias(w, name, &t);
        }
        TypeDef::Alias { ty: t, .. } => {
            let t = ty(t, types, tensor, Pos::Result);
            type_alias(w, name, &t);
        }
    }
}

/// `export type Name = T;`, a long union broken one member per line as prettier does.
fn type_alias(w: &mut CodeWriter, name: &str, t: &str) {
    let flat = format!("export type {name} = {t};");
    let members = split_union(t);
    if w.fits(&flat) || members.len() < 2 {
        w.line(flat);
        return;
    }
    w.line(format!("export type {name} ="));
    w.indented(|w| {
        let last = members.len() - 1;
        for (i, m) in members.iter().enumerate() {
            w.line(format!("| {m}{}", if i == last { ";" } else { "" }));
        }
    });
}

/// The top-level members of a union type expression (outside brackets and strings).
fn split_union(t: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut in_str = false;
    let mut escaped = false;
    let mut current = String::new();
    for c in t.chars() {
        if in_str {
            current.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_str = false;
            }
            continue;
        }
        match c {
            '"' => {
                in_str = true;
                current.push(c);
            }
            '(' | '[' | '{' | '<' => {
                depth += 1;
                current.push(c);
            }
            ')' | ']' | '}' | '>' => {
                depth -= 1;
                current.push(c);
            }
            '|' if depth == 0 => out.push(std::mem::take(&mut current).trim().to_owned()),
            _ => current.push(c),
        }
    }
    out.push(current.trim().to_owned());
    out.retain(|s| !s.is_empty());
    out
}

fn errors(w: &mut CodeWriter, api: &Api, types: &mut Scope, out: Out) {
    let mut classes = Vec::new();
    // A reserved code is the runtime's (`errorFromCode` has its classes): no duplicate
    // `InvalidParamsError`, no `TimeoutError` shadowing the runtime's.
    for e in api.errors.iter().filter(|e| !reserved_code(e.code)) {
        let name = types.name(&format!("error:{}", e.name), &error_class_name(&e.name));
        w.blank(1);
        if out == Out::Dts {
            let mut doc = e.description.clone().unwrap_or_else(|| e.message.clone());
            doc.push_str(&format!("\n\nCode {}, `{}`: \"{}\".", e.code, e.name, e.message));
            jsdoc(w, &doc);
            w.line(format!("export declare class {name} extends RpcError {{"));
            w.indented(|w| w.line(format!("static readonly CODE = {};", e.code)));
        } else {
            w.line(format!("export class {name} extends RpcError {{"));
            w.indented(|w| w.line(format!("static CODE = {};", e.code)));
        }
        w.line("}");
        classes.push((e.code, name));
    }
    w.blank(1);
    if out == Out::Dts {
        jsdoc(w, "A constructor of an error class of this module.");
        w.line("type RpcErrorClass = new (...args: never[]) => RpcError;");
        w.blank(1);
        jsdoc(w, "The error class of each code of the error table.");
        w.line("export declare const ERRORS: ReadonlyMap<number, RpcErrorClass>;");
        w.blank(1);
        jsdoc(
            w,
            "The error for an error response: this module's class for the API's own `code`, else the \
             runtime's (`errorFromCode` of ferry-client: its class for ferry's and JSON-RPC's codes, else \
             `RpcError`).",
        );
        w.line("export declare function errorFromCode(");
        w.indented(|w| {
            w.line("code: number,");
            w.line("message: string,");
            w.line("data?: unknown,");
        });
        w.line("): RpcError;");
        return;
    }
    if classes.is_empty() {
        w.line("export const ERRORS = new Map();");
    } else {
        w.line("export const ERRORS = new Map([");
        w.indented(|w| {
            for (code, name) in &classes {
                w.line(format!("[{code}, {name}],"));
            }
        });
        w.line("]);");
    }
    w.blank(1);
    w.line("export function errorFromCode(code, message, data) {");
    w.indented(|w| {
        w.line("const ctor = ERRORS.get(code);");
        w.line("return ctor === undefined");
        w.indented(|w| {
            w.line("? runtimeError(code, message, data)");
            w.line(": new ctor(code, message, data);");
        });
    });
    w.line("}");
}

fn client(w: &mut CodeWriter, api: &Api, methods: &[&Method], method_types: &[(String, String)], out: Out) {
    let class = format!("{}Client", pascal_case(&api.name));
    let dts = out == Out::Dts;
    w.blank(1);
    if dts {
        jsdoc(w, "Options of one call.");
        w.line("export interface CallOptions {");
        w.indented(|w| {
            jsdoc(w, "Milliseconds to wait for the answer (default: the client's timeout).");
            w.line("timeoutMs?: number;");
        });
        w.line("}");
        if methods.iter().any(|m| m.task) {
            task_options(w);
        }
        w.blank(1);
        jsdoc(
            w,
            &format!("Client of the \"{}\" API: one method per API method, over a connected `Client`.", api.title),
        );
        w.line(format!("export declare class {class} {{"));
    } else {
        w.line(format!("export class {class} {{"));
    }
    w.indented(|w| {
        if dts {
            jsdoc(w, "The runtime client the calls go through.");
            w.line("readonly client: Client;");
            w.line("");
            w.line("constructor(client: Client);");
        } else {
            w.line("constructor(client) {");
            w.indented(|w| w.line("this.client = client;"));
            w.line("}");
        }
        let mut members = Scope::new(TS_RESERVED.iter().chain(CLIENT_MEMBERS).copied());
        for (m, (params, result)) in methods.iter().zip(method_types) {
            w.line("");
            let name = members.name(&m.name, &camel_case(&m.name));
            if dts {
                let mut doc = m.summary.clone().unwrap_or_else(|| format!("Calls `{}`.", m.name));
                if let Some(d) = &m.description {
                    doc.push_str("\n\n");
                    doc.push_str(d);
                }
                if m.deprecated {
                    doc.push_str("\n\n@deprecated");
                }
                jsdoc(w, &doc);
                // A method without params takes an (ignored) empty object, and sends no
                // params at all: a server whose method takes none refuses `{}` and `[]`.
                let params_arg =
                    if m.params.is_empty() { format!("_params?: {params}") } else { format!("params: {params}") };
                let args = [params_arg, "opts?: CallOptions".to_owned()];
                w.list(&format!("{name}("), &args, &format!("): Promise<{result}>;"));
                if m.task {
                    task_helpers(w, m, &mut members, params, result, out);
                }
                continue;
            }
            let params_arg = if m.params.is_empty() { "_params = {}" } else { "params" };
            w.list(&format!("{name}("), &[params_arg.to_owned(), "opts".to_owned()], ") {");
            w.indented(|w| {
                let send = send_params(m);
                let call = format!("return this.call({}, {send}, opts);", ts_str(&m.name));
                if w.fits(&call) {
                    w.line(call);
                } else {
                    w.line("return this.call(");
                    w.indented(|w| {
                        w.line(format!("{},", ts_str(&m.name)));
                        w.line(format!("{send},"));
                        w.line("opts,");
                    });
                    w.line(");");
                }
            });
            w.line("}");
            if m.task {
                task_helpers(w, m, &mut members, params, result, out);
            }
        }
        w.line("");
        let tasks = methods.iter().any(|m| m.task);
        if dts {
            jsdoc(w, "Calls `method`, rethrowing error responses as this module's error classes.");
            w.line("private call;");
            if tasks {
                jsdoc(w, "Awaits a task call of the runtime, rethrowing as `call` does.");
                w.line("private settle;");
            }
            return;
        }
        if tasks {
            w.line("async settle(pending) {");
            w.indented(|w| {
                w.line("try {");
                w.indented(|w| w.line("return await pending;"));
                w.line("} catch (e) {");
                w.indented(|w| {
                    w.line("throw e instanceof RpcError && ERRORS.has(e.code)");
                    w.indented(|w| {
                        w.line("? errorFromCode(e.code, e.message, e.data)");
                        w.line(": e;");
                    });
                });
                w.line("}");
            });
            w.line("}");
            w.line("");
        }
        w.line("async call(method, params, opts) {");
        w.indented(|w| {
            w.line("try {");
            w.indented(|w| w.line("return await this.client.call(method, params, opts);"));
            w.line("} catch (e) {");
            w.indented(|w| {
                // The runtime already threw its own class for ferry's codes.
                w.line("throw e instanceof RpcError && ERRORS.has(e.code)");
                w.indented(|w| {
                    w.line("? errorFromCode(e.code, e.message, e.data)");
                    w.line(": e;");
                });
            });
            w.line("}");
        });
        w.line("}");
    });
    w.line("}");
}

/// The params `m`'s call sends, as a JS expression of its `params` argument.
fn send_params(m: &Method) -> String {
    if m.params.is_empty() {
        "undefined".to_owned()
    } else if m.param_structure == ParamStructure::ByPosition {
        let items: Vec<String> = m.params.iter().map(|p| format!("params{}", ts_access(&p.name))).collect();
        format!("[{}]", items.join(", "))
    } else {
        "params".to_owned()
    }
}

/// The options of a task method's submit and result helpers (in the `.d.ts`).
fn task_options(w: &mut CodeWriter) {
    w.blank(1);
    jsdoc(w, "Options of a task's submit helper (`ferry.task.submit`).");
    w.line("export interface TaskSubmitOptions extends CallOptions {");
    w.indented(|w| {
        jsdoc(w, "Keep the result after it is fetched (until it expires).");
        w.line("keep?: boolean;");
        jsdoc(w, "Let the task outlive this connection (else closing it cancels the task).");
        w.line("detached?: boolean;");
    });
    w.line("}");
    w.blank(1);
    jsdoc(w, "Options of a task's result helper (`ferry.task.result`).");
    w.line("export interface TaskResultOptions extends CallOptions {");
    w.indented(|w| {
        jsdoc(w, "Milliseconds the server waits for the task to finish before answering.");
        w.line("waitMs?: number;");
        jsdoc(w, "Keep the result after this fetch (until it expires).");
        w.line("keep?: boolean;");
    });
    w.line("}");
}

/// `NAMESubmit`, `NAMEStatus` and `NAMEResult` of a long-running method (`x-ferry-task`),
/// through the runtime's `submitTask`, `taskStatus` and `taskResult`.
fn task_helpers(w: &mut CodeWriter, m: &Method, members: &mut Scope, params: &str, result: &str, out: Out) {
    let base = camel_case(&m.name);
    let submit = members.name(&format!("{}\0submit", m.name), &format!("{base}Submit"));
    let status = members.name(&format!("{}\0status", m.name), &format!("{base}Status"));
    let fetch = members.name(&format!("{}\0result", m.name), &format!("{base}Result"));
    let wire = ts_str(&m.name);
    if out == Out::Dts {
        w.line("");
        jsdoc(
            w,
            &format!(
                "Starts `{}` as a task on the server (`ferry.task.submit`); resolves to the task id, for \
                 `{status}` and `{fetch}`. The task is cancelled, its result dropped, when this connection \
                 closes, unless `detached`.",
                m.name
            ),
        );
        let params_arg = if m.params.is_empty() { format!("_params?: {params}") } else { format!("params: {params}") };
        let args = [params_arg, "opts?: TaskSubmitOptions".to_owned()];
        w.list(&format!("{submit}("), &args, "): Promise<string>;");
        w.line("");
        jsdoc(w, &format!("Where the `{}` task `task` is (`ferry.task.status`).", m.name));
        w.line(format!("{status}(task: string, opts?: CallOptions): Promise<TaskStatus>;"));
        w.line("");
        jsdoc(
            w,
            &format!(
                "The result of the `{}` task `task` (`ferry.task.result`), waiting up to `waitMs` on the \
                 server; rejects with `TaskPendingError` while it still runs, and with the task's own error \
                 if it failed.",
                m.name
            ),
        );
        w.line(format!("{fetch}(task: string, opts?: TaskResultOptions): Promise<{result}>;"));
        return;
    }
    let one = |w: &mut CodeWriter, head: String, call: String| {
        w.line("");
        w.line(head);
        w.indented(|w| {
            let line = format!("return this.settle({call});");
            if w.fits(&line) {
                w.line(line);
            } else {
                w.line("return this.settle(");
                w.indented(|w| w.line(format!("{call},")));
                w.line(");");
            }
        });
        w.line("}");
    };
    let params_arg = if m.params.is_empty() { "_params = {}" } else { "params" };
    one(
        w,
        format!("{submit}({params_arg}, opts) {{"),
        format!("this.client.submitTask({wire}, {}, opts)", send_params(m)),
    );
    one(w, format!("{status}(task, opts) {{"), "this.client.taskStatus(task, opts)".to_owned());
    one(w, format!("{fetch}(task, opts) {{"), "this.client.taskResult(task, opts)".to_owned());
}

/// A JSDoc comment: `/** text */` when it fits on one line, else one line per line.
fn jsdoc(w: &mut CodeWriter, text: &str) {
    let text = text.trim().replace("*/", "*\\/");
    let one = format!("/** {text} */");
    if w.fits(&one) {
        w.line(one);
        return;
    }
    w.line("/**");
    w.wrapped(" * ", &text);
    w.line(" */");
}

/// A TypeScript string literal, as prettier writes it (double quotes).
fn ts_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn ts_value(v: &Value) -> String {
    match v {
        Value::String(s) => ts_str(s),
        other => other.to_string(),
    }
}

fn is_identifier(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_' || c == '$')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
}

/// A property key: bare when it is an identifier, else quoted.
fn ts_key(s: &str) -> String {
    if is_identifier(s) { s.to_owned() } else { ts_str(s) }
}

/// `.name` or `["not-an-identifier"]`.
fn ts_access(s: &str) -> String {
    if is_identifier(s) { format!(".{s}") } else { format!("[{}]", ts_str(s)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unions_split_at_the_top_level() {
        assert_eq!(
            split_union("\"a|b\" | Record<string, A | B> | (C | D)[]"),
            ["\"a|b\"", "Record<string, A | B>", "(C | D)[]"]
        );
    }

    #[test]
    fn keys_and_strings() {
        assert_eq!(ts_key("fc1.weight"), "\"fc1.weight\"");
        assert_eq!(ts_key("$tensor"), "$tensor");
        assert_eq!(ts_access("a-b"), "[\"a-b\"]");
        assert_eq!(ts_str("\u{1}"), "\"\\u0001\"");
    }
}
