//! Identifiers: case conversions and a scope that keeps names unique and clear of each
//! language's reserved words.

use std::collections::{BTreeMap, BTreeSet};

/// `createTensor`, `create-tensor`, `ferry.task.submit` -> `create_tensor`, `ferry_task_submit`.
pub fn snake_case(raw: &str) -> String {
    let mut out = String::new();
    let mut prev: Option<char> = None;
    for c in raw.chars() {
        if c.is_ascii_alphanumeric() {
            if c.is_ascii_uppercase() && prev.is_some_and(|p| p.is_ascii_lowercase() || p.is_ascii_digit()) {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('_') && !out.is_empty() {
            out.push('_');
        }
        prev = Some(c);
    }
    let out = out.trim_end_matches('_').to_owned();
    if out.is_empty() {
        return "x".to_owned();
    }
    if out.starts_with(|c: char| c.is_ascii_digit()) { format!("n{out}") } else { out }
}

/// The class name of an error-table row `name`, the same in every language and in the
/// runtimes' own tables: `PascalCase` ending in `Error` (`INVALID_PARAMS` ->
/// `InvalidParamsError`, `PARSE_ERROR` -> `ParseError`, `SERVER_TIMEOUT` ->
/// `ServerTimeoutError`).
pub fn error_class_name(name: &str) -> String {
    let mut class = crate::ir::pascal_case(name);
    if !class.ends_with("Error") {
        class.push_str("Error");
    }
    class
}

/// Whether `code` is in the range JSON-RPC reserves for the implementation
/// (`-32768..=-32000`): ferry's own codes and JSON-RPC's standard ones. A generated module
/// declares no class of its own for such a code: the runtime has the classes of ferry's
/// ([`RUNTIME_ERRORS`]), so `isinstance` holds whichever client raised and no generated class
/// shadows a runtime one.
pub fn reserved_code(code: i64) -> bool {
    (-32768..=-32000).contains(&code)
}

/// The codes the runtimes have an error class for (`ferry.rpc_errors` in Python,
/// `rpc_errors.ts` in TypeScript), with their class names: ferry's error table
/// (`ferry_rpc::codes::ERROR_CODES`, from which `cargo xtask codegen` generates those
/// modules). sdk-gen depends on no ferry crate, so this is a copy; xtask's
/// `sdk_gen_knows_the_runtime_error_classes` test keeps it equal to the table.
pub const RUNTIME_ERRORS: &[(i64, &str)] = &[
    (-32700, "ParseError"),
    (-32600, "InvalidRequestError"),
    (-32601, "MethodNotFoundError"),
    (-32602, "InvalidParamsError"),
    (-32603, "InternalError"),
    (-32000, "ServerError"),
    (-32001, "LimitExceededError"),
    (-32002, "CancelledError"),
    (-32003, "ServerTimeoutError"),
    (-32004, "TaskNotFoundError"),
    (-32005, "TaskPendingError"),
    (-32006, "TensorError"),
    (-32007, "UnavailableError"),
    (-32008, "UnauthorizedError"),
    (-32009, "NotFoundError"),
    (-32010, "ForbiddenError"),
];

/// The runtime's class name for `code`, if the runtime has one ([`RUNTIME_ERRORS`]).
pub fn runtime_error_class(code: i64) -> Option<&'static str> {
    RUNTIME_ERRORS.iter().find(|(c, _)| *c == code).map(|(_, name)| *name)
}

/// `create_tensor` -> `createTensor`.
pub fn camel_case(raw: &str) -> String {
    let snake = snake_case(raw);
    let mut out = String::new();
    let mut upper = false;
    for c in snake.chars() {
        if c == '_' {
            upper = !out.is_empty();
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// Hands out unique identifiers: a wanted name that is reserved or already taken gets
/// `_` appended until it is free. The same sequence of requests always gives the same
/// names.
#[derive(Debug, Clone)]
pub struct Scope {
    taken: BTreeSet<String>,
    given: BTreeMap<String, String>,
}

impl Scope {
    /// A scope where `reserved` names are never handed out.
    pub fn new<'a>(reserved: impl IntoIterator<Item = &'a str>) -> Scope {
        Scope { taken: reserved.into_iter().map(str::to_owned).collect(), given: BTreeMap::new() }
    }

    /// The identifier for `key`, wanting `wanted`: the same for the same key every time.
    pub fn name(&mut self, key: &str, wanted: &str) -> String {
        if let Some(n) = self.given.get(key) {
            return n.clone();
        }
        let mut name = wanted.to_owned();
        while self.taken.contains(&name) {
            name.push('_');
        }
        self.taken.insert(name.clone());
        self.given.insert(key.to_owned(), name.clone());
        name
    }

    /// The identifier already given to `key`, if any.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.given.get(key).map(String::as_str)
    }
}

/// Python's keywords and soft keywords, and the builtins a generated module must not shadow.
pub const PYTHON_RESERVED: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue", "def", "del",
    "elif", "else", "except", "finally", "for", "from", "global", "if", "import", "in", "is", "lambda", "nonlocal",
    "not", "or", "pass", "raise", "return", "try", "while", "with", "yield", "match", "case", "type", "_",
];

/// TypeScript's reserved words (and strict-mode ones).
pub const TS_RESERVED: &[&str] = &[
    "break",
    "case",
    "catch",
    "class",
    "const",
    "continue",
    "debugger",
    "default",
    "delete",
    "do",
    "else",
    "enum",
    "export",
    "extends",
    "false",
    "finally",
    "for",
    "function",
    "if",
    "import",
    "in",
    "instanceof",
    "new",
    "null",
    "return",
    "super",
    "switch",
    "this",
    "throw",
    "true",
    "try",
    "typeof",
    "var",
    "void",
    "while",
    "with",
    "as",
    "implements",
    "interface",
    "let",
    "package",
    "private",
    "protected",
    "public",
    "static",
    "yield",
    "any",
    "boolean",
    "constructor",
    "declare",
    "get",
    "module",
    "require",
    "number",
    "set",
    "string",
    "symbol",
    "type",
    "from",
    "of",
    "await",
    "async",
    "unknown",
    "never",
    "object",
    "undefined",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases() {
        assert_eq!(snake_case("create_tensor"), "create_tensor");
        assert_eq!(snake_case("createTensor"), "create_tensor");
        assert_eq!(snake_case("ferry.task.submit"), "ferry_task_submit");
        assert_eq!(snake_case("x-y--z"), "x_y_z");
        assert_eq!(snake_case("2d"), "n2d");
        assert_eq!(snake_case("..."), "x");
        assert_eq!(camel_case("create_tensor"), "createTensor");
        assert_eq!(camel_case("sum"), "sum");
        assert_eq!(camel_case("getHTTP"), "getHttp");
        assert_eq!(error_class_name("PARSE_ERROR"), "ParseError");
        assert_eq!(error_class_name("INVALID_PARAMS"), "InvalidParamsError");
        assert_eq!(error_class_name("SERVER_TIMEOUT"), "ServerTimeoutError");
    }

    #[test]
    fn scopes_avoid_reserved_and_taken() {
        let mut s = Scope::new(["class"]);
        assert_eq!(s.name("a", "class"), "class_");
        assert_eq!(s.name("b", "class"), "class__");
        assert_eq!(s.name("a", "other"), "class_");
        assert_eq!(s.get("b"), Some("class__"));
    }
}
