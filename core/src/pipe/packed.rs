//! Packed messages (PROTOCOL.md §22.5): on a same-host ring whose peer granted
//! [`crate::wire::FEATURE_RING_MESSAGES`], a message of contiguous host tensors that travel
//! inline or by shm reference (no new segment to announce) goes as one binary ring record
//! instead of a MESSAGE frame. Its application header is still JSON; the tensor
//! descriptors are fixed-size binary fields, so neither side builds, prints or parses JSON
//! for them.
//!
//! The record (all integers little-endian):
//!
//! | bytes | what |
//! |---|---|
//! | 4 | `header_len`: length of the application header's JSON text |
//! | 4 | `tensors`: how many tensors follow |
//! | `header_len` | the JSON text, then zeros to a multiple of 8 |
//! | per tensor | dtype (u8, its index in [`DType::ALL`]), ndim (u8), where (u8), flags (u8), 4 zero bytes, byte length (u64); then by `where`: nothing (0, inline), segment, offset and lease (1, shm: [`ShmRef`]; flag 1 is `lazy_release`), or lease and offset (2, shm_return: [`ShmReturnRef`]), each u64; then the shape (ndim × u64) |
//! | the rest | the inline tensors' data: each one's bytes start at the next multiple of [`ALIGN`] from the start of this part; the record ends with the last one's last byte |
//!
//! Every field is a peer's claim: [`unpack`] checks each length against the record and
//! against this side's limits before it copies a byte, and a record that does not add up
//! is a [`ProtocolError::Ring`].
//!
//! [`pack`] and [`unpack`] are public for the shared test vectors
//! (`conformance/vectors/packed.json`); the pipe uses them itself.

use crate::dtype::{DType, Device};
use crate::error::{LimitError, PipeError, ProtocolError};
use crate::message::Message;
use crate::meta::{MAX_DIMS, TensorMeta};
use crate::tensor::{ALIGN, Storage, Tensor};
use crate::wire::{InlineRef, Limits, Location, ShmRef, ShmReturnRef};

/// The fixed part of a record: `header_len` and `tensors`.
const FIXED: usize = 8;
/// The fixed part of a tensor's descriptor (dtype, ndim, where, flags, padding, byte
/// length).
const DESC: usize = 16;
/// `where` values.
const INLINE: u8 = 0;
const SHM: u8 = 1;
const SHM_RETURN: u8 = 2;
/// The `lazy_release` flag of a shm tensor.
const LAZY: u8 = 1;

/// What a record may hold for this pipe: the peer's limits and the ring's largest record.
pub struct PackRoom<'a> {
    /// The receiver's limits (announced in the handshake).
    pub peer: &'a Limits,
    /// The ring's largest record.
    pub max_record: usize,
}

/// Packs `msg`, whose tensors its channels encoded to `locs`, into one record, or `None`
/// when it does not qualify: a tensor that is not a contiguous host tensor, a location a
/// record cannot hold (a new segment's announcement, whose descriptor travels on the
/// socket; another channel's), a record over `room.max_record`, or a header or payload over
/// the peer's limits (the MESSAGE frame path then reports it by name).
pub fn pack(msg: &Message, locs: &[Location], room: &PackRoom<'_>) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    pack_into(msg, locs, room, &mut out)?;
    Some(out)
}

