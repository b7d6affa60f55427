//! The `ferry` Python package (`bindings/python`: serving, `ferry.Client`, pipes, the
//! store, generated clients; the one Python package, on the Rust core): `cargo xtask
//! python-server` (its CI step) and `cargo xtask bench-python-server`.
//!
//! `python-server` does what a user does, then checks the result:
//! - `pip install ./bindings/python` into an empty venv
//!   (`target/python-server-venv`, cleared each run): maturin from PyPI builds the native
//!   module with this machine's Rust toolchain. The tests build it with cargo's `dev`
//!   profile and the test-only feature `__testing` ([`DEV_MATURIN_ARGS`]: the simulated
//!   GPU of the cuda-ipc tests, never in a user's wheel): it reuses the dependencies the
//!   workspace's tests compiled, where the release build a user gets costs ~3.5 minutes of
//!   CI on 2 cores, and debug assertions and overflow checks run under the tests too. The
//!   benchmark builds release, as a user does;
//! - the pinned tools of `bindings/python/requirements-dev.txt`;
//! - `ruff format --check` and `ruff check` (package, tests, bench, examples), `mypy
//!   --strict` (package, and the Python emitter's snapshots `sdk-gen/tests/data/*.py`,
//!   which import `ferry`), `mypy.stubtest ferry._native` (the checked-in stubs match the
//!   compiled module);
//! - pytest on `bindings/python/tests` (the client side's in `tests/client`: the
//!   conformance scenario, generated clients, references, the store, placement) against
//!   the installed package, `FERRY_BIN` the
//!   freshly built `ferry`, with a real torch ([`TORCH`], CPU use): PyPI has only its
//!   CUDA build, whose dependencies are ~3 GB to download and 5.3 GB installed (~100 s
//!   here, and pip's cache does not help: the registry mirror sends no cache headers), so
//!   it is installed once into a cache venv outside the checkout
//!   (`$FERRY_TORCH_CACHE`, default `~/.cache/ferry/torch-VERSION`) and made importable
//!   in the test venv by a `.pth` file. `FERRY_NO_TORCH=1` skips it (the torch tests then
//!   say they are skipped).
//!
//! - Ray ([`crate::bench_ray::add_ray`]) for `tests/test_ray.py` (`FERRY_NO_RAY=1` skips it);
//! - the Python server's soak in its short mode ([`soak`]).
//!
//! `bench-python-server` runs `bindings/python/bench/bench_server.py` with that venv and a
//! release `ferry`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use xshell::{Shell, cmd};

use crate::conformance::{Column, OtherServer, Report, merge_columns};
use crate::flags::Flags;

/// The conformance column: the conformance API served from Python.
pub const COLUMN: &str = "python-server";

/// The `python-server` column of `cargo xtask conformance`: the conformance API implemented
/// in Python (`bindings/python/tests/conformance_app.py`, served by `python -m ferry serve`
/// from the installed package), exercised by the Rust RPC client's cases, the Python SDK's
/// scenario and the TypeScript SDK's scenario, merged into one column (an `sdk::` case
/// passes when both SDKs' runs of it pass).
pub fn conformance_column(sh: &Shell, report_dir: &Path, release: bool) -> (Column, Vec<String>) {
    let root = sh.current_dir();
    let python = match install_dev(sh) {
        Ok(p) => p,
        Err(e) => {
            let reason = format!("installing the package failed: {e:#}");
            let report = Report::broken(COLUMN, reason.clone());
            return (Column { name: COLUMN.to_owned(), report }, vec![format!("{COLUMN}: {reason}")]);
        }
    };
    let app_dir = root.join("bindings/python/tests");
    let command =
        format!("{} -m ferry serve conformance_app:app {{addr}} --app-dir {}", python.display(), app_dir.display());
    if command.split_whitespace().count() != 8 {
        let reason = format!("the command line `{command}` is split on whitespace: a path holds a space");
        let report = Report::broken(COLUMN, reason.clone());
        return (Column { name: COLUMN.to_owned(), report }, vec![format!("{COLUMN}: {reason}")]);
    }
    let server = OtherServer { column: COLUMN.to_owned(), command };
    let (rust, mut problems) = crate::conformance::rpc_cases(sh, report_dir, release, Some(&server));
    let (py, p) = crate::python_sdk::python_scenario(sh, &python, report_dir, release, Some(&server));
    problems.extend(p);
    let (ts, p) = crate::typescript_sdk::scenario(sh, report_dir, Some(&server));
    problems.extend(p);
    let column = merge_columns(COLUMN, vec![("rust", rust), ("python-sdk", py), ("typescript-sdk", ts)]);
    let merged = report_dir.join(format!("{COLUMN}.json"));
    if let Err(e) = std::fs::write(&merged, column.report.to_json().to_string() + "\n") {
        problems.push(format!("{COLUMN}: writing {}: {e}", merged.display()));
    }
    (column, problems)
}

