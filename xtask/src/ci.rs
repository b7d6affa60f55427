//! `cargo xtask ci`: the whole CI pipeline, the same locally and on the CI runners.
//!
//! Runs each step of [`STEPS`] in order with a header and its elapsed time, stops at the
//! first failure and prints a summary. [`STEPS`] is also where `cargo xtask help` and the
//! README's list of what CI runs come from ([`help_list`], [`readme_list`]; a test checks
//! the README's copy), so the three cannot drift apart.

use std::time::Instant;

use anyhow::bail;
use xshell::{Shell, cmd};

use crate::codegen::Codegen;
use crate::conformance::Conformance;
use crate::flags::Flags;
use crate::rpc_clients::RpcClients;
use crate::tidy::{Tidy, toml_tables};

/// `cargo xtask ci [--list]`.
pub struct Ci {
    /// Print the steps as the README lists them instead of running them.
    list: bool,
}

/// One step of the pipeline.
pub struct Step {
    /// What the summary, the help and the README call it (usually the command line).
    pub name: &'static str,
    /// What it checks, in a line.
    pub what: &'static str,
    /// Runs the step.
    run: fn(&Shell) -> anyhow::Result<()>,
}

/// The pipeline, in order.
pub const STEPS: &[Step] = &[
    Step {
        name: "cargo fmt --all --check",
        what: "formatting",
        run: |sh| Ok(cmd!(sh, "cargo fmt --all --check").run()?),
    },
    Step {
        name: "cargo clippy --workspace --all-targets --all-features --locked -- -D warnings",
        what: "lints, with every feature (quic, cuda-ipc, http too)",
        run: |sh| Ok(cmd!(sh, "cargo clippy --workspace --all-targets --all-features --locked -- -D warnings").run()?),
    },
    Step {
        name: "cargo nextest run --workspace --all-features --locked",
        what: "every test (`cargo test --workspace --all-features` where cargo-nextest is missing)",
        run: tests,
    },
    Step {
        name: "cargo test --workspace --doc --locked",
        what: "the doctests (nextest does not run them; part of the step above without nextest)",
        run: doctests,
    },
    Step {
        name: "cargo xtask rpc-clients",
        what: "third-party JSON-RPC clients (jsonrpcclient from PyPI, @open-rpc/* from npm) and the OpenRPC meta-schema against `ferry serve`",
        run: |sh| RpcClients.run(sh),
    },
    Step {
        name: "cargo xtask readme",
        what: "the README's `sh` blocks, run as written (long-running demos marked and skipped)",
        run: crate::readme::run,
    },
    Step {
        name: "cargo xtask sdk-typescript",
        what: "the TypeScript SDK: npm ci && npm test, dist/ fresh, the package installed into scratch projects",
        run: crate::typescript_sdk::test,
    },
    Step {
        name: "cargo xtask codegen --check",
        what: "schemas and generated clients are checked in and fresh",
        run: |sh| Codegen { check: true }.run(sh),
    },
    Step {
        name: "cargo xtask python-server",
        what: "the ferry Python package (server, client, store, generated clients) in an empty venv: ruff, mypy --strict, stubtest, pytest",
        run: |sh| crate::python_server::PythonServer.run(sh),
    },
    Step {
        name: "cargo xtask python-wheel",
        what: "the ferry-tensors wheel (maturin build --release, abi3 manylinux) in an empty venv with no cargo or rustc on PATH: py.typed, stubtest, the `ferry` command, pytest",
        run: |sh| crate::python_wheel::PythonWheel { dev: false }.run(sh),
    },
    Step {
        name: "cargo xtask soak",
        what: "the short soak: `ferry serve` under kill loops, idle and slowloris connections, floods",
        run: |sh| crate::soak::Soak::CI.run(sh),
    },
    Step {
        name: "cargo xtask tidy",
        what: "repository rules: unsafe code only in src/sys/, file length, no public test modules, a schema for every wire type",
        run: |sh| Tidy.run(sh),
    },
    Step {
        name: "RUSTDOCFLAGS=-Dwarnings cargo doc --workspace --no-deps --locked",
        what: "rustdoc without warnings",
        run: |sh| Ok(cmd!(sh, "cargo doc --workspace --no-deps --locked").env("RUSTDOCFLAGS", "-Dwarnings").run()?),
    },
    Step {
        name: "cargo xtask conformance",
        what: "every backend and SDK through the same conformance suite (target/conformance.json)",
        run: |sh| Conformance::default().run(sh),
    },
    Step {
        name: "cargo xtask windows",
        what: "installs the x86_64-pc-windows-gnu target, and as root (apt-get) mingw and Wine, when missing; clippy for that target; the named-pipe, JSON-RPC and `ferry serve`/`call` tests under Wine",
        run: |sh| crate::windows::Windows.run(sh),
    },
    Step {
        name: "cargo check -p ferry --no-default-features --locked, then with each feature alone",
        what: "the `ferry` facade builds with no default features and with each of its features alone",
        run: facade_features_alone,
    },
];

