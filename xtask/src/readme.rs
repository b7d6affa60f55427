//! `cargo xtask readme`: the README's shell blocks, run as written.
//!
//! Every fenced `sh` block of `README.md` runs in a fresh temporary directory under
//! `bash` with `set -euo pipefail`, a debug `ferry` built with the features the README
//! names for it (`rpc`, `http`) first on `PATH`, and the jobs it started in the background
//! killed when it ends. A block fails the step when a command in it fails or it runs past
//! [`LIMIT`]. The only blocks not run are those the README marks, on the line just above
//! the fence, as long-running demos, with why:
//!
//! ```text
//! <!-- readme: long-running demo (a server in the foreground, across two hosts) -->
//! ```

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use xshell::{Shell, cmd};

/// The most one block may run (`timeout` ends it past this).
pub const LIMIT: Duration = Duration::from_secs(300);

/// The marker that skips the block below it, followed by `(REASON) -->`.
const SKIP: &str = "<!-- readme: long-running demo (";

/// A fenced `sh` block of the README.
#[derive(Debug, PartialEq)]
pub struct Block {
    /// The line of its opening fence (1-based).
    pub line: usize,
    /// Its text, one command per line as a user would paste it.
    pub text: String,
    /// Why it is not run (`None`: it is run).
    pub skip: Option<String>,
}

/// The `sh` blocks of a Markdown text, with the skip markers above them.
pub fn sh_blocks(markdown: &str) -> anyhow::Result<Vec<Block>> {
    let lines: Vec<&str> = markdown.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let fence = lines[i].trim_start();
        if !fence.starts_with("```") {
            i += 1;
            continue;
        }
        let lang = fence.trim_start_matches('`').split_whitespace().next().unwrap_or("");
        let start = i;
        let end = (i + 1..lines.len())
            .find(|&j| lines[j].trim_start().starts_with("```"))
            .with_context(|| format!("README.md:{}: a code block that is never closed", start + 1))?;
        if matches!(lang, "sh" | "bash" | "shell" | "console") {
            let marker = start.checked_sub(1).map(|p| lines[p].trim()).unwrap_or("");
            let skip = match marker.strip_prefix(SKIP) {
                Some(rest) => {
                    let reason = rest.strip_suffix(") -->").unwrap_or("").trim();
                    if reason.is_empty() {
                        bail!("README.md:{}: a long-running-demo marker must say why: {SKIP}REASON) -->", start);
                    }
                    Some(reason.to_owned())
                }
                None => None,
            };
            let mut text = lines[start + 1..end].join("\n");
            text.push('\n');
            blocks.push(Block { line: start + 1, text, skip });
        }
        i = end + 1;
    }
    Ok(blocks)
}

/// What a block runs as: strict bash, its background jobs killed when it ends or is
/// stopped.
pub fn script(block: &Block) -> String {
    format!(
        "set -euo pipefail\n\
         trap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n\
         trap 'exit 143' TERM INT\n\
         {}",
        block.text
    )
}

/// Builds `ferry`, then runs every block not marked as a long-running demo.
pub fn run(sh: &Shell) -> anyhow::Result<()> {
    let root = sh.current_dir();
    let readme = std::fs::read_to_string(root.join("README.md")).context("reading README.md")?;
    let blocks = sh_blocks(&readme)?;
    for tool in ["bash", "curl", "timeout"] {
        let probe = format!("command -v {tool}");
        if cmd!(sh, "sh -c {probe}").quiet().ignore_stdout().run().is_err() {
            bail!("`{tool}` is missing: the README's blocks need it");
        }
    }
    cmd!(sh, "cargo build -p ferry-cli --features http --locked").run()?;
    let bin_dir = crate::target_dir(sh)?.join("debug");
    anyhow::ensure!(
        bin_dir.join("ferry").exists(),
        "cargo build -p ferry-cli made no {}",
        bin_dir.join("ferry").display()
    );
    let path = std::env::join_paths(
        std::iter::once(bin_dir.clone()).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )?;
    let mut ran = 0;
    for block in &blocks {
        if let Some(why) = &block.skip {
            eprintln!("README.md:{}: skipped, a long-running demo ({why})", block.line);
            continue;
        }
        eprintln!("README.md:{}: running\n{}", block.line, block.text);
        run_block(block, &path)?;
        ran += 1;
    }
    eprintln!("readme: {ran} block(s) ran as written, {} skipped as long-running demos", blocks.len() - ran);
    Ok(())
}