/// The torch the tests use.
pub const TORCH: &str = "2.15.0";

/// The cache venv holding torch (made once), and a `.pth` line in the test venv's
/// site-packages that puts its site-packages on `sys.path` (after the venv's own).
pub(crate) fn add_torch(sh: &Shell, python: &Path) -> anyhow::Result<()> {
    if std::env::var("FERRY_NO_TORCH").is_ok_and(|v| !v.is_empty() && v != "0") {
        eprintln!("xtask: FERRY_NO_TORCH is set: the torch tests will be skipped");
        return Ok(());
    }
    let cache = match std::env::var_os("FERRY_TORCH_CACHE") {
        Some(d) => PathBuf::from(d),
        None => {
            let home = std::env::var_os("HOME").context("HOME is not set (or set FERRY_TORCH_CACHE)")?;
            PathBuf::from(home).join(".cache/ferry").join(format!("torch-{TORCH}"))
        }
    };
    let torch_python = cache.join("bin/python");
    let check = "import sys, sysconfig; print(sysconfig.get_paths()['purelib'])";
    if !torch_python.exists() || cmd!(sh, "{torch_python} -c 'import torch'").quiet().ignore_stderr().run().is_err() {
        eprintln!("xtask: installing torch {TORCH} once into {} (~3 GB download, ~100 s)", cache.display());
        cmd!(sh, "python3 -m venv --clear {cache}").run()?;
        cmd!(sh, "{torch_python} -m pip install --quiet --disable-pip-version-check torch=={TORCH}")
            .run()
            .context("installing torch into its cache venv (FERRY_NO_TORCH=1 skips the torch tests)")?;
    }
    let torch_site = cmd!(sh, "{torch_python} -c {check}").read()?;
    let site = cmd!(sh, "{python} -c {check}").read()?;
    std::fs::write(Path::new(site.trim()).join("ferry-ci-torch.pth"), format!("{}\n", torch_site.trim()))?;
    cmd!(sh, "{python} -c 'import torch; print(\"xtask: torch\", torch.__version__)'")
        .run()
        .context("torch from the cache venv does not import in the test venv")?;
    Ok(())
}

/// maturin's arguments for the test venv's build: the `dev` profile and the test-only
/// feature `__testing` (the in-memory CUDA driver the cuda-ipc tests run on).
pub const DEV_MATURIN_ARGS: &str = "--profile dev --features __testing";

/// The cargo profile maturin builds the native module with.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Profile {
    /// `dev`: for the tests (see the module docs).
    Dev,
    /// `release`: what `pip install` gives a user, for the benchmark.
    Release,
}

/// The test venv with the package installed (dev profile), made if need be; installed
/// once per xtask run (the `python-sdk` and `python-server` conformance columns share it).
pub fn install_dev(sh: &Shell) -> anyhow::Result<PathBuf> {
    static INSTALLED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    if let Some(p) = INSTALLED.get() {
        return Ok(p.clone());
    }
    let python = install(sh, &sh.current_dir(), false, Profile::Dev)?;
    Ok(INSTALLED.get_or_init(|| python).clone())
}

/// Makes the empty venv and installs the package as a user would, plus the dev tools.
fn install(sh: &Shell, root: &Path, clear: bool, profile: Profile) -> anyhow::Result<PathBuf> {
    anyhow::ensure!(
        crate::python_sdk::has_python(sh),
        "python3 not found: the ferry Python package needs python3 >= 3.10"
    );
    let venv = crate::target_dir(sh)?.join("python-server-venv");
    let python = venv.join("bin").join("python");
    if clear || !python.exists() {
        cmd!(sh, "python3 -m venv --clear {venv}").run()?;
    }
    let package = root.join("bindings/python");
    let pip = cmd!(sh, "{python} -m pip install --quiet --disable-pip-version-check {package}");
    let pip = match profile {
        // The dev build also has the test-only simulated GPU (`__testing`), for the
        // cuda-ipc tests (`tests/test_cuda.py`, `tests/client/test_cuda.py`); the release
        // build, like a user's wheel, has not (those tests then skip, saying why).
        Profile::Dev => pip.env("MATURIN_PEP517_ARGS", DEV_MATURIN_ARGS),
        Profile::Release => pip.env_remove("MATURIN_PEP517_ARGS"),
    };
    let built = if profile == Profile::Dev { "dev profile" } else { "release" };
    eprintln!("xtask: pip install ./bindings/python (maturin builds the native module, {built})");
    pip.run().context("`pip install ./bindings/python` failed")?;
    let reqs = root.join("bindings/python/requirements-dev.txt");
    cmd!(sh, "{python} -m pip install --quiet --disable-pip-version-check -r {reqs}").run()?;
    Ok(python)
}

