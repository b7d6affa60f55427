//! The `ferry` command-line tool: [`ferry_commands::cli::main`] with this binary as the
//! program its benchmark peers run, on mimalloc.

use std::process::ExitCode;

/// mimalloc, not the system allocator: a server's memory comes back after a burst. Under
/// glibc's malloc, memory a burst of big requests (63 MiB lines, 16 MiB headers, 1,000
/// connections' buffers) freed stayed in its per-thread arenas, and `ferry serve` kept
/// 74 MiB over idle after `cargo xtask soak --full`; mimalloc returns freed pages to the
/// system. Its `no_thp` feature keeps transparent huge pages off: with them, a connection's
/// first 256 KiB read buffer on a fresh heap region cost a 2 MiB page.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let exe = match ferry_commands::self_exe::SelfExe::current() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("ferry: cannot find this program's own path: {e}");
            return ExitCode::FAILURE;
        }
    };
    ferry_commands::cli::main(std::env::args_os(), &exe)
}
