//! Target `shm_descriptor`: descriptors and CONTROL bodies from a peer, decoded by a live
//! shm channel session (the receiver's checks of segment announcements, ranges, leases and
//! returns), with real sealed memfds attached to each message.

use bytes::Bytes;
use ferry_core::channel::{ControlWaker, Incoming, Outgoing, SessionCtx};
use ferry_core::wire::FEATURE_SHM_FORGET;
use ferry_core::wire::{Location, TensorDesc};
use ferry_core::{Channel, ChannelSession, ConnInfo, DType, Tensor, TensorMeta};
use ferry_shm::{ShmChannel, ShmOptions};
use serde::Deserialize;
use serde_json::Value;

use crate::block_on;

/// Size of each memfd attached to a message (descriptor 0 sealed, as ferry makes them;
/// descriptor 1 unsealed, which a receiver must refuse).
pub const SEG_LEN: usize = 64 << 10;
/// Size of each message's payload.
pub const PAYLOAD_LEN: usize = 4096;
/// Size of the tensor this side sends first, so that the peer holds a lease it may return.
pub const OWN_LEN: usize = 32 << 10;
/// Most steps taken from one input.
const MAX_STEPS: usize = 32;

/// One thing the peer sends.
#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum Step {
    /// A MESSAGE frame's descriptors (its payload and descriptors are made here).
    Message { tensors: Vec<TensorDesc> },
    /// A CONTROL frame's body for the shm channel.
    Control { control: Value },
}

/// The byte at `i` of every buffer this target makes (segments, payloads, its own tensor):
/// a decoded tensor's bytes say where in its buffer it points.
pub fn pattern_byte(i: usize) -> u8 {
    ((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8
}

pub(crate) fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(pattern_byte).collect()
}

/// `data` is a JSON array of steps: `{"tensors": [descriptor, ..]}` (a message) or
/// `{"control": body}`. A fresh session first sends one tensor of 32 KiB through
/// its pool (granting the peer a lease), then decodes each step as the peer's.
///
/// Asserts: a descriptor the session accepts gives a tensor whose bytes are the bytes the
/// descriptor names: inside the payload (inline), inside the announced segment (shm), or
/// inside the lease this side granted (shm_return).
pub fn shm_descriptor(data: &[u8]) {
    let Ok(steps) = serde_json::from_slice::<Vec<Step>>(data) else { return };
    block_on(async {
        let control = ControlWaker::new();
        let (closed_tx, closed) = tokio::sync::watch::channel(false);
        let ctx = SessionCtx {
            conn: ConnInfo { transport: "mem", fd_passing: true, same_host: true, ..ConnInfo::default() },
            control,
            closed,
            is_server: true,
            features: vec![FEATURE_SHM_FORGET.into()],
        };
        let opts = ShmOptions {
            segment_bytes: 256 << 10,
            pool_limit: 4 << 20,
            full_wait: std::time::Duration::ZERO,
            ..ShmOptions::default()
        };
        let session = ShmChannel::with_options(opts).open(ctx).expect("an shm session");
        let own = Tensor::new(TensorMeta::new(DType::U8, [OWN_LEN as u64]), Bytes::from(pattern(OWN_LEN)))
            .expect("a u8 tensor");
        let mut out = Outgoing::default();
        session.encode(&own, &mut out).await.expect("sending a tensor through the pool");
        let (_frame, tickets) = out.finish(Vec::new());
        tickets.sent();
        for step in steps.into_iter().take(MAX_STEPS) {
            match step {
                Step::Message { tensors } => message(&*session, tensors).await,
                Step::Control { control } => {
                    if let Ok(control) = serde_json::value::to_raw_value(&control) {
                        let _ = session.control(&control, &mut Incoming::new(Bytes::new(), Vec::new()));
                    }
                }
            }
        }
        // The pipe's part: close the sessions, then say so.
        session.close();
        let _ = closed_tx.send(true);
        crate::settle().await;
    });
}

async fn message(session: &dyn ChannelSession, tensors: Vec<TensorDesc>) {
    let sealed = ferry_shm::testing::sealed_memfd(SEG_LEN, 0, &pattern(SEG_LEN)).expect("a sealed memfd");
    let unsealed = ferry_shm::testing::unsealed_memfd(SEG_LEN as u64).expect("a memfd");
    let mut incoming = Incoming::new(Bytes::from(pattern(PAYLOAD_LEN)), vec![sealed, unsealed]);
    let mut kept = Vec::new();
    for d in tensors {
        let Ok(t) = session.decode(d.meta.clone(), &d.data, &mut incoming).await else { continue };
        let bytes = t.host_bytes().expect("an shm tensor is in host memory");
        let (offset, len, limit) = match &d.data {
            Location::Inline(r) => (r.offset, r.len, PAYLOAD_LEN),
            Location::Shm(r) => (r.offset, r.len, SEG_LEN),
            Location::ShmReturn(r) => (r.offset, r.len, OWN_LEN),
            other => panic!("the shm session accepted {other:?}"),
        };
        assert!(bytes.len() as u64 <= len, "a tensor of {} bytes from a range of {len}", bytes.len());
        let end = offset.checked_add(bytes.len() as u64).expect("a range that overflows was accepted");
        assert!(end <= limit as u64, "accepted range {offset}+{len} is outside its buffer of {limit} bytes");
        for (k, b) in bytes.iter().enumerate() {
            assert_eq!(*b, pattern_byte(offset as usize + k), "tensor bytes are not the bytes its descriptor names");
        }
        // Held like a receiver holds a tensor: its lease is released when dropped.
        kept.push(t);
    }
}
