//! The error codes, in one table ([`ERROR_CODES`]), and the wire error object
//! ([`ErrorObject`]).
//!
//! JSON-RPC 2.0 reserves `-32768..=-32000`. The five standard codes are `-32700` and
//! `-32600..=-32603`; ferry's own codes are `-32000` down to `-32099`. Application handlers
//! may use any code outside the reserved range. The table is published in `rpc.discover`
//! (extension `x-ferry-errors`) so SDK generators can turn each code into a typed exception.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Invalid JSON was received (JSON-RPC 2.0).
pub const PARSE_ERROR: i64 = -32700;
/// The JSON sent is not a valid Request object (JSON-RPC 2.0).
pub const INVALID_REQUEST: i64 = -32600;
/// The method does not exist (JSON-RPC 2.0).
pub const METHOD_NOT_FOUND: i64 = -32601;
/// Invalid method parameters (JSON-RPC 2.0).
pub const INVALID_PARAMS: i64 = -32602;
/// Internal JSON-RPC error (JSON-RPC 2.0).
pub const INTERNAL_ERROR: i64 = -32603;
/// A handler failed without choosing a code (ferry).
pub const SERVER_ERROR: i64 = -32000;
/// A limit of [`crate::RpcLimits`] was exceeded; `data` names it (ferry).
pub const LIMIT_EXCEEDED: i64 = -32001;
/// The call was cancelled (`ferry.cancel`, `ferry.task.cancel`, or the connection closed) (ferry).
pub const CANCELLED: i64 = -32002;
/// The call did not finish in time on the server (ferry). Named `SERVER_TIMEOUT` (class
/// `ServerTimeoutError` in the SDKs) so that it is never confused with, or shadows, a
/// client's own timeout (`TimeoutError` in TypeScript and Python).
pub const SERVER_TIMEOUT: i64 = -32003;
/// No task has this id (never submitted, already fetched, or expired) (ferry).
pub const TASK_NOT_FOUND: i64 = -32004;
/// The task has not finished yet (ferry).
pub const TASK_PENDING: i64 = -32005;
/// A tensor reference or inline tensor is invalid, or a tensor cannot be carried (ferry).
pub const TENSOR_ERROR: i64 = -32006;
/// The server is shutting down (ferry).
pub const UNAVAILABLE: i64 = -32007;
/// The caller did not present the server's bearer token, or its request was refused before
/// it was read (a foreign browser origin, a foreign Host, not JSON) (ferry).
pub const UNAUTHORIZED: i64 = -32008;
/// No such object: an unknown, freed or foreign tensor-store bundle, version or reference
/// (ferry-store).
pub const NOT_FOUND: i64 = -32009;
/// The caller's identity may not change this object: a bundle another identity published
/// (ferry-store).
pub const FORBIDDEN: i64 = -32010;

/// One row of the error-code table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
pub struct ErrorCode {
    /// The code.
    pub code: i64,
    /// A stable identifier (`SCREAMING_SNAKE_CASE`), usable as an exception class name.
    pub name: &'static str,
    /// The default `message`.
    pub message: &'static str,
    /// When it is used.
    pub description: &'static str,
}

