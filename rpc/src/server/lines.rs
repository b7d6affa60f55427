//! Plain newline-delimited JSON for [`Server`](super::Server): reading a connection's
//! request lines (bounded, cancel-safe waits, yielding on long lines), parsing a request
//! text (a big one on a compute thread, under the parse budget), and writing a response as
//! one line with its tensors inline.

use serde_json::Value;
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

use super::response_ids;
use crate::codes::ErrorObject;
use crate::dispatch::Shared;
use crate::jsonrpc::failure;
use crate::limits::RpcLimits;
use crate::method::Reply;
use crate::tensor::refs_to_inline;

/// Requests at least this long are parsed on a compute thread, not on the reader (whose
/// runtime worker other connections need).
const PARSE_OFF_READER_BYTES: usize = 1 << 20;

/// Room for a request of `len` bytes under [`RpcLimits::max_parse_bytes_in_flight`]:
/// nothing for a small one (under [`PARSE_OFF_READER_BYTES`]), else its size in KiB (the
/// whole budget at most, so that one bigger than it goes alone), waited for.
pub(super) async fn parse_room(shared: &Shared, len: usize) -> Option<tokio::sync::OwnedSemaphorePermit> {
    if len < PARSE_OFF_READER_BYTES {
        return None;
    }
    let kib = (len.div_ceil(1 << 10)).min(shared.limits.max_parse_bytes_in_flight >> 10);
    let kib = u32::try_from(kib).unwrap_or(u32::MAX);
    // The semaphore is never closed.
    shared.parse_room.clone().acquire_many_owned(kib).await.ok()
}

/// Parses one plain JSON-RPC text (a request or a batch) after checking its shape
/// ([`crate::shape::check`]: batch length, depth, values) on the bytes; a big one on a
/// compute thread. A small `text` is handed back as it was (its buffer is reused); a big
/// one is freed on that thread and `text` left empty, so a connection does not keep
/// the memory of its biggest request and the reader does not pay for unmapping it.
pub(super) async fn parse_request(text: &mut Vec<u8>, limits: RpcLimits) -> Result<Value, ErrorObject> {
    parse_text(text, limits, false).await?.ok_or_else(|| ErrorObject::parse_error("the request is empty"))
}

/// [`parse_request`] for a line of a plain-JSON connection: `None` when it holds only
/// whitespace (skipped, like an empty line). A big line is looked at on a compute thread
/// too, and freed there, whatever it holds.
pub(super) async fn parse_line(text: &mut Vec<u8>, limits: RpcLimits) -> Result<Option<Value>, ErrorObject> {
    parse_text(text, limits, true).await
}

async fn parse_text(text: &mut Vec<u8>, limits: RpcLimits, skip_blank: bool) -> Result<Option<Value>, ErrorObject> {
    let parse = move |t: &[u8]| {
        if skip_blank && t.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        crate::shape::check(t, limits.max_batch, limits.max_request_values)?;
        crate::strict::parse(t).map(Some).map_err(ErrorObject::parse_error)
    };
    if text.len() < PARSE_OFF_READER_BYTES {
        return parse(text);
    }
    let owned = std::mem::take(text);
    ferry_core::compute::spawn(move || {
        // Parsing is compute: scheduled as blocking handlers are (SCHED_IDLE by default),
        // so the runtime's workers, and other clients' small calls, take the CPU first.
        crate::blocking::apply_priority();
        let r = parse(&owned);
        drop(owned);
        r
    })
    .await
    .map_err(|e| ErrorObject::internal(format!("parsing the request: {e}")))?
}

/// A response as one line of JSON, tensors inline (base64), unless they are over
/// `max_inline` bytes in all: then the same ids get a limit error saying to use a ferry pipe.
pub(super) fn inline_line(reply: Reply, max_inline: u64) -> Vec<u8> {
    let Reply { mut value, tensors } = reply;
    let total: u64 = tensors.iter().map(|t| t.nbytes() as u64).sum();
    let inlined = if total > max_inline {
        let e = ErrorObject::limit(
            "max_inline_bytes",
            "bytes of tensors in one result sent inline (base64) to a plain JSON or HTTP client; a ferry \
             pipe (the SDKs, ferry call) carries them without that copy, zero-copy over shm",
            total,
            max_inline,
        );
        Err(e)
    } else if tensors.is_empty() {
        Ok(())
    } else {
        refs_to_inline(&mut value, &tensors).map_err(ErrorObject::tensor)
    };
    drop(tensors);
    if let Err(e) = inlined {
        let errs: Vec<Value> = response_ids(&value).into_iter().map(|id| failure(id, e.clone())).collect();
        value = if value.is_array() { Value::Array(errs) } else { errs.into_iter().next().unwrap_or(Value::Null) };
    }
    let mut out = crate::strict::write(&value);
    out.push(b'\n');
    out
}

/// What [`wait_readable`] found.
pub(super) enum Readable {
    /// Bytes are buffered.
    Data,
    /// End of stream.
    Eof,
    /// Nothing arrived for the idle time while `idle` said so.
    Idle,
}