/// Whether `cargo nextest` is installed.
fn has_nextest(sh: &Shell) -> bool {
    cmd!(sh, "cargo nextest --version").quiet().ignore_stdout().ignore_stderr().run().is_ok()
}

/// Every test: nextest, else `cargo test` (doctests included).
fn tests(sh: &Shell) -> anyhow::Result<()> {
    if has_nextest(sh) {
        Ok(cmd!(sh, "cargo nextest run --workspace --all-features --locked").run()?)
    } else {
        eprintln!("cargo-nextest is not installed: running `cargo test` instead");
        Ok(cmd!(sh, "cargo test --workspace --all-features --locked").run()?)
    }
}

/// The doctests, which nextest does not run (`cargo test` above already did without it).
fn doctests(sh: &Shell) -> anyhow::Result<()> {
    if has_nextest(sh) {
        Ok(cmd!(sh, "cargo test --workspace --doc --locked").run()?)
    } else {
        eprintln!("ran with `cargo test` in the step before");
        Ok(())
    }
}

/// `cargo check` of the facade with no default features, then with each feature alone.
fn facade_features_alone(sh: &Shell) -> anyhow::Result<()> {
    let manifest = sh.current_dir().join("ferry").join("Cargo.toml");
    let text =
        std::fs::read_to_string(&manifest).map_err(|e| anyhow::anyhow!("reading {}: {e}", manifest.display()))?;
    cmd!(sh, "cargo check -p ferry --no-default-features --locked").run()?;
    for feature in facade_features(&text) {
        cmd!(sh, "cargo check -p ferry --no-default-features --features {feature} --locked").run()?;
    }
    Ok(())
}

/// The steps as `cargo xtask help` lists them, under the `ci` command.
pub fn help_list() -> String {
    let mut out = String::new();
    for (i, step) in STEPS.iter().enumerate() {
        out.push_str(&format!("                           {:>2}. {}\n", i + 1, step.name));
    }
    out
}

/// The steps as the README lists them (between `<!-- ci-steps -->` and `<!-- /ci-steps -->`).
pub fn readme_list() -> String {
    let mut out = String::new();
    for (i, step) in STEPS.iter().enumerate() {
        out.push_str(&format!("{}. `{}`: {}\n", i + 1, step.name, step.what));
    }
    out
}

impl Ci {
    /// Parses `--list`.
    pub fn parse(mut flags: Flags) -> anyhow::Result<Ci> {
        let list = flags.flag("--list");
        flags.finish("ci")?;
        Ok(Ci { list })
    }

    /// Runs every step, stopping at the first failure (with `--list`: prints them).
    pub fn run(self, sh: &Shell) -> anyhow::Result<()> {
        if self.list {
            print!("{}", readme_list());
            return Ok(());
        }
        let mut notes = Vec::new();
        if !has_nextest(sh) {
            notes.push("cargo-nextest is not installed; ran `cargo test` instead".to_owned());
        }
        notes.extend(crate::rpc_clients::missing_tools(sh));
        notes.extend(crate::typescript_sdk::missing_tools(sh));
        if !crate::python_sdk::has_python(sh) {
            notes.push("python3 is missing: the Python package's checks were SKIPPED".to_owned());
        }
        let total = STEPS.len();
        let started = Instant::now();
        let mut done: Vec<(&str, f64)> = Vec::new();
        let mut failed: Option<(&str, f64, anyhow::Error)> = None;
        for (i, step) in STEPS.iter().enumerate() {
            eprintln!("\n==> [{}/{total}] {}", i + 1, step.name);
            let t = Instant::now();
            let result = (step.run)(sh);
            let secs = t.elapsed().as_secs_f64();
            // A full disk fails a later step in its own words (a linker error, Wine's
            // "could not load kernel32.dll"): the free space after each step says when.
            let dir = crate::target_dir(sh).ok().filter(|d| d.exists()).unwrap_or_else(crate::project_root);
            if let Some(free) = crate::free_disk(sh, &dir) {
                eprintln!("==> {} free on the build's disk", crate::gib(free));
            }
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

    #[test]
    fn the_readme_lists_every_ci_step_in_order() {
        let readme = std::fs::read_to_string(crate::project_root().join("README.md")).unwrap();
        let (_, rest) = readme.split_once("<!-- ci-steps -->\n").expect("README.md has no <!-- ci-steps --> line");
        let (listed, _) = rest.split_once("<!-- /ci-steps -->").expect("README.md has no <!-- /ci-steps --> line");
        assert_eq!(
            listed,
            readme_list(),
            "README.md's list of CI steps is stale (`cargo xtask ci --list` prints it); it should read:\n{}",
            readme_list()
        );
    }

    #[test]
    fn the_help_lists_every_ci_step() {
        let help = crate::usage();
        for step in STEPS {
            assert!(help.contains(step.name), "`cargo xtask help` does not list {}", step.name);
        }
    }
}
