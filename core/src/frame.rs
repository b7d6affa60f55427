//! The frame format (see `docs/PROTOCOL.md`): an 8-byte preamble once per direction, then
//! frames of a 16-byte little-endian prefix, a JSON header and a payload.
//!
//! [`FramePrefix`] and the preamble functions are sans-IO; [`FrameReader`] and
//! [`FrameWriter`] drive them over a connection's byte streams.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, BufReader};

use crate::error::{LimitError, PipeError, ProtocolError};
use crate::spin::BusyPoll;
use crate::tensor::ALIGN;
use crate::transport::FdQueueRef as FdQueue;
use crate::wire::Limits;

mod direct;
mod link;
mod writer;
#[cfg(unix)]
pub use link::LinkProvider;
pub(crate) use link::RingCloser;
pub use link::{Link, LinkRead, LinkWrite};
pub use writer::{FrameWriter, OutFrame, SocketWriter, WriteStarted};

/// The first six bytes each side sends: `89 46 45 52 52 59` ("\x89FERRY"). The first byte
/// is not ASCII, so it can never be `{` or `[` (plain JSON-RPC) or any text protocol.
pub const MAGIC: [u8; 6] = [0x89, b'F', b'E', b'R', b'R', b'Y'];
/// Length of the preamble: the magic plus a u16 little-endian protocol version.
pub const PREAMBLE_LEN: usize = 8;
/// Length of a frame prefix.
pub const PREFIX_LEN: usize = 16;

/// Frames whose header and payload together are smaller than this are written with one
/// system call.
pub const COALESCE: usize = 64 * 1024;
/// Read buffer size.
const READ_BUF: usize = 64 * 1024;

/// The preamble for `version`.
pub fn preamble(version: u16) -> [u8; PREAMBLE_LEN] {
    let v = version.to_le_bytes();
    [MAGIC[0], MAGIC[1], MAGIC[2], MAGIC[3], MAGIC[4], MAGIC[5], v[0], v[1]]
}

/// Checks a received preamble and returns the peer's protocol version.
pub fn parse_preamble(b: &[u8; PREAMBLE_LEN]) -> Result<u16, ProtocolError> {
    if b[..6] != MAGIC {
        let hint = match b[0] {
            b'{' | b'[' => " (this looks like plain JSON-RPC, which this listener does not serve)",
            b'G' | b'P' | b'H' => " (this looks like HTTP)",
            _ => "",
        };
        return Err(ProtocolError::BadMagic { got: b.to_vec(), hint });
    }
    Ok(u16::from_le_bytes([b[6], b[7]]))
}

/// Frame kinds (the prefix's first byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// Client -> server, first frame: [`crate::wire::Hello`].
    Hello = 1,
    /// Server -> client: [`crate::wire::Welcome`].
    Welcome = 2,
    /// Server -> client: [`crate::wire::Refusal`], then close.
    Refuse = 3,
    /// A message: [`crate::wire::MessageHeader`] plus payload.
    Message = 4,
    /// Channel control: [`crate::wire::ControlHeader`].
    Control = 5,
    /// The sender closes: [`crate::wire::Close`].
    Close = 6,
    /// The same-host ring (PROTOCOL.md §22): during the handshake, the client's answer to
    /// the ring the server offered ([`crate::wire::RingAnswer`]); after it, with no header,
    /// the doorbell that wakes a reader waiting on the socket.
    Ring = 7,
}

impl FrameKind {
    /// The kind for a byte, if known.
    pub fn from_u8(b: u8) -> Option<Self> {
        Some(match b {
            1 => FrameKind::Hello,
            2 => FrameKind::Welcome,
            3 => FrameKind::Refuse,
            4 => FrameKind::Message,
            5 => FrameKind::Control,
            6 => FrameKind::Close,
            7 => FrameKind::Ring,
            _ => return None,
        })
    }
}

