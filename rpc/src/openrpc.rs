//! `rpc.discover`: an OpenRPC 1.3 document of the method table.
//!
//! - Schemas come from schemars with draft-07 settings and one shared generator, so named
//!   types land once in `components/schemas` and are referenced as
//!   `#/components/schemas/Name`. Integer `format`s that strict validators reject
//!   (`int64`, `uint32`, ...) are removed; bounds (`minimum`) stay.
//! - Each method's params are its params struct's fields, in declaration order (read from
//!   serde's own field list), with `paramStructure: "either"`: by name or by position.
//! - Extensions: `x-ferry-errors` (the error-code table, with names and descriptions) and
//!   `x-ferry-tensors` (how tensors are written); on a method, `x-ferry-additional-params`
//!   and, for a long-running one ([`crate::method::MethodDoc::task`]), `x-ferry-task: true`. The codes are also in
//!   `components/errors`.
//! - `rpc.discover` itself is not listed (OpenRPC's convention); ferry's built-in methods
//!   (`ferry.cancel`, `ferry.task.*`) are.

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::de::{DeserializeOwned, Deserializer, Visitor};
use serde_json::{Map, Value, json};

use crate::codes::ERROR_CODES;
use crate::dispatch::{CancelParams, CancelResult};
use crate::method::{MethodInfo, Methods};
use crate::remote::{self, TensorRef};
use crate::task::{ResultParams, SubmitParams, Submitted, TaskParams, TaskStatus};

/// The OpenRPC version written.
pub const OPENRPC_VERSION: &str = "1.3.2";

/// The `info` of the document.
#[derive(Debug, Clone)]
pub struct ApiInfo {
    /// API title.
    pub title: String,
    /// API version.
    pub version: String,
    /// Description.
    pub description: Option<String>,
}

impl Default for ApiInfo {
    fn default() -> Self {
        ApiInfo { title: "ferry JSON-RPC API".into(), version: "0.1.0".into(), description: None }
    }
}

const TENSORS: &str = "Tensors are written {\"$tensor\": i} on ferry pipes (an index into the message's tensors, \
                       which travel over the negotiated channel) and {\"$tensor\": {\"dtype\", \"shape\", \"data\"}} \
                       on plain JSON and HTTP connections (data: standard base64 of the little-endian bytes).";

/// The document for `methods`.
pub fn document(api: &ApiInfo, methods: &Methods) -> Value {
    let mut g = SchemaSettings::draft07()
        .with(|s| {
            s.definitions_path = "/components/schemas".into();
            s.meta_schema = None;
        })
        .into_generator();
    let builtins = builtin_infos();
    let mut out = Vec::new();
    for info in methods.infos().chain(builtins.iter()) {
        out.push(method(&mut g, info));
    }
    let mut schemas = g.take_definitions(true);
    // Transforms of the generator apply to the definitions above; the method-level schemas
    // are small and get the same treatment here.
    for m in &mut out {
        for s in m.pointer_mut("/params").and_then(Value::as_array_mut).into_iter().flatten() {
            if let Some(schema) = s.get_mut("schema") {
                transform(&mut g, schema);
            }
        }
        if let Some(schema) = m.pointer_mut("/result/schema") {
            transform(&mut g, schema);
        }
    }
    let errors: Map<String, Value> =
        ERROR_CODES.iter().map(|c| (c.name.to_owned(), json!({ "code": c.code, "message": c.message }))).collect();
    let mut doc = json!({
        "openrpc": OPENRPC_VERSION,
        "info": {
            "title": api.title,
            "version": api.version,
            "description": api.description.clone().unwrap_or_else(|| TENSORS.to_owned()),
        },
        "methods": out,
        "components": { "schemas": Value::Object(std::mem::take(&mut schemas)), "errors": errors },
        "x-ferry-errors": ERROR_CODES,
        "x-ferry-tensors": {
            "ref": "{\"$tensor\": i}: index into the tensors of the ferry message (pipes)",
            "inline": "{\"$tensor\": {\"dtype\": \"f32\", \"shape\": [2, 2], \"data\": \"<base64>\"}}: plain JSON and HTTP",
            "reserved": "an object whose only key is \"$tensor\" is always a tensor",
        },
    });
    strip_formats(&mut doc);
    doc
}

fn transform(g: &mut SchemaGenerator, v: &mut Value) {
    if let Ok(schema) = <&mut Schema>::try_from(v) {
        for t in g.transforms_mut() {
            t.transform(schema);
        }
    }
}

