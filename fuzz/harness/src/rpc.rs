//! Target `rpc_request`: a plain JSON-RPC text through the server's own request path (the
//! shape check on the bytes, the strict parse, then `classify`), plus the shape check
//! alone against what the parser makes of the text.

use ferry_core::json_shape::{self, MAX_DEPTH};
use ferry_rpc::RpcLimits;
use ferry_rpc::fuzzing::{parse_request, strict_parse, write_response};
use ferry_rpc::jsonrpc::{self, Entry, Incoming};
use serde_json::Value;

/// Small limits, so that the fuzzer reaches them.
const SMALL_BATCH: usize = 3;
const SMALL_VALUES: usize = 24;

/// Runs `data` through the server's request path under the default limits and small ones.
///
/// Asserts: a text the shape check passes is never refused by `classify` for its batch
/// length (the two agree); a text the shape check passes, once parsed, is within the
/// counted bounds (batch length, values, depth); an id a call is answered with writes out
/// as JSON that reads back to the same id.
pub fn rpc_request(data: &[u8]) {
    for limits in [RpcLimits::default(), RpcLimits::default().max_batch(SMALL_BATCH).max_request_values(SMALL_VALUES)] {
        let Ok(v) = parse_request(data, &limits) else { continue };
        let entries = match jsonrpc::classify(v, limits.max_batch) {
            Ok(Incoming::Single(e)) => vec![e],
            Ok(Incoming::Batch(es)) => {
                assert!(es.len() <= limits.max_batch, "a batch over max_batch was classified");
                es
            }
            Err(e) => panic!("the shape check passed a batch that classify refuses: {e:?}"),
        };
        for e in entries {
            answer(e);
        }
    }
    // The shape check against the parser's own view of the text.
    if json_shape::check(data, SMALL_BATCH, SMALL_VALUES).is_ok()
        && let Ok(v) = serde_json::from_slice::<Value>(data)
    {
        if let Value::Array(a) = &v {
            assert!(a.len() <= SMALL_BATCH, "shape check passed a top-level array of {}", a.len());
        }
        let (values, depth) = measure(&v);
        assert!(values <= SMALL_VALUES, "shape check passed {values} values");
        assert!(depth <= MAX_DEPTH, "shape check passed depth {depth}");
    }
}

/// Writes the answer the server would write for `e` and reads it back.
fn answer(e: Entry) {
    let Entry::Call { id, method, .. } = e else { return };
    let _ = method.len();
    let out = write_response(&jsonrpc::success(id.clone(), Value::Null));
    let back: Value = match serde_json::from_slice(&out) {
        Ok(v) => v,
        Err(err) => panic!("a response is not JSON ({err}): {}", String::from_utf8_lossy(&out)),
    };
    assert!(back.get("id").is_some(), "a response without an id");
    let again = strict_parse(&out).expect("a response reads back strictly");
    assert_eq!(again.get("id"), Some(&id), "the id changed on its way out");
}

/// Values (member names and containers included, as the shape check counts them) and depth.
fn measure(v: &Value) -> (usize, usize) {
    match v {
        Value::Array(a) => a.iter().map(measure).fold((1, 1), |(n, d), (n2, d2)| (n + n2, d.max(d2 + 1))),
        Value::Object(o) => o.values().map(measure).fold((1, 1), |(n, d), (n2, d2)| (n + 1 + n2, d.max(d2 + 1))),
        _ => (1, 0),
    }
}
