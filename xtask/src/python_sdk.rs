//! The Python SDK (`sdks/python`): `cargo xtask sdk-python` (its CI step), its column of
//! `cargo xtask conformance` (`python-sdk`), and `cargo xtask bench-sdk`.
//!
//! - A venv at `target/sdk-venv` (in cargo's target directory, `$CARGO_TARGET_DIR` when
//!   set, as is the `ferry` binary the tests use; `python3 -m venv`, made once) gets the pinned tools of
//!   `sdks/python/requirements-dev.txt` (numpy, pytest, mypy, ruff) and, on every run, a
//!   fresh `pip install ./sdks/python`, so the tests exercise the installed package, as a
//!   user gets it.
//! - `sdk-python` runs `ruff format --check` and `ruff check` (the package, its tests and
//!   bench, and the generator's Python snapshots), `mypy --strict` (same files), then
//!   `pytest` against real `ferry serve` processes (`FERRY_BIN`: the freshly built binary):
//!   once on the installed package (its hot modules compiled with mypyc where a C compiler
//!   is), once more on the source tree, interpreted.
//! - `sdk-python-install` does what a newcomer does: `pip install ./sdks/python` in an
//!   empty venv, then again with `FERRY_PURE_PYTHON=1`, and checks each installed package
//!   (compiled or not as expected; a generated client calls `ferry serve`).
//! - The conformance column runs `tests/test_conformance.py` with
//!   `FERRY_CONFORMANCE_REPORT=target/conformance/python-sdk.json` (the report format of
//!   [`crate::conformance`]).
//! - `bench-sdk` builds `ferry` with `--release` and runs `sdks/python/bench/bench_rtt.py`.
//!
//! Without `python3` every one of these says so loudly and does not pass silently: the CI
//! step is skipped with a banner and a note, the conformance column is "not viable".

use std::path::{Path, PathBuf};

use anyhow::Context;
use xshell::{Shell, cmd};

use crate::conformance::{Column, OtherServer, REPORT_ENV, Report};
use crate::flags::Flags;

/// The conformance column's name.
pub const PYTHON_SDK: &str = "python-sdk";

/// Whether `python3` runs here.
pub fn has_python(sh: &Shell) -> bool {
    cmd!(sh, "python3 --version").quiet().ignore_stdout().ignore_stderr().run().is_ok()
}

fn loud(msg: &str) {
    let bar = "!".repeat(78);
    eprintln!("\n{bar}\n!! SKIPPED: {msg}\n{bar}\n");
}

/// Makes (once) the venv, installs the pinned tools and (every time) the package itself;
/// returns the venv's python.
fn venv(sh: &Shell, root: &Path) -> anyhow::Result<PathBuf> {
    let venv = crate::target_dir(sh)?.join("sdk-venv");
    let python = venv.join("bin").join("python");
    if !python.exists() {
        cmd!(sh, "python3 -m venv {venv}").run()?;
    }
    let reqs = root.join("sdks/python/requirements-dev.txt");
    cmd!(sh, "{python} -m pip install --quiet --disable-pip-version-check -r {reqs}").run()?;
    let package = root.join("sdks/python");
    cmd!(sh, "{python} -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall {package}")
        .run()
        .context("pip install ./sdks/python")?;
    Ok(python)
}

/// Builds the `ferry` binary (debug, or release) and returns its path.
pub fn ferry_bin(sh: &Shell, release: bool) -> anyhow::Result<PathBuf> {
    let flag = release.then_some("--release");
    cmd!(sh, "cargo build -p ferry-cli --bin ferry --locked {flag...}").run()?;
    let bin = crate::target_dir(sh)?.join(if release { "release" } else { "debug" }).join("ferry");
    anyhow::ensure!(bin.exists(), "cargo build -p ferry-cli made no {}", bin.display());
    Ok(bin)
}

/// `cargo xtask sdk-python`.
pub struct SdkPython;

impl SdkPython {
    /// Parses the (empty) argument list.
    pub fn parse(flags: Flags) -> anyhow::Result<SdkPython> {
        flags.finish("sdk-python")?;
        Ok(SdkPython)
    }