/// The 16-byte frame prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FramePrefix {
    /// Frame kind byte.
    pub kind: u8,
    /// Reserved, must be 0.
    pub flags: u8,
    /// Number of file descriptors that travel with this frame.
    pub fds: u16,
    /// Length of the JSON header.
    pub header_len: u32,
    /// Length of the payload.
    pub payload_len: u64,
}

impl FramePrefix {
    /// Little-endian encoding.
    pub fn encode(&self) -> [u8; PREFIX_LEN] {
        let mut b = [0u8; PREFIX_LEN];
        b[0] = self.kind;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&self.fds.to_le_bytes());
        b[4..8].copy_from_slice(&self.header_len.to_le_bytes());
        b[8..16].copy_from_slice(&self.payload_len.to_le_bytes());
        b
    }

    /// Decoding (never fails; see [`FramePrefix::check`]).
    pub fn decode(b: &[u8; PREFIX_LEN]) -> Self {
        FramePrefix {
            kind: b[0],
            flags: b[1],
            fds: u16::from_le_bytes([b[2], b[3]]),
            header_len: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            payload_len: u64::from_le_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]),
        }
    }

    /// Checks kind, flags and sizes against `limits`.
    pub fn check(&self, limits: &Limits) -> Result<FrameKind, PipeError> {
        let kind = FrameKind::from_u8(self.kind)
            .ok_or(ProtocolError::UnexpectedFrame { kind: self.kind, context: "unknown kind" })?;
        if self.flags != 0 {
            return Err(ProtocolError::BadFlags(self.flags).into());
        }
        let over = |limit, what, value: u64, max: u64| {
            PipeError::Limit(LimitError::endpoint(limit, what, value, max, " on the receiving side"))
        };
        if self.header_len > limits.max_header_bytes {
            return Err(over(
                "max_header_bytes",
                "frame header length",
                self.header_len.into(),
                limits.max_header_bytes.into(),
            ));
        }
        if self.payload_len > limits.max_payload_bytes {
            return Err(over("max_payload_bytes", "frame payload length", self.payload_len, limits.max_payload_bytes));
        }
        if self.fds > limits.max_fds {
            return Err(over("max_fds", "file descriptors in one frame", self.fds.into(), limits.max_fds.into()));
        }
        Ok(kind)
    }
}

/// `b` in fresh [`ALIGN`]-aligned memory (tensor payloads are viewed in place).
pub fn aligned_copy(b: &[u8]) -> Bytes {
    if b.is_empty() {
        return Bytes::new();
    }
    let mut v: Vec<u8> = Vec::with_capacity(b.len() + ALIGN - 1);
    let pad = v.as_ptr().align_offset(ALIGN).min(ALIGN - 1);
    v.resize(pad, 0);
    v.extend_from_slice(b);
    let mut bytes = Bytes::from(v);
    // Advancing keeps the one handle (a slice would make a second).
    bytes::Buf::advance(&mut bytes, pad);
    bytes
}

/// One received frame.
#[derive(Debug)]
pub struct Frame {
    /// Its kind.
    pub kind: FrameKind,
    /// The JSON header bytes.
    pub header: Vec<u8>,
    /// The payload, in [`crate::ALIGN`]-aligned memory.
    pub payload: Bytes,
    /// File descriptors that came with it (unix only).
    #[cfg(unix)]
    pub fds: Vec<std::os::fd::OwnedFd>,
}

/// What [`FrameReader::read_frame`] read: a frame, or a packed message record.
#[derive(Debug)]
pub enum Received {
    /// A frame (prefix, JSON header, payload).
    Frame(Frame),
    /// A packed message read from a same-host ring (PROTOCOL.md §22.5): the whole binary
    /// record, not JSON.
    Packed(Vec<u8>),
}

impl Received {
    /// The frame. A packed record where only a frame may come (the handshake, or a link
    /// that carries no packed records) is the peer's fault.
    pub fn into_frame(self) -> Result<Frame, PipeError> {
        match self {
            Received::Frame(f) => Ok(f),
            Received::Packed(_) => Err(ProtocolError::UnexpectedFrame {
                kind: FrameKind::Message as u8,
                context: "a packed message record where a frame must come",
            }
            .into()),
        }
    }
}

