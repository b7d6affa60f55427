//! Recording the tiers' uses to a trace file ([`super::TierOptions::record_trace`]): one
//! JSON line per use, in [`crate::placement::trace::Trace::save`]'s format, so that
//! `cargo xtask placement-bench --trace FILE` replays a real run of the store.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::placement::Key;
use crate::placement::trace::Use;

/// The buffer between the uses and the file: a use writes a line into memory, the file is
/// written when it fills (and on [`Recorder::flush`]).
const BUFFER: usize = 64 << 10;

/// The trace file being written: stops at its limit or at the first write error (logged
/// once), never failing a use.
pub(super) struct Recorder {
    path: PathBuf,
    /// `None` once recording stopped (the limit, an error).
    out: Option<BufWriter<File>>,
    lines: u64,
    limit: u64,
}

impl Recorder {
    /// Creates (or truncates) `path`; recording stops after `limit` uses.
    pub(super) fn create(path: &Path, limit: u64) -> std::io::Result<Recorder> {
        let file = File::create(path)?;
        let out = (limit > 0).then(|| BufWriter::with_capacity(BUFFER, file));
        if limit == 0 {
            tracing::warn!(
                "placement trace {}: a limit of 0 uses records nothing (TierOptions::trace_limit)",
                path.display()
            );
        }
        Ok(Recorder { path: path.to_owned(), out, lines: 0, limit })
    }

    /// Appends a use of `key` (`bytes`); at the limit recording stops, saying so.
    pub(super) fn record(&mut self, key: Key, bytes: u64) {
        let Some(out) = self.out.as_mut() else { return };
        let written = serde_json::to_writer(&mut *out, &Use { key, bytes })
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n"));
        if let Err(e) = written {
            self.fail(&e);
            return;
        }
        self.lines += 1;
        if self.lines >= self.limit {
            tracing::warn!(
                "placement trace {}: {} uses recorded, the most TierOptions::trace_limit (`ferry serve-weights \
                 --record-trace-limit`) allows; recording stops",
                self.path.display(),
                self.limit
            );
            self.flush();
            self.out = None;
        }
    }

    /// Writes what is buffered to the file.
    pub(super) fn flush(&mut self) {
        if let Some(out) = self.out.as_mut()
            && let Err(e) = out.flush()
        {
            self.fail(&e);
        }
    }

    /// Uses recorded so far.
    pub(super) fn lines(&self) -> u64 {
        self.lines
    }

    fn fail(&mut self, e: &std::io::Error) {
        tracing::error!(
            "placement trace {}: {e}; recording stops after {} uses (the store goes on)",
            self.path.display(),
            self.lines
        );
        // (Dropping the writer would try the write again: its buffer is let go instead.)
        if let Some(out) = self.out.take() {
            let _ = out.into_parts();
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.flush();
    }
}
