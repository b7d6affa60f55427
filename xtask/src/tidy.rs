//! `cargo xtask tidy`: repository rules the compiler does not check. Each rule is also a
//! `#[test]` below, so `cargo test --workspace` enforces them too.
//!
//! - Unsafe allow-list: `allow(unsafe_code)` (or `expect(unsafe_code)`) appears only in
//!   files under `*/src/sys/`.
//! - Conformance instantiation: every crate in `backends/*` has `tests/conformance.rs`,
//!   declared in its `Cargo.toml` as `[[test]] name = "conformance"` with `harness = false`.
//! - Case registry: every `pub fn NAME` in `conformance/src/cases/MODULE.rs` is listed in
//!   `conformance/src/cases/mod.rs` as `MODULE::NAME`.
//! - File length: no `.rs` file is longer than [`MAX_LINES`] lines, except those in
//!   [`LONG_FILES`], which may not grow past their listed count; an entry whose file is
//!   back under the limit must be removed.
//! - Public test modules: no `pub mod` named like test-only code (`testing`, `test_util`,
//!   `tests`, `fake`, `mock`, ..) in a crate's `src/` unless `#[cfg(test)]` or the crate's
//!   test-only feature `__testing` gates it ([`test_only`]).
//! - Test-only features: a test-only feature (a name starting with `__`) is `__testing`, and
//!   no build of a package that ships (`cargo build -p ferry-cli`, the facade with any
//!   features, a bare `cargo build`) enables one: only dev-dependencies and the test-code
//!   packages of `TEST_PACKAGES` do ([`test_only`]; checked on the manifests and on cargo's
//!   resolution, `cargo tree -e features`).
//! - Wire types: every type in `core/src/wire.rs` that derives or implements `Serialize`
//!   or `Deserialize` is described by a checked-in JSON Schema: listed in
//!   `core/src/schema.rs` (`schema_for!(Type)`) or a definition inside one of those schemas.
//!   (`cargo xtask codegen --check` checks that the files are fresh.)
//! - Core depends on no ferry crate: no `ferry-*` package among `core/Cargo.toml`'s
//!   dependencies (dev-dependencies aside) ([`core_deps`]).
//!
//! Files are found by walking the repository, skipping `target/`, `node_modules/` and
//! hidden directories. The checks read Rust and TOML with the small hand-written scanners
//! of [`scan`] (comments and string literals are blanked out first), which is enough for
//! rustfmt-formatted code.

mod core_deps;
mod scan;
mod test_only;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use xshell::Shell;

use self::scan::{
    ascii_fold, attributes_before, blank_comments_and_strings, ident_at, ident_positions, is_ident_char, item_start,
};
pub use self::scan::{toml_tables, unquote};
use crate::flags::Flags;

/// `cargo xtask tidy`.
pub struct Tidy;

impl Tidy {
    /// Parses the (empty) argument list.
    pub fn parse(flags: Flags) -> anyhow::Result<Tidy> {
        flags.finish("tidy")?;
        Ok(Tidy)
    }

    /// Runs every check and reports every problem found.
    pub fn run(self, sh: &Shell) -> anyhow::Result<()> {
        check_all(&sh.current_dir())?;
        eprintln!("tidy: ok");
        Ok(())
    }
}

/// Runs every check on the repository at `root`; fails listing every problem.
pub fn check_all(root: &Path) -> anyhow::Result<()> {
    let mut problems = unsafe_allow_list(root)?;
    problems.extend(backends_instantiate_conformance(root)?);
    problems.extend(conformance_cases_registered(root)?);
    problems.extend(file_lengths(root)?);
    problems.extend(test_only::public_test_modules(root)?);
    problems.extend(test_only::test_features(root)?);
    problems.extend(wire_types_have_schemas(root)?);
    problems.extend(core_deps::core_depends_on_no_ferry_crate(root)?);
    fail_on(problems)
}