/// [`pack`] into `out`, cleared first (a sender reuses one buffer); on `None`, what `out`
/// holds is no record.
pub(super) fn pack_into(msg: &Message, locs: &[Location], room: &PackRoom<'_>, out: &mut Vec<u8>) -> Option<()> {
    let mut data_len = 0usize;
    let mut descs_len = 0usize;
    for (t, loc) in msg.tensors.iter().zip(locs) {
        let host = matches!(t.storage(), Storage::Host(_));
        if !host || t.device() != Device::Cpu || t.meta().strides.is_some() {
            return None;
        }
        descs_len += DESC + 8 * t.shape().len();
        match loc {
            Location::Inline(_) => data_len = data_len.next_multiple_of(ALIGN).checked_add(t.nbytes())?,
            Location::Shm(r) if r.announce.is_none() => descs_len += 24,
            Location::ShmReturn(_) => descs_len += 16,
            _ => return None,
        }
    }
    if locs.len() != msg.tensors.len() || data_len as u64 > room.peer.max_payload_bytes {
        return None;
    }
    // Over the ring's largest record whatever the header: nothing is reserved for it.
    if FIXED.checked_add(descs_len)?.checked_add(data_len)? > room.max_record {
        return None;
    }
    out.clear();
    out.reserve(FIXED + 64 + descs_len + data_len);
    out.extend_from_slice(&[0; FIXED]);
    serde_json::to_writer(&mut *out, &msg.header).ok()?;
    let header_len = u32::try_from(out.len() - FIXED).ok()?;
    if header_len > room.peer.max_header_bytes {
        return None;
    }
    if out.len().next_multiple_of(8).checked_add(descs_len + data_len)? > room.max_record {
        return None;
    }
    out[..4].copy_from_slice(&header_len.to_le_bytes());
    out[4..8].copy_from_slice(&u32::try_from(msg.tensors.len()).ok()?.to_le_bytes());
    pad_to(out, 8);
    for (t, loc) in msg.tensors.iter().zip(locs) {
        let dtype = DType::ALL.iter().position(|d| *d == t.dtype())?;
        let (place, flags, fields): (u8, u8, &[u64]) = match loc {
            Location::Shm(r) => (SHM, if r.lazy_release { LAZY } else { 0 }, &[r.segment, r.offset, r.lease]),
            Location::ShmReturn(r) => (SHM_RETURN, 0, &[r.lease, r.offset]),
            _ => (INLINE, 0, &[]),
        };
        out.extend_from_slice(&[u8::try_from(dtype).ok()?, u8::try_from(t.shape().len()).ok()?, place, flags]);
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&(t.nbytes() as u64).to_le_bytes());
        for v in fields.iter().chain(t.shape()) {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    let data_start = out.len();
    for (t, loc) in msg.tensors.iter().zip(locs) {
        if let Location::Inline(_) = loc {
            let at = data_start + (out.len() - data_start).next_multiple_of(ALIGN);
            out.resize(at, 0);
            out.extend_from_slice(t.as_bytes());
        }
    }
    Some(())
}

/// The most of a sender's record buffer kept between sends ([`trim_scratch`]).
pub(super) const SCRATCH_KEEP: usize = 64 << 10;

/// Lets go of a big record's memory once it is out: the buffer a sender keeps between
/// sends stays small (a record may be as big as the ring's largest).
pub(super) fn trim_scratch(scratch: &mut Vec<u8>) {
    if scratch.capacity() > SCRATCH_KEEP {
        *scratch = Vec::new();
    }
}

/// Zeros up to the next multiple of `n` (of the record's length).
fn pad_to(out: &mut Vec<u8>, n: usize) {
    out.resize(out.len().next_multiple_of(n), 0);
}

/// What [`unpack`] checks a record against: this side's limits.
pub struct UnpackRules<'a> {
    /// This side's limits.
    pub limits: &'a Limits,
    /// [`crate::EndpointBuilder::max_header_values`].
    pub max_header_values: usize,
}

/// A tensor a record describes, before its bytes are found.
struct Described {
    meta: TensorMeta,
    nbytes: u64,
    /// An inline tensor's bytes in the data part.
    span: std::ops::Range<usize>,
    loc: Location,
}

