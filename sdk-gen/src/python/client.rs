//! The client classes of a generated module: `<Api>Client` (blocking, over
//! `ferry.Client`) and `Async<Api>Client` (asyncio, over `ferry.AsyncClient`), each with
//! `connect`, `close` and one typed method per API method: its params built, its result
//! checked against its spec, its docstring made from the method's (a long-running
//! method's helpers: `tasks.rs`).

use super::{Ctx, Pos, docstring, expr, py_str, tasks};
use crate::ir::{Method, ParamStructure};
use crate::names::{PYTHON_RESERVED, Scope, snake_case};
use crate::writer::CodeWriter;

/// Methods of the generated client classes that API methods must not take.
const CLIENT_MEMBERS: &[&str] = &["client", "connect", "close", "_call", "_submit", "_status", "_result"];

pub(super) fn client(cx: &mut Ctx<'_>, w: &mut CodeWriter, class: &str, asynchronous: bool) {
    let (name, runtime, aw, def) = if asynchronous {
        (format!("Async{class}Client"), "AsyncClient", "await ", "async def")
    } else {
        (format!("{class}Client"), "Client", "", "def")
    };
    let title = &cx.api.title;
    cx.imports.insert("Any"); // (`connect`'s `**options`)
    w.line(format!("class {name}:"));
    w.indented(|w| {
        let (kind, how) = if asynchronous {
            (
                "An asyncio",
                format!(
                    "Connect with `await {name}.connect(addr)`, or wrap a connected `ferry.AsyncClient`; \
                     close it with `await close()` or use `async with`."
                ),
            )
        } else {
            (
                "Blocking",
                format!(
                    "Connect with `{name}.connect(addr)`, or wrap a connected `ferry.Client`; close it \
                     with `close()` or use `with`."
                ),
            )
        };
        docstring(
            w,
            &format!(
                "{kind} client of the \"{title}\" API.\n\n{how} Each method raises the exception classes of \
                 `ERRORS` for error responses, `ferry.CallTimeout` when no answer comes in time, and \
                 `ferry.ConnectionClosed` when the connection is gone."
            ),
        );
        w.line("");
        w.line(format!("def __init__(self, client: {runtime}) -> None:"));
        w.indented(|w| w.line("self.client = client"));
        w.line("");
        w.line("@classmethod");
        w.list(
            &format!("{def} connect("),
            &[
                "cls".into(),
                "addr: str".into(),
                "*".into(),
                "timeout: float = 60.0".into(),
                "token: str | None = None".into(),
                "**options: Any".into(),
            ],
            &format!(") -> {name}:"),
        );
        w.indented(|w| {
            docstring(
                w,
                &format!(
                    "Connects to the server at `addr` (`unix:NAME`, `unix:/path` or `quic://host:port#sha256=PIN`).\n\n\
                     `timeout` is the default for every call, in seconds; `token` is the server's bearer token, if \
                     it needs one; `options` are the other options of `ferry.{runtime}.connect` (e.g. \
                     `connect_timeout=5.0`, `as_torch=True`)."
                ),
            );
            expr(w, &format!("return cls({aw}{runtime}.connect(addr, timeout=timeout, token=token, **options))"), "");
        });
        w.line("");
        w.line(format!("{def} close(self) -> None:"));
        w.indented(|w| {
            docstring(w, "Closes the connection.");
            w.line(format!("{aw}self.client.close()"));
        });
        w.line("");
        if asynchronous {
            w.line(format!("async def __aenter__(self) -> {name}:"));
            w.indented(|w| w.line("return self"));
            w.line("");
            w.line("async def __aexit__(self, *exc: object) -> None:");
            w.indented(|w| w.line("await self.close()"));
        } else {
            w.line(format!("def __enter__(self) -> {name}:"));
            w.indented(|w| w.line("return self"));
            w.line("");
            w.line("def __exit__(self, *exc: object) -> None:");
            w.indented(|w| w.line("self.close()"));
        }
        w.line("");
        w.line(format!("{def} _call(self, method: str, params: object, timeout: float | None) -> object:"));
        w.indented(|w| {
            w.line("try:");
            w.indented(|w| w.line(format!("return {aw}self.client.call(method, params, timeout=timeout)")));
            w.line("except RpcError as e:");
            w.indented(|w| w.line("raise error_from_code(e.code, e.message, e.data) from None"));
        });
        if cx.api.client_methods().any(|m| m.task) {
            tasks::runtime_calls(w, asynchronous);
        }
        let mut members = Scope::new(PYTHON_RESERVED.iter().chain(CLIENT_MEMBERS).copied());
        let methods: Vec<&Method> = cx.api.client_methods().collect();
        for m in methods {
            w.line("");
            method(cx, w, m, &mut members, asynchronous);
        }
    });
}