/// `Err` listing `problems`, if there are any.
fn fail_on(problems: Vec<String>) -> anyhow::Result<()> {
    if problems.is_empty() {
        return Ok(());
    }
    bail!("tidy found {} problem(s):\n  {}", problems.len(), problems.join("\n  "))
}

// ---------------------------------------------------------------------------------------
// Unsafe allow-list

/// Every `allow(unsafe_code)` outside `*/src/sys/`, as `path:line: message`.
fn unsafe_allow_list(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut problems = Vec::new();
    for path in rust_files(root)? {
        let rel = crate::relative(root, &path);
        // This crate's sources spell out the patterns they look for.
        if format!("/{rel}").contains("/src/sys/") || rel.starts_with("xtask/src/") {
            continue;
        }
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {rel}"))?;
        for line in unsafe_code_allows(&text) {
            problems.push(format!(
                "{rel}:{line}: `allow(unsafe_code)` outside a `src/sys/` module \
                 (unsafe code lives only in `src/sys/` modules: shm, cuda-ipc, rpc, pipe on Windows)"
            ));
        }
    }
    Ok(problems)
}

/// Line numbers (1-based) of every `allow(..)` / `expect(..)` attribute group that names
/// `unsafe_code`, ignoring comments and string literals.
fn unsafe_code_allows(text: &str) -> Vec<usize> {
    let code = blank_comments_and_strings(text);
    let mut lines = Vec::new();
    for attr in ["allow", "expect"] {
        for start in ident_positions(&code, attr) {
            let after = code[start + attr.len()..].trim_start();
            let Some(group) = after.strip_prefix('(') else { continue };
            let mut depth = 1;
            let end = group
                .char_indices()
                .find(|&(_, c)| {
                    match c {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        _ => {}
                    }
                    depth == 0
                })
                .map_or(group.len(), |(i, _)| i);
            if !ident_positions(&group[..end], "unsafe_code").is_empty() {
                lines.push(code[..start].matches('\n').count() + 1);
            }
        }
    }
    lines.sort_unstable();
    lines
}

