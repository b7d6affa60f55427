//! Third-party JSON-RPC clients and an OpenRPC validator against `ferry serve`:
//! - Python `jsonrpcclient` (PyPI) over the unix socket (newline-delimited) and HTTP:
//!   `rpc/tests/py/clients.py`;
//! - Node `@open-rpc/client-js` over HTTP and the unix socket, and
//!   `@open-rpc/schema-utils-js` validating `rpc.discover` against the OpenRPC
//!   meta-schema: `rpc/tests/js/clients.mjs`.
//!
//! They need tools outside cargo, so they are `#[ignore]`d here and run by
//! `cargo xtask ci` (step "rpc: third-party clients"), which makes the Python venv
//! (`target/venv`), runs `npm ci` in `rpc/tests/js`, and sets `FERRY_TEST_PYTHON` /
//! `FERRY_TEST_NODE`. By hand: `cargo xtask rpc-clients`.
#![cfg(feature = "http")]

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::{Served, run};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn tool(var: &str, what: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: it names the {what} to use; run these tests with `cargo xtask rpc-clients`")
    })
}

fn check(mut cmd: Command) {
    let out = run(&mut cmd, Duration::from_secs(180));
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd:?} failed ({})", out.status);
    assert!(stdout.contains(" passed, 0 failed"), "no summary line from {cmd:?}");
}

#[test]
#[ignore = "needs Python with jsonrpcclient: run by `cargo xtask rpc-clients` / `cargo xtask ci`"]
fn python_jsonrpcclient() {
    let python = tool("FERRY_TEST_PYTHON", "Python interpreter (with jsonrpcclient installed)");
    let s = Served::start(true);
    let mut cmd = Command::new(python);
    cmd.arg(root().join("rpc/tests/py/clients.py")).arg(&s.addr).arg(s.url.as_deref().unwrap());
    check(cmd);
}

#[test]
#[ignore = "needs Node with rpc/tests/js installed: run by `cargo xtask rpc-clients` / `cargo xtask ci`"]
fn node_open_rpc_client_and_validator() {
    let node = tool("FERRY_TEST_NODE", "node binary");
    let js = root().join("rpc/tests/js");
    assert!(js.join("node_modules/@open-rpc").is_dir(), "run `npm ci` in {} first", js.display());
    // Node cannot reach Linux abstract socket names: serve on a socket file.
    let s = Served::start_in_dir(true);
    let mut cmd = Command::new(node);
    cmd.arg(js.join("clients.mjs")).arg(&s.addr).arg(s.url.as_deref().unwrap()).current_dir(&js);
    check(cmd);
}
