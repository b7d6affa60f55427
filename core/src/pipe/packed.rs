//! Packed messages (PROTOCOL.md §22.5): on a same-host ring whose peer granted
//! [`crate::wire::FEATURE_RING_MESSAGES`], a message whose tensors all travel inline goes as
//! one binary ring record instead of a MESSAGE frame. Its application header is still JSON;
//! the tensor descriptors are fixed-size binary fields, so neither side builds, prints or
//! parses JSON for them, and no channel session takes part (an inline tensor needs none).
//!
//! The record (all integers little-endian):
//!
//! | bytes | what |
//! |---|---|
//! | 4 | `header_len`: length of the application header's JSON text |
//! | 4 | `tensors`: how many tensors follow |
//! | `header_len` | the JSON text, then zeros to a multiple of 8 |
//! | per tensor, 16 + 8 × ndim | dtype (u8, its index in [`DType::ALL`]), ndim (u8), 6 zero bytes, byte length (u64), the shape (ndim × u64) |
//! | the rest | the data: each tensor's bytes start at the next multiple of [`ALIGN`] from the start of this part; the record ends with the last tensor's last byte |
//!
//! Every field is a peer's claim: [`unpack`] checks each length against the record and
//! against this side's limits before it copies a byte, and a record that does not add up
//! is a [`ProtocolError::Ring`].

use crate::dtype::{DType, Device};
use crate::error::{LimitError, PipeError, ProtocolError};
use crate::message::Message;
use crate::meta::{MAX_DIMS, TensorMeta};
use crate::tensor::{ALIGN, Storage, Tensor};
use crate::wire::Limits;

/// The fixed part of a record: `header_len` and `tensors`.
const FIXED: usize = 8;
/// The fixed part of a tensor's descriptor (dtype, ndim, padding, byte length).
const DESC: usize = 16;

/// What a record may hold for this pipe: the peer's limits and the ring's largest record.
pub(super) struct PackRoom<'a> {
    /// The receiver's limits (announced in the handshake).
    pub(super) peer: &'a Limits,
    /// The ring's largest record.
    pub(super) max_record: usize,
}

/// Packs `msg` into one record, or `None` when it does not qualify: a tensor that is not a
/// contiguous host tensor, one `inline` refuses (its channel would send it another way:
/// the shm pool, a lease), a record over `room.max_record`, or a header or payload over
/// the peer's limits (the MESSAGE frame path then reports it by name).
pub(super) fn pack(msg: &Message, inline: impl Fn(&Tensor) -> bool, room: &PackRoom<'_>) -> Option<Vec<u8>> {
    let mut data_len = 0usize;
    let mut descs_len = 0usize;
    for t in &msg.tensors {
        let host = matches!(t.storage(), Storage::Host(_));
        if !host || t.device() != Device::Cpu || t.meta().strides.is_some() || !inline(t) {
            return None;
        }
        data_len = data_len.next_multiple_of(ALIGN).checked_add(t.nbytes())?;
        descs_len += DESC + 8 * t.shape().len();
    }
    if data_len as u64 > room.peer.max_payload_bytes {
        return None;
    }
    let mut out = Vec::with_capacity(FIXED + 64 + descs_len + data_len);
    out.extend_from_slice(&[0; FIXED]);
    serde_json::to_writer(&mut out, &msg.header).ok()?;
    let header_len = u32::try_from(out.len() - FIXED).ok()?;
    if header_len > room.peer.max_header_bytes {
        return None;
    }
    if out.len().next_multiple_of(8).checked_add(descs_len + data_len)? > room.max_record {
        return None;
    }
    out[..4].copy_from_slice(&header_len.to_le_bytes());
    out[4..8].copy_from_slice(&u32::try_from(msg.tensors.len()).ok()?.to_le_bytes());
    pad_to(&mut out, 8);
    for t in &msg.tensors {
        let dtype = DType::ALL.iter().position(|d| *d == t.dtype())?;
        out.push(u8::try_from(dtype).ok()?);
        out.push(u8::try_from(t.shape().len()).ok()?);
        out.extend_from_slice(&[0; 6]);
        out.extend_from_slice(&(t.nbytes() as u64).to_le_bytes());
        for d in t.shape() {
            out.extend_from_slice(&d.to_le_bytes());
        }
    }
    let data_start = out.len();
    for t in &msg.tensors {
        let at = data_start + (out.len() - data_start).next_multiple_of(ALIGN);
        out.resize(at, 0);
        out.extend_from_slice(t.as_bytes());
    }
    Some(out)
}

