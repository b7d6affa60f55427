//! Peer-supplied text made safe to log: [`peer_text`].
//!
//! A string a peer chose (a client's agent name, a refusal's detail, a reason it gave)
//! goes into log lines. Written raw, a newline in it forges a log line of the peer's
//! choosing and an ANSI escape reaches the operator's terminal. [`peer_text`] shows the
//! text as it is where it is printable and escapes the rest, so that one event stays one
//! line and nothing in it is interpreted.

use std::fmt;

/// The most characters of one peer string a log line shows; the rest is counted, not shown.
pub const MAX_SHOWN_CHARS: usize = 256;

/// `text` for a log line: printable characters as they are; `\` as `\\`; `\n`, `\r`, `\t`
/// as those two-character escapes; other control characters (ESC, C1 controls, DEL) and
/// the invisible direction and formatting marks (bidi overrides, zero-width characters)
/// as `\u{..}`. At most [`MAX_SHOWN_CHARS`] characters are shown, then `...(N more chars)`.
///
/// ```
/// use ferry_core::logsafe::peer_text;
/// assert_eq!(peer_text("evil\n\x1b[31mFORGED").to_string(), "evil\\n\\u{1b}[31mFORGED");
/// assert_eq!(peer_text("ferry-py/1.0 (café)").to_string(), "ferry-py/1.0 (café)");
/// ```
pub fn peer_text(text: &str) -> PeerText<'_> {
    PeerText(text)
}

/// A peer's string shown safely; see [`peer_text`].
#[derive(Debug, Clone, Copy)]
pub struct PeerText<'a>(&'a str);

/// Characters that print nothing but change how the text around them is shown.
fn invisible(c: char) -> bool {
    matches!(c,
        '\u{200B}'..='\u{200F}' // zero-width space, joiners, LRM, RLM
        | '\u{2028}' | '\u{2029}' // line and paragraph separators
        | '\u{202A}'..='\u{202E}' // bidi embeddings and overrides
        | '\u{2060}'..='\u{2069}' // word joiner, invisible operators, bidi isolates
        | '\u{FEFF}' // zero-width no-break space
    )
}

impl fmt::Display for PeerText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut chars = self.0.chars();
        for c in chars.by_ref().take(MAX_SHOWN_CHARS) {
            match c {
                '\\' => f.write_str("\\\\")?,
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_str("\\t")?,
                c if c.is_control() || invisible(c) => write!(f, "\\u{{{:x}}}", c as u32)?,
                c => fmt::Write::write_char(f, c)?,
            }
        }
        let more = chars.count();
        if more > 0 {
            write!(f, "...({more} more chars)")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_and_invisible_marks_are_escaped_and_printable_text_is_kept() {
        let shown = peer_text("a\nb\r\tc\x1b[2J\u{7f}\u{9b}d\u{202e}e\u{200b}f\\g é 日本").to_string();
        assert_eq!(shown, "a\\nb\\r\\tc\\u{1b}[2J\\u{7f}\\u{9b}d\\u{202e}e\\u{200b}f\\\\g é 日本");
        assert!(!shown.chars().any(|c| c.is_control() || invisible(c)), "{shown:?}");
    }

    #[test]
    fn a_long_string_is_cut_at_max_shown_chars_and_the_rest_counted() {
        let long = "x".repeat(MAX_SHOWN_CHARS + 10);
        assert_eq!(peer_text(&long).to_string(), format!("{}...(10 more chars)", "x".repeat(MAX_SHOWN_CHARS)));
        let exact = "y".repeat(MAX_SHOWN_CHARS);
        assert_eq!(peer_text(&exact).to_string(), exact);
    }
}
