//! `cargo xtask conformance [--backend NAME].. [--require NAME].. [--release]`.
//!
//! For each backend `B` (`mem`, the in-memory transport of ferry-core, then every
//! directory in `backends/` with a `Cargo.toml`; or those named), runs the test
//! `conformance` of package `ferry-B` (all built in one `cargo test --no-run --workspace
//! --all-features`, see [`crate::test_bins`]) with
//! `FERRY_CONFORMANCE_REPORT=<target>/conformance/B.json` (`<target>`: cargo's target
//! directory, `<repo>/target` or `$CARGO_TARGET_DIR`). The test binary (the
//! conformance crate's libtest-mimic `main`) writes that report itself:
//!
//! ```json
//! {"backend": "local", "viable": true, "reason": null,
//!  "cases": [{"name": "every_dtype::threads", "outcome": "pass", "detail": null, "ms": 12}]}
//! ```
//!
//! `outcome` is `"pass"`, `"fail"` or `"ignored"`; `reason` says why a backend is not
//! viable; `detail` carries a failure message. Then it prints one table (a row per case, a
//! column per backend), writes the merged result to `target/conformance.json` and fails if
//! any case failed, any test command failed, or a `--require`d backend ignored a case or is
//! not viable. The table works on [`Column`]s (a name plus a [`Report`]), so the SDK suites
//! can be added as more columns.
//!
//! SDK and server columns run after the backends (without `--backend`, or when named by
//! `--backend` / `--require`), each against a real server of the conformance API:
//! - `python-sdk`: the pytest scenario of the `ferry` package's client (`bindings/python/tests/client`,
//!   the generated client on the native `ferry.Client`; [`crate::python_sdk`]);
//! - `typescript-sdk`: `npm run conformance` in `sdks/typescript` ([`crate::typescript_sdk`]);
//! - `rust-server`: the Rust RPC client's cases (`cli/tests/rpc_conformance.rs`, `rpc::*`);
//!
//! all three against `ferry serve --api conformance`; and
//! - `python-server`: the same three suites against the conformance API served from Python
//!   ([`crate::python_server::conformance_column`], pointed there by [`OtherServer`]),
//!   merged into one column ([`merge_columns`]).
//!
//! All write the same report format.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use xshell::Shell;

use crate::flags::Flags;
use crate::test_bins::{self, TestBin};

/// The column of the in-memory transport (`ferry_core::mem`, core's `tests/conformance.rs`):
/// the cases whose peer runs in the same process; the others are ignored there.
const MEM: &str = "mem";

/// The environment variable that tells the conformance test binary where to write its report.
pub const REPORT_ENV: &str = "FERRY_CONFORMANCE_REPORT";

/// `cargo xtask conformance`.
#[derive(Default)]
pub struct Conformance {
    /// Backends to run (directory names under `backends/`); empty means all.
    pub backends: Vec<String>,
    /// Backends that must be viable and run every case (an ignored case fails).
    pub require: Vec<String>,
    /// Build and run the suites with `--release`.
    pub release: bool,
}

impl Conformance {
    /// Parses `[--backend NAME].. [--require NAME].. [--release]`.
    pub fn parse(mut flags: Flags) -> anyhow::Result<Conformance> {
        let backends = flags.values("--backend")?;
        let require = flags.values("--require")?;
        let release = flags.flag("--release");
        flags.finish("conformance")?;
        Ok(Conformance { backends, require, release })
    }

