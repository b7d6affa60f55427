//! `cargo xtask python-wheel [--dev]`: the `ferry-tensors` wheel as a user's machine gets
//! it, checked where no Rust toolchain can help.
//!
//! 1. `maturin build --release` (`--dev`: cargo's `dev` profile, for a quick local check)
//!    of `bindings/python`: one abi3 wheel (CPython >= 3.10) tagged `manylinux_2_*`
//!    (maturin checks the symbols it links against that tag), in `target/python-wheel/`.
//!    maturin comes from PyPI ([`MATURIN`]) into its own venv.
//! 2. An empty venv (`target/python-wheel-venv`, cleared each run) and a `PATH` with no
//!    directory holding `cargo` or `rustc` (and no `CARGO*`/`RUSTUP*` variables), checked
//!    first: everything below runs under it. Into the venv: the wheel (the one Python
//!    package: nothing else of this checkout); the pinned tools of
//!    `bindings/python/requirements-dev.txt`; torch from its cache venv
//!    ([`crate::python_server`]).
//! 3. Checks of the installed package: `py.typed` and the stubs are in it, `mypy.stubtest
//!    ferry._native` against the installed module, the `ferry` command runs (`ferry info`).
//! 4. pytest on `bindings/python/tests`, with `FERRY_BIN` the venv's `ferry` command (the
//!    wheel's, not a Rust binary).
//!
//! Each phase's time is printed at the end.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use xshell::{Shell, cmd};

use crate::flags::Flags;

/// The maturin that builds the wheel (the same as `bindings/python/pyproject.toml` allows).
pub const MATURIN: &str = "1.16.0";

/// `cargo xtask python-wheel`.
pub struct PythonWheel {
    /// Build with cargo's `dev` profile instead of `release`.
    pub dev: bool,
}

impl PythonWheel {
    /// Parses `--dev`.
    pub fn parse(mut flags: Flags) -> anyhow::Result<PythonWheel> {
        let dev = flags.flag("--dev");
        flags.finish("python-wheel")?;
        Ok(PythonWheel { dev })
    }

    /// Builds, installs and tests the wheel.
    pub fn run(self, sh: &Shell) -> anyhow::Result<()> {
        anyhow::ensure!(
            crate::python_sdk::has_python(sh),
            "python3 not found: the ferry Python package needs python3 >= 3.10"
        );
        let root = sh.current_dir();
        let target = crate::target_dir(sh)?;
        let mut times = Vec::new();

        let t = Instant::now();
        let wheel = build(sh, &root, &target, self.dev)?;
        times.push(("maturin build", t.elapsed()));

        let t = Instant::now();
        let path = path_without_rust()?;
        let venv = target.join("python-wheel-venv");
        let python = venv.join("bin").join("python");
        let bare = |c| bare(c, &path);
        bare(cmd!(sh, "python3 -m venv --clear {venv}")).run()?;
        let no_rust = "import shutil, sys; found = [t for t in ('cargo', 'rustc') if shutil.which(t)]; \
                       sys.exit(f'{found} on PATH') if found else print('xtask: no cargo or rustc on PATH')";
        bare(cmd!(sh, "{python} -c {no_rust}")).run().context("the install's PATH still reaches Rust")?;
        eprintln!("xtask: installing {} (and its dependencies from the registry)", wheel.display());
        bare(cmd!(sh, "{python} -m pip install --quiet --disable-pip-version-check {wheel}"))
            .run()
            .context("installing the wheel into an empty venv without Rust")?;
        let reqs = root.join("bindings/python/requirements-dev.txt");
        bare(cmd!(sh, "{python} -m pip install --quiet --disable-pip-version-check -r {reqs}")).run()?;
        crate::python_server::add_torch(sh, &python)?;
        times.push(("install into an empty venv", t.elapsed()));

        let t = Instant::now();
        let installed = "import pathlib, ferry; d = pathlib.Path(ferry.__file__).parent; \
                         missing = [f for f in ('py.typed', '_native.pyi') if not (d / f).is_file()]; \
                         assert not missing, f'the wheel lacks {missing}'; print('xtask: py.typed and stubs in', d)";
        bare(cmd!(sh, "{python} -c {installed}")).run()?;
        {
            // From the target directory: the installed module, not the source tree.
            let _dir = sh.push_dir(&target);
            bare(cmd!(sh, "{python} -m mypy.stubtest ferry._native"))
                .run()
                .context("the stubs (bindings/python/python/ferry/_native.pyi) do not match the installed module")?;
        }
        let ferry = venv.join("bin").join("ferry");
        bare(cmd!(sh, "{ferry} info")).run().context("the wheel's `ferry` command")?;
        times.push(("py.typed, stubtest, ferry info", t.elapsed()));

        let t = Instant::now();
        {
            let _dir = sh.push_dir(root.join("bindings/python"));
            bare(cmd!(sh, "{python} -m pytest -q -p no:cacheprovider tests"))
                .env("FERRY_BIN", &ferry)
                .run()
                .context("pytest bindings/python/tests against the installed wheel")?;
        }
        times.push(("pytest against the wheel", t.elapsed()));

        eprintln!("xtask python-wheel: {}", wheel.file_name().unwrap_or_default().to_string_lossy());
        for (what, d) in times {
            eprintln!("  {what:<32} {:>6.1} s", d.as_secs_f64());
        }
        Ok(())
    }
}

