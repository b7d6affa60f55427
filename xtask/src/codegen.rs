//! `cargo xtask codegen [--check]`: every generated file that is checked in.
//!
//! Each generator is an [`Output`]: a directory it owns, the file extension it owns there,
//! and the `(path, contents)` pairs it generates. [`generate`] writes (or checks) every
//! file through [`ensure_file_contents`] and removes (or reports) owned files that are no
//! longer generated. To add a generator (the Python and TypeScript SDKs), add a function
//! returning an [`Output`] and list it in [`outputs`].

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use xshell::Shell;

use crate::flags::Flags;

/// `cargo xtask codegen [--check]`.
pub struct Codegen {
    /// Check that the checked-in files are fresh instead of writing them.
    pub check: bool,
}

impl Codegen {
    /// Parses `[--check]`.
    pub fn parse(mut flags: Flags) -> anyhow::Result<Codegen> {
        let check = flags.flag("--check");
        flags.finish("codegen")?;
        Ok(Codegen { check })
    }

    /// Writes (or checks) every generated file.
    pub fn run(self, sh: &Shell) -> anyhow::Result<()> {
        generate(&sh.current_dir(), self.check)
    }
}

/// The files one generator produces.
pub struct Output {
    /// Directory, relative to the repository root, that this generator owns: every file in
    /// it (not below it) with extension [`Output::ext`] must be one of [`Output::files`].
    pub dir: PathBuf,
    /// Extension (without the dot) of the files this generator owns in [`Output::dir`].
    pub ext: &'static str,
    /// `(path relative to the repository root, contents)` of each generated file.
    pub files: Vec<(PathBuf, String)>,
}

/// Every generator, in a fixed order.
pub fn outputs() -> Vec<Output> {
    vec![schemas()]
}

/// `core/schemas/*.json`, from the wire types' `schemars` derives.
fn schemas() -> Output {
    let dir = PathBuf::from("core/schemas");
    let files = ferry_core::schema::schemas().into_iter().map(|(name, text)| (dir.join(name), text)).collect();
    Output { dir, ext: "json", files }
}

/// Writes every generated file under `root`, or with `check`, fails naming every stale,
/// missing or leftover file.
pub fn generate(root: &Path, check: bool) -> anyhow::Result<()> {
    let mut problems = Vec::new();
    for output in outputs() {
        for (path, contents) in &output.files {
            if let Err(err) = ensure_file_contents(&root.join(path), contents, check) {
                problems.push(format!("{err:#}"));
            }
        }
        for path in leftovers(root, &output)? {
            let shown = crate::relative(root, &path);
            if check {
                problems.push(format!("{shown} is no longer generated: run `cargo xtask codegen` to remove it"));
            } else {
                std::fs::remove_file(&path).with_context(|| format!("removing {shown}"))?;
                eprintln!("removed {shown} (no longer generated)");
            }
        }
    }
    if !problems.is_empty() {
        bail!("generated files are out of date:\n  {}", problems.join("\n  "));
    }
    Ok(())
}

/// Files in `output.dir` with extension `output.ext` that `output` no longer generates.
fn leftovers(root: &Path, output: &Output) -> anyhow::Result<Vec<PathBuf>> {
    let dir = root.join(&output.dir);
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let mut stale = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let owned = path.is_file() && path.extension().is_some_and(|e| e == output.ext);
        if owned && !output.files.iter().any(|(p, _)| root.join(p) == path) {
            stale.push(path);
        }
    }
    stale.sort();
    Ok(stale)
}

/// Makes `path` hold exactly `contents` (with `\n` newlines). With `check`, fails with
/// "PATH is stale: run `cargo xtask codegen`" instead of writing.
pub fn ensure_file_contents(path: &Path, contents: &str, check: bool) -> anyhow::Result<()> {
    let contents = normalize_newlines(contents);
    let shown = crate::relative(&crate::project_root(), path);
    if let Ok(old) = std::fs::read_to_string(path)
        && normalize_newlines(&old) == contents
    {
        return Ok(());
    }
    if check {
        bail!("{shown} is stale: run `cargo xtask codegen`");
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(path, contents.as_bytes()).with_context(|| format!("writing {shown}"))?;
    eprintln!("updated {shown}");
    Ok(())
}

/// `\r\n` to `\n`, so a checkout with `core.autocrlf` is not reported as stale.
fn normalize_newlines(s: &str) -> String {
    s.replace("\r\n", "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checked-in generated files match their sources. Run `cargo xtask codegen`.
    #[test]
    fn generated_files_are_fresh() {
        generate(&crate::project_root(), true).unwrap();
    }

    #[test]
    fn ensure_file_contents_checks_writes_and_ignores_crlf() {
        let dir = std::env::temp_dir().join(format!("xtask-codegen-test-{}", std::process::id()));
        let path = dir.join("sub/a.json");
        let err = ensure_file_contents(&path, "{}\n", true).unwrap_err();
        assert!(err.to_string().contains("is stale: run `cargo xtask codegen`"), "{err}");
        ensure_file_contents(&path, "{}\r\n", false).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{}\n");
        std::fs::write(&path, "{}\r\n").unwrap();
        ensure_file_contents(&path, "{}\n", true).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn outputs_are_inside_their_dirs_and_unique() {
        let mut seen = std::collections::BTreeSet::new();
        for output in outputs() {
            for (path, _) in &output.files {
                assert!(path.starts_with(&output.dir), "{}", path.display());
                assert!(seen.insert(path.clone()), "generated twice: {}", path.display());
            }
        }
    }
}
