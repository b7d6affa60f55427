//! A request's shape, measured on its bytes before it is parsed ([`ferry_core::json_shape`]):
//! a 63 MiB `[0,0,...]` line took a gigabyte parsed before the batch limit refused it.

use ferry_core::json_shape::{self, ShapeError};

use crate::codes::ErrorObject;

/// Nesting the server parses (serde_json stops at 128 too).
pub const MAX_DEPTH: usize = json_shape::MAX_DEPTH;

/// Refuses `text` if its shape is over the limits (batch length `max_batch`, nesting
/// [`MAX_DEPTH`], `max_values` values); the error names the limit.
pub(crate) fn check(text: &[u8], max_batch: usize, max_values: usize) -> Result<(), ErrorObject> {
    json_shape::check(text, max_batch, max_values).map_err(|e| match e {
        ShapeError::Depth(depth) => ErrorObject::new(
            crate::codes::LIMIT_EXCEEDED,
            format!(
                "Limit exceeded: nesting depth of the request is over {MAX_DEPTH}, the JSON parser's own limit \
                 (max_depth, fixed)"
            ),
        )
        .with_data(serde_json::json!({"limit": "max_depth", "value": depth, "max": MAX_DEPTH})),
        ShapeError::Batch(n) => ErrorObject::limit("max_batch", "requests in the batch", n as u64, max_batch as u64),
        ShapeError::Values(n) => ErrorObject::limit(
            "max_request_values",
            "JSON values in one request (send tensors as tensors: inline base64 or a ferry pipe)",
            n as u64,
            max_values as u64,
        ),
    })
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
