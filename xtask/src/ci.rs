//! `cargo xtask ci`: the whole CI pipeline, the same locally and on the CI runners.
//!
//! Runs each step in order with a header and its elapsed time, stops at the first failure
//! and prints a summary: fmt, clippy, tests (nextest plus doctests when `cargo nextest` is
//! installed, else `cargo test`), the third-party JSON-RPC clients (`rpc-clients`),
//! `codegen --check`, the Python SDK (`sdk-python`, and `sdk-python-install`: a plain
//! `pip install ./sdks/python` in an empty venv), `tidy`, rustdoc with `-Dwarnings`,
//! `conformance` (all backends), `windows` (clippy for x86_64-pc-windows-gnu and the named-pipe
//! tests under Wine), then `cargo check` of the `ferry` facade with no default
//! features and with each of its features alone.

use std::path::Path;
use std::time::Instant;

use anyhow::bail;
use xshell::{Shell, cmd};

use crate::codegen::Codegen;
use crate::conformance::Conformance;
use crate::flags::Flags;
use crate::rpc_clients::RpcClients;
use crate::tidy::{Tidy, toml_tables};

/// `cargo xtask ci`.
pub struct Ci;

/// What a step does.
type Action = Box<dyn FnOnce(&Shell) -> anyhow::Result<()>>;

/// One step of the pipeline.
struct Step {
    /// What the summary calls it (usually the command line).
    name: String,
    /// Runs the step.
    action: Action,
}

impl Step {
    /// A step running `action`.
    fn new(name: impl Into<String>, action: impl FnOnce(&Shell) -> anyhow::Result<()> + 'static) -> Step {
        Step { name: name.into(), action: Box::new(action) }
    }
}

impl Ci {
    /// Parses the (empty) argument list.
    pub fn parse(flags: Flags) -> anyhow::Result<Ci> {
        flags.finish("ci")?;
        Ok(Ci)
    }

    /// Runs every step, stopping at the first failure.
    pub fn run(self, sh: &Shell) -> anyhow::Result<()> {
        let root = sh.current_dir();
        let mut notes = Vec::new();
        let steps = steps(sh, &root, &mut notes)?;
        let total = steps.len();
        let started = Instant::now();
        let mut done: Vec<(String, f64)> = Vec::new();
        let mut failed: Option<(String, f64, anyhow::Error)> = None;
        for (i, step) in steps.into_iter().enumerate() {
            eprintln!("\n==> [{}/{total}] {}", i + 1, step.name);
            let t = Instant::now();
            let result = (step.action)(sh);
            let secs = t.elapsed().as_secs_f64();
            match result {
                Ok(()) => {
                    eprintln!("==> {}: ok in {secs:.1}s", step.name);
                    done.push((step.name, secs));
                }
                Err(err) => {
                    eprintln!("==> {}: FAILED after {secs:.1}s", step.name);
                    failed = Some((step.name, secs, err));
                    break;
                }
            }
        }

        eprintln!("\n==> ci summary ({:.1}s in all)", started.elapsed().as_secs_f64());
        for (name, secs) in &done {
            eprintln!("  ok      {secs:>7.1}s  {name}");
        }
        if let Some((name, secs, _)) = &failed {
            eprintln!("  FAILED  {secs:>7.1}s  {name}");
        }
        let not_run = total - done.len() - usize::from(failed.is_some());
        if not_run > 0 {
            eprintln!("  ({not_run} later step(s) not run)");
        }
        for note in &notes {
            eprintln!("  note: {note}");
        }
        if let Some((name, _, err)) = failed {
            bail!("ci step `{name}` failed: {err:#}");
        }
        Ok(())
    }
}

