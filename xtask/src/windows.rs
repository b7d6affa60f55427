//! `cargo xtask windows`: the Windows build (`x86_64-pc-windows-gnu`), linted and tested
//! under Wine.
//!
//! 1. Installs what it needs when missing: the rustup target, and (as root, with apt-get)
//!    `gcc-mingw-w64-x86-64` and `wine`. Where one cannot be installed, the step fails with a
//!    message naming it; it never skips silently.
//! 2. `cargo clippy --target x86_64-pc-windows-gnu --workspace --all-targets --all-features
//!    -- -D warnings`: every crate and feature (quic, http, cuda-ipc) compiles and is lint
//!    clean for Windows.
//! 3. A Wine prefix in `target/wine/prefix`, with a `ProcessPrng` shim
//!    (`xtask/wine/bcryptprimitives.c`: Rust's std needs bcryptprimitives.dll, which Wine
//!    8 lacks), then, every test binary built in one `cargo test --no-run` (one feature
//!    set, see [`crate::test_bins`]) and run with Wine:
//!    - `ferry-local`: unit tests, the named-pipe conformance suite (inline channel) and
//!      `tests/windows.rs` (the pipe's DACL, peer process and user, addresses);
//!    - `ferry-rpc`: JSON-RPC over named pipes (ferry frames and plain JSON);
//!    - the shm and cuda-ipc conformance suites, which must report themselves not viable
//!      (Linux only), every case ignored;
//!    - `ferry-cli --test cli`: `ferry serve` and `ferry call` as processes over a pipe.
//!
//! QUIC is compiled and linted but not run: quinn-udp sets socket options Wine 8 does not
//! implement (it queries `IPV6_V6ONLY` on IPv4 sockets and sets `IPV6_RECVECN`), so no QUIC
//! endpoint opens there.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use xshell::{Shell, cmd};

use crate::flags::Flags;
use crate::test_bins;

/// The Windows target.
const TARGET: &str = "x86_64-pc-windows-gnu";

/// `cargo xtask windows`.
pub struct Windows;

impl Windows {
    /// No options.
    pub fn parse(flags: Flags) -> anyhow::Result<Windows> {
        flags.finish("windows")?;
        Ok(Windows)
    }

    /// Installs, lints and tests (see the module docs).
    pub fn run(&self, sh: &Shell) -> anyhow::Result<()> {
        ensure_target(sh)?;
        ensure_tools(sh)?;
        cmd!(sh, "cargo clippy --target {TARGET} --workspace --all-targets --all-features --locked -- -D warnings")
            .run()?;
        let prefix = wine_prefix(sh)?;
        let _env = [
            sh.push_env("WINEPREFIX", &prefix),
            sh.push_env("WINEDEBUG", "-all"),
            sh.push_env("CARGO_TARGET_X86_64_PC_WINDOWS_GNU_RUNNER", "wine"),
        ];
        // One Wine server for every test binary, kept until `wineserver -k` below. By
        // default a server exits 3 s after its last process; a binary started as it shut
        // down failed at once with "wine client error:0: recvmsg: Connection reset by peer"
        // (seen in CI, before any test ran).
        cmd!(sh, "wineserver -p").quiet().run().context("starting a persistent wineserver")?;
        let tests = (|| -> anyhow::Result<()> {
            // One build for every binary below: `cargo test -p A` then `-p B` would rebuild
            // the shared crates for each package's own feature set.
            let bins = test_bins::build(sh, &build_args(sh)?)?;
            for bin in bins.iter().filter(|b| FULL.contains(&b.package.as_str())) {
                bin.run(sh, Some("wine"), &[])?;
            }
            // Linux-only channels say so: every case ignored, with the reason.
            for backend in ["ferry-shm", "ferry-cuda-ipc"] {
                let bin = test_bins::find(&bins, backend, "conformance")?;
                let _dir = sh.push_dir(&bin.dir);
                let out = bin.command(sh, Some("wine"), &[]).ignore_status().output()?;
                let text = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
                anyhow::ensure!(
                    out.status.success()
                        && text.contains("is not viable here")
                        && text.contains("Linux")
                        && text.contains("test result: ok. 0 passed; 0 failed;"),
                    "{backend}'s conformance under Wine did not report itself not viable (Linux only):\n{text}"
                );
                eprintln!("windows: {backend} is not viable, as expected: {}", first_line(&text, "not viable"));
            }
            test_bins::find(&bins, "ferry-cli", "cli")?.run(sh, Some("wine"), &[])?;
            Ok(())
        })();
        // Wine's server outlives the tests by a few seconds: stop it now.
        let _ = cmd!(sh, "wineserver -k").quiet().ignore_stderr().run();
        tests
    }
}

