//! The write half of the frame layer: [`FrameWriter`] over a connection's byte stream
//! ([`SocketWriter`]) or the link beside it.

use std::sync::Arc;

use bytes::Bytes;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::link::LinkWrite;
use super::{COALESCE, FrameKind, FramePrefix, preamble};
use crate::error::PipeError;
use crate::transport::FdQueueRef as FdQueue;

/// A frame to write: kind, JSON header and payload parts (written in order, no copy for
/// large parts).
#[derive(Debug, Default)]
pub struct OutFrame {
    /// The JSON header.
    pub header: Vec<u8>,
    /// Payload parts, concatenated on the wire.
    pub payload: Vec<Bytes>,
    /// File descriptors to attach (unix only).
    #[cfg(unix)]
    pub fds: Vec<std::os::fd::OwnedFd>,
}

impl OutFrame {
    /// A frame with a JSON header and no payload.
    pub fn json<T: serde::Serialize>(value: &T) -> Self {
        OutFrame { header: serde_json::to_vec(value).unwrap_or_default(), ..Default::default() }
    }

    /// Total payload length.
    pub fn payload_len(&self) -> u64 {
        self.payload.iter().map(|p| p.len() as u64).sum()
    }
}

/// Called once, right after the first byte of a write is on the stream
/// ([`SocketWriter::write_parts_started`]).
pub type WriteStarted<'a> = Option<&'a mut (dyn FnMut() + Send)>;

/// Writes all of `buf`, marking the writer `torn` from its first byte on (the caller clears
/// it once the last byte of its frames is written) and calling `started` then.
async fn put(
    inner: &mut Box<dyn AsyncWrite + Send + Unpin>,
    torn: &mut bool,
    started: &mut WriteStarted<'_>,
    mut buf: &[u8],
) -> std::io::Result<()> {
    while !buf.is_empty() {
        let n = inner.write(buf).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        *torn = true;
        if let Some(f) = started.take() {
            f();
        }
        buf = &buf[n..];
    }
    Ok(())
}

/// Writes frames to a connection's write half: to its byte stream ([`SocketWriter`]), or
/// through the link beside it that the handshake agreed on ([`LinkWrite`]).
pub struct FrameWriter {
    pub(super) sock: SocketWriter,
    /// The link beside the byte stream (a same-host ring), once the handshake agreed on one.
    pub(super) link: Option<Box<dyn LinkWrite>>,
}

/// The byte stream of a connection's write half, as a link's writer uses it
/// ([`LinkWrite`]): frames written whole, the count of writes done, the torn mark.
pub struct SocketWriter {
    inner: Box<dyn AsyncWrite + Send + Unpin>,
    #[cfg_attr(not(unix), allow(dead_code))]
    fds: Option<FdQueue>,
    scratch: Vec<u8>,
    /// A write stopped part-way through its frames (it failed, or its future was dropped):
    /// the stream has no frame boundary any more, so nothing more may be written.
    torn: bool,
    /// Writes finished whole ([`FrameWriter::writes_done`]).
    done: u64,
    /// Whether the peer is still there ([`crate::PeerLiveness`]): asked while a write waits
    /// for room that only the peer can make.
    liveness: Option<Arc<dyn crate::PeerLiveness>>,
}

impl FrameWriter {
    /// Wraps a write half. `fds` is the connection's descriptor queue, if it passes fds.
    pub fn new(write: Box<dyn AsyncWrite + Send + Unpin>, fds: Option<FdQueue>) -> Self {
        let sock = SocketWriter { inner: write, fds, scratch: Vec::new(), torn: false, done: 0, liveness: None };
        FrameWriter { sock, link: None }
    }

    /// Writes through `link` from now on (after the handshake agreed on one).
    pub fn attach_link(&mut self, link: Box<dyn LinkWrite>) {
        self.link = Some(link);
    }

    /// The probe given to [`FrameWriter::with_liveness`].
    pub(crate) fn liveness(&self) -> Option<Arc<dyn crate::PeerLiveness>> {
        self.sock.liveness.clone()
    }

    /// Asks `liveness` whether the peer is still there while a write waits for room only
    /// the peer can make (a full same-host ring): a dead peer fails the write with
    /// [`PipeError::PeerGone`].
    pub fn with_liveness(mut self, liveness: Option<Arc<dyn crate::PeerLiveness>>) -> Self {
        self.sock.liveness = liveness;
        self
    }

    /// True when a write stopped after some but not all of its bytes went to the transport
    /// (it failed, or the future was dropped): every later write fails, and the connection
    /// should be closed.
    pub fn is_torn(&self) -> bool {
        self.sock.torn
    }

    /// How many writes ([`FrameWriter::write_frame_then`] and the like) handed all their
    /// bytes to the transport. Compared before and after a write whose future may have been
    /// dropped, it tells whether that write's frames went out whole (it went up), or not
    /// at all (it did not, and the writer is not torn).
    pub fn writes_done(&self) -> u64 {
        self.sock.done
    }

    /// The byte stream underneath.
    pub fn into_inner(self) -> Box<dyn AsyncWrite + Send + Unpin> {
        self.sock.inner
    }

    /// Writes the preamble.
    pub async fn write_preamble(&mut self, version: u16) -> Result<(), PipeError> {
        self.sock.inner.write_all(&preamble(version)).await?;
        self.sock.inner.flush().await?;
        Ok(())
    }

    /// Writes one frame. Small frames go out in one write.
    pub async fn write_frame(&mut self, kind: FrameKind, frame: OutFrame) -> Result<(), PipeError> {
        self.write_frame_then(kind, frame, &[]).await
    }