    /// Runs each backend's suite, prints the table and writes `target/conformance.json`.
    pub fn run(self, sh: &Shell) -> anyhow::Result<()> {
        let root = sh.current_dir();
        let known: Vec<String> = std::iter::once(MEM.to_owned())
            .chain(
                crate::tidy::backend_dirs(&root)?
                    .iter()
                    .filter_map(|d| d.file_name().map(|n| n.to_string_lossy().into_owned())),
            )
            .collect();
        for name in self.backends.iter().chain(&self.require) {
            if !known.contains(name) && !SDK_COLUMNS.contains(&name.as_str()) {
                bail!("unknown backend `{name}`: the backends are {}", list_or_none(&known));
            }
        }
        let mut backends = if self.backends.is_empty() { known.clone() } else { self.backends.clone() };
        backends.retain(|b| !SDK_COLUMNS.contains(&b.as_str()));
        // A required backend always runs, even when --backend names others only.
        backends.extend(self.require.iter().filter(|b| !SDK_COLUMNS.contains(&b.as_str())).cloned());
        let mut seen = HashSet::new();
        backends.retain(|b| seen.insert(b.clone()));
        if backends.is_empty() {
            eprintln!("conformance: note: no backends found in backends/");
        }

        let target = crate::target_dir(sh)?;
        let report_dir = target.join("conformance");
        std::fs::create_dir_all(&report_dir).with_context(|| format!("creating {}", report_dir.display()))?;
        let mut failures = Vec::new();
        let mut columns = Vec::new();
        let mut add = |(column, problems): (Column, Vec<String>)| {
            columns.push(column);
            failures.extend(problems);
        };
        if !backends.is_empty() {
            match conformance_bins(sh, self.release) {
                Ok(bins) => {
                    for backend in &backends {
                        add(run_backend(sh, &bins, &report_dir, backend));
                    }
                }
                Err(err) => {
                    let why = format!("the conformance suites did not build: {err:#}");
                    for (i, backend) in backends.iter().enumerate() {
                        let report = Report::broken(backend, why.clone());
                        let problems = if i == 0 { vec![why.clone()] } else { Vec::new() };
                        add((Column { name: backend.clone(), report }, problems));
                    }
                }
            }
        }
        if self.runs_sdk(crate::python_sdk::PYTHON_SDK) {
            add(crate::python_sdk::python_column(sh, &report_dir, self.release));
        }
        if self.runs_sdk(crate::typescript_sdk::COLUMN) {
            add(crate::typescript_sdk::conformance_column(sh, &report_dir));
        }
        if self.runs_sdk(RUST_SERVER) {
            add(rpc_cases(sh, &report_dir, self.release, None));
        }
        if self.runs_sdk(crate::python_server::COLUMN) {
            add(crate::python_server::conformance_column(sh, &report_dir, self.release));
        }

        println!("\n{}", render_table(&columns));
        print!("{}", render_details(&columns));
        failures.extend(case_failures(&columns));
        for name in &self.require {
            if let Some(column) = columns.iter().find(|c| &c.name == name) {
                failures.extend(requirement_failures(column));
            }
        }

        let merged = merged_json(&columns, &failures);
        let merged_path = target.join("conformance.json");
        let text = serde_json::to_string_pretty(&merged)? + "\n";
        std::fs::write(&merged_path, text).with_context(|| format!("writing {}", merged_path.display()))?;
        eprintln!("conformance: wrote {}", crate::relative(&root, &merged_path));

        if !failures.is_empty() {
            bail!("conformance failed:\n  {}", failures.join("\n  "));
        }
        Ok(())
    }
}

/// Columns that are SDK suites rather than `backends/` crates; `--backend` and `--require`
/// accept them too.
const SDK_COLUMNS: &[&str] =
    &[crate::python_sdk::PYTHON_SDK, crate::typescript_sdk::COLUMN, RUST_SERVER, crate::python_server::COLUMN];

/// The column of the Rust RPC client's cases against `ferry serve --api conformance`.
pub const RUST_SERVER: &str = "rust-server";

/// Another implementation of the conformance API, for the SDK scenarios and the Rust RPC
/// cases to run against instead of `ferry serve --api conformance`: they read
/// `FERRY_CONFORMANCE_SERVER` (a command line split on whitespace, `{addr}` standing for
/// the address to listen on; it prints `listening on ADDR` once it does) and
/// `FERRY_CONFORMANCE_COLUMN` (the column their report names).
pub struct OtherServer {
    /// The column of its results.
    pub column: String,
    /// The command line.
    pub command: String,
}

