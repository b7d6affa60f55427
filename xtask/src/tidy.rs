//! `cargo xtask tidy`: repository rules the compiler does not check. Each rule is also a
//! `#[test]` below, so `cargo test --workspace` enforces them too.
//!
//! - Unsafe allow-list: `allow(unsafe_code)` (or `expect(unsafe_code)`) appears only in
//!   files under `*/src/sys/`.
//! - Conformance instantiation: every crate in `backends/*` has `tests/conformance.rs`,
//!   declared in its `Cargo.toml` as `[[test]] name = "conformance"` with `harness = false`.
//! - Case registry: every `pub fn NAME` in `conformance/src/cases/MODULE.rs` is listed in
//!   `conformance/src/cases/mod.rs` as `MODULE::NAME`.
//!
//! The checks read Rust and TOML with small hand-written scanners (comments and string
//! literals are blanked out first), which is enough for rustfmt-formatted code.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use xshell::Shell;

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
        if format!("/{rel}").contains("/src/sys/") {
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

/// Every `.rs` file under `root`, skipping `target/`, hidden directories, `node_modules/`
/// and this crate's own sources (which spell out the patterns they look for).
fn rust_files(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let skip = root.join("xtask").join("src");
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
                if !(name.starts_with('.') || name == "target" || name == "node_modules" || path == skip) {
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
// Small scanners

/// Whether `c` can be part of a Rust identifier.
fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Byte offsets of `ident` in `code` where it is a whole identifier.
fn ident_positions(code: &str, ident: &str) -> Vec<usize> {
    code.match_indices(ident)
        .filter(|&(i, _)| {
            let before = code[..i].chars().next_back();
            let after = code[i + ident.len()..].chars().next();
            !before.is_some_and(is_ident_char) && !after.is_some_and(is_ident_char)
        })
        .map(|(i, _)| i)
        .collect()
}

/// `text` with the contents of comments and string / char literals replaced by spaces
/// (newlines kept, so line numbers still match).
fn blank_comments_and_strings(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let prev_is_ident = i > 0 && is_ident_char(chars[i - 1]);
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                blank(&mut out, chars[i]);
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
            }
        } else if c == 'r' && !prev_is_ident && matches!(next, Some('"' | '#')) {
            // Raw string r"..", r#".."#, or an identifier that starts with r (r#type).
            let hashes = chars[i + 1..].iter().take_while(|&&c| c == '#').count();
            if chars.get(i + 1 + hashes) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            out.push('r');
            out.extend(std::iter::repeat_n('#', hashes));
            out.push('"');
            i += 2 + hashes;
            while i < chars.len() {
                let closes =
                    chars[i] == '"' && chars[i + 1..].iter().take(hashes).filter(|&&c| c == '#').count() == hashes;
                if closes {
                    out.push('"');
                    out.extend(std::iter::repeat_n('#', hashes));
                    i += 1 + hashes;
                    break;
                }
                blank(&mut out, chars[i]);
                i += 1;
            }
        } else if c == '"' {
            out.push('"');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
                if let Some(&c) = chars.get(i) {
                    blank(&mut out, c);
                }
                i += 1;
            }
            if i < chars.len() {
                out.push('"');
                i += 1;
            }
        } else if c == '\'' && next == Some('\\') {
            // Escaped char literal: '\n', '\'', '\u{..}'.
            out.push('\'');
            i += 1;
            for &c in chars.iter().skip(i).take(2) {
                blank(&mut out, c);
            }
            i += 2;
            while i < chars.len() && chars[i] != '\'' {
                blank(&mut out, chars[i]);
                i += 1;
            }
            if i < chars.len() {
                out.push('\'');
                i += 1;
            }
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            // Plain char literal 'x' (a lifetime never has a quote two characters later).
            out.push('\'');
            blank(&mut out, chars[i + 1]);
            out.push('\'');
            i += 3;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// One `[header]` or `[[header]]` table of a TOML file, with its top-level keys.
pub struct TomlTable {
    /// The header line as written, e.g. `[features]` or `[[test]]` (`""` for the root).
    pub header: String,
    /// `(key, raw value text)`; multi-line arrays are joined into one value.
    pub entries: Vec<(String, String)>,
}

impl TomlTable {
    /// The raw value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

/// Splits a (Cargo.toml-style) TOML file into its tables. Handles comments, quoted keys
/// and multi-line arrays; not a full TOML parser (no multi-line strings).
pub fn toml_tables(text: &str) -> Vec<TomlTable> {
    let mut tables = vec![TomlTable { header: String::new(), entries: Vec::new() }];
    let mut pending: Option<(String, String, i32)> = None; // key, value so far, bracket depth
    for raw in text.lines() {
        let line = strip_toml_comment(raw).trim();
        if let Some((key, mut value, mut depth)) = pending.take() {
            depth += bracket_delta(line);
            value.push(' ');
            value.push_str(line);
            let table = tables.last_mut().expect("there is always a table");
            if depth > 0 {
                pending = Some((key, value, depth));
            } else {
                table.entries.push((key, value));
            }
            continue;
        }
        if line.is_empty() {
            continue;
        }
        if line.starts_with('[') {
            tables.push(TomlTable { header: line.split_whitespace().collect(), entries: Vec::new() });
            continue;
        }
        let Some((key, value)) = split_toml_key(line) else { continue };
        let depth = bracket_delta(value);
        let table = tables.last_mut().expect("there is always a table");
        if depth > 0 {
            pending = Some((key, value.to_owned(), depth));
        } else {
            table.entries.push((key, value.to_owned()));
        }
    }
    if let Some((key, value, _)) = pending {
        tables.last_mut().expect("there is always a table").entries.push((key, value));
    }
    tables
}

/// `key = value` to `(key, value)`, unquoting a quoted key.
fn split_toml_key(line: &str) -> Option<(String, &str)> {
    if let Some(rest) = line.strip_prefix('"') {
        let close = rest.find('"')?;
        let value = rest[close + 1..].trim_start().strip_prefix('=')?;
        return Some((rest[..close].to_owned(), value.trim()));
    }
    let (key, value) = line.split_once('=')?;
    let key = key.trim();
    if key.is_empty() || !key.chars().all(|c| is_ident_char(c) || c == '-' || c == '.') {
        return None;
    }
    Some((key.to_owned(), value.trim()))
}

/// `[` minus `]` outside of strings.
fn bracket_delta(s: &str) -> i32 {
    let mut in_str = false;
    let mut delta = 0;
    for c in s.chars() {
        match c {
            '"' => in_str = !in_str,
            '[' if !in_str => delta += 1,
            ']' if !in_str => delta -= 1,
            _ => {}
        }
    }
    delta
}

/// The line without a trailing `# comment` (a `#` inside a string is kept).
fn strip_toml_comment(line: &str) -> &str {
    let mut in_str = false;
    for (i, c) in line.char_indices() {
        match c {
            '"' => in_str = !in_str,
            '#' if !in_str => return &line[..i],
            _ => {}
        }
    }
    line
}

/// `"text"` to `text` (other values unchanged).
pub fn unquote(value: &str) -> &str {
    value.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(value)
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
    fn blanks_comments_and_literals_keeping_offsets() {
        let src = "a // b\n/* c /* d */ e */ f \"g\\\"h\" 'i' '\\'' r#\"j\"# x<'a> r#type";
        let out = blank_comments_and_strings(src);
        assert_eq!(out.len(), src.len());
        assert_eq!(
            out.split_whitespace().collect::<Vec<_>>(),
            ["a", "f", "\"", "\"", "'", "'", "'", "'", "r#\"", "\"#", "x<'a>", "r#type"]
        );
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
name = "ferry-pipe" # comment

[features]
default = ["pipe", "shm"]
pipe = [
    "dep:ferry-pipe", # comment ]
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
        assert_eq!(tables[1].get("name").map(unquote), Some("ferry-pipe"));
        assert!(declares_conformance_test(manifest));
        assert!(!declares_conformance_test(&manifest.replace("harness = false", "")));
        assert!(!declares_conformance_test("[[bench]]\nname = \"conformance\"\nharness = false\n"));
    }
}
