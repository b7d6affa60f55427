//! JSON-RPC 2.0 objects, sans-IO: classify what a peer sent ([`classify`]), build
//! responses ([`success`], [`failure`]) and read them back ([`parse_response`]).
//!
//! Nothing here does IO or reads the clock; the server and client feed it values. Rules
//! followed to the letter (<https://www.jsonrpc.org/specification>):
//! - A request is an object with `"jsonrpc": "2.0"`, a string `method`, optional
//!   `params` (array or object) and an optional `id` (string, number or null). Without an
//!   `id` member it is a notification and gets no response; `"id": null` is a call.
//! - A batch is a non-empty array; an empty one is a single Invalid Request. Each element
//!   is classified on its own; a batch of notifications only gets no response at all.
//! - Where an invalid request's id cannot be determined, the error's id is null.
//! - A request object with a duplicate member (at any depth) is invalid; ids are echoed
//!   byte for byte (any JSON number). Both need the request's text, so they hold on plain
//!   JSON and HTTP connections, which parse it here; on ferry pipes the header arrives
//!   parsed by ferry-core, whose SDK clients send integer ids.

use serde_json::{Map, Value};

use crate::codes::ErrorObject;

/// The protocol version string.
pub const VERSION: &str = "2.0";

/// One request (or one element of a batch), classified.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    /// A call: it gets a response with this id.
    Call {
        /// The id, echoed unchanged (string, number or null).
        id: Value,
        /// The method name.
        method: String,
        /// The params (array, object, or absent).
        params: Option<Value>,
    },
    /// A notification: no response, whatever happens.
    Notification {
        /// The method name.
        method: String,
        /// The params.
        params: Option<Value>,
    },
    /// Not a valid request: answer `error` with `id` (null when it could not be read).
    Invalid {
        /// The id to answer with.
        id: Value,
        /// What is wrong (code -32600).
        error: ErrorObject,
    },
}

impl Entry {
    /// The method, for calls and notifications.
    pub fn method(&self) -> Option<&str> {
        match self {
            Entry::Call { method, .. } | Entry::Notification { method, .. } => Some(method),
            Entry::Invalid { .. } => None,
        }
    }
}

/// What one incoming JSON value is.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// A single request.
    Single(Entry),
    /// A batch (non-empty), in order.
    Batch(Vec<Entry>),
}

/// Classifies one incoming JSON value (a request or a batch). `Err` is a batch over
/// `max_batch` elements: answer it with that single error (id null).
pub fn classify(v: Value, max_batch: usize) -> Result<Incoming, ErrorObject> {
    match v {
        Value::Array(items) if items.is_empty() => {
            Ok(Incoming::Single(Entry::Invalid { id: Value::Null, error: ErrorObject::invalid_request("empty batch") }))
        }
        Value::Array(items) if items.len() > max_batch => {
            Err(ErrorObject::limit("max_batch", "requests in the batch", items.len() as u64, max_batch as u64))
        }
        Value::Array(items) => Ok(Incoming::Batch(items.into_iter().map(entry).collect())),
        other => Ok(Incoming::Single(entry(other))),
    }
}

/// Classifies one request object.
pub fn entry(v: Value) -> Entry {
    let Value::Object(mut o) = v else {
        return invalid(Value::Null, "a request must be an object");
    };
    // The id first, so that other problems can be reported against it.
    let id = match o.remove("id") {
        None => None,
        Some(id @ (Value::String(_) | Value::Number(_) | Value::Null)) => Some(id),
        Some(_) => return invalid(Value::Null, "id must be a string, a number or null"),
    };
    let reply_id = id.clone().unwrap_or(Value::Null);
    if let Some(Value::String(name)) = o.remove(crate::strict::DUPLICATE) {
        return invalid(reply_id, &format!("member {name:?} appears more than once"));
    }
    match o.get("jsonrpc") {
        Some(Value::String(s)) if s == VERSION => {}
        Some(_) => return invalid(reply_id, "jsonrpc must be exactly \"2.0\""),
        None => return invalid(reply_id, "missing member jsonrpc (must be \"2.0\")"),
    }
    let method = match o.remove("method") {
        Some(Value::String(m)) => m,
        Some(_) => return invalid(reply_id, "method must be a string"),
        None => return invalid(reply_id, "missing member method"),
    };
    let params = match o.remove("params") {
        None => None,
        Some(p @ (Value::Array(_) | Value::Object(_))) => Some(p),
        Some(_) => return invalid(reply_id, "params must be an array or an object"),
    };
    match id {
        Some(id) => Entry::Call { id, method, params },
        None => Entry::Notification { method, params },
    }
}

fn invalid(id: Value, reason: &str) -> Entry {
    Entry::Invalid { id, error: ErrorObject::invalid_request(reason) }
}

/// A success response.
pub fn success(id: Value, result: Value) -> Value {
    let mut m = Map::new();
    m.insert("jsonrpc".into(), Value::from(VERSION));
    m.insert("result".into(), result);
    m.insert("id".into(), id);
    Value::Object(m)
}

/// An error response.
pub fn failure(id: Value, error: ErrorObject) -> Value {
    let mut m = Map::new();
    m.insert("jsonrpc".into(), Value::from(VERSION));
    m.insert("error".into(), serde_json::to_value(error).unwrap_or(Value::Null));
    m.insert("id".into(), id);
    Value::Object(m)
}