/// Runs one block in a fresh temporary directory with `PATH` set to `path`.
fn run_block(block: &Block, path: &std::ffi::OsStr) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("ferry-readme-{}-{}", std::process::id(), block.line));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("block.sh");
    std::fs::write(&file, script(block))?;
    let status = Command::new("timeout")
        .args(["--kill-after=10", &format!("{}", LIMIT.as_secs()), "bash"])
        .arg(&file)
        .current_dir(&dir)
        .env("PATH", path)
        .status()
        .context("running bash")?;
    let _ = std::fs::remove_dir_all(&dir);
    match status.code() {
        Some(0) => Ok(()),
        Some(124) => bail!("README.md:{}: the block ran past {} s", block.line, LIMIT.as_secs()),
        _ => bail!("README.md:{}: the block failed as written ({status})", block.line),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_found_with_their_markers() {
        let md = "text\n```sh\nls\n```\n<!-- readme: long-running demo (a server in the foreground) -->\n```sh\nferry serve\n```\n\
                  ```rust\nfn main() {}\n```\n";
        let blocks = sh_blocks(md).unwrap();
        assert_eq!(
            blocks,
            [
                Block { line: 2, text: "ls\n".into(), skip: None },
                Block { line: 6, text: "ferry serve\n".into(), skip: Some("a server in the foreground".into()) },
            ]
        );
        let err = sh_blocks("<!-- readme: long-running demo () -->\n```sh\nls\n```\n").unwrap_err();
        assert!(err.to_string().contains("must say why"), "{err}");
        assert!(sh_blocks("```sh\nls\n").unwrap_err().to_string().contains("never closed"));
    }

    /// The README's JSON-RPC block (the one a new user tripped on) is run, not skipped, and
    /// every skipped block says why.
    #[test]
    fn the_readme_runs_its_json_rpc_block() {
        let readme = std::fs::read_to_string(crate::project_root().join("README.md")).unwrap();
        let blocks = sh_blocks(&readme).unwrap();
        let rpc =
            blocks.iter().find(|b| b.text.contains("ferry call unix:ferry-demo add")).expect("the JSON-RPC block");
        assert_eq!(rpc.skip, None, "the README's JSON-RPC block must run in `cargo xtask readme`");
        assert!(rpc.text.contains("--http"), "{}", rpc.text);
        assert!(blocks.iter().all(|b| b.skip.as_deref().is_none_or(|w| !w.is_empty())));
    }

    /// A block runs with its background jobs stopped at its end, and a failing command fails it.
    #[test]
    #[cfg(target_os = "linux")]
    fn a_block_fails_on_a_failing_command_and_leaves_no_job_behind() {
        let path = std::env::var_os("PATH").unwrap();
        let pid_file = std::env::temp_dir().join(format!("ferry-readme-test-{}.pid", std::process::id()));
        let ok = Block { line: 9001, text: format!("sleep 600 &\necho $! > {}\n", pid_file.display()), skip: None };
        run_block(&ok, &path).unwrap();
        let pid = std::fs::read_to_string(&pid_file).unwrap();
        let _ = std::fs::remove_file(&pid_file);
        let proc = std::path::PathBuf::from(format!("/proc/{}", pid.trim()));
        // The kill is sent before bash exits; the process may take a moment to be gone.
        for _ in 0..500 {
            if !proc.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!proc.exists(), "the block's background job {} outlived it", pid.trim());
        let bad = Block { line: 9002, text: "true\nfalse\necho never\n".into(), skip: None };
        let err = run_block(&bad, &path).unwrap_err();
        assert!(err.to_string().contains("README.md:9002: the block failed as written"), "{err}");
    }
}
