//! Descriptors and CONTROL bodies: wire JSON ([`CudaIpcRef`], [`CudaIpcReturnRef`],
//! [`Control`], core's [`CudaIpcControl`]) to checked values and back. Pure: no driver, no
//! IO.
//!
//! Every value from the peer is checked here before anything else sees it: handles are
//! canonical base64 of exactly 64 bytes, the range lies inside the allocation
//! (overflow-checked), the allocation size is positive and under the limit, and the device
//! UUID has the `GPU-`/`MIG-` form. 64-bit values are JSON numbers, which the wire types
//! already refused past 2^53 - 1 while the frame was parsed ([`ferry_core::wire::MAX_WIRE_INT`]).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ferry_core::wire::{CudaIpcControl, CudaIpcRef, CudaIpcReturnRef};

use crate::driver::{HANDLE_BYTES, IpcHandle};

/// A checked [`CudaIpcRef`]: a range of the sender's allocation, leased to the receiver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Desc {
    /// UUID of the device the memory is on.
    pub uuid: String,
    /// Handle of the allocation's base.
    pub mem: IpcHandle,
    /// The sender's id for the allocation.
    pub alloc_id: u64,
    /// Size of the whole allocation.
    pub alloc_size: u64,
    /// Offset of the tensor's bytes from the base.
    pub offset: u64,
    /// Length of the tensor's bytes.
    pub len: u64,
    /// The event recorded after the sender's writes.
    pub event: IpcHandle,
    /// The lease to release.
    pub lease: u64,
}

/// A checked [`CudaIpcReturnRef`]: a range inside a lease the receiver granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReturnDesc {
    /// The receiver's own lease id.
    pub lease: u64,
    /// Offset inside the leased range.
    pub offset: u64,
    /// Length.
    pub len: u64,
    /// The event recorded after the sender's last use.
    pub event: IpcHandle,
}

/// The CONTROL body of the cuda-ipc channel (core's wire type). Either side may send either
/// part.
///
/// - `release` (with `device` and `event`): leases the sender of this frame no longer
///   needs, all on `device`; `event` was recorded after its last use of them, and the
///   owner orders reuse of the memory after it.
/// - `retire`: allocations the sender of this frame has freed; the receiver closes its
///   mappings of them once no tensor uses them.
pub(crate) type Control = CudaIpcControl;

/// The longest device UUID accepted (`MIG-` plus a UUID is 40 characters).
const MAX_UUID_LEN: usize = 64;

/// Base64 of a handle.
pub(crate) fn handle_to_b64(h: &IpcHandle) -> String {
    STANDARD.encode(h.0)
}

/// A handle from canonical base64 of exactly 64 bytes.
pub(crate) fn handle_from_b64(field: &str, s: &str) -> Result<IpcHandle, String> {
    // 64 bytes are 88 characters; refuse anything longer before decoding.
    if s.len() != HANDLE_BYTES.div_ceil(3) * 4 {
        return Err(format!(
            "{field}: expected base64 of {HANDLE_BYTES} bytes (88 characters), got {} characters",
            s.len()
        ));
    }
    let bytes = STANDARD.decode(s).map_err(|e| format!("{field}: not base64: {e}"))?;
    let arr: [u8; HANDLE_BYTES] =
        bytes.try_into().map_err(|b: Vec<u8>| format!("{field}: expected {HANDLE_BYTES} bytes, got {}", b.len()))?;
    Ok(IpcHandle(arr))
}

/// Whether `s` looks like a device UUID (`GPU-` or `MIG-`, then hex digits and dashes).
pub(crate) fn valid_uuid(s: &str) -> bool {
    let rest = s.strip_prefix("GPU-").or_else(|| s.strip_prefix("MIG-"));
    matches!(rest, Some(r) if !r.is_empty() && s.len() <= MAX_UUID_LEN
        && r.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-'))
}

/// Formats a 16-byte UUID as `nvidia-smi` does: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub(crate) fn format_uuid(prefix: &str, b: &[u8; 16]) -> String {
    let hex = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!("{prefix}-{}-{}-{}-{}-{}", hex(0..4), hex(4..6), hex(6..8), hex(8..10), hex(10..16))
}

