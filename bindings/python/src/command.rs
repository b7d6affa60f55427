//! The `ferry` command of the Python package: the same command line as the Rust `ferry`
//! binary ([`ferry_commands::cli::main`]), run in this process.

use std::path::PathBuf;

use ferry_commands::self_exe::SelfExe;
use pyo3::prelude::*;

/// Runs the `ferry` command line `argv` (the program name first) with the GIL released and
/// returns its exit status. `program` and `prefix` start another copy of this command (the
/// benchmark's peers): `sys.executable` and `["-m", "ferry"]`.
///
/// A server it starts (`serve`, `serve-weights`) stops on SIGINT or SIGTERM, handled by
/// the command (Python's own handlers do not run meanwhile).
#[pyfunction]
#[pyo3(signature = (argv, program, prefix))]
pub fn main(py: Python<'_>, argv: Vec<String>, program: PathBuf, prefix: Vec<String>) -> i32 {
    let exe = SelfExe { program, prefix: prefix.into_iter().map(Into::into).collect() };
    i32::from(py.detach(|| ferry_commands::cli::run(argv, &exe)))
}
