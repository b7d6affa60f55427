//! Unit tests of the Python emitter's helpers.

use super::layout::split_call;
use super::*;

#[test]
fn literals() {
    assert_eq!(py_str("a\"b\\c\n"), "\"a\\\"b\\\\c\\n\"");
    assert_eq!(py_value(&serde_json::json!(true)), "True");
    assert_eq!(py_value(&serde_json::json!(null)), "None");
    assert_eq!(doc_text("say \"hi\""), "say \"hi\\\"");
    assert_eq!(doc_text("a \"\"\" b"), "a \\\"\\\"\\\" b");
}

#[test]
fn splits_calls_at_top_level_commas() {
    let (head, args, close) = split_call("t.Object({\"a\": t.ListOf(x), \"b,\": y}, {}, None)").unwrap();
    assert_eq!(head, "t.Object(");
    assert_eq!(args, ["{\"a\": t.ListOf(x), \"b,\": y}", "{}", "None"]);
    assert_eq!(close, ")");
    assert!(split_call("plain").is_none());
}
