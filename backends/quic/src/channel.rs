//! The QUIC stream channel (name `quic`): each tensor on its own unidirectional stream, so
//! big tensors travel in parallel and never block the frame stream. A stream carries a u64
//! little-endian length, then the bytes; the receiver reads them straight into aligned
//! memory and hands them out without another copy.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use ferry_core::inline::decode_inline;
use ferry_core::wire::{ChannelOffer, Location, QuicStreamRef};
use ferry_core::{
    Channel, ChannelError, ChannelSession, ConnInfo, Device, DeviceKind, Incoming, LimitError, Outgoing, SendTicket,
    SessionCtx, Storage, Tensor, TensorMeta,
};
use tokio::sync::Notify;

use crate::recv_buf::RecvBuf;
use crate::transport::QuicConn;

const NAME: &str = "quic";

/// Reset code of a stream whose message was not sent.
const STREAM_UNUSED: quinn::VarInt = quinn::VarInt::from_u32(1);
/// Stop code of a stream the receiver refuses (over a limit, malformed).
const STREAM_REFUSED: quinn::VarInt = quinn::VarInt::from_u32(2);

/// Options of the stream channel.
#[derive(Debug, Clone)]
pub struct StreamOptions {
    /// Tensors smaller than this travel inline in the frame (default 64 KiB).
    pub inline_below: usize,
    /// Largest tensor accepted on a stream (default 4 GiB).
    pub max_stream_bytes: u64,
    /// Most bytes of streams received but not yet claimed by a message (default 8 GiB).
    pub max_pending_bytes: u64,
    /// How long a message may wait for one of its streams (default 60 s).
    pub stream_wait: Duration,
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions {
            inline_below: 64 << 10,
            max_stream_bytes: 4 << 30,
            max_pending_bytes: 8 << 30,
            stream_wait: Duration::from_secs(60),
        }
    }
}

/// The QUIC stream channel.
#[derive(Debug, Clone, Default)]
pub struct QuicChannel {
    opts: StreamOptions,
}

impl QuicChannel {
    /// With default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// With these options.
    pub fn with_options(opts: StreamOptions) -> Self {
        QuicChannel { opts }
    }
}

fn quic_of(conn: &ConnInfo) -> Option<&QuicConn> {
    conn.handle.as_ref()?.downcast::<QuicConn>()
}

impl Channel for QuicChannel {
    fn name(&self) -> &'static str {
        NAME
    }

    fn devices(&self) -> &'static [DeviceKind] {
        &[DeviceKind::Cpu]
    }

    fn offer(&self, conn: &ConnInfo) -> Option<ChannelOffer> {
        quic_of(conn).map(|_| ChannelOffer {
            name: NAME.into(),
            devices: vec![DeviceKind::Cpu],
            domain: Default::default(),
        })
    }

    fn accepts(&self, offer: &ChannelOffer, conn: &ConnInfo) -> bool {
        offer.name == NAME && quic_of(conn).is_some()
    }

    fn open(&self, ctx: SessionCtx) -> Result<Arc<dyn ChannelSession>, ChannelError> {
        let q = quic_of(&ctx.conn)
            .ok_or_else(|| ChannelError::NotViable("the quic channel needs a QUIC connection".into()))?
            .conn
            .clone();
        let s = Arc::new(StreamSession {
            conn: q.clone(),
            opts: self.opts.clone(),
            inbox: Arc::default(),
            is_server: ctx.is_server,
        });
        tokio::spawn(accept_streams(q, s.inbox.clone(), self.opts.clone(), ctx.closed.clone()));
        Ok(s)
    }
}

#[derive(Default)]
struct Inbox {
    state: Mutex<InboxState>,
    arrived: Notify,
    /// Receive buffers given back by dropped tensors, reused for the next streams (a fresh
    /// buffer costs a page fault per page; a warm one costs nothing).
    spare: Arc<Mutex<Vec<RecvBuf>>>,
}

/// Spare buffers kept per session.
const SPARE_BUFFERS: usize = 4;

/// A received tensor's bytes; the buffer goes back to the session's spares when dropped.
struct Recycled {
    buf: Option<RecvBuf>,
    spare: std::sync::Weak<Mutex<Vec<RecvBuf>>>,
}

impl AsRef<[u8]> for Recycled {
    fn as_ref(&self) -> &[u8] {
        self.buf.as_ref().map(AsRef::as_ref).unwrap_or(&[])
    }
}

impl Drop for Recycled {
    fn drop(&mut self) {
        if let (Some(mut buf), Some(spare)) = (self.buf.take(), self.spare.upgrade()) {
            let mut s = lock(&spare);
            if s.len() < SPARE_BUFFERS {
                buf.clear();
                s.push(buf);
            }
        }
    }
}