/// Zeros up to the next multiple of `n` (of the record's length).
fn pad_to(out: &mut Vec<u8>, n: usize) {
    out.resize(out.len().next_multiple_of(n), 0);
}

/// What [`unpack`] checks a record against: this side's limits and channels.
pub(super) struct UnpackRules<'a> {
    /// This side's limits.
    pub(super) limits: &'a Limits,
    /// [`crate::EndpointBuilder::max_header_values`].
    pub(super) max_header_values: usize,
    /// Whether the pipe negotiated a channel for CPU tensors (a packed tensor is one).
    pub(super) cpu_channel: bool,
}

/// Rebuilds the message a record holds, after checking every field (module docs). The
/// tensors' bytes are copied once, into fresh [`ALIGN`]-aligned memory.
pub(super) fn unpack(record: &[u8], rules: &UnpackRules<'_>) -> Result<Message, PipeError> {
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
    if count > 0 && !rules.cpu_channel {
        return Err(
            ProtocolError::BadTensor { index: 0, reason: "no channel was negotiated for Cpu tensors".into() }.into()
        );
    }
    let header_end = FIXED + header_len as usize;
    let Some(header) = record.get(FIXED..header_end) else {
        return Err(bad(format!("claims a {header_len}-byte header in a {}-byte record", record.len())));
    };
    let mut at = header_end.next_multiple_of(8);
    let mut metas = Vec::with_capacity(count as usize);
    for index in 0..count as usize {
        let Some(d) = record.get(at..).and_then(|r| r.first_chunk::<DESC>()) else {
            return Err(bad(format!("ends inside the descriptor of tensor {index}")));
        };
        let dtype = *DType::ALL
            .get(usize::from(d[0]))
            .ok_or_else(|| ProtocolError::BadTensor { index, reason: format!("unknown dtype number {}", d[0]) })?;
        let ndim = usize::from(d[1]);
        if ndim > MAX_DIMS {
            return Err(
                ProtocolError::BadTensor { index, reason: format!("{ndim} dimensions, over {MAX_DIMS}") }.into()
            );
        }
        let nbytes = u64::from_le_bytes(d[8..16].try_into().expect("8 bytes"));
        let dims_at = at + DESC;
        let Some(dims) = record.get(dims_at..dims_at + 8 * ndim) else {
            return Err(bad(format!("ends inside the shape of tensor {index}")));
        };
        let shape: Vec<u64> =
            dims.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
        metas.push((TensorMeta::new(dtype, shape), nbytes));
        at = dims_at + 8 * ndim;
    }
    let data = &record[at.min(record.len())..];
    let mut spans = Vec::with_capacity(metas.len());
    let mut end = 0u64;
    for (index, (_, nbytes)) in metas.iter().enumerate() {
        let start = end.next_multiple_of(ALIGN as u64);
        end = start.checked_add(*nbytes).filter(|e| *e <= data.len() as u64).ok_or_else(|| {
            bad(format!("claims {nbytes} bytes for tensor {index}, past the {} bytes of data", data.len()))
        })?;
        spans.push(start as usize..end as usize);
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
    let header: serde_json::Value =
        serde_json::from_slice(header).map_err(|e| ProtocolError::BadHeader(e.to_string()))?;
    let one = metas.len() == 1;
    let mut whole = Some(crate::frame::aligned_copy(data));
    let mut tensors = Vec::with_capacity(metas.len());
    for (index, ((meta, _), span)) in metas.into_iter().zip(spans).enumerate() {
        // A lone tensor owns the whole copy (its span is all of it): no second handle.
        let part = if one { whole.take() } else { whole.as_ref().map(|b| b.slice(span)) };
        let part = part.unwrap_or_default();
        let t = Tensor::new(meta, part).map_err(|e| ProtocolError::BadTensor { index, reason: e.to_string() })?;
        tensors.push(t);
    }
    Ok(Message { header, tensors })
}

#[cfg(test)]
mod tests;
