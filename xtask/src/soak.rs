//! `cargo xtask soak [--full] [--release]`: `ferry serve` under heavy and hostile load
//! (`ferry __soak`, commands/src/soak/), one table row per phase. The short mode is CI's step
//! (debug build, small counts); `--full` takes issue 14's counts and a release build, and
//! then runs the Python server's soak with issue 43's counts
//! ([`crate::python_server::soak`]; its short mode is a step of `python-server`).

use xshell::{Shell, cmd};

use crate::flags::Flags;

/// The soak's options.
pub struct Soak {
    full: bool,
    release: bool,
}

impl Soak {
    /// CI's mode: short, debug.
    pub const CI: Soak = Soak { full: false, release: false };

    /// `--full` (implies `--release`), `--release`.
    pub fn parse(mut flags: Flags) -> anyhow::Result<Soak> {
        let full = flags.flag("--full");
        let release = flags.flag("--release") || full;
        flags.finish("soak")?;
        Ok(Soak { full, release })
    }

    /// Builds `ferry` and runs the soak; fails when a phase's check fails.
    pub fn run(&self, sh: &Shell) -> anyhow::Result<()> {
        anyhow::ensure!(cfg!(target_os = "linux"), "the soak reads /proc: Linux only");
        // With QUIC: a phase soaks tokenless `quic://` connections (per-connection identities).
        let flag = self.release.then_some("--release");
        cmd!(sh, "cargo build -p ferry-cli --bin ferry --features quic --locked {flag...}").run()?;
        let ferry = crate::target_dir(sh)?.join(if self.release { "release" } else { "debug" }).join("ferry");
        let full = self.full.then_some("--full");
        cmd!(sh, "{ferry} __soak {full...}").run()?;
        if self.full {
            // The Python server's phases (its short mode runs in `python-server`).
            crate::python_server::soak(sh, true)?;
        }
        Ok(())
    }
}
