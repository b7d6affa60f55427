//! The intermediate representation: an [`Api`] (methods, named types, errors) read from an
//! OpenRPC document ([`Api::from_openrpc`]).
//!
//! - Schemas are lowered to [`Ty`]: primitives, arrays, tuples, maps, unions, literals, the
//!   tensor ([`Ty::Tensor`]) and references to named types ([`Ty::Named`]).
//! - A `$ref` into `#/components/schemas` becomes a named type, lowered once; any other
//!   `$ref` (e.g. `#/components/contentDescriptors/..`) is resolved and inlined. A schema
//!   shaped like ferry's tensor (an object whose only, required property is `$tensor`) is
//!   a tensor wherever it appears, named or not.
//! - Inline objects with properties are hoisted into named types (`<Method><Param>`, made
//!   unique), so every object type has a name in every language.
//! - Everything is ordered: methods and types by name ([`BTreeMap`]), object fields by
//!   name, params in the document's order, errors in the table's order. The same document
//!   always gives the same IR, and so the same generated files.
//! - What the generator does not understand becomes [`Ty::Any`] with a note in
//!   [`Api::warnings`]; only a document without the basic OpenRPC shape is an error.

mod doc;
use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

/// Why a document cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IrError {
    /// The document lacks something every OpenRPC document has.
    #[error("not an OpenRPC document: {0}")]
    NotOpenRpc(String),
    /// A `$ref` points nowhere.
    #[error("unresolvable $ref {reference:?} (in {at})")]
    BadRef {
        /// The reference.
        reference: String,
        /// Where it was found.
        at: String,
    },
    /// The API name given to [`Api::from_openrpc`] is not a valid module name.
    #[error("API name {0:?} must be lowercase ASCII letters, digits and underscores, starting with a letter")]
    BadName(String),
}

/// One API: what a generated client module covers.
#[derive(Debug, Clone, PartialEq)]
pub struct Api {
    /// Module name (`demo`, `conformance`): lowercase, a valid identifier everywhere.
    pub name: String,
    /// `info.title`.
    pub title: String,
    /// `info.version`.
    pub version: String,
    /// `info.description`.
    pub description: Option<String>,
    /// Every method of the document, by name (ferry's built-ins included, marked).
    pub methods: BTreeMap<String, Method>,
    /// Every named type reachable from a method, by name (an identifier in every target
    /// language).
    pub types: BTreeMap<String, TypeDef>,
    /// The error-code table (`x-ferry-errors`, else `components/errors`).
    pub errors: Vec<ErrorDef>,
    /// What was not understood (and became [`Ty::Any`]).
    pub warnings: Vec<String>,
    /// The command that makes the client, named in its first line ([`crate::preamble`]).
    pub generated_by: String,
}

/// One method.
#[derive(Debug, Clone, PartialEq)]
pub struct Method {
    /// The wire name (`create_tensor`, `ferry.task.submit`).
    pub name: String,
    /// One line.
    pub summary: Option<String>,
    /// More text.
    pub description: Option<String>,
    /// Marked deprecated.
    pub deprecated: bool,
    /// Params in the document's order.
    pub params: Vec<Param>,
    /// How params may be sent.
    pub param_structure: ParamStructure,
    /// The result.
    pub result: Ty,
    /// The result's description.
    pub result_description: Option<String>,
    /// A built-in of ferry's runtime (`rpc.*`, `ferry.*`): clients provide these themselves.
    pub builtin: bool,
    /// A long-running method, to be started as a task (`x-ferry-task: true`): clients get
    /// submit, status and result helpers for it beside the call.
    pub task: bool,
}

/// OpenRPC `paramStructure`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamStructure {
    /// An object by name.
    ByName,
    /// An array in order.
    ByPosition,
    /// Either (clients send by name).
    Either,
}

/// One param (an OpenRPC content descriptor).
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    /// The wire name.
    pub name: String,
    /// Its description.
    pub description: Option<String>,
    /// Must be given.
    pub required: bool,
    /// Its type.
    pub ty: Ty,
    /// The schema's `default`, if any (the server applies it).
    pub default: Option<Value>,
}

