//! The client side of the `ferry` Python package (`bindings/python`: `ferry.Client`, the
//! generated clients in `ferry.generated`) as the `python-sdk` column of
//! `cargo xtask conformance`, and the helpers the Python steps share.
//!
//! - The column runs `bindings/python/tests/client/test_conformance.py` (the scenario of
//!   `tests/client/scenario.py`, through the generated conformance client on the native
//!   `ferry.Client`) with `FERRY_CONFORMANCE_REPORT=target/conformance/python-sdk.json`
//!   (the report format of [`crate::conformance`]), in the venv `cargo xtask python-server`
//!   installs the package into ([`crate::python_server::install_dev`]).
//! - The package's own checks and tests (the client tests included, `tests/client/`) are
//!   `cargo xtask python-server`'s.
//!
//! Without `python3` the column says so loudly and does not pass silently: it is "not
//! viable".

use std::path::{Path, PathBuf};

use xshell::{Shell, cmd};

use crate::conformance::{Column, OtherServer, REPORT_ENV, Report};

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

/// Builds the `ferry` binary (debug, or release) and returns its path. With `quic` (as
/// `cargo xtask soak` builds it, so the two share their build): the Python tests serve a
/// store on a `quic://` address.
pub fn ferry_bin(sh: &Shell, release: bool) -> anyhow::Result<PathBuf> {
    let flag = release.then_some("--release");
    cmd!(sh, "cargo build -p ferry-cli --bin ferry --features quic --locked {flag...}").run()?;
    let bin = crate::target_dir(sh)?.join(if release { "release" } else { "debug" }).join("ferry");
    anyhow::ensure!(bin.exists(), "cargo build -p ferry-cli made no {}", bin.display());
    Ok(bin)
}

/// The `python-sdk` column of `cargo xtask conformance`, and the problems running it.
pub fn python_column(sh: &Shell, report_dir: &Path, release: bool) -> (Column, Vec<String>) {
    if !has_python(sh) {
        loud(&format!("python3 not found: the {PYTHON_SDK} conformance column is NOT viable"));
        let report = Report::broken(PYTHON_SDK, "python3 not found".to_owned());
        return (Column { name: PYTHON_SDK.to_owned(), report }, Vec::new());
    }
    match crate::python_server::install_dev(sh) {
        Ok(python) => python_scenario(sh, &python, report_dir, release, None),
        Err(e) => {
            let reason = format!("installing the ferry package failed: {e:#}");
            let report = Report::broken(PYTHON_SDK, reason.clone());
            (Column { name: PYTHON_SDK.to_owned(), report }, vec![format!("{PYTHON_SDK}: {reason}")])
        }
    }
}

/// The Python client's scenario, run by `python` (a venv with the package installed),
/// against `ferry serve --api conformance`, or against `server` (another implementation of
/// the conformance API): its report is then named after the server's column, in
/// `<column>-python-sdk.json`.
pub fn python_scenario(
    sh: &Shell,
    python: &Path,
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
        let ferry = ferry_bin(sh, release)?;
        // From the package (its tests import as `tests.client`), the installed `ferry`.
        let _dir = sh.push_dir(root.join("bindings/python"));
        let tests = root.join("bindings/python/tests/client/test_conformance.py");
        let mut c = cmd!(sh, "{python} -m pytest -q -p no:cacheprovider {tests}")
            .env("FERRY_BIN", ferry)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env_remove("PYTHONPATH")
            .env(REPORT_ENV, &report_path);
        for (k, v) in server.map(OtherServer::envs).into_iter().flatten() {
            c = c.env(k, v);
        }
        c.run()?;
        Ok(())
    };
    let status = run();
    if let Err(e) = &status {
        problems.push(format!("{column}: the Python client scenario failed: {e:#}"));
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
