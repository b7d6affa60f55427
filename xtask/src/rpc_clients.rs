//! `cargo xtask rpc-clients`: third-party JSON-RPC clients and an OpenRPC validator
//! against `ferry serve` (the ignored tests of `cli/tests/external_clients.rs`).
//!
//! - Python: makes (once) a venv at `target/venv` with `python3 -m venv`, installs the
//!   pinned `rpc/tests/py/requirements.txt` (jsonrpcclient) into it, and runs the Python
//!   check with `FERRY_TEST_PYTHON=target/venv/bin/python`.
//! - Node: `npm ci` in `rpc/tests/js` (committed `package-lock.json`: @open-rpc/client-js,
//!   @open-rpc/schema-utils-js), then runs the Node check with `FERRY_TEST_NODE=node`.
//! - Both need the package registries (PyPI, npm) on the first run. A missing `python3` or
//!   `npm`/`node` skips that half with a loud message (never a silent pass); everything
//!   else failing fails the step.

use std::path::Path;

use xshell::{Shell, cmd};

use crate::flags::Flags;

/// `cargo xtask rpc-clients`.
pub struct RpcClients;

/// The Python test of `cli/tests/external_clients.rs`.
const PYTHON_TEST: &str = "python_jsonrpcclient";
/// The Node test of `cli/tests/external_clients.rs`.
const NODE_TEST: &str = "node_open_rpc_client_and_validator";

fn has(sh: &Shell, program: &str) -> bool {
    cmd!(sh, "{program} --version").quiet().ignore_stdout().ignore_stderr().run().is_ok()
}

fn loud(msg: &str) {
    let bar = "!".repeat(78);
    eprintln!("\n{bar}\n!! SKIPPED: {msg}\n{bar}\n");
}

/// What is missing to run every check, as notes for the CI summary.
pub fn missing_tools(sh: &Shell) -> Vec<String> {
    let mut notes = Vec::new();
    if !has(sh, "python3") {
        notes.push("python3 is missing: the jsonrpcclient (PyPI) check of `xtask rpc-clients` was SKIPPED".to_owned());
    }
    if !has(sh, "npm") || !has(sh, "node") {
        notes.push("npm/node is missing: the @open-rpc (npm) checks of `xtask rpc-clients` were SKIPPED".to_owned());
    }
    notes
}

impl RpcClients {
    /// Parses the (empty) argument list.
    pub fn parse(flags: Flags) -> anyhow::Result<RpcClients> {
        flags.finish("rpc-clients")?;
        Ok(RpcClients)
    }

    /// Installs what the checks need and runs them.
    pub fn run(self, sh: &Shell) -> anyhow::Result<()> {
        let mut tests: Vec<&str> = Vec::new();
        let mut envs: Vec<(&str, String)> = Vec::new();

        if has(sh, "python3") {
            let venv = crate::target_dir(sh)?.join("venv");
            let python = venv.join("bin").join("python");
            if !python.exists() {
                cmd!(sh, "python3 -m venv {venv}").run()?;
            }
            let reqs = Path::new("rpc/tests/py/requirements.txt");
            cmd!(sh, "{python} -m pip install --quiet --disable-pip-version-check -r {reqs}").run()?;
            envs.push(("FERRY_TEST_PYTHON", python.display().to_string()));
            tests.push(PYTHON_TEST);
        } else {
            loud("python3 not found: the third-party Python client (jsonrpcclient) was NOT tested");
        }

        if has(sh, "npm") && has(sh, "node") {
            cmd!(sh, "npm ci --prefix rpc/tests/js --no-audit --no-fund --loglevel=error").run()?;
            envs.push(("FERRY_TEST_NODE", "node".to_owned()));
            tests.push(NODE_TEST);
        } else {
            loud("npm/node not found: @open-rpc/client-js and the OpenRPC validation were NOT tested");
        }

        if tests.is_empty() {
            loud("neither python3 nor npm: no third-party client was tested");
            return Ok(());
        }
        let mut c = cmd!(
            sh,
            "cargo test -p ferry-cli --features http --locked --test external_clients -- --ignored --exact {tests...}"
        );
        for (k, v) in envs {
            c = c.env(k, v);
        }
        c.run()?;
        Ok(())
    }
}