/// A type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ty {
    /// Anything (`true`, `{}`, or not understood).
    Any,
    /// `null`.
    Null,
    /// A boolean.
    Bool,
    /// An integer.
    Integer,
    /// Any number.
    Number,
    /// A string.
    String,
    /// A tensor (`{"$tensor": ..}` on the wire).
    Tensor,
    /// A remote tensor reference (`{"$tensor_ref": {..}}`, PROTOCOL.md §21).
    TensorRef,
    /// An array of one type.
    Array(Box<Ty>),
    /// A fixed-length array (`prefixItems`, or `items` given as an array).
    Tuple(Vec<Ty>),
    /// An object with arbitrary keys and values of one type (a tensor map is
    /// `Map(Tensor)`).
    Map(Box<Ty>),
    /// One of these JSON values (strings, numbers, booleans).
    Literal(Vec<Value>),
    /// One of several types (`Option<T>` is `Union([T, Null])`); flattened, deduplicated.
    Union(Vec<Ty>),
    /// A named type of [`Api::types`].
    Named(String),
}

impl Ty {
    /// Every named type this type mentions directly.
    pub fn names(&self, out: &mut BTreeSet<String>) {
        match self {
            Ty::Array(t) | Ty::Map(t) => t.names(out),
            Ty::Tuple(ts) | Ty::Union(ts) => ts.iter().for_each(|t| t.names(out)),
            Ty::Named(n) => {
                out.insert(n.clone());
            }
            _ => {}
        }
    }

    /// Whether `null` is a value of this type (at the top level).
    pub fn is_nullable(&self) -> bool {
        match self {
            Ty::Null | Ty::Any => true,
            Ty::Union(ts) => ts.iter().any(Ty::is_nullable),
            Ty::Literal(vs) => vs.iter().any(Value::is_null),
            _ => false,
        }
    }
}

/// A named type.
#[derive(Debug, Clone, PartialEq)]
pub enum TypeDef {
    /// An object with known fields.
    Object {
        /// Its description.
        description: Option<String>,
        /// Fields, by name.
        fields: Vec<Field>,
        /// The type of further keys, if the schema allows them with a schema.
        additional: Option<Ty>,
    },
    /// One of a fixed set of values (`oneOf` consts, `enum`).
    Enum {
        /// Its description.
        description: Option<String>,
        /// The values, in the document's order.
        values: Vec<EnumValue>,
    },
    /// Another name for a type.
    Alias {
        /// Its description.
        description: Option<String>,
        /// The type.
        ty: Ty,
    },
}

impl TypeDef {
    /// The type's description.
    pub fn description(&self) -> Option<&str> {
        match self {
            TypeDef::Object { description, .. }
            | TypeDef::Enum { description, .. }
            | TypeDef::Alias { description, .. } => description.as_deref(),
        }
    }
}

/// One field of an object type.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    /// The wire name.
    pub name: String,
    /// Its description.
    pub description: Option<String>,
    /// Always present.
    pub required: bool,
    /// Its type.
    pub ty: Ty,
}

/// One value of an enum.
#[derive(Debug, Clone, PartialEq)]
pub struct EnumValue {
    /// The JSON value (a string, number or boolean).
    pub value: Value,
    /// Its description.
    pub description: Option<String>,
}

/// One row of the error-code table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorDef {
    /// The JSON-RPC error code.
    pub code: i64,
    /// Stable `SCREAMING_SNAKE_CASE` name.
    pub name: String,
    /// The default message.
    pub message: String,
    /// When it is used.
    pub description: Option<String>,
}

/// The deepest schema nesting lowered (deeper becomes [`Ty::Any`]); also bounds `$ref`
/// chains that are not named types.
const MAX_DEPTH: usize = 64;