impl Frame {
    /// Parses the header as `T`.
    pub fn parse<T: serde::de::DeserializeOwned>(&self) -> Result<T, ProtocolError> {
        parse_header(&self.header)
    }
}

/// Parses a frame's header bytes as `T` (which may borrow from them, as a CONTROL frame's
/// raw body does).
pub(crate) fn parse_header<'a, T: serde::Deserialize<'a>>(header: &'a [u8]) -> Result<T, ProtocolError> {
    serde_json::from_slice(header).map_err(|e| ProtocolError::BadHeader(e.to_string()))
}

/// The most of a frame's reserved room one read offers the transport (which may zero it
/// before the bytes arrive): the most memory a frame is committed ahead of its bytes.
pub const READ_ROOM: usize = 256 << 10;

/// How many bytes of one frame a reader copies before it lets the other tasks of its
/// runtime worker run (about 100 µs of copying).
const YIELD_EVERY: usize = 1 << 20;

/// What a peer may send before the handshake is done (HELLO, WELCOME, REFUSE): JSON
/// headers of at most 64 KiB, no payload, no descriptors, so that an unauthenticated peer
/// can cost a server no more than that.
pub const HANDSHAKE_LIMITS: Limits =
    Limits { max_header_bytes: 64 << 10, max_payload_bytes: 0, max_tensors: 0, max_fds: 0 };

/// How the pipe's reader waits for the next frame (`FrameReader::wait_readable`, and a
/// link's [`LinkRead::wait_readable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitSpin {
    /// In the runtime, polling a ring first as the pipe's busy polling allows
    /// ([`FrameReader::arm_busy_poll`]): the reader task.
    BusyPoll,
    /// On the caller's own thread, until this deadline (none: for good): a link that
    /// [`LinkRead::wakes_blocking_reader`] (a same-host ring) is polled for the wait policy's
    /// window, then slept on (its futex, woken by the writer directly).
    Blocking(Option<std::time::Instant>),
}

/// Reads frames from a connection's read half: from its byte stream ([`SocketReader`]), or
/// through the link beside it that the handshake agreed on ([`LinkRead`]).
pub struct FrameReader {
    sock: SocketReader,
    /// The link beside the byte stream (a same-host ring), once the handshake agreed on one.
    link: Option<Box<dyn LinkRead>>,
}

/// The byte stream of a connection's read half, as a link's reader uses it
/// ([`LinkRead`]): frames, its buffer, its limits, the pipe's busy polling.
pub struct SocketReader {
    inner: BufReader<Box<dyn AsyncRead + Send + Unpin>>,
    #[cfg_attr(not(unix), allow(dead_code))]
    fds: Option<FdQueue>,
    limits: Limits,
    busy_poll: Option<Arc<BusyPoll>>,
    /// Once a frame has begun: the longest its prefix and header may take, and the longest
    /// its payload may go without a byte (none: no limit).
    frame_timeout: Option<Duration>,
    /// The read half waited on from a blocking caller's thread, when the transport can.
    direct: Option<Arc<dyn crate::DirectRead>>,
    /// A blocking caller's spins before its direct waits ([`crate::spin::caller`]): kept
    /// with the reader, which only its holder uses.
    caller_spin: crate::spin::caller::CallerSpin,
}

impl FrameReader {
    /// Wraps a read half. `fds` is the connection's descriptor queue, if it passes fds.
    pub fn new(read: Box<dyn AsyncRead + Send + Unpin>, fds: Option<FdQueue>, limits: Limits) -> Self {
        let r = SocketReader {
            inner: BufReader::with_capacity(READ_BUF, read),
            fds,
            limits,
            busy_poll: None,
            frame_timeout: None,
            direct: None,
            caller_spin: crate::spin::caller::CallerSpin::new(Duration::ZERO),
        };
        r.cap_unclaimed_fds();
        FrameReader { sock: r, link: None }
    }