/// Every code the JSON-RPC layer itself produces, standard ones first.
pub const ERROR_CODES: &[ErrorCode] = &[
    ErrorCode {
        code: PARSE_ERROR,
        name: "PARSE_ERROR",
        message: "Parse error",
        description: "Invalid JSON was received (plain JSON and HTTP connections).",
    },
    ErrorCode {
        code: INVALID_REQUEST,
        name: "INVALID_REQUEST",
        message: "Invalid Request",
        description: "The JSON sent is not a valid Request object.",
    },
    ErrorCode {
        code: METHOD_NOT_FOUND,
        name: "METHOD_NOT_FOUND",
        message: "Method not found",
        description: "The method does not exist or is not available.",
    },
    ErrorCode {
        code: INVALID_PARAMS,
        name: "INVALID_PARAMS",
        message: "Invalid params",
        description: "The params do not match the method's schema; data.path and data.reason say where and why.",
    },
    ErrorCode {
        code: INTERNAL_ERROR,
        name: "INTERNAL_ERROR",
        message: "Internal error",
        description: "The server failed to process the call (e.g. the result did not serialize, or the handler panicked).",
    },
    ErrorCode {
        code: SERVER_ERROR,
        name: "SERVER_ERROR",
        message: "Server error",
        description: "A handler returned an error without choosing a code.",
    },
    ErrorCode {
        code: LIMIT_EXCEEDED,
        name: "LIMIT_EXCEEDED",
        message: "Limit exceeded",
        description: "A server limit was exceeded; data.limit names the RpcLimits field, data.value and data.max the numbers.",
    },
    ErrorCode {
        code: CANCELLED,
        name: "CANCELLED",
        message: "Cancelled",
        description: "The call or task was cancelled (ferry.cancel, ferry.task.cancel, or the connection closed).",
    },
    ErrorCode {
        code: SERVER_TIMEOUT,
        name: "SERVER_TIMEOUT",
        message: "Timeout",
        description: "The call did not finish in time on the server.",
    },
    ErrorCode {
        code: TASK_NOT_FOUND,
        name: "TASK_NOT_FOUND",
        message: "Task not found",
        description: "No task has this id: never submitted, result already fetched, or expired.",
    },
    ErrorCode {
        code: TASK_PENDING,
        name: "TASK_PENDING",
        message: "Task pending",
        description: "The task has not finished yet; ask again later or pass wait_ms.",
    },
    ErrorCode {
        code: TENSOR_ERROR,
        name: "TENSOR_ERROR",
        message: "Tensor error",
        description: "A tensor reference or inline tensor is invalid, or a tensor cannot be carried on this connection.",
    },
    ErrorCode {
        code: UNAVAILABLE,
        name: "UNAVAILABLE",
        message: "Unavailable",
        description: "The server is shutting down.",
    },
    ErrorCode {
        code: UNAUTHORIZED,
        name: "UNAUTHORIZED",
        message: "Unauthorized",
        description: "The server requires a bearer token that was not presented, or refused the request before reading it (HTTP: a browser origin not allowed, a foreign Host header, a Content-Type other than application/json).",
    },
    ErrorCode {
        code: NOT_FOUND,
        name: "NOT_FOUND",
        message: "Not found",
        description: "No such object: a tensor-store bundle, version or reference that is unknown, was freed, or belongs to another identity.",
    },
    ErrorCode {
        code: FORBIDDEN,
        name: "FORBIDDEN",
        message: "Forbidden",
        description: "The caller's identity may not change this object (a tensor-store bundle another identity published).",
    },
];

/// The table row for `code`, if it is one of ours.
pub fn lookup(code: i64) -> Option<&'static ErrorCode> {
    ERROR_CODES.iter().find(|c| c.code == code)
}

