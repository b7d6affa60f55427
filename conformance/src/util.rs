//! Helpers shared by the cases (not cases themselves).

use std::time::Duration;

use ferry_core::{DType, Message, Pipe, PipeError, Tensor, TensorMeta, TensorMut};

use crate::peer::{self, PeerHandle, role};
use crate::{Failed, Fixture, Peers};

/// Generous limit for one receive in a data case.
pub const RECV: Duration = Duration::from_secs(60);

/// A tensor of `dtype` and `shape` whose bytes follow a pattern seeded by `seed`
/// (bool tensors hold 0 or 1).
pub fn pattern(dtype: DType, shape: &[u64], seed: u64) -> Tensor {
    let mut t = TensorMut::zeros(TensorMeta::new(dtype, shape.to_vec())).expect("valid test shape");
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in t.as_bytes_mut().chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
    if dtype == DType::Bool {
        for b in t.as_bytes_mut() {
            *b &= 1;
        }
    }
    t.freeze()
}

/// Maps a pipe error into a failure with context.
pub fn fail(ctx: &str) -> impl Fn(PipeError) -> Failed + '_ {
    move |e| Failed::from(format!("{ctx}: {e}"))
}

/// Starts an echo peer and connects a pipe to it; checks the negotiated channel.
pub async fn echo_pipe<F: Fixture>(fx: &F, mode: Peers, tag: &str) -> Result<(PeerHandle, Pipe), Failed> {
    let addr = fx.addr(tag);
    let peer = peer::spawn::<F>(mode, role::ECHO, &addr).await?;
    let pipe = fx.endpoint().build().connect(&addr).await.map_err(fail("connect to echo peer"))?;
    if pipe.channel() != fx.expected_channel() {
        return Err(format!("negotiated channel {:?}, expected {:?}", pipe.channel(), fx.expected_channel()).into());
    }
    Ok((peer, pipe))
}

/// Sends `msg` and checks that the echo is identical.
pub async fn round_trip(pipe: &Pipe, msg: Message) -> Result<(), Failed> {
    pipe.send(msg.clone()).await.map_err(fail("send"))?;
    let back = pipe.recv_timeout(RECV).await.map_err(fail("recv"))?;
    compare(&msg, &back)
}

/// Checks that two messages are equal, explaining the first difference.
pub fn compare(sent: &Message, got: &Message) -> Result<(), Failed> {
    if sent.header != got.header {
        return Err("header differs".into());
    }
    if sent.tensors.len() != got.tensors.len() {
        return Err(format!("sent {} tensors, got {}", sent.tensors.len(), got.tensors.len()).into());
    }
    for (i, (a, b)) in sent.tensors.iter().zip(&got.tensors).enumerate() {
        if a.meta() != b.meta() {
            return Err(format!("tensor {i}: metadata {:?} came back as {:?}", a.meta(), b.meta()).into());
        }
        if a.as_bytes() != b.as_bytes() {
            let at = a.as_bytes().iter().zip(b.as_bytes()).position(|(x, y)| x != y);
            return Err(format!("tensor {i} ({:?}): bytes differ (first at {at:?})", a.meta()).into());
        }
    }
    Ok(())
}