fn method(g: &mut SchemaGenerator, info: &MethodInfo) -> Value {
    let (params_schema, result_schema, names) = match &info.given {
        Some(given) => {
            // ferry's tensor schemas are defined once, by the generator, for every method.
            g.subschema_for::<crate::RpcTensor>();
            g.subschema_for::<crate::InlineTensor>();
            for (k, v) in &given.defs {
                g.definitions_mut().entry(k.clone()).or_insert_with(|| v.clone());
            }
            (given.params.clone(), given.result.clone(), Some(given.param_names.iter().map(String::as_str).collect()))
        }
        None => ((info.params)(g).to_value(), (info.result)(g).to_value(), (info.param_names)().map(<[&str]>::to_vec)),
    };
    let resolved = resolve(g, &params_schema);
    let (params, structure) = content_descriptors(&resolved, names.as_deref());
    let mut m = json!({
        "name": info.name,
        "params": params,
        "result": { "name": "result", "schema": result_schema },
        "paramStructure": structure,
    });
    if let Some(s) = &info.summary {
        m["summary"] = json!(s);
    }
    if let Some(d) = &info.description {
        m["description"] = json!(d);
    }
    if info.deprecated {
        m["deprecated"] = json!(true);
    }
    // Whether by-name params may carry other names (JSON Schema's additionalProperties of
    // the params object, which OpenRPC's list of params has no place for).
    m["x-ferry-additional-params"] = json!(info.additional_params);
    // A long-running method, to be submitted as a task (`ferry.task.submit`): generated
    // clients add submit/status/result helpers for it.
    if info.task {
        m["x-ferry-task"] = json!(true);
    }
    m
}

/// The schema `v` refers to, if it is a `$ref` into the generator's definitions.
fn resolve(g: &SchemaGenerator, v: &Value) -> Value {
    let name = v.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix("#/components/schemas/"));
    match name.and_then(|n| g.definitions().get(n)) {
        Some(def) => def.clone(),
        None => v.clone(),
    }
}

/// One content descriptor per param, and the param structure.
fn content_descriptors(schema: &Value, order: Option<&[&str]>) -> (Vec<Value>, &'static str) {
    let required: Vec<&str> =
        schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        let mut names: Vec<&str> = match order {
            Some(o) => o.iter().copied().filter(|n| props.contains_key(*n)).collect(),
            None => Vec::new(),
        };
        let by_position = !names.is_empty() || props.is_empty();
        for n in props.keys() {
            if !names.contains(&n.as_str()) {
                names.push(n);
            }
        }
        let params = names
            .iter()
            .map(|n| {
                let mut d = json!({ "name": n, "required": required.contains(n), "schema": props[*n] });
                if let Some(desc) = props[*n].get("description") {
                    d["description"] = desc.clone();
                }
                d
            })
            .collect();
        return (params, if by_position { "either" } else { "by-name" });
    }
    let items = schema.get("prefixItems").or_else(|| schema.get("items"));
    if let Some(items) = items.and_then(Value::as_array) {
        let params = items
            .iter()
            .enumerate()
            .map(|(i, s)| json!({ "name": format!("arg{i}"), "required": true, "schema": s }))
            .collect();
        return (params, "by-position");
    }
    (Vec::new(), "either")
}