/// The packages whose every test (unit and integration) runs under Wine.
const FULL: &[&str] = &["ferry-local", "ferry-rpc"];

/// `cargo test --no-run` arguments for the Windows test binaries: the packages of
/// [`FULL`] whole (their unit tests and each of their `tests/*.rs`), the shm and cuda-ipc
/// conformance suites and ferry-cli's `cli` test. The packages are built together, so with
/// one feature set; `--lib` builds the other packages' unit tests too, which do not run.
fn build_args(sh: &Shell) -> anyhow::Result<Vec<String>> {
    let meta = crate::cargo_metadata(sh)?;
    let mut tests: Vec<String> = vec!["conformance".into(), "cli".into()];
    for package in meta["packages"].as_array().into_iter().flatten() {
        if !FULL.iter().any(|p| package["name"] == *p) {
            continue;
        }
        for target in package["targets"].as_array().into_iter().flatten() {
            if target["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "test")) {
                tests.extend(target["name"].as_str().map(str::to_owned));
            }
        }
    }
    tests.sort();
    tests.dedup();
    let mut args: Vec<String> = ["--target", TARGET, "--lib"].map(String::from).to_vec();
    for p in FULL.iter().chain(&["ferry-shm", "ferry-cuda-ipc", "ferry-cli"]) {
        args.extend(["-p".to_owned(), (*p).to_owned()]);
    }
    for t in tests {
        args.extend(["--test".to_owned(), t]);
    }
    Ok(args)
}

/// The first line of `text` containing `needle` (trimmed), or nothing.
fn first_line<'a>(text: &'a str, needle: &str) -> &'a str {
    text.lines().find(|l| l.contains(needle)).map_or("", str::trim)
}

/// Whether `program --version` runs.
fn has(sh: &Shell, program: &str) -> bool {
    cmd!(sh, "{program} --version").quiet().ignore_stdout().ignore_stderr().run().is_ok()
}

/// The rustup target, added when missing.
fn ensure_target(sh: &Shell) -> anyhow::Result<()> {
    let installed = cmd!(sh, "rustup target list --installed").quiet().read().context(
        "`rustup` is needed to add the x86_64-pc-windows-gnu target (install Rust with rustup: https://rustup.rs)",
    )?;
    if installed.lines().any(|l| l.trim() == TARGET) {
        return Ok(());
    }
    cmd!(sh, "rustup target add {TARGET}")
        .run()
        .with_context(|| format!("could not add the Rust target {TARGET} (`rustup target add {TARGET}`)"))?;
    Ok(())
}

/// mingw's gcc (the linker) and Wine, installed with apt-get when missing.
fn ensure_tools(sh: &Shell) -> anyhow::Result<()> {
    let missing: Vec<&str> = [("x86_64-w64-mingw32-gcc", "gcc-mingw-w64-x86-64"), ("wine", "wine")]
        .into_iter()
        .filter(|(program, _)| !has(sh, program))
        .map(|(_, package)| package)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let root = cmd!(sh, "id -u").quiet().read().is_ok_and(|u| u.trim() == "0");
    if !root || !has(sh, "apt-get") {
        bail!(
            "the Windows step needs {} and cannot install them here (it installs with apt-get as root); \
             install them (Debian: apt-get install {} wine64), or run the step elsewhere",
            missing.join(" and "),
            missing.join(" ")
        );
    }
    let _env = sh.push_env("DEBIAN_FRONTEND", "noninteractive");
    let packages: Vec<&str> = missing.iter().copied().chain(missing.contains(&"wine").then_some("wine64")).collect();
    cmd!(sh, "apt-get update -qq").run().context("apt-get update (for the Windows step's mingw and wine)")?;
    cmd!(sh, "apt-get install -y -qq --no-install-recommends {packages...}")
        .run()
        .with_context(|| format!("could not install {} with apt-get", missing.join(" ")))?;
    for program in ["x86_64-w64-mingw32-gcc", "wine"] {
        anyhow::ensure!(has(sh, program), "{program} is still missing after installing {}", missing.join(" "));
    }
    Ok(())
}

