//! `cargo xtask bench-weights [ARGS..]`: the weight-sync benchmark (issue 47 point 6),
//! `bindings/python/bench/bench_weights.py`, on a release build of the Python package
//! installed into `target/bench-weights-venv` (torch from the cache venv, as the tests').
//! The arguments go to the script (`--mib N`, `--subs N`, `--rates 10gbit,1gbit`,
//! `--no-gloo`, `--no-same-host`, `--tmp DIR`). It makes network namespaces and `tc`
//! limits, so it needs root; without, it says so and measures over loopback. It prints
//! the tables of the closing note: the rows per link, where the delta's time went, the
//! targets' verdicts, and the same-host figures (publish against copies of the changed
//! bytes, pages touched).

use anyhow::Context;
use xshell::{Shell, cmd};

use crate::flags::Flags;

/// `cargo xtask bench-weights`.
pub struct BenchWeights {
    args: Vec<String>,
}

impl BenchWeights {
    /// Takes every argument for the script.
    pub fn parse(flags: Flags) -> anyhow::Result<BenchWeights> {
        Ok(BenchWeights { args: flags.into_rest() })
    }

    /// Installs the package (release) and runs the benchmark once.
    pub fn run(self, sh: &Shell) -> anyhow::Result<()> {
        let root = sh.current_dir();
        let venv = crate::target_dir(sh)?.join("bench-weights-venv");
        let python = venv.join("bin").join("python");
        if !python.exists() {
            cmd!(sh, "python3 -m venv {venv}").run()?;
        }
        let server = root.join("bindings/python");
        eprintln!("xtask: pip install -v ./bindings/python (release) into {}", venv.display());
        cmd!(sh, "{python} -m pip install --quiet --disable-pip-version-check {server} numpy safetensors ml_dtypes")
            .env_remove("MATURIN_PEP517_ARGS")
            .run()
            .context("installing the ferry package (release) for the benchmark")?;
        crate::python_server::add_torch(sh, &python)?;
        let script = root.join("bindings/python/bench/bench_weights.py");
        let args = self.args;
        cmd!(sh, "{python} {script} {args...}").run()?;
        Ok(())
    }
}