/// Every `.rs` file under `root`, skipping `target/`, hidden directories and
/// `node_modules/`, sorted.
fn rust_files(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let entry = entry?;
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let file_type = entry.file_type()?;
            if file_type.is_dir() {
                if !(name.starts_with('.') || name == "target" || name == "node_modules") {
                    dirs.push(path);
                }
            } else if file_type.is_file() && name.ends_with(".rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

// ---------------------------------------------------------------------------------------
// Every backend instantiates the conformance suite

/// Every crate in `backends/*` without `tests/conformance.rs` or its `[[test]]` entry.
fn backends_instantiate_conformance(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut problems = Vec::new();
    for dir in backend_dirs(root)? {
        let rel = crate::relative(root, &dir);
        if !dir.join("tests").join("conformance.rs").is_file() {
            problems.push(format!(
                "{rel}/tests/conformance.rs is missing: every backend instantiates the conformance suite \
                 (`fn main() -> ExitCode {{ ferry_conformance::main::<Fixture>() }}`)"
            ));
        }
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml"))?;
        if !declares_conformance_test(&manifest) {
            problems.push(format!(
                "{rel}/Cargo.toml does not declare the conformance test: add \
                 `[[test]]` with `name = \"conformance\"` and `harness = false`"
            ));
        }
    }
    Ok(problems)
}

/// The directories in `backends/` that hold a `Cargo.toml`, sorted.
pub fn backend_dirs(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let backends = root.join("backends");
    if !backends.is_dir() {
        return Ok(Vec::new());
    }
    let mut dirs = Vec::new();
    for entry in std::fs::read_dir(&backends).context("reading backends/")? {
        let path = entry?.path();
        if path.join("Cargo.toml").is_file() {
            dirs.push(path);
        }
    }
    dirs.sort();
    Ok(dirs)
}

/// Whether a manifest has `[[test]]` with `name = "conformance"` and `harness = false`.
fn declares_conformance_test(manifest: &str) -> bool {
    toml_tables(manifest).iter().any(|t| {
        t.header == "[[test]]" && t.get("name").map(unquote) == Some("conformance") && t.get("harness") == Some("false")
    })
}

// ---------------------------------------------------------------------------------------
// Every conformance case is registered

/// Every `pub fn NAME` in `conformance/src/cases/MODULE.rs` that `mod.rs` does not name as
/// `MODULE::NAME`. Skipped, with a note, while `conformance/src/cases/` does not exist.
fn conformance_cases_registered(root: &Path) -> anyhow::Result<Vec<String>> {
    let cases = root.join("conformance").join("src").join("cases");
    if !cases.is_dir() {
        eprintln!("tidy: note: conformance/src/cases/ does not exist yet; skipping the case-registry check");
        return Ok(Vec::new());
    }
    let registry_path = cases.join("mod.rs");
    let registry_rel = crate::relative(root, &registry_path);
    let Ok(registry) = std::fs::read_to_string(&registry_path) else {
        return Ok(vec![format!("{registry_rel} is missing: it lists every conformance case")]);
    };
    let registry = blank_comments_and_strings(&registry);

    let mut files: Vec<PathBuf> = std::fs::read_dir(&cases)?.map(|e| e.map(|e| e.path())).collect::<Result<_, _>>()?;
    files.retain(|p| p.extension().is_some_and(|e| e == "rs") && p.file_name().is_some_and(|n| n != "mod.rs"));
    files.sort();

    let mut problems = Vec::new();
    for file in files {
        let module = file.file_stem().unwrap_or_default().to_string_lossy().into_owned();
        let rel = crate::relative(root, &file);
        let text = std::fs::read_to_string(&file).with_context(|| format!("reading {rel}"))?;
        for name in top_level_pub_fns(&text) {
            if !mentions_path(&registry, &module, &name) {
                problems.push(format!(
                    "{rel}: case `pub fn {name}` is not registered: list `{module}::{name}` in `all()` in {registry_rel}"
                ));
            }
        }
    }
    Ok(problems)
}

/// Names of the unindented `pub fn` / `pub async fn` items of a rustfmt-formatted file.
fn top_level_pub_fns(text: &str) -> Vec<String> {
    blank_comments_and_strings(text)
        .lines()
        .filter_map(|line| line.strip_prefix("pub fn ").or_else(|| line.strip_prefix("pub async fn ")))
        .map(|rest| rest.chars().take_while(|&c| is_ident_char(c)).collect::<String>())
        .filter(|name| !name.is_empty())
        .collect()
}

/// Whether `code` contains the path `module::name` (as whole identifiers, any spacing).
fn mentions_path(code: &str, module: &str, name: &str) -> bool {
    ident_positions(code, module).into_iter().any(|start| {
        let rest = code[start + module.len()..].trim_start();
        let Some(rest) = rest.strip_prefix("::") else { return false };
        let rest = rest.trim_start();
        rest.strip_prefix(name).is_some_and(|after| !after.starts_with(is_ident_char))
    })
}

// ---------------------------------------------------------------------------------------
// File length

/// The most lines a `.rs` file may have.
const MAX_LINES: usize = 800;

/// The `.rs` files longer than [`MAX_LINES`]: `(path, line count when listed, why it is
/// not split yet)`. This list only shrinks. Tidy fails when a listed file grows past its
/// count, and when it is back within the limit (then remove its entry). When a listed file
/// gets shorter, lower its count.
const LONG_FILES: &[(&str, usize, &str)] = &[];

/// Every `.rs` file over [`MAX_LINES`] that [`LONG_FILES`] does not allow, every listed one
/// that grew, and every stale entry.
fn file_lengths(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut files = Vec::new();
    for path in rust_files(root)? {
        let rel = crate::relative(root, &path);
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {rel}"))?;
        files.push((rel, text.lines().count()));
    }
    Ok(file_length_problems(&files, LONG_FILES))
}

/// The file-length rule on `(path, lines)` pairs, with `allowed` as the allow-list.
fn file_length_problems(files: &[(String, usize)], allowed: &[(&str, usize, &str)]) -> Vec<String> {
    const LIST: &str = "LONG_FILES in xtask/src/tidy.rs";
    let mut problems = Vec::new();
    for (rel, lines) in files {
        let (rel, lines) = (rel.as_str(), *lines);
        match allowed.iter().find(|(path, ..)| *path == rel) {
            None if lines > MAX_LINES => problems.push(format!(
                "{rel}: {lines} lines, over the limit of {MAX_LINES}: split it into modules \
                 ({LIST} only shrinks; do not add to it)"
            )),
            Some(&(_, listed, _)) if lines > listed => problems.push(format!(
                "{rel}: {lines} lines, more than the {listed} it had when it was allowed ({LIST}): \
                 split it, or bring it back to {listed} lines or fewer"
            )),
            Some(_) if lines <= MAX_LINES => problems.push(format!(
                "{rel}: {lines} lines, within the limit of {MAX_LINES} now: remove its entry from {LIST}"
            )),
            _ => {}
        }
    }
    for (path, ..) in allowed {
        if !files.iter().any(|(rel, _)| rel == path) {
            problems.push(format!("{path}: listed in {LIST} but not found: remove its entry"));
        }
    }
    problems
}

// ---------------------------------------------------------------------------------------
// Every wire type has a JSON Schema

/// Every serde type of `core/src/wire.rs` that no schema describes.
fn wire_types_have_schemas(root: &Path) -> anyhow::Result<Vec<String>> {
    let wire_rel = "core/src/wire.rs";
    let schema_rel = "core/src/schema.rs";
    let wire = std::fs::read_to_string(root.join(wire_rel)).with_context(|| format!("reading {wire_rel}"))?;
    let schema = std::fs::read_to_string(root.join(schema_rel)).with_context(|| format!("reading {schema_rel}"))?;
    let mut described: BTreeSet<String> = schema_for_names(&schema).into_iter().collect();
    for (name, text) in ferry_core::schema::schemas() {
        let value: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("schema {name}"))?;
        described.extend(schema_definitions(&value));
    }
    let mut problems = Vec::new();
    for (line, name) in serde_types(&wire) {
        if !described.contains(&name) {
            problems.push(format!(
                "{wire_rel}:{line}: wire type `{name}` is (de)serialized but no JSON Schema describes it: add \
                 `(\"{}.json\", schema_for!({name}))` to `schemas()` in {schema_rel} (or use `{name}` in a type \
                 listed there), then run `cargo xtask codegen`",
                kebab_case(&name)
            ));
        }
    }
    Ok(problems)
}

/// `(line, name)` of every struct or enum that derives `Serialize` or `Deserialize`, and
/// of every type with a hand-written `impl Serialize for` / `impl Deserialize for`.
fn serde_types(text: &str) -> Vec<(usize, String)> {
    let raw = ascii_fold(text);
    let code = ascii_fold(&blank_comments_and_strings(text));
    let is_serde =
        |s: &str| !ident_positions(s, "Serialize").is_empty() || !ident_positions(s, "Deserialize").is_empty();
    let mut types = BTreeMap::new();
    let mut add = |line: usize, name: &str| {
        let first = types.entry(name.to_owned()).or_insert(line);
        *first = line.min(*first);
    };
    for keyword in ["struct", "enum"] {
        for at in ident_positions(&code, keyword) {
            let Some(name) = ident_at(&code, at + keyword.len()) else { continue };
            let attrs = attributes_before(&code, &raw, item_start(&code, at));
            if attrs.iter().any(|a| a.trim_start_matches("#[").trim_start().starts_with("derive") && is_serde(a)) {
                add(code[..at].matches('\n').count() + 1, name);
            }
        }
    }
    for (i, line) in code.lines().enumerate() {
        let line = line.trim_start();
        let Some((head, target)) = line.split_once(" for ") else { continue };
        if line.starts_with("impl")
            && is_serde(head)
            && let Some(name) = ident_at(target, 0)
        {
            add(i + 1, name);
        }
    }
    let mut types: Vec<(usize, String)> = types.into_iter().map(|(name, line)| (line, name)).collect();
    types.sort();
    types
}

/// The type names in `schema_for!(Name)` calls of `core/src/schema.rs`.
fn schema_for_names(text: &str) -> Vec<String> {
    let code = blank_comments_and_strings(text);
    ident_positions(&code, "schema_for")
        .into_iter()
        .filter_map(|at| {
            let rest = code[at + "schema_for".len()..].trim_start().strip_prefix('!')?.trim_start();
            ident_at(rest.strip_prefix('(')?, 0).map(str::to_owned)
        })
        .collect()
}

/// The names a generated schema describes: its `title` and the keys of its `definitions`
/// (`$defs` in newer drafts).
fn schema_definitions(schema: &serde_json::Value) -> Vec<String> {
    let mut names: Vec<String> = schema.get("title").and_then(|t| t.as_str()).map(str::to_owned).into_iter().collect();
    for key in ["definitions", "$defs"] {
        if let Some(defs) = schema.get(key).and_then(|d| d.as_object()) {
            names.extend(defs.keys().cloned());
        }
    }
    names
}

/// `TensorDesc` to `tensor-desc`, the schemas' file names.
fn kebab_case(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push('-');
        }
        out.extend(c.to_lowercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsafe_code_is_allowed_only_in_sys_modules() {
        fail_on(unsafe_allow_list(&crate::project_root()).unwrap()).unwrap();
    }

    #[test]
    fn every_backend_instantiates_conformance() {
        fail_on(backends_instantiate_conformance(&crate::project_root()).unwrap()).unwrap();
    }

    #[test]
    fn every_conformance_case_is_registered() {
        fail_on(conformance_cases_registered(&crate::project_root()).unwrap()).unwrap();
    }

    #[test]
    fn no_file_is_too_long() {
        fail_on(file_lengths(&crate::project_root()).unwrap()).unwrap();
    }

    #[test]
    fn every_wire_type_has_a_schema() {
        fail_on(wire_types_have_schemas(&crate::project_root()).unwrap()).unwrap();
    }

    #[test]
    fn file_length_allow_list_only_shrinks() {
        let allowed = [("big.rs", 900, "why"), ("grew.rs", 850, "why"), ("fixed.rs", 820, "why"), ("gone.rs", 810, "")];
        let files: Vec<(String, usize)> =
            [("ok.rs", 800), ("new.rs", 801), ("big.rs", 900), ("grew.rs", 851), ("fixed.rs", 800)]
                .into_iter()
                .map(|(p, n)| (p.to_owned(), n))
                .collect();
        let problems = file_length_problems(&files, &allowed);
        let starts: Vec<&str> = problems.iter().map(|p| p.split(':').next().unwrap()).collect();
        assert_eq!(starts, ["new.rs", "grew.rs", "fixed.rs", "gone.rs"], "{problems:#?}");
        assert!(problems[0].contains("over the limit of 800: split it"), "{}", problems[0]);
        assert!(problems[1].contains("more than the 850"), "{}", problems[1]);
        assert!(problems[2].contains("remove its entry"), "{}", problems[2]);
        assert!(problems[3].contains("not found"), "{}", problems[3]);
    }

    #[test]
    fn finds_serde_types_and_schema_names() {
        let wire = "/// A `#[derive(Serialize)]` in a doc.\n\
                    #[derive(Debug, Serialize, Deserialize, JsonSchema)]\n#[serde(tag = \"t\")]\npub struct Hello {\n}\n\
                    #[derive(Debug, Clone)]\npub struct Internal;\n\
                    #[derive(serde::Deserialize)]\n/// Doc.\npub(crate) enum Kind { A }\n\
                    impl<'de> Deserialize<'de> for Manual {}\nimpl Serialize for Hello {}\n\
                    // #[derive(Serialize)] struct Commented;\n";
        let names: Vec<(usize, String)> = serde_types(wire);
        assert_eq!(names, [(4, "Hello".to_owned()), (10, "Kind".to_owned()), (11, "Manual".to_owned())]);

        let schema = "use schemars::schema_for;\nlet v = vec![(\"a.json\", schema_for!(Hello)), (\"b.json\", schema_for! ( Kind ))];\n\
                      // schema_for!(Commented)\n";
        assert_eq!(schema_for_names(schema), ["Hello", "Kind"]);
        let value = serde_json::json!({"title": "Hello", "definitions": {"Manual": {}}});
        assert_eq!(schema_definitions(&value), ["Hello", "Manual"]);
        assert_eq!(kebab_case("TensorDesc"), "tensor-desc");
    }

    #[test]
    fn finds_unsafe_code_allows() {
        let src = "//! allow(unsafe_code) in docs is fine\n\
                   #![allow(unsafe_code)]\n\
                   let s = \"allow(unsafe_code)\";\n\
                   #[cfg_attr(test, expect(\n    dead_code,\n    unsafe_code\n))]\n\
                   #[allow(unsafe_code_extra)] /* allow(unsafe_code) */\n\
                   fn allow(x: u8) -> char { let unsafe_code = 1; 'a' }\n";
        assert_eq!(unsafe_code_allows(src), [2, 4]);
    }

    #[test]
    fn finds_registered_cases() {
        let registry = "pub mod every_dtype;\npub fn all<F: Fixture>() -> Vec<Case<F>> {\n    vec![\n        \
                        (\"every_dtype::threads\", every_dtype::threads::<F>),\n        case!(shapes :: empty),\n        \
                        // (\"every_dtype::commented\", every_dtype::commented::<F>),\n    ]\n}\n";
        let code = blank_comments_and_strings(registry);
        assert!(mentions_path(&code, "every_dtype", "threads"));
        assert!(mentions_path(&code, "shapes", "empty"));
        assert!(!mentions_path(&code, "every_dtype", "thread"));
        assert!(!mentions_path(&code, "every_dtype", "commented"));
        assert!(!mentions_path(&code, "dtype", "threads"));
    }

    #[test]
    fn finds_top_level_pub_fns() {
        let src = "pub fn threads<F: Fixture>(fx: &F) -> Result<(), Failed> {}\n\
                   pub async fn later() {}\nfn helper() {}\npub(crate) fn internal() {}\n\
                   impl X {\n    pub fn method(&self) {}\n}\n// pub fn commented() {}\n";
        assert_eq!(top_level_pub_fns(src), ["threads", "later"]);
    }

    #[test]
    fn parses_cargo_toml_tables() {
        let manifest = r#"
[package]
name = "ferry-local" # comment

[features]
default = ["pipe", "shm"]
pipe = [
    "dep:ferry-local", # comment ]
    "ferry-core/x",
]
"cuda-ipc" = []
__internal = []

[[test]]
name = "conformance"
harness = false
"#;
        let tables = toml_tables(manifest);
        let features = tables.iter().find(|t| t.header == "[features]").unwrap();
        let keys: Vec<_> = features.entries.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["default", "pipe", "cuda-ipc", "__internal"]);
        assert_eq!(tables[1].get("name").map(unquote), Some("ferry-local"));
        assert!(declares_conformance_test(manifest));
        assert!(!declares_conformance_test(&manifest.replace("harness = false", "")));
        assert!(!declares_conformance_test("[[bench]]\nname = \"conformance\"\nharness = false\n"));
    }
}