    /// Writes a frame followed by `trailing` header-only frames (kind and JSON header: no
    /// payload, no descriptors), in one write where they fit together.
    pub async fn write_frame_then(
        &mut self,
        kind: FrameKind,
        #[cfg_attr(not(unix), allow(unused_mut))] mut frame: OutFrame,
        trailing: &[(FrameKind, &[u8])],
    ) -> Result<(), PipeError> {
        if self.sock.torn {
            return Err(PipeError::Transport(crate::error::TransportError::Io(std::sync::Arc::new(
                std::io::Error::other(
                    "an earlier write stopped part-way through a frame (it failed, or its send was dropped): \
                     the stream has lost its frame boundaries",
                ),
            ))));
        }
        let header_len =
            u32::try_from(frame.header.len()).map_err(|_| PipeError::ApiMisuse("frame header over 4 GiB".into()))?;
        #[cfg(unix)]
        let nfds = frame.fds.len();
        #[cfg(not(unix))]
        let nfds = 0usize;
        let prefix = FramePrefix {
            kind: kind as u8,
            flags: 0,
            fds: u16::try_from(nfds).map_err(|_| PipeError::ApiMisuse("more than 65535 fds in one frame".into()))?,
            header_len,
            payload_len: frame.payload_len(),
        };
        #[cfg(unix)]
        if !frame.fds.is_empty() {
            let Some(q) = &self.sock.fds else {
                return Err(PipeError::ApiMisuse("this transport cannot carry file descriptors".into()));
            };
            q.attach(std::mem::take(&mut frame.fds));
        }
        let r = match &mut self.link {
            Some(link) if link.carries_frames() => link.write_frames(&mut self.sock, prefix, &frame, trailing).await,
            _ => self.sock.write_parts(prefix, &frame, trailing).await,
        };
        #[cfg(unix)]
        if r.is_err()
            && let Some(q) = &self.sock.fds
        {
            // Do not let descriptors of a failed frame ride along with a later one.
            drop(q.take_outgoing());
        }
        r
    }

    /// Shuts the write half down (the peer sees end of stream).
    pub async fn shutdown(&mut self) {
        let _ = self.sock.inner.shutdown().await;
    }
}

impl SocketWriter {
    /// Writes a frame (its `prefix`, header and payload) and `trailing` header-only frames
    /// to the byte stream, in one write where they fit together, and counts the write
    /// ([`FrameWriter::writes_done`]). Torn ([`SocketWriter::set_torn`]) while part-way.
    pub async fn write_parts(
        &mut self,
        prefix: FramePrefix,
        frame: &OutFrame,
        trailing: &[(FrameKind, &[u8])],
    ) -> Result<(), PipeError> {
        self.write_parts_started(prefix, frame, trailing, None).await
    }

    /// [`SocketWriter::write_parts`], calling `started` once its first byte is on the
    /// stream: from then on the frames are committed (a cut tears the stream), and a link
    /// may say where they are before their last byte is written.
    pub async fn write_parts_started(
        &mut self,
        prefix: FramePrefix,
        frame: &OutFrame,
        trailing: &[(FrameKind, &[u8])],
        mut started: WriteStarted<'_>,
    ) -> Result<(), PipeError> {
        self.scratch.clear();
        self.scratch.extend_from_slice(&prefix.encode());
        self.scratch.extend_from_slice(&frame.header);
        let small = prefix.payload_len as usize + self.scratch.len() <= COALESCE;
        if small {
            for p in &frame.payload {
                self.scratch.extend_from_slice(p);
            }
        } else {
            put(&mut self.inner, &mut self.torn, &mut started, &self.scratch).await?;
            for p in &frame.payload {
                put(&mut self.inner, &mut self.torn, &mut started, p).await?;
            }
            self.scratch.clear();
        }
        for (kind, header) in trailing {
            let header_len =
                u32::try_from(header.len()).map_err(|_| PipeError::ApiMisuse("frame header over 4 GiB".into()))?;
            let p = FramePrefix { kind: *kind as u8, flags: 0, fds: 0, header_len, payload_len: 0 };
            self.scratch.extend_from_slice(&p.encode());
            self.scratch.extend_from_slice(header);
        }
        if !self.scratch.is_empty() {
            put(&mut self.inner, &mut self.torn, &mut started, &self.scratch).await?;
        }
        // Every byte is the transport's now: the frames are whole on the stream.
        self.torn = false;
        self.done += 1;
        self.inner.flush().await?;
        Ok(())
    }

    /// Writes `bytes` that are no frame of their own (a link's doorbell: a bare prefix) and
    /// flushes. Torn while part-way; whole, the torn mark is what it was before.
    pub async fn write_bytes(&mut self, bytes: &[u8]) -> Result<(), PipeError> {
        let was = self.torn;
        put(&mut self.inner, &mut self.torn, &mut None, bytes).await?;
        self.torn = was;
        self.inner.flush().await?;
        Ok(())
    }

    /// Marks the stream torn (`true`: a link's write is part-way, and a cut now would lose
    /// the frames' order) or whole again (`false`).
    pub fn set_torn(&mut self, torn: bool) {
        self.torn = torn;
    }

    /// Counts a write a link finished whole ([`FrameWriter::writes_done`]).
    pub fn count_write(&mut self) {
        self.done += 1;
    }

    /// The probe of whether the peer is still there, if the transport has one: a link's
    /// write waiting for room only the peer can make asks it.
    pub fn liveness(&self) -> Option<&Arc<dyn crate::PeerLiveness>> {
        self.liveness.as_ref()
    }
}
