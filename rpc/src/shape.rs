//! A request's shape, measured on its bytes before it is parsed.
//!
//! Parsed into `serde_json::Value`s, a JSON text can take 17 times its size (each number of
//! `[0,0,...]` becomes a 32-byte value): a 63 MiB line took a gigabyte before the batch
//! limit refused it. [`check`] walks the bytes once, without allocating, and refuses a batch
//! longer than `max_batch`, nesting deeper than [`MAX_DEPTH`] or more values than
//! `max_request_values` before any of that memory is taken. It does not validate JSON (the
//! parser does, afterwards); it only counts, stepping over strings.

use crate::codes::ErrorObject;

/// Nesting the server parses (serde_json stops at 128 too).
pub const MAX_DEPTH: usize = 128;

/// Refuses `text` if its shape is over the limits; the error names the limit.
pub(crate) fn check(text: &[u8], max_batch: usize, max_values: usize) -> Result<(), ErrorObject> {
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
                    return Err(ErrorObject::new(
                        crate::codes::LIMIT_EXCEEDED,
                        format!(
                            "Limit exceeded: nesting depth of the request is over {MAX_DEPTH}, the JSON parser's \
                             own limit (max_depth, fixed)"
                        ),
                    )
                    .with_data(serde_json::json!({"limit": "max_depth", "value": depth, "max": MAX_DEPTH})));
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
            return Err(ErrorObject::limit("max_batch", "requests in the batch", n as u64, max_batch as u64));
        }
        if values > max_values {
            return Err(ErrorObject::limit(
                "max_request_values",
                "JSON values in one request (send tensors as tensors: inline base64 or a ferry pipe)",
                values as u64,
                max_values as u64,
            ));
        }
        i += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(text: &str, batch: usize, values: usize) -> Option<String> {
        check(text.as_bytes(), batch, values).err().map(|e| e.data.unwrap()["limit"].as_str().unwrap().to_owned())
    }

    #[test]
    fn counts_batch_elements_values_and_depth() {
        let call = r#"{"jsonrpc":"2.0","method":"add","params":[1,2],"id":"a,]}"}"#;
        assert_eq!(limit(call, 1, 100), None);
        let batch = format!("[{call}, {call} ,{call}]");
        assert_eq!(limit(&batch, 3, 100), None);
        assert_eq!(limit(&batch, 2, 100).as_deref(), Some("max_batch"));
        // Strings with brackets, commas and escaped quotes count as one value.
        assert_eq!(limit(r#"["a\"]", "b,c", {}]"#, 3, 100), None);
        assert_eq!(limit(r#"["a\"]", "b,c", {}]"#, 2, 100).as_deref(), Some("max_batch"));
        // A single call: its values count (member names too: the object, "params", the
        // array and six numbers are nine), its nesting too.
        assert_eq!(limit(r#"{"params":[0,0,0,0,0,0]}"#, 1, 9), None);
        assert_eq!(limit(r#"{"params":[0,0,0,0,0,0]}"#, 1, 8).as_deref(), Some("max_request_values"));
        let deep = "[".repeat(MAX_DEPTH + 1);
        assert_eq!(limit(&deep, 1, 1 << 20).as_deref(), Some("max_depth"));
        assert_eq!(limit(&"[".repeat(MAX_DEPTH), 1, 1 << 20), None);
    }

    #[test]
    fn a_huge_flat_array_is_refused_early() {
        let text = format!("[{}0]", "0,".repeat(100_000));
        assert_eq!(limit(&text, 1024, 1 << 20).as_deref(), Some("max_batch"));
    }
}