/// `target/wine/prefix`, made (once) and given the `ProcessPrng` shim.
fn wine_prefix(sh: &Shell) -> anyhow::Result<PathBuf> {
    let dir = crate::target_dir(sh)?.join("wine");
    let prefix = dir.join("prefix");
    let system32 = prefix.join("drive_c/windows/system32");
    if !system32.join("kernel32.dll").exists() {
        std::fs::create_dir_all(&prefix)?;
        let _env = [sh.push_env("WINEPREFIX", &prefix), sh.push_env("WINEDEBUG", "-all")];
        eprintln!("windows: making a Wine prefix in {} (once; about a minute)", prefix.display());
        let out = cmd!(sh, "wineboot --init").quiet().ignore_status().output().context("running wineboot --init")?;
        cmd!(sh, "wineserver -w").quiet().run()?;
        if !out.status.success() || !system32.join("kernel32.dll").exists() {
            let text = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
            // Half a prefix would be taken for a whole one by the next run.
            let _ = std::fs::remove_dir_all(&prefix);
            bail!("{}", boot_failure(sh, &prefix, out.status.code(), &text));
        }
    }
    let shim = build_shim(sh, &dir)?;
    std::fs::copy(&shim, system32.join("bcryptprimitives.dll"))
        .with_context(|| format!("copying the ProcessPrng shim into {}", system32.display()))?;
    Ok(prefix)
}

/// Room a Wine prefix takes (about 700 MiB for Wine 8), with a margin.
const PREFIX_BYTES: u64 = 1 << 30;

/// Why `wineboot --init` made no prefix, in words: what it exited with, the end of what
/// it printed, and the free disk, the usual cause. Wine exits with the low byte of an
/// NTSTATUS: 53 is `0xc0000135` (a DLL not found), which a full disk gives as "could not
/// load kernel32.dll" (checked on a 20 MiB tmpfs).
fn boot_failure(sh: &Shell, prefix: &Path, code: Option<i32>, text: &str) -> String {
    let tail: Vec<&str> = text.lines().rev().take(12).collect::<Vec<_>>().into_iter().rev().collect();
    let dir = prefix.parent().unwrap_or(prefix);
    let code = code.map_or_else(|| "was killed by a signal".to_owned(), |c| format!("exited with {c}"));
    let mut msg = format!("wineboot --init {code} and made no Wine prefix in {}", prefix.display());
    match crate::free_disk(sh, dir) {
        Some(free) if free < PREFIX_BYTES || text.contains("No space left on device") => {
            msg += &format!(
                "\nthe disk is full: {} free in {} and a prefix takes about 700 MiB; free some space \
             (`cargo clean` removes the build)",
                crate::gib(free),
                dir.display()
            )
        }
        Some(free) => msg += &format!(" ({} free there)", crate::gib(free)),
        None => {}
    }
    if tail.is_empty() {
        msg += "\nit printed nothing";
    } else {
        msg += &format!("\nthe last lines it printed:\n  {}", tail.join("\n  "));
    }
    msg
}

/// Builds `xtask/wine/bcryptprimitives.c` into `dir/bcryptprimitives.dll`.
fn build_shim(sh: &Shell, dir: &Path) -> anyhow::Result<PathBuf> {
    let src = crate::project_root().join("xtask/wine");
    let (c, def) = (src.join("bcryptprimitives.c"), src.join("bcryptprimitives.def"));
    let out = dir.join("bcryptprimitives.dll");
    cmd!(sh, "x86_64-w64-mingw32-gcc -O2 -shared -o {out} {c} {def} -lbcrypt").run()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What Wine 8 printed making a prefix on a full 20 MiB tmpfs (exit code 53).
    const FULL_DISK: &str = "wine: configuration in L\"/mnt/tiny/p\" has been updated.\n\
                             wine: could not load kernel32.dll, status c0000135\n\
                             wineserver: could not save registry branch to system.reg : No space left on device\n";

    #[test]
    fn a_failed_boot_says_the_disk_is_full_and_what_wine_printed() {
        let sh = Shell::new().unwrap();
        let dir = std::env::temp_dir();
        let msg = boot_failure(&sh, &dir.join("prefix"), Some(53), FULL_DISK);
        assert!(msg.starts_with("wineboot --init exited with 53 and made no Wine prefix in "), "{msg}");
        assert!(msg.contains("the disk is full: "), "{msg}");
        assert!(msg.contains("could not load kernel32.dll, status c0000135"), "{msg}");
        let quiet = boot_failure(&sh, &dir.join("prefix"), None, "");
        assert!(quiet.contains("was killed by a signal") && quiet.ends_with("it printed nothing"), "{quiet}");
    }
}
