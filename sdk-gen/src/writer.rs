//! [`CodeWriter`]: lines with indentation, blank-line control, bracketed lists that fit
//! on one line or break one item per line, and word-wrapped comments. The emitters write
//! through it only, never by concatenating file-sized strings.

/// Builds one source file, line by line.
#[derive(Debug)]
pub struct CodeWriter {
    out: String,
    level: usize,
    unit: &'static str,
    width: usize,
}

impl CodeWriter {
    /// A writer indenting by `unit` per level, breaking lists longer than `width` columns.
    pub fn new(unit: &'static str, width: usize) -> CodeWriter {
        CodeWriter { out: String::new(), level: 0, unit, width }
    }

    /// The current indentation, in columns.
    pub fn indent_width(&self) -> usize {
        self.level * self.unit.len()
    }

    /// The width lines should stay within.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Writes one line at the current indentation (an empty `text` writes an empty line,
    /// without trailing spaces).
    pub fn line(&mut self, text: impl AsRef<str>) {
        let text = text.as_ref();
        if !text.is_empty() {
            for _ in 0..self.level {
                self.out.push_str(self.unit);
            }
            self.out.push_str(text.trim_end());
        }
        self.out.push('\n');
    }

    /// Writes `n` empty lines, counting those already at the end (so `blank(2)` twice still
    /// gives two), and none at the start of the file.
    pub fn blank(&mut self, n: usize) {
        if self.out.is_empty() {
            return;
        }
        let have = self.out.len() - self.out.trim_end_matches('\n').len();
        for _ in have.saturating_sub(1)..n {
            self.out.push('\n');
        }
    }

    /// Runs `f` one level deeper.
    pub fn indented(&mut self, f: impl FnOnce(&mut CodeWriter)) {
        self.level += 1;
        f(self);
        self.level -= 1;
    }

    /// `open` + items joined by `", "` + `close` on one line if it fits, else `open`, one
    /// item per line (each followed by `,`) one level deeper, then `close`.
    /// `open` is everything before the bracket's contents (e.g. `def f(`), `close`
    /// everything after (e.g. `) -> int:`).
    pub fn list(&mut self, open: &str, items: &[String], close: &str) {
        let flat = format!("{open}{}{close}", items.join(", "));
        if items.is_empty() || self.fits(&flat) {
            self.line(flat);
            return;
        }
        self.line(open);
        self.indented(|w| {
            for item in items {
                w.line(format!("{item},"));
            }
        });
        self.line(close);
    }

    /// Whether `text` fits on one line at the current indentation.
    pub fn fits(&self, text: &str) -> bool {
        !text.contains('\n') && self.indent_width() + text.chars().count() <= self.width
    }

    /// Writes `text` word-wrapped, each line starting with `prefix` (e.g. `"# "`, `" * "`);
    /// paragraphs (separated by empty lines) and lines that look like list items or code
    /// are kept apart.
    pub fn wrapped(&mut self, prefix: &str, text: &str) {
        let avail = self.width.saturating_sub(self.indent_width() + prefix.len()).max(20);
        for line in wrap(text, avail) {
            if line.is_empty() {
                self.line(prefix.trim_end());
            } else {
                self.line(format!("{prefix}{line}"));
            }
        }
    }

    /// The file: everything written, ending in exactly one newline.
    pub fn finish(self) -> String {
        let mut s = self.out.trim_end_matches('\n').to_owned();
        s.push('\n');
        s
    }
}

/// Word-wraps `text` to `width` columns. Line breaks in `text` are kept where the next line
/// starts a list item (`- `, `* `, `| `, a digit and `.`) or is indented, and at empty lines;
/// other single line breaks are spaces. Words longer than `width` stay whole.
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let flush = |current: &mut String, out: &mut Vec<String>| {
        if !current.is_empty() {
            out.push(std::mem::take(current));
        }
    };
    for raw in text.trim().lines() {
        let line = raw.trim_end();
        if line.trim().is_empty() {
            flush(&mut current, &mut out);
            if out.last().is_some_and(|l| !l.is_empty()) {
                out.push(String::new());
            }
            continue;
        }
        let keeps_break = line.starts_with(' ')
            || line.starts_with("- ")
            || line.starts_with("* ")
            || line.starts_with("| ")
            || line.split_once(". ").is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        if keeps_break {
            flush(&mut current, &mut out);
        }
        let (lead, words) = if keeps_break && line.starts_with(' ') {
            let trimmed = line.trim_start();
            (&line[..line.len() - trimmed.len()], trimmed)
        } else {
            ("", line)
        };
        for word in words.split_whitespace() {
            if current.is_empty() {
                current.push_str(lead);
                current.push_str(word);
            } else if current.chars().count() + 1 + word.chars().count() <= width {
                current.push(' ');
                current.push_str(word);
            } else {
                out.push(std::mem::take(&mut current));
                current.push_str(word);
            }
        }
    }
    flush(&mut current, &mut out);
    while out.last().is_some_and(String::is_empty) {
        out.pop();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_fit_or_break() {
        let mut w = CodeWriter::new("    ", 20);
        w.list("f(", &["a".into(), "b".into()], ")");
        w.indented(|w| w.list("call(", &["alpha".into(), "beta".into()], ")"));
        w.list("g(", &[], ")");
        assert_eq!(w.finish(), "f(a, b)\n    call(\n        alpha,\n        beta,\n    )\ng()\n");
    }

    #[test]
    fn blank_lines_do_not_pile_up() {
        let mut w = CodeWriter::new("  ", 80);
        w.blank(2);
        w.line("a");
        w.blank(2);
        w.blank(2);
        w.line("b");
        w.blank(1);
        w.line("");
        w.line("c");
        assert_eq!(w.finish(), "a\n\n\nb\n\n\nc\n");
    }

    #[test]
    fn wraps_words_and_keeps_lists() {
        let text = "one two three four five six\nseven\n\n- item one\n- item two\n  more";
        assert_eq!(
            wrap(text, 12),
            ["one two", "three four", "five six", "seven", "", "- item one", "- item two", "  more"]
        );
        assert_eq!(wrap("averyveryverylongword x", 5), ["averyveryverylongword", "x"]);
        assert!(wrap("  \n ", 10).is_empty());
    }
}
