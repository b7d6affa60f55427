//! Unit tests of the IR: lowering OpenRPC documents.

use serde_json::json;

use super::*;

fn api(doc: Value) -> Api {
    Api::from_openrpc("t", &doc).unwrap()
}

#[test]
fn names() {
    assert_eq!(pascal_case("create_tensor.opts"), "CreateTensorOpts");
    assert_eq!(pascal_case("PARSE_ERROR"), "ParseError");
    assert_eq!(pascal_case("fooBar"), "FooBar");
    assert_eq!(type_ident("Vec<u8>"), "Vec_u8_");
    assert_eq!(type_ident("1x"), "T1x");
}

#[test]
fn refuses_what_is_not_openrpc() {
    assert!(matches!(Api::from_openrpc("t", &json!([])), Err(IrError::NotOpenRpc(_))));
    assert!(matches!(Api::from_openrpc("t", &json!({"info": {}})), Err(IrError::NotOpenRpc(_))));
    assert!(matches!(Api::from_openrpc("Bad-Name", &json!({"methods": []})), Err(IrError::BadName(_))));
    let bad = json!({"methods": [{"name": "m", "params": [], "result": {"name": "r", "schema": {"$ref": "#/nope"}}}]});
    assert!(matches!(Api::from_openrpc("t", &bad), Err(IrError::BadRef { .. })));
}

#[test]
fn unions_flatten_and_absorb() {
    assert_eq!(
        union(vec![Ty::Integer, Ty::Union(vec![Ty::Null, Ty::Integer])]),
        Ty::Union(vec![Ty::Integer, Ty::Null])
    );
    assert_eq!(union(vec![Ty::Integer, Ty::Any]), Ty::Any);
    assert_eq!(union(vec![Ty::String]), Ty::String);
}

#[test]
fn reachable_types_skip_builtins() {
    let a = api(json!({
        "methods": [
            {"name": "m", "params": [], "result": {"name": "r", "schema": {"$ref": "#/components/schemas/A"}}},
            {"name": "ferry.x", "params": [], "result": {"name": "r", "schema": {"$ref": "#/components/schemas/C"}}},
        ],
        "components": {"schemas": {
            "A": {"type": "object", "properties": {"b": {"$ref": "#/components/schemas/B"}}},
            "B": {"type": "string", "enum": ["x", "y"]},
            "C": {"type": "object", "properties": {"c": {"type": "integer"}}},
            "Unused": {"type": "string"},
        }},
    }));
    assert_eq!(a.types.keys().collect::<Vec<_>>(), ["A", "B", "C"]);
    assert_eq!(a.client_types().keys().copied().collect::<Vec<_>>(), ["A", "B"]);
    assert!(a.methods["ferry.x"].builtin);
}

#[test]
fn a_method_marked_as_a_task_is_a_task() {
    let a = api(json!({"openrpc": "1.3.2", "info": {"title": "t", "version": "1"}, "methods": [
        {"name": "train", "params": [], "result": {"name": "r", "schema": {}}, "x-ferry-task": true},
        {"name": "add", "params": [], "result": {"name": "r", "schema": {}}, "x-ferry-task": false},
        {"name": "sub", "params": [], "result": {"name": "r", "schema": {}}},
    ]}));
    assert!(a.methods["train"].task);
    assert!(!a.methods["add"].task && !a.methods["sub"].task);
}