impl Api {
    /// Reads `doc` (an OpenRPC 1.x document) as the API `name`.
    pub fn from_openrpc(name: &str, doc: &Value) -> Result<Api, IrError> {
        let valid = name.starts_with(|c: char| c.is_ascii_lowercase())
            && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !valid {
            return Err(IrError::BadName(name.to_owned()));
        }
        let root = doc.as_object().ok_or_else(|| IrError::NotOpenRpc("the document is not a JSON object".into()))?;
        let info = root.get("info").and_then(Value::as_object);
        let text = |k: &str| info.and_then(|i| i.get(k)).and_then(Value::as_str).map(str::to_owned);
        let methods_json = root
            .get("methods")
            .and_then(Value::as_array)
            .ok_or_else(|| IrError::NotOpenRpc("no `methods` array".into()))?;
        let empty = Map::new();
        let schemas = doc.pointer("/components/schemas").and_then(Value::as_object).unwrap_or(&empty);
        let mut lower = Lower::new(doc, schemas);

        let mut methods = BTreeMap::new();
        for (i, m) in methods_json.iter().enumerate() {
            let m = lower.deref(m, &format!("methods[{i}]"), 0)?;
            let method = lower.method(m, i)?;
            if methods.contains_key(&method.name) {
                lower.warnings.push(format!("method {:?} is listed twice; the first is used", method.name));
                continue;
            }
            methods.insert(method.name.clone(), method);
        }
        lower.finish_types()?;
        let errors = errors(doc);
        Ok(Api {
            name: name.to_owned(),
            title: text("title").unwrap_or_else(|| name.to_owned()),
            version: text("version").unwrap_or_default(),
            description: text("description"),
            methods,
            types: lower.types,
            errors,
            warnings: lower.warnings,
            generated_by: crate::DEFAULT_GENERATED_BY.to_owned(),
        })
    }

    /// The methods a generated client has: all but ferry's built-ins (the runtime has
    /// those), by name.
    pub fn client_methods(&self) -> impl Iterator<Item = &Method> {
        self.methods.values().filter(|m| !m.builtin)
    }

    /// The named types reachable from [`Api::client_methods`], by name.
    pub fn client_types(&self) -> BTreeMap<&str, &TypeDef> {
        let mut todo = BTreeSet::new();
        for m in self.client_methods() {
            m.params.iter().for_each(|p| p.ty.names(&mut todo));
            m.result.names(&mut todo);
        }
        let mut out = BTreeMap::new();
        while let Some(name) = todo.pop_first() {
            let Some((key, def)) = self.types.get_key_value(&name) else { continue };
            if out.insert(key.as_str(), def).is_some() {
                continue;
            }
            let mut more = BTreeSet::new();
            match def {
                TypeDef::Object { fields, additional, .. } => {
                    fields.iter().for_each(|f| f.ty.names(&mut more));
                    if let Some(a) = additional {
                        a.names(&mut more);
                    }
                }
                TypeDef::Alias { ty, .. } => ty.names(&mut more),
                TypeDef::Enum { .. } => {}
            }
            todo.extend(more.into_iter().filter(|n| !out.contains_key(n.as_str())));
        }
        out
    }
}

/// The error table: `x-ferry-errors` (in its order), else `components/errors` (by name).
fn errors(doc: &Value) -> Vec<ErrorDef> {
    let row = |name: &str, v: &Value| -> Option<ErrorDef> {
        Some(ErrorDef {
            code: v.get("code")?.as_i64()?,
            name: v.get("name").and_then(Value::as_str).unwrap_or(name).to_owned(),
            message: v.get("message").and_then(Value::as_str).unwrap_or_default().to_owned(),
            description: v.get("description").and_then(Value::as_str).map(str::to_owned),
        })
    };
    let mut out: Vec<ErrorDef> = match doc.get("x-ferry-errors").and_then(Value::as_array) {
        Some(rows) => rows.iter().filter_map(|r| row("", r)).collect(),
        None => doc
            .pointer("/components/errors")
            .and_then(Value::as_object)
            .map(|m| m.iter().filter_map(|(k, v)| row(k, v)).collect())
            .unwrap_or_default(),
    };
    // Names must be usable as identifiers and unique; codes unique.
    let mut names = BTreeSet::new();
    let mut codes = BTreeSet::new();
    out.retain(|e| {
        let ok = !e.name.is_empty()
            && e.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && e.name.starts_with(|c: char| c.is_ascii_alphabetic());
        ok && names.insert(e.name.clone()) && codes.insert(e.code)
    });
    out
}

