//! The TypeScript SDK (`sdks/typescript`, npm package `ferry-client`) in CI and in the
//! conformance table.
//!
//! - [`test()`] (a `cargo xtask ci` step): `npm ci && npm test` in `sdks/typescript`, against
//!   a debug `ferry` built here (`FERRY_BIN`); then checks that the checked-in `dist/` is
//!   what `src/` builds, and installs the package into scratch projects as a user does
//!   (a directory link and a packed tarball) to `require()` it, `import` it and type-check
//!   a consumer.
//! - [`conformance_column`] (`cargo xtask conformance`, column `typescript-sdk`):
//!   `npm run conformance` with `FERRY_CONFORMANCE_REPORT=target/conformance/typescript-sdk.json`,
//!   then reads that report.
//! - Both need `npm` and `node` (and the npm registry on the first `npm ci`); without them the
//!   step is SKIPPED loudly and the column is *not viable*, never a silent pass.

use std::path::{Path, PathBuf};

use anyhow::Context;
use xshell::{Shell, cmd};

use crate::conformance::{Column, OtherServer, REPORT_ENV, Report};

/// The package's directory, relative to the repository root.
pub const DIR: &str = "sdks/typescript";
/// The conformance column (and the `backend` its report names).
pub const COLUMN: &str = "typescript-sdk";

fn has(sh: &Shell, program: &str) -> bool {
    cmd!(sh, "{program} --version").quiet().ignore_stdout().ignore_stderr().run().is_ok()
}

/// Whether `npm` and `node` are on the PATH.
pub fn has_npm(sh: &Shell) -> bool {
    has(sh, "npm") && has(sh, "node")
}

fn loud(msg: &str) {
    let bar = "!".repeat(78);
    eprintln!("\n{bar}\n!! SKIPPED: {msg}\n{bar}\n");
}

/// Notes for the CI summary about what cannot run here.
pub fn missing_tools(sh: &Shell) -> Vec<String> {
    if has_npm(sh) {
        Vec::new()
    } else {
        vec![format!("npm/node is missing: the TypeScript SDK tests (`npm ci && npm test` in {DIR}) were SKIPPED")]
    }
}

/// Builds the `ferry` binary the SDK runs against (debug, as the workspace tests build it).
fn ferry_bin(sh: &Shell) -> anyhow::Result<PathBuf> {
    cmd!(sh, "cargo build -p ferry-cli --locked").run()?;
    let bin = crate::target_dir(sh)?.join("debug").join("ferry");
    anyhow::ensure!(bin.exists(), "cargo build -p ferry-cli made no {}", bin.display());
    Ok(bin)
}

/// `npm ci` in the package (committed package-lock.json).
fn npm_ci(sh: &Shell) -> anyhow::Result<()> {
    let _dir = sh.push_dir(DIR);
    cmd!(sh, "npm ci --no-audit --no-fund --loglevel=error").run()?;
    Ok(())
}

/// The CI step: `npm ci && npm test` in `sdks/typescript`, then [`dist_is_fresh`] and
/// [`install_checks`] (skipped loudly without npm).
pub fn test(sh: &Shell) -> anyhow::Result<()> {
    if !has_npm(sh) {
        loud(&format!("npm/node not found: the TypeScript SDK ({DIR}) was NOT tested"));
        return Ok(());
    }
    let bin = ferry_bin(sh)?;
    npm_ci(sh)?;
    {
        let _dir = sh.push_dir(DIR);
        cmd!(sh, "npm test").env("FERRY_BIN", &bin).run()?;
    }
    dist_is_fresh(sh)?;
    install_checks(sh, &bin)
}

/// `dist/` is checked in (so that installing the package needs no build step, which npm
/// may not run for a dependency); `npm test` has just rebuilt it from `src/`, so git must
/// see no change in it.
fn dist_is_fresh(sh: &Shell) -> anyhow::Result<()> {
    let dist = format!("{DIR}/dist");
    let Ok(status) = cmd!(sh, "git status --porcelain -- {dist}").quiet().ignore_stderr().read() else {
        eprintln!("xtask: not a git checkout: did not check that {dist} is fresh");
        return Ok(());
    };
    anyhow::ensure!(
        status.trim().is_empty(),
        "{dist} is stale (npm run build changed it):\n{status}\ncommit the rebuilt {dist}"
    );
    Ok(())
}