    /// Format, lint and type checks, then the tests.
    pub fn run(self, sh: &Shell) -> anyhow::Result<()> {
        let root = sh.current_dir();
        if !has_python(sh) {
            loud("python3 not found: the Python SDK was NOT installed, type-checked or tested");
            return Ok(());
        }
        let python = venv(sh, &root)?;
        let ferry = ferry_bin(sh, false)?;
        let _dir = sh.push_dir(root.join("sdks/python"));
        let snapshots: Vec<PathBuf> = python_snapshots(&root)?;
        let snaps = &snapshots;
        let checked = ["ferry_client", "tests", "bench", "examples"];
        // (setup.py: linted, not type-checked: setuptools ships no types in every version.)
        cmd!(sh, "{python} -m ruff format --check {checked...} setup.py {snaps...}").run()?;
        cmd!(sh, "{python} -m ruff check {checked...} setup.py {snaps...}").run()?;
        // mypy also reads the package's config from pyproject.toml.
        cmd!(sh, "{python} -m mypy --strict {checked...} {snaps...}").run()?;
        drop(_dir);
        // The installed package: compiled with mypyc where a C compiler is (setup.py). The
        // tests check that it was (`FERRY_EXPECT_COMPILED`), so a silent fallback to pure
        // Python shows.
        let compiler = has_c_compiler(sh);
        let _expect = sh.push_env("FERRY_EXPECT_COMPILED", if compiler { "1" } else { "0" });
        pytest(sh, &root, &python, &ferry, "tests")?;
        if compiler {
            let stray = stray_extensions(&root)?;
            anyhow::ensure!(
                stray.is_empty(),
                "compiled modules in the source tree would shadow its .py files (left by `pip install -e`?); \
                 remove them: {stray:?}"
            );
            // And the same source interpreted, as a machine without a compiler runs it.
            let _pure = sh.push_env("PYTHONPATH", root.join("sdks/python"));
            let _expect = sh.push_env("FERRY_EXPECT_COMPILED", "0");
            eprintln!("xtask: the Python SDK's tests again, interpreted (the source tree)");
            pytest(sh, &root, &python, &ferry, "tests")?;
        }
        Ok(())
    }
}

/// `cargo xtask sdk-python-install`: what a newcomer does, checked. For each of the two
/// ways the README gives (`pip install ./sdks/python`, and the same with
/// `FERRY_PURE_PYTHON=1`), a brand-new venv (`python3 -m venv --clear`: pip and nothing
/// else) installs the package exactly so, and `sdks/python/tests/check_install.py`, run by
/// that venv's python outside the source tree, checks that it imports from the venv, is
/// compiled (mypyc, where a C compiler is) or pure Python as asked, and that its generated
/// demo client calls a real `ferry serve`.
pub struct SdkPythonInstall;

impl SdkPythonInstall {
    /// Parses the (empty) argument list.
    pub fn parse(flags: Flags) -> anyhow::Result<SdkPythonInstall> {
        flags.finish("sdk-python-install")?;
        Ok(SdkPythonInstall)
    }

    /// Both installs, each in an empty venv, and their checks.
    pub fn run(self, sh: &Shell) -> anyhow::Result<()> {
        let root = sh.current_dir();
        if !has_python(sh) {
            loud("python3 not found: `pip install ./sdks/python` was NOT checked");
            return Ok(());
        }
        let ferry = ferry_bin(sh, false)?;
        let target = crate::target_dir(sh)?;
        let compiler = c_compiler_answers(sh);
        if !compiler {
            eprintln!("xtask: no C compiler here: the plain install is expected to fall back to pure Python");
        }
        for pure in [false, true] {
            let venv = target.join(if pure { "fresh-venv-pure" } else { "fresh-venv" });
            let what = if pure { "FERRY_PURE_PYTHON=1 pip install ./sdks/python" } else { "pip install ./sdks/python" };
            eprintln!("xtask: {what}, in an empty venv ({})", venv.display());
            cmd!(sh, "python3 -m venv --clear {venv}").run()?;
            let (pip, python) = (venv.join("bin/pip"), venv.join("bin/python"));
            let mut install = cmd!(sh, "{pip} install ./sdks/python").env_remove("FERRY_PURE_PYTHON");
            if pure {
                install = install.env("FERRY_PURE_PYTHON", "1");
            }
            install.run().with_context(|| format!("`{what}` in an empty venv failed"))?;
            let expect = if compiler && !pure { "1" } else { "0" };
            let script = root.join("sdks/python/tests/check_install.py");
            // From the target directory, so that the source tree is not on sys.path.
            let _dir = sh.push_dir(&target);
            cmd!(sh, "{python} {script} --expect-compiled {expect}")
                .env("FERRY_BIN", &ferry)
                .env_remove("PYTHONPATH")
                .run()
                .with_context(|| format!("the package `{what}` installed does not work"))?;
        }
        Ok(())
    }
}

/// Whether a C compiler (`$CC`'s program, else `cc`) answers.
fn c_compiler_answers(sh: &Shell) -> bool {
    let cc = std::env::var("CC").ok().and_then(|v| v.split_whitespace().next().map(str::to_owned));
    let cc = cc.unwrap_or_else(|| "cc".into());
    cmd!(sh, "{cc} --version").quiet().ignore_stdout().ignore_stderr().run().is_ok()
}

