//! Ray in the Python package's venv, and `cargo xtask bench-ray` (issue 46): a torch tensor
//! from one Ray actor to another through ferry (`ferry.ray`), Ray's object store and Ray's
//! gloo transport, same run (`bindings/python/bench/bench_ray.py`).
//!
//! [`add_ray`] installs Ray ([`RAY`]) into the test venv of `cargo xtask python-server`, so
//! that `bindings/python/tests/test_ray.py` runs in CI: the wheel is ~80 MB and installed in
//! ~9 s here with a warm pip cache (the checks then take ~40 s). `FERRY_NO_RAY=1` skips it
//! (the Ray tests then say they are skipped).

use std::path::Path;

use anyhow::Context;
use xshell::{Shell, cmd};

use crate::flags::Flags;

/// The Ray the tests and the benchmark use (Ray Direct Transport's plug-in API is new in
/// 2.60 and alpha: pinned).
pub const RAY: &str = "2.60.0";

/// `pip install ray==RAY` into the venv of `python`, unless `FERRY_NO_RAY` is set.
pub(crate) fn add_ray(sh: &Shell, python: &Path) -> anyhow::Result<()> {
    if std::env::var("FERRY_NO_RAY").is_ok_and(|v| !v.is_empty() && v != "0") {
        eprintln!("xtask: FERRY_NO_RAY is set: the Ray tests will be skipped");
        return Ok(());
    }
    let start = std::time::Instant::now();
    cmd!(sh, "{python} -m pip install --quiet --disable-pip-version-check ray=={RAY}")
        .run()
        .context("installing Ray into the test venv (FERRY_NO_RAY=1 skips the Ray tests)")?;
    eprintln!("xtask: ray {RAY} installed in {:.1} s", start.elapsed().as_secs_f64());
    Ok(())
}

/// `cargo xtask bench-ray [ARGS..]`.
pub struct BenchRay {
    args: Vec<String>,
}

impl BenchRay {
    /// Takes every argument for the script (`--iters-big N`, `--iters-small N`, `--json PATH`).
    pub fn parse(flags: Flags) -> anyhow::Result<BenchRay> {
        Ok(BenchRay { args: flags.into_rest() })
    }

    /// Installs the package (release, as a user gets it), torch and Ray, and runs the
    /// benchmark once.
    pub fn run(self, sh: &Shell) -> anyhow::Result<()> {
        let root = sh.current_dir();
        let python = crate::python_server::install_release(sh, &root)?;
        crate::python_server::add_torch(sh, &python)?;
        add_ray(sh, &python)?;
        let _dir = sh.push_dir(root.join("bindings/python/bench"));
        let args = self.args;
        cmd!(sh, "{python} bench_ray.py {args...}").run()?;
        Ok(())
    }
}
