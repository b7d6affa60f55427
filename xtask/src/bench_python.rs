//! `cargo xtask bench-python [ARGS..]`: ferry's Python face against what Python users pick
//! today (issue 44 point 8), `bindings/python/bench/bench_python.py`: `ferry.Pipe`,
//! `multiprocessing.shared_memory` + `multiprocessing.Pipe`, iceoryx2's Python package
//! (request-response, polling and event), `torch.multiprocessing` queues; `ferry.App`'s
//! `add` and `echo` against the Rust-served ones from one `ferry.Client`. One run,
//! contenders interleaved in rounds, ratios and the targets' verdicts printed.
//!
//! The package is installed release (as a user gets it) into `target/bench-python-venv`
//! with numpy and iceoryx2 (from PyPI; when it does not install, the script says so and
//! skips its rows), torch from the tests' cache venv ([`crate::python_server::add_torch`]),
//! and a release `ferry` (`FERRY_BIN`: the Rust-served API and `--load N`'s burners,
//! `ferry __burn` at nice 0). The arguments go to the script (`--load N`, `--iters N`,
//! `--big-iters N`, `--rounds N`).

use anyhow::Context;
use xshell::{Shell, cmd};

use crate::flags::Flags;

/// `cargo xtask bench-python`.
pub struct BenchPython {
    args: Vec<String>,
}

impl BenchPython {
    /// Takes every argument for the script.
    pub fn parse(flags: Flags) -> anyhow::Result<BenchPython> {
        Ok(BenchPython { args: flags.into_rest() })
    }

    /// Installs the package (release), builds a release `ferry` and runs the benchmark once.
    pub fn run(self, sh: &Shell) -> anyhow::Result<()> {
        let root = sh.current_dir();
        let ferry = crate::python_sdk::ferry_bin(sh, true)?;
        let venv = crate::target_dir(sh)?.join("bench-python-venv");
        let python = venv.join("bin").join("python");
        if !python.exists() {
            cmd!(sh, "python3 -m venv {venv}").run()?;
        }
        let package = root.join("bindings/python");
        eprintln!("xtask: pip install ./bindings/python (release) into {}", venv.display());
        cmd!(sh, "{python} -m pip install --quiet --disable-pip-version-check {package} numpy ml_dtypes")
            .env_remove("MATURIN_PEP517_ARGS")
            .run()
            .context("installing the ferry package (release) for the benchmark")?;
        if let Err(e) = cmd!(sh, "{python} -m pip install --quiet --disable-pip-version-check iceoryx2").run() {
            eprintln!("xtask: iceoryx2 did not install ({e}): its rows are skipped");
        }
        crate::python_server::add_torch(sh, &python)?;
        let script = root.join("bindings/python/bench/bench_python.py");
        let args = self.args;
        cmd!(sh, "{python} {script} {args...}").env("FERRY_BIN", &ferry).run()?;
        Ok(())
    }
}