/// Whether `pip install ./sdks/python` compiles the hot modules here: a C compiler (`$CC`'s
/// program, else `cc`) answers, and `FERRY_PURE_PYTHON` does not ask for pure Python.
fn has_c_compiler(sh: &Shell) -> bool {
    if std::env::var("FERRY_PURE_PYTHON").is_ok_and(|v| !v.is_empty() && v != "0") {
        return false;
    }
    c_compiler_answers(sh)
}

/// Compiled modules in the source tree (`pip install -e` puts them there) would shadow the
/// `.py` files the interpreted test run means to test.
fn stray_extensions(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(root.join("sdks/python/ferry_client"))? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "so" || x == "pyd") {
            out.push(p);
        }
    }
    Ok(out)
}

/// Runs pytest on `sdks/python/{what}` from `target/`, so that `import ferry_client` finds
/// the installed package (as a user gets it), not the source tree.
fn pytest(sh: &Shell, root: &Path, python: &Path, ferry: &Path, what: &str) -> anyhow::Result<()> {
    let _dir = sh.push_dir(crate::target_dir(sh)?);
    let tests = root.join("sdks/python").join(what);
    cmd!(sh, "{python} -m pytest -q -p no:cacheprovider {tests}")
        .env("FERRY_BIN", ferry)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .run()?;
    Ok(())
}

/// The generator's Python snapshot outputs (`sdk-gen/tests/data/*.py`), type-checked as
/// well: they exercise every construct the emitter has.
fn python_snapshots(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let dir = root.join("sdk-gen/tests/data");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "py") {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// The `python-sdk` column of `cargo xtask conformance`, and the problems running it.
pub fn python_column(sh: &Shell, report_dir: &Path, release: bool) -> (Column, Vec<String>) {
    python_scenario(sh, report_dir, release, None)
}

/// The Python SDK's scenario against `server` (another implementation of the conformance
/// API) instead of `ferry serve --api conformance`: its report is named after the server's
/// column, in `<column>-python-sdk.json`.
pub fn python_scenario(
    sh: &Shell,
    report_dir: &Path,
    release: bool,
    server: Option<&OtherServer>,
) -> (Column, Vec<String>) {
    let root = sh.current_dir();
    let column = server.map_or(PYTHON_SDK, |s| s.column.as_str());
    let file = server.map_or_else(|| format!("{PYTHON_SDK}.json"), |s| format!("{}-{PYTHON_SDK}.json", s.column));
    let report_path = report_dir.join(file);
    let _ = std::fs::remove_file(&report_path);
    if !has_python(sh) {
        loud(&format!("python3 not found: the {column} conformance column is NOT viable"));
        let report = Report::broken(column, "python3 not found".to_owned());
        return (Column { name: column.to_owned(), report }, Vec::new());
    }
    let mut problems = Vec::new();
    let run = || -> anyhow::Result<()> {
        let python = venv(sh, &root)?;
        let ferry = ferry_bin(sh, release)?;
        let _dir = sh.push_dir(crate::target_dir(sh)?);
        let tests = root.join("sdks/python/tests/test_conformance.py");
        let mut c = cmd!(sh, "{python} -m pytest -q -p no:cacheprovider {tests}")
            .env("FERRY_BIN", ferry)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env(REPORT_ENV, &report_path);
        for (k, v) in server.map(OtherServer::envs).into_iter().flatten() {
            c = c.env(k, v);
        }
        c.run()?;
        Ok(())
    };
    let status = run();
    if let Err(e) = &status {
        problems.push(format!("{column}: the Python SDK scenario failed: {e:#}"));
    }
    let report = match std::fs::read_to_string(&report_path) {
        Ok(text) => Report::parse(&text).unwrap_or_else(|e| Report::broken(column, format!("{e:#}"))),
        Err(_) => {
            problems.push(format!("{column}: no report at {}", report_path.display()));
            Report::broken(column, "no report (see the output above)".to_owned())
        }
    };
    (Column { name: column.to_owned(), report }, problems)
}

/// `cargo xtask bench-sdk [ARGS..]`: the Python SDK's round trips beside bare Python
/// socket round trips, against a release `ferry serve` (arguments go to the script).
pub struct BenchSdk {
    args: Vec<String>,
}

impl BenchSdk {
    /// Takes every argument for the script.
    pub fn parse(flags: Flags) -> anyhow::Result<BenchSdk> {
        Ok(BenchSdk { args: flags.into_rest() })
    }

    /// Builds, installs and runs the benchmark.
    pub fn run(self, sh: &Shell) -> anyhow::Result<()> {
        let root = sh.current_dir();
        anyhow::ensure!(has_python(sh), "python3 not found: the Python SDK benchmark needs python3 with numpy");
        let python = venv(sh, &root)?;
        let ferry = ferry_bin(sh, true)?;
        let script = root.join("sdks/python/bench/bench_rtt.py");
        let args = self.args;
        cmd!(sh, "{python} {script} {args...}").env("FERRY_BIN", &ferry).run()?;
        Ok(())
    }
}
