//! A param's documentation from its schema: what a generated client's `Args:` (Python) or
//! `@param` (TypeScript) says about it beyond its name and type.

use serde_json::{Map, Value};

/// A param's documentation: `own` (its content descriptor's description or summary), else
/// its schema's description (a named type's, through `$ref` or a one-item `allOf`), else
/// the schema's title; then what the schema allows (bounds, lengths, a pattern, a format,
/// enumerated values), so that a param the server documented only in its schema is
/// documented in the client too. `None`: the schema says nothing more than its type.
pub fn param_doc(own: Option<&str>, schema: &Value, schemas: &Map<String, Value>) -> Option<String> {
    let text = own
        .map(str::to_owned)
        .or_else(|| text_of(schema, schemas, "description"))
        .or_else(|| text_of(schema, schemas, "title"));
    let rules = constraints(schema);
    match (text, rules.is_empty()) {
        (Some(t), true) => Some(t),
        (Some(t), false) => {
            let t = t.trim_end();
            let (body, dot) = t.strip_suffix('.').map_or((t, ""), |b| (b, "."));
            Some(format!("{body} ({}){dot}", rules.join(", ")))
        }
        (None, false) => {
            let mut s = rules.join(", ");
            if let Some(first) = s.get(..1) {
                s.replace_range(..1, &first.to_uppercase());
            }
            Some(format!("{s}."))
        }
        (None, true) => None,
    }
}

/// The schema's `key` (`description`, `title`), or that of the named type it refers to.
fn text_of(schema: &Value, schemas: &Map<String, Value>, key: &str) -> Option<String> {
    if let Some(t) = schema.get(key).and_then(Value::as_str).filter(|t| !t.trim().is_empty()) {
        return Some(t.trim().to_owned());
    }
    let target = schema.get("$ref").or_else(|| {
        schema.get("allOf").and_then(Value::as_array).filter(|a| a.len() == 1).and_then(|a| a[0].get("$ref"))
    })?;
    let key_name = target.as_str()?.strip_prefix("#/components/schemas/")?;
    schemas
        .get(key_name)?
        .get(key)
        .and_then(Value::as_str)
        .filter(|t| !t.trim().is_empty())
        .map(|t| t.trim().to_owned())
}

/// Integer and float formats every JSON Schema generator adds: they say no more than the
/// type does.
const PLAIN_FORMATS: &[&str] =
    &["int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64", "float", "double"];

/// What `schema` allows beyond its type, in words.
fn constraints(schema: &Value) -> Vec<String> {
    let num = |k: &str| schema.get(k).filter(|v| v.is_number()).map(Value::to_string);
    let mut out = Vec::new();
    if let Some(v) = num("minimum") {
        out.push(format!("at least {v}"));
    }
    if let Some(v) = num("exclusiveMinimum") {
        out.push(format!("over {v}"));
    }
    if let Some(v) = num("maximum") {
        out.push(format!("at most {v}"));
    }
    if let Some(v) = num("exclusiveMaximum") {
        out.push(format!("under {v}"));
    }
    if let Some(v) = num("multipleOf") {
        out.push(format!("a multiple of {v}"));
    }
    for (k, what) in [("minLength", "characters"), ("minItems", "items"), ("minProperties", "entries")] {
        if let Some(v) = num(k) {
            out.push(format!("at least {v} {what}"));
        }
    }
    for (k, what) in [("maxLength", "characters"), ("maxItems", "items"), ("maxProperties", "entries")] {
        if let Some(v) = num(k) {
            out.push(format!("at most {v} {what}"));
        }
    }
    if let Some(p) = schema.get("pattern").and_then(Value::as_str) {
        out.push(format!("matching `{p}`"));
    }
    if let Some(f) = schema.get("format").and_then(Value::as_str).filter(|f| !PLAIN_FORMATS.contains(f)) {
        out.push(format!("format `{f}`"));
    }
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        let shown: Vec<String> = values.iter().map(|v| format!("`{v}`")).collect();
        out.push(format!("one of {}", shown.join(", ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_param_is_documented_from_its_schema() {
        let schemas = json!({"Shape": {"description": "Sizes of each dimension.", "type": "array"}});
        let schemas = schemas.as_object().unwrap();
        // The descriptor's own text wins; the schema's rules are added.
        let s = json!({"type": "integer", "format": "uint32", "minimum": 0, "maximum": 10, "description": "ignored"});
        assert_eq!(param_doc(Some("How many."), &s, schemas).as_deref(), Some("How many (at least 0, at most 10)."));
        // No descriptor text: the schema's description, a named type's, or its title.
        assert_eq!(param_doc(None, &s, schemas).as_deref(), Some("ignored (at least 0, at most 10)"));
        let r = json!({"$ref": "#/components/schemas/Shape"});
        assert_eq!(param_doc(None, &r, schemas).as_deref(), Some("Sizes of each dimension."));
        let all = json!({"allOf": [{"$ref": "#/components/schemas/Shape"}], "maxItems": 64});
        assert_eq!(param_doc(None, &all, schemas).as_deref(), Some("Sizes of each dimension (at most 64 items)."));
        let t = json!({"title": "Name", "type": "string", "minLength": 1, "pattern": "^[a-z]+$", "format": "hostname"});
        assert_eq!(
            param_doc(None, &t, schemas).as_deref(),
            Some("Name (at least 1 characters, matching `^[a-z]+$`, format `hostname`)")
        );
        // Rules alone make a sentence; a bare type says nothing more.
        let e = json!({"enum": ["f32", "u8"]});
        assert_eq!(param_doc(None, &e, schemas).as_deref(), Some("One of `\"f32\"`, `\"u8\"`."));
        assert_eq!(param_doc(None, &json!({"type": "number", "format": "double"}), schemas), None);
    }
}
