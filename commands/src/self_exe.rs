//! How a command starts another copy of itself: the benchmark's echo peer (`ferry __echo`),
//! `ferry serve` under the benchmark and the soak.
//!
//! The `ferry` binary is its own program (`std::env::current_exe()`); the Python package's
//! `ferry` command is the Python interpreter running `-m ferry`, so a peer is
//! `python -m ferry __echo ADDR` there. [`SelfExe`] holds the program and the arguments that
//! come before the subcommand.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

/// The program (and leading arguments) that runs this command line again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelfExe {
    /// The program.
    pub program: PathBuf,
    /// Arguments before the subcommand (`["-m", "ferry"]` for the Python package).
    pub prefix: Vec<OsString>,
}

impl SelfExe {
    /// The running binary, with no leading arguments (the `ferry` binary).
    pub fn current() -> std::io::Result<SelfExe> {
        Ok(SelfExe { program: std::env::current_exe()?, prefix: Vec::new() })
    }

    /// `program prefix..`, ready for the subcommand's arguments.
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.program);
        c.args(&self.prefix);
        c
    }

    /// `program prefix..` as text, for messages.
    pub fn display(&self) -> String {
        std::iter::once(self.program.display().to_string())
            .chain(self.prefix.iter().map(|a| a.to_string_lossy().into_owned()))
            .collect::<Vec<_>>()
            .join(" ")
    }
}