impl OtherServer {
    /// The environment that points a scenario at it.
    pub fn envs(&self) -> [(&'static str, &str); 2] {
        [("FERRY_CONFORMANCE_SERVER", &self.command), ("FERRY_CONFORMANCE_COLUMN", &self.column)]
    }
}

/// The Rust RPC client's cases (`cargo test -p ferry-cli --test rpc_conformance`): against
/// `ferry serve --api conformance` (column `rust-server`), or `server`.
pub fn rpc_cases(sh: &Shell, report_dir: &Path, release: bool, server: Option<&OtherServer>) -> (Column, Vec<String>) {
    let column = server.map_or(RUST_SERVER, |s| s.column.as_str());
    let report_path = report_dir.join(format!("{column}-rpc.json"));
    let _ = std::fs::remove_file(&report_path);
    let release = release.then_some("--release");
    let mut args = vec!["--workspace", "--all-features", "--test", "rpc_conformance"];
    args.extend(release);
    let mut envs: Vec<(&str, &OsStr)> = vec![(REPORT_ENV, report_path.as_os_str())];
    for (k, v) in server.map(OtherServer::envs).into_iter().flatten() {
        envs.push((k, OsStr::new(v)));
    }
    let status = test_bins::build(sh, &args)
        .and_then(|bins| test_bins::find(&bins, "ferry-cli", "rpc_conformance")?.run(sh, None, &envs));
    let mut problems = Vec::new();
    if let Err(err) = &status {
        problems.push(format!("{column}: the Rust RPC cases failed: {err:#}"));
    }
    let column = read_column(column, &report_path, "the Rust RPC cases wrote none", &mut problems);
    (column, problems)
}

/// One column from several suites' columns of the same server: every case of each, a case
/// named by more than one (the SDK scenarios share their names) failing if any failed and
/// passing only if every one that ran passed; its detail names the suite (`labels`).
pub fn merge_columns(name: &str, parts: Vec<(&str, Column)>) -> Column {
    let mut cases: Vec<CaseResult> = Vec::new();
    let mut viable = true;
    let mut reasons = Vec::new();
    for (label, part) in parts {
        if !part.report.viable {
            viable = false;
            reasons.push(format!("{label}: {}", part.report.reason.as_deref().unwrap_or("not viable")));
        }
        for case in part.report.cases {
            let detail = case.detail.map(|d| format!("{label}: {d}"));
            match cases.iter_mut().find(|c| c.name == case.name) {
                None => cases.push(CaseResult { detail, ..case }),
                Some(c) => {
                    c.outcome = match (c.outcome, case.outcome) {
                        (Outcome::Fail, _) | (_, Outcome::Fail) => Outcome::Fail,
                        (Outcome::Ignored, Outcome::Ignored) => Outcome::Ignored,
                        _ => Outcome::Pass,
                    };
                    c.detail = match (c.detail.take(), detail) {
                        (Some(a), Some(b)) => Some(format!("{a}; {b}")),
                        (a, b) => a.or(b),
                    };
                    c.ms = match (c.ms, case.ms) {
                        (Some(a), Some(b)) => Some(a + b),
                        (a, b) => a.or(b),
                    };
                }
            }
        }
    }
    let reason = (!reasons.is_empty()).then(|| reasons.join("; "));
    Column { name: name.to_owned(), report: Report { backend: name.to_owned(), viable, reason, cases } }
}

impl Conformance {
    /// Whether the SDK column `name` runs: always without `--backend`, else when named
    /// (by `--backend` or `--require`).
    fn runs_sdk(&self, name: &str) -> bool {
        self.backends.is_empty() || self.backends.iter().chain(&self.require).any(|b| b == name)
    }
}

/// The test binaries of every conformance suite, built with the feature set of CI's
/// `cargo nextest run --workspace --all-features` (so they reuse its artifacts).
fn conformance_bins(sh: &Shell, release: bool) -> anyhow::Result<Vec<TestBin>> {
    let release = release.then_some("--release");
    let mut args = vec!["--workspace", "--all-features", "--test", "conformance"];
    args.extend(release);
    test_bins::build(sh, &args)
}

/// Runs one backend's suite; returns its column and the problems with running it.
fn run_backend(sh: &Shell, bins: &[TestBin], report_dir: &Path, backend: &str) -> (Column, Vec<String>) {
    let report_path: PathBuf = report_dir.join(format!("{backend}.json"));
    // A report left from an earlier run must not pass for this run's.
    let _ = std::fs::remove_file(&report_path);
    let package = if backend == MEM { "ferry-core".to_owned() } else { format!("ferry-{backend}") };
    let status = test_bins::find(bins, &package, "conformance")
        .and_then(|bin| bin.run(sh, None, &[(REPORT_ENV, report_path.as_os_str())]));

    let mut problems = Vec::new();
    if let Err(err) = &status {
        problems.push(format!("backend {backend}: {err:#}"));
    }
    let missing = if status.is_err() {
        "the conformance test binary is missing or failed (see the output above)".to_owned()
    } else {
        format!(
            "{package}'s conformance test passed but wrote nothing to ${REPORT_ENV} \
             (does tests/conformance.rs call `ferry_conformance::main`?)"
        )
    };
    let column = read_column(backend, &report_path, &missing, &mut problems);
    (column, problems)
}

/// The column a suite wrote its report for at `report_path`: a report naming another
/// column is a problem; none (`missing` says why) or an unreadable one makes a broken
/// column, and a problem.
pub fn read_column(column: &str, report_path: &Path, missing: &str, problems: &mut Vec<String>) -> Column {
    let report = match std::fs::read_to_string(report_path) {
        Ok(text) => Report::parse(&text).with_context(|| format!("reading {}", report_path.display())),
        Err(_) => Err(anyhow::anyhow!("no report at {}: {missing}", report_path.display())),
    };
    let report = match report {
        Ok(report) => {
            if report.backend != column {
                problems.push(format!("{column}: its report names backend `{}`", report.backend));
            }
            report
        }
        Err(err) => {
            problems.push(format!("{column}: {err:#}"));
            Report::broken(column, format!("{err:#}"))
        }
    };
    Column { name: column.to_owned(), report }
}

/// One column of the table: a backend (later also an SDK) and its report.
pub struct Column {
    /// Column header: the backend or SDK name.
    pub name: String,
    /// The suite's results.
    pub report: Report,
}

/// The result of one suite run, as written by the conformance test binary.
#[derive(Debug, PartialEq)]
pub struct Report {
    /// The backend (or SDK) that ran.
    pub backend: String,
    /// Whether the backend can work on this machine; if not, every case is ignored.
    pub viable: bool,
    /// Why the backend is not viable (or why there is no report).
    pub reason: Option<String>,
    /// Every case, in the order the suite lists them.
    pub cases: Vec<CaseResult>,
}

/// The result of one case.
#[derive(Debug, PartialEq)]
pub struct CaseResult {
    /// `module::case`, e.g. `every_dtype::threads`.
    pub name: String,
    /// Pass, fail or ignored.
    pub outcome: Outcome,
    /// The failure message, if any.
    pub detail: Option<String>,
    /// Wall time in milliseconds, if reported.
    pub ms: Option<u64>,
}

/// How one case ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It ran and passed.
    Pass,
    /// It ran and failed.
    Fail,
    /// It did not run (the backend is not viable here, or the case was skipped).
    Ignored,
}