/// The venv with the package built as a user gets it (release), for the benchmarks.
pub(crate) fn install_release(sh: &Shell, root: &Path) -> anyhow::Result<PathBuf> {
    install(sh, root, false, Profile::Release)
}

/// `cargo xtask python-server`.
pub struct PythonServer;

impl PythonServer {
    /// Parses the (empty) argument list.
    pub fn parse(flags: Flags) -> anyhow::Result<PythonServer> {
        flags.finish("python-server")?;
        Ok(PythonServer)
    }

    /// Installs, lints, type-checks and tests the package.
    pub fn run(self, sh: &Shell) -> anyhow::Result<()> {
        let root = sh.current_dir();
        let python = install(sh, &root, true, Profile::Dev)?;
        let pkg = root.join("bindings/python");
        let sources: Vec<PathBuf> = ["python", "tests", "bench"]
            .iter()
            .map(|d| pkg.join(d))
            .chain(std::iter::once(root.join("examples/python")))
            .filter(|p| p.exists())
            .collect();
        let config = pkg.join("pyproject.toml");
        let sources = &sources;
        {
            // From the package: ruff resolves the config's relative paths (`src`, which makes
            // `ferry` first-party) against the working directory.
            let _dir = sh.push_dir(&pkg);
            cmd!(sh, "{python} -m ruff format --check --config {config} {sources...}").run().context("ruff format")?;
            cmd!(sh, "{python} -m ruff check --config {config} {sources...}").run().context("ruff check")?;
            let snapshots = python_snapshots(&root)?;
            let snaps = &snapshots;
            // (ferry-sdk-gen writes Python formatted at ruff's default width, 88 columns.)
            cmd!(sh, "{python} -m ruff format --check --line-length 88 {snaps...}").run().context("ruff format")?;
            cmd!(sh, "{python} -m mypy --config-file {config} python/ferry {snaps...}")
                .run()
                .context("mypy --strict")?;
        }
        {
            // From the target directory: the installed module, not the source tree.
            let _dir = sh.push_dir(crate::target_dir(sh)?);
            cmd!(sh, "{python} -m mypy.stubtest ferry._native")
                .run()
                .context("the stubs (bindings/python/python/ferry/_native.pyi) do not match the module")?;
        }
        add_torch(sh, &python)?;
        crate::bench_ray::add_ray(sh, &python)?;
        let ferry = crate::python_sdk::ferry_bin(sh, false)?;
        let _dir = sh.push_dir(&pkg);
        cmd!(sh, "{python} -m pytest -q -p no:cacheprovider tests")
            .env("FERRY_BIN", &ferry)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env_remove("PYTHONPATH")
            .run()
            .context("pytest bindings/python/tests")?;
        drop(_dir);
        soak_with(sh, &root, &python, false)
    }
}

/// The Python server's soak, `bindings/python/bench/soak_server.py` (issue 43 points 2
/// and 4: cancelled, abandoned and hanging calls, big JSON params, under a canary): short
/// counts as a step of `python-server`, the full ones from `cargo xtask soak --full`, which
/// installs the package (release, as a user gets it) into the venv first.
pub fn soak(sh: &Shell, full: bool) -> anyhow::Result<()> {
    let root = sh.current_dir();
    let python = install(sh, &root, false, if full { Profile::Release } else { Profile::Dev })?;
    soak_with(sh, &root, &python, full)
}

fn soak_with(sh: &Shell, root: &Path, python: &Path, full: bool) -> anyhow::Result<()> {
    let _dir = sh.push_dir(root.join("bindings/python/bench"));
    let full = full.then_some("--full");
    cmd!(sh, "{python} soak_server.py {full...}")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("PYTHONPATH")
        .run()
        .context("the Python server's soak (bindings/python/bench/soak_server.py)")?;
    Ok(())
}

/// The Python emitter's snapshot outputs (`sdk-gen/tests/data/*.py`), checked as well:
/// they exercise every construct the emitter has, on the `ferry` package.
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

/// `cargo xtask bench-python-server [ARGS..]`.
pub struct BenchPythonServer {
    args: Vec<String>,
}

impl BenchPythonServer {
    /// Takes every argument for the script.
    pub fn parse(flags: Flags) -> anyhow::Result<BenchPythonServer> {
        Ok(BenchPythonServer { args: flags.into_rest() })
    }

    /// Installs (once), builds a release `ferry` and runs the benchmark.
    pub fn run(self, sh: &Shell) -> anyhow::Result<()> {
        let root = sh.current_dir();
        let python = install(sh, &root, false, Profile::Release)?;
        let ferry = crate::python_sdk::ferry_bin(sh, true)?;
        let bench = root.join("bindings/python/bench");
        let _dir = sh.push_dir(&bench);
        let args = self.args;
        cmd!(sh, "{python} bench_server.py {args...}").env("FERRY_BIN", &ferry).run()?;
        Ok(())
    }
}