/// Removes integer and float `format`s that are not JSON Schema formats.
fn strip_formats(v: &mut Value) {
    const NON_STANDARD: &[&str] =
        &["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "uint", "int", "float", "double"];
    match v {
        Value::Object(o) => {
            if o.get("format").and_then(Value::as_str).is_some_and(|f| NON_STANDARD.contains(&f)) {
                o.remove("format");
            }
            o.values_mut().for_each(strip_formats);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_formats),
        _ => {}
    }
}

/// The field names of `P` in declaration order, if it derives `Deserialize` as a struct
/// (serde hands them to `deserialize_struct`).
pub fn field_names<P: DeserializeOwned>() -> Option<&'static [&'static str]> {
    struct Probe<'a>(&'a mut Option<&'static [&'static str]>);
    impl<'de> Deserializer<'de> for Probe<'_> {
        type Error = serde::de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(serde::de::Error::custom("probe"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = Some(fields);
            Err(serde::de::Error::custom("probe"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
            unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }
    let mut fields = None;
    let _ = P::deserialize(Probe(&mut fields));
    fields
}

fn schema_of<T: JsonSchema>(g: &mut SchemaGenerator) -> Schema {
    g.subschema_for::<T>()
}

fn any_schema(_: &mut SchemaGenerator) -> Schema {
    Schema::from(true)
}

fn info(
    name: &str,
    summary: &str,
    params: crate::method::SchemaFn,
    result: crate::method::SchemaFn,
    names: fn() -> Option<&'static [&'static str]>,
) -> MethodInfo {
    MethodInfo {
        name: name.into(),
        summary: Some(summary.into()),
        description: None,
        deprecated: false,
        params,
        result,
        param_names: names,
        additional_params: false,
        given: None,
        task: false,
    }
}

/// The built-in methods' docs.
fn builtin_infos() -> Vec<MethodInfo> {
    vec![
        info(
            "ferry.cancel",
            "Cancels a running call on this connection (usually sent as a notification).",
            schema_of::<CancelParams>,
            schema_of::<CancelResult>,
            field_names::<CancelParams>,
        ),
        info(
            "ferry.task.submit",
            "Starts a method as a long-running task; returns its id.",
            schema_of::<SubmitParams>,
            schema_of::<Submitted>,
            field_names::<SubmitParams>,
        ),
        info(
            "ferry.task.status",
            "Where a task is: running, done, failed or cancelled.",
            schema_of::<TaskParams>,
            schema_of::<TaskStatus>,
            field_names::<TaskParams>,
        ),
        info(
            "ferry.task.result",
            "The task's result (or error), waiting up to wait_ms; fetched once unless kept.",
            schema_of::<ResultParams>,
            any_schema,
            field_names::<ResultParams>,
        ),
        info(
            "ferry.task.cancel",
            "Cancels a running task; returns its status.",
            schema_of::<TaskParams>,
            schema_of::<TaskStatus>,
            field_names::<TaskParams>,
        ),
        info(
            "ferry.ref.keep",
            "Keeps a tensor on the server; returns a reference to pass instead of its bytes.",
            schema_of::<remote::KeepParams>,
            schema_of::<TensorRef>,
            field_names::<remote::KeepParams>,
        ),
        info(
            "ferry.ref.fetch",
            "The tensor a reference names (zero-copy where the channel lends its memory).",
            schema_of::<remote::FetchParams>,
            schema_of::<crate::RpcTensor>,
            field_names::<remote::FetchParams>,
        ),
        info(
            "ferry.ref.free",
            "Frees the caller's references by id (unknown ids are skipped).",
            schema_of::<remote::FreeParams>,
            schema_of::<remote::Freed>,
            field_names::<remote::FreeParams>,
        ),
        info(
            "ferry.ref.publish",
            "Lets a reference outlive the connection that made it.",
            schema_of::<remote::PublishParams>,
            schema_of::<TensorRef>,
            field_names::<remote::PublishParams>,
        ),
        info(
            "ferry.ref.list",
            "The caller's references.",
            schema_of::<remote::ListRefsParams>,
            schema_of::<Vec<TensorRef>>,
            field_names::<remote::ListRefsParams>,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;
    use crate::{ErrorObject, RpcTensor, TensorMap};

    #[derive(Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Params {
        /// Second in the alphabet, first in the struct.
        zeta: u64,
        alpha: Option<String>,
        weights: TensorMap,
        x: RpcTensor,
    }

    #[test]
    fn field_order_is_declaration_order() {
        assert_eq!(field_names::<Params>(), Some(&["zeta", "alpha", "weights", "x"][..]));
        assert_eq!(field_names::<(u8, u8)>(), None);
        assert_eq!(field_names::<()>(), None);
    }

    #[test]
    fn a_method_registered_as_a_task_says_so() {
        let mut m = Methods::new();
        m.register("train", |(n,): (u32,)| async move { Ok::<_, ErrorObject>(n) }).unwrap().task();
        m.register("add", |(a, b): (u8, u8)| async move { Ok::<_, ErrorObject>(a + b) }).unwrap();
        let doc = document(&ApiInfo::default(), &m);
        let by_name = |n: &str| doc["methods"].as_array().unwrap().iter().find(|x| x["name"] == n).unwrap().clone();
        assert_eq!(by_name("train")["x-ferry-task"], true);
        assert!(by_name("add").get("x-ferry-task").is_none());
        assert!(by_name("ferry.task.submit").get("x-ferry-task").is_none());
    }

    #[test]
    fn document_shape() {
        let mut m = Methods::new();
        m.register("f", |_: Params| async { Ok::<_, ErrorObject>(1u32) }).unwrap().summary("does f");
        m.register("pair", |(a, b): (u8, u8)| async move { Ok::<_, ErrorObject>(a + b) }).unwrap();
        let doc = document(&ApiInfo::default(), &m);
        assert_eq!(doc["openrpc"], OPENRPC_VERSION);
        let f = &doc["methods"][0];
        assert_eq!(f["name"], "f");
        assert_eq!(f["summary"], "does f");
        assert_eq!(f["paramStructure"], "either");
        let names: Vec<&str> = f["params"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["zeta", "alpha", "weights", "x"]);
        assert_eq!(f["params"][0]["required"], true);
        assert_eq!(f["params"][1]["required"], false);
        assert_eq!(f["params"][0]["description"], "Second in the alphabet, first in the struct.");
        assert_eq!(f["params"][3]["schema"]["$ref"], "#/components/schemas/Tensor");
        assert!(f.get("x-ferry-task").is_none(), "{f}");
        let pair = &doc["methods"][1];
        assert_eq!(pair["paramStructure"], "by-position");
        assert_eq!(pair["params"].as_array().unwrap().len(), 2);
        let tensor = &doc["components"]["schemas"]["Tensor"];
        assert_eq!(tensor["required"], json!(["$tensor"]));
        assert!(doc["components"]["schemas"]["InlineTensor"].is_object());
        assert!(!doc.to_string().contains("\"format\":\"uint64\""));
        assert!(!doc.to_string().contains("$defs"));
        assert_eq!(doc["x-ferry-errors"][0]["code"], -32700);
        assert!(doc["methods"].as_array().unwrap().iter().any(|m| m["name"] == "ferry.task.submit"));
    }
}
