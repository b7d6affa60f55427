//! Test binaries built in one cargo invocation and run as `cargo test` runs them.
//!
//! `cargo test -p A --test t` resolves features for `A` alone, so each package named on
//! its own rebuilds its dependencies with another feature set (ferry-core, tokio, the
//! conformance crate...). CI's steps instead build their test binaries with the feature set
//! of `cargo nextest run --workspace --all-features`, reusing that step's artifacts, and
//! run the binaries themselves: in the package's directory, with the variables cargo sets.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use xshell::{Cmd, Shell, cmd};

/// One test binary: a package's library unit tests or one of its `tests/*.rs`.
#[derive(Debug, Clone)]
pub struct TestBin {
    /// The package's name (`ferry-shm`).
    pub package: String,
    /// The target's name (`conformance`; the library's name for unit tests).
    pub target: String,
    /// The executable.
    pub exe: PathBuf,
    /// The package's directory (where cargo runs it).
    pub dir: PathBuf,
}

impl TestBin {
    /// The command that runs it with `args`, through `runner` when given (`wine`), in its
    /// package's directory with `CARGO_MANIFEST_DIR` and `CARGO_PKG_NAME` set.
    pub fn command<'a>(&self, sh: &'a Shell, runner: Option<&str>, args: &[&str]) -> Cmd<'a> {
        let exe = &self.exe;
        let c = match runner {
            Some(runner) => cmd!(sh, "{runner} {exe} {args...}"),
            None => cmd!(sh, "{exe} {args...}"),
        };
        c.env("CARGO_MANIFEST_DIR", &self.dir).env("CARGO_PKG_NAME", &self.package)
    }

    /// Runs it (see [`TestBin::command`]) in its package's directory, failing when it fails.
    pub fn run(&self, sh: &Shell, runner: Option<&str>, envs: &[(&str, &OsStr)]) -> anyhow::Result<()> {
        let _dir = sh.push_dir(&self.dir);
        let mut c = self.command(sh, runner, &[]);
        for (k, v) in envs {
            c = c.env(k, v);
        }
        c.run().with_context(|| format!("{}'s test `{}` failed", self.package, self.target))
    }
}

/// Builds test binaries with `cargo test --no-run --locked {args}` and returns each one
/// built. `args` select packages, targets and features (`--workspace --all-features --test
/// conformance`); diagnostics go to the terminal as usual.
pub fn build(sh: &Shell, args: &[impl AsRef<OsStr>]) -> anyhow::Result<Vec<TestBin>> {
    let out = cmd!(sh, "cargo test --no-run --locked --message-format=json-render-diagnostics {args...}")
        .read()
        .context("building the test binaries (`cargo test --no-run`, see cargo's output above)")?;
    parse(&out)
}

/// Finds `package`'s `target` among `bins`, or says which were built.
pub fn find<'a>(bins: &'a [TestBin], package: &str, target: &str) -> anyhow::Result<&'a TestBin> {
    bins.iter().find(|b| b.package == package && b.target == target).with_context(|| {
        let built: Vec<String> = bins.iter().map(|b| format!("{}:{}", b.package, b.target)).collect();
        format!("cargo built no test `{target}` for {package} (built: {})", built.join(", "))
    })
}

/// The test executables in cargo's JSON messages.
fn parse(messages: &str) -> anyhow::Result<Vec<TestBin>> {
    let mut bins = Vec::new();
    for line in messages.lines().filter(|l| l.starts_with('{')) {
        let m: serde_json::Value = serde_json::from_str(line).context("reading cargo's JSON messages")?;
        if m["reason"] != "compiler-artifact" || m["profile"]["test"] != true {
            continue;
        }
        let Some(exe) = m["executable"].as_str() else { continue };
        let manifest = m["manifest_path"].as_str().context("a compiler-artifact message without manifest_path")?;
        let dir = Path::new(manifest).parent().context("a manifest path without a directory")?.to_path_buf();
        bins.push(TestBin {
            package: package_name(m["package_id"].as_str().unwrap_or_default(), &dir),
            target: m["target"]["name"].as_str().unwrap_or_default().to_owned(),
            exe: PathBuf::from(exe),
            dir,
        });
    }
    Ok(bins)
}

/// The package's name from its id (`path+file:///w/cli#ferry-cli@0.1.0`, or
/// `path+file:///w/ferry#0.1.0` where the directory is the name).
fn package_name(id: &str, dir: &Path) -> String {
    match id.rsplit_once('#') {
        Some((_, tail)) if tail.contains('@') => tail.split('@').next().unwrap_or_default().to_owned(),
        _ => dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_test_executables_from_cargo_messages() {
        let messages = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/cli#ferry-cli@0.1.0","manifest_path":"/w/cli/Cargo.toml","target":{"kind":["test"],"name":"cli"},"profile":{"test":true},"executable":"/w/target/debug/deps/cli-1"}
{"reason":"compiler-artifact","package_id":"path+file:///w/ferry#0.1.0","manifest_path":"/w/ferry/Cargo.toml","target":{"kind":["lib"],"name":"ferry"},"profile":{"test":true},"executable":"/w/target/debug/deps/ferry-2"}
{"reason":"compiler-artifact","package_id":"registry+x#tokio@1.0.0","manifest_path":"/r/tokio/Cargo.toml","target":{"kind":["lib"],"name":"tokio"},"profile":{"test":false},"executable":null}
{"reason":"build-finished","success":true}"#;
        let bins = parse(messages).unwrap();
        assert_eq!(bins.len(), 2);
        assert_eq!((bins[0].package.as_str(), bins[0].target.as_str()), ("ferry-cli", "cli"));
        assert_eq!(bins[0].dir, Path::new("/w/cli"));
        assert_eq!((bins[1].package.as_str(), bins[1].target.as_str()), ("ferry", "ferry"));
        assert!(find(&bins, "ferry-cli", "cli").is_ok());
        let err = find(&bins, "ferry-shm", "conformance").unwrap_err().to_string();
        assert!(err.contains("ferry-cli:cli"), "{err}");
    }
}