/// Rebuilds the message a record holds, after checking every field (module docs). Inline
/// tensors' bytes are copied once, into fresh [`ALIGN`]-aligned memory; `decode` finds the
/// others' (the CPU channel's session: `decode(index, meta, location)`).
pub fn unpack(
    record: &[u8],
    rules: &UnpackRules<'_>,
    mut decode: impl FnMut(usize, TensorMeta, &Location) -> Result<Tensor, PipeError>,
) -> Result<Message, PipeError> {
    let bad = |what: String| PipeError::from(ProtocolError::Ring(format!("a packed message {what}")));
    let limits = rules.limits;
    let Some((fixed, _)) = record.split_first_chunk::<FIXED>() else {
        return Err(bad(format!("record of {} bytes is shorter than its 8-byte start", record.len())));
    };
    let header_len = u32::from_le_bytes([fixed[0], fixed[1], fixed[2], fixed[3]]);
    let count = u32::from_le_bytes([fixed[4], fixed[5], fixed[6], fixed[7]]);
    if header_len > limits.max_header_bytes {
        return Err(PipeError::Limit(LimitError::endpoint(
            "max_header_bytes",
            "message header length",
            header_len.into(),
            limits.max_header_bytes.into(),
            " on the receiving side",
        )));
    }
    if count > limits.max_tensors {
        return Err(PipeError::Limit(LimitError {
            limit: "max_tensors",
            what: "tensors in a received message",
            value: count.into(),
            max: limits.max_tensors.into(),
            hint: "raise it with Limits::max_tensors (EndpointBuilder::limits) on the receiving side".into(),
        }));
    }
    let header_end = FIXED + header_len as usize;
    let Some(header) = record.get(FIXED..header_end) else {
        return Err(bad(format!("claims a {header_len}-byte header in a {}-byte record", record.len())));
    };
    let mut at = header_end.next_multiple_of(8);
    // Room for what the record can hold, not for what it claims: a 16-byte record saying
    // 65,536 tensors must not cost megabytes before it is found out.
    let mut described = Vec::with_capacity((count as usize).min(record.len().saturating_sub(at) / DESC));
    for index in 0..count as usize {
        let Some(d) = record.get(at..).and_then(|r| r.first_chunk::<DESC>()) else {
            return Err(bad(format!("ends inside the descriptor of tensor {index}")));
        };
        let tensor_err = |reason: String| PipeError::from(ProtocolError::BadTensor { index, reason });
        let dtype =
            *DType::ALL.get(usize::from(d[0])).ok_or_else(|| tensor_err(format!("unknown dtype number {}", d[0])))?;
        let ndim = usize::from(d[1]);
        if ndim > MAX_DIMS {
            return Err(tensor_err(format!("{ndim} dimensions, over {MAX_DIMS}")));
        }
        let allowed_flags = if d[2] == SHM { LAZY } else { 0 };
        if d[3] & !allowed_flags != 0 || d[4..8] != [0; 4] {
            return Err(tensor_err(format!("reserved descriptor bits are set (flags {:#04x})", d[3])));
        }
        let nbytes = u64::from_le_bytes(d[8..16].try_into().expect("8 bytes"));
        let fields = match d[2] {
            INLINE => 0,
            SHM => 3,
            SHM_RETURN => 2,
            other => return Err(tensor_err(format!("unknown place number {other}"))),
        };
        let end = at + DESC + 8 * (fields + ndim);
        let Some(words) = record.get(at + DESC..end) else {
            return Err(bad(format!("ends inside the descriptor of tensor {index}")));
        };
        at = end;
        let mut words = words.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")));
        let mut field = [0u64; 3];
        for f in field.iter_mut().take(fields) {
            *f = words.next().unwrap_or_default();
        }
        let loc = match d[2] {
            SHM => Location::Shm(ShmRef {
                segment: field[0],
                offset: field[1],
                len: nbytes,
                lease: field[2],
                announce: None,
                lazy_release: d[3] & LAZY != 0,
            }),
            SHM_RETURN => Location::ShmReturn(ShmReturnRef { lease: field[0], offset: field[1], len: nbytes }),
            _ => Location::Inline(InlineRef { offset: 0, len: nbytes }),
        };
        let shape: Vec<u64> = words.collect();
        described.push(Described { meta: TensorMeta::new(dtype, shape), nbytes, span: 0..0, loc });
    }
    let data = &record[at.min(record.len())..];
    let mut end = 0u64;
    let mut inline = 0usize;
    for (index, d) in described.iter_mut().enumerate() {
        if let Location::Inline(_) = d.loc {
            let start = end.next_multiple_of(ALIGN as u64);
            end = start.checked_add(d.nbytes).filter(|e| *e <= data.len() as u64).ok_or_else(|| {
                bad(format!("claims {} bytes for tensor {index}, past the {} bytes of data", d.nbytes, data.len()))
            })?;
            d.span = start as usize..end as usize;
            inline += 1;
        }
    }
    if end != data.len() as u64 {
        return Err(bad(format!("has {} bytes after its last tensor", data.len() as u64 - end)));
    }
    if end > limits.max_payload_bytes {
        return Err(PipeError::Limit(LimitError::endpoint(
            "max_payload_bytes",
            "message payload length",
            end,
            limits.max_payload_bytes,
            " on the receiving side",
        )));
    }
    super::read::count_header_values(header, rules.max_header_values)?;
    // (`null`, the header of most messages, without the parser.)
    let header: serde_json::Value = if header == b"null" {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(header).map_err(|e| ProtocolError::BadHeader(e.to_string()))?
    };
    // One copy for the inline tensors; a lone one owns it whole (no second handle).
    let mut whole = (inline > 0).then(|| crate::frame::aligned_copy(data));
    let mut tensors = Vec::with_capacity(described.len());
    for (index, d) in described.into_iter().enumerate() {
        let t = match d.loc {
            Location::Inline(_) => {
                let part = if inline == 1 { whole.take() } else { whole.as_ref().map(|b| b.slice(d.span)) };
                Tensor::new(d.meta, part.unwrap_or_default())
                    .map_err(|e| ProtocolError::BadTensor { index, reason: e.to_string() })?
            }
            loc => decode(index, d.meta, &loc)?,
        };
        tensors.push(t);
    }
    Ok(Message { header, tensors })
}

#[cfg(test)]
mod tests;