/// The package as a user installs it, from a scratch project each: `npm install
/// ./sdks/typescript` (a link to the directory) and `npm install` of the `npm pack`
/// tarball. In each, `test/install/check.cjs` (`require`) and `check.mjs` (`import`) call
/// `ferry serve` through the runtime and the generated demo client, on an abstract name
/// and on a socket file, and `tsc` type-checks `consumer.ts` against the installed
/// declarations.
fn install_checks(sh: &Shell, bin: &Path) -> anyhow::Result<()> {
    let root = sh.current_dir();
    let sdk = root.join(DIR);
    let scratch = crate::target_dir(sh)?.join("ts-install");
    let files = sdk.join("test/install");
    let tsc = sdk.join("node_modules/.bin/tsc");
    let types = sdk.join("node_modules/@types");
    for how in ["link", "pack"] {
        let dir = scratch.join(how);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::write(dir.join("package.json"), "{\"name\": \"scratch\", \"private\": true}\n")?;
        for entry in std::fs::read_dir(&files)? {
            let path = entry?.path();
            if let Some(name) = path.file_name() {
                std::fs::copy(&path, dir.join(name))?;
            }
        }
        let package = if how == "link" {
            sdk.clone()
        } else {
            let _sdk = sh.push_dir(&sdk);
            let out = cmd!(sh, "npm pack --silent --pack-destination {dir}").read()?;
            let name = out.lines().last().unwrap_or_default().trim().to_owned();
            anyhow::ensure!(name.ends_with(".tgz"), "npm pack printed no tarball name: {out}");
            dir.join(name)
        };
        let _dir = sh.push_dir(&dir);
        eprintln!("xtask: ferry-client installed from a scratch project ({how}: npm install {})", package.display());
        cmd!(sh, "npm install --no-audit --no-fund --loglevel=error {package}").run()?;
        cmd!(sh, "node check.cjs").env("FERRY_BIN", bin).run().context("require(\"ferry-client\") failed")?;
        cmd!(sh, "node check.mjs").env("FERRY_BIN", bin).run().context("import \"ferry-client\" failed")?;
        cmd!(sh, "{tsc} -p tsconfig.json --typeRoots {types}").run().context("type-checking consumer.ts")?;
    }
    Ok(())
}

/// Runs `npm run conformance` and returns the `typescript-sdk` column and the problems with
/// running it (as `run_backend` does for a backend).
pub fn conformance_column(sh: &Shell, report_dir: &Path) -> (Column, Vec<String>) {
    scenario(sh, report_dir, None)
}

/// The scenario against `server` (another implementation of the conformance API) instead
/// of `ferry serve --api conformance`: its report goes to `<column>-typescript-sdk.json`
/// and names the server's column.
pub fn scenario(sh: &Shell, report_dir: &Path, server: Option<&OtherServer>) -> (Column, Vec<String>) {
    let column = server.map_or(COLUMN, |s| s.column.as_str());
    let file = server.map_or_else(|| format!("{COLUMN}.json"), |s| format!("{}-{COLUMN}.json", s.column));
    let report_path = report_dir.join(file);
    // A report left from an earlier run must not pass for this run's.
    let _ = std::fs::remove_file(&report_path);
    if !has_npm(sh) {
        loud(&format!("npm/node not found: the {column} conformance column was NOT run"));
        let report = Report::broken(column, "npm/node not found on this machine".to_owned());
        return (Column { name: column.to_owned(), report }, Vec::new());
    }
    let command = format!("npm ci && npm run conformance (in {DIR})");
    let status = ferry_bin(sh).and_then(|bin| {
        npm_ci(sh)?;
        let _dir = sh.push_dir(DIR);
        let mut c = cmd!(sh, "npm run conformance").env("FERRY_BIN", &bin).env(REPORT_ENV, &report_path);
        for (k, v) in server.map(OtherServer::envs).into_iter().flatten() {
            c = c.env(k, v);
        }
        c.run()?;
        Ok(())
    });

    let mut problems = Vec::new();
    if let Err(err) = &status {
        problems.push(format!("{column}: `{command}` failed: {err:#}"));
    }
    let column =
        crate::conformance::read_column(column, &report_path, &format!("`{command}` wrote none"), &mut problems);
    (column, problems)
}
