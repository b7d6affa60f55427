//! Target `tensor_desc`: a tensor descriptor in both of its forms (the serde object of
//! `ferry_core::wire` and the compact array of `ferry_core::compact`), alone and inside a
//! MESSAGE header.

use ferry_core::wire::{MessageHeader, TensorDesc};

/// Parses `data` as a [`TensorDesc`] (either form) and as a [`MessageHeader`].
///
/// Asserts: an accepted descriptor, written again (as the object form), reads back equal
/// and writes the same bytes; its meta's sizes compute without a panic. The same for each
/// descriptor of an accepted header.
pub fn tensor_desc(data: &[u8]) {
    if let Ok(d) = serde_json::from_slice::<TensorDesc>(data) {
        round_trip(&d);
    }
    if let Ok(h) = serde_json::from_slice::<MessageHeader>(data) {
        for d in &h.tensors {
            round_trip(d);
        }
        let text = serde_json::to_vec(&h).expect("a header serializes");
        let again: MessageHeader = serde_json::from_slice(&text).expect("a written header reads back");
        assert_eq!(again.tensors, h.tensors, "header descriptors changed on a round trip");
    }
}

fn round_trip(d: &TensorDesc) {
    let text = serde_json::to_vec(d).expect("a descriptor serializes");
    let again: TensorDesc = match serde_json::from_slice(&text) {
        Ok(a) => a,
        Err(e) => panic!("a written descriptor does not read back: {e}: {}", String::from_utf8_lossy(&text)),
    };
    assert_eq!(&again, d, "descriptor changed on a round trip");
    assert_eq!(serde_json::to_vec(&again).expect("serializes"), text, "descriptor wrote different bytes");
    let _ = d.meta.numel();
    let _ = d.meta.byte_span();
    let _ = d.meta.is_contiguous();
    let _ = d.meta.validate(1 << 20);
}