    /// Reads through `link` from now on (after the handshake agreed on one).
    pub fn attach_link(&mut self, link: Box<dyn LinkRead>) {
        self.link = Some(link);
    }

    /// With a time limit on frames once they have begun (a pipe may idle between frames as
    /// long as it likes): the prefix and header must arrive within `d` of the frame's first
    /// byte, and the payload may go at most `d` without a byte. A peer trickling a frame
    /// (slowloris) fails with [`PipeError::Timeout`].
    pub fn with_frame_timeout(mut self, d: Option<Duration>) -> Self {
        self.sock.frame_timeout = d;
        self
    }

    /// With the connection's busy-polling control (see [`BusyPoll`]).
    pub fn with_busy_poll(mut self, busy_poll: Option<Arc<BusyPoll>>) -> Self {
        self.sock.busy_poll = busy_poll;
        self
    }

    /// Whether the connection passes file descriptors.
    #[cfg_attr(not(unix), allow(dead_code))]
    pub(crate) fn passes_fds(&self) -> bool {
        self.sock.fds.is_some()
    }

    /// Allows (or forbids) the next reads to busy-poll, where the transport can.
    pub fn arm_busy_poll(&self, yes: bool) {
        self.sock.arm_busy_poll(yes);
    }

    /// Waits for the first byte of the stream without consuming it (`None` at end of stream).
    pub async fn peek_byte(&mut self) -> Result<Option<u8>, PipeError> {
        self.sock.peek_byte().await
    }

    /// The buffered byte stream underneath (for handing a non-ferry peer to another
    /// protocol, with nothing read lost).
    pub fn into_inner(self) -> BufReader<Box<dyn AsyncRead + Send + Unpin>> {
        self.sock.inner
    }

    /// Reads and checks the peer's preamble; returns its version.
    pub async fn read_preamble(&mut self) -> Result<u16, PipeError> {
        let mut b = [0u8; PREAMBLE_LEN];
        self.sock.inner.read_exact(&mut b).await?;
        Ok(parse_preamble(&b)?)
    }

    /// Waits until the next frame has begun to arrive, or the stream ended or failed (the
    /// next [`FrameReader::read_frame`] then says which). Cancel-safe: it consumes nothing
    /// but doorbells, so a caller may give up waiting (a deadline, a hand-over of the
    /// reader) and read later with nothing lost. `spin`: how it waits. False: the deadline
    /// of [`WaitSpin::Blocking`] passed first (a deadline of the bare socket is the
    /// caller's: it drops this future).
    pub(crate) async fn wait_readable(&mut self, spin: WaitSpin) -> Result<bool, PipeError> {
        if let Some(link) = &mut self.link {
            return link.wait_readable(&mut self.sock, spin).await;
        }
        let _ = spin;
        use tokio::io::AsyncBufReadExt;
        self.sock.inner.fill_buf().await?;
        Ok(true)
    }

    /// Whether [`FrameReader::wait_readable`] keeps a [`WaitSpin::Blocking`] deadline
    /// itself (a link that [`LinkRead::wakes_blocking_reader`]); otherwise the caller bounds
    /// the wait.
    pub(crate) fn waits_for_deadlines(&self) -> bool {
        self.link.as_ref().is_some_and(|l| l.wakes_blocking_reader())
    }

    /// Reads one whole frame, or a packed message record (from a same-host ring). End of
    /// stream, at a frame boundary or inside a frame, is [`PipeError::Closed`]; a frame
    /// over the limits is refused before its body is read.
    pub async fn read_frame(&mut self) -> Result<Received, PipeError> {
        if let Some(link) = &mut self.link {
            return link.read(&mut self.sock).await;
        }
        self.sock.read_frame().await.map(Received::Frame)
    }

    /// Changes the limits checked from the next frame on (the handshake reads with small
    /// ones, [`HANDSHAKE_LIMITS`], the pipe with the agreed ones).
    pub fn set_limits(&mut self, limits: Limits) {
        self.sock.limits = limits;
        self.sock.cap_unclaimed_fds();
    }
}