impl Outcome {
    /// The report's spelling.
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Fail => "fail",
            Outcome::Ignored => "ignored",
        }
    }

    /// The table's spelling: failures stand out.
    fn cell(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Fail => "FAIL",
            Outcome::Ignored => "ignored",
        }
    }
}

impl Report {
    /// Parses a report (the format is in the module docs).
    pub fn parse(text: &str) -> anyhow::Result<Report> {
        let v: Value = serde_json::from_str(text).context("the report is not valid JSON")?;
        let backend = v["backend"].as_str().context("the report has no string `backend`")?.to_owned();
        let viable = v["viable"].as_bool().context("the report has no boolean `viable`")?;
        let reason = v["reason"].as_str().map(str::to_owned);
        let mut cases = Vec::new();
        for (i, case) in v["cases"].as_array().context("the report has no array `cases`")?.iter().enumerate() {
            let name = case["name"].as_str().with_context(|| format!("case {i} has no string `name`"))?.to_owned();
            let outcome = match case["outcome"].as_str() {
                Some("pass") => Outcome::Pass,
                Some("fail") => Outcome::Fail,
                Some("ignored") => Outcome::Ignored,
                other => bail!("case `{name}` has outcome {other:?}; expected \"pass\", \"fail\" or \"ignored\""),
            };
            let detail = case["detail"].as_str().map(str::to_owned);
            let ms = case["ms"].as_u64().or_else(|| case["ms"].as_f64().map(|ms| ms.max(0.0).round() as u64));
            cases.push(CaseResult { name, outcome, detail, ms });
        }
        Ok(Report { backend, viable, reason, cases })
    }

