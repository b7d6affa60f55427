//! Small scanners for tidy's rules: Rust text with comments and literals blanked out,
//! whole identifiers, the attributes in front of an item, and Cargo.toml tables. Enough for
//! rustfmt-formatted code; not a parser.

/// Whether `c` can be part of a Rust identifier.
pub fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Byte offsets of `ident` in `code` where it is a whole identifier.
pub fn ident_positions(code: &str, ident: &str) -> Vec<usize> {
    code.match_indices(ident)
        .filter(|&(i, _)| {
            let before = code[..i].chars().next_back();
            let after = code[i + ident.len()..].chars().next();
            !before.is_some_and(is_ident_char) && !after.is_some_and(is_ident_char)
        })
        .map(|(i, _)| i)
        .collect()
}

/// `text` with the contents of comments and string / char literals replaced by spaces
/// (newlines kept, so line numbers still match).
pub fn blank_comments_and_strings(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let prev_is_ident = i > 0 && is_ident_char(chars[i - 1]);
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                blank(&mut out, chars[i]);
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
            }
        } else if c == 'r' && !prev_is_ident && matches!(next, Some('"' | '#')) {
            // Raw string r"..", r#".."#, or an identifier that starts with r (r#type).
            let hashes = chars[i + 1..].iter().take_while(|&&c| c == '#').count();
            if chars.get(i + 1 + hashes) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            out.push('r');
            out.extend(std::iter::repeat_n('#', hashes));
            out.push('"');
            i += 2 + hashes;
            while i < chars.len() {
                let closes =
                    chars[i] == '"' && chars[i + 1..].iter().take(hashes).filter(|&&c| c == '#').count() == hashes;
                if closes {
                    out.push('"');
                    out.extend(std::iter::repeat_n('#', hashes));
                    i += 1 + hashes;
                    break;
                }
                blank(&mut out, chars[i]);
                i += 1;
            }
        } else if c == '"' {
            out.push('"');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
                if let Some(&c) = chars.get(i) {
                    blank(&mut out, c);
                }
                i += 1;
            }
            if i < chars.len() {
                out.push('"');
                i += 1;
            }
        } else if c == '\'' && next == Some('\\') {
            // Escaped char literal: '\n', '\'', '\u{..}'.
            out.push('\'');
            i += 1;
            for &c in chars.iter().skip(i).take(2) {
                blank(&mut out, c);
            }
            i += 2;
            while i < chars.len() && chars[i] != '\'' {
                blank(&mut out, chars[i]);
                i += 1;
            }
            if i < chars.len() {
                out.push('\'');
                i += 1;
            }
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            // Plain char literal 'x' (a lifetime never has a quote two characters later).
            out.push('\'');
            blank(&mut out, chars[i + 1]);
            out.push('\'');
            i += 3;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// One `[header]` or `[[header]]` table of a TOML file, with its top-level keys.
pub struct TomlTable {
    /// The header line as written, e.g. `[features]` or `[[test]]` (`""` for the root).
    pub header: String,
    /// `(key, raw value text)`; multi-line arrays are joined into one value.
    pub entries: Vec<(String, String)>,
}

impl TomlTable {
    /// The raw value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

/// Splits a (Cargo.toml-style) TOML file into its tables. Handles comments, quoted keys
/// and multi-line arrays; not a full TOML parser (no multi-line strings).
pub fn toml_tables(text: &str) -> Vec<TomlTable> {
    let mut tables = vec![TomlTable { header: String::new(), entries: Vec::new() }];
    let mut pending: Option<(String, String, i32)> = None; // key, value so far, bracket depth
    for raw in text.lines() {
        let line = strip_toml_comment(raw).trim();
        if let Some((key, mut value, mut depth)) = pending.take() {
            depth += bracket_delta(line);
            value.push(' ');
            value.push_str(line);
            let table = tables.last_mut().expect("there is always a table");
            if depth > 0 {
                pending = Some((key, value, depth));
            } else {
                table.entries.push((key, value));
            }
            continue;
        }
        if line.is_empty() {
            continue;
        }
        if line.starts_with('[') {
            tables.push(TomlTable { header: line.split_whitespace().collect(), entries: Vec::new() });
            continue;
        }
        let Some((key, value)) = split_toml_key(line) else { continue };
        let depth = bracket_delta(value);
        let table = tables.last_mut().expect("there is always a table");
        if depth > 0 {
            pending = Some((key, value.to_owned(), depth));
        } else {
            table.entries.push((key, value.to_owned()));
        }
    }
    if let Some((key, value, _)) = pending {
        tables.last_mut().expect("there is always a table").entries.push((key, value));
    }
    tables
}

/// `key = value` to `(key, value)`, unquoting a quoted key.
fn split_toml_key(line: &str) -> Option<(String, &str)> {
    if let Some(rest) = line.strip_prefix('"') {
        let close = rest.find('"')?;
        let value = rest[close + 1..].trim_start().strip_prefix('=')?;
        return Some((rest[..close].to_owned(), value.trim()));
    }
    let (key, value) = line.split_once('=')?;
    let key = key.trim();
    if key.is_empty() || !key.chars().all(|c| is_ident_char(c) || c == '-' || c == '.') {
        return None;
    }
    Some((key.to_owned(), value.trim()))
}

/// `[` minus `]` outside of strings.
fn bracket_delta(s: &str) -> i32 {
    let mut in_str = false;
    let mut delta = 0;
    for c in s.chars() {
        match c {
            '"' => in_str = !in_str,
            '[' if !in_str => delta += 1,
            ']' if !in_str => delta -= 1,
            _ => {}
        }
    }
    delta
}

/// The line without a trailing `# comment` (a `#` inside a string is kept).
fn strip_toml_comment(line: &str) -> &str {
    let mut in_str = false;
    for (i, c) in line.char_indices() {
        match c {
            '"' => in_str = !in_str,
            '#' if !in_str => return &line[..i],
            _ => {}
        }
    }
    line
}

/// `"text"` to `text` (other values unchanged).
pub fn unquote(value: &str) -> &str {
    value.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(value)
}

/// `text` with every non-ASCII character replaced by `?`, so that byte offsets in it and
/// in `ascii_fold(&blank_comments_and_strings(text))` point at the same characters.
pub fn ascii_fold(text: &str) -> String {
    text.chars().map(|c| if c.is_ascii() { c } else { '?' }).collect()
}

/// The identifier that starts at byte `at` of `code` (after any whitespace), if any.
pub fn ident_at(code: &str, at: usize) -> Option<&str> {
    let rest = code[at..].trim_start();
    let len = rest.find(|c: char| !is_ident_char(c)).unwrap_or(rest.len());
    (len > 0).then(|| &rest[..len])
}

/// Where the item whose keyword (`mod`, `struct`, ..) is at byte `keyword` of `code`
/// starts: at its visibility (`pub`, `pub(crate)`, ..) if it has one.
pub fn item_start(code: &str, keyword: usize) -> usize {
    let before = code[..keyword].trim_end();
    let mut end = before.len();
    if before.ends_with(')') {
        match before.rfind('(') {
            Some(open) => end = code[..open].trim_end().len(),
            None => return keyword,
        }
    }
    let vis = &code[..end];
    if vis.ends_with("pub") && !vis[..vis.len() - 3].chars().next_back().is_some_and(is_ident_char) {
        vis.len() - 3
    } else {
        keyword
    }
}

/// The outer attributes (`#[..]`) written right before byte `start` of `code`, nearest
/// last, as their text in `raw`. `code` is `raw` with comments and literals blanked, both
/// through [`ascii_fold`], so doc comments between the attributes are skipped and a `]`
/// inside a string cannot end an attribute early.
pub fn attributes_before(code: &str, raw: &str, start: usize) -> Vec<String> {
    let mut attrs = Vec::new();
    let mut end = start;
    loop {
        let before = code[..end].trim_end();
        if !before.ends_with(']') {
            break;
        }
        let close = before.len() - 1;
        let mut depth = 0;
        let open = code[..=close].char_indices().rev().find(|&(_, c)| {
            match c {
                ']' => depth += 1,
                '[' => depth -= 1,
                _ => {}
            }
            depth == 0
        });
        let Some((open, _)) = open else { break };
        if !code[..open].ends_with('#') {
            break; // `#![..]` (inner) or not an attribute at all
        }
        attrs.push(raw[open - 1..=close].to_owned());
        end = open - 1;
    }
    attrs.reverse();
    attrs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blanks_comments_and_literals_keeping_offsets() {
        let src = "a // b\n/* c /* d */ e */ f \"g\\\"h\" 'i' '\\'' r#\"j\"# x<'a> r#type";
        let out = blank_comments_and_strings(src);
        assert_eq!(out.len(), src.len());
        assert_eq!(
            out.split_whitespace().collect::<Vec<_>>(),
            ["a", "f", "\"", "\"", "'", "'", "'", "'", "r#\"", "\"#", "x<'a>", "r#type"]
        );
    }

    #[test]
    fn finds_items_and_their_attributes() {
        let text = "#![allow(x)]\n/// Doc \u{e9}.\n#[cfg(feature = \"__a]\")]\n// note\n#[doc(hidden)]\npub(crate) mod m;\npub mod n;\nmod o;\n";
        let raw = ascii_fold(text);
        let code = ascii_fold(&blank_comments_and_strings(text));
        assert_eq!(raw.len(), code.len());
        let mods = ident_positions(&code, "mod");
        let names: Vec<_> = mods.iter().map(|&at| ident_at(&code, at + 3).unwrap()).collect();
        assert_eq!(names, ["m", "n", "o"]);
        let starts: Vec<_> = mods.iter().map(|&at| code[item_start(&code, at)..at].trim().to_owned()).collect();
        assert_eq!(starts, ["pub(crate)", "pub", ""]);
        let start = item_start(&code, mods[0]);
        assert_eq!(attributes_before(&code, &raw, start), ["#[cfg(feature = \"__a]\")]", "#[doc(hidden)]"]);
        assert!(attributes_before(&code, &raw, item_start(&code, mods[1])).is_empty());
    }
}
