//! `cargo xtask`: ferry's build tasks, written in Rust so they run the same everywhere.
//!
//! Run `cargo xtask help` for the list. Each subcommand is a struct in its own module with
//! `fn run(self, sh: &Shell) -> anyhow::Result<()>`; arguments are parsed by hand (see
//! [`flags`]) to keep this crate's dependencies few.
//!
//! - [`codegen`]: writes (or with `--check`, verifies) every generated, checked-in file.
//! - [`tidy`]: repository rules that the compiler cannot check (also run as `#[test]`s).
//! - [`conformance`]: runs every backend's conformance suite and prints one table.
//! - [`rpc_clients`]: third-party JSON-RPC clients (PyPI, npm) against `ferry serve`.
//! - [`python_sdk`]: the Python client's conformance column (`python-sdk`).
//! - [`python_server`]: the `ferry` Python package's checks and tests, its benchmark.
//! - [`bench_python`]: ferry's Python face against the standard library, iceoryx2, torch.
//! - [`windows`]: the Windows build, linted and tested under Wine.
//! - [`readme`]: the README's shell blocks, run as written.
//! - [`ci`]: the whole CI pipeline, the same locally and on the CI runners.
#![forbid(unsafe_code)]

mod bench_python;
mod bench_ray;
mod bench_weights;
mod ci;
mod codegen;
mod conformance;
mod flags;
mod python_sdk;
mod python_server;
mod python_wheel;
mod readme;
mod rpc_clients;
mod soak;
mod test_bins;
mod tidy;
mod typescript_sdk;
mod windows;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::OnceLock;

use anyhow::Context;
use xshell::{Shell, cmd};

use crate::flags::Flags;