/// The pipeline, in order. Notes about skipped steps go to `notes`.
fn steps(sh: &Shell, root: &Path, notes: &mut Vec<String>) -> anyhow::Result<Vec<Step>> {
    let mut steps = vec![
        Step::new("cargo fmt --all --check", |sh| Ok(cmd!(sh, "cargo fmt --all --check").run()?)),
        // All features: the facade's optional backends (quic, cuda-ipc, http) are linted and
        // tested too.
        Step::new("cargo clippy --workspace --all-targets --all-features --locked -- -D warnings", |sh| {
            Ok(cmd!(sh, "cargo clippy --workspace --all-targets --all-features --locked -- -D warnings").run()?)
        }),
    ];
    let has_nextest = cmd!(sh, "cargo nextest --version").quiet().ignore_stdout().ignore_stderr().run().is_ok();
    if has_nextest {
        steps.push(Step::new("cargo nextest run --workspace --all-features --locked", |sh| {
            Ok(cmd!(sh, "cargo nextest run --workspace --all-features --locked").run()?)
        }));
        // nextest does not run doctests.
        steps.push(Step::new("cargo test --workspace --doc --locked", |sh| {
            Ok(cmd!(sh, "cargo test --workspace --doc --locked").run()?)
        }));
    } else {
        notes.push("cargo-nextest is not installed; ran `cargo test` instead".to_owned());
        steps.push(Step::new("cargo test --workspace --all-features --locked", |sh| {
            Ok(cmd!(sh, "cargo test --workspace --all-features --locked").run()?)
        }));
    }
    notes.extend(crate::rpc_clients::missing_tools(sh));
    steps.push(Step::new("cargo xtask rpc-clients", |sh| RpcClients.run(sh)));
    notes.extend(crate::typescript_sdk::missing_tools(sh));
    steps.push(Step::new("cargo xtask sdk-typescript", crate::typescript_sdk::test));
    steps.push(Step::new("cargo xtask codegen --check", |sh| Codegen { check: true }.run(sh)));
    if !crate::python_sdk::has_python(sh) {
        notes.push("python3 is missing: `xtask sdk-python` (the Python SDK) was SKIPPED".to_owned());
    }
    steps.push(Step::new("cargo xtask sdk-python", |sh| crate::python_sdk::SdkPython.run(sh)));
    steps.push(Step::new("cargo xtask sdk-python-install", |sh| crate::python_sdk::SdkPythonInstall.run(sh)));
    steps.push(Step::new("cargo xtask python-server", |sh| crate::python_server::PythonServer.run(sh)));
    steps.push(Step::new("cargo xtask soak", |sh| crate::soak::Soak::CI.run(sh)));
    steps.push(Step::new("cargo xtask tidy", |sh| Tidy.run(sh)));
    steps.push(Step::new("RUSTDOCFLAGS=-Dwarnings cargo doc --workspace --no-deps --locked", |sh| {
        Ok(cmd!(sh, "cargo doc --workspace --no-deps --locked").env("RUSTDOCFLAGS", "-Dwarnings").run()?)
    }));
    steps.push(Step::new("cargo xtask conformance", |sh| Conformance::default().run(sh)));
    steps.push(Step::new("cargo xtask windows", |sh| crate::windows::Windows.run(sh)));

    let manifest = root.join("ferry").join("Cargo.toml");
    match std::fs::read_to_string(&manifest) {
        Ok(text) => {
            steps.push(Step::new("cargo check -p ferry --no-default-features --locked", |sh| {
                Ok(cmd!(sh, "cargo check -p ferry --no-default-features --locked").run()?)
            }));
            for feature in facade_features(&text) {
                steps.push(Step::new(
                    format!("cargo check -p ferry --no-default-features --features {feature} --locked"),
                    move |sh| {
                        Ok(cmd!(sh, "cargo check -p ferry --no-default-features --features {feature} --locked")
                            .run()?)
                    },
                ));
            }
        }
        Err(_) => notes.push("ferry/Cargo.toml does not exist yet; skipped the facade feature checks".to_owned()),
    }
    Ok(steps)
}

/// The features of the facade's `[features]` table worth checking alone: all but `default`
/// and internal ones (`__name`).
fn facade_features(manifest: &str) -> Vec<String> {
    toml_tables(manifest)
        .into_iter()
        .filter(|t| t.header == "[features]")
        .flat_map(|t| t.entries)
        .map(|(name, _)| name)
        .filter(|name| name != "default" && !name.starts_with("__"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_facade_features() {
        let manifest = "[package]\nname = \"ferry\"\n\n[features]\ndefault = [\"pipe\", \"rpc\"]\npipe = [\"dep:ferry-local\"]\n\
                        cuda-ipc = [\n  \"dep:ferry-cuda-ipc\",\n]\n__test = []\n\n[dependencies]\nanyhow = \"1\"\n";
        assert_eq!(facade_features(manifest), ["pipe", "cuda-ipc"]);
    }
}