fn method(cx: &mut Ctx<'_>, w: &mut CodeWriter, m: &Method, members: &mut Scope, asynchronous: bool) {
    let name = members.name(&m.name, &snake_case(&m.name));
    // A task's helpers take these too (`f_submit(.., keep, detached)`).
    let task_args: &[&str] = if m.task { &["keep", "detached"] } else { &[] };
    let reserved = ["self", "timeout", "params", "result"].iter().chain(task_args);
    let mut locals = Scope::new(PYTHON_RESERVED.iter().chain(reserved).copied());
    let mut args = vec!["self".to_owned()];
    let mut optional = Vec::new();
    // Required params first, in order; then the optional ones, keyword-only.
    let (required, rest): (Vec<_>, Vec<_>) = m.params.iter().partition(|p| p.required);
    for p in &required {
        let id = locals.name(&p.name, &snake_case(&p.name));
        args.push(format!("{id}: {}", cx.ty(&p.ty, Pos::Param)));
    }
    args.push("*".into());
    for p in &rest {
        let id = locals.name(&p.name, &snake_case(&p.name));
        let ty = cx.ty(&p.ty, Pos::Param);
        let ty = if p.ty.is_nullable() { ty } else { format!("{ty} | None") };
        args.push(format!("{id}: {ty} = None"));
        optional.push(*p);
    }
    let params_args = args.clone();
    args.push("timeout: float | None = None".into());
    let result_ty = cx.ty(&m.result, Pos::Result);
    let def = if asynchronous { "async def" } else { "def" };
    w.list(&format!("{def} {name}("), &args, &format!(") -> {result_ty}:"));
    w.indented(|w| {
        docstring(w, &method_doc(m, &locals));
        let aw = if asynchronous { "await " } else { "" };
        if m.params.is_empty() {
            // No params at all: send none (a unit-params server refuses `{}` and `[]`).
            expr(w, &format!("result = {aw}self._call({}, None, timeout)", py_str(&m.name)), "");
        } else {
            params_value(w, m, &required, &optional, &locals);
            expr(w, &format!("result = {aw}self._call({}, params, timeout)", py_str(&m.name)), "");
        }
        cx.imports.insert("cast");
        let spec = cx.spec(&m.result);
        let ret = format!("return cast({}, t.check(result, {spec}, {}, _TYPES))", py_str(&result_ty), py_str(&m.name));
        expr(w, &ret, "");
    });
    if m.task {
        let call = tasks::Call {
            m,
            name: &name,
            args: params_args,
            required: &required,
            optional: &optional,
            locals: &locals,
        };
        tasks::helpers(cx, w, &call, members, asynchronous);
    }
}

/// Writes `params = ..`: a dict by name (optional params only when given) or a list by
/// position (trailing params not given left out).
pub(super) fn params_value(
    w: &mut CodeWriter,
    m: &Method,
    required: &[&crate::ir::Param],
    optional: &[&crate::ir::Param],
    locals: &Scope,
) {
    let by_position = m.param_structure == ParamStructure::ByPosition;
    let id = |p: &crate::ir::Param| locals.get(&p.name).unwrap_or(&p.name).to_owned();
    if by_position {
        // Positional: every param up to the last one given.
        let items: Vec<String> = m.params.iter().map(id).collect();
        if optional.is_empty() {
            w.list("params: list[object] = [", &items, "]");
        } else {
            w.list("args: list[object] = [", &items, "]");
            w.line("while args and args[-1] is None:");
            w.indented(|w| w.line("args.pop()"));
            w.line("params = args");
        }
    } else {
        let items: Vec<String> = required.iter().map(|p| format!("{}: {}", py_str(&p.name), id(p))).collect();
        if optional.is_empty() && items.is_empty() {
            w.line("params: dict[str, object] = {}");
        } else if optional.is_empty() {
            w.list("params: dict[str, object] = {", &items, "}");
        } else {
            w.list("params: dict[str, object] = {", &items, "}");
            for p in optional {
                let local = id(p);
                w.line(format!("if {local} is not None:"));
                w.indented(|w| w.line(format!("params[{}] = {local}", py_str(&p.name))));
            }
        }
    }
}

fn method_doc(m: &Method, locals: &Scope) -> String {
    let mut parts = Vec::new();
    let summary = m.summary.clone().unwrap_or_else(|| format!("Calls `{}`.", m.name));
    parts.push(summary);
    if let Some(d) = &m.description {
        parts.push(d.clone());
    }
    if m.deprecated {
        parts.push("Deprecated.".into());
    }
    let mut args = vec!["Args:".to_owned()];
    args.extend(arg_docs(m, locals));
    args.push("    timeout: Seconds to wait for the answer (default: the client's timeout).".into());
    parts.push(args.join("\n"));
    if let Some(returns) = &m.result_description {
        parts.push(format!("Returns:\n    {returns}"));
    }
    parts.join("\n\n")
}

/// The `Args:` lines of `m`'s params, indented.
pub(super) fn arg_docs(m: &Method, locals: &Scope) -> Vec<String> {
    let doc = |p: &crate::ir::Param| {
        let id = locals.get(&p.name).unwrap_or(&p.name);
        let mut d = p.description.clone().unwrap_or_else(|| format!("`{}`.", p.name));
        if let Some(default) = &p.default {
            d.push_str(&format!(" Default (applied by the server): `{default}`."));
        } else if !p.required {
            d.push_str(" Optional.");
        }
        format!("    {id}: {d}")
    };
    m.params.iter().map(doc).collect()
}