/// Usage text printed by `cargo xtask help`, with no arguments, or on an unknown subcommand
/// ([`usage`] fills in `{ci_steps}`).
const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  codegen [--check]        write core/schemas/*.json and the SDKs' generated clients; with --check,
                           fail if any checked-in generated file is stale
  tidy                     repository rules: unsafe allow-list, backend conformance tests,
                           conformance case registry, file length (800 lines), no public
                           test modules outside `__` features, a schema for every wire type
  conformance [--backend NAME].. [--require NAME].. [--release]
                           run `cargo test -p ferry-NAME --test conformance` for each backend
                           (default: every directory in backends/) and the SDK scenarios
                           (python-sdk, typescript-sdk), print a pass/FAIL/ignored
                           table and write target/conformance.json; a --require'd backend
                           fails on any ignored case or if it is not viable
  sdk-typescript           the TypeScript SDK (CI's step): npm ci && npm test in sdks/typescript,
                           dist/ fresh, then the package installed into scratch projects
                           (link and tarball): require(), import, tsc on a consumer
  python-server            the ferry Python package: pip install ./bindings/python in an
                           empty venv, ruff, mypy --strict, stubtest, pytest
                           (bindings/python/tests, the client's in tests/client)
  python-wheel [--dev]     the ferry-tensors wheel: maturin build --release (abi3, manylinux),
                           installed into an empty venv whose PATH has no cargo or rustc;
                           py.typed, stubtest, `ferry info`, pytest with the wheel's `ferry`
  bench-python-server [ARGS..]
                           Python-served vs Rust-served calls, echo, 16 clients, and
                           Python-to-Python pipes (bindings/python/bench/bench_server.py)
  bench-python [ARGS..]    ferry's Python face against the standard library, iceoryx2 and
                           torch.multiprocessing in one run: 64 B and f32[1920,1080,3] round
                           trips, add and a 24.9 MB echo (ferry.App vs Rust-served); ratios
                           and the targets' verdicts (bindings/python/bench/bench_python.py;
                           --load N burners, --iters N, --big-iters N, --rounds N)
  bench-ray [ARGS..]       a 24.9 MB and a 64 B torch tensor between two Ray actors through
                           ferry.ray, Ray's object store and gloo, one run
                           (bindings/python/bench/bench_ray.py)
  placement-bench [ARGS..] placement policies (pinned, genoa, lru, flow) against Belady's MIN
                           on synthetic traces and one recorded from a real store run
                           (store/examples/traces/mlp.jsonl): bytes moved, hit rate, modelled
                           stall; then the layer trace with real copies between a disk and a
                           cpu tier
                           (store/examples/placement.rs; --quick, --trace FILE)
  bench-ring [ARGS..]      64-byte round trips between two processes in one run: ferry-ring
                           (spinning on and off), iceoryx2 request-response, a unix socket;
                           p50/p99 and the ratios (bench/iceoryx2-peer, its own workspace;
                           --iters N, --json)
  bench-weights [ARGS..]   weight sync (issue 47): a 1 GiB bf16 state_dict, 1% of it changed
                           per step, 4 subscribers in network namespaces behind a publisher
                           link limited by tc (10 and 1 Gbit/s): full transfer, ferry's delta,
                           gloo broadcast, safetensors re-read (bindings/python/bench/
                           bench_weights.py; --mib N, --subs N, --rates; root for netns)
  rpc-clients              third-party JSON-RPC clients (jsonrpcclient from PyPI in
                           target/venv, @open-rpc/* from npm in rpc/tests/js) and the
                           OpenRPC meta-schema check against `ferry serve`
  soak [--full] [--release]
                           `ferry serve` under heavy and hostile load (kill loops, idle and
                           slowloris connections, many clients, floods), a table of RSS,
                           fds, memfd mappings, /dev/shm and a canary's p50/p99 per phase;
                           --full: issue 14's counts, release build
  windows                  the Windows build (x86_64-pc-windows-gnu): installs the rustup
                           target, and as root (apt-get) mingw and wine, when missing;
                           clippy for that target, then
                           the named-pipe, JSON-RPC and `ferry serve`/`call` tests under Wine
  readme                   run the README's `sh` blocks as written (blocks marked as
                           long-running demos are skipped, naming why), with a debug
                           `ferry` (features rpc, http) first on PATH
  ci [--list]              every step below in order, stopping at the first failure (--list:
                           print them as the README lists them):
{ci_steps}
  help                     print this text
";

/// [`USAGE`] with the CI steps listed from [`ci::STEPS`].
pub fn usage() -> String {
    USAGE.replace("{ci_steps}\n", &ci::help_list())
}

fn main() -> ExitCode {
    match try_main() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Parses the command line and runs one subcommand from the repository root.
fn try_main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let command = args.next();
    let flags = Flags::new(args.collect());
    if flags.wants_help() {
        print!("{}", usage());
        return Ok(());
    }

    let sh = Shell::new()?;
    sh.change_dir(project_root());
    match command.as_deref() {
        Some("codegen") => codegen::Codegen::parse(flags)?.run(&sh),
        Some("tidy") => tidy::Tidy::parse(flags)?.run(&sh),
        Some("conformance") => conformance::Conformance::parse(flags)?.run(&sh),
        Some("rpc-clients") => rpc_clients::RpcClients::parse(flags)?.run(&sh),
        Some("sdk-typescript") => {
            flags.finish("sdk-typescript")?;
            typescript_sdk::test(&sh)
        }
        Some("bench-weights") => bench_weights::BenchWeights::parse(flags)?.run(&sh),
        Some("bench-python") => bench_python::BenchPython::parse(flags)?.run(&sh),
        Some("bench-ring") => {
            let args = flags.into_rest();
            let manifest = "bench/iceoryx2-peer/Cargo.toml";
            Ok(cmd!(sh, "cargo run --release --locked --manifest-path {manifest} -- {args...}").run()?)
        }
        Some("placement-bench") => {
            let args = flags.into_rest();
            Ok(cmd!(sh, "cargo run --release --locked -p ferry-store --example placement -- {args...}").run()?)
        }
        Some("python-server") => python_server::PythonServer::parse(flags)?.run(&sh),
        Some("python-wheel") => python_wheel::PythonWheel::parse(flags)?.run(&sh),
        Some("bench-python-server") => python_server::BenchPythonServer::parse(flags)?.run(&sh),
        Some("bench-ray") => bench_ray::BenchRay::parse(flags)?.run(&sh),
        Some("ci") => ci::Ci::parse(flags)?.run(&sh),
        Some("soak") => soak::Soak::parse(flags)?.run(&sh),
        Some("windows") => windows::Windows::parse(flags)?.run(&sh),
        Some("readme") => {
            flags.finish("readme")?;
            readme::run(&sh)
        }
        None | Some("help" | "-h" | "--help") => {
            print!("{}", usage());
            Ok(())
        }
        Some(other) => {
            eprint!("{}", usage());
            anyhow::bail!("unknown command `{other}`")
        }
    }
}

/// The repository root: the parent of this crate's directory.
pub fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask/ lives directly in the repository root").to_path_buf()
}

/// `cargo metadata --no-deps` of the workspace (asked once per run).
pub fn cargo_metadata(sh: &Shell) -> anyhow::Result<&'static serde_json::Value> {
    static META: OnceLock<serde_json::Value> = OnceLock::new();
    if let Some(meta) = META.get() {
        return Ok(meta);
    }
    let text = cmd!(sh, "cargo metadata --no-deps --format-version 1").quiet().read()?;
    let meta: serde_json::Value = serde_json::from_str(&text).context("reading `cargo metadata`")?;
    Ok(META.get_or_init(|| meta))
}

/// Cargo's target directory, where it puts `debug/ferry` and where the xtask keeps its
/// venvs and reports: `CARGO_TARGET_DIR`, else `build.target-dir` of a cargo config, else
/// `<root>/target`, as `cargo metadata` reports it.
pub fn target_dir(sh: &Shell) -> anyhow::Result<PathBuf> {
    let dir = cargo_metadata(sh)?["target_directory"].as_str().context("`cargo metadata` names no target_directory")?;
    Ok(PathBuf::from(dir))
}

/// Bytes free for an unprivileged user on the filesystem holding `dir` (`df -Pk`), or
/// `None` where `df` cannot say.
pub fn free_disk(sh: &Shell, dir: &Path) -> Option<u64> {
    let out = cmd!(sh, "df -Pk {dir}").quiet().ignore_stderr().read().ok()?;
    let kib: u64 = out.lines().nth(1)?.split_whitespace().nth(3)?.parse().ok()?;
    Some(kib * 1024)
}

/// `bytes` in GiB, for messages.
pub fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

/// `path` relative to `root` (when it is inside), with `/` separators, for messages.
pub fn relative(root: &Path, path: &Path) -> String {
    let Ok(rel) = path.strip_prefix(root) else {
        return path.display().to_string();
    };
    rel.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/")
}