/// The `error` member of a JSON-RPC response: what a handler returns on failure and what a
/// client receives. This is the wire type; Rust-side failures of the client are
/// [`crate::CallError`].
///
/// Any `std::error::Error` converts into an `ErrorObject` with code [`SERVER_ERROR`] and
/// the error's text as message, so handlers can use `?`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ErrorObject {
    /// The error code.
    pub code: i64,
    /// A short description.
    pub message: String,
    /// Detail (structured), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl ErrorObject {
    /// An error with `code` and `message`.
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        ErrorObject { code, message: message.into(), data: None }
    }

    /// Adds structured detail.
    #[must_use]
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }

    /// -32700 Parse error, with the parser's complaint in `data`.
    pub fn parse_error(reason: impl fmt::Display) -> Self {
        Self::new(PARSE_ERROR, "Parse error").with_data(serde_json::json!({ "reason": reason.to_string() }))
    }

    /// -32600 Invalid Request, with what is wrong in `data`.
    pub fn invalid_request(reason: impl Into<String>) -> Self {
        Self::new(INVALID_REQUEST, "Invalid Request").with_data(serde_json::json!({ "reason": reason.into() }))
    }

    /// -32601 Method not found.
    pub fn method_not_found(method: &str) -> Self {
        Self::new(METHOD_NOT_FOUND, "Method not found").with_data(serde_json::json!({ "method": method }))
    }

    /// -32602 Invalid params: `path` is where in the params (e.g. `b` or `weights.w1`),
    /// `reason` what is wrong.
    pub fn invalid_params(path: impl Into<String>, reason: impl Into<String>) -> Self {
        let (path, reason) = (path.into(), reason.into());
        let message = if path.is_empty() || path == "." {
            format!("Invalid params: {reason}")
        } else {
            format!("Invalid params: {path}: {reason}")
        };
        Self::new(INVALID_PARAMS, message).with_data(serde_json::json!({ "path": path, "reason": reason }))
    }

    /// -32603 Internal error.
    pub fn internal(reason: impl fmt::Display) -> Self {
        Self::new(INTERNAL_ERROR, "Internal error").with_data(serde_json::json!({ "reason": reason.to_string() }))
    }

    /// -32001 Limit exceeded: names the [`crate::RpcLimits`] field and how to raise it.
    pub fn limit(limit: &'static str, what: &str, value: u64, max: u64) -> Self {
        Self::new(
            LIMIT_EXCEEDED,
            format!(
                "Limit exceeded: {what} is {value}, over the limit {limit} = {max}; \
                 the server can raise it with RpcLimits::{limit}"
            ),
        )
        .with_data(serde_json::json!({ "limit": limit, "value": value, "max": max }))
    }

    /// -32002 Cancelled.
    pub fn cancelled(why: &str) -> Self {
        Self::new(CANCELLED, format!("Cancelled: {why}"))
    }

    /// -32006 Tensor error.
    pub fn tensor(reason: impl fmt::Display) -> Self {
        Self::new(TENSOR_ERROR, format!("Tensor error: {reason}"))
    }

    /// The table row of this code, if it is one of ours.
    pub fn known(&self) -> Option<&'static ErrorCode> {
        lookup(self.code)
    }
}

impl fmt::Display for ErrorObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (code {}", self.message, self.code)?;
        if let Some(c) = self.known() {
            write!(f, ", {}", c.name)?;
        }
        f.write_str(")")?;
        if let Some(d) = &self.data {
            write!(f, ": {d}")?;
        }
        Ok(())
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for ErrorObject {
    fn from(e: E) -> Self {
        ErrorObject::new(SERVER_ERROR, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_consistent() {
        let mut codes: Vec<i64> = ERROR_CODES.iter().map(|c| c.code).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), ERROR_CODES.len(), "codes are unique");
        for c in ERROR_CODES {
            let standard = c.code == PARSE_ERROR || (-32603..=-32600).contains(&c.code);
            assert!(standard || (-32099..=-32000).contains(&c.code), "{} outside ferry's range", c.name);
            assert!(c.name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_'), "{}", c.name);
        }
    }

    #[test]
    fn errors_convert_and_display() {
        let e: ErrorObject = std::io::Error::other("disk on fire").into();
        assert_eq!(e.code, SERVER_ERROR);
        assert_eq!(e.message, "disk on fire");
        let l = ErrorObject::limit("max_batch", "batch size", 5, 4);
        assert!(l.to_string().contains("RpcLimits::max_batch"), "{l}");
        assert!(l.to_string().contains("LIMIT_EXCEEDED"), "{l}");
        let p = ErrorObject::invalid_params("b", "invalid type: string \"x\", expected f64");
        assert_eq!(p.message, "Invalid params: b: invalid type: string \"x\", expected f64");
    }
}