impl SocketReader {
    /// The buffered byte stream (a link's reader looks at what is buffered, skips what
    /// is its own, and waits for bytes).
    pub fn stream(&mut self) -> &mut BufReader<Box<dyn AsyncRead + Send + Unpin>> {
        &mut self.inner
    }

    /// Whether the socket has something this reader has not taken yet, without waiting:
    /// bytes buffered here, or readable in the kernel ([`crate::DirectRead::readable_now`]).
    /// `None`: nothing is buffered and the transport cannot tell.
    pub fn readable_now(&self) -> Option<bool> {
        if !self.inner.buffer().is_empty() {
            return Some(true);
        }
        self.direct.as_ref()?.readable_now()
    }

    /// Waits on this thread (a blocking caller's) until the socket has bytes this reader
    /// has not taken, its end, or `until`, through the transport's direct wait
    /// ([`crate::DirectRead::wait_readable`]: the kernel wakes this thread, no runtime
    /// thread first). Bytes buffered here end it at once. `None`: the transport has no
    /// direct wait (the caller waits through the runtime).
    pub fn wait_readable_here(&self, until: std::time::Instant) -> Option<std::io::Result<crate::Readiness>> {
        if !self.inner.buffer().is_empty() {
            return Some(Ok(crate::Readiness::Readable));
        }
        Some(self.direct.as_ref()?.wait_readable(Some(until)))
    }

    /// The limits every frame is checked against, wherever it comes from.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The pipe's busy polling (a link's reader polls it as the transport would poll the
    /// socket), if the connection has it.
    pub fn busy_poll(&self) -> Option<&Arc<BusyPoll>> {
        self.busy_poll.as_ref()
    }

    /// Descriptors may arrive ahead of the frame that claims them (read-ahead holds a few
    /// frames): up to four frames' worth of [`Limits::max_fds`] wait; more are closed on
    /// arrival and fail the pipe.
    #[cfg_attr(not(unix), allow(dead_code))]
    fn unclaimed_fds_cap(&self) -> usize {
        4 * usize::from(self.limits.max_fds).max(1)
    }

    /// The queue holds a frame's own descriptors besides those.
    fn cap_unclaimed_fds(&self) {
        #[cfg(unix)]
        if let Some(q) = &self.fds {
            q.set_incoming_cap(self.unclaimed_fds_cap() + usize::from(self.limits.max_fds));
        }
    }

    /// Allows (or forbids) the next reads to busy-poll, where the transport can.
    fn arm_busy_poll(&self, yes: bool) {
        if let Some(b) = &self.busy_poll {
            b.arm(yes);
        }
    }

    /// Waits for the first byte of the stream without consuming it (`None` at end of stream).
    async fn peek_byte(&mut self) -> Result<Option<u8>, PipeError> {
        use tokio::io::AsyncBufReadExt;
        let buf = self.inner.fill_buf().await?;
        Ok(buf.first().copied())
    }

    /// Reads one whole frame from the byte stream ([`FrameReader::read_frame`] without a
    /// link). End of stream is [`PipeError::Closed`]; a frame over the limits is refused
    /// before its body is read.
    pub async fn read_frame(&mut self) -> Result<Frame, PipeError> {
        let limit = self.frame_timeout;
        // Idle between frames as long as it likes; from a frame's first byte on, timed.
        if limit.is_some() && self.peek_byte().await?.is_none() {
            return Err(PipeError::Closed);
        }
        // When the frame began: set at its first wait (buffered bytes need no clock read).
        let mut started = None;
        let mut p = [0u8; PREFIX_LEN];
        let buffered = self.inner.buffer().len() >= PREFIX_LEN;
        let read = async { self.inner.read_exact(&mut p).await.map(drop).map_err(PipeError::from) };
        within(limit, buffered, &mut started, "a frame's prefix (frame_timeout)", read).await?;
        let prefix = FramePrefix::decode(&p);
        let kind = prefix.check(&self.limits)?;
        #[cfg(unix)]
        let fds = self.take_fds(prefix.fds)?;
        #[cfg(not(unix))]
        if prefix.fds != 0 {
            return Err(ProtocolError::Fds("this transport cannot carry file descriptors".into()).into());
        }
        let header_len = prefix.header_len as usize;
        let buffered = self.inner.buffer().len() >= header_len;
        let read = self.read_header(header_len);
        let header = within(limit, buffered, &mut started, "a frame's header (frame_timeout)", read).await?;
        let len = usize::try_from(prefix.payload_len).map_err(|_| {
            PipeError::Limit(LimitError {
                limit: "max_payload_bytes",
                what: "frame payload length",
                value: prefix.payload_len,
                max: usize::MAX as u64,
                hint: "this machine cannot address that much memory".into(),
            })
        })?;
        let payload = self.read_aligned(len, limit).await?;
        Ok(Frame {
            kind,
            header,
            payload,
            #[cfg(unix)]
            fds,
        })
    }