/// Whether `o` is ferry's tensor schema: an object whose only property, required, is
/// `$tensor`.
fn is_tensor_schema(o: &Map<String, Value>) -> bool {
    let props = o.get("properties").and_then(Value::as_object);
    let required = o.get("required").and_then(Value::as_array);
    matches!((props, required), (Some(p), Some(r))
        if p.len() == 1 && p.contains_key("$tensor") && r.iter().any(|x| x == "$tensor"))
}

/// Whether `o` is ferry's remote tensor reference schema: an object whose only property,
/// required, is `$tensor_ref`.
fn is_tensor_ref_schema(o: &Map<String, Value>) -> bool {
    let props = o.get("properties").and_then(Value::as_object);
    let required = o.get("required").and_then(Value::as_array);
    matches!((props, required), (Some(p), Some(r))
        if p.len() == 1 && p.contains_key("$tensor_ref") && r.iter().any(|x| x == "$tensor_ref"))
}

/// A name usable as a type identifier: ASCII letters, digits and `_`, starting with a
/// letter.
pub fn type_ident(raw: &str) -> String {
    let mut s: String = raw.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    if !s.starts_with(|c: char| c.is_ascii_alphabetic()) {
        s.insert(0, 'T');
    }
    s
}

/// `create_tensor.opts` -> `CreateTensorOpts`.
pub fn pascal_case(raw: &str) -> String {
    let mut out = String::new();
    for word in raw.split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| !w.is_empty()) {
        let mut chars = word.chars();
        if let Some(first) = chars.next() {
            out.push(first.to_ascii_uppercase());
            let rest: String = chars.collect();
            // SCREAMING words become Capitalized; camelCase words keep their humps.
            if word.chars().all(|c| !c.is_ascii_lowercase()) {
                out.push_str(&rest.to_ascii_lowercase());
            } else {
                out.push_str(&rest);
            }
        }
    }
    out
}

/// Lowering state: named types done and to do, hoisted names, warnings.
struct Lower<'a> {
    doc: &'a Value,
    schemas: &'a Map<String, Value>,
    /// Lowered named types, by identifier.
    types: BTreeMap<String, TypeDef>,
    /// Component key -> identifier (assigned on first reference).
    idents: BTreeMap<String, String>,
    /// Identifiers taken (components and hoisted objects).
    taken: BTreeSet<String>,
    /// Component keys referenced but not lowered yet.
    todo: BTreeSet<String>,
    warnings: Vec<String>,
}

impl<'a> Lower<'a> {
    fn new(doc: &'a Value, schemas: &'a Map<String, Value>) -> Self {
        // Identifiers of components are fixed up front (in key order), so they never
        // depend on the order of references.
        let mut idents = BTreeMap::new();
        let mut taken = BTreeSet::new();
        for key in schemas.keys() {
            let ident = unique(&mut taken, type_ident(key));
            idents.insert(key.clone(), ident);
        }
        Lower { doc, schemas, types: BTreeMap::new(), idents, taken, todo: BTreeSet::new(), warnings: Vec::new() }
    }