/// `maturin build` into `target/python-wheel/` (emptied first); the one wheel it made,
/// checked to be abi3 and manylinux.
fn build(sh: &Shell, root: &Path, target: &Path, dev: bool) -> anyhow::Result<PathBuf> {
    let tools = target.join("python-wheel-tools");
    let maturin = tools.join("bin").join("maturin");
    let have = cmd!(sh, "{maturin} --version").quiet().ignore_stderr().read().unwrap_or_default();
    if !have.contains(MATURIN) {
        cmd!(sh, "python3 -m venv --clear {tools}").run()?;
        let pip = tools.join("bin").join("pip");
        cmd!(sh, "{pip} install --quiet --disable-pip-version-check maturin=={MATURIN}").run()?;
    }
    let out = target.join("python-wheel");
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("emptying {}", out.display()))?;
    }
    let manifest = root.join("bindings/python/Cargo.toml");
    let profile: &[&str] = if dev { &["--profile", "dev"] } else { &["--release"] };
    eprintln!("xtask: maturin build {} (bindings/python)", profile.join(" "));
    cmd!(sh, "{maturin} build {profile...} --locked --manifest-path {manifest} --out {out}").run()?;
    let wheels: Vec<PathBuf> = std::fs::read_dir(&out)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    let [wheel] = wheels.as_slice() else {
        anyhow::bail!("maturin made {} wheels in {}, expected one", wheels.len(), out.display());
    };
    let name = wheel.file_name().unwrap_or_default().to_string_lossy().into_owned();
    anyhow::ensure!(
        name.starts_with("ferry_tensors-") && name.contains("-abi3-") && name.contains("manylinux"),
        "{name}: expected an abi3 manylinux wheel of ferry-tensors"
    );
    Ok(wheel.clone())
}

/// `c` with `path` as its `PATH`, no `CARGO*`, `RUSTUP*`, `RUSTC*` or `PYTHONPATH`
/// variables, and no bytecode written.
fn bare<'a>(c: xshell::Cmd<'a>, path: &OsString) -> xshell::Cmd<'a> {
    let mut c = c.env("PATH", path).env("PYTHONDONTWRITEBYTECODE", "1").env_remove("PYTHONPATH");
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("CARGO") || k.starts_with("RUSTUP") || k.starts_with("RUSTC") {
            c = c.env_remove(k.as_ref());
        }
    }
    c
}

/// This process's `PATH` without the directories that hold `cargo` or `rustc`.
fn path_without_rust() -> anyhow::Result<OsString> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let kept: Vec<PathBuf> = std::env::split_paths(&path)
        .filter(|d| !["cargo", "rustc"].iter().any(|t| d.join(t).exists()))
        .filter(|d| !d.to_string_lossy().contains(".cargo") && !d.to_string_lossy().contains(".rustup"))
        .collect();
    Ok(std::env::join_paths(kept)?)
}