/// The wire form of `d`.
pub(crate) fn encode(d: &Desc) -> CudaIpcRef {
    CudaIpcRef {
        device_uuid: d.uuid.clone(),
        mem_handle: handle_to_b64(&d.mem),
        alloc_id: d.alloc_id,
        alloc_size: d.alloc_size,
        offset: d.offset,
        len: d.len,
        event_handle: handle_to_b64(&d.event),
        lease: d.lease,
    }
}

/// Checks a received descriptor. `max_alloc` bounds the allocation size a peer may claim.
pub(crate) fn decode(r: &CudaIpcRef, max_alloc: u64) -> Result<Desc, String> {
    if !valid_uuid(&r.device_uuid) {
        return Err(format!("device_uuid {:?} is not a device UUID", truncated(&r.device_uuid)));
    }
    let mem = handle_from_b64("mem_handle", &r.mem_handle)?;
    let event = handle_from_b64("event_handle", &r.event_handle)?;
    let (alloc_id, alloc_size, offset, len) = (r.alloc_id, r.alloc_size, r.offset, r.len);
    if alloc_size == 0 {
        return Err("alloc_size is 0".into());
    }
    if alloc_size > max_alloc {
        return Err(format!("alloc_size {alloc_size} is over the limit of {max_alloc} bytes (max_peer_bytes)"));
    }
    match offset.checked_add(len) {
        Some(end) if end <= alloc_size => {}
        _ => return Err(format!("range {offset}+{len} is outside the allocation of {alloc_size} bytes")),
    }
    Ok(Desc { uuid: r.device_uuid.clone(), mem, alloc_id, alloc_size, offset, len, event, lease: r.lease })
}

/// The wire form of `d`.
pub(crate) fn encode_return(d: &ReturnDesc) -> CudaIpcReturnRef {
    CudaIpcReturnRef { lease: d.lease, offset: d.offset, len: d.len, event_handle: handle_to_b64(&d.event) }
}

/// Checks a received return descriptor (the range is checked against the lease later).
pub(crate) fn decode_return(r: &CudaIpcReturnRef) -> Result<ReturnDesc, String> {
    Ok(ReturnDesc {
        lease: r.lease,
        offset: r.offset,
        len: r.len,
        event: handle_from_b64("event_handle", &r.event_handle)?,
    })
}

/// Parses a CONTROL body.
pub(crate) fn decode_control(body: &serde_json::value::RawValue) -> Result<Control, String> {
    let c: Control = serde_json::from_str(body.get()).map_err(|e| format!("control message: {e}"))?;
    if !c.release.is_empty() {
        match (&c.device, &c.event) {
            (Some(d), Some(_)) if valid_uuid(d) => {}
            _ => return Err("a release needs a valid `device` UUID and an `event` handle".into()),
        }
    }
    Ok(c)
}