/// A receive buffer for an announced `n` bytes: a spare one of that size, else a new one
/// whose memory is committed only as the bytes arrive ([`RecvBuf`]), so a peer announcing
/// more than it sends costs nothing for the bytes it did not send.
fn take_buffer(spare: &Arc<Mutex<Vec<RecvBuf>>>, n: usize) -> Result<RecvBuf, StreamError> {
    {
        let mut s = lock(spare);
        if let Some(i) = s.iter().position(|b| b.capacity() == n) {
            return Ok(s.swap_remove(i));
        }
    }
    RecvBuf::reserve(n).ok_or_else(|| format!("no address space for a stream of {n} bytes on this machine").into())
}

#[derive(Default)]
struct InboxState {
    ready: HashMap<u64, Result<Bytes, String>>,
    claimed: HashSet<u64>,
    pending_bytes: u64,
    closed: bool,
}

struct StreamSession {
    conn: quinn::Connection,
    opts: StreamOptions,
    inbox: Arc<Inbox>,
    is_server: bool,
}

fn bad(reason: impl Into<String>) -> ChannelError {
    ChannelError::BadDescriptor { channel: NAME, reason: reason.into() }
}

async fn accept_streams(
    conn: quinn::Connection,
    inbox: Arc<Inbox>,
    opts: StreamOptions,
    mut closed: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let mut recv = tokio::select! {
            r = conn.accept_uni() => match r {
                Ok(s) => s,
                Err(_) => break,
            },
            _ = closed.wait_for(|c| *c) => break,
        };
        let (inbox, opts) = (inbox.clone(), opts.clone());
        tokio::spawn(async move {
            let id = u64::from(recv.id());
            let r = match read_stream(&mut recv, &inbox, &opts).await {
                // A stream the sender reset was never referenced: forget it.
                Err(StreamError::Reset) => return,
                Err(StreamError::Bad(e)) => {
                    tracing::warn!(stream = id, "refusing a tensor stream: {e}");
                    let _ = recv.stop(STREAM_REFUSED);
                    // The error surfaces (as a CLOSE naming it) when a message refers to it.
                    Err(e)
                }
                Ok(b) => Ok(b),
            };
            lock(&inbox.state).ready.insert(id, r);
            inbox.arrived.notify_waiters();
        });
    }
    lock(&inbox.state).closed = true;
    inbox.arrived.notify_waiters();
}

enum StreamError {
    Reset,
    Bad(String),
}

impl From<String> for StreamError {
    fn from(s: String) -> Self {
        StreamError::Bad(s)
    }
}

impl From<&str> for StreamError {
    fn from(s: &str) -> Self {
        StreamError::Bad(s.into())
    }
}

async fn read_stream(recv: &mut quinn::RecvStream, inbox: &Inbox, opts: &StreamOptions) -> Result<Bytes, StreamError> {
    let mut len = [0u8; 8];
    match recv.read_exact(&mut len).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::ReadError(quinn::ReadError::Reset(_))) => return Err(StreamError::Reset),
        Err(e) => return Err(format!("reading the length: {e}").into()),
    }
    let len = u64::from_le_bytes(len);
    if len > opts.max_stream_bytes {
        return Err(format!(
            "stream announces {len} bytes, over the limit max_stream_bytes = {}; raise \
             StreamOptions::max_stream_bytes (QuicChannel::with_options) on the receiving side",
            opts.max_stream_bytes
        )
        .into());
    }
    {
        let mut st = lock(&inbox.state);
        let pending = st.pending_bytes.saturating_add(len);
        if pending > opts.max_pending_bytes {
            return Err(format!(
                "{pending} bytes of unclaimed streams, over the limit max_pending_bytes = {}; raise \
                 StreamOptions::max_pending_bytes (QuicChannel::with_options) on the receiving side",
                opts.max_pending_bytes
            )
            .into());
        }
        st.pending_bytes = pending;
    }
    let n = usize::try_from(len).map_err(|_| StreamError::from("stream too long for this machine"))?;
    let mut buf = take_buffer(&inbox.spare, n)?;
    loop {
        let c = match recv.read_chunk(usize::MAX, true).await {
            Ok(Some(c)) => c,
            Ok(None) => break,
            Err(quinn::ReadError::Reset(_)) => return Err(StreamError::Reset),
            Err(e) => return Err(format!("reading {len} bytes: {e}").into()),
        };
        if !buf.push(&c.bytes) {
            return Err(StreamError::from("stream longer than its announced length"));
        }
    }
    if buf.filled() != n {
        return Err(format!("stream ended after {} of its announced {n} bytes", buf.filled()).into());
    }
    Ok(Bytes::from_owner(Recycled { buf: Some(buf), spare: Arc::downgrade(&inbox.spare) }))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl StreamSession {
    async fn wait_for(&self, id: u64) -> Result<Bytes, ChannelError> {
        let deadline = tokio::time::Instant::now() + self.opts.stream_wait;
        loop {
            let notified = self.inbox.arrived.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = lock(&self.inbox.state);
                if let Some(r) = st.ready.remove(&id) {
                    st.claimed.insert(id);
                    let r = r.map_err(bad)?;
                    st.pending_bytes = st.pending_bytes.saturating_sub(r.len() as u64);
                    return Ok(r);
                }
                if st.closed {
                    return Err(ChannelError::Closed);
                }
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(ChannelError::Timeout(self.opts.stream_wait, format!(
                        "tensor stream {id} did not arrive (StreamOptions::stream_wait)"
                    )));
                }
            }
        }
    }
}