    /// Follows `$ref`s that are not component schemas (e.g. content descriptors).
    fn deref(&mut self, v: &'a Value, at: &str, depth: usize) -> Result<&'a Value, IrError> {
        let mut v = v;
        for _ in depth..MAX_DEPTH {
            match v.get("$ref").and_then(Value::as_str) {
                Some(r) => {
                    let target = r.strip_prefix('#').and_then(|p| self.doc.pointer(p));
                    v = target.ok_or_else(|| IrError::BadRef { reference: r.to_owned(), at: at.to_owned() })?;
                }
                None => return Ok(v),
            }
        }
        Err(IrError::BadRef { reference: "(a $ref chain too long)".into(), at: at.to_owned() })
    }

    fn method(&mut self, m: &'a Value, index: usize) -> Result<Method, IrError> {
        let name = m
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| IrError::NotOpenRpc(format!("methods[{index}] has no name")))?
            .to_owned();
        let text = |k: &str| m.get(k).and_then(Value::as_str).map(str::to_owned);
        let mut params = Vec::new();
        for (i, p) in m.get("params").and_then(Value::as_array).into_iter().flatten().enumerate() {
            let at = format!("{name}.params[{i}]");
            let p = self.deref(p, &at, 0)?;
            let pname = p
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .map_or_else(|| format!("arg{i}"), str::to_owned);
            let schema = p.get("schema").unwrap_or(&Value::Bool(true));
            let ty = self.ty(schema, &format!("{name}.{pname}"), 0)?;
            let own = p.get("description").or_else(|| p.get("summary")).and_then(Value::as_str);
            let description = doc::param_doc(own, schema, self.schemas);
            params.push(Param {
                name: pname,
                description,
                required: p.get("required").and_then(Value::as_bool).unwrap_or(false),
                ty,
                default: schema.get("default").cloned(),
            });
        }
        let param_structure = match m.get("paramStructure").and_then(Value::as_str) {
            Some("by-name") => ParamStructure::ByName,
            Some("by-position") => ParamStructure::ByPosition,
            _ => ParamStructure::Either,
        };
        let (result, result_description) = match m.get("result") {
            Some(r) => {
                let r = self.deref(r, &format!("{name}.result"), 0)?;
                let schema = r.get("schema").unwrap_or(&Value::Bool(true));
                let desc = r.get("description").and_then(Value::as_str).map(str::to_owned);
                (self.ty(schema, &format!("{name}.result"), 0)?, desc)
            }
            None => (Ty::Null, None),
        };
        Ok(Method {
            builtin: name.starts_with("rpc.") || name.starts_with("ferry."),
            summary: text("summary"),
            description: text("description"),
            deprecated: m.get("deprecated").and_then(Value::as_bool).unwrap_or(false),
            task: m.get("x-ferry-task").and_then(Value::as_bool).unwrap_or(false),
            params,
            param_structure,
            result,
            result_description,
            name,
        })
    }

    /// Lowers every referenced component, including those referenced from components.
    fn finish_types(&mut self) -> Result<(), IrError> {
        while let Some(key) = self.todo.pop_first() {
            let ident = self.idents[&key].clone();
            if self.types.contains_key(&ident) {
                continue;
            }
            let schema = &self.schemas[&key];
            let def = self.type_def(schema, &ident)?;
            self.types.insert(ident, def);
        }
        Ok(())
    }

    fn type_def(&mut self, schema: &'a Value, ident: &str) -> Result<TypeDef, IrError> {
        let description = schema.get("description").and_then(Value::as_str).map(str::to_owned);
        if let Some(values) = enum_values(schema) {
            return Ok(TypeDef::Enum { description, values });
        }
        if let Some(o) = schema.as_object()
            && let Some(def) = self.object(o, ident, 0)?
        {
            return Ok(def);
        }
        let mut ty = self.ty(schema, ident, 0)?;
        if ty == Ty::Named(ident.to_owned()) {
            ty = Ty::Any;
        }
        Ok(TypeDef::Alias { description, ty })
    }