/// A peer string cut short for an error message.
fn truncated(s: &str) -> String {
    s.chars().take(80).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(b: u8) -> IpcHandle {
        IpcHandle([b; HANDLE_BYTES])
    }

    fn good() -> Desc {
        Desc {
            uuid: "GPU-12345678-9abc-def0-1234-56789abcdef0".into(),
            mem: h(1),
            alloc_id: ferry_core::wire::MAX_WIRE_INT,
            alloc_size: 64 << 20,
            offset: 4096,
            len: 24_883_200,
            event: h(2),
            lease: 7,
        }
    }

    #[test]
    fn round_trips_with_numbers_for_64_bit_values() {
        let d = good();
        let w = encode(&d);
        assert_eq!(w.mem_handle.len(), 88);
        let json = serde_json::to_value(&w).unwrap();
        assert_eq!(json["alloc_id"], serde_json::json!(9_007_199_254_740_991u64));
        assert!(json["alloc_size"].is_u64() && json["offset"].is_u64() && json["len"].is_u64());
        let back: CudaIpcRef = serde_json::from_value(json).unwrap();
        assert_eq!(decode(&back, 1 << 40).unwrap(), d);
        let r = ReturnDesc { lease: 3, offset: 64, len: 128, event: h(9) };
        assert_eq!(decode_return(&encode_return(&r)).unwrap(), r);
    }

    fn refused(edit: impl FnOnce(&mut CudaIpcRef), needle: &str) {
        let mut w = encode(&good());
        edit(&mut w);
        let e = decode(&w, 1 << 40).unwrap_err();
        assert!(e.contains(needle), "{e:?} does not mention {needle:?}");
    }

    #[test]
    fn hostile_descriptors_are_refused() {
        refused(|w| w.mem_handle = "%%%%".repeat(22), "not base64");
        refused(|w| w.mem_handle = STANDARD.encode([0u8; 63]), "88 characters");
        refused(|w| w.mem_handle = STANDARD.encode([0u8; 65]), "expected 64 bytes, got 65");
        refused(|w| w.mem_handle = "A".repeat(1 << 20), "88 characters");
        refused(|w| w.event_handle = String::new(), "event_handle");
        refused(|w| w.offset = 64 << 20, "outside the allocation");
        refused(|w| w.len = u64::MAX, "outside the allocation");
        refused(|w| w.offset = u64::MAX, "outside the allocation");
        refused(|w| w.alloc_size = 0, "alloc_size is 0");
        refused(|w| w.alloc_size = 1 << 41, "over the limit");
        refused(|w| w.device_uuid = "cuda:0".into(), "not a device UUID");
        refused(|w| w.device_uuid = "GPU-".into(), "not a device UUID");
        refused(|w| w.device_uuid = format!("GPU-{}", "a".repeat(100)), "not a device UUID");
        refused(|w| w.device_uuid = "GPU-zz".into(), "not a device UUID");
    }

    #[test]
    fn decimal_strings_and_values_past_2_pow_53_are_refused_by_the_wire_types() {
        let json = serde_json::to_value(encode(&good())).unwrap();
        for field in ["alloc_id", "alloc_size", "offset", "len", "lease"] {
            for bad in
                [serde_json::json!("7"), serde_json::json!(1u64 << 53), serde_json::json!(-1), serde_json::json!(1.5)]
            {
                let mut v = json.clone();
                v[field] = bad.clone();
                assert!(serde_json::from_value::<CudaIpcRef>(v).is_err(), "{field} = {bad}");
            }
        }
    }

    #[test]
    fn uuids_format_like_nvidia_smi() {
        let b = [0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0];
        let u = format_uuid("GPU", &b);
        assert_eq!(u, "GPU-12345678-9abc-def0-1234-56789abcdef0");
        assert!(valid_uuid(&u));
        assert!(valid_uuid("MIG-12345678-9abc-def0-1234-56789abcdef0"));
    }

    fn raw(v: serde_json::Value) -> Box<serde_json::value::RawValue> {
        serde_json::value::to_raw_value(&v).unwrap()
    }

    #[test]
    fn control_bodies() {
        let c = decode_control(&raw(serde_json::json!({"retire": [5]}))).unwrap();
        assert_eq!(c.retire, [5]);
        let ok = serde_json::json!({"release": [1, 2], "device": "GPU-00", "event": handle_to_b64(&h(3))});
        assert_eq!(decode_control(&raw(ok)).unwrap().release, [1, 2]);
        for bad in [
            serde_json::json!({"release": [1]}),
            serde_json::json!({"release": [1], "device": "nope", "event": "x"}),
            serde_json::json!({"release": ["one"]}),
            serde_json::json!({"release": [-1]}),
            serde_json::json!({"free": [1]}),
            serde_json::json!({"retire": ["5"]}),
            serde_json::json!({"retire": [1u64 << 53]}),
            serde_json::json!([1]),
        ] {
            assert!(decode_control(&raw(bad.clone())).is_err(), "{bad}");
        }
        let out = serde_json::to_value(Control { retire: vec![9], ..Default::default() }).unwrap();
        assert_eq!(out, serde_json::json!({"retire": [9]}));
    }
}
