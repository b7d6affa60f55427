//! Target `cuda_descriptor`: descriptors and CONTROL bodies from a peer, decoded by a live
//! cuda-ipc channel session over the fake driver (`ferry_cuda_ipc::fake`): two simulated
//! processes on one simulated GPU.

use bytes::Bytes;
use ferry_core::channel::{ControlWaker, Incoming, Outgoing, SessionCtx};
use ferry_core::wire::{CudaIpcRef, Location, TensorDesc};
use ferry_core::{Channel, ChannelSession, ConnInfo, DType, Device, TensorMeta};
use ferry_cuda_ipc::fake::FakeGpu;
use ferry_cuda_ipc::{CudaIpcChannel, CudaIpcOptions};

use crate::block_on;
use crate::shm::{Step, pattern, pattern_byte};

/// Size of the tensor each side sends first.
pub const TENSOR_LEN: usize = 4096;
/// Most steps taken from one input.
const MAX_STEPS: usize = 32;

/// `data` is a JSON array of steps, as for [`crate::shm_descriptor`]: `{"tensors": [..]}`
/// or `{"control": body}`, decoded by the receiving session. Strings in it may name the
/// fields of a real descriptor the peer sent first, which the fuzzer cannot guess:
/// `$uuid`, `$mem`, `$event` (strings), `$alloc_id`, `$alloc_size`, `$offset` and `$lease`
/// (numbers). The receiver has also sent the peer a tensor of its own first,
/// so that the peer holds a lease it may return.
///
/// Asserts: a descriptor the session accepts gives a device tensor whose bytes (copied back
/// through the driver) are the bytes it names: inside the peer's allocation as the peer
/// wrote it (where it wrote), or inside the lease this side granted.
pub fn cuda_descriptor(data: &[u8]) {
    if serde_json::from_slice::<serde_json::Value>(data).is_err() {
        return;
    }
    block_on(async {
        let gpu = FakeGpu::new(1);
        let opts =
            CudaIpcOptions { slab_bytes: 64 << 10, full_wait: std::time::Duration::ZERO, ..CudaIpcOptions::default() };
        let (peer_chan, chan) = (
            CudaIpcChannel::with_driver(gpu.process(1), opts.clone()),
            CudaIpcChannel::with_driver(gpu.process(2), opts),
        );
        let (closed_tx, closed) = tokio::sync::watch::channel(false);
        let ctx = |is_server| SessionCtx {
            conn: ConnInfo { transport: "mem", same_host: true, ..ConnInfo::default() },
            control: ControlWaker::new(),
            closed: closed.clone(),
            is_server,
            features: Vec::new(),
        };
        let peer = peer_chan.open(ctx(false)).expect("a cuda-ipc session");
        let session = chan.open(ctx(true)).expect("a cuda-ipc session");
        // The peer sends a tensor: the template whose fields the input may name.
        let Location::CudaIpc(template) = send(&*peer, &peer_chan).await else {
            panic!("the peer's tensor did not go as a cuda_ipc descriptor")
        };
        // This side sends one too: a lease the peer may return.
        let _ = send(&*session, &chan).await;
        let text = substitute(data, &template);
        let steps = serde_json::from_slice::<Vec<Step>>(&text).unwrap_or_default();
        let peer_offset = template.offset;
        for step in steps.into_iter().take(MAX_STEPS) {
            match step {
                Step::Message { tensors } => {
                    for d in tensors {
                        decode(&*session, &chan, d, peer_offset).await;
                    }
                }
                Step::Control { control } => {
                    if let Ok(control) = serde_json::value::to_raw_value(&control) {
                        let _ = session.control(&control, &mut Incoming::new(Bytes::new(), Vec::new()));
                    }
                }
            }
        }
        // The pipe's part: close the sessions, then say so.
        session.close();
        peer.close();
        let _ = closed_tx.send(true);
        crate::settle().await;
    });
}

/// Sends a device tensor of [`TENSOR_LEN`] pattern bytes from `session`; its location.
async fn send(session: &dyn ChannelSession, chan: &CudaIpcChannel) -> Location {
    let meta = TensorMeta::new(DType::U8, [TENSOR_LEN as u64]).with_device(Device::Cuda(0));
    let t = session.alloc_device(&meta).await.expect("device memory").expect("a device tensor");
    chan.copy_from_host(&t, &pattern(TENSOR_LEN)).expect("copying to the device");
    let mut out = Outgoing::default();
    let loc = session.encode(&t, &mut out).await.expect("sending a device tensor");
    let (_frame, tickets) = out.finish(Vec::new());
    tickets.sent();
    loc
}

async fn decode(session: &dyn ChannelSession, chan: &CudaIpcChannel, d: TensorDesc, peer_offset: u64) {
    let Ok(t) = session.decode(d.meta.clone(), &d.data, &mut Incoming::new(Bytes::new(), Vec::new())).await else {
        return;
    };
    let (offset, len, base) = match &d.data {
        // The peer's allocation holds its tensor at `peer_offset` (the rest is unwritten).
        Location::CudaIpc(r) => (r.offset, r.len, Some(peer_offset)),
        // Returned: offsets are within the lease this side granted (its whole tensor).
        Location::CudaIpcReturn(r) => (r.offset, r.len, None),
        other => panic!("the cuda-ipc session accepted {other:?}"),
    };
    let bytes = chan.copy_to_host(&t).expect("a received tensor copies to the host");
    assert!(bytes.len() as u64 <= len, "a tensor of {} bytes from a range of {len}", bytes.len());
    for (k, b) in bytes.iter().enumerate() {
        let at = offset + k as u64;
        let want = match base {
            Some(base) if at >= base && at < base + TENSOR_LEN as u64 => pattern_byte((at - base) as usize),
            // Memory the peer never wrote: whatever the driver left there.
            Some(_) => continue,
            None => {
                assert!(at < TENSOR_LEN as u64, "a returned range reaches past the lease");
                pattern_byte(at as usize)
            }
        };
        assert_eq!(*b, want, "tensor bytes are not the bytes its descriptor names (byte {k} of {offset}+{len})");
    }
}

/// `data` with the placeholders replaced by the template's fields. A number's placeholder
/// in quotes (`"$offset"`, as older seeds wrote it when numbers were decimal strings) is
/// replaced by the bare number, quotes and all.
fn substitute(data: &[u8], t: &CudaIpcRef) -> Vec<u8> {
    let pairs: [(&[u8], String, bool); 7] = [
        (b"$uuid", t.device_uuid.clone(), false),
        (b"$mem", t.mem_handle.clone(), false),
        (b"$event", t.event_handle.clone(), false),
        (b"$alloc_id", t.alloc_id.to_string(), true),
        (b"$alloc_size", t.alloc_size.to_string(), true),
        (b"$offset", t.offset.to_string(), true),
        (b"$lease", t.lease.to_string(), true),
    ];
    let mut out = Vec::with_capacity(data.len());
    let mut i = 0;
    'outer: while i < data.len() {
        if data[i] == b'$' {
            for (from, to, number) in &pairs {
                if data[i..].starts_with(from) {
                    let quoted = *number && out.last() == Some(&b'"') && data.get(i + from.len()) == Some(&b'"');
                    if quoted {
                        out.pop();
                    }
                    out.extend_from_slice(to.as_bytes());
                    i += from.len() + usize::from(quoted);
                    continue 'outer;
                }
            }
        }
        out.push(data[i]);
        i += 1;
    }
    out
}