    /// An object schema with properties, as a type definition.
    fn object(&mut self, o: &'a Map<String, Value>, ctx: &str, depth: usize) -> Result<Option<TypeDef>, IrError> {
        let Some(props) = o.get("properties").and_then(Value::as_object) else { return Ok(None) };
        if props.is_empty() {
            return Ok(None);
        }
        let required: BTreeSet<&str> =
            o.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
        let mut names: Vec<&String> = props.keys().collect();
        names.sort();
        let mut fields = Vec::new();
        for name in names {
            let schema = &props[name];
            fields.push(Field {
                name: name.clone(),
                description: schema.get("description").and_then(Value::as_str).map(str::to_owned),
                required: required.contains(name.as_str()),
                ty: self.ty(schema, &format!("{ctx}.{name}"), depth + 1)?,
            });
        }
        let additional = match o.get("additionalProperties") {
            Some(Value::Object(a)) if !a.is_empty() => Some(self.ty(&o["additionalProperties"], ctx, depth + 1)?),
            _ => None,
        };
        let description = o.get("description").and_then(Value::as_str).map(str::to_owned);
        Ok(Some(TypeDef::Object { description, fields, additional }))
    }

    fn reference(&mut self, r: &str, at: &str, depth: usize) -> Result<Ty, IrError> {
        if let Some(key) = r.strip_prefix("#/components/schemas/") {
            let key = key.replace("~1", "/").replace("~0", "~");
            let Some(schema) = self.schemas.get(&key) else {
                return Err(IrError::BadRef { reference: r.to_owned(), at: at.to_owned() });
            };
            if schema.as_object().is_some_and(is_tensor_schema) {
                return Ok(Ty::Tensor);
            }
            if schema.as_object().is_some_and(is_tensor_ref_schema) {
                return Ok(Ty::TensorRef);
            }
            self.todo.insert(key.clone());
            return Ok(Ty::Named(self.idents[&key].clone()));
        }
        let target = r
            .strip_prefix('#')
            .and_then(|p| self.doc.pointer(p))
            .ok_or_else(|| IrError::BadRef { reference: r.to_owned(), at: at.to_owned() })?;
        self.ty(target, at, depth + 1)
    }

    fn ty(&mut self, schema: &'a Value, at: &str, depth: usize) -> Result<Ty, IrError> {
        if depth >= MAX_DEPTH {
            self.warnings.push(format!("{at}: schema nested too deeply; typed as any"));
            return Ok(Ty::Any);
        }
        let o = match schema {
            Value::Bool(true) => return Ok(Ty::Any),
            Value::Object(o) => o,
            other => {
                self.warnings.push(format!("{at}: schema {other} is not understood; typed as any"));
                return Ok(Ty::Any);
            }
        };
        if let Some(r) = o.get("$ref").and_then(Value::as_str) {
            return self.reference(r, at, depth);
        }
        if is_tensor_schema(o) {
            return Ok(Ty::Tensor);
        }
        if is_tensor_ref_schema(o) {
            return Ok(Ty::TensorRef);
        }
        if let Some(all) = o.get("allOf").and_then(Value::as_array) {
            if let [one] = all.as_slice() {
                return self.ty(one, at, depth + 1);
            }
            self.warnings.push(format!("{at}: allOf with {} schemas is not understood; typed as any", all.len()));
            return Ok(Ty::Any);
        }
        if let Some(values) = enum_values(schema) {
            return Ok(Ty::Literal(values.into_iter().map(|v| v.value).collect()));
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(alts) = o.get(key).and_then(Value::as_array) {
                let mut tys = Vec::new();
                for (i, alt) in alts.iter().enumerate() {
                    tys.push(self.ty(alt, &format!("{at}.{key}[{i}]"), depth + 1)?);
                }
                return Ok(union(tys));
            }
        }
        match o.get("type") {
            Some(Value::Array(kinds)) => {
                let mut tys = Vec::new();
                for k in kinds.iter().filter_map(Value::as_str) {
                    tys.push(self.of_kind(k, o, at, depth)?);
                }
                Ok(union(tys))
            }
            Some(Value::String(k)) => self.of_kind(k, o, at, depth),
            Some(other) => {
                self.warnings.push(format!("{at}: type {other} is not understood; typed as any"));
                Ok(Ty::Any)
            }
            None if o.contains_key("properties") => self.of_kind("object", o, at, depth),
            None => Ok(Ty::Any),
        }
    }