    /// Reads exactly `len` bytes into fresh [`ALIGN`]-aligned memory, committing memory only
    /// for bytes that arrived: the buffer's address space is reserved up front (no copy
    /// later), and the bytes are read straight into it ([`Self::fill`]), never zeroed first.
    /// A peer announcing 4 GiB and sending 100 bytes costs at most [`READ_ROOM`].
    /// `stall`: the longest it may wait for a byte.
    async fn read_aligned(&mut self, len: usize, stall: Option<Duration>) -> Result<Bytes, PipeError> {
        if len == 0 {
            return Ok(Bytes::new());
        }
        let mut v: Vec<u8> = Vec::new();
        v.try_reserve_exact(len.saturating_add(ALIGN - 1)).map_err(|_| {
            PipeError::Limit(LimitError {
                limit: "max_payload_bytes",
                what: "frame length this process could not reserve memory for",
                value: len as u64,
                max: self.limits.max_payload_bytes,
                hint: "the machine is out of memory (or address space) for a frame that large".into(),
            })
        })?;
        let pad = v.as_ptr().align_offset(ALIGN).min(ALIGN - 1);
        v.resize(pad, 0);
        self.fill(&mut v, len, stall).await?;
        Ok(Bytes::from(v).slice(pad..))
    }

    /// Reads a header of `len` bytes (checked against `max_header_bytes` already) into a
    /// buffer of its own, committed as the bytes arrive ([`Self::fill`]), and
    /// never copied: a 16 MiB header costs the reader no 16 MiB copy.
    async fn read_header(&mut self, len: usize) -> Result<Vec<u8>, PipeError> {
        let mut v: Vec<u8> = Vec::new();
        v.try_reserve_exact(len).map_err(|_| {
            PipeError::Limit(LimitError {
                limit: "max_header_bytes",
                what: "frame header length this process could not reserve memory for",
                value: len as u64,
                max: self.limits.max_header_bytes.into(),
                hint: "the machine is out of memory (or address space) for a header that large".into(),
            })
        })?;
        self.fill(&mut v, len, None).await?;
        Ok(v)
    }

    /// Appends exactly `len` bytes to `v`, whose room is reserved, straight into that room,
    /// at most [`READ_ROOM`] offered per read (a transport may initialize what it is
    /// offered: pages are committed only that far ahead of the bytes).
    /// `stall`: the longest it may wait for a byte.
    async fn fill(&mut self, v: &mut Vec<u8>, len: usize, stall: Option<Duration>) -> Result<(), PipeError> {
        use bytes::BufMut;
        debug_assert!(v.capacity() - v.len() >= len, "fill's room is reserved by its caller");
        let end = v.len() + len;
        let mut since_yield = 0;
        while v.len() < end {
            if since_yield >= YIELD_EVERY {
                // A big frame whose bytes keep coming would hold this worker for Tokio's whole
                // cooperative budget (128 reads, 30 MiB of copies): let other connections in.
                since_yield = 0;
                tokio::task::yield_now().await;
            }
            let left = (end - v.len()).min(READ_ROOM);
            let mut room = (&mut *v).limit(left);
            let n = match stall {
                // Buffered bytes need no timer.
                Some(d) if self.inner.buffer().is_empty() => tokio::time::timeout(d, self.inner.read_buf(&mut room))
                    .await
                    .map_err(|_| PipeError::Timeout(d, "a frame's payload, without a byte (frame_timeout)"))??,
                _ => self.inner.read_buf(&mut room).await?,
            };
            if n == 0 {
                return Err(PipeError::Closed);
            }
            since_yield += n;
        }
        Ok(())
    }

