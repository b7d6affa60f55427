//! A JSON text's shape, measured on its bytes before it is parsed.
//!
//! Parsed into `serde_json::Value`s, a JSON text can take 17 times its size (each number of
//! `[0,0,...]` becomes a 32-byte value). [`check`] walks the bytes once, without
//! allocating, and refuses nesting deeper than [`MAX_DEPTH`], more values than a limit, or
//! (for JSON-RPC batches) a top-level array longer than a limit, before any of that memory
//! is taken. It does not validate JSON (the parser does, afterwards); it only counts,
//! stepping over strings. Used on message headers ([`crate::EndpointBuilder::max_header_values`])
//! and by ferry-rpc on plain JSON-RPC texts.

/// Nesting a parser accepts (serde_json stops at 128 too).
pub const MAX_DEPTH: usize = 128;

/// Which bound a text is over, and the count that went over it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShapeError {
    /// Nesting deeper than [`MAX_DEPTH`].
    Depth(usize),
    /// More elements in the top-level array than allowed.
    Batch(usize),
    /// More values (member names and containers included) than allowed.
    Values(usize),
}

/// Refuses `text` if it nests deeper than [`MAX_DEPTH`], holds more than `max_values`
/// values, or is an array of more than `max_batch` elements.
pub fn check(text: &[u8], max_batch: usize, max_values: usize) -> Result<(), ShapeError> {
    let mut depth = 0usize;
    let mut values = 0usize;
    // Elements of the top-level array so far (a batch), if the text is one.
    let mut batch: Option<usize> = None;
    // The current container at depth 1 has seen a value since its last comma.
    let mut i = 0;
    let mut in_value = false;
    while i < text.len() {
        let b = text[i];
        match b {
            b'"' => {
                // Step over the string (escapes included).
                i += 1;
                while i < text.len() && text[i] != b'"' {
                    i += if text[i] == b'\\' { 2 } else { 1 };
                }
                values += 1;
                if depth == 1 && !in_value {
                    in_value = true;
                    batch = batch.map(|n| n + 1);
                }
            }
            b'[' | b'{' => {
                if depth == 0 && b == b'[' {
                    batch = Some(0);
                } else if depth == 1 && !in_value {
                    in_value = true;
                    batch = batch.map(|n| n + 1);
                }
                depth += 1;
                values += 1;
                if depth > MAX_DEPTH {
                    return Err(ShapeError::Depth(depth));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b',' if depth == 1 => in_value = false,
            b' ' | b'\t' | b'\n' | b'\r' | b',' | b':' => {}
            _ => {
                // A number or a literal: one value, however many bytes.
                values += 1;
                if depth == 1 && !in_value {
                    in_value = true;
                    batch = batch.map(|n| n + 1);
                }
                while i + 1 < text.len()
                    && !matches!(text[i + 1], b',' | b']' | b'}' | b' ' | b'\n' | b'\r' | b'\t' | b':')
                {
                    i += 1;
                }
            }
        }
        if let Some(n) = batch
            && n > max_batch
        {
            return Err(ShapeError::Batch(n));
        }
        if values > max_values {
            return Err(ShapeError::Values(values));
        }
        i += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_values_depth_and_top_level_elements() {
        assert_eq!(check(br#"{"params":[0,0,0,0,0,0]}"#, 1, 9), Ok(()));
        assert_eq!(check(br#"{"params":[0,0,0,0,0,0]}"#, 1, 8), Err(ShapeError::Values(9)));
        assert_eq!(check(br#"["a\"]", "b,c", {}]"#, 3, 100), Ok(()));
        assert_eq!(check(br#"["a\"]", "b,c", {}]"#, 2, 100), Err(ShapeError::Batch(3)));
        assert_eq!(check("[".repeat(MAX_DEPTH + 1).as_bytes(), 1, 1 << 20), Err(ShapeError::Depth(MAX_DEPTH + 1)));
        assert_eq!(check("[".repeat(MAX_DEPTH).as_bytes(), 1, 1 << 20), Ok(()));
    }

    #[test]
    fn a_huge_flat_array_stops_at_the_first_value_over() {
        let text = format!("[{}0]", "0,".repeat(100_000));
        assert_eq!(check(text.as_bytes(), usize::MAX, 1000), Err(ShapeError::Values(1001)));
    }
}
