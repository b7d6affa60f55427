//! A tiny hand-written argument parser: boolean flags and repeatable `--name VALUE` options.

use anyhow::bail;

/// The arguments after the subcommand name, consumed by the subcommand's `parse`.
pub struct Flags {
    /// Arguments not consumed yet.
    rest: Vec<String>,
}

impl Flags {
    /// Wraps the raw arguments.
    pub fn new(args: Vec<String>) -> Flags {
        Flags { rest: args }
    }

    /// Whether `-h` or `--help` was given anywhere.
    pub fn wants_help(&self) -> bool {
        self.rest.iter().any(|a| a == "-h" || a == "--help")
    }

    /// Consumes every occurrence of the boolean flag `name` (e.g. `--check`).
    pub fn flag(&mut self, name: &str) -> bool {
        let before = self.rest.len();
        self.rest.retain(|a| a != name);
        self.rest.len() != before
    }

    /// Consumes every `name VALUE` and `name=VALUE`, in order.
    pub fn values(&mut self, name: &str) -> anyhow::Result<Vec<String>> {
        let mut values = Vec::new();
        let mut kept = Vec::new();
        let mut args = std::mem::take(&mut self.rest).into_iter();
        while let Some(arg) = args.next() {
            if arg == name {
                match args.next() {
                    Some(v) if !v.starts_with("--") => values.push(v),
                    _ => bail!("{name} needs a value"),
                }
            } else if let Some(v) = arg.strip_prefix(name).and_then(|r| r.strip_prefix('=')) {
                values.push(v.to_owned());
            } else {
                kept.push(arg);
            }
        }
        self.rest = kept;
        Ok(values)
    }

    /// Every argument not consumed yet (for commands that pass them on).
    pub fn into_rest(self) -> Vec<String> {
        let mut rest = self.rest;
        // `cargo xtask bench-x -- --calls 9`: the `--` only says where the task's own
        // arguments end, it is not one of the script's.
        if rest.first().is_some_and(|a| a == "--") {
            rest.remove(0);
        }
        rest
    }

    /// Fails if any argument was not consumed.
    pub fn finish(self, command: &str) -> anyhow::Result<()> {
        if let Some(arg) = self.rest.first() {
            bail!("unexpected argument `{arg}` for `cargo xtask {command}` (see `cargo xtask help`)");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(args: &[&str]) -> Flags {
        Flags::new(args.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn parses_flags_and_values() {
        let mut f = flags(&["--backend", "pipe", "--release", "--require=shm", "--backend=quic"]);
        assert_eq!(f.values("--backend").unwrap(), ["pipe", "quic"]);
        assert_eq!(f.values("--require").unwrap(), ["shm"]);
        assert!(f.flag("--release"));
        assert!(!f.flag("--check"));
        f.finish("conformance").unwrap();
    }

    #[test]
    fn a_leading_separator_is_not_passed_on() {
        assert_eq!(flags(&["--", "--calls", "9"]).into_rest(), ["--calls", "9"]);
        assert_eq!(flags(&["--calls", "--"]).into_rest(), ["--calls", "--"]);
    }

    #[test]
    fn rejects_leftovers_and_missing_values() {
        assert!(flags(&["--nope"]).finish("tidy").is_err());
        assert!(flags(&["--backend"]).values("--backend").is_err());
        assert!(flags(&["--backend", "--release"]).values("--backend").is_err());
    }
}