    /// The stand-in for a backend whose suite produced no usable report.
    pub fn broken(backend: &str, reason: String) -> Report {
        Report { backend: backend.to_owned(), viable: false, reason: Some(reason), cases: Vec::new() }
    }

    /// The report in its JSON format.
    pub fn to_json(&self) -> Value {
        let cases: Vec<Value> = self
            .cases
            .iter()
            .map(|c| json!({"name": c.name, "outcome": c.outcome.as_str(), "detail": c.detail, "ms": c.ms}))
            .collect();
        json!({"backend": self.backend, "viable": self.viable, "reason": self.reason, "cases": cases})
    }

    /// Names of the cases with `outcome`.
    fn names(&self, outcome: Outcome) -> Vec<&str> {
        self.cases.iter().filter(|c| c.outcome == outcome).map(|c| c.name.as_str()).collect()
    }

    /// The outcome of case `name`, if the report lists it.
    fn outcome(&self, name: &str) -> Option<Outcome> {
        self.cases.iter().find(|c| c.name == name).map(|c| c.outcome)
    }
}

/// The table: a row per case (union over columns, in order of first appearance), a column
/// per [`Column`], cells `pass` / `FAIL` / `ignored` (`-` where a column lacks the case),
/// and a totals line.
pub fn render_table(columns: &[Column]) -> String {
    let mut seen = HashSet::new();
    let rows: Vec<&str> = columns
        .iter()
        .flat_map(|c| c.report.cases.iter().map(|case| case.name.as_str()))
        .filter(|name| seen.insert(*name))
        .collect();
    let totals: Vec<String> = columns
        .iter()
        .map(|c| {
            let r = &c.report;
            let n = |o| r.names(o).len();
            format!("{}/{}/{}", n(Outcome::Pass), n(Outcome::Fail), n(Outcome::Ignored))
        })
        .collect();
    let totals_label = "total (pass/FAIL/ignored)";
    let first = rows.iter().map(|r| r.len()).chain(["case".len(), totals_label.len()]).max().unwrap_or(0);
    let widths: Vec<usize> =
        columns.iter().zip(&totals).map(|(c, t)| c.name.len().max("ignored".len()).max(t.len())).collect();

    let mut out = String::new();
    let mut line = |label: &str, cells: &mut dyn Iterator<Item = &str>| {
        let mut l = format!("{label:<first$}");
        for (cell, width) in cells.zip(&widths) {
            l.push_str(&format!("  {cell:<width$}"));
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line("case", &mut columns.iter().map(|c| c.name.as_str()));
    let rule_len = first + widths.iter().map(|w| w + 2).sum::<usize>();
    let rule = "-".repeat(rule_len);
    line(&rule, &mut std::iter::empty());
    for row in &rows {
        line(row, &mut columns.iter().map(|c| c.report.outcome(row).map_or("-", Outcome::cell)));
    }
    line(&rule, &mut std::iter::empty());
    line(totals_label, &mut totals.iter().map(String::as_str));
    out
}

/// Why each non-viable column was skipped, and the message of each failed case.
pub fn render_details(columns: &[Column]) -> String {
    let mut out = String::new();
    for column in columns {
        let r = &column.report;
        if !r.viable {
            out.push_str(&format!(
                "{}: not viable: {}\n",
                column.name,
                r.reason.as_deref().unwrap_or("no reason given")
            ));
        }
        for case in r.cases.iter().filter(|c| c.outcome == Outcome::Fail) {
            let detail = case.detail.as_deref().unwrap_or("(no detail)").trim_end().replace('\n', "\n    ");
            out.push_str(&format!("FAIL {} {}:\n    {detail}\n", column.name, case.name));
        }
    }
    out
}

/// One message per column with failed cases.
fn case_failures(columns: &[Column]) -> Vec<String> {
    columns
        .iter()
        .filter_map(|c| {
            let failed = c.report.names(Outcome::Fail);
            (!failed.is_empty()).then(|| format!("{}: {} case(s) failed: {}", c.name, failed.len(), failed.join(", ")))
        })
        .collect()
}

/// What keeps a `--require`d column from counting as a full run.
fn requirement_failures(column: &Column) -> Vec<String> {
    let r = &column.report;
    let mut failures = Vec::new();
    if !r.viable {
        let reason = r.reason.as_deref().unwrap_or("no reason given");
        failures.push(format!("required backend {} is not viable: {reason}", column.name));
    }
    let ignored = r.names(Outcome::Ignored);
    if !ignored.is_empty() {
        failures.push(format!(
            "required backend {} ignored {} case(s): {}",
            column.name,
            ignored.len(),
            ignored.join(", ")
        ));
    }
    if r.viable && r.cases.is_empty() {
        failures.push(format!("required backend {} ran no cases", column.name));
    }
    failures
}

/// `{"backends": {B: report}, "ok": bool, "failures": [..]}`.
fn merged_json(columns: &[Column], failures: &[String]) -> Value {
    let backends: serde_json::Map<String, Value> =
        columns.iter().map(|c| (c.name.clone(), c.report.to_json())).collect();
    json!({"backends": backends, "ok": failures.is_empty(), "failures": failures})
}

/// `a, b, c`, or `(none)`.
fn list_or_none(names: &[String]) -> String {
    if names.is_empty() { "(none)".to_owned() } else { names.join(", ") }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PIPE: &str = r#"{"backend":"pipe","viable":true,"reason":null,"cases":[
        {"name":"every_dtype::threads","outcome":"pass","detail":null,"ms":12},
        {"name":"limits::too_big","outcome":"fail","detail":"expected TooLarge\ngot Ok","ms":3},
        {"name":"crash::peer_killed","outcome":"ignored","detail":null,"ms":0}]}"#;
    const CUDA: &str = r#"{"backend":"cuda-ipc","viable":false,"reason":"no CUDA driver","cases":[
        {"name":"every_dtype::threads","outcome":"ignored","detail":null,"ms":0},
        {"name":"cuda::events","outcome":"ignored","detail":null,"ms":0}]}"#;

    fn columns() -> Vec<Column> {
        vec![
            Column { name: "pipe".into(), report: Report::parse(PIPE).unwrap() },
            Column { name: "cuda-ipc".into(), report: Report::parse(CUDA).unwrap() },
        ]
    }

    #[test]
    fn merges_the_suites_of_one_server() {
        let part = |name: &str, json: &str| Column { name: name.into(), report: Report::parse(json).unwrap() };
        let py = r#"{"backend":"s","viable":true,"reason":null,"cases":[
            {"name":"sdk::a","outcome":"pass","detail":null,"ms":1},
            {"name":"sdk::b","outcome":"fail","detail":"boom","ms":2},
            {"name":"sdk::only_py","outcome":"pass","detail":null,"ms":3}]}"#;
        let ts = r#"{"backend":"s","viable":true,"reason":null,"cases":[
            {"name":"sdk::a","outcome":"fail","detail":"differs","ms":4},
            {"name":"sdk::b","outcome":"pass","detail":null,"ms":5},
            {"name":"sdk::c","outcome":"ignored","detail":null,"ms":0}]}"#;
        let m = merge_columns("s", vec![("py", part("s", py)), ("ts", part("s", ts))]);
        assert!(m.report.viable);
        let get = |n: &str| m.report.cases.iter().find(|c| c.name == n).unwrap();
        assert_eq!((get("sdk::a").outcome, get("sdk::a").detail.as_deref()), (Outcome::Fail, Some("ts: differs")));
        assert_eq!((get("sdk::b").outcome, get("sdk::b").detail.as_deref()), (Outcome::Fail, Some("py: boom")));
        assert_eq!(get("sdk::b").ms, Some(7));
        assert_eq!(get("sdk::only_py").outcome, Outcome::Pass);
        assert_eq!(get("sdk::c").outcome, Outcome::Ignored);
        let m = merge_columns("s", vec![("py", part("s", py)), ("cuda", part("s", CUDA))]);
        assert!(!m.report.viable);
        assert_eq!(m.report.reason.as_deref(), Some("cuda: no CUDA driver"));
    }

    #[test]
    fn parses_and_round_trips_reports() {
        let r = Report::parse(PIPE).unwrap();
        assert_eq!(r.backend, "pipe");
        assert!(r.viable);
        assert_eq!(r.cases.len(), 3);
        assert_eq!(r.cases[1].outcome, Outcome::Fail);
        assert_eq!(r.cases[1].ms, Some(3));
        assert_eq!(Report::parse(&r.to_json().to_string()).unwrap(), r);
        assert!(Report::parse(r#"{"backend":"x","viable":true,"cases":[{"name":"a","outcome":"ok"}]}"#).is_err());
        assert!(Report::parse("not json").is_err());
    }

    #[test]
    fn renders_the_table() {
        let expected = "\
case                       pipe     cuda-ipc
--------------------------------------------
every_dtype::threads       pass     ignored
limits::too_big            FAIL     -
crash::peer_killed         ignored  -
cuda::events               -        ignored
--------------------------------------------
total (pass/FAIL/ignored)  1/1/1    0/0/2
";
        assert_eq!(render_table(&columns()), expected);
        let details = render_details(&columns());
        assert!(details.contains("FAIL pipe limits::too_big:\n    expected TooLarge\n    got Ok\n"), "{details}");
        assert!(details.contains("cuda-ipc: not viable: no CUDA driver"), "{details}");
    }

    #[test]
    fn failures_and_requirements() {
        let cols = columns();
        assert_eq!(case_failures(&cols), ["pipe: 1 case(s) failed: limits::too_big"]);
        assert_eq!(requirement_failures(&cols[0]), ["required backend pipe ignored 1 case(s): crash::peer_killed"]);
        let cuda = requirement_failures(&cols[1]);
        assert_eq!(cuda[0], "required backend cuda-ipc is not viable: no CUDA driver");
        assert_eq!(cuda.len(), 2);
        let merged = merged_json(&cols, &["x".into()]);
        assert_eq!(merged["backends"]["cuda-ipc"]["reason"], "no CUDA driver");
        assert_eq!(merged["ok"], false);
    }
}