#[async_trait]
impl ChannelSession for StreamSession {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn encode(&self, tensor: &Tensor, out: &mut Outgoing) -> Result<Location, ChannelError> {
        let Storage::Host(bytes) = tensor.storage() else {
            return Err(ChannelError::Unsupported { channel: NAME, reason: "tensor is not in host memory".into() });
        };
        if bytes.len() < self.opts.inline_below {
            return Ok(Location::Inline(out.push_payload(bytes.clone())));
        }
        let send = self.conn.open_uni().await.map_err(|_| ChannelError::Closed)?;
        let id = u64::from(send.id());
        let len = bytes_len(tensor);
        out.ticket(|| StreamTicket { streams: Vec::new() }).streams.push((send, bytes.clone()));
        Ok(Location::QuicStream(QuicStreamRef { stream: id, len }))
    }

    async fn decode(&self, meta: TensorMeta, loc: &Location, incoming: &mut Incoming) -> Result<Tensor, ChannelError> {
        if meta.device != Device::Cpu {
            return Err(bad(format!("quic tensor claims device {}", meta.device)));
        }
        let r = match loc {
            Location::Inline(_) => return decode_inline(meta, loc, incoming),
            Location::QuicStream(r) => *r,
            other => return Err(bad(format!("unexpected location {other:?}"))),
        };
        // Unidirectional streams the peer opened have ids with bit 1 set and bit 0 naming
        // the peer's role; ours have the other role bit.
        let ours = u64::from(self.is_server);
        if r.stream & 0b10 == 0 || r.stream & 0b01 == ours {
            return Err(bad(format!("stream {} is not a unidirectional stream of the peer", r.stream)));
        }
        if r.len > self.opts.max_stream_bytes {
            return Err(ChannelError::Limit(LimitError {
                limit: "max_stream_bytes",
                what: "tensor stream length",
                value: r.len,
                max: self.opts.max_stream_bytes,
                hint: "raise StreamOptions::max_stream_bytes (QuicChannel::with_options) on the receiving side".into(),
            }));
        }
        if lock(&self.inbox.state).claimed.contains(&r.stream) {
            return Err(bad(format!("stream {} referenced twice", r.stream)));
        }
        let bytes = self.wait_for(r.stream).await?;
        if bytes.len() as u64 != r.len {
            return Err(bad(format!(
                "stream {} carried {} bytes, the descriptor says {}",
                r.stream,
                bytes.len(),
                r.len
            )));
        }
        Ok(Tensor::new(meta, bytes)?)
    }
}

fn bytes_len(t: &Tensor) -> u64 {
    t.nbytes() as u64
}

/// The streams one message's tensors travel on: once the frame is out, the bytes follow
/// (each stream in parallel with the others); if it is not sent, each stream is reset
/// without carrying a byte (the receiver discards reset streams).
struct StreamTicket {
    streams: Vec<(quinn::SendStream, Bytes)>,
}

impl SendTicket for StreamTicket {
    fn sent(self: Box<Self>) {
        for (mut send, bytes) in self.streams {
            let id = u64::from(send.id());
            tokio::spawn(async move {
                let r = async {
                    send.write_all(&(bytes.len() as u64).to_le_bytes()).await?;
                    // Hand quinn the tensor's own bytes: no copy into its send buffer.
                    send.write_chunk(bytes).await?;
                    send.finish().map_err(std::io::Error::other)?;
                    Ok::<(), std::io::Error>(())
                }
                .await;
                if let Err(e) = r {
                    tracing::warn!(stream = id, "tensor stream not sent: {e}");
                }
            });
        }
    }

    fn aborted(self: Box<Self>) {
        for (mut send, _) in self.streams {
            let _ = send.reset(STREAM_UNUSED);
        }
    }
}