    /// The `n` descriptors a frame announces; checks on every frame that the peer sends
    /// no descriptors beyond what its frames announce.
    #[cfg(unix)]
    fn take_fds(&mut self, n: u16) -> Result<Vec<std::os::fd::OwnedFd>, PipeError> {
        if let Some(q) = &self.fds {
            let (dropped, waiting) = (q.overflowed(), q.pending().saturating_sub(usize::from(n)));
            if dropped > 0 || waiting > self.unclaimed_fds_cap() {
                return Err(ProtocolError::Fds(format!(
                    "{} descriptors arrived that no frame announced (at most {} may wait: 4 x max_fds)",
                    waiting + dropped,
                    self.unclaimed_fds_cap()
                ))
                .into());
            }
        }
        if n == 0 {
            return Ok(Vec::new());
        }
        let Some(q) = &self.fds else {
            return Err(ProtocolError::Fds(format!(
                "frame announces {n} descriptors but this transport cannot carry them"
            ))
            .into());
        };
        let got = q.take(n as usize);
        if got.len() != n as usize {
            return Err(ProtocolError::Fds(format!("frame announces {n} descriptors, {} arrived", got.len())).into());
        }
        Ok(got)
    }
}

/// `read`, within the frame's time limit when it may have to wait for bytes (not all
/// `buffered`): the frame's first wait starts its clock (`started`).
async fn within<T>(
    limit: Option<Duration>,
    buffered: bool,
    started: &mut Option<tokio::time::Instant>,
    what: &'static str,
    read: impl std::future::Future<Output = Result<T, PipeError>>,
) -> Result<T, PipeError> {
    match limit {
        Some(d) if !buffered => {
            let s = *started.get_or_insert_with(tokio::time::Instant::now);
            tokio::time::timeout_at(s + d, read).await.map_err(|_| PipeError::Timeout(d, what))?
        }
        _ => read.await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_round_trip() {
        let p = FramePrefix { kind: 4, flags: 0, fds: 2, header_len: 77, payload_len: 1 << 40 };
        assert_eq!(FramePrefix::decode(&p.encode()), p);
        assert_eq!(p.encode()[..4], [4, 0, 2, 0]);
    }

    #[test]
    fn prefix_checks() {
        let l = Limits::default();
        let ok = FramePrefix { kind: 4, flags: 0, fds: 0, header_len: 10, payload_len: 10 };
        assert_eq!(ok.check(&l).unwrap(), FrameKind::Message);
        assert!(matches!(FramePrefix { kind: 0, ..ok }.check(&l), Err(PipeError::Protocol(_))));
        assert!(matches!(FramePrefix { flags: 1, ..ok }.check(&l), Err(PipeError::Protocol(_))));
        let big = FramePrefix { header_len: u32::MAX, ..ok }.check(&l);
        let Err(PipeError::Limit(e)) = big else { panic!("{big:?}") };
        assert_eq!(e.limit, "max_header_bytes");
        assert!(e.to_string().contains("Limits::max_header_bytes"), "{e}");
    }

    #[test]
    fn preamble_rules() {
        assert_eq!(parse_preamble(&preamble(7)).unwrap(), 7);
        let e = parse_preamble(b"{\"jsonrp").unwrap_err();
        assert!(e.to_string().contains("JSON-RPC"), "{e}");
        assert!(MAGIC[0] != b'{' && MAGIC[0] != b'[');
    }
}