/// A request (`id: Some`) or notification (`id: None`).
pub fn request(id: Option<Value>, method: &str, params: Option<Value>) -> Value {
    let mut m = Map::new();
    m.insert("jsonrpc".into(), Value::from(VERSION));
    m.insert("method".into(), Value::from(method));
    if let Some(p) = params {
        m.insert("params".into(), p);
    }
    if let Some(id) = id {
        m.insert("id".into(), id);
    }
    Value::Object(m)
}

/// One response, read back by a client.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    /// The id it answers (null for errors about unreadable requests).
    pub id: Value,
    /// The result, or the error.
    pub outcome: Result<Value, ErrorObject>,
}

/// Reads a response object. `Err` says why it is not one.
pub fn parse_response(v: Value) -> Result<Response, String> {
    let Value::Object(mut o) = v else {
        return Err("a response must be an object".into());
    };
    if o.get("jsonrpc").and_then(Value::as_str) != Some(VERSION) {
        return Err("response lacks \"jsonrpc\": \"2.0\"".into());
    }
    let id = o.remove("id").ok_or("response has no id")?;
    let outcome = match (o.remove("result"), o.remove("error")) {
        (Some(r), None) => Ok(r),
        (None, Some(e)) => Err(serde_json::from_value::<ErrorObject>(e).map_err(|e| format!("bad error object: {e}"))?),
        _ => return Err("a response has exactly one of result and error".into()),
    };
    Ok(Response { id, outcome })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::codes::INVALID_REQUEST;

    fn one(v: Value) -> Entry {
        match classify(v, 10).unwrap() {
            Incoming::Single(e) => e,
            b => panic!("not single: {b:?}"),
        }
    }

    fn invalid_id(e: &Entry) -> Option<&Value> {
        match e {
            Entry::Invalid { id, error } => {
                assert_eq!(error.code, INVALID_REQUEST);
                Some(id)
            }
            _ => None,
        }
    }

    #[test]
    fn ids_of_every_allowed_type() {
        for id in [json!(1), json!(-7), json!(1.5), json!(1e300), json!(u64::MAX), json!("abc"), json!(""), json!(null)]
        {
            let e = one(json!({"jsonrpc": "2.0", "method": "m", "id": id.clone()}));
            assert_eq!(e, Entry::Call { id, method: "m".into(), params: None });
        }
        for bad in [json!(true), json!([1]), json!({"a": 1})] {
            assert_eq!(invalid_id(&one(json!({"jsonrpc": "2.0", "method": "m", "id": bad}))), Some(&Value::Null));
        }
    }

    #[test]
    fn notifications_and_params() {
        assert_eq!(
            one(json!({"jsonrpc": "2.0", "method": "n", "params": [1]})),
            Entry::Notification { method: "n".into(), params: Some(json!([1])) }
        );
        for bad in [json!("bar"), json!(3), json!(null), json!(true)] {
            let e = one(json!({"jsonrpc": "2.0", "method": "m", "params": bad, "id": 4}));
            assert_eq!(invalid_id(&e), Some(&json!(4)));
        }
    }

    #[test]
    fn invalid_requests() {
        for bad in [
            json!({"jsonrpc": "2.0", "method": 1, "params": "bar"}),
            json!({"jsonrpc": "1.0", "method": "m", "id": 1}),
            json!({"jsonrpc": 2.0, "method": "m", "id": 1}),
            json!({"method": "m", "id": 1}),
            json!({"jsonrpc": "2.0", "id": 1}),
            json!(1),
            json!("x"),
            json!(null),
        ] {
            assert!(invalid_id(&one(bad.clone())).is_some(), "{bad}");
        }
        assert_eq!(invalid_id(&one(json!({"jsonrpc": "2.0", "method": 5, "id": "x"}))), Some(&json!("x")));
    }

    #[test]
    fn batches() {
        assert!(matches!(classify(json!([]), 10).unwrap(), Incoming::Single(Entry::Invalid { .. })));
        match classify(json!([1, {"jsonrpc": "2.0", "method": "a"}, {"jsonrpc": "2.0", "method": "b", "id": 2}]), 10)
            .unwrap()
        {
            Incoming::Batch(v) => {
                assert!(matches!(v[0], Entry::Invalid { .. }));
                assert!(matches!(v[1], Entry::Notification { .. }));
                assert!(matches!(v[2], Entry::Call { .. }));
            }
            s => panic!("{s:?}"),
        }
        let e = classify(json!([1, 2, 3]), 2).unwrap_err();
        assert_eq!(e.code, crate::codes::LIMIT_EXCEEDED);
        assert!(e.message.contains("max_batch"), "{}", e.message);
    }

    #[test]
    fn responses_round_trip() {
        let r = parse_response(success(json!("a"), json!(3))).unwrap();
        assert_eq!(r, Response { id: json!("a"), outcome: Ok(json!(3)) });
        let r = parse_response(failure(json!(1), ErrorObject::method_not_found("x"))).unwrap();
        assert_eq!(r.outcome.unwrap_err().code, crate::codes::METHOD_NOT_FOUND);
        assert!(parse_response(json!({"jsonrpc": "2.0", "id": 1})).is_err());
        assert!(parse_response(json!({"jsonrpc": "2.0", "id": 1, "result": 1, "error": {}})).is_err());
        assert_eq!(request(None, "m", None), json!({"jsonrpc": "2.0", "method": "m"}));
    }
}
