//! Line breaking of the Python expressions the emitter writes, as black breaks them.

use crate::writer::CodeWriter;

/// Writes the Python expression `e` followed by `end`, breaking it inside its brackets
/// (recursively, one argument per line with a trailing comma) until it fits, as black does.
pub(super) fn expr(w: &mut CodeWriter, e: &str, end: &str) {
    let flat = format!("{e}{end}");
    if w.fits(&flat) {
        w.line(flat);
        return;
    }
    let Some((head, args, close)) = split_call(e) else {
        w.line(flat);
        return;
    };
    w.line(head);
    w.indented(|w| {
        for a in &args {
            expr(w, a, ",");
        }
    });
    w.line(format!("{close}{end}"));
}

/// `f(a, g(b, c), {k: v})` -> (`f(`, [`a`, `g(b, c)`, `{k: v}`], `)`), splitting at the
/// outermost bracket's top-level commas (outside strings). A `key: value` item whose value
/// is bracketed keeps its key on the opening line.
pub(super) fn split_call(e: &str) -> Option<(String, Vec<String>, String)> {
    let bytes: Vec<char> = e.chars().collect();
    let open = first_bracket(&bytes)?;
    let close_char = match bytes[open] {
        '(' => ')',
        '[' => ']',
        _ => '}',
    };
    if *bytes.last()? != close_char {
        return None;
    }
    let inner: String = bytes[open + 1..bytes.len() - 1].iter().collect();
    let mut args = Vec::new();
    let mut depth = 0i32;
    let mut in_str: Option<char> = None;
    let mut current = String::new();
    let mut escaped = false;
    for c in inner.chars() {
        if let Some(q) = in_str {
            current.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                in_str = None;
            }
            continue;
        }
        match c {
            '"' | '\'' => {
                in_str = Some(c);
                current.push(c);
            }
            '(' | '[' | '{' => {
                depth += 1;
                current.push(c);
            }
            ')' | ']' | '}' => {
                depth -= 1;
                current.push(c);
            }
            ',' if depth == 0 => {
                args.push(current.trim().to_owned());
                current.clear();
            }
            _ => current.push(c),
        }
    }
    if !current.trim().is_empty() {
        args.push(current.trim().to_owned());
    }
    if args.is_empty() {
        return None;
    }
    let head: String = bytes[..=open].iter().collect();
    Some((head, args, close_char.to_string()))
}

/// The index of the first `(`, `[` or `{` outside string literals.
fn first_bracket(chars: &[char]) -> Option<usize> {
    let mut in_str: Option<char> = None;
    let mut escaped = false;
    for (i, &c) in chars.iter().enumerate() {
        match in_str {
            Some(_) if escaped => escaped = false,
            Some(_) if c == '\\' => escaped = true,
            Some(q) if c == q => in_str = None,
            Some(_) => {}
            None if c == '"' || c == '\'' => in_str = Some(c),
            None if matches!(c, '(' | '[' | '{') => return Some(i),
            None => {}
        }
    }
    None
}