    fn of_kind(&mut self, kind: &str, o: &'a Map<String, Value>, at: &str, depth: usize) -> Result<Ty, IrError> {
        Ok(match kind {
            "null" => Ty::Null,
            "boolean" => Ty::Bool,
            "integer" => Ty::Integer,
            "number" => Ty::Number,
            "string" => Ty::String,
            "array" => {
                let tuple = o.get("prefixItems").and_then(Value::as_array).or_else(|| o.get("items")?.as_array());
                if let Some(items) = tuple {
                    let mut tys = Vec::new();
                    for (i, s) in items.iter().enumerate() {
                        tys.push(self.ty(s, &format!("{at}[{i}]"), depth + 1)?);
                    }
                    Ty::Tuple(tys)
                } else if let Some(items) = o.get("items") {
                    Ty::Array(Box::new(self.ty(items, &format!("{at}[]"), depth + 1)?))
                } else {
                    Ty::Array(Box::new(Ty::Any))
                }
            }
            "object" => {
                if o.get("properties").and_then(Value::as_object).is_some_and(|p| !p.is_empty()) {
                    let ident = unique(&mut self.taken, pascal_case(at));
                    let def = self.object(o, &ident, depth)?.expect("properties are not empty");
                    self.types.insert(ident.clone(), def);
                    Ty::Named(ident)
                } else {
                    match o.get("additionalProperties") {
                        Some(s @ Value::Object(_)) => Ty::Map(Box::new(self.ty(s, &format!("{at}{{}}"), depth + 1)?)),
                        _ => Ty::Map(Box::new(Ty::Any)),
                    }
                }
            }
            other => {
                self.warnings.push(format!("{at}: type {other:?} is not understood; typed as any"));
                Ty::Any
            }
        })
    }
}

/// `base`, or `base2`, `base3`.. if taken; records the result as taken.
fn unique(taken: &mut BTreeSet<String>, base: String) -> String {
    let mut name = base.clone();
    let mut n = 2;
    while taken.contains(&name) {
        name = format!("{base}{n}");
        n += 1;
    }
    taken.insert(name.clone());
    name
}

/// The values of an enum-like schema: `enum: [..]`, `const`, or `oneOf`/`anyOf` whose
/// every entry is a `const` (or a one-value `enum`) of a scalar.
fn enum_values(schema: &Value) -> Option<Vec<EnumValue>> {
    let scalar = |v: &Value| v.is_string() || v.is_number() || v.is_boolean() || v.is_null();
    let description = |s: &Value| s.get("description").and_then(Value::as_str).map(str::to_owned);
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return (!values.is_empty() && values.iter().all(scalar))
            .then(|| values.iter().map(|v| EnumValue { value: v.clone(), description: None }).collect());
    }
    if let Some(c) = schema.get("const") {
        return scalar(c).then(|| vec![EnumValue { value: c.clone(), description: description(schema) }]);
    }
    let alts = schema.get("oneOf").or_else(|| schema.get("anyOf"))?.as_array()?;
    let mut out = Vec::new();
    for alt in alts {
        let value = match (alt.get("const"), alt.get("enum").and_then(Value::as_array)) {
            (Some(c), _) => c.clone(),
            (None, Some(e)) if e.len() == 1 => e[0].clone(),
            _ => return None,
        };
        if !scalar(&value) {
            return None;
        }
        out.push(EnumValue { value, description: description(alt) });
    }
    (!out.is_empty()).then_some(out)
}

/// A union, flattened and deduplicated (in first-seen order); one member is itself; `Any`
/// absorbs everything.
fn union(tys: Vec<Ty>) -> Ty {
    let mut out: Vec<Ty> = Vec::new();
    for t in tys {
        let members = match t {
            Ty::Union(inner) => inner,
            other => vec![other],
        };
        for m in members {
            if m == Ty::Any {
                return Ty::Any;
            }
            if !out.contains(&m) {
                out.push(m);
            }
        }
    }
    match out.len() {
        0 => Ty::Any,
        1 => out.pop().expect("one member"),
        _ => Ty::Union(out),
    }
}

#[cfg(test)]
mod tests;
