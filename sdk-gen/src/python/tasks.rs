//! The helpers of a long-running method (`x-ferry-task: true`): beside `f(..)`, which calls
//! it and waits, `f_submit(..)` starts it as a task and returns the task id,
//! `f_status(task)` says where the task is, and `f_result(task, wait=..)` fetches its
//! result, checked as `f`'s is. They go through the runtime client's `submit`,
//! `task_status` and `task_result` (`ferry.task.submit / status / result`).

use super::{CodeWriter, Ctx, Method, Pos, Scope, arg_docs, docstring, expr, params_value, py_str};
use crate::ir::Param;

/// What the helpers of one method need from its call: the method, its Python name, its
/// params as arguments (`self`, the required ones, `*`, the optional ones) and their
/// local names.
pub(super) struct Call<'a> {
    pub m: &'a Method,
    pub name: &'a str,
    pub args: Vec<String>,
    pub required: &'a [&'a Param],
    pub optional: &'a [&'a Param],
    pub locals: &'a Scope,
}

/// The client's private methods the helpers go through (`_submit`, `_status`,
/// `_result`), each raising this module's error classes for error responses, as `_call`.
pub(super) fn runtime_calls(w: &mut CodeWriter, asynchronous: bool) {
    let (def, aw) = if asynchronous { ("async def", "await ") } else { ("def", "") };
    let rethrow = |w: &mut CodeWriter, call: &str| {
        w.line("try:");
        w.indented(|w| expr(w, &format!("return {aw}self.client.{call}"), ""));
        w.line("except RpcError as e:");
        w.indented(|w| w.line("raise error_from_code(e.code, e.message, e.data) from None"));
    };
    let args = |names: &[&str]| names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    w.line("");
    let submit = args(&["self", "method: str", "params: object", "keep: bool", "detached: bool"]);
    w.list(&format!("{def} _submit("), &submit, ") -> str:");
    w.indented(|w| rethrow(w, "submit(method, params, keep=keep, detached=detached)"));
    w.line("");
    w.line(format!("{def} _status(self, task: str) -> dict[str, Any]:"));
    w.indented(|w| rethrow(w, "task_status(task)"));
    w.line("");
    let result = args(&["self", "task: str", "wait: float", "keep: bool", "timeout: float | None"]);
    w.list(&format!("{def} _result("), &result, ") -> object:");
    w.indented(|w| rethrow(w, "task_result(task, wait_ms=round(wait * 1000), keep=keep, timeout=timeout)"));
}

/// Writes `NAME_submit`, `NAME_status` and `NAME_result` for the task method of `call`.
pub(super) fn helpers(cx: &mut Ctx<'_>, w: &mut CodeWriter, call: &Call<'_>, members: &mut Scope, asynchronous: bool) {
    let Call { m, name, .. } = *call;
    let (def, aw) = if asynchronous { ("async def", "await ") } else { ("def", "") };
    // From the wire name, not the call's Python name (`close_` beside the client's `close`).
    let base = crate::names::snake_case(&m.name);
    let submit = members.name(&format!("{}\0submit", m.name), &format!("{base}_submit"));
    let status = members.name(&format!("{}\0status", m.name), &format!("{base}_status"));
    let result = members.name(&format!("{}\0result", m.name), &format!("{base}_result"));
    let wire = py_str(&m.name);

    w.line("");
    let mut args = call.args.clone();
    args.extend(["keep: bool = False".to_owned(), "detached: bool = False".to_owned()]);
    w.list(&format!("{def} {submit}("), &args, ") -> str:");
    w.indented(|w| {
        let mut arg_lines = vec!["Args:".to_owned()];
        arg_lines.extend(arg_docs(m, call.locals));
        arg_lines.push("    keep: Keep the result after it is fetched (until it expires).".into());
        arg_lines.push("    detached: Let the task outlive this connection.".into());
        docstring(
            w,
            &format!(
                "Starts `{}` as a task on the server (`ferry.task.submit`); returns the task id, for \
                 `{status}` and `{result}`.\n\nThe task is cancelled, its result dropped, when this \
                 connection closes, unless `detached`: then any connection of the same identity may fetch \
                 it until it expires.\n\n{}",
                m.name,
                arg_lines.join("\n")
            ),
        );
        if m.params.is_empty() {
            w.line(format!("return {aw}self._submit({wire}, None, keep, detached)"));
        } else {
            params_value(w, m, call.required, call.optional, call.locals);
            w.line(format!("return {aw}self._submit({wire}, params, keep, detached)"));
        }
    });

    w.line("");
    w.line(format!("{def} {status}(self, task: str) -> dict[str, Any]:"));
    w.indented(|w| {
        docstring(
            w,
            &format!(
                "Where the `{}` task `task` (from `{submit}`) is (`ferry.task.status`): \
                 `{{\"task\", \"method\", \"state\", \"elapsed_ms\"}}`, the state one of running, done, \
                 failed and cancelled.",
                m.name
            ),
        );
        w.line(format!("return {aw}self._status(task)"));
    });

    w.line("");
    let result_ty = cx.ty(&m.result, Pos::Result);
    let args: Vec<String> =
        ["self", "task: str", "*", "wait: float = 0.0", "keep: bool = False", "timeout: float | None = None"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
    w.list(&format!("{def} {result}("), &args, &format!(") -> {result_ty}:"));
    w.indented(|w| {
        docstring(
            w,
            &format!(
                "The result of the `{}` task `task` (from `{submit}`), checked as `{name}`'s is \
                 (`ferry.task.result`). Raises `TaskPendingError` while the task still runs, and the \
                 task's own error if it failed; a result is fetched once unless kept.\n\n\
                 Args:\n    task: The task id.\n    wait: Seconds the server waits for the task to finish \
                 before answering.\n    keep: Keep the result after this fetch (until it expires).\n    \
                 timeout: Seconds to wait for the answer (default: the client's timeout, and at least \
                 `wait` and 10 more).",
                m.name
            ),
        );
        w.line(format!("result = {aw}self._result(task, wait, keep, timeout)"));
        cx.imports.insert("cast");
        let spec = cx.spec(&m.result);
        let ret = format!("return cast({}, t.check(result, {spec}, {wire}, _TYPES))", py_str(&result_ty));
        expr(w, &ret, "");
    });
}