/// Waits for the next byte without consuming it (cancel-safe); gives up with
/// [`Readable::Idle`] after `idle` without bytes, checked again each `idle` while `idle_now`
/// says the connection is busy.
pub(super) async fn wait_readable<R: AsyncBufRead + Unpin>(
    r: &mut R,
    idle: std::time::Duration,
    idle_now: impl Fn() -> bool,
) -> Readable {
    loop {
        match tokio::time::timeout(idle, r.fill_buf()).await {
            Ok(Ok([])) => return Readable::Eof,
            Ok(Ok(_)) => return Readable::Data,
            Ok(Err(_)) => return Readable::Eof,
            Err(_) if idle_now() => return Readable::Idle,
            Err(_) => {}
        }
    }
}

/// What [`read_line`] found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Line {
    /// A line (without its newline) is in the buffer.
    Data,
    /// A line of this many bytes was over the limit and was skipped.
    TooLong(usize),
    /// End of stream.
    Eof,
}

/// Once a line outgrows this, [`read_line`] reserves its buffer's room up to the limit in
/// one step (address space: memory is committed only as the bytes arrive), so the buffer is
/// never moved while it grows. Doubling moved a 32 MiB buffer on the reader: 10 to 20 ms
/// that every other connection of that worker waited (`cargo xtask soak --full`).
const RESERVE_AT: usize = 1 << 20;

/// How many bytes of one line [`read_line`] reads before it yields to other tasks.
const YIELD_BYTES: usize = 64 << 10;

/// Reads one line into `buf`, never holding more than `max` bytes of it.
pub(super) async fn read_line<R: AsyncBufRead + Unpin>(
    r: &mut R,
    max: usize,
    buf: &mut Vec<u8>,
) -> std::io::Result<Line> {
    buf.clear();
    let mut total = 0usize;
    let mut too_long = false;
    let mut since_yield = 0usize;
    loop {
        // A long line gives the worker back every YIELD_BYTES: tokio's own budget lets a
        // reader whose socket always has data run 128 reads (8 MiB, some ms) in a row,
        // while the other connections on this worker wait.
        if since_yield >= YIELD_BYTES {
            since_yield = 0;
            tokio::task::yield_now().await;
        }
        let chunk = r.fill_buf().await?;
        if chunk.is_empty() {
            return Ok(match (total, too_long) {
                (0, _) => Line::Eof,
                (n, true) => Line::TooLong(n),
                _ => Line::Data,
            });
        }
        let (n, found) = match memchr::memchr(b'\n', chunk) {
            Some(i) => (i, true),
            None => (chunk.len(), false),
        };
        total += n;
        if !too_long {
            if buf.len() + n > max {
                too_long = true;
                buf.clear();
                buf.shrink_to(64 << 10);
            } else {
                if buf.len() + n > buf.capacity().max(RESERVE_AT) {
                    // Room for the whole limit at once, so the buffer is never moved again.
                    let _ = buf.try_reserve_exact(max - buf.len());
                }
                buf.extend_from_slice(&chunk[..n]);
            }
        }
        r.consume(n + usize::from(found));
        since_yield += n;
        if found {
            return Ok(if too_long { Line::TooLong(total) } else { Line::Data });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_bounded() {
        let data = b"{\"a\":1}\n0123456789abcdef\n\nlast".to_vec();
        let mut r = tokio::io::BufReader::with_capacity(4, &data[..]);
        let mut buf = Vec::new();
        assert_eq!(read_line(&mut r, 10, &mut buf).await.unwrap(), Line::Data);
        assert_eq!(buf, b"{\"a\":1}");
        assert_eq!(read_line(&mut r, 10, &mut buf).await.unwrap(), Line::TooLong(16));
        assert_eq!(read_line(&mut r, 10, &mut buf).await.unwrap(), Line::Data);
        assert!(buf.is_empty());
        assert_eq!(read_line(&mut r, 10, &mut buf).await.unwrap(), Line::Data);
        assert_eq!(buf, b"last");
        assert_eq!(read_line(&mut r, 10, &mut buf).await.unwrap(), Line::Eof);
    }

    /// Past RESERVE_AT the buffer takes its room up to the limit once, and is never moved
    /// again while the line arrives.
    #[tokio::test]
    async fn a_long_line_is_never_moved_while_it_grows() {
        let (len, max) = (3 * RESERVE_AT, 8 * RESERVE_AT);
        let mut data = vec![b'0'; len];
        data.push(b'\n');
        let mut r = tokio::io::BufReader::with_capacity(64 << 10, &data[..]);
        let mut buf = Vec::new();
        assert_eq!(read_line(&mut r, max, &mut buf).await.unwrap(), Line::Data);
        assert_eq!(buf.len(), len);
        // Doubling would have left 4 MiB here.
        assert_eq!(buf.capacity(), max, "the room was reserved up to the limit, once");
        let at = buf.as_ptr();
        // A second long line reuses the same room: no growth, no move.
        let mut r = tokio::io::BufReader::with_capacity(64 << 10, &data[..]);
        assert_eq!(read_line(&mut r, max, &mut buf).await.unwrap(), Line::Data);
        assert_eq!(buf.as_ptr(), at);
    }
}
