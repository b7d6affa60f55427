//! Core depends on no ferry crate (ARCHITECTURE.md: dependencies point down; core is at
//! the bottom): no `ferry-*` (or `ferry`) package in any `[dependencies]`,
//! `[build-dependencies]` or `[target.*.dependencies]` table of `core/Cargo.toml`, under
//! its own name or renamed (`package = "ferry-.."`). Dev-dependencies may point up (core's
//! tests run the conformance suite).

use std::path::Path;

use anyhow::Context;

use super::scan::{toml_tables, unquote};

/// The problems with `core/Cargo.toml`'s dependencies.
pub(super) fn core_depends_on_no_ferry_crate(root: &Path) -> anyhow::Result<Vec<String>> {
    let path = root.join("core").join("Cargo.toml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(problems("core/Cargo.toml", &text))
}

/// The ferry crates `manifest` (at `rel`) depends on, as problems.
pub(super) fn problems(rel: &str, manifest: &str) -> Vec<String> {
    let mut out = Vec::new();
    for table in toml_tables(manifest) {
        let header = table.header.trim_matches(|c| c == '[' || c == ']');
        let (section, name_in_header) = match header.rsplit_once('.') {
            // `[dependencies.ferry-ring]`: the package named in the header itself.
            Some((s, name)) if s.ends_with("dependencies") => (s, Some(name)),
            _ => (header, None),
        };
        let normal = section == "dependencies"
            || section == "build-dependencies"
            || section.ends_with(".dependencies") && !section.ends_with("dev-dependencies")
            || section.ends_with(".build-dependencies");
        if !normal {
            continue;
        }
        let mut names: Vec<String> = Vec::new();
        if let Some(n) = name_in_header {
            names.push(unquote(n).to_owned());
            if let Some(v) = table.entries.iter().find(|(k, _)| k == "package") {
                names.push(unquote(v.1.trim()).to_owned());
            }
        } else {
            for (key, value) in &table.entries {
                // `ferry-ring = ..`, `ferry-ring.workspace = true`, `x = { package = "ferry-ring" }`.
                names.push(unquote(key.split('.').next().unwrap_or(key)).to_owned());
                if let Some(at) = value.find("package") {
                    let rest = value[at + "package".len()..].trim_start().trim_start_matches('=').trim_start();
                    if let Some(q) = rest.strip_prefix('"') {
                        names.push(q.split('"').next().unwrap_or("").to_owned());
                    }
                }
            }
        }
        for name in names.into_iter().filter(|n| is_ferry(n)) {
            out.push(format!(
                "{rel} depends on `{name}` ([{header}]): ferry-core depends on no ferry crate (ARCHITECTURE.md); \
                 put what it needs behind a trait in core and implement it in the other crate"
            ));
        }
    }
    out
}

fn is_ferry(name: &str) -> bool {
    name == "ferry" || name.starts_with("ferry-") || name.starts_with("ferry_")
}

#[cfg(test)]
mod tests {
    use super::problems;

    #[test]
    fn ferry_crates_in_core_dependencies_are_found_in_every_form() {
        let manifest = r#"
[package]
name = "ferry-core"

[dependencies]
serde.workspace = true
ferry-ring.workspace = true
ring = { version = "0.17", package = "ferry-shm" }

[target.'cfg(target_os = "linux")'.dependencies]
ferry-local = { workspace = true, optional = true }

[dependencies.ferry-quic]
workspace = true

[build-dependencies]
ferry = "0.1"

[dev-dependencies]
ferry-conformance.workspace = true
"#;
        let found = problems("core/Cargo.toml", manifest);
        let names: Vec<&str> = found.iter().map(|p| p.split('`').nth(1).unwrap()).collect();
        assert_eq!(names, ["ferry-ring", "ferry-shm", "ferry-local", "ferry-quic", "ferry"], "{found:#?}");
    }

    #[test]
    fn core_without_ferry_dependencies_passes() {
        let manifest = "[dependencies]\nserde.workspace = true\ntokio = { workspace = true }\n\n\
                        [dev-dependencies]\nferry-conformance.workspace = true\n";
        assert!(problems("core/Cargo.toml", manifest).is_empty());
    }

    #[test]
    fn core_depends_on_no_ferry_crate() {
        let found = super::core_depends_on_no_ferry_crate(&crate::project_root()).unwrap();
        assert!(found.is_empty(), "{found:#?}");
    }
}
